//! One compilation per target and profile for every step that runs the workspace's code.
//!
//! Cargo unifies features over the packages one command selects, so `cargo build -p
//! probe-user`, `cargo test -p probe-tests` and `cargo test` (the default members) each built
//! probe-user, kube, tonic and OpenTelemetry again with their own feature set (measured: `cargo
//! build -p clb-probe` after `cargo test --workspace --no-run` recompiled 13 crates in 35 s,
//! probe-user among them). Every host step (tests, the agent the tests start, the VM suite, the
//! chaos and bench smokes) now names the same selection, [`WORKSPACE`], so the first build
//! ([`host`]) leaves all the others nothing to compile. The demo is the exception: on a first
//! run nothing is built yet, so it builds only the agent it runs, without OTLP (`-p clb-probe
//! --bin probe --no-default-features`: `crate::demo::DEMO_AGENT`). The arm64 steps share
//! [`ARM64_SELECTION`] the same way.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// The host selection: every member but the eBPF crate (built for its own target by
/// probe-user's build script).
pub const WORKSPACE: &[&str] = &["--workspace", "--exclude", "probe-ebpf"];

/// The arm64 agent's Rust target.
pub const ARM64: &str = "aarch64-unknown-linux-gnu";

/// The arm64 selection: the agent and the test files the arm64 VM run uses (test-support, and
/// for the image and deploy tests xtask, come in as probe-tests' dependencies). probe-common's arm64 unit tests are their own `cargo test -p
/// probe-common`: a crate with no dependencies, so its own selection costs nothing.
pub const ARM64_SELECTION: &[&str] =
    &["-p", "probe-common", "-p", "clb-probe", "-p", "probe-tests"];

/// Where cargo builds: `CARGO_TARGET_DIR` (relative to `root` when relative), else
/// `root/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target"))
}

