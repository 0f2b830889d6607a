//! `service_self_loop`: a pod called its own Service (ClusterIP, LB IP or NodePort) and the
//! endpoint chosen was the pod itself; without the hairpin SNAT the packet came back with
//! source = destination = the pod's address (kubernetes#53775, #85877, #134884; "a Pod fails
//! to reach itself via the Service IP" in Kubernetes' debugging guide).
//!
//! The kernel reports a drop of a packet whose source and destination are the same local pod
//! address, from any network namespace (`foreign_netns`: the pod's own). Such a packet exists
//! only because something DNATed the pod's own packet back to it. Where it died says which
//! piece was missing ([`missing_piece`]):
//! - in the pod's namespace as a local source: the hairpin SNAT (kube-proxy's masquerade mark
//!   for an endpoint calling itself: `KUBE-SEP-* -s <pod> -j KUBE-MARK-MASQ` in iptables mode,
//!   `ip saddr <pod> jump mark-for-masquerade` in nftables mode, the `KUBE-LOOP-BACK` entry in
//!   IPVS mode) did not apply;
//! - on the node, at the pod's bridge port: br_netfilter ran kube-proxy's DNAT while the frame
//!   was bridged, and the bridge may not send it back out the port it came in on
//!   (`hairpin_mode` 0: the kubelet's `--hairpin-mode` is not `hairpin-veth`).
//!
//! The packet dropped may be the *answer* ([`is_answer`]): in IPVS mode with br_netfilter,
//! the call is masqueraded (KUBE-LOOP-BACK) and reaches the pod, but its reply, addressed to
//! the node, is un-NATed back to the pod's own address while bridged, and the bridge may not
//! send it back out the port it came in on. Seen on VM 6.12: a SYN-ACK from pod:endpoint port
//! to pod:client port dies in `br_handle_frame_finish`. The correlator turns such a drop into
//! the call it answers (pod:client port -> pod:endpoint port) before anything else, so the
//! port, the ipset entry and the Service are the call's, not the client's ephemeral port.
//!
//! Confirmation: the drop, then [`Query::SelfLoop`]: the node's conntrack entry whose reply
//! tuple is the call reversed (original: the pod to the Service; reply: from the pod to the
//! pod, i.e. no SNAT) and the node's pieces ([`SelfLoopFacts`]). An entry with SNAT dismisses
//! a dropped call (`self_loop_snat_seen`: the pod was answered from the node's address), not a
//! dropped answer at a bridge port: there the SNAT is in the evidence and the bridge is the
//! missing piece. Confirmation needs the kernel's evidence of the DNAT ([`kernel_evidence`]):
//! the entry's DST_NAT towards a Service address; a pod forging its own address both ways
//! leaves none and is counted (`drops_unmatched`), never reported. A pod-namespace drop with
//! no entry is not confirmed; a drop on the node with no entry (a bridge drop dies before
//! conntrack confirms the connection) only with the bridge's own evidence (hairpin mode off,
//! br_netfilter on, the pod's port a Service endpoint), and says so; the Service is then named
//! from the service table's endpoints. A pod-namespace drop must be a local-source drop.
//! Retransmits of one connect fold into its confirmation. Aggregate: (drop site, pod, port,
//! Service address, proto).

use std::net::IpAddr;

pub(super) mod texts;

use probe_contract::{AggregateKey, LoopbackEvent, Outcome, SnatState, record::Packet, sock};

use super::{
    Correlator, DropInfo, Output, Query, QueryCtx, SEC,
    aggregate::NewEvent as _,
    drop_reason::local_source_drop,
    evidence::{drop_line, fmt_entry, fmt_tuple, service_name, source_name, table_missing},
    held::PendingSelfLoop,
    tuple_of,
};
use crate::state::{ConntrackEntry, SelfLoopFacts, ServiceSource, ServiceTable, Tuple};

/// How long a confirmed connect's retransmits (same tuple) fold into it instead of counting
/// again: Linux gives up a SYN after 6 retries, 127 s.
const ATTEMPT_NS: u64 = 130 * SEC;

/// Whether a self-addressed packet is the answer to the pod's call rather than the call: a
/// TCP segment with ACK set. A looped call never completes its handshake, so the pod sends
/// no ACK-bearing segment of it that could loop; the SYN-ACK (and its retransmits) is the
/// pod's answer. UDP and other protocols carry no direction: read as the call. Pure.
pub fn is_answer(p: &Packet) -> bool {
    p.proto == probe_contract::Proto::Tcp
        && p.tcp_flags & probe_contract::record::tcp_flags::ACK != 0
}

