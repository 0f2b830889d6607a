//! clb-probe's clients, without the agent: the kubectl plugin (`kubectl-clb_probe`, this crate's
//! binary), the client side of `probe watch` and `probe events`, and the pure pieces both they
//! and the agent use.
//!
//! A crate of its own so that the plugin builds without the kernel side: no aya, no eBPF
//! object, no probe-user (`cargo tree -p clb-probe-client` names no aya crate). The agent
//! (`probe-user`) depends on this crate only for `probe watch` and `probe events`, never the
//! other way round. Layout, and why:
//!
//! - the types a client reads are the output contract's (`probe-contract`): the live view's
//!   [`probe_contract::Message`], the `LoopbackReport` (`probe_contract::report`), the Event's
//!   names (`probe_contract::kube_event`). They are used from there, never re-exported here;
//! - [`plugin`]: `kubectl clb-probe` (the pure part; `plugin::api` talks to the API server);
//! - [`report`]: the `LoopbackReport` API resource and the plugin's cluster table;
//! - [`watch`]: `probe watch` and `probe events`, the clients of the agent's live-view socket
//!   (the agent's `probe` binary runs them; the socket's server stays in the agent);
//! - `fixes`, `service`, `term`, `untrusted`: the pure core's (`probe_core`), re-exported:
//!   the fixes as data, a Service as the fixes read it, outside text made safe to print,
//!   strings bounded where they enter.

pub mod plugin;
pub mod report;
pub mod watch;

// The pure pieces are the core's (`probe_core`): re-exported under the paths the plugin and
// its tests have always used.
pub use probe_core::{fixes, service, term, untrusted};
