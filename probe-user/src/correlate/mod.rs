//! The correlator: turns kernel events, state look-ups and time into confirmed loopback events.
//!
//! Pure logic: no I/O, no tokio, no aya, no clock reads. Time comes in as arguments: event
//! `ts_ns` and [`Correlator::tick`]'s `now_ns`, both CLOCK_MONOTONIC nanoseconds. The agent
//! feeds every [`KernelEvent`] to [`Correlator::ingest`], answers every [`Query`] through
//! [`Correlator::answer`] (possibly after other events), and calls [`Correlator::tick`]
//! regularly (every few hundred ms): windows close and unanswered queries expire only there.
//!
//! # What confirms what
//!
//! - **`healthcheck_blackhole`**: a `Drop` of a packet whose `src_tag` is `Vip`, with a
//!   source-validation reason (any name ending in `_SOURCE`: `IP_LOCAL_SOURCE`,
//!   `IP_INVALID_SOURCE`), or with `NOT_SPECIFIED` at a route-input drop site (symbol prefix
//!   `ip_rcv_finish_core`, `ip_route_input`, `fib_validate_source`, `ip_rcv_finish`, compiler
//!   suffixes ignored), as older kernels report a martian source. The drop alone confirms
//!   when it names the interface it arrived on (the kernel side only reports drops of
//!   packets from monitored NICs); a `Suspect` of the same 5-tuple within `pair_window_ns`,
//!   in either order, adds its evidence (and supplies the NIC when the drop has none; such a
//!   drop waits `pair_window_ns` for its suspect). Service from the NodePort. Outcome
//!   `dropped`; `vip` = the packet's source, `vip_port` null, `snat` unknown.
//! - **`hairpin`**: a `Suspect` whose `src_tag` is `Pod`. The correlator asks for the pod's
//!   un-SNATed egress ([`Query::Egress`]). Layer 4: a record with the suspect's source port and
//!   protocol; else layer 7: the latest record of the same protocol sent at most `l7_window_ns`
//!   before the suspect whose destination is not a node or pod address (the suspect's own
//!   destination, or any address seen tagged `Node`/`Pod` in kernel events). Both must have
//!   started no later than the suspect and sent their latest opener (a record keeps its
//!   first and latest time: SYN retransmits refresh it) at most `l7_window_ns` before it. No record: not
//!   confirmed. Then [`Query::Conntrack`] of the egress tuple: an entry with SNAT means the
//!   flow was NATed after all (not confirmed; counted in `hairpin_snat_seen`); otherwise
//!   `snat` = no and the entry (or its absence) is evidence. Outcome: a `Drop` of the
//!   suspect's 5-tuple (before the report is emitted; either order, within `pair_window_ns`
//!   when it comes first) gives `dropped` with its reason; else once `hairpin_settle_ns` has
//!   passed since the suspect, [`Query::Conntrack`] of the suspect's tuple: TCP state `CLOSE`
//!   (the pod reset the asymmetric reply) gives `reset`, anything else (or no answer) gives
//!   `no_reply`. `vip`/`vip_port` = the egress record's destination; `dst`/`dst_port` = the
//!   node address and NodePort the LB sent it to. The remedy names
//!   `externalTrafficPolicy: Local` when the NodePort has Local rules.
//! - **`vip_port_unserved`**: a `Drop` with `dst_tag` `Vip`, a reason containing `NO_SOCKET`,
//!   TCP or UDP, for a VIP:port the service table does not serve. Outcome `refused` (a TCP
//!   RST; for UDP an ICMP port unreachable, said in the evidence). With no service table at
//!   all it still confirms, and says so in the evidence.
//! - Anything else is counted in [`CorrelatorStats`], never reported.
//!
//! Aggregation: see [`AggregateKey`]. Every confirmation, new or repeat, is a
//! [`Output::Report`]; `write_json` is false for a repeat within `json_repeat_ns` of the
//! aggregate's last written line.
//!
//! Memory: suspects waiting for a drop, drops waiting for a suspect, and hairpin candidates
//! together never exceed `max_pending`; beyond it new ones are counted (`pending_overflow`,
//! and as unconfirmed / unmatched) and dropped. Aggregates are capped at `max_aggregates`
//! (least recently seen evicted) and forgotten after `aggregate_ttl_ns` without a repeat.

mod remedy;
pub mod replay;
mod report;
mod rules;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

pub use self::report::{AggregateKey, Layer, LoopbackEvent, LoopbackKind, Outcome, SnatState};
use self::{
    remedy::HairpinCause,
    report::sock,
    rules::{LocalSourceDrop, is_no_socket, local_source_drop},
};
use crate::{
    event::{DropReason, EgressRecord, KernelEvent, Packet, Proto, Tag, tcp_flags},
    state::{ConntrackEntry, ServiceSource, ServiceTable, Tuple},
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// Windows and bounds. All times are nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CorrelatorConfig {
    /// Suspect <-> drop of the same 5-tuple, either order. Default 2 s.
    pub pair_window_ns: u64,
    /// How long before a hairpin suspect a layer-7 egress record may have left. Default 10 s.
    pub l7_window_ns: u64,
    /// After a hairpin suspect, how long to wait for a drop before asking conntrack what became
    /// of the flow. Default 1.5 s.
    pub hairpin_settle_ns: u64,
    /// A repeat of an aggregate within this long of its last written JSON line is reported
    /// with `write_json: false`. Default 10 s.
    pub json_repeat_ns: u64,
    /// An unanswered query expires after this long. Default 5 s.
    pub query_timeout_ns: u64,
    /// An aggregate with no repeat for this long is forgotten (its next occurrence is new).
    /// Default 1 h.
    pub aggregate_ttl_ns: u64,
    /// Bound on pending suspects + pending drops + hairpin candidates. Default 4096.
    pub max_pending: usize,
    /// Bound on aggregates kept. Default 1024.
    pub max_aggregates: usize,
    /// Bound on node/pod addresses remembered from event tags (layer-7 matching). Default 4096.
    pub max_known_addrs: usize,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        CorrelatorConfig {
            pair_window_ns: 2 * SEC,
            l7_window_ns: 10 * SEC,
            hairpin_settle_ns: 1_500 * MS,
            json_repeat_ns: 10 * SEC,
            query_timeout_ns: 5 * SEC,
            aggregate_ttl_ns: 3_600 * SEC,
            max_pending: 4096,
            max_aggregates: 1024,
            max_known_addrs: 4096,
        }
    }
}

