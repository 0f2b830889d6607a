//! The deployment is checked like code. The Helm chart (`deploy/helm/clb-probe`) is rendered
//! and linted with Helm's own library (helm-python-sdk) for the default values and every
//! values file in its `ci/` folder; every rendered object is validated with
//! kubernetes-validate (strict, pinned Kubernetes) or, for the Prometheus Operator kinds,
//! against the operator's API schemas (npm @kubernetes-models/prometheus-operator). The plain
//! manifests are the chart rendered (`cargo xtask manifests`), the alert rules pass
//! `promtool test rules`, and the DaemonSet follows this project's policy (not privileged,
//! only the capabilities the agent needs). No root needed.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use test_support::tools::venv_bin;
use xtask::chart;

/// The Kubernetes version the manifests are validated against.
const KUBERNETES: &str = "1.30.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clb-deploy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a checker; None (with a skip line) when it is not installed.
fn check(bin: PathBuf, args: &[&str], files: &[PathBuf]) -> Option<(bool, String)> {
    if !bin.is_file() {
        eprintln!(
            "skipping: {} not installed (cargo xtask setup installs it)",
            bin.display()
        );
        return None;
    }
    let out = Command::new(&bin).args(args).args(files).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), text))
}

fn chart_tools() -> bool {
    let ok = chart::available()
        && venv_bin("kubernetes-validate").is_file()
        && test_support::tools::node_prefix()
            .join("node_modules/@kubernetes-models/prometheus-operator")
            .is_dir();
    if !ok {
        eprintln!("skipping: chart tools not installed (cargo xtask setup installs them)");
    }
    ok
}

fn kubernetes_validate(files: &[PathBuf]) -> (bool, String) {
    check(
        venv_bin("kubernetes-validate"),
        &["--strict", "-k", KUBERNETES],
        files,
    )
    .expect("kubernetes-validate installed")
}

fn is_prometheus_operator(file: &Path) -> bool {
    std::fs::read_to_string(file)
        .unwrap()
        .contains("\"apiVersion\": \"monitoring.coreos.com/")
}

