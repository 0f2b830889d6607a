//! `kubectl-clb_probe` (the kubectl plugin) against the in-process fake API server
//! (test_support::kubeapi: the real kube client on the wire), and its krew manifest template.
//! No root needed: nothing here touches the lab.

use std::{path::Path, process::Command};

use clb_probe_client::plugin::{Row, fix::Plan};
use probe_tests::{
    agent::{assert_contains, assert_lacks, text},
    cluster_objects::{
        self, active, clb_event, fix_ids, lb_service, node_a_hairpin_event, node_b_blackhole_event,
    },
    kube_fixture::{KubeFixture, node_object, plugin_bin},
};
use serde_json::{Value, json};

fn api(tag: &str) -> KubeFixture {
    KubeFixture::bare(&format!("plugin-{tag}"))
}

#[test]
fn events_lists_clb_probes_events_newest_first_with_every_column() {
    let a = api("events");
    a.apply(node_a_hairpin_event());
    a.apply(node_b_blackhole_event());
    a.apply(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "kubelet-pulled", "namespace": "shop"},
        "eventTime": "2026-11-23T03:00:00.000000Z",
        "reportingController": "kubelet", "reportingInstance": "node-a", "reason": "Pulled",
    }));
    let out = a.run(&["events"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "header + clb-probe's two Events only:\n{stdout}"
    );
    // Every column, in order, and nothing else in the header.
    let header = lines[0].split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        header, "LAST SEEN NODE KIND SERVICE CLIENT POD COUNT",
        "{stdout}"
    );
    assert!(
        lines[1].contains("node-b") && lines[1].contains("healthcheck_blackhole"),
        "newest first:\n{stdout}"
    );
    assert!(lines[1].trim_end().ends_with('9'), "{stdout}");
    assert!(
        lines[2].contains("node-a")
            && lines[2].contains("hairpin")
            && lines[2].contains("shop/web")
            && lines[2].contains("shop/client-0"),
        "{stdout}"
    );

    let out = a.run(&["events", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).expect("rows");
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].node.as_str(), rows[0].count), ("node-b", 9));
    assert_eq!(rows[1].service.as_deref(), Some("shop/web"));
    assert_eq!(rows[1].client_pod.as_deref(), Some("shop/client-0"));
    assert_eq!(rows[1].last_seen.to_string(), "2026-11-23T01:10:00Z");
}