/// What the correlator hands back: a report for the sinks, or a question for the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "reports are the common case and the agent matches on them by value"
)]
pub enum Output {
    Report(Report),
    Query(Query),
}

/// One confirmation (new or repeat) of an aggregate. Metrics count every report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The aggregate after this occurrence (its `count` includes it).
    pub event: LoopbackEvent,
    /// First occurrence of this aggregate (or first since it was forgotten).
    pub is_new: bool,
    /// Write a JSON line: false for a repeat within `json_repeat_ns` of the last line written.
    pub write_json: bool,
}

/// A look-up the agent must answer through [`Correlator::answer`] with the same `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Query {
    /// All `EGRESS_FLOWS` entries whose source address is `src`.
    Egress { id: u64, src: IpAddr },
    /// The conntrack entry whose original tuple is exactly `tuple`.
    Conntrack { id: u64, tuple: Tuple },
}

impl Query {
    pub fn id(&self) -> u64 {
        match self {
            Query::Egress { id, .. } | Query::Conntrack { id, .. } => *id,
        }
    }
}

/// The agent's answer to a [`Query`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    Egress {
        id: u64,
        records: Vec<EgressRecord>,
    },
    Conntrack {
        id: u64,
        entry: Option<ConntrackEntry>,
    },
}

/// Suspects seen, by source tag.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TagCounts {
    pub node: u64,
    pub vip: u64,
    pub pod: u64,
    pub untagged: u64,
}

impl TagCounts {
    pub fn total(&self) -> u64 {
        self.node + self.vip + self.pod + self.untagged
    }
}

/// Confirmations (reports, repeats included), by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindCounts {
    pub healthcheck_blackhole: u64,
    pub hairpin: u64,
    pub vip_port_unserved: u64,
}

/// Counters. Invariants (checked by the tests):
/// `suspects_seen.total() == suspects_confirmed + suspects_unconfirmed + pending_suspects`,
/// `drops_seen == drops_confirming + drops_unmatched + pending_drops`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CorrelatorStats {
    pub suspects_seen: TagCounts,
    /// Suspects that are part of a confirmed event.
    pub suspects_confirmed: u64,
    /// Suspects that were not confirmed (window passed, no egress record, SNAT seen, no
    /// rule for their tag, or no room).
    pub suspects_unconfirmed: u64,
    pub drops_seen: u64,
    /// Drops that are part of a confirmed event.
    pub drops_confirming: u64,
    /// Drops that confirmed nothing.
    pub drops_unmatched: u64,
    pub confirmed: KindCounts,
    /// Suspects currently waiting (for a drop, an answer, or the settle time).
    pub pending_suspects: u64,
    /// Drops currently waiting for their suspect.
    pub pending_drops: u64,
    /// Pending entries (suspects, drops, hairpin candidates); never above `max_pending`.
    pub pending: u64,
    /// Suspects or drops turned away because `max_pending` was reached.
    pub pending_overflow: u64,
    /// Hairpin candidates dismissed because conntrack showed the egress flow SNATed.
    pub hairpin_snat_seen: u64,
    /// Hairpin candidates dismissed because no egress record matched (or no answer came).
    pub hairpin_no_egress: u64,
    pub queries_issued: u64,
    pub queries_expired: u64,
    /// Answers to unknown (expired or already answered) queries.
    pub answers_stale: u64,
    pub aggregates: u64,
    pub aggregates_evicted: u64,
}

// ---------------------------------------------------------------------------------------------
// Internal state

/// A `Vip`-source suspect waiting for its drop.
struct VipSuspect {
    ts: u64,
    nic: String,
    packet: Packet,
    n: u64,
}

/// A drop, as evidence.
#[derive(Clone)]
struct DropInfo {
    ts: u64,
    iface: Option<String>,
    reason: DropReason,
    location: Option<String>,
    /// The destination the kernel saw at the drop, when kube-proxy's DNAT had already
    /// rewritten it (the packet then carries the pre-DNAT destination of its suspect).
    dnat_to: Option<(IpAddr, u16)>,
}

/// A drop kept for pairing with a later suspect of the same tuple.
struct RecentDrop {
    info: DropInfo,
    packet: Packet,
    /// Already part of a confirmation (kept so a late suspect is absorbed into it).
    confirmed: Option<AggregateKey>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for the egress answer.
    AwaitEgress,
    /// Waiting for conntrack of the egress tuple (query id).
    AwaitSnat(u64),
    /// Egress proven; waiting for a drop until the settle time.
    Settling,
    /// Waiting for conntrack of the hairpin tuple (query id).
    AwaitOutcome(u64),
}

struct EgressMatch {
    record: EgressRecord,
    layer: Layer,
}

/// A hairpin candidate (a `Pod`-source suspect), keyed by its 5-tuple.
struct Flow {
    seq: u64,
    ts: u64,
    nic: String,
    packet: Packet,
    /// Suspects of this tuple folded in (retransmits).
    n_suspects: u64,
    stage: Stage,
    drop: Option<DropInfo>,
    n_drops: u64,
    egress: Option<EgressMatch>,
    /// Evidence gathered after the egress match (conntrack of the egress flow).
    evidence: Vec<String>,
}

enum QueryCtx {
    Egress { src: IpAddr, flows: Vec<Tuple> },
    Snat { flow: Tuple },
    Outcome { flow: Tuple },
}

struct PendingQuery {
    issued: u64,
    ctx: QueryCtx,
}

struct Aggregate {
    event: LoopbackEvent,
    last_json_ns: u64,
}

