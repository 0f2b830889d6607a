//! Helpers for the root-only integration tests in `tests/tests/`: running the real agent in
//! the lab and reading what it wrote, and observing the kernel independently (bpftool).
//! The lab and the fake Kubernetes API are the test-support crate's (`test_support::lab`,
//! `test_support::kubeapi`). The agent launcher ([`agent`]) is the tests' own: it fails a test
//! by panicking with the agent's log, which xtask's commands, which start the agent in shapes
//! of their own and return errors, do not want (test-support's crate doc says more). Run
//! through `cargo xtask test` (one test at a time: the tests share the lab's fixed namespaces).

/// A line on the test's real stdout, not libtest's capture: the VM tier's tests show what
/// they saw (each kernel's `ipvsadm -Ln`, each verdict) also when they pass.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

pub mod agent;
pub mod capture;
pub mod cluster_objects;
pub mod kernel_view;
pub mod kube_fixture;
pub mod kube_names;
pub mod lab_check;
pub mod otlp;
pub mod readiness;
pub mod stale_udp;
pub mod trafgen;
pub mod written;
