//! `hairpin`: a pod-source packet on NIC ingress tied to that pod's un-SNATed egress to the
//! LB. The state machine per candidate flow: egress answer -> conntrack of the egress flow
//! (SNAT?) -> settle (a drop, or conntrack of the looping flow) -> report.
//!
//! Variants, all kind `hairpin`: the LB sends the loop to a NodePort of this node (the classic
//! case), or straight to a pod on this node (VPC-CNI style "LB to pod": the destination is a
//! local pod, no NodePort); TCP or UDP; and **node-sourced**: the looping packet's source is
//! the node's own address (a host-network client, or pod traffic masqueraded to the node IP,
//! through an LB that keeps client addresses and lacks the guard against sending a request
//! back to its source). The node-sourced loop is the same failure (a connection to the LB
//! that the LB returns to its caller) with the same evidence chain, so it keeps the kind and
//! says "node-sourced" in its evidence and remedy rather than becoming a kind of its own.
//!
//! **Host listener**: the LB sends the loop to a node address on a port that is no NodePort
//! (a host-network process: the API server on :6443, an ingress controller or node-local proxy
//! with hostNetwork/hostPort, behind an LB with instance targets). Only an exact layer-4 match
//! confirms it (the egress record with the suspect's own source address, port and protocol,
//! to a destination that is not local): that match is the proof, whatever the port. Layer 7
//! (same source within a window) keeps requiring a NodePort or a local pod, so no false pairs
//! come back. The socket that serves the port is asked for ([`Query::Listener`]) and named in
//! the evidence and the event's `listener`.
//!
//! No false pairing: the suspect must go to a node address with a NodePort (any node address
//! when no service table is known; any port on an exact layer-4 match) or to a local pod; the
//! egress record's destination must
//! not be local; a layer-4 egress flow that conntrack shows answered, or a looping flow that
//! got established, is no failure; and one failed connect (a SYN and its retransmits) is
//! confirmed once: later suspects and drops of the same source address and port within
//! [`RETRY_GAP_NS`] of the previous one fold into it.
//!
//! Layout: this file takes suspects and drops in, remembers confirmed attempts and builds the
//! confirmed event; `hairpin/steps.rs` walks each candidate through the state machine.

use std::{collections::HashSet, net::IpAddr};

mod steps;
pub(super) mod texts;

use probe_contract::{
    AggregateKey, Listener, LoopbackEvent, Outcome, Proto, SnatState, Tag,
    facts::{AddressOwner, Etp, Facts, SourceKind},
    record::{EgressRecord, Packet},
};

use super::{
    Correlator, DropInfo, EgressFlowKey, Output, PendingQuery, Query, QueryCtx, RecentDrop, SEC,
    aggregate::NewEvent as _,
    evidence::{
        drop_line, egress_line, host_listener_line, layer_line, listener_line, node_sourced_line,
        service_name, suspect_line,
    },
    held::{Attempt, EgressMatch, Flow, ListenerState, Stage},
    tuple_of,
};
use crate::state::{ConntrackEntry, NodePortEntry, Tuple};

/// What the node's state said about a confirmed hairpin ([`Correlator::hairpin_evidence`]).
struct HairpinEvidence {
    lines: Vec<String>,
    local_owner: Option<AddressOwner>,
    listener: Option<Listener>,
    nodeport: Option<NodePortEntry>,
}

/// The longest gap between a TCP SYN and its next retransmit (Linux doubles from 1 s: 1, 2,
/// 4, ..., 64 s), with slack: a suspect of a confirmed source address and port within this
/// long of the previous one is a retransmit of the same connect attempt.
pub(super) const RETRY_GAP_NS: u64 = 70 * SEC;

/// TCP states after a completed handshake: the connection was answered.
fn answered(e: &ConntrackEntry) -> bool {
    matches!(
        e.tcp_state.as_deref(),
        Some("ESTABLISHED" | "FIN_WAIT" | "CLOSE_WAIT" | "LAST_ACK" | "TIME_WAIT")
    )
}

/// Where the LB sent a looping packet (see [`Correlator::backend_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Backend {
    /// A node address with a NodePort (any node address without a service table), or a
    /// local pod: layer 4 or layer 7.
    Service,
    /// A node address on a port that is no NodePort: a host-network listener; only an exact
    /// layer-4 match confirms it.
    HostListener,
    /// Nothing an LB sends to.
    None,
}

/// The egress flow key a layer-4 match of the suspect tuple `t` has.
fn flow_key(t: &Tuple) -> EgressFlowKey {
    EgressFlowKey {
        sport: t.sport,
        proto: t.proto,
    }
}

