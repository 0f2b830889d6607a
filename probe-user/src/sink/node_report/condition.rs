//! `--node-condition on`: the Node condition `LoadBalancerLoopback`, as node-problem-detector
//! sets its conditions (a strategic merge patch of `nodes/NAME/status`, merged by `type`, so
//! the kubelet's own conditions are untouched); `kubectl describe node` shows it.
//!
//! True while the node report has an active loop or a risk; reason = the kind (CamelCase, an
//! active loop's before a risk's); message = the Service and the first fix. False otherwise,
//! reason `NoLoopback`. Pure: [`condition`]; the writer patches it after the report, behind
//! the same rate limit, only when it changed (or on the report's heartbeat).

use probe_contract::{
    condition::{Condition, ConditionStatus, NO_LOOPBACK, NodeCondition, reason_of_kind},
    report::ReportStatus,
};

/// The message's bound (bytes), as an Event's note: the Service and the first fix fit.
const MESSAGE_MAX: usize = 1024;

/// The condition the report implies.
pub fn condition(status: &ReportStatus) -> Condition {
    // The most severe real loop: the loops come most severe first, a flood's entry after
    // every single loop (`super::loops`); a flood is named only when nothing else is active.
    let first = status
        .active_loops
        .iter()
        .find(|l| l.flood.is_none())
        .or(status.active_loops.first())
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
            status: ConditionStatus::False,
            reason: NO_LOOPBACK.into(),
            message: "no active load-balancer loopback and no risk on this node".into(),
        };
    };
    let mut message = format!(
        "{what} {kind} on Service {} ({address})",
        service.as_deref().unwrap_or("unknown")
    );
    if let Some(fix) = fix {
        // A fix written as a sentence ends in a full stop; the message goes on after it.
        message.push_str(&format!("; first fix: {}", fix.trim_end_matches('.')));
    }
    let more = status.active_loops.len() + status.risks.len() - 1;
    if more > 0 {
        message.push_str(&format!(
            "; {more} more (kubectl get loopbackreport {})",
            status.node
        ));
    }
    Condition {
        status: ConditionStatus::True,
        reason: reason_of_kind(kind),
        // `kubectl describe node` prints it raw: escaped and bounded as a second fence (the
        // names in it were escaped where they entered, `probe_core::untrusted`).
        message: probe_core::untrusted::text(&message, MESSAGE_MAX),
    }
}

/// The strategic merge patch of `nodes/NAME/status` (merged by `type`, as the API does).
pub fn patch(c: &Condition, heartbeat: &str, transition: &str) -> serde_json::Value {
    serde_json::json!({"status": {"conditions": [NodeCondition::new(c, heartbeat, transition)]}})
}

#[cfg(test)]
mod tests {
    use probe_contract::report::{ActiveLoop, RiskStatus};

    use super::*;

    #[test]
    fn true_with_a_loop_or_a_risk_reason_the_kind_message_the_service_and_fix() {
        let clean = ReportStatus {
            node: "node-a".into(),
            ..Default::default()
        };
        assert_eq!(condition(&clean).status, ConditionStatus::False);
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
            (ConditionStatus::True, "HealthcheckBlackhole")
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
        let mut sentence = looping.clone();
        sentence.active_loops[0].first_fix = Some("Call it by its ClusterIP.".into());
        assert!(
            condition(&sentence)
                .message
                .contains("first fix: Call it by its ClusterIP; 1 more"),
            "{}",
            condition(&sentence).message
        );
        assert!(
            c.message
                .starts_with("active loop hairpin on Service shop/api")
        );
        assert!(
            c.message
                .ends_with("1 more (kubectl get loopbackreport node-a)")
        );
    }

    /// E8: a first fix naming a host process that clears the screen, and one far too long:
    /// the message carries them escaped and bounded.
    #[test]
    fn the_message_is_escaped_and_bounded() {
        let status = |fix: String| ReportStatus {
            node: "node-a".into(),
            active_loops: vec![ActiveLoop {
                kind: "hairpin".into(),
                vip: "203.0.113.10:6443".into(),
                first_fix: Some(fix),
                ..Default::default()
            }],
            ..Default::default()
        };
        let c = condition(&status("Reach host process \x1b[2J ALL CLEAR\x07".into()));
        assert!(!c.message.chars().any(char::is_control), "{}", c.message);
        assert!(
            c.message.contains("\\x1b[2J ALL CLEAR\\x07"),
            "{}",
            c.message
        );
        let c = condition(&status("x".repeat(100_000)));
        assert!(c.message.len() <= MESSAGE_MAX, "{}", c.message.len());
        assert!(probe_core::untrusted::is_cut(&c.message));
    }
}
