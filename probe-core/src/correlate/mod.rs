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
//! - **`hairpin`**: a `Suspect` whose `src_tag` is `Pod` (or `Node`: the node-sourced loop)
//!   going to a node address with a NodePort (any node address without a service table) or
//!   to a local pod (an LB that targets pods); see `hairpin.rs` for the variants and the
//!   rules against false pairing (local egress destinations, answered connections, one
//!   confirmation per connect attempt). The correlator asks for the source's
//!   un-SNATed egress ([`Query::Egress`]): the kernel's per-source index (the latest 16
//!   flows) plus the exact record of the suspect's own (source port, protocol), so layer 4 is
//!   found however many flows the pod opened since; a flow that joined a query without its
//!   key is asked again with it (`hairpin.rs`). Layer 4: a record with the suspect's source
//!   port and protocol; else layer 7 (from the index): the latest record of the same protocol
//!   sent at most `l7_window_ns` before the suspect whose destination is not a node or pod
//!   address (the suspect's own destination, or any address seen tagged `Node`/`Pod` in
//!   kernel events). Both must have
//!   started no later than the suspect and sent their latest opener (a record keeps its
//!   first and latest time: SYN retransmits refresh it) at most `l7_window_ns` before it. No record: not
//!   confirmed. Then [`Query::Conntrack`] of the egress tuple: an entry with SNAT means the
//!   flow was NATed after all (not confirmed; counted in `hairpin_snat_seen`); otherwise
//!   `snat` = no and the entry (or its absence) is evidence; a failed look-up
//!   ([`Answer::ConntrackFailed`]) gives `snat` = unknown and says so. Outcome: a `Drop` of the
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
//!   all it still confirms, and says so in the evidence. Also a `NETFILTER_DROP` (or
//!   `NOT_SPECIFIED` at `nf_hook_slow`) of such a packet when kube-proxy's IPVS access filter
//!   chain `KUBE-IPVS-FILTER` exists (it REJECTs with ICMP port unreachable; named in the
//!   evidence).
//! - **`vip_as_source`**: what would confirm `healthcheck_blackhole`, for a destination that
//!   is no health check: not a node address, or a node address on a port that is neither a
//!   NodePort of the service table nor in the NodePort range (a healthCheckNodePort). Without
//!   a service table every port of a node address counts as a health check. `vip` = the
//!   packet's source. Sending side: a `VipEgress` (a TCP SYN that left a NIC with a bound VIP
//!   as source) confirms alone; outcome `no_reply` (the receiving node drops it).
//!   Not for a TCP reply (ACK set) to a VIP, nor an opener from outside through a NIC
//!   (`vip_reply.rs`): a reply that pairs with a VIP-source suspect is the health-check black
//!   hole as IPv6 shows it (no martian check: the node's answer to the VIP dies locally).
//! - **`etp_local_drop`**: a netfilter drop (`NETFILTER_DROP`, or `NOT_SPECIFIED` at a
//!   netfilter site) of a `Pod`- or `Node`-source TCP/UDP packet to a non-local address whose
//!   (address, protocol, port) is a `drop` element of kube-proxy's nftables map
//!   `no-endpoint-services` (an externalTrafficPolicy Local Service's LB or external IP on a
//!   node without a local endpoint; kubernetes#131765): see `etp_local_drop.rs`. Outcome
//!   `dropped`; `vip`/`vip_port` = the dropped IP:port.
//! - **`source_ranges_drop`**: a netfilter drop of a `Pod`- or `Node`-source TCP/UDP packet to
//!   an (address, protocol, port) of kube-proxy's nftables map `firewall-ips`
//!   (`loadBalancerSourceRanges`), the source outside that entry's ranges: see
//!   `source_ranges_drop.rs`. Outcome `dropped`; `vip`/`vip_port` = the firewalled IP:port.
//! - **`lb_probe_refused`**: the drop of an untagged (outside) TCP SYN to a `Node` address,
//!   through a monitored NIC, on kube-proxy's healthz :10256 or a healthCheckNodePort of the
//!   table: the LB's own probe refused (`NO_SOCKET`) or dropped: see `lb_probe_refused.rs`.
//!   Outcome `refused` (no listener) or `dropped`; no `vip` (the probe's source is the loop's).
//! - Anything else is counted in [`CorrelatorStats`], never reported.
//!
//! Kernels without drop reasons (< 5.17) report every drop as `UNREPORTED` with its site:
//! on ingest such a drop is named from its site (route-input path: `IP_LOCAL_SOURCE` for a
//! `node`/`vip` source that came in through a NIC, `IP_RPFILTER` for a `pod` source;
//! `tcp_v4_rcv`, `__udp4_lib_rcv` and their IPv6 twins: `NO_SOCKET`; `nf_hook_slow`:
//! `NETFILTER_DROP`), then judged by the rules above like a named drop; its evidence says the
//! reason was inferred from the site.
//!
//! Aggregation: see [`AggregateKey`]. Every confirmation, new or repeat, is a
//! [`Output::Report`]; `write_json` is false for a repeat within `json_repeat_ns` of the
//! aggregate's last written line.
//!
//! Memory: suspects waiting for a drop, drops waiting for a suspect, and hairpin candidates
//! together never exceed `max_pending`; beyond it new ones are counted (`pending_overflow`,
//! and as unconfirmed / unmatched) and dropped. Aggregates are capped at `max_aggregates`
//! (least recently seen evicted) and forgotten after `aggregate_ttl_ns` without a repeat.
//!
//! Layout: this file is the facade (ingest/answer/tick, stats) and the correlator's state; `config`
//! its windows and bounds, `queries` what it exchanges with the agent (outputs, queries, answers),
//! `held` the plain data it holds between events, `dispatch` which rule a suspect or a drop goes
//! to; one file per kind (`blackhole`, `hairpin`, `unserved`), each an `impl Correlator` block with
//! its rule; `aggregate` (recording, eviction, the one `LoopbackEvent` constructor), `evidence`
//! (every evidence line), `drop_reason` (drop reason and drop site classification), `remedy`.

