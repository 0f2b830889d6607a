//! clb-probe's userspace: kernel events -> correlation -> sinks.
//!
//! - [`kernel`]: the only module that touches aya: load, attach, read events and counters;
//! - [`state`]: readers of kernel state (addresses, conntrack, iptables, IPVS);
//! - [`netlink`]: the one netlink request/dump helper the readers and the clsact fallback share;
//! - [`correlate`], [`resolution`], [`verify`]: the pure core's (`probe_core`), re-exported:
//!   events + state -> confirmed loopback events, their proof of resolution, verify's decisions;
//! - [`kube`]: Kubernetes attribution (pod and Service names on confirmed events);
//! - [`sink`]: where confirmed events and counters go (JSON lines, metrics, live view).
//! - [`check`]: `probe check`, the node's loopback risks judged from its state (pure rules).
//!
//! The fixes table, the terminal escaping and the bounding of untrusted strings are the pure
//! core's (`probe_core`); the kubectl plugin and `probe watch`'s and `probe events`' client
//! side are the client crate's (`clb_probe_client`), which the agent links only for those two
//! client commands of its binary.

pub mod agent;
pub mod check;
#[cfg(test)]
mod ebpf_prebuilt_tests;
#[cfg(test)]
mod fuzz_tests;
pub mod hub;
pub mod kernel;
pub mod kube;
pub mod netlink;
pub mod sink;
pub mod state;

// Test support shared with the core's tests (a hairpin event every unit test starts from).
#[cfg(test)]
use probe_core::test_events;
pub use probe_core::{correlate, resolution, verify};
