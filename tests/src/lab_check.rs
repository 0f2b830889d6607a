//! `probe check --json` run in the lab node, read as the contract's report: the lab tests that
//! ask what `probe check` names before (or after) a call read it through here.

use std::process::Command;

use probe_contract::check::{CheckReport, Finding, Kind, Severity};
use test_support::lab;

use crate::agent::probe_bin;

/// `probe check --json --nic <the node's NIC>` in the lab node (no API access: what the node's
/// rules, routes and sets hold). Its exit status says whether it found risks: only its JSON is
/// read.
pub fn lab_node_report() -> CheckReport {
    lab_node_check(&[]).1
}

/// `probe check --json --nic <the node's NIC> <more>` in the lab node (`more`: a
/// `--kubeconfig` for API access, say): its exit code and its report. Not a report fails the
/// test with its stdout and stderr.
pub fn lab_node_check(more: &[&str]) -> (i32, CheckReport) {
    let o = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(probe_bin())
        .args(["check", "--json", "--nic", lab::NODE_NIC])
        .args(more)
        .output()
        .expect("run probe check");
    let report = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not a check report ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.code().expect("exit code"), report)
}

/// The subjects of the lab node's `probe check` findings of `kind`, in the report's order.
pub fn lab_node_subjects(kind: Kind) -> Vec<String> {
    lab_node_report()
        .findings
        .into_iter()
        .filter(|f| f.kind == kind)
        .map(|f| f.subject)
        .collect()
}

/// The report's one finding of `kind`: asserts there is exactly one, a risk on `subject`.
pub fn only_risk<'a>(report: &'a CheckReport, kind: Kind, subject: &str) -> &'a Finding {
    let named: Vec<_> = report.findings.iter().filter(|f| f.kind == kind).collect();
    assert_eq!(named.len(), 1, "{report:#?}");
    let f = named[0];
    assert_eq!((f.severity, f.subject.as_str()), (Severity::Risk, subject));
    f
}
