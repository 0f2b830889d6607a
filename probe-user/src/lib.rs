//! clb-probe's userspace: kernel events -> correlation -> sinks.
//!
//! - [`kernel`]: the only module that touches aya: load, attach, read events and counters;
//! - [`state`]: readers of kernel state (addresses, conntrack, iptables, IPVS);
//! - [`netlink`]: the one netlink request/dump helper the readers and the clsact fallback share;
//! - [`correlate`]: pure logic that turns events + state into confirmed loopback events;
//! - [`kube`]: Kubernetes attribution (pod and Service names on confirmed events);
//! - [`sink`]: where confirmed events and counters go (JSON lines, metrics, live view).
//! - [`check`]: `probe check`, the node's loopback risks judged from its state (pure rules).
//! - [`term`]: outside text (NIC names, Event fields) made safe to print on a terminal.
//! - [`untrusted`]: strings from tenants and the node (annotation values, process names)
//!   bounded and escaped where they enter.

pub mod agent;
pub mod check;
pub mod correlate;
pub mod fixes;
#[cfg(test)]
mod fuzz_tests;
pub mod hub;
pub mod kernel;
pub mod kube;
pub mod netlink;
pub mod plugin;
pub mod report;
pub mod resolution;
pub mod sink;
pub mod state;
pub mod term;
#[cfg(test)]
mod test_events;
pub mod untrusted;
pub mod watch;
