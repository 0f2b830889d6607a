//! The node report and the Node condition against a faulty API, a rollout and a wrong node
//! name (issue 36, E7, E12, E13), each with the real agent on the lab writing to the
//! in-process fake API server (as `node_report.rs`):
//!
//! - E7: `nodes/status` patch forbidden (a faulty RBAC): the failures are counted in
//!   `clbprobe_kube_writes_failed_total{object="condition"}`, said once, backed off, and the
//!   report is not rewritten because the condition failed; once allowed, the condition is
//!   patched and an INFO says so.
//! - E13: a restart keeps the condition's `lastTransitionTime` when its status did not change.
//! - E12: an agent whose own Pod runs on `node-a`, started with `--node-name node-b`, writes
//!   neither node-b's report nor its condition; the metric says why.
//!
//! Root only (prints a skip line otherwise). Runs under the lab lock, like every lab test.

use std::time::Duration;

use probe_tests::{
    agent::{Agent, node_metric, wait_for},
    kube_fixture::{KubeFixture, NODE_NAME},
};
use serde_json::{Value, json};
use test_support::{
    kubeapi::FakeApiServer,
    lab::{LabGuard, Variants},
};

const METRICS: &str = "127.0.0.1:19971";
/// The first write goes once the first `probe check` pass is done: seconds.
const WAIT: Duration = Duration::from_secs(45);
/// The flags of an agent that writes the node report and the condition, its metrics on
/// [`METRICS`].
const WRITES_ALL: [&str; 6] = [
    "--node-report",
    "on",
    "--node-condition",
    "on",
    "--metrics-addr",
    METRICS,
];
/// This agent's Pod, as the downward API names it.
const POD_NAMESPACE: &str = "kube-system";

fn report_of(api: &FakeApiServer, node: &str) -> Option<Value> {
    api.objects("loopbackreports")
        .into_iter()
        .find(|o| o["metadata"]["name"] == node)
}

fn node_condition(api: &FakeApiServer, node: &str) -> Option<Value> {
    api.node_condition(node, "LoadBalancerLoopback")
}

/// PATCH requests whose path contains `needle`.
fn patches(api: &FakeApiServer, needle: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.contains(needle))
        .count()
}

/// The agent's Pod `name`, scheduled on `node`, and the environment the downward API gives
/// the agent in it.
fn agent_pod(name: &'static str, node: &str) -> (Value, [(&'static str, &'static str); 2]) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": POD_NAMESPACE, "name": name},
        "spec": {"nodeName": node, "containers": [{"name": "probe", "image": "clb-probe"}]}});
    (pod, [("POD_NAME", name), ("POD_NAMESPACE", POD_NAMESPACE)])
}