/// The call a self-addressed drop belongs to: the packet itself, or for an answer the packet
/// reversed (same address both ways, tags both Pod). Pure.
pub fn call_of(p: &Packet) -> Packet {
    if !is_answer(p) {
        return p.clone();
    }
    Packet {
        sport: p.dport,
        dport: p.sport,
        src_tag: p.dst_tag,
        dst_tag: p.src_tag,
        src: p.dst,
        dst: p.src,
        ..p.clone()
    }
}

/// What the node's state and the drop say was missing: the contract's fact (the remedy is
/// built from it, `remedy::build`).
pub use probe_contract::facts::SelfLoopMissing as Missing;

/// Which piece the drop site and the node's state say was missing. Pure.
pub fn missing_piece(foreign_netns: bool, facts: &SelfLoopFacts) -> Missing {
    if foreign_netns {
        return Missing::HairpinSnat {
            loop_back_entry: facts.loop_back_entry,
        };
    }
    match &facts.bridge_port {
        Some(p) if !p.hairpin_mode => Missing::HairpinMode {
            bridge: p.bridge.clone(),
            port: p.port.clone(),
            br_netfilter: facts.br_netfilter,
        },
        _ => Missing::Undetermined,
    }
}

/// The Service a self-loop went through: the conntrack entry's original destination when
/// there is one, else the only service whose endpoints hold `pod:port`. Returns the address
/// called (ip, port) and the service table's `namespace/name:port`. Pure.
pub fn called_service(
    services: &ServiceTable,
    entry: Option<&ConntrackEntry>,
    pod: IpAddr,
    port: u16,
    proto: probe_contract::Proto,
) -> (Option<(IpAddr, u16)>, Option<String>) {
    if let Some(e) = entry {
        let name = services
            .serves(e.orig.dst, e.orig.dport, proto)
            .and_then(|s| s.service.clone())
            .or_else(|| {
                services
                    .nodeport(e.orig.dport, proto)
                    .and_then(|n| n.service.clone())
            });
        return (Some((e.orig.dst, e.orig.dport)), name);
    }
    let endpoint = sock(pod, port);
    let of_pod: Vec<_> = services
        .services
        .iter()
        .filter(|s| s.proto == proto && s.backends.contains(&endpoint))
        .collect();
    match of_pod.as_slice() {
        [s] => (Some((s.vip, s.port)), s.service.clone()),
        // Several addresses of one Service (its ClusterIP and LB IP): the Service is known,
        // the address called is not.
        [first, rest @ ..]
            if first.service.is_some() && rest.iter().all(|s| s.service == first.service) =>
        {
            (None, first.service.clone())
        }
        _ => (None, None),
    }
}

/// Whether the node's state shows what only a Service DNAT back to the pod produces; without
/// it a self-addressed drop is not confirmed (issue #36, E4: a pod with CAP_NET_RAW forges
/// frames with its own address both ways and sends them to its gateway, which routes them
/// back in; they die exactly like a loop). Pure.
///
/// - An entry in the node's conntrack: DNAT (IPS_DST_NAT, or a reply tuple whose source is
///   not the original destination, as IPVS leaves it) with an original destination that is a
///   Service address of the service table (ClusterIP, LB IP, or a NodePort's port); with no
///   table at all, the DNAT alone. A forged packet's entry is pod -> pod, nothing rewritten.
/// - No entry, or a failed or missing look-up, in the pod's namespace: not confirmed. The
///   real call crossed the node's conntrack, which confirms its entry when the packet leaves
///   for the pod, before the pod drops it; its retransmits are looked up again.
/// - No entry (or a failed look-up) for a drop on the node: the bridge case, where the frame
///   dies at the port before conntrack confirms the connection and no kernel record of the
///   DNAT remains for userspace. Accepted only with the bridge's own evidence: the pod's port
///   on a bridge with hairpin mode off, br_netfilter on (the bridge runs kube-proxy's NAT),
///   and the destination `pod:port` an endpoint of a Service in the table. A pod on such a
///   bridge could still forge a frame to its own MAC; the node then does have the broken
///   piece named (hairpin mode off under br_netfilter breaks the pod's real self-calls), so
///   the event stays true about the node. Decision of issue #36, E4.
pub fn kernel_evidence(
    services: &ServiceTable,
    entry: Option<&ConntrackEntry>,
    foreign_netns: bool,
    facts: &SelfLoopFacts,
    packet: &Packet,
) -> bool {
    if let Some(e) = entry {
        let rewritten = e.dnat || (e.reply.src, e.reply.sport) != (e.orig.dst, e.orig.dport);
        let to_a_service = table_missing(services)
            || services
                .serves(e.orig.dst, e.orig.dport, packet.proto)
                .is_some()
            || services.nodeport(e.orig.dport, packet.proto).is_some();
        return rewritten && to_a_service;
    }
    if foreign_netns {
        return false;
    }
    let bridge_without_hairpin = facts.bridge_port.as_ref().is_some_and(|b| !b.hairpin_mode);
    let endpoint = sock(packet.dst, packet.dport);
    let an_endpoint = services
        .services
        .iter()
        .any(|s| s.proto == packet.proto && s.backends.contains(&endpoint));
    bridge_without_hairpin && facts.br_netfilter == Some(true) && an_endpoint
}