/// See the [module documentation](self).
pub struct Correlator {
    cfg: CorrelatorConfig,
    services: ServiceTable,
    now: u64,
    next_id: u64,
    next_seq: u64,
    last_sweep: u64,
    vip_suspects: HashMap<Tuple, VipSuspect>,
    /// NodePort DNAT translations seen when a drop paired with its suspect: (endpoint, port,
    /// proto) -> the node address and NodePort the LB sent to. Lets a drop whose suspect the
    /// kernel deduplicated (a SYN retransmit) still be named by its NodePort. Bounded.
    dnat_seen: HashMap<(IpAddr, u16, Proto), (IpAddr, u16)>,
    drops: HashMap<Tuple, RecentDrop>,
    flows: HashMap<Tuple, Flow>,
    queries: HashMap<u64, PendingQuery>,
    /// Egress query in flight per source address (shared by its flows).
    egress_inflight: HashMap<IpAddr, u64>,
    aggregates: HashMap<AggregateKey, Aggregate>,
    known_local: HashSet<IpAddr>,
    known_order: VecDeque<IpAddr>,
    /// Suspects / unconfirmed drops held in the maps above (kept incrementally: O(1) stats).
    held_suspects: u64,
    held_drops: u64,
    stats: CorrelatorStats,
}

fn tuple_of(p: &Packet) -> Tuple {
    Tuple {
        src: p.src,
        dst: p.dst,
        sport: p.sport,
        dport: p.dport,
        proto: p.proto,
    }
}

fn egress_tuple(r: &EgressRecord) -> Tuple {
    Tuple {
        src: r.src,
        dst: r.dst,
        sport: r.sport,
        dport: r.dport,
        proto: r.proto,
    }
}

/// `12.345678901s` (monotonic).
fn fmt_ts(ns: u64) -> String {
    format!("{}.{:09}s", ns / SEC, ns % SEC)
}

fn fmt_tuple(t: &Tuple) -> String {
    format!(
        "{} -> {}/{}",
        sock(t.src, t.sport),
        sock(t.dst, t.dport),
        t.proto.as_str()
    )
}