mod aggregate;
mod blackhole;
mod config;
mod conntrack;
mod dispatch;
mod drop_reason;
mod etp_local_drop;
#[cfg(test)]
mod etp_local_drop_tests;
mod evidence;
mod hairpin;
#[cfg(test)]
mod hairpin_tests;
mod held;
#[cfg(test)]
mod host_tests;
pub mod lb_probe_refused;
#[cfg(test)]
mod lb_probe_refused_tests;
pub mod proxy_protocol;
#[cfg(test)]
mod proxy_protocol_tests;
mod queries;
pub mod remedy;
pub mod replay;
mod self_loop;
#[cfg(test)]
mod self_loop_tests;
mod source_ranges_drop;
#[cfg(test)]
mod source_ranges_drop_tests;
pub mod stale_udp;
#[cfg(test)]
mod stale_udp_rejected_tests;
#[cfg(test)]
mod stale_udp_tests;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
mod unserved;
mod vip_as_source;
mod vip_reply;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    net::IpAddr,
    sync::Arc,
};

#[cfg(test)]
use probe_contract::record::{DropReason, EgressRecord, tcp_flags};
use probe_contract::{
    AggregateKey, Confirmation, CorrelatorStats, Layer, Outcome, Proto, Tag,
    facts::AddressOwner,
    record::{KernelEvent, Packet},
};
#[cfg(test)]
use probe_contract::{KindCounts, Listener, LoopbackEvent, LoopbackKind, SnatState};

#[cfg(test)]
use self::held::Stage;
pub use self::{
    config::CorrelatorConfig,
    queries::{Answer, DataplaneRead, EgressFlowKey, Output, Query},
};
use self::{
    config::{MS, SEC},
    conntrack::CtAnswer,
    held::{Aggregate, Attempt, DropInfo, Flow, PendingQuery, QueryCtx, RecentDrop, VipSuspect},
};
#[cfg(test)]
use crate::state::{ConntrackEntry, SelfLoopFacts, ServiceSource};
use crate::state::{ServiceTable, Tuple, addrs::Prefix};

