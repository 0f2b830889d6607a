use std::net::IpAddr;

use clb_probe_client::service::ServiceFacts;
use probe_contract::{LoopbackEvent, LoopbackKind, Outcome, Proto, verify::VerifyOutcome};

use super::*;

const VIP: &str = "203.0.113.10";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn service(ports: serde_json::Value, ingress: serde_json::Value) -> ServiceFacts {
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {"type": "LoadBalancer", "ports": ports},
        "status": {"loadBalancer": {"ingress": ingress}},
    }))
    .unwrap();
    ServiceFacts::from_service(&svc).unwrap()
}

fn target(port: u16) -> Target {
    Target {
        ip: ip(VIP),
        port,
        proto: Proto::Tcp,
    }
}

fn confirmation(kind: LoopbackKind, port: u16) -> LoopbackEvent {
    LoopbackEvent {
        key: format!("{}/{VIP}:{port}/tcp", kind.as_str()),
        vip: Some(ip(VIP)),
        vip_port: Some(port),
        drop_reason: Some("IP_LOCAL_SOURCE".into()),
        evidence: vec!["ingress eth0 198.18.0.2:40000 -> 198.18.0.2:30080".into()],
        ..LoopbackEvent::between(
            kind,
            (ip("198.18.0.2"), 40000),
            (ip("198.18.0.2"), 30080),
            Proto::Tcp,
            Outcome::Dropped,
        )
    }
}

#[test]
fn targets_are_the_lb_ips_times_the_tcp_ports_and_udp_is_not_testable() {
    let svc = service(
        serde_json::json!([
            {"port": 80, "protocol": "TCP"},
            {"port": 53, "protocol": "UDP"},
        ]),
        serde_json::json!([{"ip": VIP}, {"ip": "203.0.113.11"}]),
    );
    let (tests, untestable) = targets(&svc);
    assert_eq!(
        tests.iter().map(Target::text).collect::<Vec<_>>(),
        ["203.0.113.10:80/tcp", "203.0.113.11:80/tcp"]
    );
    assert_eq!(untestable.len(), 2, "{untestable:#?}");
    assert!(
        untestable
            .iter()
            .all(|r| r.outcome == VerifyOutcome::NotTestable
                && r.target.ends_with(":53/udp")
                && r.reason.contains("TCP"))
    );
}

#[test]
fn a_service_without_an_lb_ip_is_not_testable_with_the_reason() {
    let svc = service(
        serde_json::json!([{"port": 80, "protocol": "TCP"}]),
        serde_json::json!([{"hostname": "lb.example.com"}]),
    );
    let (tests, untestable) = targets(&svc);
    assert!(tests.is_empty());
    assert!(untestable[0].reason.contains("hostname"), "{untestable:#?}");
    let (tests, untestable) = targets(&service(
        serde_json::json!([{"port": 80, "protocol": "TCP"}]),
        serde_json::json!([]),
    ));
    assert!(tests.is_empty());
    assert!(untestable[0].reason.contains("no LB ingress IP"));
}

#[test]
fn targets_over_the_limit_are_named_not_dropped() {
    let ports: Vec<_> = (1..=10)
        .map(|p| serde_json::json!({"port": 8000 + p, "protocol": "TCP"}))
        .collect();
    let (tests, untestable) = targets(&service(
        serde_json::Value::Array(ports),
        serde_json::json!([{"ip": VIP}]),
    ));
    assert_eq!(tests.len(), probe_contract::verify::MAX_TARGETS);
    assert_eq!(untestable.len(), 10 - probe_contract::verify::MAX_TARGETS);
    assert!(untestable[0].reason.contains("over the limit"));
}