/// The conntrack answer of a self-loop.
enum Ct {
    Found(ConntrackEntry),
    Missing,
    Failed(String),
    Unanswered,
}

impl Correlator {
    /// A drop of a self-addressed local pod packet: held until the node's state answers.
    pub(super) fn on_self_loop_drop(
        &mut self,
        info: DropInfo,
        dropped: Packet,
        out: &mut Vec<Output>,
    ) {
        self.stats.drops_seen += 1;
        let answer = is_answer(&dropped).then(|| tuple_of(&dropped));
        let packet = call_of(&dropped);
        let t = tuple_of(&packet);
        // A retransmit of a connect already confirmed or still being looked at.
        if self
            .self_loop_done
            .get(&t)
            .is_some_and(|ts| info.ts >= *ts && info.ts - *ts <= ATTEMPT_NS)
        {
            self.stats.drops_confirming += 1;
            self.stats.self_loop_retransmits += 1;
            return;
        }
        if self.self_loops.contains_key(&t) {
            self.stats.drops_confirming += 1;
            self.stats.self_loop_retransmits += 1;
            return;
        }
        // In the pod's namespace only a local-source drop is the loop (the pod refusing its
        // own address); on the node any drop of it is (the bridge port, or a filter).
        if info.foreign_netns
            && local_source_drop(&info.reason, info.location.as_deref()).is_none()
            && !info.inferred
        {
            self.stats.drops_unmatched += 1;
            return;
        }
        if !self.has_room() {
            self.stats.drops_unmatched += 1;
            return;
        }
        let id = self.new_query(QueryCtx::SelfLoop { flow: t.clone() });
        out.push(Output::Query(Query::SelfLoop {
            id,
            tuple: t.clone(),
            iface: info.iface.clone(),
            reply_dropped: answer.is_some(),
        }));
        self.held_drops += 1;
        self.self_loops.insert(
            t,
            PendingSelfLoop {
                info,
                packet,
                answer,
            },
        );
    }

    /// The agent's answer (or its absence: `None` after the query timed out).
    pub(super) fn on_self_loop_answer(
        &mut self,
        flow: &Tuple,
        answer: Option<(
            Result<Option<ConntrackEntry>, crate::state::ReadFailed>,
            SelfLoopFacts,
        )>,
        out: &mut Vec<Output>,
    ) {
        let Some(p) = self.self_loops.remove(flow) else {
            return;
        };
        self.held_drops -= 1;
        let (ct, facts) = match answer {
            Some((Ok(Some(e)), f)) => (Ct::Found(e), f),
            Some((Ok(None), f)) => (Ct::Missing, f),
            Some((Err(e), f)) => (Ct::Failed(e.0), f),
            None => (Ct::Unanswered, SelfLoopFacts::default()),
        };
        // An answer un-NATed back to the pod and dropped at a bridge port is the loop even
        // though the call was masqueraded.
        let answer_at_bridge = p.answer.is_some() && !p.info.foreign_netns;
        if let Ct::Found(e) = &ct
            && (e.snat || e.reply.dst != p.packet.src)
            && !answer_at_bridge
        {
            // SNATed after all: the pod was answered from the node's address.
            self.stats.self_loop_snat_seen += 1;
            self.stats.drops_unmatched += 1;
            return;
        }
        let entry = match &ct {
            Ct::Found(e) => Some(e),
            _ => None,
        };
        if !kernel_evidence(
            &self.services,
            entry,
            p.info.foreign_netns,
            &facts,
            &p.packet,
        ) {
            // No DNAT seen by the kernel: a packet the pod forged (raw socket, AF_PACKET)
            // with its own address both ways looks the same at the drop. Counted, never an
            // event; a real loop's retransmit is looked up again.
            self.stats.drops_unmatched += 1;
            return;
        }
        self.confirm_self_loop(p, &ct, &facts, out);
    }

