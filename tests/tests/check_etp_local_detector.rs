//! Issue #51 shape 2 before it fails: `probe check` on the lab node in iptables mode names the
//! ETP Local LB IP (`default/web-local`, LB IP:8445, no local endpoint) whose pod calls
//! kube-proxy drops because its local-traffic detector misses the node's pod range, naming the
//! detector and the range; the twin (a detector covering the pods) names nothing.
//!
//! Root only (prints a skip line otherwise). One at a time: they share the lab.

use probe_contract::check::Kind;
use probe_tests::{
    agent::lines,
    lab_check::{lab_node_report, only_risk},
};
use test_support::lab::{self, LabGuard, etp_local};

#[test]
fn a_detector_that_misses_the_pods_is_named_before_a_call_and_its_twin_is_not() {
    let Some(lab) =
        LabGuard::for_test_iptables_lb_ip_unbound("probe check: iptables detector miss")
    else {
        return;
    };
    let subject = format!("{}:{}/tcp", lab::VIP, lab::VIP_NFT_ETP_LOCAL_PORT);
    // kube-proxy's ClusterCIDR detector holding only the peer node's pool: pod-a's range missed.
    let detector = format!("-s {}", lab::PEER_POD_CIDR);
    etp_local::set_web_local(Some(&detector)).expect("default/web-local's rules");
    let json = lab_node_report();
    let f = only_risk(&json, Kind::EtpLocalDrop, &subject);
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
    let twin = lab_node_report();
    assert!(
        twin.findings.iter().all(|f| f.kind != Kind::EtpLocalDrop),
        "{twin:#?}"
    );
    drop(lab);
}
