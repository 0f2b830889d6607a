//! One compilation per target and profile for every step that runs the workspace's code.
//!
//! Cargo unifies features over the packages one command selects, so `cargo build -p
//! probe-user`, `cargo test -p probe-tests` and `cargo test` (the default members) each built
//! probe-user, kube, tonic and OpenTelemetry again with their own feature set (measured: `cargo
//! build -p probe-user` after `cargo test --workspace --no-run` recompiled 13 crates in 35 s,
//! probe-user among them). Every host step (tests, the agent the tests start, the VM suite, the
//! chaos and bench smokes, the demo) now names the same selection, [`WORKSPACE`], so the first
//! build ([`host`]) leaves all the others nothing to compile. The arm64 steps share
//! [`ARM64_SELECTION`] the same way.

use std::{path::Path, process::Command};

/// The host selection: every member but the eBPF crate (built for its own target by
/// probe-user's build script).
pub const WORKSPACE: &[&str] = &["--workspace", "--exclude", "probe-ebpf"];

/// The arm64 agent's Rust target.
pub const ARM64: &str = "aarch64-unknown-linux-gnu";

/// The arm64 selection: the agent and the test files the arm64 VM run uses (xtask comes in as
/// probe-tests' dependency). probe-common's arm64 unit tests are their own `cargo test -p
/// probe-common`: a crate with no dependencies, so its own selection costs nothing.
pub const ARM64_SELECTION: &[&str] = &[
    "-p",
    "probe-common",
    "-p",
    "probe-user",
    "-p",
    "probe-tests",
];

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
pub fn host(root: &Path) -> anyhow::Result<Vec<crate::vm::suite::Artifact>> {
    let mut args = vec!["build"];
    args.extend(WORKSPACE);
    // Not `--all-targets`: that would add benches, built with the release profile.
    args.extend(["--lib", "--bins", "--tests", "--examples"]);
    crate::vm::suite::artifacts(root, &args)
}

/// The arm64 artifacts in one build: the agent (the image test's and the arm64 VM run's) and
/// the integration test executables the arm64 VM run starts.
pub fn arm64(root: &Path) -> anyhow::Result<Vec<crate::vm::suite::Artifact>> {
    let mut args = vec!["build"];
    args.extend(ARM64_SELECTION);
    args.extend(["--bin", "probe"]);
    for t in crate::vm::arm64::TEST_FILES {
        args.extend(["--test", t]);
    }
    args.extend(["--target", ARM64]);
    crate::vm::suite::artifacts(root, &args)
}