/// What the core writes per kind, each from the kind's own module (beside its rule): its
/// remedy, one option a line, and its cause in one sentence. With the contract's row
/// (`probe_contract::KINDS`) and the rule's hook in `dispatch.rs`, this row is what a new kind
/// adds (docs/architecture.md, "Adding a kind").
pub(crate) struct KindTexts {
    pub kind: probe_contract::LoopbackKind,
    pub remedy: fn(&probe_contract::LoopbackEvent) -> Vec<String>,
    pub cause: fn(&probe_contract::LoopbackEvent) -> String,
}

/// One row per kind, in `LoopbackKind::ALL`'s order (a test checks).
pub(crate) const KIND_TEXTS: [KindTexts; probe_contract::KINDS.len()] = {
    use probe_contract::LoopbackKind as K;
    [
        KindTexts {
            kind: K::Hairpin,
            remedy: hairpin::texts::remedy,
            cause: hairpin::texts::cause,
        },
        KindTexts {
            kind: K::HealthcheckBlackhole,
            remedy: blackhole::remedy,
            cause: blackhole::cause,
        },
        KindTexts {
            kind: K::VipPortUnserved,
            remedy: unserved::remedy,
            cause: unserved::cause,
        },
        KindTexts {
            kind: K::VipAsSource,
            remedy: vip_as_source::remedy,
            cause: vip_as_source::cause,
        },
        KindTexts {
            kind: K::ServiceSelfLoop,
            remedy: self_loop::texts::remedy,
            cause: self_loop::texts::cause,
        },
        KindTexts {
            kind: K::EtpLocalDrop,
            remedy: etp_local_drop::remedy,
            cause: etp_local_drop::cause,
        },
        KindTexts {
            kind: K::ProxyProtocolShortCircuit,
            remedy: proxy_protocol::remedy,
            cause: proxy_protocol::cause,
        },
        KindTexts {
            kind: K::StaleUdpConntrack,
            remedy: stale_udp::remedy,
            cause: stale_udp::cause,
        },
        KindTexts {
            kind: K::SourceRangesDrop,
            remedy: source_ranges_drop::remedy,
            cause: source_ranges_drop::cause,
        },
        KindTexts {
            kind: K::LbProbeRefused,
            remedy: lb_probe_refused::remedy,
            cause: lb_probe_refused::cause,
        },
    ]
};

/// `kind`'s row of [`KIND_TEXTS`].
pub(crate) fn kind_texts(kind: probe_contract::LoopbackKind) -> &'static KindTexts {
    KIND_TEXTS
        .iter()
        .find(|t| t.kind == kind)
        .expect("every kind has a row in KIND_TEXTS (a test checks)")
}

