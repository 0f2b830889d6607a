//! The correlator's windows and bounds ([`CorrelatorConfig`]), with their defaults.

use serde::{Deserialize, Serialize};

pub(super) const MS: u64 = 1_000_000;
pub(super) const SEC: u64 = 1_000 * MS;

/// Windows and bounds. All times are nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CorrelatorConfig {
    /// Suspect <-> drop of the same 5-tuple, either order. Default 2 s.
    pub pair_window_ns: u64,
    /// How long before a hairpin suspect a layer-7 egress record may have left. Default 10 s.
    pub l7_window_ns: u64,
    /// After a hairpin suspect, how long to wait for a drop before asking conntrack what became
    /// of the flow. Default 1.5 s.
    pub hairpin_settle_ns: u64,
    /// A repeat of an aggregate within this long of its last written JSON line is reported
    /// with `write_json: false`. Default 10 s.
    pub json_repeat_ns: u64,
    /// An unanswered query expires after this long. Default 5 s.
    pub query_timeout_ns: u64,
    /// An aggregate with no repeat for this long is forgotten (its next occurrence is new).
    /// Default 1 h.
    pub aggregate_ttl_ns: u64,
    /// Bound on pending suspects + pending drops + hairpin candidates. Default 4096.
    pub max_pending: usize,
    /// Bound on aggregates kept. Default 1024.
    pub max_aggregates: usize,
    /// Bound on node/pod addresses remembered from event tags (layer-7 matching). Default 4096.
    pub max_known_addrs: usize,
    /// The VIP interface (`--vip-iface`): the owner a `vip` tag names. Default kube-ipvs0.
    pub vip_iface: String,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        CorrelatorConfig {
            pair_window_ns: 2 * SEC,
            l7_window_ns: 10 * SEC,
            hairpin_settle_ns: 1_500 * MS,
            json_repeat_ns: 10 * SEC,
            query_timeout_ns: 5 * SEC,
            aggregate_ttl_ns: 3_600 * SEC,
            max_pending: 4096,
            max_aggregates: 1024,
            max_known_addrs: 4096,
            vip_iface: "kube-ipvs0".to_string(),
        }
    }
}
