//! `stale_udp_conntrack`, the agent's side (pure: no I/O, no clock): which UDP conntrack
//! entries prove that a sender's datagrams to a Service go nowhere because conntrack keeps
//! them on a translation the Service no longer has (issue #51, shape 3).
//!
//! # The shape
//!
//! UDP has no connection to end: conntrack keeps an entry while datagrams keep coming (the
//! UDP timeout, 30 s unreplied by default, restarts with each), and every datagram of the
//! same 5-tuple takes the entry's translation, not the rules'. A sender with a fixed source
//! port (statsd, DNS, syslog) that sends more often than the timeout keeps its entry forever:
//! - DNATed to an endpoint that is no longer one (the pod is gone), when nothing deleted the
//!   entry: kube-proxy deletes such entries when an endpoint goes, but since Kubernetes 1.32
//!   its reconciler skips UDP Services scaled to zero (kubernetes#139628: 13 h of lost statsd;
//!   fixed by kubernetes PR #139629);
//! - with no DNAT at all, when the entry was made before the Service's rules existed: the
//!   Service has endpoints now, and the datagrams still go to the ClusterIP itself.
//!
//! # How it is seen
//!
//! Nothing is dropped where the NIC or `kfree_skb` programs would name it as a loop, and
//! watching every UDP datagram in eBPF would add work to every packet. conntrack has it: the
//! agent reads the UDP entries of the table's Service IPs with one kernel-filtered dump per
//! IP every [`DUMP_EVERY`] (`state::conntrack::dump_filtered`, as the PROXY-protocol proof),
//! and an entry is confirmed ([`confirm`]) when it is
//! - UDP, its original destination a Service IP:port of the service table (a ClusterIP or an
//!   LB IP), UNREPLIED (`IPS_SEEN_REPLY` unset);
//! - stale: DNATed to a reply source that is none of the Service's current endpoints (none
//!   when it has none), or not DNATed while the Service now has endpoints;
//! - still refreshed: seen in the previous dump too, and its timeout fell by less than the
//!   time between the two dumps (measured, not assumed: a slow machine only widens the gap),
//!   so a datagram passed after the first dump.
//!
//! A Service scaled to zero has no entry in the table's services (kube-proxy's iptables mode
//! writes no nat chain for it): when the iptables reader found kube-proxy's REJECT rule for it
//! ("<svc> has no endpoints", [`crate::state::NoEndpointReject`]), the Service is named from
//! that rule and an entry still DNATed to an endpoint is stale (it has none at all). A Service
//! neither lists cannot be named: such an entry is not reported.
//!
//! # Not in IPVS mode
//!
//! IPVS forwards each packet by its own connection table, not by conntrack's NAT
//! (`net/netfilter/ipvs/ip_vs_core.c`, `ip_vs_in_hook`): a packet without an IPVS connection
//! is scheduled to a current real server whatever conntrack holds for it
//! (`ip_vs_update_conntrack`, `ip_vs_xmit.c`, leaves a confirmed entry as it is), and a
//! connection whose real server is gone is expired under kube-proxy's `expire_nodest_conn=1`
//! (kubernetes `pkg/proxy/ipvs/proxier.go`, `NewProxier`) together with its conntrack entry.
//! So a sender that started before the virtual service keeps an un-NATed entry while its
//! datagrams reach the endpoint, one whose real server was deleted reaches the new one, and
//! one whose Service was scaled to zero and back (the virtual service kept with no real
//! server: each datagram dropped, no entry left) reaches the new endpoint through a fresh
//! entry (measured on real IPVS, 5.10 and 6.12: `tests/tests/ipvs_stale_udp.rs`). With the table
//! from IPVS mode ([`ServiceSource::Ipvs`]) nothing is dumped and no entry is stale.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use probe_contract::{AggregateKey, LoopbackEvent, LoopbackKind, Outcome, Proto, sock};

use super::{Correlator, Output};
use crate::state::{ConntrackEntry, ServiceSource, ServiceTable, Tuple};

