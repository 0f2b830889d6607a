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
    agent::{Agent, assert_contains, lines, wait_for},
    kube_fixture::{KubeFixture, Listen, NODE_NAME, plugin_in_node},
};
use serde_json::{Value, json};
use test_support::{
    kubeapi::fixtures,
    lab::{self, LabGuard, Scenario, Variant, Variants},
};

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
    node_calls_to_8081_at_the_lb(
        "nat",
        "CLB-LB-VIP",
        &[
            "-m",
            "comment",
            "--comment",
            "listener 8081: never back to the source node",
            "-j",
            "DNAT",
            "--to-destination",
            "198.18.1.2:30080",
        ],
        "guarding listener 8081",
    );
}

/// Inserts a rule into the LB's `table`/`chain` for TCP calls from the node's address to
/// listener 8081, ending in `action`; `what` names it when iptables fails.
fn node_calls_to_8081_at_the_lb(table: &str, chain: &str, action: &[&str], what: &str) {
    let status = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab::NS_LB,
            "iptables",
            "-t",
            table,
            "-I",
            chain,
        ])
        .args(["-s", &lab::NODE_IP.to_string()])
        .args(["-p", "tcp", "--dport", "8081"])
        .args(action)
        .status()
        .expect("iptables in the LB");
    assert!(status.success(), "{what}");
}

