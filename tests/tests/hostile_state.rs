//! Issue #24, the hostile-user pass: state, metrics, Kubernetes and the plugin (items 6, 9, 10,
//! 11, 13; item 7 is a unit test of the metrics sink, `event_series_are_capped_with_an_exact_overflow`).
//!
//! - a full address set: the metric equals what the kernel map holds (read back with bpftool
//!   through the agent's own descriptors), a WARN names the shortfall and the flag, the capacity
//!   and the shortfall are gauges;
//! - a Kubernetes API that ends every watch at once (the in-process fake, `test_support::kubeapi`): the
//!   agent's watches are paced, one WARN, `clbprobe_kube_connected` says 0;
//! - the kubectl plugin against the fake: a forged Event comes out escaped and marked, `-o json`
//!   as before; a tenant's pod labelled as the agent is never exec'd into;
//! - a NIC named with terminal escapes: `probe watch --once` prints it escaped.
//!
//! The lab tests are root only (each prints a skip line otherwise) and share the lab: one at a
//! time. The plugin tests need no root.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use probe_tests::{
    agent::{Agent, assert_contains, hex_bytes, ip_in, node_metric, probe_bin, sh, text, wait_for},
    kernel_view::maps_held_by,
    kube_fixture::KubeFixture,
};
use serde_json::{Value, json};
use test_support::lab::{self, LabGuard, Variants, http_get_in};

const METRICS: &str = "127.0.0.1:19468";
const WAIT: Duration = Duration::from_secs(20);

/// Raw terminal controls in `s` (newline and tab excepted).
fn raw_controls(s: &str) -> Vec<char> {
    s.chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .collect()
}

// ----- item 6: a full address set ---------------------------------------------------------

/// The id of the map named `name` among the descriptors of process `pid` (other agents on
/// the machine have maps of the same name).
fn map_id_of(pid: u32, name: &str) -> String {
    maps_held_by(pid)
        .into_iter()
        .find(|(_, info)| info["name"] == name)
        .map(|(id, _)| id)
        .unwrap_or_else(|| panic!("no map {name} held by pid {pid}"))
}

/// Entries of the agent's HOSTS_V4 by tag byte, read from the kernel.
fn hosts_v4_by_tag(pid: u32) -> std::collections::BTreeMap<u8, u64> {
    let id = map_id_of(pid, "HOSTS_V4");
    let dump: Value =
        serde_json::from_str(&sh(&["bpftool", "-j", "map", "dump", "id", &id])).unwrap();
    let mut by_tag = std::collections::BTreeMap::new();
    for e in dump.as_array().into_iter().flatten() {
        let value = hex_bytes(e.get("value"));
        *by_tag.entry(value[0]).or_insert(0) += 1;
    }
    by_tag
}

fn metrics_text() -> String {
    let (status, body) = http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    body
}

