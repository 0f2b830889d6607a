//! What kube-proxy programmed for one VIP:port, as read (probe-user's `state::dataplane` reads
//! it from the rules).

use serde::{Deserialize, Serialize};

/// One dataplane read: where it looked, and what it found there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataplaneRead {
    /// Where, as evidence: `kube-proxy iptables rules (nat KUBE-SERVICES, netlink)`.
    pub read: String,
    /// The rule, map element or virtual service for the VIP:port, as text; None: none.
    pub found: Option<String>,
}
