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

use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, Tag,
    facts::{AddressOwner, Etp, VipSourceSide},
    record::Packet,
    sock,
};

use super::{
    Correlator, DropInfo, Output,
    aggregate::NewEvent as _,
    evidence::{destination_line, vip_egress_line},
    held::VipSuspect,
    remedy::{
        cause::CauseAddresses,
        sentences::{call_in_cluster, mismatch, owner_fix, owner_short, service_key},
    },
};

impl Correlator {
    /// A local-source drop of a `Vip`-source packet that is no health check.
    pub(super) fn confirm_vip_as_source(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        suspect: Option<VipSuspect>,
        out: &mut Vec<Output>,
    ) {
        let lines = vec![destination_line(packet, &self.services)];
        let key = AggregateKey::VipAsSource {
            vip: packet.src,
            dst: packet.dst,
            dst_port: packet.dport,
            proto: packet.proto,
        };
        let event = self.vip_drop_event(packet, &info, suspect.as_ref(), &key, lines);
        let event = self.vip_source_facts(event, packet, VipSourceSide::Receiving);
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
        self.owner_evidence(packet.src, &mut evidence);
        let key = AggregateKey::VipAsSource {
            vip: packet.src,
            dst: packet.dst,
            dst_port: packet.dport,
            proto: packet.proto,
        };
        let event = LoopbackEvent {
            vip: Some(packet.src),
            evidence,
            nic: Some(nic.to_string()),
            ..LoopbackEvent::new(&key, packet, ts, Outcome::NoReply)
        };
        let event = self.vip_source_facts(event, packet, VipSourceSide::Sending);
        self.stats.confirmed.vip_as_source += 1;
        out.push(Output::Report(self.record(key, event, ts)));
    }
}

impl Correlator {
    /// The facts of a `vip_as_source`: the side, the VIP's owner, and the policy the rules
    /// apply when the destination port is a NodePort of the service table.
    fn vip_source_facts(
        &self,
        mut event: LoopbackEvent,
        packet: &Packet,
        side: VipSourceSide,
    ) -> LoopbackEvent {
        event.facts.side = Some(side);
        event.facts.owner = self.vip_owner(packet.src, packet.src_tag);
        event.facts.etp_rules = self.rules_etp(packet);
        event
    }

    /// A healthcheck_blackhole's facts: the VIP's owner and the NodePort's policy.
    pub(super) fn healthcheck_facts(
        &self,
        mut event: LoopbackEvent,
        packet: &Packet,
    ) -> LoopbackEvent {
        event.facts.owner = self.vip_owner(packet.src, packet.src_tag);
        event.facts.etp_rules = self.rules_etp(packet);
        event
    }

    /// `externalTrafficPolicy` of the packet's destination NodePort as the rules apply it
    /// (none when the destination is a pod or a VIP: its port is no NodePort, whatever its
    /// number).
    fn rules_etp(&self, packet: &Packet) -> Option<Etp> {
        if matches!(packet.dst_tag, Some(Tag::Pod | Tag::Vip)) {
            return None;
        }
        self.services.nodeport(packet.dport, packet.proto).map(|n| {
            if n.local_only {
                Etp::Local
            } else {
                Etp::Cluster
            }
        })
    }
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let f = &e.facts;
    let vip = e.vip.unwrap_or(e.src);
    let to = sock(e.dst, e.dst_port);
    let svc = service_key(e)
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    // Why IPVS forwarded the call without SNAT, as far as the facts say.
    let why = match f.etp() {
        Some(Etp::Local) => format!(
            "{svc} has externalTrafficPolicy: Local and the calling node has no local endpoint, \
             so IPVS forwarded the call without SNAT"
        ),
        Some(Etp::Cluster) => format!(
            "{svc} has externalTrafficPolicy: Cluster, under which kube-proxy masquerades a \
             forwarded call, yet IPVS forwarded this one without SNAT (the calling node's \
             masquerade rules did not match it)"
        ),
        None => "IPVS forwarded the call without SNAT (kube-proxy does so under \
                 externalTrafficPolicy: Local when the calling node has no local endpoint)"
            .to_string(),
    };
    let cause = match f.side.unwrap_or(VipSourceSide::Receiving) {
        VipSourceSide::Receiving => format!(
            "Cause: a host-network caller on another node called the LB IP {vip}; {vip} is a \
             local address there, so the kernel picked {vip} itself as the source; {why} to {to} here; \
             this node has {vip} as a local address too ({}) and drops every packet from it as \
             a local (martian) source. The caller times out.",
            owner_short(f.owner.as_ref())
        ),
        VipSourceSide::Sending => format!(
            "Cause: a host-network caller on this node called the LB IP {vip}, a local address \
             here ({}), so the kernel picked {vip} itself as the source; {why} to {to} on \
             another node; that node has {vip} as a local address too and drops it as a local \
             (martian) source. The caller times out.",
            owner_short(f.owner.as_ref())
        ),
    };
    let mut out = vec![cause];
    // The story above is kube-proxy's; a VIP that something else made local here is that
    // owner's to remove.
    if let Some(owner @ (AddressOwner::Interface { .. } | AddressOwner::LocalRoute { .. })) =
        &f.owner
    {
        out.push(owner_fix(vip, owner));
    }
    out.extend(mismatch(e));
    out.push(call_in_cluster(e, vip, e.vip_port));
    out.push(
        "Or set internalTrafficPolicy / move such callers to nodes with a local endpoint, so \
         in-cluster calls are not forwarded to another node."
            .to_string(),
    );
    if f.etp() != Some(Etp::Cluster) {
        out.push(format!(
            "Or set externalTrafficPolicy: Cluster on {svc}: IPVS then masquerades the \
             forwarded call to the node IP (the client source IP is no longer preserved)."
        ));
    } else {
        out.push(
            "Check kube-proxy's masquerade rules on the calling node (KUBE-MARK-MASQ for the \
             LB IP, KUBE-POSTROUTING): under Cluster policy they SNAT this call."
                .to_string(),
        );
    }
    out
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { proto, dst, .. } = CauseAddresses::of(event);
    format!(
        "A packet with the LB VIP {} as its source left this node for {dst}/{proto} without SNAT: a host-network call to the LB IP, forwarded to another node.",
        event.src
    )
}
