//! The writer against the in-process fake API server (test_support::kubeapi) with the real kube
//! client: object named after the node and owned by it, status through the status
//! subresource by server-side apply, refusals, recreation, and the running task.

use std::sync::Arc;

use probe_contract::report::{ActiveLoop, RiskStatus, rfc3339};
use serde_json::json;
use test_support::kubeapi::FakeApiServer;

use super::*;
use crate::{
    hub::capability::Capability,
    sink::node_report::checks::{CHECK_EVERY, CHECK_MIN_GAP, check_due},
};

struct Fake {
    api: FakeApiServer,
    kubeconfig: std::path::PathBuf,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

fn fake(tag: &str) -> Fake {
    let api = FakeApiServer::start().expect("fake API server");
    let kubeconfig = std::env::temp_dir().join(format!(
        "clb-report-writer-{tag}-{}.kubeconfig",
        std::process::id()
    ));
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}));
    Fake { api, kubeconfig }
}

async fn client(f: &Fake) -> kube::Client {
    crate::kube::connect(&crate::kube::KubeSource::Kubeconfig(f.kubeconfig.clone()))
        .await
        .unwrap()
}

fn status(node: &str, loops: u32) -> ReportStatus {
    ReportStatus {
        node: node.into(),
        kube_proxy_mode: "ipvs".into(),
        active_loop_count: loops,
        active_loops: (0..loops)
            .map(|i| ActiveLoop {
                kind: "hairpin".into(),
                vip: format!("203.0.113.{i}:80"),
                ..Default::default()
            })
            .collect(),
        last_update: rfc3339(1_800_000_000),
        ..Default::default()
    }
}

/// The task's subscription: `reports`, no resolutions, and the agent's stop.
fn subscription(
    reports: tokio::sync::broadcast::Receiver<Arc<Confirmation>>,
    stop: watch::Receiver<bool>,
) -> crate::sink::Subscription {
    crate::sink::Subscription {
        reports,
        resolutions: tokio::sync::broadcast::channel(1).1,
        stop,
    }
}

/// The PATCH requests the fake API received whose path holds `path_part`, in order.
fn patches(f: &Fake, path_part: &str) -> Vec<test_support::kubeapi::Request> {
    f.api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.contains(path_part))
        .collect()
}

fn report_of(f: &Fake, name: &str) -> Option<serde_json::Value> {
    f.api
        .objects("loopbackreports")
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
}

