//! `--node-report on`: the real agent on the lab writes its node's LoopbackReport to the
//! in-process fake API server (test_support::kubeapi: the real kube client on the wire), and
//! `kubectl clb-probe report` reads the cluster table from it: the lab's node with its active
//! loop, a second Node without an agent listed as missing, exit 1; with `--node-condition on`
//! the Node gets the `LoadBalancerLoopback` condition. The report's risks follow the node's
//! addresses: there while the LB IP is bound, gone soon after the hairpin's scenario unbinds
//! it (a change-driven `probe check` pass, not the minute's one).
//!
//! Root only (prints a skip line otherwise). Runs under the lab lock, like every lab test.

use std::{process::Command, time::Duration};

use probe_contract::{
    LoopbackKind,
    condition::{ConditionStatus, NO_LOOPBACK, NodeCondition, TYPE},
    report::ReportStatus,
};
use probe_tests::{
    agent::{Agent, probe_bin, wait_for},
    kube_fixture::{KubeFixture, Listen, NODE_NAME},
};
use serde_json::{Value, json};
use test_support::{
    kubeapi::FakeApiServer,
    lab::{self, LabGuard, Scenario, Variants},
};

/// The first write goes at once; the next ones at most every 10 s (the rate limit), and the
/// risks change with the `probe check` pass at most 10 s after an address change: generous,
/// and below the minute of the periodic pass, so a risk that waits for it trips the test.
const WAIT: Duration = Duration::from_secs(45);

/// This node's LoopbackReport object as the API server holds it.
fn report_object(api: &FakeApiServer) -> Option<Value> {
    api.objects("loopbackreports")
        .into_iter()
        .find(|o| o["metadata"]["name"] == NODE_NAME)
}

/// Its status, read as the contract's type (a field the agent misspells fails here).
fn report(api: &FakeApiServer) -> Option<ReportStatus> {
    let o = report_object(api)?;
    Some(
        serde_json::from_value(o["status"].clone())
            .unwrap_or_else(|e| panic!("status is not a ReportStatus ({e}): {o:#}")),
    )
}

/// The Node's `LoadBalancerLoopback` condition as the API server holds it.
fn node_condition(api: &FakeApiServer) -> Option<NodeCondition> {
    let node = api
        .objects("nodes")
        .into_iter()
        .find(|n| n["metadata"]["name"] == NODE_NAME)?;
    let entry = node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == TYPE)?
        .clone();
    Some(
        serde_json::from_value(entry)
            .unwrap_or_else(|e| panic!("not a NodeCondition ({e}): {node:#}")),
    )
}

