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
