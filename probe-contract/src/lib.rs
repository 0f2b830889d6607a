//! clb-probe's output contract: the plain data the agent writes and every client reads (the
//! JSON lines, the live view, `/metrics`, the Kubernetes Events, `kubectl clb-probe`, xtask's
//! chaos and bench readers, the integration tests).
//!
//! A crate, not a module of `probe-user`, because of who must link it: the plugin, xtask and
//! the integration tests read the agent's output and should not compile the agent's kernel
//! code (aya, the eBPF object). So it holds data and its spellings only (serde, no I/O) and
//! imports nothing of the agent; its one dependency beyond serde is `probe-common` (no
//! features: the tag numbers of the kernel records, without aya), for [`Tag::from_raw`].
//!
//! Field names and enum spellings are the contract: change them only together with every
//! reader. Inside `probe-user` the old paths (`correlate::report`, `correlate::{Report,
//! CorrelatorStats}`, `event::{Tag, Proto}`, `kernel::{Features, CounterSnapshot}`,
//! `agent::nodesync::NodeStatus`, `sink::live::Message`, `sink::kube_event_plan::reason`)
//! are re-exports of these.

pub mod clock;
pub mod event;
pub mod facts;
pub mod fix;
pub mod kube_event;
pub mod live;
pub mod resolution;
pub mod status;

pub use event::{
    AggregateKey, Layer, Listener, LoopbackEvent, LoopbackKind, Outcome, Proto, Report, SnatState,
    Tag,
};
pub use fix::Fix;
pub use live::{Message, Snapshot};
pub use resolution::{LoopLifecycle, LoopResolution};
pub use status::{
    CorrelatorStats, CounterSnapshot, DropHook, Features, KindCounts, NodeStatus, TagCounts, TcMode,
};

#[cfg(test)]
mod tests;
