//! Evidence: every line a confirmed event carries, one fact per line.

use std::net::IpAddr;

use probe_contract::{
    Layer, Listener, Proto, Tag,
    facts::AddressOwner,
    record::{EgressRecord, Packet, tcp_flags},
    sock,
};

use super::{
    Correlator, DropInfo, MS, SEC,
    conntrack::{CtAnswer, egress_tuple},
    drop_reason::{LocalSourceDrop, local_source_drop},
    tuple_of,
};
use crate::state::{
    ConntrackEntry, NodePortEntry, ServiceSource, ServiceTable, Tuple,
    iptables::ACCESS_FILTER_CHAIN,
};

/// `12.345678901s` (monotonic).
pub(super) fn fmt_ts(ns: u64) -> String {
    format!("{}.{:09}s", ns / SEC, ns % SEC)
}

pub(super) fn fmt_tuple(t: &Tuple) -> String {
    format!(
        "{} -> {}/{}",
        sock(t.src, t.sport),
        sock(t.dst, t.dport),
        t.proto.as_str()
    )
}

pub(super) fn fmt_flags(p: &Packet) -> String {
    if p.proto != Proto::Tcp {
        return String::new();
    }
    let names = [
        (tcp_flags::SYN, "SYN"),
        (tcp_flags::ACK, "ACK"),
        (tcp_flags::FIN, "FIN"),
        (tcp_flags::RST, "RST"),
    ];
    let set: Vec<&str> = names
        .iter()
        .filter(|(bit, _)| p.tcp_flags & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    if set.is_empty() {
        String::new()
    } else {
        format!(" [{}]", set.join(","))
    }
}

pub(super) fn fmt_entry(e: &ConntrackEntry) -> String {
    format!(
        "orig {}, reply {}, {}, {}, {}{}",
        fmt_tuple(&e.orig),
        fmt_tuple(&e.reply),
        if e.snat { "SRC_NAT" } else { "no SRC_NAT" },
        if e.dnat { "DST_NAT" } else { "no DST_NAT" },
        if e.seen_reply {
            "SEEN_REPLY"
        } else {
            "no SEEN_REPLY"
        },
        e.tcp_state
            .as_deref()
            .map(|s| format!(", state {s}"))
            .unwrap_or_default()
    )
}

/// `namespace/name` out of the service table's `namespace/name:port`.
pub(super) fn service_name(s: &str) -> String {
    s.split(':').next().unwrap_or(s).to_string()
}

pub(super) fn source_name(t: &ServiceTable) -> &'static str {
    match t.source {
        Some(ServiceSource::Ipvs) => "IPVS",
        Some(ServiceSource::Iptables) => "kube-proxy iptables rules",
        Some(ServiceSource::Nftables) => "kube-proxy nftables tables",
        None => "unknown source",
    }
}

pub(super) fn table_missing(t: &ServiceTable) -> bool {
    t.source.is_none() && t.services.is_empty() && t.nodeports.is_empty()
}

pub(super) fn suspect_line(ts: u64, nic: &str, p: &Packet) -> String {
    format!(
        "tc ingress on {nic} at {}: {}{}, source tagged {}",
        fmt_ts(ts),
        fmt_tuple(&tuple_of(p)),
        fmt_flags(p),
        match p.src_tag {
            Some(Tag::Vip) =>
                "vip (a local address: a VIP bound on the VIP interface or made local by a route)",
            Some(Tag::Pod) => "pod (a pod on this node)",
            Some(Tag::Node) => "node",
            None => "nothing",
        }
    )
}

pub(super) fn drop_line(d: &DropInfo, t: &Tuple) -> String {
    let reason = if d.inferred {
        format!(
            "{} (inferred from the drop site: this kernel's kfree_skb reports no reason)",
            d.reason.name
        )
    } else {
        format!("{} (code {})", d.reason.name, d.reason.code)
    };
    format!(
        "kfree_skb at {}: {}{} dropped{}, reason {}{}",
        fmt_ts(d.ts),
        fmt_tuple(t),
        d.dnat_to
            .map(|(ip, port)| format!(" (already DNATed to {ip}:{port} by the NodePort rules)"))
            .unwrap_or_default(),
        d.iface
            .as_deref()
            .map(|i| format!(" after arriving on {i}"))
            .unwrap_or_default(),
        reason,
        d.location
            .as_deref()
            .map(|l| format!(" at {l}"))
            .unwrap_or_default()
    )
}

