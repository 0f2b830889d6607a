//! `source_ranges_drop`: kube-proxy dropped a call from this node (a local pod's, or the
//! node's own) to an LB IP whose Service sets `loadBalancerSourceRanges`, because the caller's
//! source is outside those ranges.
//!
//! kube-proxy's nftables mode (kubernetes PR #122614, 1.30) writes each such LB IP:port into
//! its verdict map `firewall-ips` (`goto firewall-<HASH>-<ns>/<name>/<proto>/<port>`), whose
//! chain holds `ip saddr != { ranges } drop`; chain `firewall-check`, jumped from
//! `filter-prerouting` and `filter-output` before DNAT, applies it to every new connection, so
//! an in-cluster caller is dropped before any short-circuit. iptables mode has done the same
//! since 1.25 (PR #110289): the LB IP's nat chain `KUBE-FW-<HASH>` sends on only the sources
//! in the ranges, and the filter chain `KUBE-PROXY-FIREWALL` (jumped from `INPUT`, `FORWARD`
//! and `OUTPUT`) drops what was not DNATed (`-d <LB IP> --dport <port> -j DROP`). IPVS mode
//! since 1.25 too (PR #110628): ipsets `KUBE-LOAD-BALANCER-FW` and
//! `KUBE-LOAD-BALANCER-SOURCE-CIDR`, and the filter chain `KUBE-SOURCE-RANGES-FIREWALL`
//! (from `KUBE-PROXY-FIREWALL`, in `INPUT` and `FORWARD`) that drops what they do not return;
//! a pod's call to the LB IP (bound on kube-ipvs0) dies in `INPUT`, before IPVS. Upstream
//! keeps it (kubernetes#109575, open): its advice is to list the pod CIDR in the ranges. A LB
//! with `ipMode: Proxy` or published as a hostname gets no element: nothing is dropped on the
//! node.
//!
//! Confirmed from a netfilter drop (`NETFILTER_DROP`, or `NOT_SPECIFIED` at a netfilter site)
//! of a local pod's (or the node's) TCP/UDP packet to an (address, protocol, port) that has a
//! firewall entry (a `firewall-ips` element, a `KUBE-PROXY-FIREWALL` rule) in the service
//! table read from the live ruleset, with the source outside that entry's ranges. The kernel side reports these drops only for the entries'
//! addresses (`DROP_DESTINATIONS`, kept by the agent from each service table).

use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, facts::SourceKind, record::Packet, sock,
};

use super::{
    Correlator, DropInfo, Output,
    aggregate::dropped_call,
    drop_reason::is_local_call_netfilter_drop,
    evidence::{drop_line, service_name},
    remedy::cause::CauseAddresses,
    tuple_of,
};
use crate::state::{FirewallEntry, ServiceSource};

impl Correlator {
    /// The firewall entry whose ranges leave out a local pod's (or the node's) call that
    /// netfilter dropped; None for any other drop.
    pub(super) fn source_ranges_drop_entry(
        &self,
        packet: &Packet,
        info: &DropInfo,
    ) -> Option<FirewallEntry> {
        if !is_local_call_netfilter_drop(packet, info) {
            return None;
        }
        self.services
            .firewall_entry(packet.dst, packet.dport, packet.proto)
            .filter(|f| f.drops(packet.src))
            .cloned()
    }

    pub(super) fn confirm_source_ranges_drop(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        entry: FirewallEntry,
        out: &mut Vec<Output>,
    ) {
        let evidence = vec![
            drop_line(&info, &tuple_of(packet)),
            firewall_rule_line(self.services.source, packet, &entry),
            format!(
                "the caller {} is in none of the Service's loadBalancerSourceRanges",
                packet.src
            ),
        ];
        let key = AggregateKey::SourceRangesDrop {
            addr: packet.dst,
            port: packet.dport,
            proto: packet.proto,
        };
        // IPVS mode's sets name no Service: the table's entry for the LB IP:port does.
        let service = entry.service.clone().or_else(|| {
            self.services
                .serves(packet.dst, packet.dport, packet.proto)
                .and_then(|s| s.service.clone())
        });
        let mut event = dropped_call(
            &key,
            packet,
            &info,
            Outcome::Dropped,
            evidence,
            service.as_deref().map(service_name),
        );
        event.facts.proxy_mode = self.services.source.map(super::remedy::proxy_mode);
        self.stats.drops_confirming += 1;
        self.stats.confirmed.source_ranges_drop += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }
}