/// The plugin started by `command` (the binary, or `ip netns exec` of it) with this API's
/// kubeconfig and `args`, its output piped: for a test that acts while it waits.
fn spawn_plugin(mut command: Command, api: &KubeFixture, args: &[&str]) -> std::process::Child {
    command
        .args(["--kubeconfig", api.kubeconfig()])
        .args(args)
        .env_remove("KUBECONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl-clb_probe")
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

/// The lab with the LB IP unbound and the fake API with `default/edge` (externalTrafficPolicy
/// Cluster, ipMode Proxy), no agent yet. None where `test` cannot run (not root).
fn edge_lab(test: &str) -> Option<(LabGuard, KubeFixture)> {
    let lab = LabGuard::for_test(test, &unbound())?;
    let api = KubeFixture::builder()
        .object(edge_service("Cluster", "Proxy"))
        .start();
    Some((lab, api))
}

/// The lab with the LB IP unbound, the fake API with `default/edge` (externalTrafficPolicy
/// Cluster, ipMode Proxy), and the agent (metrics on, no Events) once it logs `ready`.
/// None where `test` cannot run (not root: it says it skips).
fn edge_lab_with_agent(test: &str, ready: &str) -> Option<(LabGuard, KubeFixture, Agent)> {
    let (lab, api) = edge_lab(test)?;
    let mut agent = api.start_agent(&["--metrics-addr", METRICS, "--kube-events", "off"]);
    agent.wait_log(ready, WAIT);
    Some((lab, api, agent))
}

#[test]
fn verify_confirms_a_loop_no_client_trips_and_is_clean_once_the_lb_guards_it() {
    let Some((lab, api, mut agent)) =
        edge_lab_with_agent("verify_confirms", "Kubernetes attribution connected")
    else {
        return;
    };

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
    assert!(clean.looped, "the node's loop, tested again: {clean:#?}");
    // The table says the same.
    let out = plugin_in_node(
        &api,
        &["verify", "-n", "default", "edge", "--node", NODE_NAME],
    );
    let table = text(&out.stdout);
    assert!(out.status.success(), "{table}\n{}", text(&out.stderr));
    assert_contains(
        &table,
        &format!("{EDGE_TARGET}  from node:\n    clean: hairpin (the loop),"),
    );
    assert_contains(&table, "not testable: *:");
    assert_eq!(
        metric("clbprobe_verify_requests_total{phase=\"done\"}"),
        Some(3)
    );
    assert!(agent.stop().success());
    drop(lab);
}

/// `default/edge` with ETP Local and ipMode VIP (etp-cluster is offered only where
/// kube-proxy programs the LB IP), and the node agent's Warning Event of an earlier hairpin
/// on it (what `fix` reads the confirmed kinds from).
fn edge_fix_fixture(tag: &str) -> KubeFixture {
    KubeFixture::builder()
        .tag(tag)
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
        .start()
}

/// `fix --apply etp-cluster --verify --yes` on `default/edge`; the patch must reach the Service.
fn fix_edge(api: &KubeFixture) -> std::process::Output {
    let out = plugin_in_node(
        api,
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
    assert_eq!(
        api.stored_etp("edge"),
        "Cluster",
        "the fix never reached the Service:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// The unbound lab, `default/edge` with the node agent's Event of an earlier hairpin, the
/// agent (events off, resolution an hour away: "resolved" can only come from verify), and
/// the node's loop on edge confirmed by a verify before any fix: what the agent must hold to
/// test the loop again after it. Bound as `(lab, api, agent)`, they drop in reverse: the agent,
/// the API, the lab. None where `test` cannot run (not root: it says it skips).
fn edge_with_its_loop(test: &str, tag: &str) -> Option<(LabGuard, KubeFixture, Agent)> {
    let lab = LabGuard::for_test(test, &unbound())?;
    let api = edge_fix_fixture(tag);
    let mut agent = api.start_agent(&["--kube-events", "off", "--resolve-after", "3600"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    confirm_the_node_loop_first(&api);
    Some((lab, api, agent))
}

/// The node's loop on edge, confirmed by the agent's own test (a verify before the fix): what
/// the agent must hold to test the loop again after it.
fn confirm_the_node_loop_first(api: &KubeFixture) {
    let (code, v, stderr) = verify_json(api);
    assert_eq!(code, Some(3), "the loop first: {v:#?}\n{stderr}");
    let hairpin = result_from(&v, "hairpin", EDGE_TARGET, "node");
    assert_eq!(hairpin.outcome, VerifyOutcome::Confirmed, "{hairpin:#?}");
}

fn result_from<'a>(
    v: &'a Verification,
    kind: &str,
    target: &str,
    source: &str,
) -> &'a probe_contract::verify::VerifyResult {
    let node = &v.nodes[NODE_NAME];
    node.results
        .iter()
        .find(|r| r.kind == kind && r.target == target && r.source == source)
        .unwrap_or_else(|| panic!("no {kind} at {target} from {source}: {node:#?}"))
}

#[test]
fn fix_apply_verify_says_resolved_without_waiting_for_resolve_after() {
    let Some((lab, api, mut agent)) = edge_with_its_loop("verify_fix", "verify-fix") else {
        return;
    };
    // What the fix changes in the datapath, in the lab: the LB's guard on 8081. Applied first:
    // the plugin's request follows its patch within milliseconds, and the agent's first test
    // connection then races any change made after the patch.
    guard_listener_8081();
    let fixed = fix_edge(&api);
    let stdout = text(&fixed.stdout);
    assert_eq!(
        fixed.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&fixed.stderr)
    );
    assert_contains(&stdout, "applied etp-cluster");
    assert_contains(
        &stdout,
        &format!(
            "resolved: every loop tested from its own client is clean on every node that had it ({NODE_NAME})"
        ),
    );
    assert_contains(
        &stdout,
        &format!("{EDGE_TARGET}  from node:\n    clean: hairpin (the loop)"),
    );
    assert_eq!(
        agent.count_log("loop resolved"),
        0,
        "not the agent's own resolution"
    );
    assert!(agent.stop().success());
    drop(lab);
}

/// Issue #49: an LB that drops every call from the node (an AWS NLB with client IP
/// preservation does so to a hairpinned connection) used to read "clean", and `fix --verify`
/// said "resolved". Silence is no verdict: `not proven`, exit 4, and no "resolved".
#[test]
fn an_lb_that_drops_the_nodes_calls_is_not_proven_and_fix_verify_does_not_resolve() {
    let Some((lab, api, mut agent)) = edge_with_its_loop("verify_silence", "verify-silence") else {
        return;
    };

    // The LB now drops the node's calls to 8081: no answer, nothing for the agent to confirm.
    drop_node_calls_at_the_lb();
    let (code, v, stderr) = verify_json(&api);
    assert_eq!(code, Some(4), "not proven exits 4: {v:#?}\n{stderr}");
    let hairpin = result_from(&v, "hairpin", EDGE_TARGET, "node");
    assert_eq!(hairpin.outcome, VerifyOutcome::NotProven, "{hairpin:#?}");
    assert!(hairpin.looped);
    assert!(hairpin.tried.contains("timed out"), "{hairpin:#?}");

    let fixed = fix_edge(&api);
    let stdout = text(&fixed.stdout);
    assert_eq!(
        fixed.status.code(),
        Some(4),
        "{stdout}\n{}",
        text(&fixed.stderr)
    );
    assert!(!stdout.contains("resolved: every"), "{stdout}");
    assert_contains(&stdout, "not proven resolved:");
    assert_contains(
        &stdout,
        &format!("node {NODE_NAME}: hairpin at {EDGE_TARGET} from node: not_proven"),
    );
    assert!(agent.stop().success());
    drop(lab);
}

/// The LB drops every TCP call from the node's address to listener 8081.
fn drop_node_calls_at_the_lb() {
    node_calls_to_8081_at_the_lb(
        "raw",
        "PREROUTING",
        &["-j", "DROP"],
        "dropping the node's calls at the LB",
    );
}

/// Issue #49: the commonest loop, a pod calling its own LB, read "clean" from the node (the
/// LB's guard sends the node's own call elsewhere). verify tests it from the pod, along the
/// path that looped: confirmed before any fix, still confirmed after a fix that changes
/// nothing (no "resolved"), clean once the path is fixed.
#[test]
fn a_pods_hairpin_is_tested_from_the_pod_and_a_fix_that_changes_nothing_is_not_resolved() {
    let Some(lab) = LabGuard::for_test("verify_pod", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder().tag("verify-pod").start();
    let mut agent = api.start_agent(&["--metrics-addr", METRICS]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    lab.traffic(Scenario::Hairpin).expect("pod A's call");
    agent.wait_event("pod A's hairpin", WAIT, |es| {
        es.iter()
            .find(|e| e.kind == LoopbackKind::Hairpin && e.client_pod.is_some())
            .cloned()
    });
    let web = format!("{}:80/tcp", lab::VIP);
    let pod = format!("pod default/{} ({})", fixtures::CLIENT_POD, lab::POD_A_IP);
    let verify_web = |api: &KubeFixture| {
        let out = plugin_in_node(
            api,
            &[
                "verify", "-n", "default", "web", "--node", NODE_NAME, "-o", "json",
            ],
        );
        let v: Verification = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "not a verification ({e}): {}\n{}",
                text(&out.stdout),
                text(&out.stderr)
            )
        });
        (out.status.code(), v)
    };
    let (code, v) = verify_web(&api);
    assert_eq!(code, Some(3), "{v:#?}");
    let from_pod = result_from(&v, "hairpin", &web, &pod);
    assert_eq!(from_pod.outcome, VerifyOutcome::Confirmed, "{from_pod:#?}");
    assert!(from_pod.looped);
    assert!(
        from_pod.evidence[0].starts_with(&format!("hairpin/l4/{}->", lab::POD_A_IP)),
        "the pod's own call looped: {from_pod:#?}"
    );
    // The same target from the node is answered: what verify used to report alone.
    let from_node = result_from(&v, "hairpin", &web, "node");
    assert_eq!(from_node.outcome, VerifyOutcome::Clean, "{from_node:#?}");
    assert!(!from_node.looped);

    // A fix that the lab's datapath does not act on (no controller re-registers targets).
    wait_for("the hairpin's Warning Event", WAIT, || {
        api.objects("events")
            .into_iter()
            .find(|e| e["reason"] == "LoopbackHairpin")
    })
    .expect("the agent wrote the hairpin's Event");
    let out = plugin_in_node(
        &api,
        &[
            "fix",
            "-n",
            "default",
            "web",
            "--provider",
            "aws",
            "--apply",
            "aws-nlb-target-type-ip",
            "--verify",
            "--yes",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("applied aws-nlb-target-type-ip"),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_contains(
        &stdout,
        &format!("still looping on node {NODE_NAME}: hairpin at {web}"),
    );
    assert!(!stdout.contains("resolved: every"), "{stdout}");

    // The fix that works, in the lab: pod egress masqueraded on the node, so the LB's guard
    // sends the pod's call elsewhere. Tested from the pod: clean, and said so.
    lab.set(Variant::Masquerade, true).expect("masquerade");
    let (code, v) = verify_web(&api);
    assert_eq!(code, Some(0), "{v:#?}");
    let from_pod = result_from(&v, "hairpin", &web, &pod);
    assert_eq!(from_pod.outcome, VerifyOutcome::Clean, "{from_pod:#?}");
    assert!(
        from_pod
            .tried
            .starts_with(&format!("3 TCP connections from {pod}: 3 connected")),
        "{from_pod:#?}"
    );
    assert!(agent.stop().success());
    drop(lab);
}

/// Issue #49: an agent told another node's name (E12) used to answer that node's requests,
/// and the real node's agent then skipped them as answered. It answers none.
#[test]
fn an_agent_with_another_nodes_name_does_not_answer_its_requests() {
    let Some(lab) = LabGuard::for_test("verify_wrong_node", &unbound()) else {
        return;
    };
    let mut peer = fixtures::parse(fixtures::NODE);
    peer["metadata"]["name"] = json!("clb-peer");
    peer["status"]["addresses"] = json!([
        {"type": "InternalIP", "address": lab::PEER_IP.to_string()},
        {"type": "Hostname", "address": "clb-peer"},
    ]);
    let api = KubeFixture::builder()
        .object(edge_service("Cluster", "Proxy"))
        .object(peer)
        .start();
    let mut agent = api.start_agent_as("clb-peer", &["--kube-events", "off"], &[]);
    agent.wait_log("it answers no verify request", WAIT);
    let out = plugin_in_node(
        &api,
        &[
            "verify",
            "-n",
            "default",
            "edge",
            "--node",
            "clb-peer",
            "--timeout",
            "8",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{stderr}",
        text(&out.stdout)
    );
    assert_contains(&stderr, "no answer from node clb-peer within 8 s");
    assert_eq!(agent.count_log("verify: testing"), 0);
    assert!(agent.stop().success());
    drop(lab);
}

#[test]
fn the_canary_confirms_a_loop_no_user_trips_and_labels_it() {
    let Some((lab, api)) = edge_lab("verify_canary") else {
        return;
    };
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

/// The fake API with the lab's objects, reachable from the host (the tests without a lab).
fn lab_objects_api_on_the_host(tag: &str) -> KubeFixture {
    KubeFixture::builder()
        .objects(fixtures::lab())
        .listen(Listen::Host)
        .tag(tag)
        .start()
}

/// The plugin's errors, no lab: RBAC forbids the request, the Service does not exist, a node
/// that does not answer, no node to ask.
#[test]
fn verify_errors_are_one_clear_line_and_exit_1() {
    let api = lab_objects_api_on_the_host("verify-errors");
    let words = |w: &str| api.run(&w.split_whitespace().collect::<Vec<_>>());
    api.forbid("loopbackverifications", "create");
    let out = words("verify -n default web --node clb-node");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_contains(
        &stderr,
        "forbidden: cannot create loopbackverifications.clb-probe.io",
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    api.allow_all();

    let out = words("verify -n default nope --node clb-node");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("get services nope in namespace default"));

    let out = words("verify -n default web --node ghost --timeout 1");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_contains(&stderr, "no answer from node ghost within 1 s");
    assert!(
        api.objects("loopbackverifications").is_empty(),
        "the unanswered request is deleted"
    );

    let out = words("verify -n default web");
    assert_eq!(out.status.code(), Some(1));
    assert_contains(&text(&out.stderr), "--node NODE");
}

/// Hostile round 4 (issue #49): one requester could keep every node connecting, a request
/// after another. A node tests at most `MAX_TESTS_PER_MINUTE` requests a minute and answers
/// the rest `refused` at once, counted; a request repeating a kind is refused before anything
/// is built.
#[test]
fn requests_past_a_requesters_or_the_nodes_rate_and_a_flood_of_kinds_are_refused_and_counted() {
    let Some((lab, api, mut agent)) =
        edge_lab_with_agent("verify_rate", "verify: answering requests as this node")
    else {
        return;
    };
    let request = |name: &str, kinds: Value, requester: &str| {
        api.apply(json!({
            "apiVersion": "clb-probe.io/v1alpha1", "kind": "LoopbackVerification",
            "metadata": {"name": name,
                         "labels": {probe_contract::verify::NODE_LABEL: NODE_NAME},
                         "annotations": {probe_contract::verify::REQUESTER_ANNOTATION: requester}},
            "spec": {"service": {"namespace": "default", "name": "nope"},
                     "nodes": [NODE_NAME], "kinds": kinds},
        }));
    };
    let answer = |name: &str| {
        api.objects("loopbackverifications")
            .iter()
            .find(|o| o["metadata"]["name"] == name)
            .filter(|o| o["status"]["nodes"][NODE_NAME]["phase"] == "refused")
            .and_then(|o| {
                o["status"]["nodes"][NODE_NAME]["message"]
                    .as_str()
                    .map(String::from)
            })
    };
    // 140,000 repeats of one kind (1.4 MB, under the API's object limit; the CRD's maxItems
    // refuses it at a real API server): refused before a result is built.
    request("kinds-flood", json!(vec!["hairpin"; 140_000]), "mallory");
    let why = wait_for("the kinds flood answered", Duration::from_secs(60), || {
        answer("kinds-flood")
    })
    .expect("the kinds flood answered");
    assert_contains(&why, "at most 16");
    // Then more requests than one requester may have tested in a minute, and more than the
    // node tests in a minute (each refused at once here: the Service does not exist, so the
    // minute holds them all): mallory's 4 more (she has 3 a minute, the kinds flood took one),
    // then 4 from other users (the node has 6 a minute).
    let per_requester = probe_contract::verify::MAX_TESTS_PER_REQUESTER_PER_MINUTE;
    let limit = probe_contract::verify::MAX_TESTS_PER_MINUTE;
    let more = 8;
    for i in 0..more {
        let requester = if i < 4 {
            "mallory".to_owned()
        } else {
            format!("user-{i}")
        };
        request(&format!("flood-{i}"), json!([]), &requester);
    }
    let answers = wait_for("every request answered", Duration::from_secs(40), || {
        let all: Vec<String> = (0..more)
            .filter_map(|i| answer(&format!("flood-{i}")))
            .collect();
        (all.len() == more).then_some(all)
    })
    .unwrap_or_else(|| {
        panic!(
            "not every request answered: {:#?}",
            api.objects("loopbackverifications")
        )
    });
    // Mallory: the kinds flood and 2 more tested, 2 refused as hers; the node: 3 of hers and
    // 3 others' tested, the last refused as the node's.
    let by_requester = answers
        .iter()
        .filter(|m| m.starts_with("rate limited") && m.contains("(mallory)"))
        .count();
    let by_node = answers
        .iter()
        .filter(|m| m.starts_with("rate limited: this node tests at most 6 requests a minute;"))
        .count();
    assert_eq!(by_requester, 4 - (per_requester - 1), "{answers:#?}");
    assert_eq!(by_node, 4 - (limit - per_requester), "{answers:#?}");
    assert_eq!(
        metric("clbprobe_verify_rate_limited_total{limit=\"requester\"}"),
        Some(by_requester as u64)
    );
    assert_eq!(
        metric("clbprobe_verify_rate_limited_total{limit=\"node\"}"),
        Some(by_node as u64)
    );
    assert_eq!(
        metric("clbprobe_verify_requests_total{phase=\"refused\"}"),
        Some(more as u64 + 1)
    );
    assert!(agent.stop().success());
    drop(lab);
}

/// Issue #49, H3: every agent watched every request in full, so one `verify` naming 100 nodes
/// sent each agent every node's answer (201 watch events, 52 MiB). Now one object per node,
/// and each agent watches its own: here a run asks this node and 20 others, whose answers
/// (written by the test as their agents would, each ~60 KB) never reach this agent's watch.
#[test]
fn an_agent_receives_only_its_own_nodes_request_and_answer() {
    let Some((lab, api, mut agent)) =
        edge_lab_with_agent("verify_own_node", "verify: answering requests as this node")
    else {
        return;
    };
    let others: Vec<String> = (0..20).map(|i| format!("far-{i:02}")).collect();
    let mut args = vec!["verify", "-n", "default", "edge", "--node", NODE_NAME];
    for n in &others {
        args.extend(["--node", n.as_str()]);
    }
    args.extend(["--timeout", "60", "-o", "json"]);
    // The other nodes' agents, as the test: each answers its own object with 200 results.
    let bulky: Vec<Value> = (0..200)
        .map(|i| {
            json!({"kind": "hairpin", "target": format!("203.0.113.10:{i}/tcp"),
                   "outcome": "clean", "tried": "x".repeat(250)})
        })
        .collect();
    let one_answer = json!({"phase": "done", "startedAt": "2026-11-28T00:00:00Z",
                            "finishedAt": "2026-11-28T00:00:01Z", "results": bulky});
    let answer_len = one_answer.to_string().len() as u64;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for mut o in api.objects("loopbackverifications") {
                    let node = o["spec"]["nodes"][0]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    if node.starts_with("far-") && o["status"].is_null() {
                        o["status"] = json!({"nodes": {node: one_answer.clone()}});
                        api.apply(o);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let out = plugin_in_node(&api, &args);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    let stderr = text(&out.stderr);
    let v: Verification = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not a verification ({e}): {}\n{stderr}", text(&out.stdout)));
    assert!(
        v.missing.is_empty(),
        "every node answered: {:?}\n{stderr}",
        v.missing
    );
    assert_eq!(v.nodes.len(), 21, "{stderr}");
    assert_eq!(
        v.nodes[NODE_NAME].phase,
        Phase::Done,
        "{:#?}",
        v.nodes[NODE_NAME]
    );
    assert_eq!(v.nodes["far-07"].results.len(), 200);
    // What this agent's watch received: its own object's events only, less than one of the
    // others' answers (it received all 20, and more with every rewrite, when it watched all).
    let sent = api.watch_sent("loopbackverifications");
    eprintln!("this agent's watch received {sent:?}; one other node's answer: {answer_len} bytes");
    assert!(
        sent.events >= 2,
        "the agent's own request reached it: {sent:?}"
    );
    assert!(
        sent.bytes < answer_len,
        "the agent received others' answers: {sent:?} (one answer is {answer_len} bytes)"
    );
    assert!(
        api.objects("loopbackverifications").is_empty(),
        "the run's 21 objects are deleted"
    );
    assert!(agent.stop().success());
    drop(lab);
}

/// Issue #49: an interrupted `verify` (Ctrl-C, SIGTERM) used to leave its request behind. It
/// is deleted, and the plugin says nothing was concluded. No lab.
#[test]
fn an_interrupted_verify_deletes_its_request() {
    let api = lab_objects_api_on_the_host("verify-interrupted");
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let child = spawn_plugin(
            Command::new(probe_tests::kube_fixture::plugin_bin()),
            &api,
            &[
                "verify",
                "-n",
                "default",
                "web",
                "--node",
                "ghost",
                "--timeout",
                "60",
            ],
        );
        wait_for("the request created", WAIT, || {
            (!api.objects("loopbackverifications").is_empty()).then_some(())
        })
        .expect("the plugin created its request");
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(child.id() as i32, signal) };
        let out = child.wait_with_output().expect("the plugin ends");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_contains(&stderr, "interrupted");
        assert!(
            api.objects("loopbackverifications").is_empty(),
            "the interrupted request is deleted"
        );
    }
}

/// Issue #52: a request costs the agent one API write, its answer (the mark that guards
/// against a request that crashes the agent is a file beside its socket, not a `running`
/// entry). Issue #49's guard still holds: a request the agent was killed while testing is
/// answered `refused` by its restart, which does not test it again.
#[test]
fn an_answer_is_one_write_and_a_request_the_agent_died_testing_is_refused_by_its_restart() {
    let Some((lab, api)) = edge_lab("verify_mark") else {
        return;
    };
    // A socket path the test names, so the restart finds its predecessor's mark beside it.
    let socket = api.dir().join("probe.sock");
    let socket = socket.to_str().unwrap();
    let mark = api.dir().join(format!("verify-testing.{NODE_NAME}"));
    let agent_args = ["--kube-events", "off", "--socket", socket];
    let mut agent = api.start_agent(&agent_args);
    agent.wait_log("verify: answering requests as this node", WAIT);

    let (_, v, stderr) = verify_json(&api);
    assert_eq!(v.nodes[NODE_NAME].phase, Phase::Done, "{v:#?}\n{stderr}");
    let status_writes = |api: &KubeFixture| {
        api.requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("loopbackverifications/"))
            .filter(|r| r.path.split('?').next().unwrap_or("").ends_with("/status"))
            .count()
    };
    assert_eq!(status_writes(&api), 1, "one write for one answer");
    assert!(!mark.exists(), "an answered request leaves no mark");

    // A request the agent is killed while testing (SIGKILL: no clean-up).
    let mut in_node = Command::new("ip");
    in_node
        .args(["netns", "exec", lab::NS_NODE])
        .arg(probe_tests::kube_fixture::plugin_bin());
    let plugin = spawn_plugin(
        in_node,
        &api,
        &[
            "verify",
            "-n",
            "default",
            "edge",
            "--node",
            NODE_NAME,
            "--timeout",
            "90",
            "-o",
            "json",
        ],
    );
    // The first request's test logged one line already: this is the second.
    wait_for("the second request tested", WAIT, || {
        (agent.count_log("verify: testing") == 2).then_some(())
    })
    .expect("the agent tests the second request");
    agent.kill();
    let marked = std::fs::read_to_string(&mark).expect("the killed agent's mark");
    assert!(
        marked.starts_with("verify-"),
        "the mark names the request object: {marked:?}"
    );
    let mut restarted = api.start_agent(&agent_args);
    restarted.wait_log("verify: answering requests as this node", WAIT);
    let out = plugin.wait_with_output().expect("the plugin ends");
    let stderr = text(&out.stderr);
    let v: Verification = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not a verification ({e}): {}\n{stderr}", text(&out.stdout)));
    let node = &v.nodes[NODE_NAME];
    assert_eq!(node.phase, Phase::Refused, "{node:#?}\n{stderr}");
    assert_contains(&node.message, "stopped while testing this request");
    assert_ne!(
        out.status.code(),
        Some(0),
        "a refused node is not resolved: {stderr}"
    );
    assert_eq!(
        restarted.count_log("verify: testing"),
        0,
        "the restart does not test the request again"
    );
    assert!(!mark.exists(), "the mark is answered once and removed");
    assert!(restarted.stop().success());
    drop(lab);
}