fn fmt_flags(p: &Packet) -> String {
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

fn fmt_entry(e: &ConntrackEntry) -> String {
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
fn service_name(s: &str) -> String {
    s.split(':').next().unwrap_or(s).to_string()
}

fn source_name(t: &ServiceTable) -> &'static str {
    match t.source {
        Some(ServiceSource::Ipvs) => "IPVS",
        Some(ServiceSource::Iptables) => "kube-proxy iptables rules",
        None => "unknown source",
    }
}

fn table_missing(t: &ServiceTable) -> bool {
    t.source.is_none() && t.services.is_empty() && t.nodeports.is_empty()
}

impl Correlator {
    pub fn new(cfg: CorrelatorConfig) -> Self {
        Correlator {
            cfg,
            services: ServiceTable::default(),
            now: 0,
            next_id: 1,
            next_seq: 0,
            last_sweep: 0,
            vip_suspects: HashMap::new(),
            dnat_seen: HashMap::new(),
            drops: HashMap::new(),
            flows: HashMap::new(),
            queries: HashMap::new(),
            egress_inflight: HashMap::new(),
            aggregates: HashMap::new(),
            known_local: HashSet::new(),
            known_order: VecDeque::new(),
            held_suspects: 0,
            held_drops: 0,
            stats: CorrelatorStats::default(),
        }
    }

    pub fn config(&self) -> &CorrelatorConfig {
        &self.cfg
    }

    /// Replaces the service table (used at confirmation time).
    pub fn set_services(&mut self, table: ServiceTable) {
        self.services = table;
    }

    pub fn stats(&self) -> &CorrelatorStats {
        &self.stats
    }

    /// Feeds one kernel event.
    pub fn ingest(&mut self, ev: KernelEvent) -> Vec<Output> {
        let mut out = Vec::new();
        self.now = self.now.max(ev.ts_ns());
        self.learn(ev.packet());
        if self.pending_len() >= self.cfg.max_pending
            && self.now >= self.last_sweep.saturating_add(self.cfg.pair_window_ns / 4)
        {
            self.expire(self.now, &mut out);
        }
        match ev {
            KernelEvent::Suspect { ts_ns, nic, packet } => {
                self.on_suspect(ts_ns, nic, packet, &mut out)
            }
            KernelEvent::Drop {
                ts_ns,
                iface,
                packet,
                reason,
                location,
            } => {
                let mut info = DropInfo {
                    ts: ts_ns,
                    iface,
                    reason,
                    location,
                    dnat_to: None,
                };
                let packet = self.undo_dnat(packet, &mut info);
                self.on_drop(info, packet, &mut out)
            }
        }
        self.refresh();
        out
    }

    /// Takes the agent's answer to a query.
    pub fn answer(&mut self, answer: Answer) -> Vec<Output> {
        let mut out = Vec::new();
        let id = match &answer {
            Answer::Egress { id, .. } | Answer::Conntrack { id, .. } => *id,
        };
        let Some(q) = self.queries.remove(&id) else {
            self.stats.answers_stale += 1;
            return out;
        };
        match (q.ctx, answer) {
            (QueryCtx::Egress { src, flows }, Answer::Egress { records, .. }) => {
                self.egress_inflight.remove(&src);
                for t in flows {
                    self.on_egress(&t, Some(&records), &mut out);
                }
            }
            (QueryCtx::Snat { flow }, Answer::Conntrack { entry, .. }) => {
                self.on_snat(&flow, Some(entry), &mut out);
            }
            (QueryCtx::Outcome { flow }, Answer::Conntrack { entry, .. }) => {
                self.on_outcome(&flow, Some(entry), &mut out);
            }
            (ctx, _) => {
                // Wrong answer type for the id: keep waiting for the right one.
                self.queries.insert(
                    id,
                    PendingQuery {
                        issued: q.issued,
                        ctx,
                    },
                );
                self.stats.answers_stale += 1;
            }
        }
        self.refresh();
        out
    }

    /// Advances time: closes windows, issues settle-time queries, expires what waited too long.
    pub fn tick(&mut self, now_ns: u64) -> Vec<Output> {
        let mut out = Vec::new();
        self.now = self.now.max(now_ns);
        self.expire(self.now, &mut out);
        self.refresh();
        out
    }

    // -----------------------------------------------------------------------------------------

    fn pending_len(&self) -> usize {
        self.vip_suspects.len() + self.drops.len() + self.flows.len()
    }

    fn has_room(&mut self) -> bool {
        if self.pending_len() < self.cfg.max_pending {
            true
        } else {
            self.stats.pending_overflow += 1;
            false
        }
    }

    fn refresh(&mut self) {
        let s = &mut self.stats;
        s.pending_suspects = self.held_suspects;
        s.pending_drops = self.held_drops;
        s.pending = (self.vip_suspects.len() + self.drops.len() + self.flows.len()) as u64;
        s.aggregates = self.aggregates.len() as u64;
    }

    fn learn(&mut self, p: &Packet) {
        let mut add = |ip: IpAddr, tag: Option<Tag>| {
            if matches!(tag, Some(Tag::Node | Tag::Pod)) && self.known_local.insert(ip) {
                self.known_order.push_back(ip);
                while self.known_order.len() > self.cfg.max_known_addrs {
                    if let Some(old) = self.known_order.pop_front() {
                        self.known_local.remove(&old);
                    }
                }
            }
        };
        add(p.src, p.src_tag);
        add(p.dst, p.dst_tag);
    }

    fn new_query(&mut self, ctx: QueryCtx) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.stats.queries_issued += 1;
        self.queries.insert(
            id,
            PendingQuery {
                issued: self.now,
                ctx,
            },
        );
        id
    }

    fn within(&self, a: u64, b: u64) -> bool {
        a.abs_diff(b) <= self.cfg.pair_window_ns
    }

    // ----- suspects ---------------------------------------------------------------------------

    fn on_suspect(&mut self, ts: u64, nic: String, packet: Packet, out: &mut Vec<Output>) {
        match packet.src_tag {
            Some(Tag::Vip) => self.stats.suspects_seen.vip += 1,
            Some(Tag::Pod) => self.stats.suspects_seen.pod += 1,
            Some(Tag::Node) => self.stats.suspects_seen.node += 1,
            None => self.stats.suspects_seen.untagged += 1,
        }
        match packet.src_tag {
            Some(Tag::Vip) => self.on_vip_suspect(ts, nic, packet, out),
            Some(Tag::Pod) => self.on_pod_suspect(ts, nic, packet, out),
            // No rule uses node-source or untagged suspects: counted only.
            _ => self.stats.suspects_unconfirmed += 1,
        }
    }

    fn on_vip_suspect(&mut self, ts: u64, nic: String, packet: Packet, out: &mut Vec<Output>) {
        let t = tuple_of(&packet);
        if let Some(d) = self.drops.get(&t)
            && self.within(d.info.ts, ts)
        {
            if let Some(key) = d.confirmed.clone() {
                // The drop came first and already confirmed: fold the suspect in as evidence.
                self.stats.suspects_confirmed += 1;
                let line = suspect_line(ts, &nic, &packet);
                if let Some(agg) = self.aggregates.get_mut(&key)
                    && !agg.event.evidence.contains(&line)
                {
                    agg.event.evidence.insert(0, line);
                }
                return;
            }
            // A drop without an interface waited for this suspect.
            if let Some(d) = self.drops.remove(&t) {
                self.held_drops -= 1;
                let s = VipSuspect {
                    ts,
                    nic,
                    packet,
                    n: 1,
                };
                self.confirm_blackhole(&d.packet, d.info, Some(s), out);
                return;
            }
        }
        if let Some(s) = self.vip_suspects.get_mut(&t) {
            s.n += 1;
            self.held_suspects += 1;
            return;
        }
        if !self.has_room() {
            self.stats.suspects_unconfirmed += 1;
            return;
        }
        self.vip_suspects.insert(
            t,
            VipSuspect {
                ts,
                nic,
                packet,
                n: 1,
            },
        );
        self.held_suspects += 1;
    }

    fn on_pod_suspect(&mut self, ts: u64, nic: String, packet: Packet, out: &mut Vec<Output>) {
        let t = tuple_of(&packet);
        if let Some(f) = self.flows.get_mut(&t) {
            f.n_suspects += 1;
            self.held_suspects += 1;
            return;
        }
        // A drop of this tuple that came first.
        let early_drop = match self.drops.get(&t) {
            Some(d) if d.confirmed.is_none() && self.within(d.info.ts, ts) => {
                self.drops.remove(&t).map(|d| d.info)
            }
            _ => None,
        };
        if early_drop.is_none() && !self.has_room() {
            self.stats.suspects_unconfirmed += 1;
            return;
        }
        // An early drop moves from `drops` into the flow: `held_drops` is unchanged.
        let n_drops = u64::from(early_drop.is_some());
        self.held_suspects += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.flows.insert(
            t.clone(),
            Flow {
                seq,
                ts,
                nic,
                packet,
                n_suspects: 1,
                stage: Stage::AwaitEgress,
                drop: early_drop,
                n_drops,
                egress: None,
                evidence: Vec::new(),
            },
        );
        let src = t.src;
        match self.egress_inflight.get(&src).copied() {
            Some(id) => {
                if let Some(PendingQuery {
                    ctx: QueryCtx::Egress { flows, .. },
                    ..
                }) = self.queries.get_mut(&id)
                {
                    flows.push(t);
                }
            }
            None => {
                let id = self.new_query(QueryCtx::Egress {
                    src,
                    flows: vec![t],
                });
                self.egress_inflight.insert(src, id);
                out.push(Output::Query(Query::Egress { id, src }));
            }
        }
    }

    // ----- drops ------------------------------------------------------------------------------

    /// kube-proxy's NodePort DNAT runs in PREROUTING, before the route lookup that drops
    /// local-source and rp_filter packets: such a drop carries the DNAT target as destination,
    /// its suspect (seen at tc ingress, before netfilter) the NodePort the LB sent to. When no
    /// pending suspect or flow has the drop's exact tuple, pair it by source (address, port,
    /// protocol) within the pair window, and give it the suspect's destination back.
    fn undo_dnat(&mut self, mut packet: Packet, info: &mut DropInfo) -> Packet {
        let t = tuple_of(&packet);
        if self.vip_suspects.contains_key(&t) || self.flows.contains_key(&t) {
            return packet;
        }
        let same_source =
            |k: &Tuple| k.src == t.src && k.sport == t.sport && k.proto == t.proto && k.sport != 0;
        let found = self
            .vip_suspects
            .iter()
            .filter(|(k, v)| same_source(k) && self.within(v.ts, info.ts))
            .map(|(_, v)| &v.packet)
            .chain(
                self.flows
                    .iter()
                    .filter(|(k, f)| same_source(k) && self.within(f.ts, info.ts))
                    .map(|(_, f)| &f.packet),
            )
            .next();
        let post = (packet.dst, packet.dport, packet.proto);
        if let Some(seen) = found {
            info.dnat_to = Some((packet.dst, packet.dport));
            if self.dnat_seen.len() < self.cfg.max_known_addrs || self.dnat_seen.contains_key(&post)
            {
                self.dnat_seen.insert(post, (seen.dst, seen.dport));
            }
            packet.dst = seen.dst;
            packet.dport = seen.dport;
            packet.dst_tag = seen.dst_tag;
        } else if packet.src_tag == Some(Tag::Vip)
            && let Some((dst, dport)) = self.dnat_seen.get(&post).copied()
        {
            info.dnat_to = Some((packet.dst, packet.dport));
            packet.dst = dst;
            packet.dport = dport;
            packet.dst_tag = Some(Tag::Node);
        }
        packet
    }

    fn on_drop(&mut self, info: DropInfo, packet: Packet, out: &mut Vec<Output>) {
        self.stats.drops_seen += 1;
        let t = tuple_of(&packet);

        if packet.src_tag == Some(Tag::Vip)
            && local_source_drop(&info.reason, info.location.as_deref()).is_some()
        {
            let suspect = match self.vip_suspects.get(&t) {
                Some(s) if self.within(s.ts, info.ts) => self.vip_suspects.remove(&t),
                _ => None,
            };
            if let Some(s) = &suspect {
                self.held_suspects -= s.n;
            }
            if info.iface.is_none() && suspect.is_none() {
                // Nothing says which interface it came in on: wait for the suspect.
                if self.has_room() {
                    self.drops.insert(
                        t,
                        RecentDrop {
                            info,
                            packet,
                            confirmed: None,
                        },
                    );
                    self.held_drops += 1;
                } else {
                    self.stats.drops_unmatched += 1;
                }
                return;
            }
            self.confirm_blackhole(&packet, info, suspect, out);
            return;
        }

        if packet.dst_tag == Some(Tag::Vip)
            && is_no_socket(&info.reason)
            && matches!(packet.proto, Proto::Tcp | Proto::Udp)
            && self
                .services
                .serves(packet.dst, packet.dport, packet.proto)
                .is_none()
        {
            self.confirm_unserved(&packet, info, out);
            return;
        }

        if let Some(f) = self.flows.get_mut(&t) {
            f.n_drops += 1;
            self.held_drops += 1;
            if f.drop.is_none() {
                f.drop = Some(info);
            }
            if matches!(f.stage, Stage::Settling | Stage::AwaitOutcome(_)) {
                if let Stage::AwaitOutcome(id) = f.stage {
                    self.queries.remove(&id);
                }
                self.confirm_hairpin(&t, Outcome::Dropped, Vec::new(), out);
            }
            return;
        }

        if packet.src_tag == Some(Tag::Pod) && !self.drops.contains_key(&t) && self.has_room() {
            // May be a hairpin whose suspect is still on its way.
            self.drops.insert(
                t,
                RecentDrop {
                    info,
                    packet,
                    confirmed: None,
                },
            );
            self.held_drops += 1;
            return;
        }
        self.stats.drops_unmatched += 1;
    }

    // ----- confirmations ----------------------------------------------------------------------

    fn confirm_blackhole(
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
        match local_source_drop(&info.reason, info.location.as_deref()) {
            Some(LocalSourceDrop::UnspecifiedAtRouteInput) => evidence.push(format!(
                "reason NOT_SPECIFIED at the route-input site {}: kernels without the \
                 IP_*_SOURCE reasons drop a local (martian) source there unnamed; the source \
                 {} is tagged vip, so this is a local-source drop",
                info.location.as_deref().unwrap_or("?"),
                packet.src
            )),
            _ => evidence.push(format!(
                "reason {}: source validation failed because {} is a local address of this \
                 node (tagged vip: bound on the VIP interface)",
                info.reason.name, packet.src
            )),
        }
        let svc = self.nodeport_evidence(packet, &mut evidence);
        self.vip_served_evidence(packet.src, &mut evidence);
        let nic = info
            .iface
            .clone()
            .or_else(|| suspect.as_ref().map(|s| s.nic.clone()));
        let key = AggregateKey::HealthcheckBlackhole {
            vip: packet.src,
            node: packet.dst,
            node_port: packet.dport,
            proto: packet.proto,
        };
        let event = LoopbackEvent {
            kind: LoopbackKind::HealthcheckBlackhole,
            key: key.to_string(),
            src: packet.src,
            src_port: packet.sport,
            dst: packet.dst,
            dst_port: packet.dport,
            vip: Some(packet.src),
            vip_port: None,
            proto: packet.proto,
            drop_reason: Some(info.reason.name.clone()),
            drop_location: info.location.clone(),
            snat: SnatState::Unknown,
            outcome: Outcome::Dropped,
            count: 0,
            evidence,
            remedy: remedy::healthcheck_blackhole(packet.src, packet.dport),
            first_seen_ns: info.ts,
            last_seen_ns: info.ts,
            nic,
            service: svc,
            layer: None,
        };
        self.stats.suspects_confirmed += suspect.as_ref().map_or(0, |s| s.n);
        self.stats.drops_confirming += 1;
        self.stats.confirmed.healthcheck_blackhole += 1;
        let ts = info.ts;
        // Keep the drop so a suspect arriving after it folds into this event.
        if !self.drops.contains_key(&t) && self.pending_len() < self.cfg.max_pending {
            self.drops.insert(
                t,
                RecentDrop {
                    info,
                    packet: packet.clone(),
                    confirmed: Some(key.clone()),
                },
            );
        }
        out.push(Output::Report(self.record(key, event, ts)));
    }

    fn confirm_unserved(&mut self, packet: &Packet, info: DropInfo, out: &mut Vec<Output>) {
        let t = tuple_of(packet);
        let mut evidence = vec![drop_line(&info, &t)];
        let owner = self
            .services
            .services
            .iter()
            .find(|s| s.vip == packet.dst)
            .map(|s| s.service.clone());
        if table_missing(&self.services) {
            evidence.push(format!(
                "no service table was available (no IPVS services or kube-proxy rules read): \
                 could not check who serves {}; confirmed from the drop alone",
                packet.dst
            ));
        } else {
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
                .map(|s| {
                    format!(
                        "{}/{}{}",
                        s.port,
                        s.proto.as_str(),
                        s.service
                            .as_deref()
                            .map(|n| format!(" ({n})"))
                            .unwrap_or_default()
                    )
                })
                .collect();
            if !served.is_empty() {
                evidence.push(format!(
                    "service table: {} is served on {}",
                    packet.dst,
                    served.join(", ")
                ));
            }
        }
        evidence.push(match packet.proto {
            Proto::Udp => {
                "UDP: the kernel answers an unserved port with ICMP port unreachable".to_string()
            }
            _ => {
                "TCP: the kernel answers an unserved port with RST (connection refused)".to_string()
            }
        });
        let owner_name = owner.flatten().map(|s| service_name(&s));
        let key = AggregateKey::VipPortUnserved {
            vip: packet.dst,
            port: packet.dport,
            proto: packet.proto,
        };
        let event = LoopbackEvent {
            kind: LoopbackKind::VipPortUnserved,
            key: key.to_string(),
            src: packet.src,
            src_port: packet.sport,
            dst: packet.dst,
            dst_port: packet.dport,
            vip: Some(packet.dst),
            vip_port: Some(packet.dport),
            proto: packet.proto,
            drop_reason: Some(info.reason.name.clone()),
            drop_location: info.location.clone(),
            snat: SnatState::Unknown,
            outcome: Outcome::Refused,
            count: 0,
            evidence,
            remedy: remedy::vip_port_unserved(
                packet.dst,
                packet.dport,
                packet.proto,
                owner_name.as_deref(),
            ),
            first_seen_ns: info.ts,
            last_seen_ns: info.ts,
            nic: info.iface.clone(),
            service: owner_name,
            layer: None,
        };
        self.stats.drops_confirming += 1;
        self.stats.confirmed.vip_port_unserved += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }

    /// Reports the hairpin flow `t` (egress already matched) and forgets it.
    fn confirm_hairpin(
        &mut self,
        t: &Tuple,
        outcome: Outcome,
        extra: Vec<String>,
        out: &mut Vec<Output>,
    ) {
        let Some(f) = self.flows.remove(t) else {
            return;
        };
        self.held_suspects -= f.n_suspects;
        self.held_drops -= f.n_drops;
        let Some(m) = f.egress else {
            // Not reachable: only flows with an egress match get here.
            self.stats.suspects_unconfirmed += f.n_suspects;
            self.stats.drops_unmatched += f.n_drops;
            return;
        };
        let p = &f.packet;
        let mut evidence = vec![
            format!(
                "EGRESS_FLOWS: {} left {} at {} without SNAT (pod {} calling the LB)",
                fmt_tuple(&egress_tuple(&m.record)),
                m.record.nic,
                fmt_ts(m.record.ts_ns),
                m.record.src
            ),
            suspect_line(f.ts, &f.nic, p),
            match m.layer {
                Layer::L4 => format!(
                    "layer 4: same source port {} {} ms after the egress: the LB forwarded the \
                     pod's own connection back to this node",
                    p.sport,
                    f.ts.saturating_sub(m.record.ts_ns) / MS
                ),
                Layer::L7 => format!(
                    "layer 7: new connection from the same pod {} ms after its latest egress \
                     to {}: the LB proxied the request back to this node",
                    f.ts.saturating_sub(m.record.ts_ns) / MS,
                    sock(m.record.dst, m.record.dport)
                ),
            },
        ];
        evidence.extend(f.evidence);
        if let Some(d) = &f.drop {
            evidence.push(drop_line(d, t));
        }
        evidence.extend(extra);
        let np = self.services.nodeport(p.dport, p.proto).cloned();
        match &np {
            Some(n) => evidence.push(format!(
                "service table ({}): NodePort {}/{} belongs to {}{}",
                source_name(&self.services),
                n.port,
                n.proto.as_str(),
                n.service.as_deref().unwrap_or("an unnamed Service"),
                if n.local_only {
                    " with externalTrafficPolicy: Local rules (no masquerade)"
                } else {
                    ""
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
        if self.services.masquerade_rules.is_empty() {
            evidence.push("nat table: no masquerade rule for pod egress found".to_string());
        } else {
            for r in self.services.masquerade_rules.iter().take(3) {
                evidence.push(format!(
                    "nat rule: {r} (did not apply to this flow: it left unSNATed)"
                ));
            }
        }
        let service = np
            .as_ref()
            .and_then(|n| n.service.as_deref())
            .map(service_name);
        let drop_reason = f.drop.as_ref().map(|d| d.reason.name.clone());
        let remedy = remedy::hairpin(&HairpinCause {
            pod: p.src,
            vip: m.record.dst,
            vip_port: m.record.dport,
            node: p.dst,
            node_port: p.dport,
            layer: m.layer,
            outcome,
            drop_reason: drop_reason.as_deref(),
            local_only: np.as_ref().is_some_and(|n| n.local_only),
            service: service.as_deref(),
            masquerade_rules: self.services.masquerade_rules.len(),
        });
        let key = AggregateKey::Hairpin {
            layer: m.layer,
            pod: p.src,
            vip: m.record.dst,
            vip_port: m.record.dport,
            node: p.dst,
            node_port: p.dport,
            proto: p.proto,
        };
        let event = LoopbackEvent {
            kind: LoopbackKind::Hairpin,
            key: key.to_string(),
            src: p.src,
            src_port: p.sport,
            dst: p.dst,
            dst_port: p.dport,
            vip: Some(m.record.dst),
            vip_port: Some(m.record.dport),
            proto: p.proto,
            drop_reason,
            drop_location: f.drop.as_ref().and_then(|d| d.location.clone()),
            snat: SnatState::No,
            outcome,
            count: 0,
            evidence,
            remedy,
            first_seen_ns: f.ts,
            last_seen_ns: f.ts,
            nic: Some(f.nic.clone()),
            service,
            layer: Some(m.layer),
        };
        self.stats.suspects_confirmed += f.n_suspects;
        self.stats.drops_confirming += f.n_drops;
        self.stats.confirmed.hairpin += 1;
        out.push(Output::Report(self.record(key, event, f.ts)));
    }

    /// Drops a hairpin candidate without confirming it.
    fn dismiss_flow(&mut self, t: &Tuple) {
        if let Some(f) = self.flows.remove(t) {
            self.held_suspects -= f.n_suspects;
            self.held_drops -= f.n_drops;
            self.stats.suspects_unconfirmed += f.n_suspects;
            self.stats.drops_unmatched += f.n_drops;
            if let Stage::AwaitSnat(id) | Stage::AwaitOutcome(id) = f.stage {
                self.queries.remove(&id);
            }
        }
    }

    // ----- hairpin steps ----------------------------------------------------------------------

    /// The egress answer for flow `t` (`None`: the query expired).
    fn on_egress(&mut self, t: &Tuple, records: Option<&[EgressRecord]>, out: &mut Vec<Output>) {
        let Some(f) = self.flows.get(t) else {
            return;
        };
        if f.stage != Stage::AwaitEgress {
            return;
        }
        let m = records.and_then(|r| self.match_egress(f, r));
        let Some(m) = m else {
            self.stats.hairpin_no_egress += 1;
            self.dismiss_flow(t);
            return;
        };
        let et = egress_tuple(&m.record);
        let id = self.new_query(QueryCtx::Snat { flow: t.clone() });
        if let Some(f) = self.flows.get_mut(t) {
            f.egress = Some(m);
            f.stage = Stage::AwaitSnat(id);
        }
        out.push(Output::Query(Query::Conntrack { id, tuple: et }));
    }

    fn match_egress(&self, f: &Flow, records: &[EgressRecord]) -> Option<EgressMatch> {
        let p = &f.packet;
        // (record, its latest opener by the suspect's time) for records of this pod and
        // protocol that had left by then, within the window.
        let candidates = || {
            records
                .iter()
                .filter(|r| r.src == p.src && r.proto == p.proto)
                .filter_map(|r| Some((r, r.latest_by(f.ts)?)))
                .filter(|(_, at)| f.ts - at <= self.cfg.l7_window_ns)
        };
        if let Some((r, _)) = candidates()
            .filter(|(r, _)| r.sport == p.sport)
            .max_by_key(|(_, at)| *at)
        {
            return Some(EgressMatch {
                record: r.clone(),
                layer: Layer::L4,
            });
        }
        candidates()
            .filter(|(r, _)| r.dst != p.dst && r.dst != r.src && !self.known_local.contains(&r.dst))
            .max_by_key(|(_, at)| *at)
            .map(|(r, _)| EgressMatch {
                record: r.clone(),
                layer: Layer::L7,
            })
    }

    /// Conntrack of the egress tuple (`None`: the query expired).
    fn on_snat(&mut self, t: &Tuple, entry: Option<Option<ConntrackEntry>>, out: &mut Vec<Output>) {
        let Some(f) = self.flows.get_mut(t) else {
            return;
        };
        let et = f.egress.as_ref().map(|m| egress_tuple(&m.record));
        match entry {
            Some(Some(e)) if e.snat => {
                // SNAT happened after all: the LB saw the node, not the pod.
                self.stats.hairpin_snat_seen += 1;
                self.dismiss_flow(t);
                return;
            }
            Some(Some(e)) => f
                .evidence
                .push(format!("conntrack (egress flow): {}", fmt_entry(&e))),
            Some(None) => f.evidence.push(format!(
                "conntrack: no entry for the egress flow {}",
                et.as_ref().map(fmt_tuple).unwrap_or_default()
            )),
            None => f
                .evidence
                .push("conntrack look-up of the egress flow was not answered".to_string()),
        }
        f.stage = Stage::Settling;
        self.advance(t, out);
    }

    /// Egress proven: report a drop now, or ask conntrack once the settle time has passed.
    fn advance(&mut self, t: &Tuple, out: &mut Vec<Output>) {
        let Some(f) = self.flows.get(t) else {
            return;
        };
        if f.stage != Stage::Settling {
            return;
        }
        if f.drop.is_some() {
            self.confirm_hairpin(t, Outcome::Dropped, Vec::new(), out);
        } else if self.now >= f.ts.saturating_add(self.cfg.hairpin_settle_ns) {
            let id = self.new_query(QueryCtx::Outcome { flow: t.clone() });
            if let Some(f) = self.flows.get_mut(t) {
                f.stage = Stage::AwaitOutcome(id);
            }
            out.push(Output::Query(Query::Conntrack {
                id,
                tuple: t.clone(),
            }));
        }
    }

    /// Conntrack of the hairpin tuple (`None`: the query expired).
    fn on_outcome(
        &mut self,
        t: &Tuple,
        entry: Option<Option<ConntrackEntry>>,
        out: &mut Vec<Output>,
    ) {
        let (outcome, line) = match entry {
            Some(Some(e)) if e.tcp_state.as_deref() == Some("CLOSE") => (
                Outcome::Reset,
                format!(
                    "conntrack (hairpin flow): {}: the pod answered the reply that came from the \
                     node instead of the VIP with RST",
                    fmt_entry(&e)
                ),
            ),
            Some(Some(e)) => (
                Outcome::NoReply,
                format!(
                    "conntrack (hairpin flow): {}: no usable reply reached the pod",
                    fmt_entry(&e)
                ),
            ),
            Some(None) => (
                Outcome::NoReply,
                format!("conntrack: no entry for the hairpin flow {}", fmt_tuple(t)),
            ),
            None => (
                Outcome::NoReply,
                "conntrack look-up of the hairpin flow was not answered".to_string(),
            ),
        };
        self.confirm_hairpin(t, outcome, vec![line], out);
    }

    // ----- time -------------------------------------------------------------------------------

    fn expire(&mut self, now: u64, out: &mut Vec<Output>) {
        self.last_sweep = now;
        let pw = self.cfg.pair_window_ns;

        let mut n_unconf = 0;
        self.vip_suspects.retain(|_, s| {
            let keep = s.ts.saturating_add(pw) >= now;
            if !keep {
                n_unconf += s.n;
            }
            keep
        });
        self.stats.suspects_unconfirmed += n_unconf;
        self.held_suspects -= n_unconf;

        let mut n_unmatched = 0;
        self.drops.retain(|_, d| {
            let keep = d.info.ts.saturating_add(pw) >= now;
            if !keep && d.confirmed.is_none() {
                n_unmatched += 1;
            }
            keep
        });
        self.stats.drops_unmatched += n_unmatched;
        self.held_drops -= n_unmatched;

        // Expired queries, oldest first.
        let qt = self.cfg.query_timeout_ns;
        let mut expired: Vec<u64> = self
            .queries
            .iter()
            .filter(|(_, q)| q.issued.saturating_add(qt) < now)
            .map(|(id, _)| *id)
            .collect();
        expired.sort_unstable();
        for id in expired {
            let Some(q) = self.queries.remove(&id) else {
                continue;
            };
            self.stats.queries_expired += 1;
            match q.ctx {
                QueryCtx::Egress { src, flows } => {
                    self.egress_inflight.remove(&src);
                    for t in flows {
                        self.on_egress(&t, None, out);
                    }
                }
                QueryCtx::Snat { flow } => self.on_snat(&flow, None, out),
                QueryCtx::Outcome { flow } => self.on_outcome(&flow, None, out),
            }
        }

        // Settled flows, and a safety net for flows stuck longer than any path allows.
        let settle = self.cfg.hairpin_settle_ns;
        let max_age = settle
            .saturating_add(pw)
            .saturating_add(qt.saturating_mul(3))
            .saturating_add(SEC);
        let mut due: Vec<(u64, Tuple, bool)> = self
            .flows
            .iter()
            .filter_map(|(t, f)| {
                if f.ts.saturating_add(max_age) < now {
                    Some((f.seq, t.clone(), true))
                } else if f.stage == Stage::Settling && f.ts.saturating_add(settle) <= now {
                    Some((f.seq, t.clone(), false))
                } else {
                    None
                }
            })
            .collect();
        due.sort_unstable_by_key(|(seq, _, _)| *seq);
        for (_, t, stuck) in due {
            if stuck {
                self.dismiss_flow(&t);
            } else {
                self.advance(&t, out);
            }
        }

        let ttl = self.cfg.aggregate_ttl_ns;
        self.aggregates
            .retain(|_, a| a.event.last_seen_ns.saturating_add(ttl) >= now);
    }

    // ----- aggregation ------------------------------------------------------------------------

    fn record(&mut self, key: AggregateKey, mut event: LoopbackEvent, ts: u64) -> Report {
        if let Some(agg) = self.aggregates.get_mut(&key) {
            let first = agg.event.first_seen_ns.min(ts);
            let last = agg.event.last_seen_ns.max(ts);
            event.count = agg.event.count + 1;
            event.first_seen_ns = first;
            event.last_seen_ns = last;
            let write_json = ts >= agg.last_json_ns.saturating_add(self.cfg.json_repeat_ns);
            if write_json {
                agg.last_json_ns = ts;
            }
            agg.event = event.clone();
            return Report {
                event,
                is_new: false,
                write_json,
            };
        }
        if self.aggregates.len() >= self.cfg.max_aggregates.max(1)
            && let Some(oldest) = self
                .aggregates
                .iter()
                .min_by_key(|(_, a)| a.event.last_seen_ns)
                .map(|(k, _)| k.clone())
        {
            self.aggregates.remove(&oldest);
            self.stats.aggregates_evicted += 1;
        }
        event.count = 1;
        self.aggregates.insert(
            key,
            Aggregate {
                event: event.clone(),
                last_json_ns: ts,
            },
        );
        Report {
            event,
            is_new: true,
            write_json: true,
        }
    }

    // ----- evidence helpers -------------------------------------------------------------------

    /// Adds the NodePort's service table entry to `evidence`; returns the Service name.
    fn nodeport_evidence(&self, p: &Packet, evidence: &mut Vec<String>) -> Option<String> {
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

    fn vip_served_evidence(&self, vip: IpAddr, evidence: &mut Vec<String>) {
        for s in self
            .services
            .services
            .iter()
            .filter(|s| s.vip == vip)
            .take(3)
        {
            evidence.push(format!(
                "service table: {}/{} is a virtual service{} (the LB VIP is handled locally)",
                sock(s.vip, s.port),
                s.proto.as_str(),
                s.service
                    .as_deref()
                    .map(|n| format!(" of {n}"))
                    .unwrap_or_default()
            ));
        }
    }
}

fn suspect_line(ts: u64, nic: &str, p: &Packet) -> String {
    format!(
        "tc ingress on {nic} at {}: {}{}, source tagged {}",
        fmt_ts(ts),
        fmt_tuple(&tuple_of(p)),
        fmt_flags(p),
        match p.src_tag {
            Some(Tag::Vip) => "vip (bound on the VIP interface: a local address)",
            Some(Tag::Pod) => "pod (a pod on this node)",
            Some(Tag::Node) => "node",
            None => "nothing",
        }
    )
}

fn drop_line(d: &DropInfo, t: &Tuple) -> String {
    format!(
        "kfree_skb at {}: {}{} dropped{}, reason {} (code {}){}",
        fmt_ts(d.ts),
        fmt_tuple(t),
        d.dnat_to
            .map(|(ip, port)| format!(" (already DNATed to {ip}:{port} by the NodePort rules)"))
            .unwrap_or_default(),
        d.iface
            .as_deref()
            .map(|i| format!(" after arriving on {i}"))
            .unwrap_or_default(),
        d.reason.name,
        d.reason.code,
        d.location
            .as_deref()
            .map(|l| format!(" at {l}"))
            .unwrap_or_default()
    )
}
