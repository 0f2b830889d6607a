//! `vip_as_source`: a packet whose source is a LB VIP crossing between nodes that both bind
//! that VIP (kube-proxy IPVS mode, externalTrafficPolicy: Local, a host-network call to the LB
//! IP on a node without a local endpoint; reference 003, the ACK analysis).
//!
//! Sending side: a TCP SYN leaving a NIC with a bound VIP as source (`KernelEvent::VipEgress`)
//! confirms alone: no node sends from a VIP bound on its kube-ipvs0 except through this.
//!
//! Receiving side: a `Vip`-source packet to a destination that is not a NodePort of this node
//! (a pod, or another port), dropped for a local source. The health-check test is
//! [`Correlator::is_health_check`]; everything else that `blackhole.rs` would confirm lands
//! here.

use super::aggregate::NewEvent as _;
use super::{
    AggregateKey, Correlator, DropInfo, LoopbackEvent, Outcome, Output,
    blackhole::VipSuspect,
    evidence::{destination_line, drop_line, local_source_line, suspect_line, vip_egress_line},
    remedy::{self, VipSourceSide},
    tuple_of,
};
use crate::event::Packet;

impl Correlator {
    /// A local-source drop of a `Vip`-source packet that is no health check.
    pub(super) fn confirm_vip_as_source(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        suspect: Option<VipSuspect>,
        out: &mut Vec<Output>,
    ) {
        let t = tuple_of(packet);
        let mut evidence = Vec::new();
        if let Some(s) = &suspect {
            evidence.push(suspect_line(s.ts, &s.nic, &s.packet));
        }
        evidence.push(drop_line(&info, &t));
        evidence.push(local_source_line(&info, packet.src));
        evidence.push(destination_line(packet, &self.services));
        self.vip_served_evidence(packet.src, &mut evidence);
        let nic = info
            .iface
            .clone()
            .or_else(|| suspect.as_ref().map(|s| s.nic.clone()));
        let key = AggregateKey::VipAsSource {
            vip: packet.src,
            dst: packet.dst,
            dst_port: packet.dport,
            proto: packet.proto,
        };
        let event = LoopbackEvent {
            vip: Some(packet.src),
            drop_reason: Some(info.reason.name.clone()),
            drop_location: info.location.clone(),
            evidence,
            remedy: remedy::vip_as_source(
                packet.src,
                packet.dst,
                packet.dport,
                VipSourceSide::Receiving,
            ),
            nic,
            ..LoopbackEvent::new(&key, packet, info.ts, Outcome::Dropped)
        };
        self.stats.confirmed.vip_as_source += 1;
        self.report_vip_source_drop(packet, info, suspect.as_ref(), key, event, out);
    }

    /// Sending side: a TCP SYN left `nic` with a bound VIP as source.
    pub(super) fn on_vip_egress(
        &mut self,
        ts: u64,
        nic: &str,
        packet: &Packet,
        out: &mut Vec<Output>,
    ) {
        self.stats.vip_egress_seen += 1;
        let mut evidence = vec![vip_egress_line(ts, nic, packet)];
        self.vip_served_evidence(packet.src, &mut evidence);
        let key = AggregateKey::VipAsSource {
            vip: packet.src,
            dst: packet.dst,
            dst_port: packet.dport,
            proto: packet.proto,
        };
        let event = LoopbackEvent {
            vip: Some(packet.src),
            evidence,
            remedy: remedy::vip_as_source(
                packet.src,
                packet.dst,
                packet.dport,
                VipSourceSide::Sending,
            ),
            nic: Some(nic.to_string()),
            ..LoopbackEvent::new(&key, packet, ts, Outcome::NoReply)
        };
        self.stats.confirmed.vip_as_source += 1;
        out.push(Output::Report(self.record(key, event, ts)));
    }
}