/// The report `name` once `written` holds of it, polled every 50 ms `tries` times at the
/// most (what is written is asserted, not when).
async fn report_once(
    f: &Fake,
    name: &str,
    tries: u32,
    written: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    for _ in 0..tries {
        if let Some(o) = report_of(f, name).filter(|o| written(o)) {
            return Some(o);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test]
async fn the_report_is_named_after_the_node_owned_by_it_and_applied_to_status() {
    let f = fake("own");
    let node_uid = f.api.objects("nodes")[0]["metadata"]["uid"].clone();
    let mut w = ReportWriter::new(client(&f).await, "node-a").unwrap();
    w.write(&status("node-a", 2)).await.unwrap();
    let obj = report_of(&f, "node-a").expect("report written");
    assert_eq!(obj["apiVersion"], "clb-probe.io/v1alpha1");
    assert_eq!(obj["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(obj["metadata"]["ownerReferences"][0]["uid"], node_uid);
    assert_eq!(obj["status"]["activeLoopCount"], 2);
    assert_eq!(obj["status"]["kubeProxyMode"], "ipvs");
    let status_patches = patches(&f, "/loopbackreports/node-a/status");
    assert_eq!(status_patches.len(), 1);
    assert!(
        status_patches[0]
            .content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("application/apply-patch")),
        "{:?}",
        status_patches[0]
    );
    assert!(
        status_patches[0]
            .path
            .contains("fieldManager=clb-probe-agent")
    );
    assert!(status_patches[0].path.contains("force=true"));
    // The next write goes to status only (the object exists).
    w.write(&status("node-a", 0)).await.unwrap();
    assert_eq!(
        report_of(&f, "node-a").unwrap()["status"]["activeLoopCount"],
        0
    );
    let object_patches = patches(&f, "/loopbackreports/node-a?").len();
    assert_eq!(object_patches, 1, "created once");
}

#[tokio::test]
async fn only_this_node_s_report_is_ever_written() {
    let f = fake("name");
    assert!(ReportWriter::new(client(&f).await, "Not/A-Node").is_err());
    let mut w = ReportWriter::new(client(&f).await, "node-a").unwrap();
    assert!(w.write(&status("node-b", 1)).await.is_err());
    assert!(f.api.objects("loopbackreports").is_empty());
    assert!(f.api.requests().iter().all(|r| r.method != "PATCH"));
}

#[tokio::test]
async fn a_refusal_is_an_error_and_a_deleted_report_is_recreated() {
    let f = fake("refused");
    let mut w = ReportWriter::new(client(&f).await, "node-a").unwrap();
    f.api.forbid("loopbackreports", "patch");
    let e = w.write(&status("node-a", 1)).await.unwrap_err();
    assert!(matches!(e, kube::Error::Api(ref s) if s.code == 403), "{e}");
    f.api.allow_all();
    w.write(&status("node-a", 1)).await.unwrap();
    assert!(f.api.delete("LoopbackReport", "", "node-a"));
    // The status apply finds no object (404): said, and recreated on the next write.
    assert!(w.write(&status("node-a", 3)).await.is_err());
    w.write(&status("node-a", 3)).await.unwrap();
    assert_eq!(
        report_of(&f, "node-a").unwrap()["status"]["activeLoopCount"],
        3
    );
}

#[tokio::test]
async fn the_task_writes_a_confirmed_loop_then_stops_with_the_broadcast() {
    let f = fake("task");
    let w = ReportWriter::new(client(&f).await, "node-a").unwrap();
    let (tx, rx) = tokio::sync::broadcast::channel(16);
    let (_checks_tx, checks) = watch::channel(CheckState {
        mode: "iptables".into(),
        risks: vec![],
        ..Default::default()
    });
    let facts = NodeFacts {
        node: "node-a".into(),
        agent_version: "0.1.0".into(),
        kernel: "6.12.0".into(),
    };
    let caps = Arc::new(Capabilities::default());
    caps.set(Capability::Conntrack, false, "test");
    let (_stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(run(w, facts, caps, subscription(rx, stop), checks));
    let ev = crate::sink::node_report::loops::tests_event("k1", Some("shop/web"));
    tx.send(Arc::new(Confirmation {
        event: ev,
        is_new: true,
        write_json: true,
    }))
    .unwrap();
    // Waits for the write (bounded); asserts what was written, not when.
    let o = report_once(&f, "node-a", 200, |o| o["status"]["activeLoopCount"] == 1)
        .await
        .expect("the task wrote the loop");
    assert_eq!(o["status"]["activeLoops"][0]["service"], "shop/web");
    assert_eq!(o["status"]["activeLoops"][0]["kind"], "hairpin");
    assert_eq!(o["status"]["kubeProxyMode"], "iptables");
    assert_eq!(o["status"]["capabilities"][0]["name"], "conntrack");
    assert_eq!(o["status"]["kernel"], "6.12.0");
    drop(tx);
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the task ends when the broadcast closes")
        .unwrap();
}

#[test]
fn a_check_runs_at_once_then_periodically_and_soon_after_a_change() {
    let s = Duration::from_secs;
    assert!(check_due(None, false), "the first pass at once");
    assert!(!check_due(Some(s(1)), false));
    assert!(
        !check_due(Some(s(1)), true),
        "no faster than the write limit"
    );
    assert!(!check_due(Some(CHECK_MIN_GAP - s(1)), true));
    assert!(
        check_due(Some(CHECK_MIN_GAP), true),
        "a change: after the gap"
    );
    assert!(
        !check_due(Some(CHECK_MIN_GAP), false),
        "no change: the period"
    );
    assert!(check_due(Some(CHECK_EVERY), false));
    assert!(CHECK_MIN_GAP < CHECK_EVERY);
}

#[test]
fn repeats_of_a_loop_are_not_a_change_a_new_loop_or_risk_is() {
    let facts = NodeFacts {
        node: "node-a".into(),
        ..Default::default()
    };
    let caps = Capabilities::default();
    let check = CheckState::default();
    let mut loops = Loops::default();
    let t0 = 1_800_000_000;
    loops.observe(
        &crate::sink::node_report::loops::tests_event("k1", Some("shop/web")),
        t0,
    );
    let first = change_key(&build(&facts, &caps, &check, &loops, t0));
    let mut repeat = crate::sink::node_report::loops::tests_event("k1", Some("shop/web"));
    repeat.count = 40;
    loops.observe(&repeat, t0 + 30);
    let after_repeat = build(&facts, &caps, &check, &loops, t0 + 30);
    assert_eq!(
        after_repeat.active_loops[0].count, 40,
        "the state has the count"
    );
    assert_eq!(
        change_key(&after_repeat),
        first,
        "a repeat alone is no write"
    );
    let mut other = crate::sink::node_report::loops::tests_event("k2", Some("shop/api"));
    other.vip_port = Some(443);
    loops.observe(&other, t0 + 31);
    assert_ne!(
        change_key(&build(&facts, &caps, &check, &loops, t0 + 31)),
        first
    );
    let risky = CheckState {
        dataplane: "kube-proxy".into(),
        nftables_readiness: "ready, 1 gone".into(),
        mode: "ipvs".into(),
        risks: vec![RiskStatus {
            kind: "hairpin".into(),
            ..Default::default()
        }],
    };
    let mut loops = Loops::default();
    loops.observe(
        &crate::sink::node_report::loops::tests_event("k1", Some("shop/web")),
        t0,
    );
    assert_ne!(change_key(&build(&facts, &caps, &risky, &loops, t0)), first);
    caps.set(Capability::DropHook, false, "test");
    assert_ne!(
        change_key(&build(&facts, &caps, &check, &loops, t0)),
        first,
        "a lost capability is a change"
    );
}

/// The object size the README's API-load figures use: every list at its bound.
#[test]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn a_full_report_stays_far_below_the_object_size_limit() {
    use probe_contract::report::{MAX_RISK_SERVICES, MAX_RISKS, ResolvedLoop};

    use crate::sink::node_report::loops::{MAX_ACTIVE, MAX_CLIENT_PODS, MAX_FLOODS, MAX_RESOLVED};
    let t = rfc3339(1_800_000_000);
    let full = ReportStatus {
        node: "ip-10-0-123-234.eu-west-1.compute.internal".into(),
        agent_version: "0.1.0".into(),
        kernel: "6.12.48+deb13-amd64".into(),
        kube_proxy_mode: "ipvs".into(),
        capabilities: vec![],
        risks: (0..MAX_RISKS)
            .map(|i| RiskStatus {
                kind: "healthcheck_blackhole".into(),
                subject: format!("203.0.113.{i}"),
                service: Some(format!("namespace-{i}/service-{i}")),
                services: (0..MAX_RISK_SERVICES)
                    .map(|j| format!("namespace-{i}/service-{j}"))
                    .collect(),
                summary: "LB IP bound on kube-ipvs0: the LB's health checks from it are dropped"
                    .into(),
                first_fix: Some("etp-cluster".into()),
                fixes: worst_fix_ids(),
            })
            .collect(),
        active_loops: (0..MAX_ACTIVE)
            .map(|i| ActiveLoop {
                kind: "hairpin".into(),
                service: Some(format!("namespace-{i}/service-{i}")),
                vip: format!("203.0.113.{i}:443"),
                client_pods: (0..MAX_CLIENT_PODS)
                    .map(|p| format!("namespace-{i}/client-7d9f8b6c4-x{p:04}"))
                    .collect(),
                count: 123_456,
                first_seen: t.clone(),
                last_seen: t.clone(),
                first_fix: Some("aws-nlb-target-type-ip".into()),
                fixes: worst_fix_ids(),
                flood: None,
                canary: true,
            })
            // And every flood (E5).
            .chain((0..MAX_FLOODS).map(|i| ActiveLoop {
                kind: "vip_port_unserved".into(),
                vip: format!("203.0.113.{i}"),
                count: 123_456,
                first_seen: t.clone(),
                last_seen: t.clone(),
                flood: Some(format!(
                    "flood: 123456 more vip_port_unserved loops on 203.0.113.{i} than the 10 \
                     listed, aggregated; e.g. 203.0.113.{i}:8001, 203.0.113.{i}:8002, \
                     203.0.113.{i}:8003"
                )),
                ..Default::default()
            }))
            .collect(),
        resolved_loops: (0..MAX_RESOLVED)
            .map(|i| ResolvedLoop {
                kind: "hairpin".into(),
                service: Some(format!("namespace-{i}/service-{i}")),
                vip: format!("203.0.113.{i}:443"),
                count: 123_456,
                first_seen: t.clone(),
                last_seen: t.clone(),
                resolved_at: t.clone(),
                proof: Some(
                    "not confirmed again for 300 s, while 12 answered connections to \
                     203.0.113.250:443/tcp passed packets since (conntrack, SEEN_REPLY)"
                        .into(),
                ),
            })
            .collect(),
        ..Default::default()
    };
    let full_bytes = serde_json::to_vec(&full).unwrap().len();
    let clean_bytes = serde_json::to_vec(&ReportStatus {
        risks: vec![],
        active_loops: vec![],
        resolved_loops: vec![],
        ..full.clone()
    })
    .unwrap()
    .len();
    eprintln!("report status: clean {clean_bytes} B, full {full_bytes} B");
    // ~135 KiB with every entry's fix ids: a tenth of the API server's 1.5 MiB request limit.
    assert!(full_bytes < 160 * 1024, "{full_bytes}");
    assert!(clean_bytes < 1024, "{clean_bytes}");
}

fn conditions(f: &Fake) -> Vec<serde_json::Value> {
    f.api.objects("nodes")[0]["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn the_node_condition_is_merged_by_type_set_while_looping_and_cleared() {
    let f = fake("condition");
    f.api.apply(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
    );
    let mut w = ReportWriter::new(client(&f).await, "node-a").unwrap();
    let looping = ReportStatus {
        active_loops: vec![ActiveLoop {
            kind: "hairpin".into(),
            service: Some("shop/web".into()),
            vip: "203.0.113.10:80".into(),
            first_fix: Some("etp-cluster: set externalTrafficPolicy: Cluster".into()),
            ..Default::default()
        }],
        ..status("node-a", 1)
    };
    w.write_condition(&looping, "2027-01-15T08:00:00Z", false)
        .await
        .unwrap();
    let cs = conditions(&f);
    assert_eq!(cs.len(), 2, "the kubelet's Ready stays: {cs:#?}");
    assert_eq!(cs[0]["type"], "Ready");
    let c = &cs[1];
    assert_eq!(c["type"], "LoadBalancerLoopback");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "Hairpin");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("Service shop/web (203.0.113.10:80); first fix: etp-cluster"),
        "{c:#}"
    );
    let patch = f
        .api
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/nodes/node-a/status"))
        .expect("patched through nodes/status");
    assert!(
        patch
            .content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("application/strategic-merge-patch+json"))
    );
    // Unchanged: no write.
    let before = f.api.requests().len();
    w.write_condition(&looping, "2027-01-15T08:00:10Z", false)
        .await
        .unwrap();
    assert_eq!(f.api.requests().len(), before);
    // Resolved: False, with a new transition time.
    w.write_condition(&status("node-a", 0), "2027-01-15T08:20:00Z", false)
        .await
        .unwrap();
    let c = conditions(&f)[1].clone();
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "NoLoopback");
    assert_eq!(c["lastTransitionTime"], "2027-01-15T08:20:00Z");
    // A heartbeat refreshes lastHeartbeatTime, not the transition.
    w.write_condition(&status("node-a", 0), "2027-01-15T08:25:00Z", true)
        .await
        .unwrap();
    let c = conditions(&f)[1].clone();
    assert_eq!(c["lastHeartbeatTime"], "2027-01-15T08:25:00Z");
    assert_eq!(c["lastTransitionTime"], "2027-01-15T08:20:00Z");
    assert_eq!(conditions(&f).len(), 2);

    // `kubectl describe node` shows it (the real kubectl against the fake server).
    let out =
        std::process::Command::new(std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()))
            .arg("--kubeconfig")
            .arg(&f.kubeconfig)
            .args([
                "get",
                "node",
                "node-a",
                "-o",
                "jsonpath={.status.conditions[1].type}={.status.conditions[1].status}",
            ])
            .output()
            .expect("kubectl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "LoadBalancerLoopback=False",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Before the first `probe check` pass the task writes nothing: a report without its risks
/// would read as a clean node. (A broken writer writes a risk-less report at its first tick,
/// then the risky one 10 s later: two status writes instead of one.)
#[tokio::test]
async fn nothing_is_written_before_the_first_check() {
    let f = fake("first-check");
    let w = ReportWriter::new(client(&f).await, "node-a").unwrap();
    let (tx, rx) = tokio::sync::broadcast::channel(16);
    let (checks_tx, checks) = watch::channel(CheckState::default());
    let (_stop_tx, stop) = watch::channel(false);
    let facts = NodeFacts {
        node: "node-a".into(),
        ..Default::default()
    };
    let task = tokio::spawn(run(
        w,
        facts,
        Arc::new(Capabilities::default()),
        subscription(rx, stop),
        checks,
    ));
    tx.send(Arc::new(Confirmation {
        event: crate::sink::node_report::loops::tests_event("k1", Some("shop/web")),
        is_new: true,
        write_json: true,
    }))
    .unwrap();
    // Longer than the writer's tick: a writer that does not wait would have written by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    checks_tx
        .send(CheckState {
            dataplane: "kube-proxy".into(),
            nftables_readiness: "ready, 1 gone".into(),
            mode: "ipvs".into(),
            risks: vec![RiskStatus {
                kind: "healthcheck_blackhole".into(),
                ..Default::default()
            }],
        })
        .unwrap();
    let o = report_once(&f, "node-a", 400, |o| o["status"]["riskCount"] == 1)
        .await
        .expect("written once the check is in");
    assert_eq!(o["status"]["activeLoopCount"], 1);
    let status_writes = patches(&f, "/loopbackreports/node-a/status").len();
    assert_eq!(status_writes, 1, "the first write already had the risk");
    drop(tx);
    task.await.unwrap();
}

/// The longest fix ids of the table, as many as a report keeps per entry.
fn worst_fix_ids() -> Vec<String> {
    let mut ids: Vec<String> = probe_core::fixes::TABLE
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    ids.sort_by_key(|id| std::cmp::Reverse(id.len()));
    ids.truncate(probe_contract::report::MAX_FIX_IDS);
    ids
}

/// E12: the Pod's node must be the flag's; a Pod not scheduled is not on any node.
#[test]
fn the_agents_pod_must_run_on_the_node_it_writes() {
    use crate::sink::node_report::this_node::node_mismatch;
    assert_eq!(node_mismatch(Some("node-a"), "node-a"), None);
    let why = node_mismatch(Some("node-a"), "node-b").unwrap();
    assert!(
        why.contains("\"node-a\"") && why.contains("\"node-b\""),
        "{why}"
    );
    assert!(node_mismatch(None, "node-b").is_some());
}

/// E12 outside a Pod: the Node's InternalIP must be a host address of this node; nothing to
/// compare is not a refusal.
#[test]
fn outside_a_pod_the_nodes_internal_ip_must_be_local() {
    use probe_contract::facts::AddressOwner;

    use crate::{sink::node_report::this_node::internal_ip_is_local, state::addrs::Prefix};
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let local: crate::state::addrs::Owners = std::sync::Arc::new(
        [(
            Prefix::host(ip("198.18.0.2")),
            AddressOwner::interface("eth0"),
        )]
        .into_iter()
        .collect(),
    );
    assert_eq!(
        internal_ip_is_local(&[ip("198.18.0.2")], &local),
        Some(true)
    );
    assert_eq!(
        internal_ip_is_local(&[ip("192.0.2.77")], &local),
        Some(false)
    );
    assert_eq!(internal_ip_is_local(&[], &local), None);
    assert_eq!(
        internal_ip_is_local(&[ip("198.18.0.2")], &Default::default()),
        None
    );
}