/// Why the drop of a packet from `src` (tagged vip) is a local-source drop.
pub(super) fn local_source_line(info: &DropInfo, src: IpAddr) -> String {
    match local_source_drop(&info.reason, info.location.as_deref()) {
        Some(LocalSourceDrop::UnspecifiedAtRouteInput) => format!(
            "reason NOT_SPECIFIED at the route-input site {}: kernels without the \
             IP_*_SOURCE reasons drop a local (martian) source there unnamed; the source \
             {} is tagged vip, so this is a local-source drop",
            info.location.as_deref().unwrap_or("?"),
            src
        ),
        _ if info.inferred => format!(
            "no drop reason on this kernel, but the drop site {} is the route-input path and \
             the source {} is tagged vip (a local address): a local-source drop",
            info.location.as_deref().unwrap_or("?"),
            src
        ),
        _ => format!(
            "reason {}: source validation failed because {} is a local address of this \
             node (tagged vip)",
            info.reason.name, src
        ),
    }
}

/// What a received VIP-source packet proves, and what it does not: its source is whatever the
/// sender wrote. A health check and a SYN spoofed from the VIP by any host whose packets
/// reach this NIC are the same bytes; the agent counts it as the LB's because only the LB in
/// the node's path is expected to send from its VIP (SECURITY.md).
pub(super) fn unauthenticated_source_line(src: IpAddr) -> String {
    format!(
        "the source {src} is not authenticated: the agent takes the packet for the load \
         balancer's because only an LB in this node's path sends from its VIP; a host that can \
         reach this NIC and spoofs {src} produces the same record"
    )
}

/// A TCP SYN that left `nic` with a bound VIP as source.
pub(super) fn vip_egress_line(ts: u64, nic: &str, p: &Packet) -> String {
    format!(
        "tc egress on {nic} at {}: {}{} left with source {}, a VIP bound on this node's VIP \
         interface: a call to the LB IP from this node, forwarded to another node without SNAT; \
         that node binds the VIP too (kube-proxy IPVS mode binds LB IPs on every node) and drops \
         it as a local source",
        fmt_ts(ts),
        fmt_tuple(&tuple_of(p)),
        fmt_flags(p),
        p.src
    )
}

/// Why a dropped `Vip`-source packet is no health check: where it was going.
pub(super) fn destination_line(p: &Packet, services: &ServiceTable) -> String {
    let to = sock(p.dst, p.dport);
    let what = match p.dst_tag {
        Some(Tag::Pod) => format!("{to} is a pod of this node"),
        Some(Tag::Vip) => format!("{to} is a VIP bound on this node"),
        Some(Tag::Node) => format!(
            "{to} is a node address, and {}/{} is no NodePort in the service table ({})",
            p.dport,
            p.proto.as_str(),
            source_name(services)
        ),
        None => format!("{to} is no address of this node"),
    };
    format!(
        "destination {what}: not a health check; a packet from the VIP to it was forwarded by \
         another node that binds the VIP (a call to the LB IP, not SNATed)"
    )
}

/// What the kernel answers a connection to an unserved port with (`filtered`: kube-proxy's
/// access filter REJECTed it).
pub(super) fn refusal_line(proto: Proto, filtered: bool) -> String {
    if filtered {
        return format!(
            "{}: the REJECT answers with ICMP port unreachable (connection refused)",
            proto.as_str().to_uppercase()
        );
    }
    match proto {
        Proto::Udp => {
            "UDP: the kernel answers an unserved port with ICMP port unreachable".to_string()
        }
        _ => "TCP: the kernel answers an unserved port with RST (connection refused)".to_string(),
    }
}

/// The pod's un-SNATed egress to the LB.
pub(super) fn egress_line(r: &EgressRecord, node_sourced: bool) -> String {
    format!(
        "EGRESS_FLOWS: {} left {} at {} without SNAT ({} {} calling the LB)",
        fmt_tuple(&egress_tuple(r)),
        r.nic,
        fmt_ts(r.ts_ns),
        if node_sourced {
            "the node's own address"
        } else {
            "pod"
        },
        r.src
    )
}

/// What made a local address local (kube-ipvs0, a NIC, a `local` route and its protocol).
pub(super) fn owner_line(ip: IpAddr, owner: &AddressOwner) -> String {
    format!("local address owner: {ip} is local through {owner}")
}

impl Correlator {
    /// The owner of the local address `ip`, with its evidence line when known.
    pub(super) fn owner_evidence(
        &self,
        ip: IpAddr,
        evidence: &mut Vec<String>,
    ) -> Option<AddressOwner> {
        let owner = self.owner_of(ip);
        if let Some(o) = &owner {
            evidence.push(owner_line(ip, o));
        }
        owner
    }
}

