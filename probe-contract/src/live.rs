//! The live view's protocol (`probe watch`, `probe events`): JSON lines from the agent to the
//! client, each one [`Message`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    event::LoopbackEvent,
    status::{CorrelatorStats, CounterSnapshot, NodeStatus},
};

/// A point-in-time view for the live view's header and tables.
///
/// `#[serde(default)]` here and on the status and counter structs: a client reads an agent of
/// another version (a field it does not know is ignored, one the agent does not send is zero).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    pub node: String,
    pub status: NodeStatus,
    pub counters: CounterSnapshot,
    /// Drops by reason name (kernel counters, suspects and VIP destinations).
    pub drops_by_reason: BTreeMap<String, u64>,
    pub userspace_queue_full: u64,
    pub events_read: u64,
    pub correlator: CorrelatorStats,
    pub confirmed: Vec<LoopbackEvent>,
    /// (capability, available).
    pub capabilities: Vec<(String, bool)>,
    /// Kubernetes attribution has a working API connection.
    pub kube_connected: bool,
    /// Kubernetes Event writes by result.
    pub kube_event_writes: Vec<(String, u64)>,
    /// Confirmed loops by state, and the latest resolutions.
    pub loops: crate::resolution::LoopLifecycle,
}

/// One line of the protocol: `{"type":"snapshot","snapshot":{...}}` or
/// `{"type":"report","event":{...},"is_new":bool}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Snapshot {
        snapshot: Box<Snapshot>,
    },
    Report {
        event: Box<LoopbackEvent>,
        is_new: bool,
    },
}