impl Correlator {
    pub(super) fn on_pod_suspect(
        &mut self,
        ts: u64,
        nic: String,
        packet: Packet,
        out: &mut Vec<Output>,
    ) {
        let t = tuple_of(&packet);
        if let Some(f) = self.flows.get_mut(&t) {
            f.n_suspects += 1;
            self.held_suspects += 1;
            return;
        }
        if self.fold_confirmed_attempt(&packet, ts) {
            self.stats.suspects_confirmed += 1;
            return;
        }
        let backend = self.backend_of(&packet);
        if backend == Backend::None {
            self.stats.hairpin_not_a_backend += 1;
            self.stats.suspects_unconfirmed += 1;
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
                snat_unknown: false,
                listener: None,
                deferred: None,
            },
        );
        if backend == Backend::HostListener {
            let (addr, port, proto) = (t.dst, t.dport, t.proto);
            let id = self.new_query(QueryCtx::Listener { flow: t.clone() });
            if let Some(f) = self.flows.get_mut(&t) {
                f.listener = Some(ListenerState::Asked(id));
            }
            out.push(Output::Query(Query::Listener {
                id,
                addr,
                port,
                proto,
            }));
        }
        self.ask_egress(t.src, vec![t], out);
    }

    /// The listener answer of a host-listener candidate; confirms it when the confirmation
    /// waited for it.
    pub(super) fn on_listener(
        &mut self,
        t: &Tuple,
        listener: Result<Option<Listener>, crate::state::ReadFailed>,
        out: &mut Vec<Output>,
    ) {
        let Some(f) = self.flows.get_mut(t) else {
            return;
        };
        f.listener = Some(ListenerState::Known(listener));
        if let Some((outcome, extra)) = f.deferred.take() {
            self.confirm_hairpin(t, outcome, extra, out);
        }
    }

    /// Asks for `flows`' egress (all of source `src`): they join the source's query in flight,
    /// or a new one carries their flow keys (see [`Correlator::on_egress_answer`]).
    fn ask_egress(&mut self, src: IpAddr, flows: Vec<Tuple>, out: &mut Vec<Output>) {
        if let Some(id) = self.egress_inflight.get(&src).copied()
            && let Some(PendingQuery {
                ctx: QueryCtx::Egress { flows: waiting, .. },
                ..
            }) = self.queries.get_mut(&id)
        {
            waiting.extend(flows);
            return;
        }
        let mut seen = HashSet::new();
        let keys: Vec<EgressFlowKey> = flows
            .iter()
            .map(flow_key)
            .filter(|k| seen.insert(*k))
            .collect();
        let id = self.new_query(QueryCtx::Egress {
            src,
            flows,
            keys: keys.clone(),
        });
        self.egress_inflight.insert(src, id);
        out.push(Output::Query(Query::Egress { id, src, keys }));
    }

    /// The answer to source `src`'s egress query, for every flow that waited on it.
    ///
    /// One query per source is in flight at a time, carrying the flow keys known when it was
    /// emitted (its first flow's); flows of the source that come meanwhile join it. Chosen
    /// over one query per flow key: a pod's burst of flows costs the agent one index read
    /// (1 + 16 look-ups) per round trip plus one look-up per key, not an index read each.
    /// A flow is decided by the answer when its own key was looked up: carried, or its
    /// record is in the answer anyway (the index named it: the same entry the exact look-up
    /// returns). Otherwise its layer-4 record may exist beyond the index's latest 16, so it
    /// must not fall back to layer 7 or be dismissed yet: such joiners are asked again, one
    /// query carrying all their keys (one more round trip for them; each flow is re-asked at
    /// most once since its key is then carried).
    pub(super) fn on_egress_answer(
        &mut self,
        src: IpAddr,
        flows: Vec<Tuple>,
        keys: &[EgressFlowKey],
        records: &[EgressRecord],
        out: &mut Vec<Output>,
    ) {
        self.egress_inflight.remove(&src);
        // Sets: a flood of one source's flows makes both lists as long as `max_pending`.
        let looked_up: HashSet<EgressFlowKey> = keys
            .iter()
            .copied()
            .chain(
                records
                    .iter()
                    .filter(|r| r.src == src)
                    .map(|r| EgressFlowKey {
                        sport: r.sport,
                        proto: r.proto,
                    }),
            )
            .collect();
        let mut ask_again = Vec::new();
        for t in flows {
            if looked_up.contains(&flow_key(&t)) {
                self.on_egress(&t, Some(records), out);
            } else if self
                .flows
                .get(&t)
                .is_some_and(|f| f.stage == Stage::AwaitEgress)
            {
                ask_again.push(t);
            }
        }
        if !ask_again.is_empty() {
            self.ask_egress(src, ask_again, out);
        }
    }

    /// A drop of a hairpin candidate's tuple: its outcome, reported at once when the egress
    /// is already proven.
    pub(super) fn on_flow_drop(&mut self, t: &Tuple, info: DropInfo, out: &mut Vec<Output>) {
        let Some(f) = self.flows.get_mut(t) else {
            return;
        };
        f.n_drops += 1;
        self.held_drops += 1;
        if f.drop.is_none() {
            f.drop = Some(info);
        }
        if matches!(f.stage, Stage::Settling | Stage::AwaitOutcome(_)) {
            if let Stage::AwaitOutcome(id) = f.stage {
                self.queries.remove(&id);
            }
            self.confirm_hairpin(t, Outcome::Dropped, Vec::new(), out);
        }
    }

    /// Where a looping packet went: a node address with a NodePort (any node address when
    /// the service table is unknown) or a local pod (an LB that targets pods directly) is a
    /// Service backend; a node address on another port is a host listener (TCP or UDP with a
    /// port: an exact layer-4 match needs one); anything else is no LB backend.
    pub(super) fn backend_of(&self, p: &Packet) -> Backend {
        match p.dst_tag {
            Some(Tag::Pod) => Backend::Service,
            Some(Tag::Node)
                if super::evidence::table_missing(&self.services)
                    || self.services.nodeport(p.dport, p.proto).is_some() =>
            {
                Backend::Service
            }
            Some(Tag::Node) if p.sport != 0 && matches!(p.proto, Proto::Tcp | Proto::Udp) => {
                Backend::HostListener
            }
            _ => Backend::None,
        }
    }

    /// A suspect or drop of a connect attempt already confirmed (a SYN retransmit, matched by
    /// source address, port and protocol, since the drop may carry the DNATed destination):
    /// true when folded in (the caller counts it as confirming).
    pub(super) fn fold_confirmed_attempt(&mut self, p: &Packet, ts: u64) -> bool {
        let key = (p.src, p.sport, p.proto);
        match self.confirmed_attempts.get_mut(&key) {
            Some(a) if p.sport != 0 && ts.saturating_sub(a.last_ns) <= RETRY_GAP_NS => {
                a.last_ns = a.last_ns.max(ts);
                self.stats.hairpin_retries_folded += 1;
                true
            }
            _ => false,
        }
    }

    /// Remembers a confirmed attempt (bounded: the oldest goes first when full).
    fn remember_attempt(&mut self, p: &Packet, ts: u64) {
        if p.sport == 0 || !matches!(p.proto, Proto::Tcp | Proto::Udp) {
            return;
        }
        let key = (p.src, p.sport, p.proto);
        if !self.confirmed_attempts.contains_key(&key)
            && self.confirmed_attempts.len() >= self.cfg.max_pending.max(1)
            && let Some(oldest) = self
                .confirmed_attempts
                .iter()
                .min_by_key(|(_, a)| a.last_ns)
                .map(|(k, _)| *k)
        {
            self.confirmed_attempts.remove(&oldest);
        }
        self.confirmed_attempts.insert(key, Attempt { last_ns: ts });
    }

    /// Keeps a drop of a `Pod`- or `Node`-source packet: it may be a hairpin whose suspect is
    /// still on its way. False when it was not kept.
    pub(super) fn hold_pod_drop(&mut self, t: &Tuple, info: DropInfo, packet: Packet) -> bool {
        if matches!(packet.src_tag, Some(Tag::Pod | Tag::Node))
            && !self.drops.contains_key(t)
            && self.has_room()
        {
            self.drops.insert(
                t.clone(),
                RecentDrop {
                    info,
                    packet,
                    confirmed: None,
                },
            );
            self.held_drops += 1;
            return true;
        }
        false
    }

    /// Reports the hairpin flow `t` (egress already matched) and forgets it.
    pub(super) fn confirm_hairpin(
        &mut self,
        t: &Tuple,
        outcome: Outcome,
        extra: Vec<String>,
        out: &mut Vec<Output>,
    ) {
        if let Some(f) = self.flows.get_mut(t)
            && matches!(f.listener, Some(ListenerState::Asked(_)))
        {
            // The listener is part of the evidence: wait for its answer (or its expiry).
            f.deferred = Some((outcome, extra));
            return;
        }
        let Some(mut f) = self.flows.remove(t) else {
            return;
        };
        self.held_suspects -= f.n_suspects;
        self.held_drops -= f.n_drops;
        let Some(m) = f.egress.take() else {
            // Not reachable: only flows with an egress match get here.
            self.stats.suspects_unconfirmed += f.n_suspects;
            self.stats.drops_unmatched += f.n_drops;
            return;
        };
        let host_listener = f.listener.is_some();
        let gathered = self.hairpin_evidence(&mut f, &m, t, extra);
        let p = &f.packet;
        let facts = self.hairpin_facts(
            p,
            gathered.nodeport.as_ref(),
            gathered.local_owner,
            host_listener,
        );
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
            vip: Some(m.record.dst),
            vip_port: Some(m.record.dport),
            drop_reason: f.drop.as_ref().map(|d| d.reason.name.clone()),
            drop_location: f.drop.as_ref().and_then(|d| d.location.clone()),
            snat: if f.snat_unknown {
                SnatState::Unknown
            } else {
                SnatState::No
            },
            evidence: gathered.lines,
            facts,
            nic: Some(f.nic.clone()),
            service: gathered
                .nodeport
                .as_ref()
                .and_then(|n| n.service.as_deref())
                .map(service_name),
            layer: Some(m.layer),
            listener: gathered.listener,
            ..LoopbackEvent::new(&key, p, f.ts, outcome)
        };
        self.stats.suspects_confirmed += f.n_suspects;
        self.stats.drops_confirming += f.n_drops;
        self.stats.confirmed.hairpin += 1;
        self.remember_attempt(p, f.ts);
        out.push(Output::Report(self.record(key, event, f.ts)));
    }

    /// The evidence lines of a confirmed hairpin, in the report's order, with the node's
    /// state read on the way (takes the flow's listener answer and gathered lines).
    fn hairpin_evidence(
        &self,
        f: &mut Flow,
        m: &EgressMatch,
        t: &Tuple,
        extra: Vec<String>,
    ) -> HairpinEvidence {
        let p = &f.packet;
        let node_sourced = p.src_tag == Some(Tag::Node);
        let mut evidence = vec![
            egress_line(&m.record, node_sourced),
            suspect_line(f.ts, &f.nic, p),
            layer_line(m.layer, f.ts, &m.record, p),
        ];
        let local_owner = if node_sourced {
            evidence.push(node_sourced_line(p));
            self.owner_evidence(p.src, &mut evidence)
        } else {
            None
        };
        let listener = match f.listener.take() {
            Some(ListenerState::Known(answer)) => {
                evidence.push(host_listener_line(p));
                evidence.push(listener_line(p, &answer));
                answer.ok().flatten()
            }
            _ => None,
        };
        if p.dst_tag == Some(Tag::Pod) {
            evidence.push(format!(
                "the LB sent the request straight to the local pod {} (an LB that targets \
                 pods, VPC-CNI style), not to a NodePort",
                probe_contract::sock(p.dst, p.dport)
            ));
        }
        evidence.append(&mut f.evidence);
        if let Some(d) = &f.drop {
            evidence.push(drop_line(d, t));
        }
        evidence.extend(extra);
        let nodeport = self.hairpin_nodeport_evidence(p, &mut evidence);
        self.masquerade_evidence(&mut evidence);
        HairpinEvidence {
            lines: evidence,
            local_owner,
            listener,
            nodeport,
        }
    }

    /// The facts the hairpin's remedy is built from.
    fn hairpin_facts(
        &self,
        p: &Packet,
        nodeport: Option<&NodePortEntry>,
        local_owner: Option<AddressOwner>,
        host_listener: bool,
    ) -> Facts {
        Facts {
            source: if p.src_tag == Some(Tag::Node) {
                SourceKind::Node
            } else {
                SourceKind::Pod
            },
            etp_rules: nodeport.map(|n| {
                if n.local_only {
                    Etp::Local
                } else {
                    Etp::Cluster
                }
            }),
            masquerade_rules: self.services.masquerade_rules.len(),
            lb_targets_pod: p.dst_tag == Some(Tag::Pod),
            owner: local_owner,
            host_listener,
            ..Facts::default()
        }
    }

    /// Drops a hairpin candidate without confirming it.
    pub(super) fn dismiss_flow(&mut self, t: &Tuple) {
        if let Some(f) = self.flows.remove(t) {
            self.held_suspects -= f.n_suspects;
            self.held_drops -= f.n_drops;
            self.stats.suspects_unconfirmed += f.n_suspects;
            self.stats.drops_unmatched += f.n_drops;
            if let Stage::AwaitSnat(id) | Stage::AwaitOutcome(id) = f.stage {
                self.queries.remove(&id);
            }
            if let Some(ListenerState::Asked(id)) = f.listener {
                self.queries.remove(&id);
            }
        }
    }
}