/// A host-listener hairpin: the port is no NodePort, the exact layer-4 match is the proof.
pub(super) fn host_listener_line(p: &Packet) -> String {
    format!(
        "{} is no NodePort of the service table: the LB sent the request to a host-network \
         listener of this node (no Service rule on that port); confirmed on the exact layer-4 \
         match alone",
        sock(p.dst, p.dport)
    )
}

/// The socket that serves a host-listener hairpin's port (sock_diag).
pub(super) fn listener_line(
    p: &Packet,
    answer: &Result<Option<Listener>, crate::state::ReadFailed>,
) -> String {
    let at = format!("{}/{}", sock(p.dst, p.dport), p.proto.as_str());
    match answer {
        Ok(Some(l)) => format!("listener of {at} on this node: {l}"),
        Ok(None) => format!("no socket listens on {at} now (sock_diag)"),
        Err(e) => format!("listener of {at} unknown: the sock_diag look-up failed: {e}"),
    }
}

/// What makes a hairpin node-sourced.
pub(super) fn node_sourced_line(p: &Packet) -> String {
    format!(
        "node-sourced: the looping packet's source {} is this node's own address (a \
         host-network client, or pod traffic masqueraded to the node IP); the LB kept it and \
         sent the request back to its source, where it is a local (martian) source",
        p.src
    )
}

/// How the hairpin suspect (`p`, seen at `ts`) was tied to the egress record; the sender is
/// the node when `p`'s source is tagged node (a node-sourced loop), else the pod.
pub(super) fn layer_line(layer: Layer, ts: u64, r: &EgressRecord, p: &Packet) -> String {
    let sender = if p.src_tag == Some(Tag::Node) {
        "node"
    } else {
        "pod"
    };
    match layer {
        Layer::L4 => format!(
            "layer 4: same source port {} {} ms after the egress: the LB forwarded the \
             {sender}'s own connection back to this node",
            p.sport,
            ts.saturating_sub(r.ts_ns) / MS
        ),
        Layer::L7 => format!(
            "layer 7: new connection from the same {sender} {} ms after its latest egress \
             to {}: the LB proxied the request back to this node",
            ts.saturating_sub(r.ts_ns) / MS,
            sock(r.dst, r.dport)
        ),
    }
}

/// Conntrack of the egress flow `et` (`entry` None: not answered; Some(None): no entry).
pub(super) fn egress_ct_line(et: Option<&Tuple>, ct: &CtAnswer) -> String {
    match ct {
        CtAnswer::Found(e) => format!("conntrack (egress flow): {}", fmt_entry(e)),
        CtAnswer::Missing => format!(
            "conntrack: no entry for the egress flow {}",
            et.map(fmt_tuple).unwrap_or_default()
        ),
        CtAnswer::Failed(error) => format!(
            "conntrack look-up of the egress flow failed ({error}): whether it was SNATed \
             cannot be confirmed (snat unknown)"
        ),
        CtAnswer::Expired => "conntrack look-up of the egress flow was not answered".to_string(),
    }
}

/// Conntrack of the hairpin flow `t`: what became of it.
pub(super) fn outcome_line(t: &Tuple, ct: &CtAnswer) -> String {
    match ct {
        CtAnswer::Found(e) if e.tcp_state.as_deref() == Some("CLOSE") => format!(
            "conntrack (hairpin flow): {}: the pod answered the reply that came from the \
             node instead of the VIP with RST",
            fmt_entry(e)
        ),
        CtAnswer::Found(e) => format!(
            "conntrack (hairpin flow): {}: no usable reply reached the pod",
            fmt_entry(e)
        ),
        CtAnswer::Missing => format!("conntrack: no entry for the hairpin flow {}", fmt_tuple(t)),
        CtAnswer::Failed(error) => format!(
            "conntrack look-up of the hairpin flow failed ({error}): whether the caller was \
             reset cannot be confirmed"
        ),
        CtAnswer::Expired => "conntrack look-up of the hairpin flow was not answered".to_string(),
    }
}

impl Correlator {
    /// Adds the NodePort's service table entry to `evidence`; returns the Service name.
    pub(super) fn nodeport_evidence(
        &self,
        p: &Packet,
        evidence: &mut Vec<String>,
    ) -> Option<String> {
        if table_missing(&self.services) {
            evidence.push("no service table was available".to_string());
            return None;
        }
        match self.services.nodeport(p.dport, p.proto) {
            Some(n) => {
                evidence.push(format!(
                    "service table ({}): NodePort {}/{} belongs to {}",
                    source_name(&self.services),
                    n.port,
                    n.proto.as_str(),
                    n.service.as_deref().unwrap_or("an unnamed Service")
                ));
                n.service.as_deref().map(service_name)
            }
            None => {
                evidence.push(format!(
                    "service table ({}): no NodePort {}/{}",
                    source_name(&self.services),
                    p.dport,
                    p.proto.as_str()
                ));
                None
            }
        }
    }

