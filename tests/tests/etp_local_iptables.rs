//! Issue 51, shape 2: kube-proxy's iptables-mode drop of a pod's call to an
//! externalTrafficPolicy Local LB IP on a node without a local endpoint. On the real lab node
//! (iptables mode, any kernel) with kube-proxy's rules of `default/web-local`
//! (`lab::etp_local`): the filter chain `KUBE-EXTERNAL-SERVICES` drops the call unless the
//! Service's `KUBE-EXT-*` chain short-circuits the pod first, which it does only when
//! kube-proxy's local-traffic detector matches the pod. The agent confirms `etp_local_drop`
//! naming the iptables rule, and the detector the pod missed; the twin (the detector matches
//! the pod) is answered and reported as nothing.
//!
//! Root only (prints a skip line otherwise). One at a time: they share the lab.

use std::{net::SocketAddrV4, time::Duration};

use probe_contract::{LoopbackKind, facts::ProxyMode};
use probe_tests::agent::{
    Agent, assert_contains, assert_pod_a_call_dropped_by_netfilter, lines, require_root,
};
use test_support::lab::{self, LabGuard, Outcome, etp_local};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);

/// The lab in iptables mode with `default/web-local`'s rules (`detector`: the pod short
/// circuit's match, None: kube-proxy without a detector), the agent on its node (reading
/// the rules), and pod-a's call to the LB IP made; None where `test` cannot run (not root:
/// it says it skips).
fn called(test: &str, detector: Option<&str>) -> Option<(LabGuard, Agent, lab::Attempt)> {
    if !require_root(test) {
        return None;
    }
    let lab = LabGuard::up_iptables_lb_ip_unbound().expect("lab up (iptables mode, LB IP unbound)");
    etp_local::set_web_local(detector).expect("default/web-local's rules");
    let agent = Agent::on_node_nic_with_table(&[]);
    let to = SocketAddrV4::new(lab::VIP, lab::VIP_NFT_ETP_LOCAL_PORT);
    let pod = lab.connect(lab::NS_POD_A, None, to).unwrap();
    Some((lab, agent, pod))
}

/// What every confirmed case says: the call, the drop, the iptables rule (not nftables'),
/// and a remedy of iptables mode.
fn assert_iptables_drop(e: &probe_contract::LoopbackEvent) {
    assert_pod_a_call_dropped_by_netfilter(e, lab::VIP_NFT_ETP_LOCAL_PORT, "default/web-local");
    assert_eq!(e.facts.proxy_mode, Some(ProxyMode::Iptables));
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        "chain KUBE-EXTERNAL-SERVICES has -d 203.0.113.10/32 -p tcp --dport 8445 -m \
             comment --comment \"default/web-local:http has no local endpoints\" -j DROP",
    );
    assert!(!ev.contains("no-endpoint-services"), "{ev}");
    let remedy = lines(&e.remedy);
    assert_contains(
        &remedy,
        "in iptables mode its filter chain KUBE-EXTERNAL-SERVICES",
    );
    assert!(!remedy.contains("no-endpoint-services"), "{remedy}");
}

/// kube-proxy without a local-traffic detector (no "pod traffic for" rule): pod-a's call
/// dies in `FORWARD`'s `KUBE-EXTERNAL-SERVICES`, confirmed naming the rule and the missing
/// detector.
#[test]
fn iptables_external_services_drop_of_a_pods_call_is_confirmed_with_the_rule() {
    let Some((lab, agent, pod)) = called("iptables_etp_local_drop", None) else {
        return;
    };
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::EtpLocalDrop, WAIT);
    assert_iptables_drop(&e);
    let ev = lines(&e.evidence);
    assert_contains(&ev, "kube-proxy has no local-traffic detector");
    let remedy = lines(&e.remedy);
    assert_contains(&remedy, "Give kube-proxy a local-traffic detector");
    drop(lab);
}

/// The detector miss (kubernetes#112820): kube-proxy's detector is a CIDR (ClusterCIDR mode)
/// that leaves out pod-a's pool; the short circuit is there, pod-a is not matched, its call is
/// dropped and confirmed naming the detector and pod-a's address.
#[test]
fn iptables_detector_that_misses_the_pod_is_named_in_the_drop() {
    let detector = format!("-s {}", lab::PEER_POD_CIDR);
    let Some((lab, agent, pod)) = called("iptables_etp_local_detector_miss", Some(&detector))
    else {
        return;
    };
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::EtpLocalDrop, WAIT);
    assert_iptables_drop(&e);
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        &format!(
            "kube-proxy's local-traffic detector `{detector}` (chain {}",
            etp_local::WEB_LOCAL_EXT_CHAIN
        ),
    );
    assert_contains(&ev, &format!("the pod {} is outside it", lab::POD_A_IP));
    let remedy = lines(&e.remedy);
    assert_contains(
        &remedy,
        &format!(
            "Its detector here is `{detector}`, and it does not match the pod {}",
            lab::POD_A_IP
        ),
    );
    assert_contains(
        &remedy,
        &format!("--cluster-cidr must cover {}", lab::POD_A_IP),
    );
    assert_contains(&remedy, "1.33.6, 1.34.2 and 1.35");
    drop(lab);
}

/// The twin: the detector matches pod-a (the lab's cluster CIDR), the external chain sends
/// its call to the cluster-wide endpoints before the filter drop: answered, nothing reported.
#[test]
fn iptables_detector_that_matches_the_pod_short_circuits_it_and_reports_nothing() {
    let detector = format!("-s {}", lab::CLUSTER_CIDR);
    let Some((lab, agent, pod)) = called("iptables_etp_local_twin", Some(&detector)) else {
        return;
    };
    assert_eq!(pod.outcome, Outcome::Ok, "{pod:?}");
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}
