//! The evidence capture end to end (issue 40): the real programs copy the first bytes of the
//! packets they record, the agent keeps each confirmed loop's first packets and serves them
//! on its HTTP port; the pcapng is opened by tcpdump (the packets) and by pcap-parser (the
//! comments), neither of them the agent's writer.

use std::time::Duration;

use probe_contract::{
    LoopbackEvent, LoopbackKind,
    evidence::{EvidenceBundle, EvidenceIndex, Hook},
};
use probe_tests::{
    agent::{Agent, assert_contains, tempdir::TempDir, wait_for},
    capture::{packet_comments, tcpdump_read},
    kube_fixture::{KubeFixture, NODE_NAME, plugin_in_node},
    written::{clb_events, is},
};
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants, http_get_with_in};

const METRICS: &str = "127.0.0.1:19967";
/// The token the agents get in a file (the chart: Secret clb-probe-evidence, mounted).
const TOKEN: &str = "s3cret-evidence-token";

/// A scratch directory (`tag`) holding the agent's `--evidence-token-file` with [`TOKEN`], and
/// that file's path.
fn token_file(tag: &str) -> (TempDir, String) {
    let dir = TempDir::new(tag);
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    (dir, path.to_str().unwrap().to_owned())
}

/// `GET path` with the token: (status, body).
fn get(addr: &str, path: &str) -> (u16, Vec<u8>) {
    http_get_with_in(
        lab::NS_NODE,
        addr,
        path,
        &[(probe_contract::evidence::TOKEN_HEADER, TOKEN)],
    )
    .unwrap_or_else(|| panic!("GET {path}"))
}

