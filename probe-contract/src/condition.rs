//! The Node condition `LoadBalancerLoopback` (`probe agent --node-condition on`), as
//! `kubectl describe node` and a node-problem-detector-style reader see it: one entry of
//! `Node.status.conditions`, merged by `type`.

use serde::{Deserialize, Serialize};

/// The condition's `type`.
pub const TYPE: &str = "LoadBalancerLoopback";
/// The `reason` while no loop is active and no risk is named.
pub const NO_LOOPBACK: &str = "NoLoopback";

/// `True` while the node report holds an active loop or a risk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionStatus {
    True,
    False,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
        }
    }

    /// The API's spelling back (`Unknown` and anything else: None).
    pub fn parse(s: &str) -> Option<ConditionStatus> {
        match s {
            "True" => Some(ConditionStatus::True),
            "False" => Some(ConditionStatus::False),
            _ => None,
        }
    }
}

/// What the agent decides: status, reason (the loop's kind in CamelCase, see
/// [`reason_of_kind`], or [`NO_LOOPBACK`]) and message (the Service and the first fix).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

/// The entry as written to `Node.status.conditions` (times RFC 3339, UTC).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    /// Always [`TYPE`].
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
    pub last_heartbeat_time: String,
    pub last_transition_time: String,
}

impl NodeCondition {
    pub fn new(c: &Condition, heartbeat: &str, transition: &str) -> NodeCondition {
        NodeCondition {
            type_: TYPE.into(),
            status: c.status,
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_heartbeat_time: heartbeat.into(),
            last_transition_time: transition.into(),
        }
    }
}

/// `healthcheck_blackhole` -> `HealthcheckBlackhole`: a kind as a condition reason.
pub fn reason_of_kind(kind: &str) -> String {
    kind.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}
