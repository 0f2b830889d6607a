//! The node report (#27), a writer of the hub's reports like the others: one `LoopbackReport`
//! object per node in the Kubernetes API, written by that node's agent, read by
//! `kubectl clb-probe report` and `kubectl get loopbackreports`; and the Node condition.
//!
//! The object's schema (`status` only; the CRD ships in the chart), its API coordinates and its
//! name check (the agent writes only the object named after its own node) are the output
//! contract's, `probe_contract::report`; its API resource and the plugin's cluster table from the
//! objects and the Nodes are the plugin's (`clb_probe_client::report`).
//!
//! - [`loops`]: pure: which loops are *active* and which were *resolved* (see there).
//! - [`gate`]: pure: the write rate limit (one write per node per 10 s, coalesced, newest wins).
//! - [`writer`]: the agent's task, off the correlation path like the Events sink: a writer of
//!   the hub's reports that builds, offers and writes the status.
//! - [`status`]: pure: what the report says (the node's facts, the checks' result, the loops).
//! - [`checks`]: `probe check`'s rules for the report, on a thread of their own.
//! - [`api`]: the report object's and the Node condition's writes through the API.
//! - [`this_node`]: E12: the agent writes only as the node it runs on.
//! - [`condition`]: pure: the Node condition `LoadBalancerLoopback` (`--node-condition on`).
//! - [`risks`]: pure: which Services a risk regards (each Service on a shared LB IP).

pub mod api;
pub mod checks;
pub mod condition;
pub mod gate;
pub mod loops;
pub mod risks;
pub mod status;
pub mod this_node;
pub mod writer;

/// Server-side apply's field manager: the agent owns every field of `status` it writes.
pub const FIELD_MANAGER: &str = "clb-probe-agent";