/// The rule that dropped the call, as the service table read it: nftables' `firewall-ips`
/// element and its chain, or iptables' `KUBE-PROXY-FIREWALL` rule and its `KUBE-FW-*` chain.
/// Both say `source outside { <ranges> }` (the remedy reads the ranges back).
fn firewall_rule_line(
    mode: Option<ServiceSource>,
    packet: &Packet,
    entry: &FirewallEntry,
) -> String {
    let proto = packet.proto.as_str();
    let of_service = entry
        .service
        .as_deref()
        .map(|c| format!(" of {c}"))
        .unwrap_or_default();
    if mode == Some(ServiceSource::Iptables) {
        let (cmd, host) = if packet.dst.is_ipv4() {
            ("iptables", 32)
        } else {
            ("ip6tables", 128)
        };
        let fw = entry.chain.as_deref().unwrap_or("KUBE-FW-*");
        let comment = entry
            .service
            .as_deref()
            .map(|c| format!(" -m comment --comment \"{c} traffic not accepted by {fw}\""))
            .unwrap_or_default();
        return format!(
            "kube-proxy's iptables rules ({cmd}): filter chain KUBE-PROXY-FIREWALL has -d \
             {}/{host} -p {proto} --dport {}{comment} -j DROP (INPUT, FORWARD and OUTPUT jump \
             to it for every new connection), and nat chain {fw} sends on (DNATs) only the \
             sources it lists, so every new connection from a source outside {{ {} }} is \
             dropped (kubernetes PR #110289)",
            packet.dst,
            packet.dport,
            entry.allowed_text(),
        );
    }
    if mode == Some(ServiceSource::Ipvs) {
        return ipvs_rule_line(packet, entry);
    }
    let family = if packet.dst.is_ipv4() { "ip" } else { "ip6" };
    format!(
        "kube-proxy's nftables rules (table {family} kube-proxy): map firewall-ips has the \
         element {} . {proto} . {}{of_service}, whose chain drops every new connection from a \
         source outside {{ {} }} ({family} saddr != {{ ... }} drop; chain firewall-check runs \
         it in prerouting and output, before DNAT)",
        packet.dst,
        packet.dport,
        entry.allowed_text(),
    )
}

/// IPVS mode's form (kubernetes `pkg/proxy/ipvs/proxier.go`; filter-table DROP since 1.25,
/// PR #110628): the ipsets and the filter chains that apply them.
fn ipvs_rule_line(packet: &Packet, entry: &FirewallEntry) -> String {
    let v6 = packet.dst.is_ipv6();
    // The IPv6 proxier's set names: `KUBE-6-` for `KUBE-`, cut to ipset's 31 characters
    // (kubernetes `pkg/proxy/ipvs/ipset.go`, `NewIPSet`).
    let (cmd, fw, cidr, ip) = if v6 {
        (
            "ip6tables",
            "KUBE-6-LOAD-BALANCER-FW",
            "KUBE-6-LOAD-BALANCER-SOURCE-CID",
            "KUBE-6-LOAD-BALANCER-SOURCE-IP",
        )
    } else {
        (
            "iptables",
            "KUBE-LOAD-BALANCER-FW",
            "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            "KUBE-LOAD-BALANCER-SOURCE-IP",
        )
    };
    format!(
        "kube-proxy's IPVS-mode rules ({cmd}, ipset): ipset {fw} has {},{}:{}, and filter chain \
         KUBE-PROXY-FIREWALL (INPUT and FORWARD jump to it) sends it to \
         KUBE-SOURCE-RANGES-FIREWALL, which returns only the sources ipset {cidr} (and \
         {ip}) lists for it and drops the rest, so every new connection \
         from a source outside {{ {} }} is dropped before IPVS (kubernetes PR #110628)",
        packet.dst,
        packet.proto.as_str(),
        packet.dport,
        entry.allowed_text(),
    )
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

/// The firewall's ranges as the evidence quoted them (`{ ... }`), when it did.
fn ranges_of(e: &LoopbackEvent) -> Option<&str> {
    e.evidence.iter().find_map(|l| {
        let (_, rest) = l.split_once("source outside { ")?;
        rest.split_once(" }").map(|(ranges, _)| ranges)
    })
}

/// kube-proxy's `loadBalancerSourceRanges` firewall dropped an in-cluster call to the LB IP
/// (kubernetes#109575; nftables PR #122614, iptables PR #110289).
pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let at = sock(e.vip.unwrap_or(e.dst), e.vip_port.unwrap_or(e.dst_port));
    let proto = e.proto.as_str();
    let svc = e
        .service
        .as_deref()
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    let ranges = ranges_of(e).map(|r| format!(" ({r})")).unwrap_or_default();
    let caller = match e.facts.source {
        SourceKind::Node => format!("a host-network caller on this node ({})", e.src),
        SourceKind::Unknown => "this node's pods and host-network callers".to_string(),
        _ => format!("the pod {}", e.src),
    };
    vec![
        format!(
            "Cause: {svc} sets loadBalancerSourceRanges{ranges}, and kube-proxy enforces them on \
             every node, in-cluster callers included: {caller} called {at}/{proto} from a \
             source outside them, and kube-proxy's firewall chain dropped the call before it \
             reached the LB or an endpoint (nftables mode since 1.30, kubernetes PR #122614; \
             iptables mode since 1.25, PR #110289; kubernetes#109575). An LB with ipMode: Proxy \
             or published as a hostname gets no such rule."
        ),
        format!(
            "Have in-cluster callers use the Service's cluster DNS name or its ClusterIP \
             instead of {at}: kube-proxy applies loadBalancerSourceRanges only to the LB IP."
        ),
        format!(
            "Or add the pod CIDR (and the node IPs, for host-network callers) to \
             loadBalancerSourceRanges of {svc}. Side effect: the cloud applies the same ranges \
             to the LB's own firewall or security group, so those sources may then reach the \
             LB from the network too."
        ),
    ]
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, .. } = CauseAddresses::of(event);
    format!(
        "kube-proxy dropped a call from {} to {vip}/{proto}: the source is outside the Service's loadBalancerSourceRanges.",
        event.src
    )
}
