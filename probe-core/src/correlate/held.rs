//! What the correlator holds between events (plain data): drops and suspects waiting for
//! their pair, hairpin candidates and the stage each has reached, self-loop drops waiting for
//! the node's state, the queries in flight, the aggregates. The rules that fill and read them
//! are in the file of their kind; this file imports none of them, so the facade and the rules
//! both import it and neither imports the other back.

use std::{collections::HashMap, net::IpAddr};

use probe_contract::{
    AggregateKey, Layer, Listener, LoopbackEvent, Outcome,
    record::{DropReason, EgressRecord, Packet},
};

use super::queries::EgressFlowKey;
use crate::state::Tuple;

/// A drop, as evidence.
#[derive(Clone)]
pub(super) struct DropInfo {
    pub(super) ts: u64,
    pub(super) iface: Option<String>,
    pub(super) reason: DropReason,
    pub(super) location: Option<String>,
    /// The destination the kernel saw at the drop, when kube-proxy's DNAT had already
    /// rewritten it (the packet then carries the pre-DNAT destination of its suspect).
    pub(super) dnat_to: Option<(IpAddr, u16)>,
    /// `reason` was inferred from the drop site: the kernel reported none (< 5.17).
    pub(super) inferred: bool,
    /// The drop happened in a pod's own network namespace (see `KernelEvent::Drop`).
    pub(super) foreign_netns: bool,
}

/// A drop kept for pairing with a later suspect of the same tuple.
pub(super) struct RecentDrop {
    pub(super) info: DropInfo,
    pub(super) packet: Packet,
    /// Already part of a confirmation (kept so a late suspect is absorbed into it).
    pub(super) confirmed: Option<AggregateKey>,
}

pub(super) enum QueryCtx {
    /// `keys`: the flow keys the query carried (see `Correlator::on_egress_answer`).
    Egress {
        src: IpAddr,
        flows: Vec<Tuple>,
        keys: Vec<EgressFlowKey>,
    },
    Snat {
        flow: Tuple,
    },
    Outcome {
        flow: Tuple,
    },
    Listener {
        flow: Tuple,
    },
    SelfLoop {
        flow: Tuple,
    },
    /// A refused VIP packet the table from the API says is served, waiting for the dataplane
    /// to say whether kube-proxy programmed its port (`unserved.rs`).
    Programmed {
        packet: Box<Packet>,
        info: Box<DropInfo>,
    },
}

pub(super) struct PendingQuery {
    pub(super) issued: u64,
    pub(super) ctx: QueryCtx,
}

/// A recorded confirmation: its event (count, times) and when its JSON line was last written.
pub(super) struct Aggregate {
    pub(super) event: LoopbackEvent,
    pub(super) last_json_ns: u64,
}

/// A `Vip`-source suspect waiting for its drop (`blackhole.rs`).
pub(super) struct VipSuspect {
    pub(super) ts: u64,
    pub(super) nic: String,
    pub(super) packet: Packet,
    pub(super) n: u64,
}

/// A confirmed connect attempt, remembered to fold its retransmits in.
pub(super) struct Attempt {
    pub(super) last_ns: u64,
}

/// Where a hairpin candidate stands (`hairpin/steps.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Waiting for the egress answer.
    AwaitEgress,
    /// Waiting for conntrack of the egress tuple (query id).
    AwaitSnat(u64),
    /// Egress proven; waiting for a drop until the settle time.
    Settling,
    /// Waiting for conntrack of the hairpin tuple (query id).
    AwaitOutcome(u64),
}

/// The listener look-up of a host-listener candidate.
pub(super) enum ListenerState {
    /// Asked (query id).
    Asked(u64),
    /// The answer: `Ok(None)`, nothing listens there now; `Err`, the look-up failed.
    Known(Result<Option<Listener>, crate::state::ReadFailed>),
}

/// The egress record that explains a hairpin suspect, and how (layer 4 or 7).
pub(super) struct EgressMatch {
    pub(super) record: EgressRecord,
    pub(super) layer: Layer,
}

/// A hairpin candidate (a `Pod`-source suspect), keyed by its 5-tuple.
pub(super) struct Flow {
    pub(super) seq: u64,
    pub(super) ts: u64,
    pub(super) nic: String,
    pub(super) packet: Packet,
    /// Suspects of this tuple folded in (retransmits).
    pub(super) n_suspects: u64,
    pub(super) stage: Stage,
    pub(super) drop: Option<DropInfo>,
    pub(super) n_drops: u64,
    pub(super) egress: Option<EgressMatch>,
    /// Evidence gathered after the egress match (conntrack of the egress flow).
    pub(super) evidence: Vec<String>,
    /// The conntrack look-up of the egress flow failed: SNAT cannot be confirmed either way.
    pub(super) snat_unknown: bool,
    /// Host-listener candidates: the listener look-up (None for the other backends).
    pub(super) listener: Option<ListenerState>,
    /// A confirmation waiting for the listener answer: (outcome, extra evidence).
    pub(super) deferred: Option<(Outcome, Vec<String>)>,
}

/// A self-loop drop waiting for its [`super::Query::SelfLoop`] answer.
pub(super) struct PendingSelfLoop {
    pub(super) info: DropInfo,
    /// The call (see `self_loop::call_of`).
    pub(super) packet: Packet,
    /// The packet dropped was the call's answer; its own tuple, for the drop's line.
    pub(super) answer: Option<Tuple>,
}

/// The self-loop drops waiting for the node's state, by the dropped tuple.
pub(super) type Pending = HashMap<Tuple, PendingSelfLoop>;