/// E7: `nodes/status` patch forbidden. The agent runs with `--node-report-interval 1` (the
/// write limit and the backoff's first wait; 10 s by default) so the same shape shows in 9 s
/// instead of 90: with the report's content unchanged the report is written once (its first
/// write), not every second; the condition's attempts back off (1 s, 2 s, 4 s: at most 4 in
/// 9 s; 9 at the 1 s limit), are counted in the metric and said in one WARN; once allowed,
/// the condition is written and an INFO says so.
#[test]
fn a_forbidden_node_status_is_counted_backed_off_and_never_rewrites_the_report() {
    let Some(_lab) = LabGuard::for_test("hostile_report_forbidden", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder().tag("hostile-report-e7").start();
    api.forbid("nodes", "patch");
    let mut agent = api.start_agent(&[&WRITES_ALL[..], &["--node-report-interval", "1"]].concat());
    wait_for("the first report", WAIT, || report_of(&api, NODE_NAME))
        .unwrap_or_else(|| panic!("no report written"));
    let condition_failed = "clbprobe_kube_writes_failed_total{object=\"condition\"}";
    std::thread::sleep(Duration::from_secs(9));
    let report_writes = patches(&api, &format!("/loopbackreports/{NODE_NAME}/status"));
    let condition_attempts = patches(&api, &format!("/nodes/{NODE_NAME}/status"));
    let counted = node_metric(METRICS, condition_failed) as usize;
    eprintln!(
        "E7: in ~9 s: {report_writes} report writes, {condition_attempts} condition attempts, {counted} counted"
    );
    assert!(
        report_writes <= 2,
        "the report is rewritten for the condition's failures: {report_writes} writes"
    );
    assert!(
        condition_attempts <= 5,
        "the condition is retried without a backoff: {condition_attempts} attempts"
    );
    assert_eq!(counted, condition_attempts, "every failed attempt counted");
    assert_eq!(
        agent.count_log("patching nodes/status failed"),
        1,
        "one WARN per failing stretch"
    );
    assert_eq!(node_condition(&api, NODE_NAME), None);
    // The RBAC is fixed: the condition follows within the backoff (at most the heartbeat).
    api.allow_all();
    wait_for(
        "the condition once allowed",
        Duration::from_secs(320),
        || node_condition(&api, NODE_NAME),
    )
    .unwrap_or_else(|| panic!("no condition once allowed"));
    agent.wait_log("node condition: patched again", Duration::from_secs(10));
}

/// E13: an agent restart with the node's state unchanged keeps the condition's
/// `lastTransitionTime` (the new agent reads the Node's condition before its first write).
/// The agents run as in the chart, their Pod (downward API) on this node: E12's check lets
/// them write.
#[test]
fn a_restart_keeps_the_conditions_transition_time() {
    let Some(_lab) = LabGuard::for_test("hostile_report_restart", &Variants::default()) else {
        return;
    };
    let (pod, env) = agent_pod("clb-probe-here", NODE_NAME);
    let api = KubeFixture::builder()
        .tag("hostile-report-e13")
        .object(pod)
        .start();
    let args = ["--node-report", "on", "--node-condition", "on"];
    let mut first = api.start_agent_with_env(&args, &env);
    let before = wait_for("the first agent's condition", WAIT, || {
        node_condition(&api, NODE_NAME)
    })
    .unwrap_or_else(|| panic!("no condition"));
    assert!(first.stop().success());
    // The next heartbeat must be a later second than the first one's.
    std::thread::sleep(Duration::from_millis(1500));
    let _second = api.start_agent_with_env(&args, &env);
    let after = wait_for("the second agent's condition", WAIT, || {
        node_condition(&api, NODE_NAME)
            .filter(|c| c["lastHeartbeatTime"] != before["lastHeartbeatTime"])
    })
    .unwrap_or_else(|| panic!("the second agent did not write the condition"));
    eprintln!(
        "E13: before {} ({}), after {} ({})",
        before["lastTransitionTime"],
        before["status"],
        after["lastTransitionTime"],
        after["status"]
    );
    assert_eq!(after["status"], before["status"], "{before:#} {after:#}");
    assert_eq!(
        after["lastTransitionTime"], before["lastTransitionTime"],
        "the status did not change, the transition time moved"
    );
}

/// E12: the agent's Pod runs on `node-a`; started with `--node-name node-b` it writes
/// neither node-b's report nor its condition, says so in one ERROR, and the metric says why.
#[test]
fn an_agent_never_writes_another_nodes_report() {
    let Some(_lab) = LabGuard::for_test("hostile_report_node_name", &Variants::default()) else {
        return;
    };
    let (pod, env) = agent_pod("clb-probe-a", "node-a");
    let api = KubeFixture::builder()
        .tag("hostile-report-e12")
        .object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}))
        .object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}))
        .object(pod)
        .start();
    let _agent = never_writes_node_b(&api, &env, "pod_on_other_node", "E12");
    assert!(api.objects("loopbackreports").is_empty());
}

/// E12 outside a Pod (no `POD_NAME`): `--node-name node-b`, whose Node's InternalIP is no
/// address of this host, writes nothing either; the metric says why.
#[test]
fn outside_a_pod_an_agent_never_writes_a_node_whose_address_is_elsewhere() {
    let Some(_lab) = LabGuard::for_test("hostile_report_node_address", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder()
        .tag("hostile-report-e12-host")
        .object(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.77"}]}}),
        )
        .start();
    never_writes_node_b(&api, &[], "node_address_not_local", "E12 (outside a Pod)");
}

/// Starts an agent told `--node-name node-b` (with `env`) writing the node report and
/// condition; asserts it writes neither, counts the refusal under `reason` once and logs one
/// ERROR. Returns the agent, still running.
fn never_writes_node_b(
    api: &KubeFixture,
    env: &[(&str, &str)],
    reason: &str,
    label: &str,
) -> Agent {
    let mut agent = api.start_agent_as("node-b", &WRITES_ALL, env);
    let refused = format!("clbprobe_node_report_refused{{reason=\"{reason}\"}}");
    wait_for("a write to node-b or the refusal", WAIT, || {
        (report_of(api, "node-b").is_some() || node_metric(METRICS, &refused) == 1).then_some(())
    });
    let writes = patches(api, "node-b");
    eprintln!(
        "{label}: {writes} writes to node-b, report {}, condition {}",
        report_of(api, "node-b").is_some(),
        node_condition(api, "node-b").is_some()
    );
    assert_eq!(writes, 0, "node-b's report or condition written");
    assert_eq!(node_metric(METRICS, &refused), 1);
    assert_eq!(agent.count_log("refusing to write"), 1, "one ERROR");
    agent
}
