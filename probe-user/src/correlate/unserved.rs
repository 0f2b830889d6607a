//! `vip_port_unserved`: a packet to a bound VIP refused because nothing serves that port: no
//! socket (`NO_SOCKET`), or kube-proxy's IPVS access filter (`KUBE-IPVS-FILTER`, kube-proxy
//! >= 1.25 in IPVS mode: `NETFILTER_DROP` at `nf_hook_slow`, after an ICMP port unreachable).

use super::{
    Correlator, DropInfo, Output,
    aggregate::NewEvent as _,
    drop_reason::{is_netfilter_drop, is_no_socket},
    evidence::{drop_line, refusal_line, service_name},
    tuple_of,
};
use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, Proto, Tag, facts::Facts, record::Packet,
};

impl Correlator {
    /// A drop to a bound VIP for no socket (or by kube-proxy's IPVS access filter), TCP or
    /// UDP, on a port the service table does not serve.
    pub(super) fn is_unserved_drop(&self, packet: &Packet, info: &DropInfo) -> bool {
        packet.dst_tag == Some(Tag::Vip)
            && (is_no_socket(&info.reason) || self.is_access_filter_drop(info))
            && matches!(packet.proto, Proto::Tcp | Proto::Udp)
            && self
                .services
                .serves(packet.dst, packet.dport, packet.proto)
                .is_none()
    }

    /// Netfilter dropped it and kube-proxy's `KUBE-IPVS-FILTER` chain exists: the filter
    /// REJECTed it (any other netfilter drop of a VIP packet is not ours to name).
    fn is_access_filter_drop(&self, info: &DropInfo) -> bool {
        !self.services.access_filter.is_empty()
            && is_netfilter_drop(&info.reason, info.location.as_deref())
    }

    pub(super) fn confirm_unserved(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        out: &mut Vec<Output>,
    ) {
        let t = tuple_of(packet);
        let mut evidence = vec![drop_line(&info, &t)];
        let owner = self
            .services
            .services
            .iter()
            .find(|s| s.vip == packet.dst)
            .map(|s| s.service.clone());
        let filtered = !is_no_socket(&info.reason) && self.is_access_filter_drop(&info);
        if filtered {
            self.access_filter_evidence(&mut evidence);
        }
        self.unserved_table_evidence(packet, &mut evidence);
        evidence.push(refusal_line(packet.proto, filtered));
        self.owner_evidence(packet.dst, &mut evidence);
        let owner_name = owner.flatten().map(|s| service_name(&s));
        let key = AggregateKey::VipPortUnserved {
            vip: packet.dst,
            port: packet.dport,
            proto: packet.proto,
        };
        let event = LoopbackEvent {
            vip: Some(packet.dst),
            vip_port: Some(packet.dport),
            drop_reason: Some(info.reason.name.clone()),
            drop_location: info.location.clone(),
            evidence,
            nic: info.iface.clone(),
            service: owner_name,
            ..LoopbackEvent::new(&key, packet, info.ts, Outcome::Refused)
        };
        let event = LoopbackEvent {
            facts: Facts {
                owner: self.vip_owner(packet.dst, packet.dst_tag),
                access_filtered: filtered,
                ..event.facts.clone()
            },
            ..event
        };
        self.stats.drops_confirming += 1;
        self.stats.confirmed.vip_port_unserved += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }
}