/// `ip addr <verb>` of `n` /32 VIPs (100.64.x.y) on the node's kube-ipvs0, in one batch.
fn vips(verb: &str, n: u32) {
    let batch: String = (0..n)
        .map(|i| {
            format!(
                "addr {verb} 100.64.{}.{}/32 dev {}\n",
                i / 250,
                i % 250 + 1,
                lab::KUBE_IPVS0
            )
        })
        .collect();
    let mut ip = Command::new("ip")
        .args(["-n", lab::NS_NODE, "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut ip.stdin.take().unwrap(), batch.as_bytes()).unwrap();
    assert!(ip.wait().unwrap().success(), "ip -batch");
}

#[test]
fn a_full_address_set_says_what_the_kernel_holds() {
    let Some(_lab) = LabGuard::for_test(
        "a_full_address_set_says_what_the_kernel_holds",
        &Variants::default(),
    ) else {
        return;
    };
    const CAPACITY: u32 = 256; // the flag's minimum
    let mut agent = Agent::on_node_nic(&[
        "--metrics-addr",
        METRICS,
        "--address-entries",
        &CAPACITY.to_string(),
    ]);
    let vip_before = node_metric(METRICS, "clbprobe_local_addresses{set=\"vip\"}");
    // Host entries that are not VIPs (node addresses, pod /32 routes) go in first.
    let before = hosts_v4_by_tag(agent.pid());
    let not_vips: u64 =
        before.values().sum::<u64>() - before.get(&probe_common::tag::VIP).copied().unwrap_or(0);
    // kube-proxy binding capacity + 50 more VIPs (a tenant's LoadBalancer Services).
    vips("add", CAPACITY + 50);
    let total_vips = vip_before + u64::from(CAPACITY) + 50;

    agent.wait_log("address sets exceed --address-entries", WAIT);
    // The burst may take several resyncs: wait for the last one's figure.
    let expected_left_out = total_vips - (u64::from(CAPACITY) - not_vips);
    let left_out = wait_for("the shortfall gauge", WAIT, || {
        let n = node_metric(METRICS, "clbprobe_local_addresses_left_out{set=\"vip\"}");
        (n == expected_left_out).then_some(n)
    })
    .unwrap_or_else(|| {
        panic!("clbprobe_local_addresses_left_out{{set=\"vip\"}} != {expected_left_out}")
    });
    let metric_vips = node_metric(METRICS, "clbprobe_local_addresses{set=\"vip\"}");
    let metric_nodes = node_metric(METRICS, "clbprobe_local_addresses{set=\"node\"}");
    let kernel = hosts_v4_by_tag(agent.pid());
    let kernel_vips = kernel.get(&probe_common::tag::VIP).copied().unwrap_or(0);
    let kernel_nodes = kernel.get(&probe_common::tag::NODE).copied().unwrap_or(0);
    eprintln!(
        "bound {total_vips} VIPs, capacity {CAPACITY}: kernel {kernel:?}, metric vip \
         {metric_vips} node {metric_nodes}, left out {left_out}"
    );
    assert_eq!(
        metric_vips, kernel_vips,
        "the metric is what the kernel holds"
    );
    // (Node addresses also have IPv6 entries, in HOSTS_V6: the node metric counts both.)
    assert!(metric_nodes >= kernel_nodes);
    assert_eq!(
        kernel.values().sum::<u64>(),
        u64::from(CAPACITY),
        "the map is full"
    );
    assert_eq!(
        kernel_vips + left_out,
        total_vips,
        "every VIP is held or counted out"
    );
    assert!(kernel_nodes >= 1, "node addresses go in before VIPs");
    assert_eq!(
        node_metric(METRICS, "clbprobe_local_addresses_capacity"),
        u64::from(CAPACITY)
    );
    let text = metrics_text();
    assert_contains(&text, "# HELP clbprobe_local_addresses_capacity");
    let warn = agent.count_log("address sets exceed --address-entries");
    assert_eq!(warn, 1, "one WARN for one shortfall");
    let (_, ready) = http_get_in(lab::NS_NODE, METRICS, "/readyz").expect("readyz");
    assert_contains(&ready, "over --address-entries (256) are not watched");

    // Under capacity again: everything in, said once.
    vips("del", CAPACITY + 50);
    agent.wait_log("address sets fit in the kernel maps again", WAIT);
    wait_for("the VIP count back", WAIT, || {
        (node_metric(METRICS, "clbprobe_local_addresses{set=\"vip\"}") == vip_before).then_some(())
    })
    .expect("clbprobe_local_addresses{set=\"vip\"} back to its start");
    assert_eq!(
        node_metric(METRICS, "clbprobe_local_addresses_left_out{set=\"vip\"}"),
        0
    );
}

// ----- item 9: watches that end at once ---------------------------------------------------

/// Watch requests per resource among `requests`.
fn watches_by_resource(requests: &[test_support::kubeapi::Request]) -> [usize; 3] {
    let mut n = [0; 3];
    for r in requests {
        if r.method != "GET" || !(r.path.contains("watch=true") || r.path.contains("watch=1")) {
            continue;
        }
        let path = r.path.split('?').next().unwrap_or_default();
        for (i, resource) in ["pods", "services", "endpointslices"].iter().enumerate() {
            if path.ends_with(&format!("/{resource}")) {
                n[i] += 1;
            }
        }
    }
    n
}

#[test]
fn watches_the_server_ends_at_once_are_paced_and_said() {
    let Some(_lab) = LabGuard::for_test(
        "watches_the_server_ends_at_once_are_paced_and_said",
        &Variants::default(),
    ) else {
        return;
    };
    let api = KubeFixture::lab();
    let mut agent = api.start_agent(&["--metrics-addr", METRICS, "--kube-events", "off"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    assert_eq!(node_metric(METRICS, "clbprobe_kube_connected"), 1);

    api.end_watches_at_once(true);
    let before = api.requests().len();
    // A window of 10 s: unpaced, about 75 watches a second per resource were measured.
    const WINDOW: Duration = Duration::from_secs(10);
    std::thread::sleep(WINDOW);
    let in_window = watches_by_resource(&api.requests()[before..]);
    eprintln!("watch requests in {WINDOW:?} by resource (pods, services, slices): {in_window:?}");
    for n in in_window {
        assert!(
            n <= WINDOW.as_secs() as usize,
            "at most one watch per resource per second: {in_window:?}"
        );
    }
    assert_eq!(
        node_metric(METRICS, "clbprobe_kube_connected"),
        0,
        "the gauge tells"
    );
    assert_eq!(
        agent.count_log("the Kubernetes API ends watches at once"),
        1,
        "one WARN"
    );

    // The server behaves again: a watch lasts, the gauge comes back, said once.
    api.end_watches_at_once(false);
    wait_for("clbprobe_kube_connected 1", Duration::from_secs(60), || {
        (node_metric(METRICS, "clbprobe_kube_connected") == 1).then_some(())
    })
    .expect("clbprobe_kube_connected back to 1 once watches last");
    assert_eq!(
        agent.count_log("the Kubernetes API ends watches at once"),
        1
    );
}

// ----- item 13: a NIC named with terminal escapes -----------------------------------------

#[test]
fn probe_watch_prints_a_hostile_nic_name_escaped() {
    let Some(_lab) = LabGuard::for_test(
        "probe_watch_prints_a_hostile_nic_name_escaped",
        &Variants::default(),
    ) else {
        return;
    };
    // CSI "clear screen" and an OSC retitle ended by BEL: 11 bytes, a valid interface name (a
    // bridge: this kernel has no dummy driver; any kind does).
    let name = "e\x1b[2J\x1b]0;x\x07";
    ip_in(
        lab::NS_NODE,
        &["link", "add", "name", name, "type", "bridge"],
    );
    ip_in(lab::NS_NODE, &["link", "set", name, "up"]);
    let agent = Agent::on_node_nic(&["--nic", name]);
    let out = Command::new(probe_bin())
        .args(["watch", "--once", "--socket"])
        .arg(agent.dir.path().join("probe.sock"))
        .output()
        .expect("probe watch --once");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        raw_controls(&stdout).is_empty(),
        "raw control characters {:?} in {stdout:?}",
        raw_controls(&stdout)
    );
    assert!(
        stdout.contains("e\\x1b[2J\\x1b]0;x\\x07"),
        "the NIC is named, escaped:\n{stdout}"
    );
}

// ----- items 10 and 11: the kubectl plugin ------------------------------------------------

fn api() -> KubeFixture {
    KubeFixture::bare("plugin")
}

/// A tenant with Event rights in `shop` writes a "clb-probe" Event meant to clear the
/// operator's screen, print a green ALL CLEAR and hide the real rows.
#[test]
fn a_forged_event_is_printed_escaped_and_marked() {
    let a = api();
    a.apply(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "real", "namespace": "shop"},
        "eventTime": "2026-11-23T01:00:00.000000Z",
        "type": "Warning", "action": "Detected", "reason": "LoopbackHairpin",
        "reportingController": "clb-probe", "reportingInstance": "node-a",
        "regarding": {"apiVersion": "v1", "kind": "Service", "namespace": "shop", "name": "web"},
        "related": {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "client-0"},
    }));
    let forged_instance = "\u{1b}[2J\u{1b}[H\u{1b}[32mALL CLEAR\u{1b}[0m\u{7}";
    a.apply(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "forged", "namespace": "shop"},
        "eventTime": "2026-11-23T02:00:00.000000Z",
        "type": "Warning", "action": "Detected", "reason": "HealthCheckBlackhole\u{9b}8m",
        "reportingController": "clb-probe", "reportingInstance": forged_instance,
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }));
    let out = a.run(&["events"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    eprintln!("{table}");
    assert!(
        raw_controls(&table).is_empty(),
        "raw control characters {:?} in {table:?}",
        raw_controls(&table)
    );
    assert_contains(&table, "\\x1b[2J\\x1b[H\\x1b[32mALL CLEAR\\x1b[0m\\x07");
    let lines: Vec<&str> = table.lines().collect();
    let forged = lines.iter().find(|l| l.contains("ALL CLEAR")).unwrap();
    assert!(forged.contains("\\u{9b}8m*"), "marked: {forged}");
    let real = lines.iter().find(|l| l.contains("node-a")).unwrap();
    assert!(
        real.contains("hairpin ") && !real.contains('*'),
        "the agent's Event is not marked: {real}"
    );
    assert!(
        lines.last().unwrap().starts_with("* not in the shape"),
        "{table}"
    );

    // -o json: the fields as before, the bytes as the API has them (JSON escapes them).
    let out = a.run(&["events", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // JSON escapes C0 controls (ESC, BEL) itself; C1 stays as the bytes (JSON allows it):
    // the output is for programs, unchanged.
    assert!(!text(&out.stdout).contains(['\u{1b}', '\u{7}']));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(rows[0]["node"], forged_instance);
    let keys: Vec<&str> = rows[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "client_pod",
            "count",
            "kind",
            "last_seen",
            "name",
            "namespace",
            "node",
            "note",
            "service"
        ]
    );
}

fn labelled_pod(ns: &str, name: &str, owner: Option<&str>) -> Value {
    let owners: Vec<Value> = owner
        .map(|kind| {
            json!({"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": format!("uid-{name}"),
                   "controller": true})
        })
        .into_iter()
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app.kubernetes.io/name": "clb-probe"},
                     "ownerReferences": owners},
        "spec": {"nodeName": "node-a", "containers": [{"name": "agent", "image": "x"}]},
        "status": {"phase": "Running"},
    })
}

