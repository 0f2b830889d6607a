//! What the correlator and the agent exchange besides kernel events: its [`Output`]s (a report
//! or a [`Query`]) and the agent's [`Answer`]s (see the [module documentation](super) for which
//! rule asks what).

use std::net::IpAddr;

use probe_contract::{Confirmation, Listener, Proto, record::EgressRecord};
use serde::{Deserialize, Serialize};

use crate::state::{ConntrackEntry, SelfLoopFacts, Tuple};

/// What the correlator hands back: a report for the sinks, or a question for the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "reports are the common case and the agent matches on them by value"
)]
pub enum Output {
    Report(Confirmation),
    Query(Query),
}

/// A look-up the agent must answer through [`Correlator::answer`](super::Correlator::answer) with the same `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Query {
    /// `src`'s `EGRESS_FLOWS` entries its per-source index names (its latest 16 flows), plus
    /// the exact entry of each of `keys` (the suspects' own flows: their layer-4 match).
    Egress {
        id: u64,
        src: IpAddr,
        /// Absent in recordings older than the exact look-up: the index alone.
        #[serde(default)]
        keys: Vec<EgressFlowKey>,
    },
    /// The conntrack entry whose original tuple is exactly `tuple`.
    Conntrack { id: u64, tuple: Tuple },
    /// The listening socket that serves `addr:port/proto` in this network namespace (a
    /// host-listener hairpin names it).
    Listener {
        id: u64,
        addr: IpAddr,
        port: u16,
        proto: Proto,
    },
    /// A pod's self-addressed packet was dropped (on `iface` when on the node); `tuple` is
    /// the pod's call as it reached the pod (pod:client port -> pod:endpoint port, after
    /// DNAT): the conntrack entry whose *reply* tuple is `tuple` reversed, and the node's
    /// pieces of the hairpin ([`SelfLoopFacts`]). `reply_dropped`: the packet was the answer
    /// to that call, un-NATed back to the pod (its call was masqueraded, so the entry's reply
    /// tuple holds the node's address: looked up by the call's ports instead,
    /// [`crate::state::conntrack::is_self_call`]). Answered with [`Answer::SelfLoop`].
    SelfLoop {
        id: u64,
        tuple: Tuple,
        iface: Option<String>,
        reply_dropped: bool,
    },
    /// Whether this node's kube-proxy really programmed `addr:port/proto` (read from the
    /// dataplane over netlink, one chain, set or IPVS service): asked when the table from the
    /// API says a Service serves a VIP port the kernel just refused. Answered with
    /// [`Answer::Programmed`].
    Programmed {
        id: u64,
        /// The mode the table is for: where to look.
        mode: Option<crate::state::ServiceSource>,
        addr: IpAddr,
        port: u16,
        proto: Proto,
    },
}

impl Query {
    pub fn id(&self) -> u64 {
        match self {
            Query::Egress { id, .. }
            | Query::Conntrack { id, .. }
            | Query::Listener { id, .. }
            | Query::SelfLoop { id, .. }
            | Query::Programmed { id, .. } => *id,
        }
    }
}

/// A hairpin suspect's own egress flow, besides its source address: the `EGRESS_FLOWS` key
/// its layer-4 match would have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EgressFlowKey {
    pub sport: u16,
    pub proto: Proto,
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
    /// The conntrack look-up failed (a netlink error, not "no entry"): what it would have
    /// confirmed is reported as unknown.
    ConntrackFailed {
        id: u64,
        error: String,
    },
    /// The listener look-up: `Ok(None)` when nothing listens there, `Err` when the look-up
    /// failed.
    Listener {
        id: u64,
        listener: Result<Option<Listener>, crate::state::ReadFailed>,
    },
    /// The answer to [`Query::SelfLoop`]: the conntrack look-up (an error as text) and what
    /// the node's ipsets, bridge and sysctls say.
    SelfLoop {
        id: u64,
        conntrack: Result<Option<ConntrackEntry>, crate::state::ReadFailed>,
        facts: SelfLoopFacts,
    },
    /// The answer to [`Query::Programmed`]: what the dataplane holds, or why it could not be
    /// read.
    Programmed {
        id: u64,
        read: Result<DataplaneRead, crate::state::ReadFailed>,
    },
}

pub use crate::state::dataplane::DataplaneRead;