#[test]
fn the_agent_writes_its_node_report_and_the_plugin_tables_the_cluster() {
    let Some(lab) = LabGuard::for_test("node_report", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder()
        .tag("node-report")
        // A second Node, with no agent: the plugin must list it as missing.
        .object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "clb-node-2"}}))
        .start();
    let kc = api.kubeconfig();
    let agent = api.start_agent(&[
        "--node-report",
        "on",
        "--node-condition",
        "on",
        // The loop is active for 20 s after its last confirmation (the report's "active" is
        // the tracker's window: long enough for the report's 10 s write limit and the plugin
        // below to see it), and once fixed resolved within 24 s of it (checks every 4 s).
        "--resolve-after",
        "20",
    ]);
    // First the risks alone: the lab's LB IP is bound on kube-ipvs0, and nothing has looped.
    let st = wait_for("the report with the risks", WAIT, || {
        report(&api).filter(|st| st.risk_count >= 1)
    })
    .unwrap_or_else(|| panic!("no report with risks: {:#?}", report_object(&api)));
    let node_uid = api
        .objects("nodes")
        .into_iter()
        .find(|n| n["metadata"]["name"] == NODE_NAME)
        .unwrap()["metadata"]["uid"]
        .clone();
    let written = report_object(&api).unwrap();
    assert_eq!(written["metadata"]["ownerReferences"][0]["uid"], node_uid);
    assert_eq!(st.node, NODE_NAME);
    assert_eq!(st.kube_proxy_mode, "iptables", "{st:#?}");
    assert_eq!(st.dataplane, "kube-proxy", "{st:#?}");
    assert_eq!(st.active_loop_count, 0, "{st:#?}");
    let lb_ip = lab::VIP.to_string();
    assert!(
        st.risks
            .iter()
            .any(|r| r.kind == "healthcheck_blackhole" && r.subject == lb_ip),
        "{st:#?}"
    );
    // `probe check --as nftables` in short: the lab's bound LB IP's risks go with the move.
    assert!(
        st.nftables_readiness.ends_with("gone") && !st.nftables_readiness.ends_with(" 0 gone"),
        "{st:#?}"
    );
    // The Node condition, beside the kubelet's (merged by type): True with the first risk.
    // It is patched after the report, so it is waited for too.
    let first_risk = st.risks[0].kind.clone();
    let condition = wait_for("the Node condition with the risk", WAIT, || {
        node_condition(&api).filter(|c| c.message.starts_with("risk "))
    })
    .expect("LoadBalancerLoopback condition");
    assert_eq!(condition.status, ConditionStatus::True, "{condition:#?}");
    assert_eq!(
        condition.reason.to_lowercase(),
        first_risk.replace('_', ""),
        "{condition:#?}"
    );

    // Then the hairpin. Its scenario unbinds the LB IP (the pod's call must leave the node):
    // the risks go with it, at the check's next change-driven pass, not a minute later.
    lab.traffic(Scenario::Hairpin).expect("traffic");
    agent.first_event_of(LoopbackKind::Hairpin, WAIT);
    let st = wait_for(
        "the report with the loop and without the risks",
        WAIT,
        || report(&api).filter(|st| st.active_loop_count >= 1 && st.risk_count == 0),
    )
    .unwrap_or_else(|| panic!("no report with the loop alone: {:#?}", report_object(&api)));
    let hairpin = st
        .active_loops
        .iter()
        .find(|l| l.kind == "hairpin")
        .unwrap_or_else(|| panic!("{st:#?}"));
    assert!(
        hairpin.service.is_some(),
        "named by attribution: {hairpin:#?}"
    );
    assert!(!hairpin.client_pods.is_empty(), "{hairpin:#?}");
    // The fixes computed on the node, best fit first (what `kubectl clb-probe fix` lists),
    // the first of them the one `firstFix` names.
    let first_id = hairpin
        .fixes
        .first()
        .unwrap_or_else(|| panic!("fix ids: {hairpin:#?}"));
    assert!(
        hairpin
            .first_fix
            .as_deref()
            .is_some_and(|f| f.starts_with(&format!("{first_id}: "))),
        "{hairpin:#?}"
    );
    // Only this node's report, only through the status subresource after the one create.
    assert_eq!(api.objects("loopbackreports").len(), 1);
    let reqs = api.requests();
    let patches = |needle: &str| {
        reqs.iter()
            .filter(|r| r.method == "PATCH" && r.path.contains(needle))
            .count()
    };
    assert_eq!(patches("/loopbackreports/clb-node?"), 1, "created once");
    assert!(patches("/loopbackreports/clb-node/status?") >= 2);

    // The condition follows: True with the loop's kind (an active loop before a risk).
    let condition = wait_for("the Node condition with the loop", WAIT, || {
        node_condition(&api).filter(|c| c.reason == "Hairpin")
    })
    .unwrap_or_else(|| panic!("no Hairpin condition: {:#?}", node_condition(&api)));
    assert_eq!(condition.status, ConditionStatus::True, "{condition:#?}");
    assert!(
        condition.message.contains("on Service default/web"),
        "{condition:#?}"
    );

    // The plugin, in the node's namespace (where the fake API listens).
    let plugin = probe_bin().with_file_name("kubectl-clb_probe");
    let out = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(&plugin)
        .args(["--kubeconfig", kc, "report"])
        .output()
        .expect("run kubectl-clb_probe");
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |node: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(node))
            .unwrap_or_else(|| panic!("{node} missing from\n{table}"))
            .to_string()
    };
    assert!(line(NODE_NAME).contains(" ok "), "{table}");
    assert!(line("clb-node-2").contains(" missing "), "{table}");
    assert!(table.contains("1 without a report (missing)"), "{table}");
    // The README's example is this output.
    let _ = std::fs::write(
        std::env::temp_dir().join("clb-node-report-example.txt"),
        &table,
    );

    // The fix (pod-a's egress masqueraded) and pod-a's answered call: the agent resolves the
    // loop with proof from pod-a's own call, and the report lists the hairpin in its resolved
    // loops with the proof (a quiet entry, if the window passed first, gets it then). A second first: conntrack ages entries to
    // the second.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        lab.traffic(Scenario::HairpinSnat).expect("traffic"),
        lab::Outcome::Ok
    );
    let st = wait_for("the hairpin resolved in the report", WAIT, || {
        report(&api).filter(|st| {
            st.resolved_loops
                .iter()
                .any(|l| l.kind == "hairpin" && l.proof.is_some())
        })
    })
    .unwrap_or_else(|| panic!("no resolved hairpin: {:#?}", report_object(&api)));
    assert!(
        !st.active_loops.iter().any(|l| l.kind == "hairpin"),
        "{st:#?}"
    );
    let resolved = st
        .resolved_loops
        .iter()
        .find(|l| l.kind == "hairpin")
        .unwrap();
    assert!(
        resolved
            .proof
            .as_deref()
            .unwrap()
            .contains("answered connections to"),
        "{resolved:#?}"
    );
    // The Node condition no longer names the loop, and with the LB IP unbound there is no
    // risk left to keep it True.
    let condition = wait_for("the condition without the loop", WAIT, || {
        node_condition(&api).filter(|c| !c.message.starts_with("active loop"))
    })
    .expect("LoadBalancerLoopback without the active loop");
    assert_eq!(condition.status, ConditionStatus::False, "{condition:#?}");
    assert_eq!(condition.reason, NO_LOOPBACK, "{condition:#?}");
    drop(agent);
    drop(api);
    drop(lab);
}

