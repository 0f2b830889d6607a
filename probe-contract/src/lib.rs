//! clb-probe's output contract: the plain data the agent writes and every client reads (the
//! JSON lines, the live view, `/metrics`, the Kubernetes Events, `kubectl clb-probe`, xtask's
//! chaos and bench readers, the integration tests).
//!
//! A crate, not a module of `probe-user`, because of who must link it: the plugin, xtask and
//! the integration tests read the agent's output and should not compile the agent's kernel
//! code (aya, the eBPF object). So it holds data and its spellings only (serde, no I/O) and
//! imports nothing of the agent; beyond serde it depends on `probe-common` (no features: the
//! tag numbers of the kernel records, without aya), for [`Tag::from_raw`], and on jiff for the
//! `LoopbackReport`'s RFC 3339 times ([`report::rfc3339`]).
//!
//! Field names and enum spellings are the contract: change them only together with every
//! reader.
//!
//! One path per type: the agent's records and statuses (the modules `event`, `status`,
//! `live`, `fix`, `resolution`) are named at the crate root (`probe_contract::LoopbackEvent`);
//! the record stream ([`record`]), the remedy facts ([`facts`]), the Event spellings ([`kube_event`]), the `LoopbackReport` ([`report`]) and the clock
//! ([`clock`]) keep their module's name, because their names only read well with it
//! (`facts::SelfLoopMissing`, `kube_event::reason`, `metrics::READY`). Nothing in `probe-user` re-exports them.

pub mod check;
pub mod clock;
pub mod condition;
mod event;
pub mod evidence;
pub mod facts;
mod fix;
pub mod kube_event;
mod live;
pub mod metrics;
pub mod readiness;
pub mod record;
pub mod report;
mod resolution;
mod status;
pub mod verify;

pub use event::{
    AggregateKey, Caller, Confirmation, KINDS, KindCounts, KindSpec, Layer, LbAddress, Listener,
    LoopbackEvent, LoopbackKind, Outcome, ProofShape, Proto, ServiceLookup, SnatState, Tag,
    names_service, sock,
};
pub use fix::Fix;
pub use live::{Message, Snapshot};
pub use resolution::{LoopLifecycle, LoopResolution};
pub use status::{
    CorrelatorStats, CounterSnapshot, DropHook, Features, NodeStatus, TagCounts, TcMode,
};

#[cfg(test)]
mod tests;
