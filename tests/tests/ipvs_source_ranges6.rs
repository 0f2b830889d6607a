//! Issue #51 shape 1 over IPv6 in kube-proxy's IPVS mode, on real IPVS (the VM tier): the
//! IPv6 proxier's source-range ipsets (`KUBE-6-LOAD-BALANCER-FW`, and
//! `KUBE-6-LOAD-BALANCER-SOURCE-CID`: `KUBE-6-` for `KUBE-`, cut to ipset's 31 characters,
//! kubernetes `pkg/proxy/ipvs/ipset.go` `NewIPSet`) and its ip6tables filter chains
//! (`KUBE-PROXY-FIREWALL` -> `KUBE-SOURCE-RANGES-FIREWALL`, kubernetes PR #110628) for
//! `default/web`'s LB IP [VIP6]:80, bound on kube-ipvs0 and served by an IPv6 virtual service.
//! Pod-a's IPv6 call from outside the ranges dies in ip6tables' `INPUT`, before IPVS, and is
//! confirmed as `source_ranges_drop` naming the v6 sets; with the pod range listed (the twin)
//! it is returned, sent on by IPVS to pod-b, answered, and nothing is reported.
//!
//! Runs only inside `cargo xtask vm-test` (`CLB_VM` set; it prints a skip line elsewhere).

use std::{net::IpAddr, time::Duration};

use probe_contract::{LoopbackKind, check::Kind as CheckKind};
use probe_tests::{
    agent::{Agent, assert_ipvs_source_ranges_drop},
    lab_check::lab_node_subjects,
    say,
};
use test_support::lab::{
    self, KubeProxyMode, LabGuard, Outcome, UpOptions, Variants,
    source_ranges::{self, IpFamily},
    v6,
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(15);
/// Ranges that leave the lab's IPv6 pods (2001:db8:19::/48) and node out.
const OUTSIDE: &[&str] = &["2001:db8:51::/48"];

/// The IPVS-mode lab with its dual-stack layer, [VIP6]:80 served by IPVS, `default/web`'s
/// IPv6 firewall allowing `ranges`, and the agent on its node.
fn ipvs_lab6_with(ranges: &[&str]) -> (LabGuard, Agent) {
    let lab = LabGuard::up_in(
        KubeProxyMode::Ipvs,
        &Variants::default(),
        &UpOptions::default(),
    )
    .expect("IPVS-mode lab up");
    lab.add_ipv6().expect("dual-stack layer");
    lab.serve_vip6_by_ipvs().expect("[VIP6]:80 served by IPVS");
    source_ranges::set_ipvs_source_ranges_in(IpFamily::V6, Some(ranges))
        .expect("default/web's IPv6 IPVS-mode firewall");
    let agent = Agent::on_node_nic_with_table(&[]);
    (lab, agent)
}

/// Pod-a's IPv6 call to [VIP6]:80.
fn pod_a_call() -> lab::Attempt {
    v6::pod_a_call6(lab::SERVICE_PORT, Duration::from_secs(3)).unwrap()
}

#[test]
fn ipvs_mode_ipv6_source_ranges_drop_is_confirmed_with_the_v6_ipsets() {
    if !lab::require_vm("ipvs_mode_ipv6_source_ranges_drop") {
        return;
    }
    let (lab, agent) = ipvs_lab6_with(OUTSIDE);
    assert_eq!(
        lab_node_subjects(CheckKind::SourceRangesDrop),
        ["[2001:db8:113::10]:80/tcp"]
    );
    let pod = pod_a_call();
    say!("ipvs-vm: IPv6 source ranges without the pod range: client {pod:?}");
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::SourceRangesDrop, WAIT);
    let ev = assert_ipvs_source_ranges_drop(
        &e,
        IpAddr::V6(v6::POD_A_IP6),
        IpAddr::V6(v6::VIP6),
        &[
            "ip6tables, ipset",
            "ipset KUBE-6-LOAD-BALANCER-FW has 2001:db8:113::10,tcp:80",
            "KUBE-6-LOAD-BALANCER-SOURCE-CID (and KUBE-6-LOAD-BALANCER-SOURCE-IP)",
            "KUBE-SOURCE-RANGES-FIREWALL",
            "source outside { 2001:db8:51::/48 }",
            "the caller 2001:db8:19:1::10 is in none",
        ],
    );
    say!("ipvs-vm: IPv6 source ranges: confirmed source_ranges_drop ({ev})");
    source_ranges::set_ipvs_source_ranges_in(IpFamily::V6, None).unwrap();
    drop((agent, lab));
}

/// The twin: the pod range among the ranges: the call is returned by
/// `KUBE-SOURCE-RANGES-FIREWALL`, IPVS sends it to pod-b, it is answered; nothing is reported
/// and `probe check` names no risk.
#[test]
fn ipvs_mode_ipv6_source_ranges_with_the_pod_range_report_nothing() {
    if !lab::require_vm("ipvs_mode_ipv6_source_ranges_twin") {
        return;
    }
    let (lab, agent) = ipvs_lab6_with(&["2001:db8:51::/48", v6::POD_CIDR6]);
    assert!(lab_node_subjects(CheckKind::SourceRangesDrop).is_empty());
    let pod = pod_a_call();
    say!("ipvs-vm: IPv6 source ranges with the pod range (twin): client {pod:?}");
    assert_eq!(pod.outcome, Outcome::Ok, "{pod:?}");
    agent.assert_reports_nothing_after(SETTLE);
    source_ranges::set_ipvs_source_ranges_in(IpFamily::V6, None).unwrap();
    drop((agent, lab));
}