/// `cargo`, as the one running xtask (its toolchain).
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cargo <verb>` over [`WORKSPACE`], from the workspace root.
pub fn workspace_cargo(root: &Path, verb: &str) -> Command {
    let mut cmd = cargo();
    cmd.arg(verb).args(WORKSPACE).current_dir(root);
    cmd
}

/// Every host artifact of the debug profile in one build: the agent and xtask binaries, every
/// unit and integration test executable, the examples (the chaos and bench smokes run two).
/// Returns the executables, as [`crate::vm::suite::artifacts`] does.
pub fn host(root: &Path) -> anyhow::Result<Vec<Artifact>> {
    let mut args = vec!["build"];
    args.extend(WORKSPACE);
    // Not `--all-targets`: that would add benches, built with the release profile.
    args.extend(["--lib", "--bins", "--tests", "--examples"]);
    artifacts(root, &args)
}

/// The arm64 artifacts in one build: the agent (the image test's and the arm64 VM run's) and
/// the integration test executables `tests` (file names: the arm64 VM run's).
pub fn arm64(root: &Path, tests: &[&str]) -> anyhow::Result<Vec<Artifact>> {
    let mut args = vec!["build"];
    args.extend(ARM64_SELECTION);
    args.extend(["--bin", "probe"]);
    for t in tests {
        args.extend(["--test", t]);
    }
    args.extend(["--target", ARM64]);
    artifacts(root, &args)
}

/// One built artifact: (package name, target name, target kinds, executable).
pub type Artifact = (String, String, Vec<String>, PathBuf);

/// Runs a cargo command with `--message-format=json`; returns (package name, target name,
/// target kinds, executable) of every artifact with an executable.
pub fn artifacts(root: &Path, args: &[&str]) -> anyhow::Result<Vec<Artifact>> {
    eprintln!("vm: cargo {}", args.join(" "));
    let out = cargo()
        .args(args)
        .arg("--message-format=json")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting cargo {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), out.status);
    }
    Ok(parse_artifacts(&String::from_utf8_lossy(&out.stdout)))
}

/// The compiler artifacts with an executable in cargo's JSON messages.
pub fn parse_artifacts(json_lines: &str) -> Vec<Artifact> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let exe = m["executable"].as_str()?;
            let package = m["package_id"].as_str().unwrap_or_default();
            // "path+file:///work/main/tests#probe-tests@0.1.0", "path+file:///w/probe-user#0.1.0"
            // (the folder is the name) or the older "probe-tests 0.1.0 (...)".
            let name = match package.rsplit_once('#') {
                Some((_, r)) if r.contains('@') => r.split('@').next().unwrap_or(r),
                Some((url, _)) => url.rsplit('/').next().unwrap_or(url),
                None => package.split(' ').next().unwrap_or(package),
            }
            .to_string();
            let mut kinds: Vec<String> = m["target"]["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(String::from))
                .collect();
            // A binary built as its own unit-test harness (`--tests`) has the bin's kind and
            // name too: marked, so the agent is never taken for its test executable.
            if m["profile"]["test"] == true && kinds.iter().any(|k| k == "bin") {
                kinds.push(TEST_HARNESS.to_string());
            }
            Some((
                name,
                m["target"]["name"].as_str()?.to_string(),
                kinds,
                PathBuf::from(exe),
            ))
        })
        .collect()
}

/// The kind [`parse_artifacts`] adds to a binary's unit-test executable.
pub const TEST_HARNESS: &str = "test-harness";

/// The agent (the `probe` binary) among `built`; `what` names the build in the error (`""`,
/// `"arm64 "`).
pub fn probe_binary(built: &[Artifact], what: &str) -> anyhow::Result<PathBuf> {
    built
        .iter()
        .find(|(_, t, k, _)| {
            t == "probe" && k.iter().any(|k| k == "bin") && !k.iter().any(|k| k == TEST_HARNESS)
        })
        .map(|a| a.3.clone())
        .with_context(|| format!("cargo built no {what}`probe` binary"))
}

/// (test file, executable) of each of `files` (tests/tests/<file>.rs) among `built`, in
/// `files` order; `what` as for [`probe_binary`].
pub fn test_executables(
    built: &[Artifact],
    files: &[&str],
    what: &str,
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    files
        .iter()
        .map(|file| {
            built
                .iter()
                .find(|(p, t, k, _)| {
                    p == "probe-tests" && t == file && k.iter().any(|k| k == "test")
                })
                .map(|a| (file.to_string(), a.3.clone()))
                .with_context(|| {
                    format!("cargo built no {what}test executable for tests/tests/{file}.rs")
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_executables_in_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","package_id":"path+file:///work/main/tests#probe-tests@0.1.0","target":{"kind":["test"],"name":"ipvs"},"executable":"/t/debug/deps/ipvs-1"}
{"reason":"compiler-artifact","package_id":"path+file:///work/main/probe-user#0.1.0","target":{"kind":["bin"],"name":"probe"},"executable":"/t/debug/probe"}
{"reason":"compiler-artifact","package_id":"serde 1.0.0 (registry+https://github.com/rust-lang/crates.io-index)","target":{"kind":["lib"],"name":"serde"},"executable":null}
{"reason":"build-finished","success":true}"#;
        let a = parse_artifacts(json);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].0, "probe-tests");
        assert_eq!(a[0].1, "ipvs");
        assert_eq!(a[0].3, PathBuf::from("/t/debug/deps/ipvs-1"));
        assert_eq!(a[1].0, "probe-user");
        assert_eq!(a[1].1, "probe");
    }

    /// `cargo build --bins --tests` names the agent twice: its unit-test harness (profile test)
    /// and the binary. The guests once ran the harness as the agent ("Unrecognized option").
    #[test]
    fn the_agent_is_the_binary_not_its_test_harness() {
        let json = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/probe-user#0.1.0","target":{"kind":["bin"],"name":"probe"},"profile":{"test":true},"executable":"/t/debug/deps/probe-9"}
{"reason":"compiler-artifact","package_id":"path+file:///w/probe-user#0.1.0","target":{"kind":["bin"],"name":"probe"},"profile":{"test":false},"executable":"/t/debug/probe"}"#;
        let built = parse_artifacts(json);
        assert_eq!(built.len(), 2);
        assert_eq!(
            probe_binary(&built, "").unwrap(),
            PathBuf::from("/t/debug/probe")
        );
        assert!(
            probe_binary(&built[..1], "").is_err(),
            "a harness alone is no agent"
        );
    }
}