/// A tenant labels its own pods `app.kubernetes.io/name=clb-probe` (in its namespace, even
/// owned by a DaemonSet of its own; or a bare pod where it may create one): `watch` never
/// chooses them, with or without the agent running.
#[test]
fn watch_never_execs_into_a_labelled_tenant_pod() {
    let a = api();
    a.apply(labelled_pod("shop", "fake-agent", Some("DaemonSet")));
    a.apply(labelled_pod("clb-probe", "bare-pod", None));
    a.apply(labelled_pod("clb-probe", "rs-pod", Some("ReplicaSet")));
    let out = a.run(&["watch", "node-a", "--print-command"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "no agent: refused, not a tenant's pod: {}",
        text(&out.stdout)
    );
    assert_contains(
        &text(&out.stderr),
        "no clb-probe agent pod on node node-a in namespace clb-probe",
    );
    assert!(out.stdout.is_empty());

    // The agent runs: its pod is the one, the tenant's pods do not make it ambiguous.
    a.apply(labelled_pod("clb-probe", "clb-probe-x1", Some("DaemonSet")));
    let out = a.run(&["watch", "node-a", "--print-command"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let cmd = text(&out.stdout);
    assert!(
        cmd.trim_end()
            .ends_with("exec -it -n clb-probe clb-probe-x1 -c agent -- probe watch"),
        "{cmd}"
    );
    // Another namespace only when asked for, and still only a DaemonSet's pod there.
    let out = a.run(&["watch", "node-a", "-n", "shop", "--print-command"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("-n shop fake-agent"));
}
