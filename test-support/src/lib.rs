//! What the product's tests and xtask's commands share, apart from the build tool: the
//! network-namespace lab ([`lab`]: the node, the LB, the pods, kube-proxy-shaped rules and the
//! scenarios), the in-process fake Kubernetes API ([`kubeapi`]) and where `cargo xtask setup`
//! put the tools they run ([`tools`]). xtask keeps the commands (setup, demo, test, vm-test,
//! bench, chaos, image) and drives these; the tests (`tests/`, probe-user's unit tests) import
//! these and not xtask.
//!
//! The agent launcher the integration tests use stays in `tests/src/agent.rs`: it panics with
//! the agent's log (a test's way to fail) and reads the `--events`/`--record` files, while
//! xtask's demo (stdout streamed to the terminal, the fake API's kubeconfig), bench (each
//! stdout line stamped with a monotonic time, in the bench's own namespaces) and chaos
//! (capability sets under `setpriv`) each start the agent with a shape of their own and return
//! errors. One launcher for all four is a change of its own, not part of this move.

pub mod kubeapi;
pub mod lab;
pub mod tools;

/// Runs `cmd` to its end and returns its output; panics with `what` and the command's stderr
/// when it cannot start or exits unsuccessfully (a test's way to fail).
pub fn run_ok(cmd: &mut std::process::Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Panics unless `haystack` contains `needle`, showing the haystack.
#[track_caller]
pub fn assert_contains(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "{needle:?} is missing from:\n{haystack}"
    );
}

/// The workspace root (test-support is one of its members).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support lives in the workspace")
        .to_path_buf()
}
