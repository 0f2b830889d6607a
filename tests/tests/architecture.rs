//! The house's boundaries, checked (issue #50): the pure core links no I/O crate, and the
//! agent's readers and rules do not reach into the kubectl plugin's crate. No root.

use std::{path::PathBuf, process::Command};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The crates in `package`'s normal dependency tree, by name.
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let out = Command::new(cargo)
        .current_dir(root())
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_core_links_no_kernel_runtime_or_api_client_crate() {
    let deps = normal_dependencies("probe-core");
    assert!(deps.iter().any(|d| d == "probe-contract"), "{deps:?}");
    let io: Vec<&String> = deps
        .iter()
        .filter(|d| {
            d.starts_with("aya")
                || d.starts_with("tokio")
                || *d == "kube"
                || d.starts_with("kube-")
                || d.contains("netlink")
                || d.starts_with("hyper")
        })
        .collect();
    assert!(io.is_empty(), "the pure core links {io:?}");
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_agents_readers_rules_and_attribution_do_not_use_the_plugins_crate() {
    let mut offenders = Vec::new();
    for dir in ["state", "kube", "check", "hub", "kernel"] {
        for file in sources(&root().join("probe-user/src").join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            if text.lines().any(|l| {
                let code = l.split("//").next().unwrap_or_default();
                code.contains("clb_probe_client")
            }) {
                offenders.push(file.display().to_string());
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}