/// How often the UDP entries of the Service IPs are read: well under the 30 s an unreplied
/// UDP entry lives without a datagram, so a sender that keeps one alive is seen in two dumps.
pub const DUMP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Service IPs dumped at most per round (every [`DUMP_EVERY`]): each dump is a kernel walk of
/// the whole table.
pub const MAX_DUMPED_IPS: usize = 64;

/// The most entries remembered between dumps, and confirmed (the rest wait for a later round).
const REMEMBERED_MAX: usize = 4096;

/// The timeout is read in whole seconds, rounded down at each dump: a fall of one second less
/// than the time between two dumps is rounding, not a datagram.
const ROUNDING_S: u64 = 1;

/// A stale entry as one dump saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeenAt {
    /// CLOCK_MONOTONIC of the dump.
    pub at_ns: u64,
    /// The entry's timeout then (seconds left).
    pub timeout_s: u32,
}

/// What the previous dump's stale entries were, by original tuple, and which of them were
/// already reported (the entry lives on: one report while it does).
#[derive(Debug, Default)]
pub(super) struct StaleUdpMemory {
    seen: HashMap<Tuple, SeenAt>,
    reported: HashSet<Tuple>,
}

impl Correlator {
    /// The stale UDP entries of one dump of the Service IPs' UDP entries ([`confirm`] against
    /// the previous dump), each reported once while its entry lives, as reports of
    /// `stale_udp_conntrack`. `now_ns`: CLOCK_MONOTONIC of the dump.
    pub fn stale_udp(&mut self, entries: &[ConntrackEntry], now_ns: u64) -> Vec<Output> {
        let (confirmed, seen) = confirm(entries, &self.services, &self.stale_udp.seen, now_ns);
        self.stale_udp.reported.retain(|t| seen.contains_key(t));
        self.stale_udp.seen = seen;
        let mut out = Vec::new();
        for s in confirmed {
            let reported = &mut self.stale_udp.reported;
            if reported.len() >= REMEMBERED_MAX || !reported.insert(s.orig.clone()) {
                continue;
            }
            let key = AggregateKey::StaleUdpConntrack {
                sender: s.orig.src,
                sender_port: s.orig.sport,
                service: s.orig.dst,
                service_port: s.orig.dport,
            };
            let mut event = LoopbackEvent {
                key: key.to_string(),
                vip: Some(s.orig.dst),
                vip_port: Some(s.orig.dport),
                service: Some(s.service.clone()),
                evidence: s.evidence,
                first_seen_ns: now_ns,
                last_seen_ns: now_ns,
                ..LoopbackEvent::between(
                    LoopbackKind::StaleUdpConntrack,
                    (s.orig.src, s.orig.sport),
                    s.sent_to,
                    Proto::Udp,
                    Outcome::NoReply,
                )
            };
            // The mode is a fact of every kube-proxy kind (the remedy's versions are its).
            event.facts.proxy_mode = self.services.source.map(super::remedy::proxy_mode);
            out.push(Output::Report(self.record(key, event, now_ns)));
        }
        out
    }

    /// The Service IPs whose UDP entries the next dump reads (at most [`MAX_DUMPED_IPS`]).
    pub fn stale_udp_dump_ips(&self) -> Vec<IpAddr> {
        dump_ips(&self.services)
    }
}

/// The UDP Service IPs of `table` (those without endpoints that kube-proxy REJECTs too),
/// sorted, once each, at most [`MAX_DUMPED_IPS`]; none in IPVS mode (see the module doc).
pub fn dump_ips(table: &ServiceTable) -> Vec<IpAddr> {
    if forwards_by_ipvs(table) {
        return Vec::new();
    }
    let mut ips: Vec<IpAddr> = table
        .services
        .iter()
        .filter(|s| s.proto == Proto::Udp)
        .map(|s| s.vip)
        .chain(
            table
                .no_endpoint_rejects
                .iter()
                .filter(|r| r.proto == Proto::Udp)
                .map(|r| r.addr),
        )
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips.truncate(MAX_DUMPED_IPS);
    ips
}

