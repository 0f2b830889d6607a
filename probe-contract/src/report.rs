//! The `LoopbackReport` (#27): its API coordinates and its `status`, as the agent writes it and
//! `kubectl clb-probe report` reads it (camelCase JSON; the chart's CRD schema lists the same
//! fields). Times are RFC 3339 UTC.
//!
//! Size: a report is bounded ([`MAX_RISKS`], the agent's `report::loops::MAX_ACTIVE` and
//! `report::loops::MAX_RESOLVED`, client pods per loop): a clean node's status is ~250 B
//! (the object ~1 KiB with metadata and managedFields), ~90 KiB when every list is full
//! (`a_full_report_stays_far_below_the_object_size_limit`; docs/cluster-view.md).

use serde::{Deserialize, Serialize};

/// The project's API group (the CRD `loopbackreports.clb-probe.io` in the chart).
pub const GROUP: &str = "clb-probe.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "LoopbackReport";
pub const PLURAL: &str = "loopbackreports";
/// `group/version`.
pub const API_VERSION: &str = "clb-probe.io/v1alpha1";

/// The LoopbackReport resource: the agent writes it, the plugin reads it.
pub const RESOURCE: CustomResource = CustomResource {
    group: GROUP,
    version: VERSION,
    api_version: API_VERSION,
    kind: KIND,
    plural: PLURAL,
};

/// One of the project's custom resources by its API names, the same at both ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CustomResource {
    pub group: &'static str,
    pub version: &'static str,
    /// `group/version`.
    pub api_version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

#[cfg(feature = "kube")]
impl CustomResource {
    /// For `kube::Api<DynamicObject>`.
    pub fn api_resource(&self) -> kube_core::discovery::ApiResource {
        kube_core::discovery::ApiResource {
            group: self.group.into(),
            version: self.version.into(),
            api_version: self.api_version.into(),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }
}

/// Risks kept in a report (most severe first, as `probe check` sorts them).
pub const MAX_RISKS: usize = 50;
/// The Services one risk names at most.
pub const MAX_RISK_SERVICES: usize = 10;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReportStatus {
    /// The node (also the object's name).
    pub node: String,
    pub agent_version: String,
    /// `uname -r`.
    pub kernel: String,
    /// kube-proxy's mode as the node's rules show it: `ipvs`, `iptables`, `nftables`, `none`
    /// (no kube-proxy rules: see `dataplane`), or `unknown` (not read yet).
    pub kube_proxy_mode: String,
    /// What serves the node's Services: `kube-proxy`, or with `kubeProxyMode: none` its
    /// replacement, `cilium` or `unknown` (`probe check`'s dataplane); empty from an older
    /// agent.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub dataplane: String,
    /// `probe check --as nftables` in short, on a kube-proxy node not in nftables mode:
    /// `ready, 2 gone` (no risk appears with the move) or `1 new, 2 gone`; empty otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub nftables_readiness: String,
    /// What this agent cannot confirm on this node, and why (empty: everything).
    pub capabilities: Vec<CapabilityStatus>,
    /// `probe check`'s findings of severity `risk`.
    pub risks: Vec<RiskStatus>,
    pub active_loops: Vec<ActiveLoop>,
    /// Loops not seen for the active window, resolved within the last 24 h.
    pub resolved_loops: Vec<ResolvedLoop>,
    /// Counts, for the CRD's printer columns (`kubectl get loopbackreports`).
    pub risk_count: u32,
    pub active_loop_count: u32,
    /// When the agent built this state (it rewrites at least every heartbeat, the agent's
    /// `report::writer::HEARTBEAT`: older than `clb_probe_client::report::cluster::STALE_AFTER`
    /// is stale).
    pub last_update: String,
}

/// A capability the agent lacks on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CapabilityStatus {
    /// `drop_hook`, `drop_sites`, `conntrack` (`clbprobe_capability{name}`).
    pub name: String,
    pub available: bool,
    /// What cannot be confirmed without it.
    pub cannot_confirm: String,
}

/// Fix ids kept per risk or loop (the best fits: the report stays small with every entry
/// full; `kubectl clb-probe fix` lists the kept ones).
pub const MAX_FIX_IDS: usize = 4;