/// See the [module documentation](self).
pub struct Correlator {
    cfg: CorrelatorConfig,
    /// Shared with the refresher and the node report (`Arc`): never copied.
    services: Arc<ServiceTable>,
    now: u64,
    next_id: u64,
    next_seq: u64,
    last_sweep: u64,
    vip_suspects: HashMap<Tuple, VipSuspect>,
    /// Monitored NICs (see `vip_reply`).
    nics: Vec<String>,
    /// NodePort DNAT translations seen when a drop paired with its suspect: the drop's tuple
    /// (source, source port, endpoint, port, proto) -> the node address and NodePort the LB sent to. Lets a
    /// drop whose suspect the kernel deduplicated (a SYN retransmit of the same flow) still be
    /// named by its NodePort; another flow to the same endpoint (a VIP-source call to the pod)
    /// is not rewritten. Bounded.
    dnat_seen: HashMap<Tuple, (IpAddr, u16)>,
    drops: HashMap<Tuple, RecentDrop>,
    flows: HashMap<Tuple, Flow>,
    /// Self-loop drops waiting for the node's state (`self_loop.rs`), by the dropped tuple.
    self_loops: held::Pending,
    /// Self-loop connects confirmed, by tuple -> time: their retransmits fold in. Bounded.
    self_loop_done: HashMap<Tuple, u64>,
    /// PROXY-protocol resets confirmed, by the conntrack entry's original tuple -> time: the
    /// entry stays in `CLOSE` for 10 s, over several dumps, and counts once. Bounded.
    proxy_protocol_done: HashMap<Tuple, u64>,
    /// The previous UDP dump's stale entries and those reported (`stale_udp.rs`). Bounded.
    stale_udp: stale_udp::StaleUdpMemory,
    /// Connect attempts already confirmed as hairpins, by source (address, port, protocol):
    /// their retransmits fold in instead of counting again. Bounded by `max_pending`.
    confirmed_attempts: HashMap<(IpAddr, u16, Proto), Attempt>,
    queries: HashMap<u64, PendingQuery>,
    /// Refused VIP ports the table from the API serves: the dataplane's answer, by VIP:port
    /// (`unserved.rs`). Bounded.
    programmed: HashMap<(IpAddr, u16, Proto), unserved::ProgrammedAsk>,
    /// Egress query in flight per source address (shared by its flows).
    egress_inflight: HashMap<IpAddr, u64>,
    aggregates: HashMap<AggregateKey, Aggregate>,
    known_local: HashSet<IpAddr>,
    known_order: VecDeque<IpAddr>,
    /// Who made each local address local (from the address sync; shared, replaced whole).
    owners: Arc<BTreeMap<Prefix, AddressOwner>>,
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

/// A self-addressed local pod packet: the only shape a pod's call DNATed back to itself
/// without SNAT has (`self_loop.rs`).
fn is_self_loop(p: &Packet) -> bool {
    p.src == p.dst && p.src_tag == Some(Tag::Pod)
}

impl Correlator {
    pub fn new(cfg: CorrelatorConfig) -> Self {
        Correlator {
            cfg,
            services: Arc::default(),
            now: 0,
            next_id: 1,
            next_seq: 0,
            last_sweep: 0,
            vip_suspects: HashMap::new(),
            nics: Vec::new(),
            dnat_seen: HashMap::new(),
            drops: HashMap::new(),
            flows: HashMap::new(),
            self_loops: HashMap::new(),
            self_loop_done: HashMap::new(),
            proxy_protocol_done: HashMap::new(),
            stale_udp: stale_udp::StaleUdpMemory::default(),
            confirmed_attempts: HashMap::new(),
            queries: HashMap::new(),
            programmed: HashMap::new(),
            egress_inflight: HashMap::new(),
            aggregates: HashMap::new(),
            known_local: HashSet::new(),
            known_order: VecDeque::new(),
            owners: Arc::default(),
            held_suspects: 0,
            held_drops: 0,
            stats: CorrelatorStats::default(),
        }
    }

    pub fn config(&self) -> &CorrelatorConfig {
        &self.cfg
    }

    /// Replaces the service table (used at confirmation time).
    pub fn set_services(&mut self, table: impl Into<Arc<ServiceTable>>) {
        self.services = table.into();
    }

    pub fn stats(&self) -> &CorrelatorStats {
        &self.stats
    }

    /// Replaces the owners of the node's local addresses (used at confirmation time: each
    /// event names what made its local address local, and the remedy addresses that owner).
    pub fn set_owners(&mut self, owners: Arc<BTreeMap<Prefix, AddressOwner>>) {
        self.owners = owners;
    }

    /// Who made `ip` local, by longest prefix.
    fn owner_of(&self, ip: IpAddr) -> Option<AddressOwner> {
        self.owners
            .iter()
            .filter(|(p, _)| p.contains(ip))
            .max_by_key(|(p, _)| p.len)
            .map(|(_, o)| o.clone())
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
            KernelEvent::VipEgress { ts_ns, nic, packet } => {
                self.on_vip_egress(ts_ns, &nic, &packet, &mut out)
            }
            KernelEvent::Drop {
                ts_ns,
                iface,
                packet,
                reason,
                location,
                foreign_netns,
            } => {
                let mut info = DropInfo {
                    ts: ts_ns,
                    iface,
                    reason,
                    location,
                    dnat_to: None,
                    inferred: false,
                    foreign_netns,
                };
                // A kernel without drop reasons: name the drop by its site, so every rule
                // below judges it like a newer kernel's named drop (the evidence says so).
                if !info.reason.is_reported()
                    && let Some(name) = drop_reason::reason_from_site(
                        info.location.as_deref(),
                        packet.src_tag,
                        info.iface.is_some(),
                        is_self_loop(&packet),
                    )
                {
                    info.reason.name = name.to_string();
                    info.inferred = true;
                }
                if is_self_loop(&packet) {
                    // Already DNATed back to its source: no suspect to undo it with.
                    self.on_self_loop_drop(info, packet, &mut out);
                } else {
                    let packet = self.undo_dnat(packet, &mut info);
                    self.on_drop(info, packet, &mut out)
                }
            }
        }
        self.refresh();
        out
    }