    fn confirm_self_loop(
        &mut self,
        p: PendingSelfLoop,
        ct: &Ct,
        facts: &SelfLoopFacts,
        out: &mut Vec<Output>,
    ) {
        let PendingSelfLoop {
            info,
            packet,
            answer,
        } = p;
        let t = tuple_of(&packet);
        let entry = match ct {
            Ct::Found(e) => Some(e),
            _ => None,
        };
        let (called, svc) = called_service(
            &self.services,
            entry,
            packet.src,
            packet.dport,
            packet.proto,
        );
        let missing = missing_piece(info.foreign_netns, facts);

        let mut evidence = vec![
            drop_line(&info, answer.as_ref().unwrap_or(&t)),
            self_addressed_line(&info, &packet, answer.as_ref(), &t),
            conntrack_line(ct, &packet, &t, info.foreign_netns),
        ];
        if entry.is_none() {
            evidence.push(service_table_line(
                &self.services,
                called,
                svc.as_deref(),
                &packet,
            ));
        }
        evidence.extend(facts_lines(facts, &packet));
        evidence.push(missing_line(&missing, &packet, self.services.source));

        let key = AggregateKey::ServiceSelfLoop {
            in_pod: info.foreign_netns,
            pod: packet.src,
            port: packet.dport,
            service: called,
            proto: packet.proto,
        };
        let mut event = LoopbackEvent {
            vip: called.map(|(ip, _)| ip),
            vip_port: called.map(|(_, port)| port),
            drop_reason: Some(info.reason.name.clone()),
            drop_location: info.location.clone(),
            snat: match ct {
                Ct::Failed(_) | Ct::Unanswered => SnatState::Unknown,
                Ct::Found(e) if e.snat => SnatState::Yes,
                // The drop's source is the pod itself: nothing rewrote it.
                _ => SnatState::No,
            },
            evidence,
            nic: info.iface.clone(),
            service: svc.as_deref().map(service_name),
            ..LoopbackEvent::new(&key, &packet, info.ts, Outcome::Dropped)
        };
        // The remedy is built from these (`remedy::build`, again after attribution).
        event.facts.self_loop = Some(missing);
        event.facts.proxy_mode = self.services.source.map(super::remedy::proxy_mode);
        self.stats.confirmed.service_self_loop += 1;
        self.stats.drops_confirming += 1;
        if self.self_loop_done.len() < self.cfg.max_pending {
            self.self_loop_done.insert(t, info.ts);
        }
        out.push(Output::Report(self.record(key, event, info.ts)));
    }

    /// Forgets confirmed connects whose retransmits are over.
    pub(super) fn expire_self_loops(&mut self, now: u64) {
        self.self_loop_done
            .retain(|_, ts| ts.saturating_add(ATTEMPT_NS) >= now);
    }
}

/// What the self-addressed packet was and where it died.
fn self_addressed_line(
    info: &DropInfo,
    packet: &Packet,
    answer: Option<&Tuple>,
    t: &Tuple,
) -> String {
    if let Some(a) = answer {
        format!(
            "source = destination = {}, a pod of this node: the dropped packet is the \
             pod's answer ({}) to its own call {}, dropped on the node{}",
            packet.src,
            sock(a.src, a.sport),
            fmt_tuple(t),
            info.iface
                .as_deref()
                .map(|i| format!(" after arriving on {i}"))
                .unwrap_or_default()
        )
    } else if info.foreign_netns {
        format!(
            "source = destination = {}, a pod of this node, dropped in the pod's own network \
             namespace as a local source: the pod's own packet was sent back to it unSNATed",
            packet.src
        )
    } else {
        format!(
            "source = destination = {}, a pod of this node, dropped on the node{}: the pod's \
             own packet was DNATed back to it unSNATed",
            packet.src,
            info.iface
                .as_deref()
                .map(|i| format!(" after arriving on {i}"))
                .unwrap_or_default()
        )
    }
}

/// What conntrack says about the call: whether it was masqueraded.
fn conntrack_line(ct: &Ct, packet: &Packet, t: &Tuple, in_pod: bool) -> String {
    match ct {
        Ct::Found(e) if e.snat || e.reply.dst != packet.src => format!(
            "conntrack: {}: the pod called {}, the call was masqueraded (answered to {}), \
             and the answer, un-NATed back to the pod's own address in the bridge, had to \
             leave by the port it came in on",
            fmt_entry(e),
            sock(e.orig.dst, e.orig.dport),
            sock(e.reply.dst, e.reply.dport)
        ),
        Ct::Found(e) => format!(
            "conntrack: {}: the pod called {} and the reply would come from the pod to \
             itself (no SNAT)",
            fmt_entry(e),
            sock(e.orig.dst, e.orig.dport)
        ),
        Ct::Missing => format!(
            "conntrack: no entry answers as {}{}",
            fmt_tuple(&t.reversed()),
            if in_pod {
                ""
            } else {
                " (a packet dropped in the bridge dies before conntrack confirms its \
                 connection)"
            }
        ),
        Ct::Failed(e) => format!(
            "conntrack look-up failed ({e}): whether the call was SNATed cannot be confirmed"
        ),
        Ct::Unanswered => "the node's state (conntrack, ipsets, bridge) was not read in \
                           time: confirmed from the drop alone"
            .to_string(),
    }
}

