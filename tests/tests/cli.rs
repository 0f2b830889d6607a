//! Bad input gets one clear line, the documented exit code, and nothing half-done.

use std::{
    net::TcpListener,
    process::{Command, Output},
};

use probe_tests::agent::{
    agent_on_node_nic_args, assert_nothing_attached, error_line, probe_bin, probe_command,
    require_root, stderr,
};
use test_support::lab::{self, LabGuard, Variants};

fn probe_in(netns: Option<&str>, args: &[&str]) -> Output {
    probe_command(netns, args)
        .env("CLB_PROBE_LOG", "warn")
        .output()
        .expect("run probe")
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["agent", "--bogus"][..],
        &["agent", "--pod-cidr", "10.0.0.0/33"],
        &["agent", "--metrics-addr", "not-an-address"],
        &["agent", "--log-format", "xml"],
        &["agent", "--node-report", "maybe"],
        &["agent", "--otlp-endpoint", "not a url"],
        &[
            "agent",
            "--otlp-endpoint",
            "http://127.0.0.1:4317",
            "--otlp-interval",
            "0",
        ],
        // The condition is written with the node report: alone it is refused.
        &["agent", "--node-condition", "on"],
        &["frobnicate"],
    ] {
        let o = probe_in(None, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("error:"), "{args:?}: {}", stderr(&o));
    }
}

/// `--otlp-endpoint` (and its env twin) is checked before anything starts: the flag and the
/// reason in the error, exit 2.
#[test]
fn a_bad_otlp_endpoint_is_named_before_anything_starts() {
    for (bad, reason) in [
        ("otel-collector:4317", "give http://HOST:PORT"),
        ("https://otel-collector:4317", "https is not supported"),
        ("http://", "not a URL"),
    ] {
        let o = probe_in(None, &["agent", "--otlp-endpoint", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        let first = stderr(&o).lines().next().unwrap_or_default().to_string();
        assert!(
            first.starts_with("error:")
                && first.contains("--otlp-endpoint")
                && first.contains(reason),
            "{bad}: {}",
            stderr(&o)
        );
        let o = Command::new(probe_bin())
            .arg("agent")
            .env("CLB_PROBE_OTLP_ENDPOINT", bad)
            .env("CLB_PROBE_LOG", "warn")
            .output()
            .expect("run probe");
        assert_eq!(o.status.code(), Some(2), "env {bad}: {}", stderr(&o));
        assert!(stderr(&o).contains(reason), "env {bad}: {}", stderr(&o));
    }
}

#[test]
fn unknown_interface_is_named_and_nothing_is_attached() {
    let Some(_lab) = LabGuard::for_test("unknown_interface", &Variants::default()) else {
        return;
    };
    let o = probe_in(
        Some(lab::NS_NODE),
        &[
            "agent",
            "--nic",
            "nosuch0",
            "--socket",
            "/tmp/clb-cli-test.sock",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let line = error_line(&o);
    assert!(line.contains("unknown interface \"nosuch0\""), "{line}");
    assert_nothing_attached();
}

#[test]
fn metrics_port_in_use_fails_before_anything_is_attached() {
    let Some(_lab) = LabGuard::for_test("port_in_use", &Variants::default()) else {
        return;
    };
    // Hold a port inside the node namespace from a thread that entered it.
    let ns = std::fs::File::open(format!("/run/netns/{}", lab::NS_NODE)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        // SAFETY: setns on this thread only.
        assert_eq!(
            unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
            0
        );
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        tx.send(l.local_addr().unwrap().port()).unwrap();
        let _ = done_rx.recv();
        drop(l);
    });
    let port = rx.recv().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let o = probe_in(
        Some(lab::NS_NODE),
        &agent_on_node_nic_args(&[
            "--metrics-addr",
            &addr,
            "--socket",
            "/tmp/clb-cli-test.sock",
        ]),
    );
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let line = error_line(&o);
    assert!(
        line.contains(&addr) && line.contains("cannot listen"),
        "{line}"
    );
    assert_nothing_attached();
}

#[test]
fn without_root_the_missing_capabilities_are_named() {
    if !require_root("without_root") {
        return;
    }
    // Drop to nobody with no capabilities.
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(probe_bin())
        .args(["agent", "--socket", "/tmp/clb-cli-test-nobody.sock"])
        .output()
        .expect("setpriv");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let line = error_line(&o);
    assert!(line.contains("missing capabilities"), "{line}");
    for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"] {
        assert!(line.contains(cap), "{cap} not named: {line}");
    }
    assert_nothing_attached();
}