/// Renders with `values`, validates every object; returns the rendered stream.
fn render_and_validate(values: Option<&Path>) -> String {
    let what = values.map_or("default values".into(), |v| v.display().to_string());
    chart::lint(values).unwrap_or_else(|e| panic!("helm lint ({what}):\n{e:#}"));
    let stream = chart::render(values).unwrap_or_else(|e| panic!("helm template ({what}):\n{e:#}"));
    let dir = tempdir("render");
    let files = chart::split(&stream, &dir).unwrap();
    let (operator, core): (Vec<PathBuf>, Vec<PathBuf>) =
        files.into_iter().partition(|f| is_prometheus_operator(f));
    let (ok, text) = kubernetes_validate(&core);
    assert!(ok, "kubernetes-validate ({what}):\n{text}\n{stream}");
    if !operator.is_empty() {
        chart::validate_prometheus_operator(&operator)
            .unwrap_or_else(|e| panic!("Prometheus Operator schema ({what}):\n{e:#}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    stream
}

#[test]
fn the_chart_renders_lints_and_validates_for_every_ci_values_file() {
    if !chart_tools() {
        return;
    }
    let default = render_and_validate(None);
    // Off by default: the Prometheus Operator objects, the dashboard, the attribution flag
    // (`auto` is the agent's own default) and the namespace (Helm's --create-namespace).
    for absent in [
        "kind: PodMonitor",
        "kind: PrometheusRule",
        "grafana_dashboard",
        "kind: Namespace",
        "--kube-attribution",
        "--resolve-after",
        // OTLP export (#28) is off unless an endpoint is set: no flag, no env.
        "CLB_PROBE_OTLP",
    ] {
        assert!(!default.contains(absent), "{absent} rendered by default");
    }
    // On by default: RBAC and the token, so events carry names and Events are written.
    assert!(default.contains("kind: ClusterRole\n"));
    assert!(default.contains("- --kube-events=on"));
    assert!(default.contains("automountServiceAccountToken: true"));
    // The node report (#27): its CRD with the printer columns, its RBAC, the flag.
    for present in [
        "kind: CustomResourceDefinition",
        "name: loopbackreports.clb-probe.io",
        "jsonPath: .status.activeLoopCount",
        "jsonPath: .status.lastUpdate",
        "resources: [loopbackreports/status]",
        "- --node-report=on",
        // Verify on demand (#40): its CRD, the agent's read and status-patch RBAC, the flag.
        "name: loopbackverifications.clb-probe.io",
        "resources: [loopbackverifications/status]",
        "- --verify=on",
    ] {
        assert!(
            default.contains(present),
            "{present} not rendered by default"
        );
    }
    // The Node condition is off by default, and so is its RBAC.
    for absent in ["--node-condition", "nodes/status"] {
        assert!(!default.contains(absent), "{absent} rendered by default");
    }

    let values = chart::ci_values();
    assert!(values.len() >= 3, "ci/ values files: {values:?}");
    for v in &values {
        let stream = render_and_validate(Some(v));
        if v.ends_with("node-report-off-values.yaml") {
            assert!(stream.contains("- --node-report=off"));
            for absent in [
                "name: loopbackreports.clb-probe.io",
                "loopbackreports",
                "resources: [nodes]",
                "nodes/status",
                "--node-condition",
            ] {
                assert!(
                    !stream.contains(absent),
                    "{absent} rendered with nodeReport off"
                );
            }
            assert!(
                stream.contains("kind: ClusterRole\n"),
                "the other RBAC stays"
            );
        }
        if v.ends_with("all-on-values.yaml") {
            for present in [
                "kind: Namespace",
                "kind: ClusterRole\n",
                "kind: ClusterRoleBinding",
                "kind: PodMonitor",
                "kind: PrometheusRule",
                "grafana_dashboard: \"1\"",
                "release: kube-prometheus-stack",
                "alert: LoadBalancerLoopbackConfirmed",
                "alert: ClbProbeNotReady",
                "alert: ClbProbeEventsShed",
                "- --nic=eth1",
                "- --pod-cidr=10.244.1.0/24",
                "- --kube-attribution",
                "- --kube-events=on",
                "- --node-report=on",
                "- --node-condition=on",
                "- --resolve-after=120",
                "- --canary-every=30m",
                "resources: [nodes/status]",
                "automountServiceAccountToken: true",
                "containerPort: 9100",
                "\"uid\": \"clb-probe\"",
                "- name: CLB_PROBE_OTLP_ENDPOINT\n              value: \"http://otel-collector.monitoring:4317\"",
                "- name: CLB_PROBE_OTLP_INTERVAL\n              value: \"30\"",
            ] {
                assert!(stream.contains(present), "{present} missing from\n{stream}");
            }
        }
    }
}

#[test]
fn the_values_schema_rejects_bad_values() {
    if !chart_tools() {
        return;
    }
    let dir = tempdir("schema");
    for (name, bad, needle) in [
        ("cap", "capabilities: [CAP_BPF]\n", "capabilities"),
        ("cap-case", "capabilities: [bpf]\n", "capabilities"),
        ("log", "logFormat: xml\n", "logFormat"),
        ("port", "metrics: {port: 99999}\n", "port"),
        ("typo", "nic: [eth0]\n", "nic"),
        // The agent speaks plain gRPC only: an https or scheme-less endpoint fails here.
        (
            "otlp-tls",
            "otlp: {endpoint: \"https://c:4317\"}\n",
            "endpoint",
        ),
        ("otlp-bare", "otlp: {endpoint: \"c:4317\"}\n", "endpoint"),
        (
            "canary",
            "kube: {canaryEvery: \"5 minutes\"}\n",
            "canaryEvery",
        ),
    ] {
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(&file, bad).unwrap();
        let err = chart::render(Some(&file)).expect_err(bad);
        assert!(format!("{err:#}").contains(needle), "{bad}: {err:#}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_plain_manifests_are_the_chart_rendered() {
    if !chart_tools() {
        return;
    }
    let want = chart::plain_manifests_text().unwrap();
    let have = std::fs::read_to_string(chart::plain_manifests()).unwrap();
    assert!(
        want == have,
        "deploy/clb-probe.yaml is stale: run `cargo xtask manifests`"
    );
}

/// The rendered file whose name contains `kind`, rewritten with `from` replaced by `to`.
fn break_object<'a>(files: &'a [PathBuf], kind: &str, from: &str, to: &str) -> &'a PathBuf {
    let file = files
        .iter()
        .find(|f| f.to_string_lossy().contains(kind))
        .unwrap_or_else(|| panic!("no rendered {kind}"));
    let text = std::fs::read_to_string(file).unwrap();
    std::fs::write(file, text.replace(from, to)).unwrap();
    file
}

#[test]
fn a_broken_object_fails_its_schema() {
    if !chart_tools() {
        return;
    }
    let dir = tempdir("broken");
    let files = chart::split(
        &chart::render(Some(&chart::chart_dir().join("ci/all-on-values.yaml"))).unwrap(),
        &dir,
    )
    .unwrap();
    let daemonset = break_object(&files, "DaemonSet", "\"containers\"", "\"containerz\"");
    let (ok, out) = kubernetes_validate(std::slice::from_ref(daemonset));
    assert!(!ok, "a misspelt DaemonSet field passed:\n{out}");
    let monitor = break_object(&files, "PodMonitor", "\"15s\"", "\"15 seconds\"");
    let err = chart::validate_prometheus_operator(std::slice::from_ref(monitor))
        .expect_err("a PodMonitor with a bad interval passed");
    assert!(format!("{err:#}").contains("interval"), "{err:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn manifests_and_rules_pass_yamllint() {
    let config = repo().join(".yamllint");
    let mut files = vec![
        chart::plain_manifests(),
        chart::chart_dir().join("files/alerts.rules.yml"),
        chart::chart_dir().join("values.yaml"),
        chart::chart_dir().join("Chart.yaml"),
        repo().join("deploy/alerts.test.yml"),
    ];
    files.extend(chart::ci_values());
    if let Some((ok, text)) = check(
        venv_bin("yamllint"),
        &["--strict", "-c", config.to_str().unwrap()],
        &files,
    ) {
        assert!(ok, "yamllint:\n{text}");
    }
}

/// Every alert fires on its failure and stays silent otherwise (deploy/alerts.test.yml).
#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let Some(promtool) = test_support::tools::which("promtool") else {
        eprintln!("skipping: promtool not installed (cargo xtask setup installs it)");
        return;
    };
    let rules = chart::chart_dir().join("files/alerts.rules.yml");
    let (ok, text) = check(promtool.clone(), &["check", "rules"], &[rules]).unwrap();
    assert!(ok, "promtool check rules:\n{text}");
    let (ok, text) = check(
        promtool,
        &["test", "rules"],
        &[repo().join("deploy/alerts.test.yml")],
    )
    .unwrap();
    assert!(
        ok && text.contains("SUCCESS"),
        "promtool test rules:\n{text}"
    );
}

/// The Grafana dashboard: valid JSON with the structure Grafana's dashboard model requires
/// (no JSON schema for it can be had offline): unique panel ids, grid positions, each data
/// panel on the `${datasource}` variable with at least one PromQL target.
#[test]
fn the_dashboard_is_well_formed() {
    let text = std::fs::read_to_string(chart::chart_dir().join("files/dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    assert_eq!(dash["uid"], "clb-probe");
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "instance"]);
    let panels = dash["panels"].as_array().unwrap();
    let mut ids = std::collections::BTreeSet::new();
    let mut exprs = 0;
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate id: {p}");
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "gridPos.{k}: {p}");
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{p}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            assert!(expr.contains("instance=~\"$instance\""), "{expr}");
            exprs += 1;
        }
    }
    assert!(exprs >= 9, "{exprs} queries");
}

