use std::net::IpAddr;

use probe_contract::{
    LoopbackEvent, LoopbackKind, Outcome, Proto,
    verify::{VerifyOutcome, VerifyResult},
};

use super::*;
use crate::service::ServiceFacts;

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
        &node_test(8081, &kinds(&[]).unwrap()),
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
    // Timed out and nothing confirmed: silence is no verdict (issue #49).
    let unserved = by_kind(LoopbackKind::VipPortUnserved);
    assert_eq!(unserved.outcome, VerifyOutcome::NotProven);
    assert_eq!(
        unserved.tried,
        "2 TCP connections from the node: 2 timed out after 1.5 s"
    );
    assert_eq!(unserved.source, "node");
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
        &node_test(
            80,
            &[LoopbackKind::VipPortUnserved, LoopbackKind::ServiceSelfLoop],
        ),
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
    let none = decide(&node_test(80, &[LoopbackKind::Hairpin]), &[], &[]);
    assert_eq!(none[0].outcome, VerifyOutcome::NotTestable);
    // One answered, one timed out, nothing confirmed: not proven either.
    let mixed = decide(
        &node_test(80, &[LoopbackKind::Hairpin]),
        &[Attempt::Connected(2), Attempt::TimedOut],
        &[],
    );
    assert_eq!(mixed[0].outcome, VerifyOutcome::NotProven);
    assert_eq!(worst(&mixed), Some(VerifyOutcome::NotProven));
}

fn node_test(port: u16, kinds: &[LoopbackKind]) -> Test {
    Test {
        client: Client::Node,
        target: target(port),
        kinds: kinds.to_vec(),
        looped: Vec::new(),
    }
}

const POD_A: &str = "198.19.1.10";

/// A pod's hairpin through the LB, as the correlator confirms it.
fn pod_hairpin(port: u16) -> LoopbackEvent {
    let mut e = LoopbackEvent {
        key: format!("hairpin/l4/{POD_A}->{VIP}:{port}"),
        vip: Some(ip(VIP)),
        vip_port: Some(port),
        service: Some("default/web".into()),
        client_pod: Some("default/pod-a".into()),
        ..LoopbackEvent::between(
            LoopbackKind::Hairpin,
            (ip(POD_A), 40000),
            (ip("198.18.0.2"), 30080),
            Proto::Tcp,
            Outcome::Dropped,
        )
    };
    e.facts.source = probe_contract::facts::SourceKind::Pod;
    e
}

/// Issue #49: a pod's loop is tested from that pod at the LB IP:port it looped through; the
/// node's own test of the same target says nothing of it, and the node's loops stay the
/// node's.
#[test]
fn a_pods_loop_is_planned_from_the_pod_at_its_own_target() {
    let svc = service(
        serde_json::json!([{"port": 80, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}]),
        serde_json::json!([{"ip": VIP}]),
    );
    let mut node_loop = confirmation(LoopbackKind::Hairpin, 8081);
    node_loop.service = Some("default/web".into());
    node_loop.facts.source = probe_contract::facts::SourceKind::Node;
    let other_service = LoopbackEvent {
        service: Some("default/other".into()),
        ..pod_hairpin(80)
    };
    // As attribution names it: the Service and its port's name.
    let named_port = LoopbackEvent {
        service: Some("default/web:http".into()),
        ..pod_hairpin(80)
    };
    let confirmed = [pod_hairpin(80), named_port, node_loop, other_service];
    let loops = loops_of(&confirmed, "default/web", &[]);
    assert_eq!(loops.len(), 2, "{loops:#?}");
    // A loop through the Service's LB IP:port that the event names by another Service (the
    // LB sent the call to that one's NodePort): the Service's all the same.
    let via_other = LoopbackEvent {
        service: Some("default/other".into()),
        ..pod_hairpin(80)
    };
    assert_eq!(
        loops_of([&via_other], "default/web", &[target(80)]).len(),
        1
    );
    assert!(loops_of([&via_other], "default/web", &[target(8081)]).is_empty());
    let (tests, untestable) = plan(targets(&svc), &kinds(&[]).unwrap(), true, &loops);
    assert!(untestable.is_empty(), "{untestable:#?}");
    // The node's two targets, then the pod's one.
    assert_eq!(tests.len(), 3, "{tests:#?}");
    assert_eq!(
        tests[1].looped,
        vec![LoopbackKind::Hairpin],
        "node at :8081"
    );
    assert!(tests[0].looped.is_empty(), "node at :80 never looped");
    let pod = &tests[2];
    assert_eq!(
        pod.client,
        Client::Pod {
            ip: ip(POD_A),
            name: Some("default/pod-a".into())
        }
    );
    assert_eq!(pod.target, target(80));
    assert_eq!(pod.kinds, vec![LoopbackKind::Hairpin]);

    // The node's call at :80 answered, the pod's timed out and the correlator confirmed the
    // pod's loop: the pod's result is confirmed, the node's clean, each saying its source.
    let seen = [pod_hairpin(80)];
    let from_node = decide(&tests[0], &vec![Attempt::Connected(2); 3], &seen);
    let hairpin = from_node.iter().find(|r| r.kind == "hairpin").unwrap();
    assert_eq!(hairpin.outcome, VerifyOutcome::Clean);
    assert!(!hairpin.looped);
    let from_pod = decide(pod, &[Attempt::TimedOut], &seen);
    assert_eq!(from_pod.len(), 1);
    assert_eq!(from_pod[0].outcome, VerifyOutcome::Confirmed);
    assert_eq!(from_pod[0].source, "pod default/pod-a (198.19.1.10)");
    assert!(from_pod[0].looped);
    // Answered from the pod, nothing confirmed: clean, and said to be from the pod.
    let clean = decide(pod, &vec![Attempt::Connected(3); 3], &[]);
    assert_eq!(clean[0].outcome, VerifyOutcome::Clean);
    assert!(
        clean[0].tried.contains("from pod default/pod-a"),
        "{clean:#?}"
    );
    // A pod whose namespace cannot be entered: not testable, marked as the loop.
    let no_ns = untestable_client(pod, "no network namespace on this node has 198.19.1.10");
    assert_eq!(no_ns[0].outcome, VerifyOutcome::NotTestable);
    assert!(no_ns[0].looped);

    // Asked for another kind only: the pod's hairpin is not planned.
    let (tests, _) = plan(
        targets(&svc),
        &[LoopbackKind::VipPortUnserved],
        false,
        &loops,
    );
    assert!(tests.iter().all(|t| t.client == Client::Node));
    // A loop at a port the Service no longer has is not testable, and says so.
    let gone = loops_of(&[pod_hairpin(9999)], "default/web", &[]);
    let (_, untestable) = plan(targets(&svc), &kinds(&[]).unwrap(), true, &gone);
    assert_eq!(untestable.len(), 1);
    assert!(untestable[0].looped && untestable[0].reason.contains("not one of the Service's"));
}