    pub(super) fn vip_served_evidence(&self, vip: IpAddr, evidence: &mut Vec<String>) {
        for s in self
            .services
            .services
            .iter()
            .filter(|s| s.vip == vip)
            .take(3)
        {
            evidence.push(format!(
                "service table: {} is a virtual service{} (the LB VIP is handled locally)",
                s.endpoint(),
                s.service
                    .as_deref()
                    .map(|n| format!(" of {n}"))
                    .unwrap_or_default()
            ));
        }
    }

    /// The service table's view of an unserved VIP:port (or that there was no table).
    pub(super) fn unserved_table_evidence(&self, packet: &Packet, evidence: &mut Vec<String>) {
        if table_missing(&self.services) {
            evidence.push(format!(
                "no service table was available (no IPVS services or kube-proxy rules read): \
                 could not check who serves {}; confirmed from the drop alone",
                packet.dst
            ));
            return;
        }
        evidence.push(format!(
            "service table ({}): no entry for {}/{}",
            source_name(&self.services),
            sock(packet.dst, packet.dport),
            packet.proto.as_str()
        ));
        let served: Vec<String> = self
            .services
            .services
            .iter()
            .filter(|s| s.vip == packet.dst)
            .map(|s| format!("{}/{}{}", s.port, s.proto.as_str(), s.name_suffix()))
            .collect();
        if !served.is_empty() {
            evidence.push(format!(
                "service table: {} is served on {}",
                packet.dst,
                served.join(", ")
            ));
        }
    }

    /// kube-proxy's IPVS access filter, named with its REJECT rule(s).
    pub(super) fn access_filter_evidence(&self, evidence: &mut Vec<String>) {
        evidence.push(format!(
            "netfilter dropped it in the filter table's INPUT: kube-proxy's IPVS access filter \
             (chain {ACCESS_FILTER_CHAIN}, kube-proxy >= 1.25) REJECTs new connections to a \
             kube-ipvs0 address (ipset KUBE-IPVS-IPS) unless the ip,port is a service \
             (ipsets KUBE-LOAD-BALANCER, KUBE-CLUSTER-IP, KUBE-EXTERNAL-IP, ...)"
        ));
        for r in self
            .services
            .access_filter
            .iter()
            .filter(|r| r.contains("REJECT"))
            .take(2)
        {
            evidence.push(format!("filter rule: {r}"));
        }
    }

    /// The hairpin's NodePort in the service table (with its `externalTrafficPolicy: Local`
    /// rules), or its absence; returns the entry.
    pub(super) fn hairpin_nodeport_evidence(
        &self,
        p: &Packet,
        evidence: &mut Vec<String>,
    ) -> Option<NodePortEntry> {
        let np = self.services.nodeport(p.dport, p.proto).cloned();
        match &np {
            Some(n) => evidence.push(format!(
                "service table ({}): NodePort {}/{} belongs to {}{}",
                source_name(&self.services),
                n.port,
                n.proto.as_str(),
                n.service.as_deref().unwrap_or("an unnamed Service"),
                match (n.local_only, self.services.source) {
                    (true, Some(ServiceSource::Ipvs)) => format!(
                        " with externalTrafficPolicy: Local (in ipset KUBE-NODE-PORT-LOCAL-{}: \
                         kube-proxy RETURNs before KUBE-MARK-MASQ, no masquerade)",
                        n.proto.as_str().to_ascii_uppercase()
                    ),
                    (true, _) => " with externalTrafficPolicy: Local rules (no masquerade)".into(),
                    (false, _) => String::new(),
                }
            )),
            None if table_missing(&self.services) => {
                evidence.push("no service table was available".to_string())
            }
            None => evidence.push(format!(
                "service table ({}): no NodePort {}/{}",
                source_name(&self.services),
                p.dport,
                p.proto.as_str()
            )),
        }
        np
    }

    /// The masquerade rules that did not apply to an un-SNATed egress (at most three).
    pub(super) fn masquerade_evidence(&self, evidence: &mut Vec<String>) {
        if self.services.masquerade_rules.is_empty() {
            evidence.push("nat table: no masquerade rule for pod egress found".to_string());
        } else {
            for r in self.services.masquerade_rules.iter().take(3) {
                evidence.push(format!(
                    "nat rule: {r} (did not apply to this flow: it left unSNATed)"
                ));
            }
        }
    }
}
