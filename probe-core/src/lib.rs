//! clb-probe's pure core: what the product decides, with no I/O. Inputs come in as data (the
//! kernel's events, the node's state as its readers filled it, a Service as the API sent it,
//! the time as an argument), and decisions go out as data; the agent (`probe-user`) and the
//! kubectl plugin (`probe-client`) are the shells that read, wait and write around it.
//!
//! - [`correlate`]: events + state -> confirmed loopback events, with evidence and remedies;
//! - [`resolution`]: when a confirmed loop is proven gone;
//! - [`verify`]: what a verify test plans and what its attempts come to;
//! - [`fixes`]: the fixes for a Service as data (which the plugin applies and the agent
//!   attaches to events);
//! - [`service`]: a Service as the fixes read it;
//! - [`state`]: the plain data the node's state readers fill;
//! - [`term`], [`untrusted`]: outside text made safe to print, strings bounded where they enter.
//!
//! Its dependency tree holds no aya, tokio, kube client, rtnetlink or netlink crate
//! (`cargo tree -p probe-core -e normal`), and its tests run without root or the eBPF build.

pub mod correlate;
pub mod fixes;
pub mod resolution;
pub mod service;
pub mod state;
pub mod term;
#[doc(hidden)]
pub mod test_events;
pub mod untrusted;
pub mod verify;
