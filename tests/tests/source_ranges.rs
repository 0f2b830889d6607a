//! Issue #51 shape 1: `loadBalancerSourceRanges` drops in-cluster callers. In the lab's
//! nftables mode kube-proxy's firewall for `default/web`'s LB IP (`firewall-ips`, its chain's
//! `ip saddr != { ranges } drop`, in prerouting before DNAT: kubernetes PR #122614) drops
//! pod-a's call when the ranges leave the pod out, and the agent confirms
//! `source_ranges_drop` naming the Service, the ranges and the pod; with the pod CIDR in the
//! ranges (the twin) the call is answered and nothing is reported.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{net::SocketAddrV4, time::Duration};

use probe_contract::LoopbackKind;
use probe_tests::agent::{
    Agent, assert_contains, assert_pod_a_call_dropped_by_netfilter,
    assert_pod_a_outside_the_ranges, lines,
};
use test_support::lab::{self, LabGuard, Outcome, source_ranges};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);
/// Ranges that leave the lab's pods (198.19.1.0/24) and node out.
const OUTSIDE: &[&str] = &["192.0.2.0/24", "198.51.100.0/24"];

/// The nftables-mode lab, the LB IP short-circuited (`ipMode: VIP`, the default), or None
/// where `test` cannot run (not root: it says it skips).
fn lab_for(test: &str) -> Option<LabGuard> {
    LabGuard::for_test_nftables(test)
}

fn to_lb() -> SocketAddrV4 {
    SocketAddrV4::new(lab::VIP, lab::SERVICE_PORT)
}

#[test]
fn source_ranges_drop_of_a_pods_call_is_confirmed_with_the_ranges() {
    let Some(lab) = lab_for("source_ranges_drop") else {
        return;
    };
    source_ranges::set_source_ranges(Some(OUTSIDE)).unwrap();
    assert!(source_ranges::firewalled());
    let agent = Agent::on_node_nic_with_table(&[]);
    let pod = lab.connect(lab::NS_POD_A, None, to_lb()).unwrap();
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::SourceRangesDrop, WAIT);
    assert_pod_a_call_dropped_by_netfilter(&e, lab::SERVICE_PORT, "default/web");
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        "map firewall-ips has the element 203.0.113.10 . tcp . 80 of default/web:http, \
             whose chain drops every \
             new connection from a source outside { 192.0.2.0/24, 198.51.100.0/24 }",
    );
    assert_pod_a_outside_the_ranges(
        &e,
        &["kubernetes#109575", "cluster DNS name or its ClusterIP"],
    );
    // The node's own call dies the same way, in filter-output (confirmed from the node in
    // etp_local_host_caller.rs).
    let node = lab.connect(lab::NS_NODE, None, to_lb()).unwrap();
    assert_eq!(node.outcome, Outcome::Timeout, "{node:?}");
    source_ranges::set_source_ranges(None).unwrap();
    drop(lab);
}

/// The twin: the pod CIDR among the ranges (upstream's advice): the call passes the firewall,
/// is short-circuited to pod-b and answered; nothing is reported.
#[test]
fn source_ranges_with_the_pod_cidr_report_nothing() {
    let Some(lab) = lab_for("source_ranges_twin") else {
        return;
    };
    source_ranges::set_source_ranges(Some(&["192.0.2.0/24", lab::POD_CIDR])).unwrap();
    assert!(source_ranges::firewalled());
    let agent = Agent::on_node_nic_with_table(&[]);
    let pod = lab.connect(lab::NS_POD_A, None, to_lb()).unwrap();
    assert_eq!(pod.outcome, Outcome::Ok, "{pod:?}");
    agent.assert_reports_nothing_after(SETTLE);
    source_ranges::set_source_ranges(None).unwrap();
    drop(lab);
}