/// One confirmed stale entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleUdp {
    /// The entry's original tuple: the sender and the Service IP:port.
    pub orig: Tuple,
    /// Where conntrack sends its datagrams: the stale endpoint, or the Service IP itself (no
    /// DNAT).
    pub sent_to: (IpAddr, u16),
    /// The Service, as the table names it (`namespace/name:port`), else its IP:port.
    pub service: String,
    /// What proves it, one line each.
    pub evidence: Vec<String>,
}

/// The entries of `entries` that are stale ([`stale_for`]) and refreshed since `previous`
/// saw them (see the module doc), and every stale entry as this dump saw it (the next
/// call's `previous`).
pub fn confirm(
    entries: &[ConntrackEntry],
    table: &ServiceTable,
    previous: &HashMap<Tuple, SeenAt>,
    now_ns: u64,
) -> (Vec<StaleUdp>, HashMap<Tuple, SeenAt>) {
    let mut confirmed = Vec::new();
    let mut seen = HashMap::new();
    for e in entries {
        let Some(service) = stale_for(e, table) else {
            continue;
        };
        let Some(timeout_s) = e.timeout_s else {
            continue;
        };
        if seen.len() >= REMEMBERED_MAX {
            break;
        }
        seen.insert(
            e.orig.clone(),
            SeenAt {
                at_ns: now_ns,
                timeout_s,
            },
        );
        let Some(before) = previous.get(&e.orig) else {
            continue;
        };
        let elapsed_s = now_ns.saturating_sub(before.at_ns) / 1_000_000_000;
        // Without a datagram the timeout falls by the time between the dumps.
        let refreshed = u64::from(timeout_s) + elapsed_s > u64::from(before.timeout_s) + ROUNDING_S;
        if !refreshed {
            continue;
        }
        confirmed.push(stale(e, service, *before, timeout_s, elapsed_s));
    }
    (confirmed, seen)
}

/// The Service an entry was sent to, as the table has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SentService<'a> {
    /// `namespace/name:port`, when the table names it.
    pub name: Option<&'a str>,
    /// Its current endpoints, `ip:port`.
    pub endpoints: &'a [String],
    /// Named by kube-proxy's REJECT rule for a Service without endpoints (not in the table's
    /// services).
    pub rejected: bool,
}

/// The Service whose IP:port `e` was sent to, when `e` is a stale UDP entry to it:
/// unreplied, and DNATed to no current endpoint, or not DNATed while it has endpoints. A
/// Service kube-proxy REJECTs for having no endpoints has none.
pub fn stale_for<'a>(e: &ConntrackEntry, table: &'a ServiceTable) -> Option<SentService<'a>> {
    if e.orig.proto != Proto::Udp || e.seen_reply || forwards_by_ipvs(table) {
        return None;
    }
    let (dst, dport) = (e.orig.dst, e.orig.dport);
    let service = match table.serves(dst, dport, Proto::Udp) {
        Some(s) => SentService {
            name: s.service.as_deref(),
            endpoints: &s.backends,
            rejected: false,
        },
        None => SentService {
            name: Some(&table.no_endpoint_reject(dst, dport, Proto::Udp)?.service),
            endpoints: &[],
            rejected: true,
        },
    };
    let not_nated = (e.reply.src, e.reply.sport) == (dst, dport);
    let stale = if e.dnat && !not_nated {
        !endpoints(service.endpoints).contains(&SocketAddr::new(e.reply.src, e.reply.sport))
    } else {
        !e.dnat && not_nated && !service.endpoints.is_empty()
    };
    stale.then_some(service)
}

/// The table is IPVS mode's: IPVS, not conntrack, decides where each datagram goes.
fn forwards_by_ipvs(table: &ServiceTable) -> bool {
    table.source == Some(ServiceSource::Ipvs)
}

/// The current endpoints (the `ip:port` backends that parse).
fn endpoints(backends: &[String]) -> Vec<SocketAddr> {
    backends.iter().filter_map(|b| b.parse().ok()).collect()
}