#[test]
fn an_empty_cluster_says_so_and_exits_0() {
    let a = api("empty");
    let out = a.run(&["events"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("no loopback events"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn forbidden_is_one_line_and_exit_1() {
    let a = api("forbidden");
    a.forbid("events", "list");
    let out = a.run(&["events"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert_contains(&stderr, "forbidden");
    assert!(out.stdout.is_empty());
}

#[test]
fn usage_errors_exit_2_and_an_unreachable_server_exits_1() {
    let a = api("usage");
    assert_eq!(a.run(&["nonsense"]).status.code(), Some(2));
    assert_eq!(a.run(&["watch"]).status.code(), Some(2));
    assert_eq!(a.run(&["events", "-o", "yaml"]).status.code(), Some(2));
    let out = Command::new(plugin_bin())
        .args(["--kubeconfig", "/nonexistent/kubeconfig", "events"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_contains(&text(&out.stderr), "--kubeconfig");
}

fn agent_pod(name: &str, node: &str, phase: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "clb-probe",
                     "labels": {"app.kubernetes.io/name": "clb-probe"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "clb-probe", "uid": "u1", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "clb-probe"}]},
        "status": {"phase": phase},
    })
}

#[test]
fn watch_finds_the_agent_pod_on_the_node_and_execs_kubectl() {
    let a = api("watch");
    a.apply(agent_pod("clb-probe-aaaaa", "node-a", "Running"));
    a.apply(agent_pod("clb-probe-bbbbb", "node-b", "Running"));
    let out = a.run(&["watch", "node-b", "--print-command"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let kc = a.kubeconfig().to_string();
    assert_eq!(
        text(&out.stdout).trim(),
        format!(
            "kubectl --kubeconfig {kc} exec -it -n clb-probe clb-probe-bbbbb -c agent -- probe watch"
        )
    );

    // Without --print-command it becomes kubectl: a fake one on PATH records its arguments.
    let bin = a.dir().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("kubectl");
    let args_file = a.dir().join("args");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {}\nexit 7\n",
            args_file.display()
        ),
    )
    .unwrap();
    set_executable(&fake);
    let path = std::env::join_paths(
        std::iter::once(bin.clone())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let out = a.run_env(&["watch", "node-a"], &[("PATH", &path)]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "kubectl's exit status is the plugin's"
    );
    let args = std::fs::read_to_string(&args_file).unwrap();
    assert_eq!(
        args.lines().collect::<Vec<_>>(),
        [
            "--kubeconfig",
            kc.as_str(),
            "exec",
            "-it",
            "-n",
            "clb-probe",
            "clb-probe-aaaaa",
            "-c",
            "agent",
            "--",
            "probe",
            "watch"
        ]
    );

    let out = a.run(&["watch", "node-z"]);
    assert_eq!(out.status.code(), Some(1));
    assert_contains(&text(&out.stderr), "no clb-probe agent pod on node node-z");
}

fn set_executable(p: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mut perm = std::fs::metadata(p).unwrap().permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm).unwrap();
}

/// The krew manifest template parses as YAML and has what krew requires, with the binary
/// name the workspace builds.
#[test]
fn the_krew_manifest_template_has_the_required_fields() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/krew/clb-probe.yaml");
    // Setup's venv has PyYAML (yamllint's dependency): no reliance on the host's python3.
    if !test_support::tools::venv_has_module("yaml") {
        eprintln!("skip: setup's venv (PyYAML) is missing: run cargo xtask setup");
        return;
    }
    let out = Command::new(test_support::tools::venv_bin("python3"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(&path)
        .output();
    let out = out.expect("running setup's venv python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "clb-probe");
    let spec = &m["spec"];
    assert_eq!(spec["version"], "v${VERSION}");
    for key in ["homepage", "shortDescription", "description"] {
        assert!(spec[key].as_str().is_some_and(|s| !s.is_empty()), "{key}");
    }
    let platforms = spec["platforms"].as_array().expect("platforms");
    assert!(!platforms.is_empty());
    for p in platforms {
        assert!(p["selector"]["matchLabels"]["os"].is_string(), "{p:#}");
        assert!(p["uri"].as_str().unwrap().contains("${VERSION}"), "{p:#}");
        assert!(
            p["sha256"].as_str().unwrap().starts_with("${SHA256_"),
            "{p:#}"
        );
        assert_eq!(
            p["bin"],
            plugin_bin().file_name().unwrap().to_str().unwrap()
        );
    }
}

/// `fix` lists the fixes for a Service from its confirmed hairpin (an Event) and the provider
/// the Nodes' providerIDs name; `--apply` dry-runs, patches, prints the undo; refusals exit 2
/// and change nothing.
#[test]
fn fix_lists_dry_runs_applies_and_prints_the_undo() {
    let a = api("fix");
    a.apply(node_object("node-a", "aws:///eu-west-1a/i-0abc"));
    a.apply(node_object("node-b", "aws:///eu-west-1b/i-0def"));
    a.apply(lb_service("Local"));
    a.apply(node_a_hairpin_event());

    let out = a.run(&["fix", "-n", "shop", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    println!("{listing}");
    assert!(
        listing.starts_with("Service shop/web (resourceVersion ")
            && listing.contains("provider aws (from node providerID)")
            && listing.contains("confirmed: hairpin"),
        "{listing}"
    );
    // The in-tree AWS controller runs it (no LBC class/annotation): only the generic fixes.
    // The plugin does not see whether kube-proxy programs the LB IP on the nodes, so
    // etp-cluster comes after the caller's change, with that precondition (issue 35, item 4).
    assert!(
        listing.contains("1. call-by-service-name [generic]")
            && listing.contains("2. etp-cluster [generic]"),
        "{listing}"
    );
    assert_lacks(&listing, "aws-nlb-target-type-ip");

    let out = a.run(&["fix", "-n", "shop", "web", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: Plan = serde_json::from_slice(&out.stdout).expect("a plan");
    assert_eq!(plan.provider, "aws");
    assert_eq!(plan.fixes[1].id, "etp-cluster");
    assert_eq!(
        plan.fixes[1].patch,
        Some(json!({"spec": {"externalTrafficPolicy": "Cluster"}}))
    );
    let rv = plan.resource_version.clone().expect("the resource version");

    // Another provider's fix, and advice without a patch: refused, nothing changed.
    let out = a.run(&["fix", "-n", "shop", "web", "--apply", "do-lb-hostname"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_contains(&text(&out.stderr), "is for provider digitalocean");
    let out = a.run_words("fix -n shop web --apply call-by-service-name");
    assert_eq!(out.status.code(), Some(2));
    // RBAC: the dry run is denied, named, exit 2.
    a.forbid("services", "patch");
    let out = a.run(&["fix", "-n", "shop", "web", "--apply", "etp-cluster"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_contains(
        &text(&out.stderr),
        "cannot patch services in namespace shop",
    );
    a.allow_all();
    assert_eq!(a.stored_etp("web"), "Local");

    // --dry-run: the server's answer as a diff; nothing stored.
    let out = a.run_words("fix -n shop web --apply etp-cluster --dry-run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_contains(&text(&out.stdout), "nothing applied (--dry-run)");
    assert_eq!(a.stored_etp("web"), "Local");

    // Issue 36 E17: no terminal to confirm on and no --yes: the dry run shown, nothing
    // applied, exit 2.
    let apply_at_rv = [
        "fix",
        "-n",
        "shop",
        "web",
        "--apply",
        "etp-cluster",
        "--resource-version",
        &rv,
    ];
    let out = a.run(&apply_at_rv);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_contains(
        &text(&out.stdout),
        "spec.externalTrafficPolicy: \"Local\" -> \"Cluster\"",
    );
    assert_contains(&text(&out.stderr), "pass --yes");
    assert_eq!(a.stored_etp("web"), "Local");

    // Apply at the listed version, confirmed: dry run, patch, undo line.
    let out = a.run(&[&apply_at_rv[..], &["--yes"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let applied = text(&out.stdout);
    println!("{applied}");
    assert!(
        applied.starts_with(
            "dry run of etp-cluster on service shop/web (the API server's answer):\n  \
             spec.externalTrafficPolicy: \"Local\" -> \"Cluster\"\n"
        ),
        "{applied}"
    );
    assert!(
        applied.contains("undo: kubectl clb-probe fix -n shop web --undo")
            && applied.contains(
                r#"or: kubectl patch service -n shop web --type merge -p '{"metadata":{"annotations":{"clb-probe.io/undo":null}},"spec":{"externalTrafficPolicy":"Local"}}'"#
            ),
        "{applied}"
    );
    assert_eq!(a.stored_etp("web"), "Cluster");
    let dry_runs = a
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("dryRun=All"))
        .count();
    assert!(dry_runs >= 1, "a server-side dry run first");

    // The listing's version is stale now: refused; and Cluster is in place: not offered.
    let out = a.run(&apply_at_rv);
    assert_eq!(out.status.code(), Some(2));
    assert_contains(&text(&out.stderr), "changed since the fix was computed");
    let out = a.run(&["fix", "-n", "shop", "web"]);
    assert_lacks(&text(&out.stdout), "etp-cluster");

    // The undo is kept on the Service: --dry-run shows it and changes nothing, --undo
    // restores Local and removes the annotation; a second --undo finds nothing kept.
    let out = a.run(&["fix", "shop/web", "--undo", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_contains(
        &text(&out.stdout),
        "spec.externalTrafficPolicy: \"Cluster\" -> \"Local\"",
    );
    assert_eq!(a.stored_etp("web"), "Cluster");
    let out = a.run(&["fix", "shop/web", "--undo", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_contains(&text(&out.stdout), "undone etp-cluster: service shop/web");
    assert_eq!(a.stored_etp("web"), "Local");
    let out = a.run(&["fix", "shop/web", "--undo", "--yes"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_contains(&text(&out.stderr), "no undo kept");
}

/// With the AWS Load Balancer Controller's class, the provider's own fixes come first; a
/// DigitalOcean node makes a health-check blackhole offer DO's hostname annotation.
#[test]
fn fix_offers_the_provider_s_own_fixes_first() {
    let a = api("fix-aws");
    a.apply(node_object("node-a", "aws:///eu-west-1a/i-0abc"));
    let mut svc = lb_service("Local");
    svc["spec"]["loadBalancerClass"] = json!("service.k8s.aws/nlb");
    a.apply(svc);
    a.apply(node_a_hairpin_event());
    let out = a.run(&["fix", "-n", "shop", "web", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = fix_ids(&plan);
    // The provider's own first; etp-cluster later (the plugin does not see kube-proxy).
    assert_eq!(
        ids[..2],
        ["aws-nlb-target-type-ip", "aws-preserve-client-ip-off"]
    );
    assert!(ids.contains(&"etp-cluster"), "{ids:?}");
    let out = a.run_words("fix -n shop web --apply aws-nlb-target-type-ip --yes");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_contains(
        &text(&out.stdout),
        r#"-p '{"metadata":{"annotations":{"clb-probe.io/undo":null,"service.beta.kubernetes.io/aws-load-balancer-nlb-target-type":null}}}'"#,
    );

    let b = api("fix-do");
    b.apply(node_object("node-a", "digitalocean://123"));
    b.apply(lb_service("Cluster"));
    b.apply(clb_event(
        "clb-probe.node-a.hc.1",
        "shop",
        "node-a",
        "HealthCheckBlackhole",
        "2026-11-23T01:10:00.000000Z",
        2,
    ));
    let out = b.run(&["fix", "-n", "shop", "web"]);
    let listing = text(&out.stdout);
    assert_contains(&listing, "1. do-lb-hostname [digitalocean]");
    assert_lacks(&listing, "etp-cluster");
}

/// `date -u` of now minus `secs`, RFC 3339.
fn rfc3339_ago(secs: u64) -> String {
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("-{secs} seconds"),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .expect("date");
    text(&out.stdout).trim().to_string()
}

/// A LoopbackReport as the agent's writer stores it (clb-probe.io/v1alpha1, status by apply),
/// updated `updated_secs_ago`, its agent unable to resolve drop sites.
fn node_report(node: &str, updated_secs_ago: u64, loops: Value, risks: Value) -> Value {
    let mut report = cluster_objects::node_report(node, loops, risks);
    report["status"]["capabilities"] = json!([{"name": "drop_sites", "available": false,
                                               "cannotConfirm": "drop sites cannot be resolved"}]);
    report["status"]["lastUpdate"] = json!(rfc3339_ago(updated_secs_ago));
    report
}

fn three_nodes_two_reports(tag: &str) -> KubeFixture {
    let a = api(tag);
    for n in ["node-a", "node-b", "node-c"] {
        a.apply(node_object(n, ""));
    }
    a.apply(node_report(
        "node-a",
        600,
        json!([
            active("hairpin", "shop/web", "203.0.113.10:80"),
            active("healthcheck_blackhole", "shop/web", "203.0.113.10"),
            active("hairpin", "shop/api", "203.0.113.11:443"),
        ]),
        json!([{"kind": "healthcheck_blackhole", "subject": "203.0.113.10",
                "service": "shop/web", "summary": "LB IP bound locally",
                "firstFix": "etp-cluster: set externalTrafficPolicy: Cluster"}]),
    ));
    a.apply(node_report("node-b", 2 * 3600, json!([]), json!([])));
    a
}

#[test]
fn report_prints_the_cluster_table_with_a_missing_node_and_exits_1() {
    let a = three_nodes_two_reports("report");
    let out = a.run(&["report"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let expected = "\
NODE    STATE    MODE  KERNEL               RISKS  HAIRPIN  HC-BLACKHOLE  VIP-UNSERVED  VIP-AS-SOURCE  SELF-LOOP  ETP-LOCAL-DROP  PROXY-PROTOCOL  STALE-UDP-CT  SOURCE-RANGES  LB-PROBE  UPDATED
node-a  ok       ipvs  6.12.48+deb13-amd64  1      2        1             0             0              0          0               0               0             0              0         10m
node-b  stale    ipvs  6.12.48+deb13-amd64  0      0        0             0             0              0          0               0               0             0              0         2h
node-c  missing  -     -                    -      -        -             -             -              -          -               -               -             -              -         -

SERVICE   ACTIVE-LOOPS  RISKS  NODES  KINDS                          FIRST FIX
shop/web  2             1      1      hairpin,healthcheck_blackhole  etp-cluster
shop/api  1             0      1      hairpin                        etp-cluster

3 nodes: 1 risks, 3 active loops; 1 without a report (missing), 1 stale (no update for 15m)
";
    assert_eq!(stdout, expected);
    // The README's example is this output.
    let _ = std::fs::write(std::env::temp_dir().join("clb-report-example.txt"), &stdout);

    let wide = text(&a.run(&["report", "-o", "wide"]).stdout);
    assert!(
        wide.lines()
            .next()
            .unwrap()
            .ends_with("AGENT  CANNOT-CONFIRM"),
        "{wide}"
    );
    assert_contains(&wide, "0.1.0  drop_sites");
    assert_contains(&wide, "etp-cluster: set externalTrafficPolicy: Cluster");

    let json_out = a.run(&["report", "-o", "json"]);
    assert_eq!(json_out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&json_out.stdout).expect("-o json parses");
    assert_eq!(v["missing"], 1);
    assert_eq!(v["stale"], 1);
    assert_eq!(v["nodes"][2]["node"], "node-c");
    assert_eq!(v["nodes"][2]["state"], "missing");
    assert_eq!(v["services"][0]["service"], "shop/web");
}

#[test]
fn report_filters_by_service_and_node_and_a_clean_view_exits_0() {
    let a = three_nodes_two_reports("report-filter");
    let only_api = a.run(&["report", "--service", "shop/api", "-o", "json"]);
    assert_eq!(only_api.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&only_api.stdout).unwrap();
    assert_eq!(v["active_loops"], 1, "{v}");
    assert_eq!(v["risks"], 0);
    // The node with the loop, and the nodes whose state is unknown.
    let nodes: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["node-a", "node-b", "node-c"]);
    let clean = a.run(&["report", "--node", "node-b"]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean.stdout));
    assert!(text(&clean.stdout).contains("node-b  stale"));
    let unknown = a.run(&["report", "--node", "node-z"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown.stdout).is_empty());
    let e = text(&unknown.stderr);
    assert!(e.contains("no such node") && e.lines().count() == 1, "{e}");
    let bad = a.run(&["report", "--service", "web"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("NAMESPACE/NAME"));
}

#[test]
fn report_errors_exit_2() {
    let a = three_nodes_two_reports("report-forbidden");
    a.forbid("loopbackreports", "list");
    let out = a.run(&["report"]);
    assert_eq!(out.status.code(), Some(2));
    let e = text(&out.stderr);
    assert_contains(&e, "forbidden");
    assert_contains(&e, "loopbackreports");
    assert!(text(&out.stdout).is_empty());
}

#[test]
fn kubectl_get_lists_the_reports() {
    let a = three_nodes_two_reports("report-kubectl");
    let out = Command::new(std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()))
        .arg("--kubeconfig")
        .arg(a.kubeconfig())
        .args(["get", "loopbackreports", "-o", "name"])
        .output()
        .expect("run kubectl");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "loopbackreport.clb-probe.io/node-a\nloopbackreport.clb-probe.io/node-b\n"
    );
    // The table kubectl prints from the server's Table: the chart CRD's printer columns.
    let get = |extra: &[&str]| {
        let out = Command::new(std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()))
            .arg("--kubeconfig")
            .arg(a.kubeconfig())
            .args(["get", "lbr"])
            .args(extra)
            .output()
            .expect("run kubectl");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let words = |line: &str| {
        line.split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let plain = get(&[]);
    let lines: Vec<&str> = plain.lines().collect();
    assert_eq!(
        words(lines[0]),
        [
            "NAME",
            "NODE",
            "MODE",
            "RISKS",
            "ACTIVE-LOOPS",
            "LAST-UPDATE"
        ],
        "{plain}"
    );
    assert_eq!(
        words(lines[1])[..5],
        ["node-a", "node-a", "ipvs", "1", "3"],
        "{plain}"
    );
    assert_eq!(
        words(lines[1])[5],
        "10m",
        "lastUpdate 600 s ago, as an age: {plain}"
    );
    assert_eq!(
        words(lines[2])[..5],
        ["node-b", "node-b", "ipvs", "0", "0"],
        "{plain}"
    );
    let wide = get(&["-o", "wide"]);
    let header = words(wide.lines().next().unwrap());
    assert_eq!(header[6..], ["KERNEL", "AGENT"], "{wide}");
    assert_contains(&wide, "6.12.48+deb13-amd64");
}
