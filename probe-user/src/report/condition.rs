//! `--node-condition on`: the Node condition `LoadBalancerLoopback`, as node-problem-detector
//! sets its conditions (a strategic merge patch of `nodes/NAME/status`, merged by `type`, so
//! the kubelet's own conditions are untouched); `kubectl describe node` shows it.
//!
//! True while the node report has an active loop or a risk; reason = the kind (CamelCase, an
//! active loop's before a risk's); message = the Service and the first fix. False otherwise,
//! reason `NoLoopback`. Pure: [`condition`]; the writer patches it after the report, behind
//! the same rate limit, only when it changed (or on the report's heartbeat).

use serde::Serialize;

use super::status::ReportStatus;

pub const TYPE: &str = "LoadBalancerLoopback";

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Condition {
    /// `True` / `False`.
    pub status: &'static str,
    pub reason: String,
    pub message: String,
}

/// `healthcheck_blackhole` -> `HealthcheckBlackhole`.
fn camel(kind: &str) -> String {
    kind.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The condition the report implies.
pub fn condition(status: &ReportStatus) -> Condition {
    let first = status
        .active_loops
        .first()
        .map(|l| {
            (
                "active loop",
                &l.kind,
                &l.service,
                l.vip.as_str(),
                &l.first_fix,
            )
        })
        .or_else(|| {
            status.risks.first().map(|r| {
                (
                    "risk",
                    &r.kind,
                    &r.service,
                    r.subject.as_str(),
                    &r.first_fix,
                )
            })
        });
    let Some((what, kind, service, address, fix)) = first else {
        return Condition {
            status: "False",
            reason: "NoLoopback".into(),
            message: "no active load-balancer loopback and no risk on this node".into(),
        };
    };
    let mut message = format!(
        "{what} {kind} on Service {} ({address})",
        service.as_deref().unwrap_or("unknown")
    );
    if let Some(fix) = fix {
        message.push_str(&format!("; first fix: {fix}"));
    }
    let more = status.active_loops.len() + status.risks.len() - 1;
    if more > 0 {
        message.push_str(&format!(
            "; {more} more (kubectl get loopbackreport {})",
            status.node
        ));
    }
    Condition {
        status: "True",
        reason: camel(kind),
        message,
    }
}

/// The strategic merge patch of `nodes/NAME/status` (merged by `type`, as the API does).
pub fn patch(c: &Condition, heartbeat: &str, transition: &str) -> serde_json::Value {
    serde_json::json!({"status": {"conditions": [{
        "type": TYPE,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": transition,
    }]}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::status::{ActiveLoop, RiskStatus};

    #[test]
    fn true_with_a_loop_or_a_risk_reason_the_kind_message_the_service_and_fix() {
        let clean = ReportStatus {
            node: "node-a".into(),
            ..Default::default()
        };
        assert_eq!(condition(&clean).status, "False");
        assert_eq!(condition(&clean).reason, "NoLoopback");
        let risky = ReportStatus {
            risks: vec![RiskStatus {
                kind: "healthcheck_blackhole".into(),
                subject: "203.0.113.10".into(),
                service: Some("shop/web".into()),
                first_fix: Some("etp-cluster: set externalTrafficPolicy: Cluster".into()),
                ..Default::default()
            }],
            ..clean.clone()
        };
        let c = condition(&risky);
        assert_eq!(
            (c.status, c.reason.as_str()),
            ("True", "HealthcheckBlackhole")
        );
        assert_eq!(
            c.message,
            "risk healthcheck_blackhole on Service shop/web (203.0.113.10); first fix: \
             etp-cluster: set externalTrafficPolicy: Cluster"
        );
        let looping = ReportStatus {
            active_loops: vec![ActiveLoop {
                kind: "hairpin".into(),
                service: Some("shop/api".into()),
                vip: "203.0.113.11:443".into(),
                ..Default::default()
            }],
            ..risky
        };
        let c = condition(&looping);
        assert_eq!(c.reason, "Hairpin", "an active loop comes before a risk");
        assert!(
            c.message
                .starts_with("active loop hairpin on Service shop/api")
        );
        assert!(
            c.message
                .ends_with("1 more (kubectl get loopbackreport node-a)")
        );
    }
}