/// Not privileged; exactly the capabilities the agent needs; read-only root; host network;
/// every node; probes on the metrics port; NODE_NAME from the downward API.
#[test]
fn daemonset_follows_the_security_policy() {
    let ds = std::fs::read_to_string(chart::plain_manifests()).unwrap();
    assert!(ds.contains("privileged: false") && !ds.contains("privileged: true"));
    assert!(ds.contains("allowPrivilegeEscalation: false"));
    assert!(ds.contains("readOnlyRootFilesystem: true"));
    assert!(ds.contains("drop: [\"ALL\"]"));
    let added: Vec<&str> = ds
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("add:"))
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("- "))
        .filter_map(|l| l.trim().strip_prefix("- "))
        .collect();
    assert_eq!(
        added,
        ["BPF", "PERFMON", "NET_ADMIN", "SYSLOG", "SYS_RESOURCE"]
    );
    assert!(!ds.contains("SYS_ADMIN"), "no CAP_SYS_ADMIN");
    assert!(ds.contains("hostNetwork: true"));
    assert!(ds.contains("- operator: Exists"), "tolerates every taint");
    assert!(ds.contains("fieldPath: spec.nodeName"));
    assert!(ds.contains("path: /healthz") && ds.contains("path: /readyz"));
    assert!(ds.contains("prometheus.io/scrape: \"true\""));
}

/// Issue #49: verify from pods is opt-in; with it the agent gets `CAP_SYS_ADMIN` (setns) and
/// the host's `/run/netns`, read-only, and nothing else more. No root needed.
#[test]
fn verify_from_pods_adds_setns_and_the_netns_mount_only_when_asked() {
    if !chart_tools() {
        return;
    }
    let all_on = chart::render(Some(&chart::chart_dir().join("ci/all-on-values.yaml"))).unwrap();
    assert!(all_on.contains("- SYS_ADMIN"), "{all_on}");
    assert!(all_on.contains("mountPath: /run/netns"));
    assert!(all_on.contains("mountPropagation: HostToContainer"));
    assert!(all_on.contains("path: /run/netns"));
    let default = chart::render(None).unwrap();
    assert!(!default.contains("SYS_ADMIN"));
    assert!(!default.contains("/run/netns"));
}
