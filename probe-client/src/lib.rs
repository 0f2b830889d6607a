//! clb-probe's clients, without the agent: the kubectl plugin (`kubectl-clb_probe`, this crate's
//! binary), the client side of `probe watch` and `probe events`, and the pure pieces both they
//! and the agent use.
//!
//! A crate of its own so that the plugin builds without the kernel side: no aya, no eBPF
//! object, no probe-user (`cargo tree -p probe-client` names no aya crate). The agent
//! (`probe-user`) depends on this crate, never the other way round. Layout, and why:
//!
//! - the types a client reads are the output contract's (`probe-contract`): the live view's
//!   [`probe_contract::Message`], the `LoopbackReport` (`probe_contract::report`), the Event's
//!   names (`probe_contract::kube_event`). They are used from there, never re-exported here;
//! - [`plugin`]: `kubectl clb-probe` (the pure part; `plugin::api` talks to the API server);
//! - [`report`]: the `LoopbackReport` API resource and the plugin's cluster table;
//! - [`watch`]: `probe watch` and `probe events`, the clients of the agent's live-view socket
//!   (the agent's `probe` binary runs them; the socket's server stays in the agent);
//! - [`fixes`]: the fixes as data (pure), which the plugin lists and applies and the agent
//!   attaches to events (the function that reads the agent's address index, `attach_fixes`,
//!   stays in probe-user's `kube::enrich`);
//! - [`service`]: a Service as the fixes read it ([`service::ServiceFacts`]); the agent's
//!   address index over them stays in probe-user (`kube::index`);
//! - [`term`]: outside text (NIC names, Event fields) made safe to print on a terminal;
//! - [`untrusted`]: strings from tenants and the node (annotation values, process names)
//!   bounded and escaped where they enter.

pub mod fixes;
pub mod plugin;
pub mod report;
pub mod service;
pub mod term;
pub mod untrusted;
pub mod watch;
