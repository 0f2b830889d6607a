//! `etp_local_drop`: kube-proxy's nftables mode dropped a call from this node (a local pod's)
//! to an external or LB IP of an externalTrafficPolicy Local Service that has no endpoint on
//! this node.
//!
//! kube-proxy writes such an IP:port into its verdict map `no-endpoint-services` with verdict
//! `drop` ("DROP anything that didn't get short-circuited by the EXT chain",
//! kubernetes/kubernetes `pkg/proxy/nftables/proxier.go`, `syncProxyRules`), and its filter
//! chains (`service-endpoints-check`, jumped from `filter-forward`, `filter-input` and
//! `filter-output`) apply it to every new connection whose destination was not DNATed first.
//! A pod's call is DNATed first only when kube-proxy's `external-` chain short-circuits it
//! ("short-circuit pod traffic", written only with a local-traffic detector); the node's own
//! call was checked before DNAT until kubernetes#132456 moved the filter chains after it
//! (kubernetes#131765; 1.33 got it as #133969). iptables and IPVS mode send a pod's call to
//! the cluster-wide endpoints only when the local-traffic detector matches the pod
//! (kubernetes#77523, #93456); a pod outside it is dropped there too
//! (`KUBE-EXTERNAL-SERVICES`, kubernetes#112820), not yet named here (issue #51).
//!
//! Confirmed from a drop (`NETFILTER_DROP`, or `NOT_SPECIFIED` at a netfilter site on kernels
//! without the reason: [`is_netfilter_drop`]) of a local pod's (or the node's) TCP/UDP packet
//! to a non-local address, whose (address, protocol, port) is a `drop` element of
//! `no-endpoint-services` in the service table read from the live ruleset. Without that
//! element nothing is confirmed: a netfilter drop of a pod's call to some outside address is
//! anyone's (a NetworkPolicy, a firewall). The kernel side reports these drops only for the
//! elements' addresses (`DROP_DESTINATIONS`, kept by the agent from each service table).

use super::{
    Correlator, DropInfo, Output,
    aggregate::NewEvent as _,
    drop_reason::is_netfilter_drop,
    evidence::{drop_line, service_name},
    tuple_of,
};
use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, Proto, Tag,
    facts::{Etp, Facts},
    record::Packet,
    sock,
};

use super::remedy::{
    cause::CauseAddresses,
    sentences::{mismatch, service_key},
};
use probe_contract::facts::SourceKind;

impl Correlator {
    /// A netfilter drop of a local pod's (or the node's) call to a `no-endpoint-services`
    /// `drop` element of kube-proxy's nftables rules.
    pub(super) fn is_etp_local_drop(&self, packet: &Packet, info: &DropInfo) -> bool {
        matches!(packet.src_tag, Some(Tag::Pod | Tag::Node))
            && packet.dst_tag.is_none()
            && matches!(packet.proto, Proto::Tcp | Proto::Udp)
            && is_netfilter_drop(&info.reason, info.location.as_deref())
            && self
                .services
                .no_endpoint_drop(packet.dst, packet.dport, packet.proto)
                .is_some()
    }

