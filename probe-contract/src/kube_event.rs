//! How a confirmed loopback is named in a Kubernetes Event: what the agent writes
//! (`--kube-events`) and `kubectl clb-probe events` selects and reads back.

use crate::event::LoopbackKind;

/// The Event's `reportingController`; `kubectl clb-probe events` selects on it.
pub const REPORTING_CONTROLLER: &str = "clb-probe";
/// The Event's `action`.
pub const ACTION: &str = "Detected";
/// The `reason` of the Normal Event written when a loop is resolved (its `action`:
/// [`RESOLVED_ACTION`]).
pub const RESOLVED_REASON: &str = "LoopbackResolved";
pub const RESOLVED_ACTION: &str = "Resolved";

/// The Event's `reason` per kind (UpperCamelCase, as Kubernetes reasons are).
pub fn reason(kind: LoopbackKind) -> &'static str {
    match kind {
        LoopbackKind::HealthcheckBlackhole => "HealthCheckBlackhole",
        LoopbackKind::Hairpin => "LoopbackHairpin",
        LoopbackKind::VipPortUnserved => "VipPortUnserved",
        LoopbackKind::VipAsSource => "VipAsSource",
        LoopbackKind::ServiceSelfLoop => "ServiceSelfLoop",
    }
}

/// The kind a `reason` names (for `kubectl clb-probe events`).
pub fn kind_of_reason(reason: &str) -> Option<LoopbackKind> {
    [
        LoopbackKind::HealthcheckBlackhole,
        LoopbackKind::Hairpin,
        LoopbackKind::VipPortUnserved,
        LoopbackKind::VipAsSource,
        LoopbackKind::ServiceSelfLoop,
    ]
    .into_iter()
    .find(|k| self::reason(*k) == reason)
}