/// Hostile round 4: a request repeating a kind is one kind; too many names is refused before
/// any result is built; an answer is bounded.
#[test]
fn kinds_are_deduplicated_and_bounded_and_so_is_the_answer() {
    let repeated = vec![RequestedKind::from("hairpin"); probe_contract::verify::MAX_KINDS];
    assert_eq!(kinds(&repeated).unwrap(), vec![LoopbackKind::Hairpin]);
    let flood = vec![RequestedKind::from("hairpin"); 140_000];
    assert!(kinds(&flood).unwrap_err().to_string().contains("at most"));
    let many: Vec<_> = (0..1000)
        .map(|i| VerifyResult {
            kind: "hairpin".into(),
            target: format!("{i}"),
            outcome: VerifyOutcome::Clean,
            evidence: vec![],
            tried: String::new(),
            reason: String::new(),
            source: "node".into(),
            looped: false,
        })
        .collect();
    let (kept, note) = bounded(many);
    assert_eq!(kept.len(), probe_contract::verify::MAX_RESULTS);
    assert!(note.unwrap().contains("left out"));
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
            .to_string()
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

/// Hostile round 4: one tenant Service with 5,000 ports no longer puts every other Service
/// 1,250 rounds away; a Service with a risk comes first.
#[test]
fn canary_rounds_are_shared_per_service_risks_first() {
    let tenant: Vec<Target> = (0..5000).map(|p| target(10_000 + p)).collect();
    let services = vec![
        ("tenant/many".to_string(), tenant, false),
        ("shop/web".to_string(), vec![target(80)], false),
        ("shop/risky".to_string(), vec![target(8081)], true),
        ("shop/none".to_string(), vec![], false),
    ];
    let (mut cursor, mut next) = (0, std::collections::HashMap::new());
    let first = canary_round(&services, &mut cursor, &mut next, 2);
    assert_eq!(
        first,
        vec![target(8081), target(80)],
        "the risk first, then by name"
    );
    let second = canary_round(&services, &mut cursor, &mut next, 2);
    assert_eq!(second, vec![target(10_000), target(8081)]);
    // Every Service comes up every (3 / 2) rounds, whatever its ports.
    let mut seen_web = 0;
    for _ in 0..10 {
        seen_web += canary_round(&services, &mut cursor, &mut next, 2)
            .iter()
            .filter(|t| **t == target(80))
            .count();
    }
    assert!(seen_web >= 6, "web tested {seen_web} times in 10 rounds");
    // The tenant's targets advance in turn.
    assert!(next["tenant/many"] > 1);
}