#[test]
fn a_confirmation_at_the_target_makes_its_kind_confirmed_with_its_evidence() {
    let found = vec![
        confirmation(LoopbackKind::Hairpin, 8081),
        // Another port's loop is not this target's.
        confirmation(LoopbackKind::VipPortUnserved, 443),
    ];
    let results = decide(
        &target(8081),
        &kinds(&[]).unwrap(),
        &[Attempt::TimedOut, Attempt::TimedOut],
        &found,
    );
    let by_kind = |k: LoopbackKind| results.iter().find(|r| r.kind == k.as_str()).unwrap();
    let hairpin = by_kind(LoopbackKind::Hairpin);
    assert_eq!(hairpin.outcome, VerifyOutcome::Confirmed);
    assert!(hairpin.evidence[0].starts_with("hairpin/"), "{hairpin:#?}");
    assert!(hairpin.evidence[0].contains("IP_LOCAL_SOURCE"));
    assert!(
        hairpin
            .evidence
            .iter()
            .any(|l| l.starts_with("ingress eth0"))
    );
    let unserved = by_kind(LoopbackKind::VipPortUnserved);
    assert_eq!(unserved.outcome, VerifyOutcome::Clean);
    assert_eq!(
        unserved.tried,
        "2 TCP connections from the node: 2 timed out after 1.5 s"
    );
    // Health checks are decided per IP, apart.
    assert!(
        !results
            .iter()
            .any(|r| r.kind == LoopbackKind::HealthcheckBlackhole.as_str())
    );
    assert_eq!(worst(&results), Some(VerifyOutcome::Confirmed));
}

#[test]
fn nothing_confirmed_is_clean_with_what_was_tried_and_self_loops_are_not_testable() {
    let results = decide(
        &target(80),
        &[LoopbackKind::VipPortUnserved, LoopbackKind::ServiceSelfLoop],
        &[
            Attempt::Connected(3),
            Attempt::Connected(12),
            Attempt::Refused,
        ],
        &[],
    );
    assert_eq!(results[0].outcome, VerifyOutcome::Clean);
    assert_eq!(
        results[0].tried,
        "3 TCP connections from the node: 2 connected (<= 12 ms), 1 refused"
    );
    assert_eq!(results[1].outcome, VerifyOutcome::NotTestable);
    assert!(results[1].reason.contains("from a pod"), "{results:#?}");
    assert_eq!(worst(&results), Some(VerifyOutcome::Clean));
    // No connection at all (the agent could not open one): nothing is called clean.
    let none = decide(&target(80), &[LoopbackKind::Hairpin], &[], &[]);
    assert_eq!(none[0].outcome, VerifyOutcome::NotTestable);
}

#[test]
fn health_checks_are_confirmed_only_by_a_dropped_check_from_that_ip() {
    let waited = std::time::Duration::from_secs(7);
    let mut check = confirmation(LoopbackKind::HealthcheckBlackhole, 0);
    check.vip_port = None;
    let r = decide_healthcheck(ip(VIP), waited, std::slice::from_ref(&check));
    assert_eq!(r.outcome, VerifyOutcome::Confirmed);
    let r = decide_healthcheck(ip("203.0.113.11"), waited, &[check]);
    assert_eq!(r.outcome, VerifyOutcome::NotTestable);
    assert!(r.reason.contains("7 s"), "{r:#?}");
}

#[test]
fn requested_kinds_are_read_and_an_unknown_one_is_an_error() {
    assert_eq!(
        kinds(&["hairpin".into()]).unwrap(),
        vec![LoopbackKind::Hairpin]
    );
    assert!(
        kinds(&["loop".into()])
            .unwrap_err()
            .contains("unknown kind")
    );
    assert!(!kinds(&[]).unwrap().contains(&LoopbackKind::ServiceSelfLoop));
}

#[test]
fn a_request_is_for_the_named_nodes_or_with_none_named_for_those_with_a_loop() {
    assert!(is_for(&["a".into()], "a", false));
    assert!(!is_for(&["b".into()], "a", true));
    assert!(is_for(&[], "a", true));
    assert!(!is_for(&[], "a", false));
}
