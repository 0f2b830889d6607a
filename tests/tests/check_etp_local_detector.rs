//! Issue #51 shape 2 before it fails: `probe check` on the lab node in iptables mode names the
//! ETP Local LB IP (`default/web-local`, LB IP:8445, no local endpoint) whose pod calls
//! kube-proxy drops because its local-traffic detector misses the node's pod range, naming the
//! detector and the range; the twin (a detector covering the pods) names nothing.
//!
//! Root only (prints a skip line otherwise). One at a time: they share the lab.

use std::process::Command;

use probe_contract::check::{CheckReport, Kind, Severity};
use probe_tests::agent::{lines, probe_bin, require_root};
use test_support::lab::{self, KubeProxyMode, LabGuard, Variants, etp_local};

/// `probe check --json` in the lab node (the node's pod routes give its pod range).
fn report() -> CheckReport {
    let o = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(probe_bin())
        .args(["check", "--json", "--nic", lab::NODE_NIC])
        .output()
        .expect("run probe check");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not the check report ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

#[test]
fn a_detector_that_misses_the_pods_is_named_before_a_call_and_its_twin_is_not() {
    if !require_root("probe check: iptables detector miss") {
        return;
    }
    let variants = Variants {
        vip_bound: false,
        ..Variants::default()
    };
    let lab = LabGuard::up_in(KubeProxyMode::Iptables, &variants, &Default::default())
        .expect("lab up (iptables mode)");
    lab.set_all(&variants).expect("the LB IP unbound");
    let subject = format!("{}:{}/tcp", lab::VIP, lab::VIP_NFT_ETP_LOCAL_PORT);
    // kube-proxy's ClusterCIDR detector holding only the peer node's pool: pod-a's range missed.
    let detector = format!("-s {}", lab::PEER_POD_CIDR);
    etp_local::set_web_local(Some(&detector)).expect("default/web-local's rules");
    let json = report();
    let risks: Vec<_> = json
        .findings
        .iter()
        .filter(|f| f.kind == Kind::EtpLocalDrop)
        .collect();
    assert_eq!(risks.len(), 1, "{json:#?}");
    let f = risks[0];
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Risk, subject.as_str())
    );
    assert!(
        f.summary.contains(&format!("`{detector}`")) && f.summary.contains("198.19.1."),
        "{f:#?}"
    );
    assert!(
        lines(&f.evidence).contains("filter chain KUBE-EXTERNAL-SERVICES has -d 203.0.113.10/32"),
        "{f:#?}"
    );
    assert!(lines(&f.remedy).contains("--cluster-cidr"), "{f:#?}");

    // The twin: the detector holds every pod of the node (the cluster CIDR).
    etp_local::set_web_local(Some(&format!("-s {}", lab::CLUSTER_CIDR))).unwrap();
    let twin = report();
    assert!(
        twin.findings.iter().all(|f| f.kind != Kind::EtpLocalDrop),
        "{twin:#?}"
    );
    drop(lab);
}
