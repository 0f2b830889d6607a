//! The facts a remedy is built from: the output contract's (`probe-contract`), re-exported
//! under the correlator's path.

pub use probe_contract::facts::*;
