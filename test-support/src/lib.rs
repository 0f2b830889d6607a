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

/// The environment variable that stretches every test deadline ([`patient`]).
pub const PATIENCE_ENV: &str = "CLB_TEST_PATIENCE";

/// How many times longer a deadline is allowed to be on this machine: `CLB_TEST_PATIENCE`
/// (a number >= 1; 1 when unset or unreadable). The VM tier sets it for its guests, whose
/// emulated CPU runs the same code 10-24x slower than the host (BENCHMARKS 9h) and slower still
/// beside the host tests.
fn patience() -> f64 {
    patience_from(std::env::var(PATIENCE_ENV).ok().as_deref())
}

/// [`patience`] from the variable's value: never below 1 (a wait is never cut short).
fn patience_from(value: Option<&str>) -> f64 {
    value
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f >= 1.0)
        .unwrap_or(1.0)
}

/// `deadline` stretched by [`patience`]. For the waits that end as soon as what they wait for
/// happens (an event, a log line, a server listening), so a slow machine only waits longer and
/// never changes a verdict. Not for the quiet windows a healthy twin is watched through
/// (`assert_reports_nothing_after`): those are the scenario's length, not an upper bound, and a
/// slower machine would only make them cost more.
pub fn patient(deadline: std::time::Duration) -> std::time::Duration {
    deadline.mul_f64(patience())
}

#[cfg(test)]
mod tests {
    use super::patience_from;

    #[test]
    fn patience_stretches_and_never_shortens() {
        assert_eq!(patience_from(None), 1.0);
        assert_eq!(patience_from(Some("6")), 6.0);
        assert_eq!(patience_from(Some(" 2.5\n")), 2.5);
        for shorter_or_garbage in ["0.5", "0", "-3", "inf", "NaN", "six", ""] {
            assert_eq!(
                patience_from(Some(shorter_or_garbage)),
                1.0,
                "{shorter_or_garbage}"
            );
        }
    }
}
