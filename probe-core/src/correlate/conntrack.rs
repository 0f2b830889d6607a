//! What the correlator gets back from conntrack: a look-up's answer, and the tuple an egress
//! record is looked up by. Its own room so that `hairpin` (which asks) and `evidence` (which
//! words the answers) both read it without importing each other.

use probe_contract::record::EgressRecord;

use crate::state::{ConntrackEntry, Tuple};

/// What a conntrack look-up came to.
pub(super) enum CtAnswer {
    Found(ConntrackEntry),
    /// The kernel has no such entry.
    Missing,
    /// The look-up failed (netlink error, no permission): distinct from "no entry".
    Failed(String),
    /// Not answered within the query timeout.
    Expired,
}

impl From<Option<ConntrackEntry>> for CtAnswer {
    fn from(e: Option<ConntrackEntry>) -> Self {
        e.map_or(CtAnswer::Missing, CtAnswer::Found)
    }
}

/// The conntrack tuple of an egress record (the flow as it left the pod).
pub(super) fn egress_tuple(r: &EgressRecord) -> Tuple {
    Tuple {
        src: r.src,
        dst: r.dst,
        sport: r.sport,
        dport: r.dport,
        proto: r.proto,
    }
}
