//! Verify on demand, `fix --apply --verify` and the canary (#40), end to end: the real agent
//! in the lab's node answering `LoopbackVerification` requests through the fake API (the
//! only fake: the connections, the LB's DNAT and the kernel's drops are real), and the real
//! kubectl plugin creating them from the node's namespace (where the fake API listens).
//!
//! The loop no client trips: Service `default/edge` (an LB IP `ipMode: Proxy`, so kube-proxy
//! does not short-circuit it) on the lab LB's listener 8081, which has no source-node guard:
//! a connection from the node comes back to the node with its own IP as source and is dropped
//! (the lab's `hairpin-node-sourced`). The remedy, in the lab: the LB's guard on 8081 (as on
//! 80), after which the LB sends the node's call to the peer, which answers.
//!
//! Root only (each lab test prints a skip line otherwise); the plugin-only errors need no
//! root. One at a time: they share the lab.

use std::{process::Command, time::Duration};

use clb_probe_client::plugin::verify::Verification;
use probe_contract::{
    LoopbackKind,
    verify::{Phase, VerifyOutcome},
};
use probe_tests::{
    agent::{lines, require_root, wait_for},
    kube_fixture::{KubeFixture, Listen, NODE_NAME, plugin_in_node},
};
use serde_json::{Value, json};
use test_support::kubeapi::fixtures;
use test_support::lab::{self, LabGuard, Scenario, Variants};

const WAIT: Duration = Duration::from_secs(20);
const METRICS: &str = "127.0.0.1:19467";
const EDGE_TARGET: &str = "203.0.113.10:8081/tcp";

/// `default/edge`: the LB IP on the listener without the source-node guard, and a UDP port.
fn edge_service(etp: &str, ip_mode: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": "edge"},
        "spec": {
            "type": "LoadBalancer", "externalTrafficPolicy": etp,
            "clusterIP": "198.18.100.20", "clusterIPs": ["198.18.100.20"],
            "selector": {"app": "web"},
            "ports": [
                {"name": "no-guard", "port": lab::VIP_NO_GUARD_PORT, "protocol": "TCP",
                 "targetPort": 8080, "nodePort": 30081},
                {"name": "dns", "port": lab::VIP_UDP_PORT, "protocol": "UDP",
                 "targetPort": 5353, "nodePort": 30054},
            ],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": lab::VIP.to_string(), "ipMode": ip_mode}]}},
    })
}

/// The lab as the node-sourced hairpin needs it: the VIP not bound on the node (bound, the
/// node's call to 8081 never leaves it: refused, `vip_port_unserved`).
fn unbound() -> Variants {
    Scenario::HairpinNodeSourced.spec().variants
}

/// The remedy on the LB's side: listener 8081 gets the guard listener 80 has (never back to
/// the node the request came from; the peer node serves it instead).
fn guard_listener_8081() {
    let status = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab::NS_LB,
            "iptables",
            "-t",
            "nat",
            "-I",
            "CLB-LB-VIP",
        ])
        .args([
            "-s",
            &lab::NODE_IP.to_string(),
            "-p",
            "tcp",
            "--dport",
            "8081",
        ])
        .args([
            "-m",
            "comment",
            "--comment",
            "listener 8081: never back to the source node",
        ])
        .args(["-j", "DNAT", "--to-destination", "198.18.1.2:30080"])
        .status()
        .expect("iptables in the LB");
    assert!(status.success(), "guarding listener 8081");
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn verify_json(api: &KubeFixture) -> (Option<i32>, Verification, String) {
    let out = plugin_in_node(
        api,
        &[
            "verify", "-n", "default", "edge", "--node", NODE_NAME, "-o", "json",
        ],
    );
    let stderr = text(&out.stderr);
    let v: Verification = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not a verification ({e}): {}\n{stderr}", text(&out.stdout)));
    (out.status.code(), v, stderr)
}

fn outcome_of(v: &Verification, kind: LoopbackKind, target: &str) -> VerifyOutcome {
    let node = &v.nodes[NODE_NAME];
    node.results
        .iter()
        .find(|r| r.kind == kind.as_str() && r.target == target)
        .unwrap_or_else(|| panic!("no {} at {target}: {node:#?}", kind.as_str()))
        .outcome
}