    /// Takes the agent's answer to a query.
    pub fn answer(&mut self, answer: Answer) -> Vec<Output> {
        let mut out = Vec::new();
        let id = match &answer {
            Answer::Egress { id, .. }
            | Answer::Conntrack { id, .. }
            | Answer::ConntrackFailed { id, .. }
            | Answer::Listener { id, .. }
            | Answer::SelfLoop { id, .. }
            | Answer::Programmed { id, .. } => *id,
        };
        let Some(q) = self.queries.remove(&id) else {
            self.stats.answers_stale += 1;
            return out;
        };
        match (q.ctx, answer) {
            (QueryCtx::Egress { src, flows, keys }, Answer::Egress { records, .. }) => {
                self.on_egress_answer(src, flows, &keys, &records, &mut out);
            }
            (QueryCtx::Snat { flow }, Answer::Conntrack { entry, .. }) => {
                self.on_snat(&flow, CtAnswer::from(entry), &mut out);
            }
            (QueryCtx::Outcome { flow }, Answer::Conntrack { entry, .. }) => {
                self.on_outcome(&flow, CtAnswer::from(entry), &mut out);
            }
            (QueryCtx::Snat { flow }, Answer::ConntrackFailed { error, .. }) => {
                self.on_snat(&flow, CtAnswer::Failed(error), &mut out);
            }
            (QueryCtx::Outcome { flow }, Answer::ConntrackFailed { error, .. }) => {
                self.on_outcome(&flow, CtAnswer::Failed(error), &mut out);
            }
            (QueryCtx::Listener { flow }, Answer::Listener { listener, .. }) => {
                self.on_listener(&flow, listener, &mut out);
            }
            (
                QueryCtx::SelfLoop { flow },
                Answer::SelfLoop {
                    conntrack, facts, ..
                },
            ) => {
                self.on_self_loop_answer(&flow, Some((conntrack, facts)), &mut out);
            }
            (QueryCtx::Programmed { packet, info }, Answer::Programmed { read, .. }) => {
                self.on_programmed(&packet, *info, read, &mut out);
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
        self.vip_suspects.len() + self.drops.len() + self.flows.len() + self.self_loops.len()
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
        let pending = self.pending_len() as u64;
        let s = &mut self.stats;
        s.pending_suspects = self.held_suspects;
        s.pending_drops = self.held_drops;
        s.pending = pending;
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

    // ----- time -------------------------------------------------------------------------------

    fn expire(&mut self, now: u64, out: &mut Vec<Output>) {
        self.last_sweep = now;
        self.expire_vip_suspects(now);
        self.expire_drops(now);
        self.expire_queries(now, out);
        self.expire_flows(now, out);
        self.expire_aggregates(now);
        self.expire_self_loops(now);
    }

    fn expire_drops(&mut self, now: u64) {
        let pw = self.cfg.pair_window_ns;
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
    }

    /// Expired queries, oldest first.
    fn expire_queries(&mut self, now: u64, out: &mut Vec<Output>) {
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
                QueryCtx::Egress { src, flows, .. } => {
                    self.egress_inflight.remove(&src);
                    for t in flows {
                        self.on_egress(&t, None, out);
                    }
                }
                QueryCtx::Snat { flow } => self.on_snat(&flow, CtAnswer::Expired, out),
                QueryCtx::Outcome { flow } => self.on_outcome(&flow, CtAnswer::Expired, out),
                QueryCtx::Listener { flow } => {
                    self.on_listener(&flow, Err("no answer in time".into()), out)
                }
                QueryCtx::SelfLoop { flow } => self.on_self_loop_answer(&flow, None, out),
                QueryCtx::Programmed { packet, info } => {
                    self.on_programmed(&packet, *info, Err("no answer in time".into()), out)
                }
            }
        }
    }
}