/// A `probe check` risk.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RiskStatus {
    /// `healthcheck_blackhole`, `vip_port_unserved`, `hairpin`, ...
    pub kind: String,
    /// The address (`ip` or `ip:port/proto`).
    pub subject: String,
    /// `namespace/name` of the Service behind it, when the API names it (the first of
    /// `services`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Every Service it regards (an LB IP shared by several Services: each of them), at most
    /// [`MAX_RISK_SERVICES`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    pub summary: String,
    /// The first fix (its id and what it changes), else the first remedy line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_fix: Option<String>,
    /// The ids of the fixes computed from the facts on the node, best fit first, at most
    /// [`MAX_FIX_IDS`] (`kubectl clb-probe fix` lists these rather than recomputing them
    /// from the Service).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<String>,
}

/// A loop seen within the active window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ActiveLoop {
    /// `hairpin`, `healthcheck_blackhole`, `vip_port_unserved`, `vip_as_source`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// `ip:port` (`ip` when the port is unknown).
    pub vip: String,
    pub client_pods: Vec<String>,
    pub count: u64,
    pub first_seen: String,
    pub last_seen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_fix: Option<String>,
    /// The ids of the fixes the agent computed for the loop, best fit first, at most
    /// [`MAX_FIX_IDS`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<String>,
    /// Set on the one entry that stands for a flood of one group's loops (E5, the agent's
    /// `report::loops`): "flood: N more KIND loops on SERVICE-OR-ADDRESS ...; e.g. ...".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<String>,
    /// Only the agent's canary (`--canary-every`) has tripped this loop so far: no user's
    /// call was seen looping (left out when false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub canary: bool,
}

/// A loop no longer seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResolvedLoop {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub vip: String,
    pub count: u64,
    pub first_seen: String,
    pub last_seen: String,
    /// When the agent resolved it with proof (`proof` set), else `last_seen` + the active
    /// window: when it stopped counting as active.
    pub resolved_at: String,
    /// The agent's proof that the loop is gone (the first line of its `LoopbackResolved`):
    /// absent when the loop only went quiet for the window, unproven.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// The object's name for `node`: the node's own name, checked to be one the API accepts (a
/// DNS subdomain). The agent never writes any other object: the name comes from here only.
pub fn object_name(node: &str) -> Result<String, InvalidNodeName> {
    let ok = !node.is_empty()
        && node.len() <= 253
        && node.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok {
        Ok(node.to_string())
    } else {
        Err(InvalidNodeName(node.to_string()))
    }
}

/// A node name the API would not accept as an object's name: no LoopbackReport is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidNodeName(pub String);

impl std::fmt::Display for InvalidNodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node name {:?} is not a valid object name (lowercase DNS subdomain): no \
             LoopbackReport is written",
            self.0
        )
    }
}

impl std::error::Error for InvalidNodeName {}

/// RFC 3339 of a Unix time in seconds.
pub fn rfc3339(unix_secs: i64) -> String {
    jiff::Timestamp::from_second(unix_secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Unix seconds of an RFC 3339 time (None: unparsable).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_valid_node_name_names_the_object() {
        assert_eq!(object_name("node-a"), Ok("node-a".into()));
        assert_eq!(
            object_name("ip-10-0-1-2.ec2.internal"),
            Ok("ip-10-0-1-2.ec2.internal".into())
        );
        for bad in ["", "Node-A", "a/b", "-a", "a..b", "../x", "a b"] {
            let e = object_name(bad).unwrap_err();
            assert!(
                e.to_string().contains("not a valid object name"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn times_round_trip_and_the_status_is_camel_case() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339(&rfc3339(1_800_000_000)), Some(1_800_000_000));
        let v = serde_json::to_value(ReportStatus {
            active_loop_count: 2,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(v["activeLoopCount"], 2);
        assert!(v.get("kubeProxyMode").is_some());
        // An older or newer agent's object still parses (every field defaults).
        let back: ReportStatus = serde_json::from_value(serde_json::json!({"node": "n"})).unwrap();
        assert_eq!(back.node, "n");
    }
}