fn metric(line_prefix: &str) -> Option<u64> {
    let (_, body) = lab::http_get_in(lab::NS_NODE, METRICS, "/metrics")?;
    body.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn verify_confirms_a_loop_no_client_trips_and_is_clean_once_the_lb_guards_it() {
    if !require_root("verify_confirms") {
        return;
    }
    let lab = LabGuard::up(&unbound()).expect("lab up");
    let api = KubeFixture::builder()
        .object(edge_service("Cluster", "Proxy"))
        .start();
    let mut agent = api.start_agent(&["--metrics-addr", METRICS, "--kube-events", "off"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);

    // Nothing calls the LB: the agent's own test trips the loop.
    let (code, v, stderr) = verify_json(&api);
    assert_eq!(code, Some(3), "a confirmed loop exits 3: {v:#?}\n{stderr}");
    let node = &v.nodes[NODE_NAME];
    assert_eq!(node.phase, Phase::Done, "{node:#?}");
    assert!(v.missing.is_empty());
    let hairpin = node
        .results
        .iter()
        .find(|r| r.kind == "hairpin" && r.target == EDGE_TARGET)
        .expect("a hairpin result");
    assert_eq!(hairpin.outcome, VerifyOutcome::Confirmed, "{node:#?}");
    assert!(
        hairpin.evidence[0].starts_with("hairpin/l4/198.18.0.2->203.0.113.10:8081->"),
        "the confirmation's key: {hairpin:#?}"
    );
    // What a node cannot test says why.
    let udp = node
        .results
        .iter()
        .find(|r| r.target.ends_with(":53/udp"))
        .expect("the UDP port's result");
    assert_eq!(udp.outcome, VerifyOutcome::NotTestable);
    assert!(udp.reason.contains("TCP"), "{udp:#?}");
    let checks = node
        .results
        .iter()
        .find(|r| r.kind == "healthcheck_blackhole")
        .expect("the health checks' result");
    assert_eq!(checks.outcome, VerifyOutcome::NotTestable);
    assert!(checks.reason.contains("health checks"), "{checks:#?}");
    // The agent's own confirmation went through the correlator like any other.
    let confirmed = agent.wait_event("hairpin", WAIT, |es| {
        es.iter()
            .find(|e| e.kind == LoopbackKind::Hairpin && e.vip_port == Some(lab::VIP_NO_GUARD_PORT))
            .cloned()
    });
    assert_eq!(
        confirmed.src,
        std::net::IpAddr::V4(lab::NODE_IP),
        "{}",
        lines(&confirmed.evidence)
    );
    assert!(
        !confirmed.facts.canary,
        "a verify request is not the canary"
    );
    // The request is deleted when the plugin is done.
    assert!(api.objects("loopbackverifications").is_empty());

    // The remedy: the LB guards 8081. The same test is now clean, with what it tried.
    guard_listener_8081();
    let (code, v, stderr) = verify_json(&api);
    assert_eq!(code, Some(0), "nothing confirmed exits 0: {v:#?}\n{stderr}");
    assert_eq!(
        outcome_of(&v, LoopbackKind::Hairpin, EDGE_TARGET),
        VerifyOutcome::Clean
    );
    let clean = v.nodes[NODE_NAME]
        .results
        .iter()
        .find(|r| r.kind == "hairpin")
        .unwrap();
    assert!(
        clean
            .tried
            .starts_with("3 TCP connections from the node: 3 connected"),
        "{clean:#?}"
    );
    // The table says the same.
    let out = plugin_in_node(
        &api,
        &["verify", "-n", "default", "edge", "--node", NODE_NAME],
    );
    let table = text(&out.stdout);
    assert!(out.status.success(), "{table}\n{}", text(&out.stderr));
    assert!(
        table.contains(&format!("{EDGE_TARGET}  clean: hairpin,")),
        "{table}"
    );
    assert!(table.contains("not testable: *:"), "{table}");
    assert_eq!(
        metric("clbprobe_verify_requests_total{phase=\"done\"}"),
        Some(3)
    );
    assert!(agent.stop().success());
    drop(lab);
}

#[test]
fn fix_apply_verify_says_resolved_without_waiting_for_resolve_after() {
    if !require_root("verify_fix") {
        return;
    }
    let lab = LabGuard::up(&unbound()).expect("lab up");
    // The node's agent confirmed a hairpin on edge earlier: its Warning Event.
    let api = KubeFixture::builder()
        // ipMode VIP: etp-cluster is offered only where kube-proxy programs the LB IP.
        .object(edge_service("Local", "VIP"))
        .object(json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "clb-probe.clb-node.hairpin.1", "namespace": "default"},
            "eventTime": "2026-11-23T01:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-11-23T01:10:00.000000Z"},
            "type": "Warning", "action": "Detected", "reason": "LoopbackHairpin",
            "reportingController": "clb-probe", "reportingInstance": NODE_NAME,
            "note": "cause. Remedy: fix",
            "regarding": {"apiVersion": "v1", "kind": "Service", "namespace": "default", "name": "edge"},
        }))
        .start();
    // An hour: "resolved" below can only come from verify.
    let mut agent = api.start_agent(&["--kube-events", "off", "--resolve-after", "3600"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);

    // The test stands in for what the fix changes in the datapath: once the Service carries
    // the fix, the LB's listener is guarded (as the controller would reconfigure it). It
    // polls every 20 ms; the plugin creates its request only after the patch, and the agent
    // takes it only after the watch delivers it and its "running" write is answered.
    let fixed = std::thread::scope(|s| {
        let guard = s.spawn(|| {
            let deadline = std::time::Instant::now() + WAIT;
            while api.stored_etp("edge") != "Cluster" {
                if std::time::Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            guard_listener_8081();
            true
        });
        let out = plugin_in_node(
            &api,
            &[
                "fix",
                "-n",
                "default",
                "edge",
                "--apply",
                "etp-cluster",
                "--verify",
                "--yes",
            ],
        );
        assert!(
            guard.join().unwrap(),
            "the fix never reached the Service:\n{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        out
    });
    let stdout = text(&fixed.stdout);
    assert_eq!(
        fixed.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&fixed.stderr)
    );
    assert!(stdout.contains("applied etp-cluster"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "resolved: verify is clean on every node that had the loop ({NODE_NAME})"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{EDGE_TARGET}  clean: hairpin")),
        "{stdout}"
    );
    assert_eq!(
        agent.count_log("loop resolved"),
        0,
        "not the agent's own resolution"
    );
    assert!(agent.stop().success());
    drop(lab);
}

#[test]
fn the_canary_confirms_a_loop_no_user_trips_and_labels_it() {
    if !require_root("verify_canary") {
        return;
    }
    let lab = LabGuard::up(&unbound()).expect("lab up");
    let api = KubeFixture::builder()
        .object(edge_service("Cluster", "Proxy"))
        .start();
    let mut agent = api.start_agent(&[
        "--metrics-addr",
        METRICS,
        "--kube-events",
        "off",
        "--canary-every",
        "10s",
    ]);
    agent.wait_log("canary on", WAIT);
    let canary = agent.wait_event("the canary's hairpin", Duration::from_secs(40), |es| {
        es.iter()
            .find(|e| e.kind == LoopbackKind::Hairpin && e.facts.canary)
            .cloned()
    });
    assert_eq!(canary.vip_port, Some(lab::VIP_NO_GUARD_PORT), "{canary:#?}");
    let confirmed = wait_for("the canary's confirmed count", WAIT, || {
        metric("clbprobe_canary_tests_total{outcome=\"confirmed\"}").filter(|n| *n >= 1)
    });
    assert!(confirmed.is_some(), "no confirmed canary test counted");
    // The guarded listener 80 of web is tested in the same round and is clean.
    assert!(metric("clbprobe_canary_tests_total{outcome=\"clean\"}").is_some_and(|n| n >= 1));
    // Its loops are not users' traffic.
    assert_eq!(
        metric("clbprobe_loopback_events_total{kind=\"hairpin\""),
        None,
        "the canary's hairpin counted as users' loops"
    );
    assert!(agent.stop().success());
    drop(lab);
}

/// The plugin's errors, no lab: RBAC forbids the request, the Service does not exist, a node
/// that does not answer, no node to ask.
#[test]
fn verify_errors_are_one_clear_line_and_exit_1() {
    let api = KubeFixture::builder()
        .objects(fixtures::lab())
        .listen(Listen::Host)
        .tag("verify-errors")
        .start();
    let words = |w: &str| api.run(&w.split_whitespace().collect::<Vec<_>>());
    api.forbid("loopbackverifications", "create");
    let out = words("verify -n default web --node clb-node");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("forbidden: cannot create loopbackverifications.clb-probe.io"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    api.allow_all();

    let out = words("verify -n default nope --node clb-node");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("get services nope in namespace default"));

    let out = words("verify -n default web --node ghost --timeout 1");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no answer from node ghost within 1 s"),
        "{stderr}"
    );
    assert!(
        api.objects("loopbackverifications").is_empty(),
        "the unanswered request is deleted"
    );

    let out = words("verify -n default web");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--node NODE"),
        "{}",
        text(&out.stderr)
    );
}