/// Which Service the pod called, from the service table's endpoints (no conntrack entry said
/// it).
fn service_table_line(
    services: &ServiceTable,
    called: Option<(IpAddr, u16)>,
    svc: Option<&str>,
    packet: &Packet,
) -> String {
    match (called, svc) {
        (Some((ip, port)), name) => format!(
            "service table ({}): {} is the endpoint of {}{}",
            source_name(services),
            sock(packet.src, packet.dport),
            sock(ip, port),
            name.map(|n| format!(" ({n})")).unwrap_or_default()
        ),
        (None, Some(name)) => format!(
            "service table ({}): {} is the endpoint of several addresses of {name}: \
             which one was called is not known",
            source_name(services),
            sock(packet.src, packet.dport)
        ),
        _ if table_missing(services) => "no service table was available: the \
                                               Service called is not known"
            .to_string(),
        _ => format!(
            "service table ({}): no single service has the endpoint {}",
            source_name(services),
            sock(packet.src, packet.dport)
        ),
    }
}

/// The node's pieces as read.
fn facts_lines(f: &SelfLoopFacts, p: &Packet) -> Vec<String> {
    let mut out = Vec::new();
    let entry = format!("{},{}:{},{}", p.src, p.proto.as_str(), p.dport, p.src);
    let set = crate::state::ipset::loop_back_set(p.src.is_ipv6());
    match f.loop_back_entry {
        Some(true) => out.push(format!("ipset {set} holds {entry} (kube-proxy IPVS mode)")),
        Some(false) => out.push(format!(
            "ipset {set} lacks {entry}: kube-proxy's IPVS-mode hairpin masquerade does not \
             cover this endpoint"
        )),
        None => {}
    }
    if let Some(b) = &f.bridge_port {
        out.push(format!(
            "bridge: the pod is port {} of {}, hairpin_mode {}",
            b.port,
            b.bridge,
            u8::from(b.hairpin_mode)
        ));
    }
    let sysctl = if p.src.is_ipv6() {
        "bridge-nf-call-ip6tables"
    } else {
        "bridge-nf-call-iptables"
    };
    out.push(match f.br_netfilter {
        Some(on) => format!("br_netfilter: net.bridge.{sysctl} = {}", u8::from(on)),
        None => "br_netfilter: not loaded in this namespace (no net.bridge sysctls)".to_string(),
    });
    out
}

/// The verdict: which piece is missing.
fn missing_line(m: &Missing, p: &Packet, source: Option<ServiceSource>) -> String {
    match m {
        Missing::HairpinSnat {
            loop_back_entry: Some(false),
        } => format!(
            "missing: the hairpin SNAT; the KUBE-LOOP-BACK entry {},{}:{},{} is absent, so \
             KUBE-POSTROUTING did not masquerade the pod's call to itself",
            p.src,
            p.proto.as_str(),
            p.dport,
            p.src
        ),
        Missing::HairpinSnat {
            loop_back_entry: Some(true),
        } => "missing: the hairpin SNAT; KUBE-LOOP-BACK has the entry, yet nothing \
              masqueraded the call (KUBE-POSTROUTING's KUBE-LOOP-BACK MASQUERADE rule?)"
            .to_string(),
        Missing::HairpinSnat {
            loop_back_entry: None,
        } => format!(
            "missing: the hairpin SNAT; kube-proxy's masquerade mark for an endpoint calling \
             itself ({}) did not apply",
            texts::self_masq_rule(p.src, source)
        ),
        Missing::HairpinMode {
            bridge,
            port,
            br_netfilter,
        } => format!(
            "missing: hairpin mode on {bridge} port {port}{}: the bridge does not send a frame \
             back out the port it came in on",
            match br_netfilter {
                Some(true) => " (br_netfilter ran conntrack's NAT while the frame was bridged)",
                _ => "",
            }
        ),
        Missing::Undetermined => "missing: not determined (dropped on the node, not at a \
                                  bridge port without hairpin mode)"
            .to_string(),
    }
}

#[cfg(test)]
#[path = "self_loop_facts_tests.rs"]
mod tests;