    pub(super) fn confirm_etp_local_drop(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        out: &mut Vec<Output>,
    ) {
        let Some(element) = self
            .services
            .no_endpoint_drop(packet.dst, packet.dport, packet.proto)
            .cloned()
        else {
            return;
        };
        let t = tuple_of(packet);
        let to = sock(packet.dst, packet.dport);
        let proto = packet.proto.as_str();
        let mut evidence = vec![
            drop_line(&info, &t),
            format!(
                "kube-proxy's nftables rules (table {family} kube-proxy): map \
                 no-endpoint-services has the element {} . {proto} . {}{} : drop, which \
                 kube-proxy writes for an externalTrafficPolicy Local Service with no endpoint \
                 on this node; its filter chains drop every new connection to {to}/{proto} \
                 that was not DNATed before them",
                packet.dst,
                packet.dport,
                element
                    .service
                    .as_deref()
                    .map(|c| format!(" comment \"{c}\""))
                    .unwrap_or_default(),
                family = if packet.dst.is_ipv4() { "ip" } else { "ip6" },
            ),
        ];
        evidence.push(
            match self.services.serves(packet.dst, packet.dport, packet.proto) {
                Some(s) if !s.backends.is_empty() => format!(
                    "service table: {to}/{proto} has endpoints, none of them on this node: {}",
                    s.backends.join(", ")
                ),
                Some(_) => format!(
                    "service table: {to}/{proto} is in service-ips (its endpoints are not named \
                     in the rules read)"
                ),
                None => format!("service table: {to}/{proto} is not in service-ips"),
            },
        );
        let key = AggregateKey::EtpLocalDrop {
            addr: packet.dst,
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
            service: element.service.as_deref().map(service_name),
            ..LoopbackEvent::new(&key, packet, info.ts, Outcome::Dropped)
        };
        let event = LoopbackEvent {
            facts: Facts {
                // Only an externalTrafficPolicy Local Service's external IPs get a `drop`
                // element (a Service without endpoints gets `goto reject-chain`).
                etp_rules: Some(Etp::Local),
                proxy_mode: self.services.source.map(super::remedy::proxy_mode),
                ..event.facts.clone()
            },
            ..event
        };
        self.stats.drops_confirming += 1;
        self.stats.confirmed.etp_local_drop += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

/// kube-proxy's nftables `no-endpoint-services` drop of a call to an ETP Local Service's LB
/// IP (kubernetes#131765). The version range: nftables mode exists since 1.29 (alpha; beta
/// 1.31, GA 1.33, KEP-3866); kubernetes#132456 moved the filter chains after DNAT (1.34) and
/// was cherry-picked to 1.33 only (#133969, merged 2025-09-09; no 1.32/1.31 cherry-pick found).
/// A pod's call is also dropped by a fixed kube-proxy without a local-traffic detector (no
/// "short-circuit pod traffic" rule in the external chain: `proxier.localDetector
/// .IsImplemented()` in `pkg/proxy/nftables/proxier.go`).
pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let at = sock(e.vip.unwrap_or(e.dst), e.vip_port.unwrap_or(e.dst_port));
    let proto = e.proto.as_str();
    let svc = service_key(e)
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    // Who called, and what happened to the call (`probe check`'s risk has no caller yet).
    let (caller, fate) = match e.facts.source {
        SourceKind::Node => (
            "a host-network caller on this node called".to_string(),
            "dropped the call before it reached",
        ),
        SourceKind::Unknown => (
            "this node's pods (and, before kubernetes#132456, its host-network callers) call"
                .to_string(),
            "drop such calls before they reach",
        ),
        _ => (
            format!("the pod {} called", e.src),
            "dropped the call before it reached",
        ),
    };
    let mut out = vec![format!(
        "Cause: {caller} {at}/{proto}, an LB IP of {svc}, which kube-proxy here handles as \
         externalTrafficPolicy Local without an endpoint on this node: in nftables mode it \
         writes that IP:port into its map no-endpoint-services with verdict drop, and its \
         filter chains {fate} an endpoint on another node \
         (kubernetes#131765). In iptables and IPVS mode kube-proxy sends a pod's such call to \
         the cluster-wide endpoints only when its local-traffic detector matches the pod \
         (kubernetes#112820: a pod outside it is dropped there too). Affected: kube-proxy 1.29 to 1.32 in nftables mode, and 1.33 \
         before the cherry-pick of kubernetes#132456 (#133969); and, for pod calls, any \
         release whose kube-proxy has no local-traffic detector."
    )];
    out.extend(mismatch(e));
    out.push(
        "Upgrade kube-proxy to a release with kubernetes#132456 (1.34, or a 1.33 patch release \
         with #133969), and give it a local-traffic detector (--detect-local-mode ClusterCIDR \
         with --cluster-cidr, or NodeCIDR, BridgeInterface, InterfaceNamePrefix; in \
         nftables mode the BridgeInterface and InterfaceNamePrefix detectors work only from \
         1.33.6, 1.34.2 and 1.35, kubernetes#134024) so that pod calls to the LB IP are \
         short-circuited to the cluster-wide endpoints."
            .to_string(),
    );
    if e.facts.etp() != Some(Etp::Cluster) {
        out.push(format!(
            "Or set externalTrafficPolicy: Cluster on {svc} (kube-proxy then writes no drop for \
             its LB IP; backends no longer see client source IPs)."
        ));
    }
    out.push(format!(
        "Or run an endpoint of {svc} on every node whose pods call {at} (a DaemonSet or a \
         topology spread), or have callers use the Service's cluster DNS name or ClusterIP."
    ));
    out
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, .. } = CauseAddresses::of(event);
    format!(
        "kube-proxy dropped a call from {} to {vip}/{proto}: an externalTrafficPolicy Local Service without an endpoint on this node, in nftables mode.",
        event.src
    )
}