fn stale(
    e: &ConntrackEntry,
    service: SentService<'_>,
    before: SeenAt,
    timeout_s: u32,
    elapsed_s: u64,
) -> StaleUdp {
    let sender = sock(e.orig.src, e.orig.sport);
    let frontend = sock(e.orig.dst, e.orig.dport);
    let name = service
        .name
        .map_or_else(|| frontend.clone(), str::to_string);
    let current = if service.endpoints.is_empty() {
        "none".to_string()
    } else {
        service.endpoints.join(", ")
    };
    let sent_to = if e.dnat {
        (e.reply.src, e.reply.sport)
    } else {
        (e.orig.dst, e.orig.dport)
    };
    let translation = if e.dnat {
        format!(
            "DNATed to {}, which is no endpoint of it now",
            sock(sent_to.0, sent_to.1)
        )
    } else {
        "with no DNAT (made before the Service's rules existed)".to_string()
    };
    let mut evidence = vec![
        format!("conntrack: udp {sender} -> {frontend} {translation}; UNREPLIED"),
        format!("{name} ({frontend}/udp): current endpoints: {current}"),
        format!(
            "conntrack: the entry's timeout went from {}s to {timeout_s}s between two dumps \
             {elapsed_s}s apart: the sender still sends on it",
            before.timeout_s
        ),
    ];
    if service.rejected {
        evidence.insert(
            2,
            format!(
                "iptables: KUBE-SERVICES (filter) REJECTs {frontend}/udp: \"{name} has no \
                 endpoints\" (kube-proxy writes no nat chain for it)"
            ),
        );
    }
    StaleUdp {
        orig: e.orig.clone(),
        sent_to,
        service: name,
        evidence,
    }
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

/// The `conntrack` command line that deletes the event's entry.
pub fn delete_command(e: &LoopbackEvent) -> String {
    let service = e.vip.unwrap_or(e.dst);
    let family = if service.is_ipv6() { " -f ipv6" } else { "" };
    format!(
        "conntrack -D{family} -p udp --orig-src {} --orig-dst {service} --sport {} --dport {}",
        e.src,
        e.src_port,
        e.vip_port.unwrap_or(e.dst_port)
    )
}

/// Whether the event's entry had no DNAT (it was sent to the Service IP itself).
fn not_nated(e: &LoopbackEvent) -> bool {
    e.vip == Some(e.dst) && e.vip_port == Some(e.dst_port)
}

/// `stale_udp_conntrack`: delete the entry, and the kube-proxy that stops leaving it.
pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let svc = e
        .service
        .clone()
        .unwrap_or_else(|| "the Service".to_string());
    vec![
        format!("Cause: {}", cause(e)),
        format!(
            "Delete the entry on this node (as root): {}; the sender's next datagram then \
             takes {svc}'s current rules.",
            delete_command(e)
        ),
        "Since Kubernetes 1.32 kube-proxy's conntrack reconciler skips UDP Services scaled to \
         zero and leaves their entries (kubernetes#139628); run a kube-proxy with the fix, \
         kubernetes PR #139629, and until then delete such entries after scaling a UDP Service \
         to zero and back."
            .to_string(),
        "Or make the sender open a new socket (a new source port) when its datagrams go \
         unanswered or periodically: a new 5-tuple gets a new entry through the current rules."
            .to_string(),
    ]
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(e: &LoopbackEvent) -> String {
    let sender = sock(e.src, e.src_port);
    let service = e
        .vip
        .zip(e.vip_port)
        .map_or_else(|| "a Service IP".to_string(), |(ip, port)| sock(ip, port));
    if not_nated(e) {
        format!(
            "{sender} keeps sending UDP to {service} on a conntrack entry made before the Service's rules existed (no DNAT): each datagram refreshes it, so none reaches the Service's endpoints and none is answered."
        )
    } else {
        format!(
            "{sender} keeps sending UDP to {service} on a conntrack entry DNATed to {}, which is no endpoint of the Service now: each datagram refreshes it, so none reaches a current endpoint and none is answered.",
            sock(e.dst, e.dst_port)
        )
    }
}
