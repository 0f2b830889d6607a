//! clb-probe's userspace: kernel events -> correlation -> sinks.
//!
//! - [`kernel`]: the only module that touches aya: load, attach, read events and counters;
//! - [`state`]: readers of kernel state (addresses, conntrack, iptables, IPVS);
//! - [`netlink`]: the one netlink request/dump helper the readers and the clsact fallback share;
//! - [`correlate`]: pure logic that turns events + state into confirmed loopback events;
//! - [`kube`]: Kubernetes attribution (pod and Service names on confirmed events);
//! - [`sink`]: where confirmed events and counters go (JSON lines, metrics, live view).
//! - [`check`]: `probe check`, the node's loopback risks judged from its state (pure rules).
//!
//! The kubectl plugin, `probe watch`'s and `probe events`' client side, the fixes table, the
//! terminal escaping and the bounding of untrusted strings are the client crate's
//! (`clb_probe_client`, no aya): the agent uses them from there.

pub mod agent;
pub mod check;
pub mod correlate;
#[cfg(test)]
mod fuzz_tests;
pub mod hub;
pub mod kernel;
pub mod kube;
pub mod netlink;
pub mod resolution;
pub mod sink;
pub mod state;
#[cfg(test)]
mod test_events;
pub mod verify;
