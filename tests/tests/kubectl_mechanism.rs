//! The plugin the way operators run it: `kubectl clb-probe ...`, found on the PATH by kubectl's
//! own plugin mechanism (the real kubectl, `$KUBECTL` or the PATH's), with the flags kubectl
//! users type (`--kubeconfig`, `--context`, `-n`, `-o json`, `$KUBECONFIG`) passed through to
//! it, against the in-process fake API server; and `kubectl get loopbackverifications` with the
//! chart CRD's printer columns. No root needed.

use std::path::Path;

use clb_probe_client::plugin::{Row, fix::Plan};
use probe_tests::{
    agent::{assert_contains, text},
    cluster_objects::{
        active, kubectl_with, lb_service, node_a_hairpin_event, node_b_blackhole_event,
        node_report, plugin_path,
    },
    kube_fixture::{KubeFixture, node_object},
};
use serde_json::{Value, json};

/// A cluster with a confirmed hairpin of `shop/web` (its Event and node-a's report) and a Node
/// Event in `default`.
fn cluster(tag: &str) -> KubeFixture {
    let a = KubeFixture::bare(&format!("mechanism-{tag}"));
    a.apply(node_object("node-a", "aws:///eu-west-1a/i-0abc"));
    a.apply(node_object("node-b", "aws:///eu-west-1b/i-0def"));
    a.apply(lb_service("Local"));
    a.apply(node_a_hairpin_event());
    a.apply(node_b_blackhole_event());
    a.apply(node_report(
        "node-a",
        json!([active("hairpin", "shop/web", "203.0.113.10:80")]),
        json!([]),
    ));
    a.apply(node_report("node-b", json!([]), json!([])));
    a
}

/// A kubeconfig with two contexts: `dead` (the current one, a server nobody listens on) and
/// `live` (the fake API). A plugin that ignores `--context` talks to the dead one and fails.
fn two_contexts(a: &KubeFixture) -> String {
    let path = a.dir().join("two-contexts");
    let config = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: dead\n\
         clusters:\n\
         - name: dead\n  cluster:\n    server: http://127.0.0.1:1\n\
         - name: live\n  cluster:\n    server: {}\n\
         contexts:\n\
         - name: dead\n  context:\n    cluster: dead\n    user: u\n\
         - name: live\n  context:\n    cluster: live\n    user: u\n\
         users:\n- name: u\n  user:\n    token: fake-token\n",
        a.url()
    );
    std::fs::write(&path, config).expect("write the kubeconfig");
    path.to_str().expect("a UTF-8 path").to_owned()
}