fn get_text(addr: &str, path: &str) -> (u16, String) {
    let (status, body) = get(addr, path);
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn index() -> EvidenceIndex {
    let (status, body) = get_text(METRICS, "/evidence");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The agent in the lab node (`--nic`, `--metrics-addr`, then `extra`, its token file at
/// `token`), and the health-check black hole it confirms once the lab's scenario times out.
fn agent_with_a_black_hole(lab: &LabGuard, extra: &[&str], token: &str) -> (Agent, LoopbackEvent) {
    let mut args = vec!["--nic", lab::NODE_NIC, "--metrics-addr", METRICS];
    args.extend_from_slice(extra);
    args.extend(["--evidence-token-file", token]);
    let agent = Agent::start(lab::NS_NODE, &args);
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    let event = agent.only_event(LoopbackKind::HealthcheckBlackhole, Duration::from_secs(10));
    (agent, event)
}

#[test]
fn a_confirmed_health_check_black_hole_has_its_packets_in_a_capture_tcpdump_reads() {
    let Some(lab) = LabGuard::for_test("evidence", &Variants::default()) else {
        return;
    };
    let (dir, token) = token_file("evidence");
    let (_agent, event) = agent_with_a_black_hole(&lab, &[], &token);

    // The loop is listed with packets that include its drop (the store takes them when the
    // confirmation is published, which the JSON line may precede).
    let summary = wait_for(
        "the loop's packets are kept",
        Duration::from_secs(10),
        || {
            index()
                .loops
                .into_iter()
                .find(|l| l.key == event.key && l.packets > 0)
        },
    )
    .unwrap_or_else(|| panic!("no evidence for {} in {:#?}", event.key, index()));
    assert_eq!(summary.kind, LoopbackKind::HealthcheckBlackhole);
    assert_eq!(index().mode, "headers");

    // Issue #49, H9: the evidence names every loop's clients and carries their packets; any
    // pod reaching the metrics port read it. Without the token, or with another, 401; the
    // counters stay open.
    for headers in [
        vec![],
        vec![(probe_contract::evidence::TOKEN_HEADER, "guess")],
    ] {
        let (status, body) = http_get_with_in(
            lab::NS_NODE,
            METRICS,
            &format!("/evidence/{}", summary.id),
            &headers,
        )
        .unwrap();
        assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
        assert!(!String::from_utf8_lossy(&body).contains(&event.src.to_string()));
    }
    assert_eq!(
        http_get_with_in(lab::NS_NODE, METRICS, "/metrics", &[])
            .unwrap()
            .0,
        200
    );
    let (status, body) = get_text(METRICS, &format!("/evidence/{}", summary.id));
    assert_eq!(status, 200, "{body}");
    let bundle: EvidenceBundle = serde_json::from_str(&body).unwrap();
    assert_eq!(bundle.event.key, event.key);
    let drop = bundle
        .packets
        .iter()
        .find(|p| p.hook == Hook::KfreeSkb)
        .unwrap_or_else(|| panic!("no drop among the kept packets: {:#?}", bundle.packets));
    let reason = drop.drop_reason.clone().expect("a drop names its reason");
    assert!(drop.captured >= 40, "IP and TCP headers captured: {drop:?}");
    assert_eq!((drop.src, drop.sport), (event.src, event.src_port));

    // The capture: tcpdump shows the looping flow's source; the comments name the drop reason.
    let (status, file) = get(METRICS, &format!("/evidence/{}/capture.pcapng", summary.id));
    assert_eq!(status, 200);
    let path = dir.path().join("capture.pcapng");
    std::fs::write(&path, &file).unwrap();
    let packets = tcpdump_read(&path);
    let flow = format!("IP {}.{} > ", event.src, event.src_port);
    assert!(
        packets.contains(&flow),
        "no packet of {flow:?} in:\n{packets}"
    );
    let comments = packet_comments(&file);
    assert!(
        comments
            .iter()
            .any(|c| c.contains(&format!("drop reason {reason}")) && c.contains("hook kfree_skb")),
        "no comment names the drop reason {reason}: {comments:#?}"
    );
    assert!(
        comments
            .iter()
            .all(|c| c.contains(&format!("loop {}", summary.id))
                && c.contains("kind healthcheck_blackhole"))
    );

    // Unknown loops and paths: clear 404s.
    let (status, body) = get_text(METRICS, "/evidence/0123456789abcdef");
    assert_eq!(status, 404);
    assert_contains(&body, "no evidence for loop 0123456789abcdef");
    assert_eq!(get(METRICS, "/evidence/x/y").0, 404);
}

/// Issue #49, H9: an agent without a token (no `--evidence-token-file`, or its Secret not
/// created yet) serves no evidence, and says how to turn it on; the token's file appearing
/// later turns it on without a restart (the kubelet syncs a Secret created after the pod).
#[test]
fn without_a_token_evidence_is_off_until_its_file_appears() {
    let Some(lab) = LabGuard::for_test("evidence", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("evidence-off");
    let later = dir.path().join("token");
    let (_agent, _) = agent_with_a_black_hole(&lab, &[], later.to_str().unwrap());
    let (status, body) = get_text(METRICS, "/evidence");
    assert_eq!(status, 403, "{body}");
    assert_contains(&body, "off");
    assert_contains(&body, "clb-probe-evidence");
    std::fs::write(&later, TOKEN).unwrap();
    let (status, body) = get_text(METRICS, "/evidence");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<EvidenceIndex>(&body)
            .unwrap()
            .loops
            .len(),
        1
    );
    drop(lab);
}

#[test]
fn with_the_capture_off_the_loop_is_listed_without_packets() {
    let Some(lab) = LabGuard::for_test("evidence", &Variants::default()) else {
        return;
    };
    let (_dir, token) = token_file("evidence-nocapture");
    let (_agent, event) = agent_with_a_black_hole(&lab, &["--capture-bytes", "0"], &token);
    let listed = wait_for("the loop is listed", Duration::from_secs(10), || {
        index().loops.into_iter().find(|l| l.key == event.key)
    })
    .expect("the loop is listed");
    // Confirmed as before, from plain records: nothing to keep.
    assert_eq!(listed.packets, 0);
}

/// A Secret's `data` value (base64, as k8s-openapi writes it).
/// `kubectl clb-probe evidence SERVICE -o DIR` run in the lab node: its output and stderr.
fn evidence_into(
    api: &KubeFixture,
    service: &str,
    dir: &std::path::Path,
) -> (std::process::Output, String) {
    let out = plugin_in_node(api, &["evidence", service, "-o", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

fn base64_of(s: &str) -> serde_json::Value {
    serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec())).unwrap()
}

/// The agent's pod as the DaemonSet makes it: hostNetwork (its IP is the node's), its
/// metrics port named.
fn agent_pod(name: &str, node: &str, ip: &str, port: u16) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "clb-probe",
                     "labels": {"app.kubernetes.io/name": "clb-probe"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "clb-probe", "uid": "u1", "controller": true}]},
        "spec": {"nodeName": node, "hostNetwork": true, "containers": [{
            "name": "agent", "image": "clb-probe",
            "ports": [{"name": "metrics", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": ip},
    })
}

#[test]
fn kubectl_evidence_writes_each_nodes_capture_through_the_api_servers_pod_proxy() {
    const PORT: u16 = 19968;
    let Some(lab) = LabGuard::for_test("evidence_kubectl", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder().tag("evidence").start();
    // The fake's pods/proxy connects from the node's namespace, as the API server reaches a
    // hostNetwork pod at the node's address.
    api.proxy_pods_in(lab::NS_NODE);
    let node_ip = lab::NODE_IP.to_string();
    api.apply(agent_pod("clb-probe-aaaaa", NODE_NAME, &node_ip, PORT));
    // A second node that reported the same Service, whose agent does not answer.
    api.apply(agent_pod("clb-probe-bbbbb", "node-b", "127.0.0.1", 1));
    let listen = format!("{node_ip}:{PORT}");
    let (dir, token) = token_file("evidence-out");
    let agent = api.start_agent(&["--metrics-addr", &listen, "--evidence-token-file", &token]);
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    let event = agent.only_event(LoopbackKind::HealthcheckBlackhole, Duration::from_secs(10));
    let svc = event
        .facts
        .service
        .clone()
        .unwrap_or_else(|| panic!("the Service is named: {event:#?}"));
    let service = format!("{}/{}", svc.namespace, svc.name);
    let ours = wait_for("the agent's Event", Duration::from_secs(10), || {
        clb_events(&api)
            .into_iter()
            .find(|e| is(&e.reason, "HealthCheckBlackhole"))
    })
    .unwrap_or_else(|| panic!("no Event: {:#?}", clb_events(&api)));
    let mut other = serde_json::to_value(&ours).unwrap();
    other["metadata"] = serde_json::json!({"name": "from-node-b", "namespace": svc.namespace});
    other["reportingInstance"] = "node-b".into();
    api.apply(other);
    wait_for(
        "the loop's packets are kept",
        Duration::from_secs(10),
        || {
            let (_, body) = get_text(&listen, "/evidence");
            let index: EvidenceIndex = serde_json::from_str(&body).ok()?;
            index
                .loops
                .iter()
                .find(|l| l.key == event.key && l.packets > 0)
                .cloned()
        },
    )
    .expect("evidence kept for the loop");

    let out_dir = dir.path().join("out");
    // No Secret yet: the plugin says the agents serve no evidence and how to turn it on.
    let (off, stderr) = evidence_into(&api, &service, &out_dir);
    assert_eq!(off.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("clb-probe/clb-probe-evidence does not exist")
            && stderr.contains("create secret generic"),
        "{stderr}"
    );
    // The Secret as the operator creates it (its token is what the agent's file holds).
    api.apply(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "clb-probe-evidence", "namespace": "clb-probe"},
        "data": {"token": base64_of(TOKEN)},
    }));
    let out_dir = dir.path().join("out2");
    let (out, stderr) = evidence_into(&api, &service, &out_dir);
    // node-b's agent does not answer: exit 1, named; this node's folder is written anyway.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_contains(&stderr, "node-b");
    assert_contains(&stderr, "no evidence from node-b");
    let node_dir = out_dir.join(NODE_NAME);
    for file in [
        "capture.pcapng",
        "events.json",
        "conntrack.json",
        "rules.txt",
        "check.json",
    ] {
        assert!(
            node_dir.join(file).is_file(),
            "{file} missing in {}",
            node_dir.display()
        );
    }
    let readme = std::fs::read_to_string(out_dir.join("README.txt")).unwrap();
    assert!(
        readme.contains(&format!("{NODE_NAME}/: 1 loop(s)")),
        "{readme}"
    );
    assert_contains(&readme, "node-b: NOT WRITTEN");
    let capture = node_dir.join("capture.pcapng");
    let packets = tcpdump_read(&capture);
    let flow = format!("IP {}.{} > ", event.src, event.src_port);
    assert!(
        packets.contains(&flow),
        "no packet of {flow:?} in:\n{packets}"
    );
    let comments = packet_comments(&std::fs::read(&capture).unwrap());
    assert!(
        comments
            .iter()
            .any(|c| c.contains("hook kfree_skb") && c.contains("drop reason")),
        "{comments:#?}"
    );
    let bundles: Vec<EvidenceBundle> =
        serde_json::from_slice(&std::fs::read(node_dir.join("events.json")).unwrap()).unwrap();
    assert_eq!(bundles.len(), 1);
    assert_eq!(bundles[0].event.key, event.key);

    // DIR is not empty now: refused before anything is asked.
    let (again, stderr) = evidence_into(&api, &service, &out_dir);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr.contains("exists and is not empty"));

    // Without pods/proxy: each node says which permission is missing.
    api.forbid("pods/proxy", "get");
    let denied_dir = dir.path().join("denied");
    let (denied, stderr) = evidence_into(&api, &service, &denied_dir);
    assert_eq!(denied.status.code(), Some(1), "{stderr}");
    assert_contains(&stderr, "forbidden");
    assert_contains(&stderr, "pods/proxy");
    assert!(!denied_dir.join(NODE_NAME).exists());
}
