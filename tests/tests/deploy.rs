//! The deployment is checked like code: yamllint, the Kubernetes schema (kubernetes-validate,
//! strict, pinned version), promtool for the alert rules, and this project's own policy (no
//! `privileged`, only the capabilities the agent needs). No root needed.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use xtask::setup::venv_bin;

/// The Kubernetes version the manifests are validated against.
const KUBERNETES: &str = "1.30.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn manifests() -> Vec<PathBuf> {
    ["namespace.yaml", "serviceaccount.yaml", "daemonset.yaml"]
        .iter()
        .map(|f| repo().join("deploy").join(f))
        .collect()
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

#[test]
fn manifests_pass_yamllint() {
    let config = repo().join(".yamllint");
    let mut files = manifests();
    files.push(repo().join("deploy/alerts.rules.yml"));
    if let Some((ok, text)) = check(
        venv_bin("yamllint"),
        &["--strict", "-c", config.to_str().unwrap()],
        &files,
    ) {
        assert!(ok, "yamllint:\n{text}");
    }
}

#[test]
fn manifests_validate_against_the_kubernetes_schema_and_a_broken_one_does_not() {
    let Some((ok, text)) = check(
        venv_bin("kubernetes-validate"),
        &["--strict", "-k", KUBERNETES],
        &manifests(),
    ) else {
        return;
    };
    assert!(ok, "kubernetes-validate:\n{text}");
    // The checker can fail: a misspelt field is rejected.
    let dir = std::env::temp_dir().join(format!("clb-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let broken = dir.join("daemonset.yaml");
    let text = std::fs::read_to_string(repo().join("deploy/daemonset.yaml")).unwrap();
    std::fs::write(&broken, text.replace("containers:", "containerz:")).unwrap();
    let (ok, out) = check(
        venv_bin("kubernetes-validate"),
        &["--strict", "-k", KUBERNETES],
        &[broken],
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "a broken DaemonSet passed:\n{out}");
}

#[test]
fn alert_rules_pass_promtool() {
    let Some(promtool) = xtask::setup::which("promtool") else {
        eprintln!("skipping: promtool not installed (cargo xtask setup installs it)");
        return;
    };
    let rules = repo().join("deploy/alerts.rules.yml");
    let (ok, text) = check(promtool, &["check", "rules"], &[rules]).unwrap();
    assert!(ok, "promtool:\n{text}");
}

/// Not privileged; exactly the capabilities the agent needs; read-only root; host network;
/// every node; probes on the metrics port; NODE_NAME from the downward API.
#[test]
fn daemonset_follows_the_security_policy() {
    let ds = std::fs::read_to_string(repo().join("deploy/daemonset.yaml")).unwrap();
    assert!(ds.contains("privileged: false") && !ds.contains("privileged: true"));
    assert!(ds.contains("allowPrivilegeEscalation: false"));
    assert!(ds.contains("readOnlyRootFilesystem: true"));
    assert!(ds.contains("drop: [\"ALL\"]"));
    let added: Vec<&str> = ds
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("add:"))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("resources:"))
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
