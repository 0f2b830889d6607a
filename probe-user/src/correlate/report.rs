//! The JSON output contract: one [`LoopbackEvent`] per line of `probe agent --events -`.
//!
//! The types live in the `probe-contract` crate (every client reads them); this path
//! re-exports them.

pub use probe_contract::event::*;
