//! What the node report says (pure): the facts of the node, `probe check`'s latest result,
//! and the status built from them and the loops; which differences are worth a write.

use probe_contract::report::{CapabilityStatus, ReportStatus, RiskStatus, rfc3339};

use super::loops::{Loops, first_fix, fix_ids};
use crate::hub::capability::{Capabilities, Capability};

/// What does not change while the agent runs.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    pub node: String,
    pub agent_version: String,
    pub kernel: String,
}

impl NodeFacts {
    pub fn of_this_node(node: &str) -> NodeFacts {
        NodeFacts {
            node: node.to_string(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
        }
    }
}

/// The latest `probe check` result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckState {
    pub mode: String,
    /// `kube-proxy`, `cilium`, `unknown` (empty: not read).
    pub dataplane: String,
    /// [`crate::check::readiness::Prediction::summary`] (empty: not an IPVS/iptables node).
    pub nftables_readiness: String,
    pub risks: Vec<RiskStatus>,
}

/// `probe check`'s risks (severity `risk`), with their Services and first fixes (pure).
pub fn check_state(
    inputs: &crate::check::Inputs,
    services: &[probe_core::service::ServiceFacts],
) -> CheckState {
    let mut inputs = inputs.clone();
    if !services.is_empty() {
        crate::check::services::merge(&mut inputs, services);
    }
    let mut findings = crate::check::rules::judge(&inputs);
    crate::check::attach_fixes(&mut findings, services, inputs.kube_proxy_runs());
    let report = probe_contract::check::CheckReport::new(findings);
    let risks = report
        .findings
        .iter()
        .filter(|f| f.severity == probe_contract::check::Severity::Risk)
        .take(probe_contract::report::MAX_RISKS)
        .map(|f| {
            let services = super::risks::risk_services(f, &inputs.lb_targets);
            RiskStatus {
                kind: f.kind.as_str().to_string(),
                subject: f.subject.clone(),
                service: services.first().cloned(),
                services,
                summary: f.summary.clone(),
                first_fix: first_fix(&f.fixes, &f.remedy),
                fixes: fix_ids(&f.fixes),
            }
        })
        .collect();
    CheckState {
        // The dataplane as `probe check` names it (`none` without kube-proxy's rules).
        mode: match (&inputs.dataplane, inputs.services.source) {
            (Some(d), _) => d.mode.as_str().into(),
            (None, Some(s)) => crate::check::dataplane::mode_of(s).as_str().into(),
            (None, None) => "unknown".into(),
        },
        dataplane: inputs
            .dataplane
            .as_ref()
            .map(|d| d.serving().to_string())
            .unwrap_or_default(),
        nftables_readiness: match inputs.dataplane.as_ref().map(|d| d.mode) {
            Some(probe_contract::check::Mode::Ipvs | probe_contract::check::Mode::Iptables) => {
                crate::check::readiness::predict(
                    &inputs,
                    services,
                    None,
                    probe_contract::check::Mode::Nftables,
                )
                .summary()
            }
            _ => String::new(),
        },
        risks,
    }
}

/// The status at `now` (Unix seconds) from everything the agent knows (pure).
pub fn build(
    facts: &NodeFacts,
    caps: &Capabilities,
    check: &CheckState,
    loops: &Loops,
    now: i64,
) -> ReportStatus {
    let active_loops = loops.active();
    ReportStatus {
        node: facts.node.clone(),
        agent_version: facts.agent_version.clone(),
        kernel: facts.kernel.clone(),
        kube_proxy_mode: if check.mode.is_empty() {
            "unknown".into()
        } else {
            check.mode.clone()
        },
        dataplane: check.dataplane.clone(),
        nftables_readiness: check.nftables_readiness.clone(),
        capabilities: Capability::ALL
            .iter()
            .filter(|c| !caps.get(**c))
            .map(|c| CapabilityStatus {
                name: c.name().into(),
                available: false,
                cannot_confirm: c.lost().into(),
            })
            .collect(),
        risk_count: u32::try_from(check.risks.len()).unwrap_or(u32::MAX),
        risks: check.risks.clone(),
        active_loop_count: u32::try_from(active_loops.len()).unwrap_or(u32::MAX),
        active_loops,
        resolved_loops: loops.resolved(),
        last_update: rfc3339(now),
    }
}

/// What counts as a change worth a write: everything but the time of the update and an
/// active loop's `count` and `lastSeen` (they move with every repeat: a looping node would
/// write at the rate limit for as long as it loops). Those are refreshed by the next change
/// or the [`super::api::HEARTBEAT`], well inside the 10 min active window.
pub fn change_key(status: &ReportStatus) -> ReportStatus {
    let mut key = status.clone();
    key.last_update.clear();
    for l in &mut key.active_loops {
        l.count = 0;
        l.last_seen.clear();
    }
    // The order of active loops follows lastSeen: sorted so a reorder is not a change.
    key.active_loops
        .sort_by(|a, b| (&a.kind, &a.vip, &a.service).cmp(&(&b.kind, &b.vip, &b.service)));
    key
}