/// Issue 27's cluster view with two agents: the lab's node and its peer node each run an agent
/// writing its own report to the one API server (the peer reaches it over the lab's network, as
/// agents on other nodes reach the API server); a third Node has no agent. `kubectl get lbr`
/// lists both reports with the CRD's columns; `kubectl clb-probe report` tables all three, the
/// third as missing, and exits 1 for the node with the loop.
#[test]
fn two_agents_on_two_nodes_each_write_their_own_report() {
    const PEER: &str = "clb-peer";
    let Some(lab) = LabGuard::for_test("node_report_two_agents", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder()
        .listen(Listen::NodeForAll)
        .tag("node-report-2")
        .object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": PEER}}))
        .object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "clb-node-3"}}))
        .start();
    let kc_node = api.kubeconfig();
    let kc_peer = api.kubeconfig_via(lab::NODE_IP.into());
    let on_node = api.start_agent(&["--node-report", "on"]);
    let on_peer = Agent::start(
        lab::NS_PEER,
        &[
            "--nic",
            "eth0",
            "--kubeconfig",
            kc_peer.to_str().unwrap(),
            "--node-name",
            PEER,
            "--node-report",
            "on",
        ],
    );
    lab.traffic(Scenario::Hairpin).expect("traffic");
    on_node.first_event_of(LoopbackKind::Hairpin, WAIT);
    let reports = wait_for("both reports, the node's with its loop", WAIT, || {
        let all = api.objects("loopbackreports");
        let of = |n: &str| all.iter().find(|o| o["metadata"]["name"] == n).cloned();
        let node = of(NODE_NAME)?;
        let peer = of(PEER)?;
        (node["status"]["activeLoopCount"].as_u64() >= Some(1) && peer["status"]["node"] == PEER)
            .then_some((node, peer))
    })
    .unwrap_or_else(|| panic!("reports: {:#?}", api.objects("loopbackreports")));
    let (_, peer) = reports;
    assert_eq!(peer["status"]["activeLoopCount"], 0, "{peer:#}");
    assert_eq!(
        peer["metadata"]["ownerReferences"][0]["name"], PEER,
        "owned by its own Node: {peer:#}"
    );
    assert_eq!(api.objects("loopbackreports").len(), 2);

    // kubectl get, in the node's namespace (the API listens there).
    let kubectl = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()))
        .arg("--kubeconfig")
        .arg(kc_node)
        .args(["get", "lbr"])
        .output()
        .expect("run kubectl");
    let got = String::from_utf8_lossy(&kubectl.stdout).into_owned();
    assert!(kubectl.status.success(), "{got}");
    let row = |table: &str, node: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(node))
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("{node} missing from\n{table}"))
    };
    assert!(got.starts_with("NAME"), "{got}");
    assert_eq!(row(&got, NODE_NAME)[1..3], [NODE_NAME, "iptables"], "{got}");
    assert_eq!(row(&got, PEER)[1], PEER, "{got}");
    assert!(!got.contains("clb-node-3"), "no report, no row: {got}");

    let plugin = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(probe_bin().with_file_name("kubectl-clb_probe"))
        .arg("--kubeconfig")
        .arg(kc_node)
        .arg("report")
        .output()
        .expect("run kubectl-clb_probe");
    let table = String::from_utf8_lossy(&plugin.stdout).into_owned();
    assert_eq!(plugin.status.code(), Some(1), "{table}");
    assert!(
        row(&table, NODE_NAME).contains(&"ok".to_string()),
        "{table}"
    );
    assert!(row(&table, PEER).contains(&"ok".to_string()), "{table}");
    assert!(
        row(&table, "clb-node-3").contains(&"missing".to_string()),
        "{table}"
    );
    drop(on_peer);
    drop(on_node);
    drop(api);
    drop(lab);
}