#[test]
fn kubectl_plugin_list_names_the_plugin_without_a_warning() {
    let a = KubeFixture::bare("mechanism-list");
    let (dir, path) = plugin_path(a.dir());
    let out = kubectl_with(&path, &["plugin", "list"], &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    let ours = dir.join("kubectl-clb_probe");
    assert!(
        stdout.lines().any(|l| Path::new(l.trim()) == ours),
        "kubectl plugin list does not name {}:\n{stdout}",
        ours.display()
    );
    // kubectl warns about a plugin that is not executable, overshadows a kubectl command or is
    // overshadowed by another of the same name: none of that for ours.
    assert!(
        !stderr
            .lines()
            .chain(stdout.lines())
            .any(|l| l.contains("warning") && l.contains("clb")),
        "{stdout}{stderr}"
    );
}

#[test]
fn kubectl_runs_the_plugin_with_kubeconfig_context_and_namespace() {
    let a = cluster("run");
    let (_, path) = plugin_path(a.dir());
    let kc = two_contexts(&a);
    let live = ["--kubeconfig", kc.as_str(), "--context", "live"];
    let run = |args: &[&str]| kubectl_with(&path, &[&["clb-probe"], args].concat(), &[]);

    // report: the gate's exit code (1: an active loop) comes back through kubectl.
    let out = run(&[&["report", "-o", "json"], &live[..]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("report -o json");
    assert_eq!(v["active_loops"], 1, "{v:#}");
    let nodes: Vec<&str> = v["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["node"].as_str().expect("a node name"))
        .collect();
    assert_eq!(nodes, ["node-a", "node-b"]);
    assert_eq!(v["services"][0]["service"], "shop/web");

    // Without --context the kubeconfig's current context (the dead server) is used: an error,
    // the report's 2, saying what it could not reach.
    let out = run(&["report", "--kubeconfig", &kc]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert_contains(&text(&out.stderr), "kubectl clb-probe: error:");
    assert!(text(&out.stdout).is_empty());

    // events -n: only that namespace's Events; -o json is the plugin's rows.
    let out = run(&[&["events", "-n", "shop", "-o", "json"], &live[..]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).expect("events -o json");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].node.as_str(), rows[0].kind.as_str(), rows[0].count),
        ("node-a", "hairpin", 4)
    );
    assert_eq!(rows[0].service.as_deref(), Some("shop/web"));
    // Without -n: every namespace's, newest first.
    let out = run(&[&["events", "-o", "json"], &live[..]].concat());
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).expect("events -o json");
    assert_eq!(
        rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(),
        ["node-b", "node-a"]
    );

    // The global flags right after the plugin's name, before its command, as well.
    let out = run(&[&live[..], &["fix", "web", "-n", "shop", "-o", "json"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: Plan = serde_json::from_slice(&out.stdout).expect("fix -o json");
    assert_eq!(plan.provider, "aws");
    assert!(
        plan.fixes.iter().any(|f| f.id == "etp-cluster"),
        "{:?}",
        plan.fixes.iter().map(|f| &f.id).collect::<Vec<_>>()
    );
    // -n names the Service's namespace: in `default` there is no `web`.
    let out = run(&[&["fix", "web", "-n", "default"], &live[..]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_contains(&text(&out.stderr), "namespace default");
}

#[test]
fn kubectl_passes_kubeconfig_from_the_environment_and_usage_errors_through() {
    let a = cluster("env");
    let (_, path) = plugin_path(a.dir());
    let kc = two_contexts(&a);
    // $KUBECONFIG, as kubectl itself reads it, with --context.
    let out = kubectl_with(
        &path,
        &["clb-probe", "events", "-o", "json", "--context", "live"],
        &[("KUBECONFIG", &kc)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).expect("events -o json");
    assert_eq!(rows.len(), 2);
    // $KUBECONFIG's current context is the dead one.
    let out = kubectl_with(&path, &["clb-probe", "events"], &[("KUBECONFIG", &kc)]);
    assert_eq!(out.status.code(), Some(1));
    // A context the kubeconfig lacks: named, exit 1, nothing on stdout.
    let out = kubectl_with(
        &path,
        &[
            "clb-probe",
            "events",
            "--kubeconfig",
            &kc,
            "--context",
            "nope",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_contains(&text(&out.stderr), "nope");
    assert!(out.stdout.is_empty());
    // Usage errors are the plugin's 2, through kubectl.
    let out = kubectl_with(&path, &["clb-probe", "report", "-o", "yaml"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_contains(&text(&out.stderr), "yaml");
}

/// `kubectl get loopbackverifications` (and `lbv`): the chart CRD's printer columns, filled from
/// the object (a request as the plugin creates it).
#[test]
fn kubectl_get_lists_the_verifications_with_the_crds_columns() {
    let a = KubeFixture::bare("mechanism-lbv");
    a.apply(json!({
        "apiVersion": "clb-probe.io/v1alpha1", "kind": "LoopbackVerification",
        "metadata": {"name": "clb-probe-verify-abcde"},
        "spec": {"service": {"namespace": "shop", "name": "web"}, "nodes": ["node-a"]},
    }));
    let (_, path) = plugin_path(a.dir());
    let get = |what: &str| {
        let out = kubectl_with(&path, &["get", what, "--kubeconfig", a.kubeconfig()], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    for what in ["loopbackverifications", "lbv"] {
        let table = get(what);
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines.len(), 2, "{table}");
        let header = &lines[0];
        assert_eq!(header[0], "NAME", "{table}");
        // The columns the CRD declares, in its order (others may come between them).
        let at = |name: &str| {
            header
                .iter()
                .position(|c| *c == name)
                .unwrap_or_else(|| panic!("no {name} column:\n{table}"))
        };
        let (ns, svc, age) = (at("SERVICE-NAMESPACE"), at("SERVICE"), at("AGE"));
        assert!(ns < svc && svc < age, "{table}");
        let row = &lines[1];
        assert_eq!(row.len(), header.len(), "{table}");
        assert_eq!(
            (row[0], row[ns], row[svc]),
            ("clb-probe-verify-abcde", "shop", "web"),
            "{table}"
        );
        // One request object per node (issue #49, H3): its node, from `.spec.nodes[0]`.
        assert_eq!(row[at("NODE")], "node-a", "{table}");
        assert!(
            row[age].ends_with('s') && row[age][..row[age].len() - 1].parse::<u32>().is_ok(),
            "an age in seconds: {table}"
        );
    }
}
