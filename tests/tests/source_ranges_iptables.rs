//! Issue #51 shape 1 in kube-proxy's iptables mode: `loadBalancerSourceRanges` drops
//! in-cluster callers. kube-proxy's rules for `default/web`'s LB IP (`lab::source_ranges`,
//! kubernetes PR #110289): the nat chain `KUBE-FW-*` sends on only the ranges' sources, and
//! the filter chain `KUBE-PROXY-FIREWALL` drops the rest in `FORWARD`. The agent confirms
//! `source_ranges_drop` naming the iptables rule, the Service, the ranges and the pod; with the
//! pod CIDR in the ranges (the twin) the call is DNATed, answered, and nothing is reported.
//!
//! IPv6 too: the dual-stack lab's VIP6 with the same rules in `ip6tables`.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{
    net::{IpAddr, SocketAddrV4},
    time::Duration,
};

use probe_contract::{LoopbackKind, check::Kind, facts::ProxyMode};
use probe_tests::{
    agent::{
        Agent, assert_contains, assert_pod_a_call_dropped_by_netfilter,
        assert_pod_a_outside_the_ranges, lines, require_root,
    },
    lab_check::lab_node_subjects,
};
use test_support::lab::{
    self, LabGuard, Outcome,
    source_ranges::{self, IpFamily},
    v6,
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);
/// Ranges that leave the lab's pods (198.19.1.0/24) and node out.
const OUTSIDE: &[&str] = &["192.0.2.0/24", "198.51.100.0/24"];

/// The iptables-mode lab with `default/web`'s firewall allowing `ranges` (in `family`'s rules;
/// IPv6: the dual-stack layer added), its LB IP not bound (kube-proxy's iptables mode binds
/// none), and the agent on its node reading the rules.
fn lab_with(family: IpFamily, ranges: &[&str]) -> (LabGuard, Agent) {
    let lab = LabGuard::up_iptables_lb_ip_unbound().expect("lab up (iptables mode, LB IP unbound)");
    if family == IpFamily::V6 {
        lab.add_ipv6().expect("dual-stack layer");
    }
    source_ranges::set_iptables_source_ranges(family, Some(ranges))
        .expect("default/web's firewall");
    assert!(source_ranges::iptables_firewalled(family));
    let agent = Agent::on_node_nic_with_table(&[]);
    (lab, agent)
}

fn to_lb() -> SocketAddrV4 {
    SocketAddrV4::new(lab::VIP, lab::SERVICE_PORT)
}

#[test]
fn iptables_source_ranges_drop_of_a_pods_call_is_confirmed_with_the_rule() {
    if !require_root("iptables_source_ranges_drop") {
        return;
    }
    let (lab, agent) = lab_with(IpFamily::V4, OUTSIDE);
    // `probe check` names it before any call, from the rules alone.
    assert_eq!(
        lab_node_subjects(Kind::SourceRangesDrop),
        ["203.0.113.10:80/tcp"]
    );
    let pod = lab.connect(lab::NS_POD_A, None, to_lb()).unwrap();
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::SourceRangesDrop, WAIT);
    assert_pod_a_call_dropped_by_netfilter(&e, lab::SERVICE_PORT, "default/web");
    assert_eq!(e.facts.proxy_mode, Some(ProxyMode::Iptables));
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        &format!(
            "filter chain KUBE-PROXY-FIREWALL has -d 203.0.113.10/32 -p tcp --dport 80 -m \
             comment --comment \"default/web:http traffic not accepted by {fw}\" -j DROP",
            fw = source_ranges::IPT_FIREWALL_CHAIN
        ),
    );
    assert_contains(&ev, "source outside { 192.0.2.0/24, 198.51.100.0/24 }");
    assert!(!ev.contains("firewall-ips"), "{ev}");
    assert_pod_a_outside_the_ranges(&e, &["PR #110289"]);
    // The node's own call dies the same way, in OUTPUT (confirmed from the node in
    // etp_local_host_caller.rs).
    let node = lab.connect(lab::NS_NODE, None, to_lb()).unwrap();
    assert_eq!(node.outcome, Outcome::Timeout, "{node:?}");
    source_ranges::set_iptables_source_ranges(IpFamily::V4, None).unwrap();
    drop(lab);
}

/// The twin: the pod CIDR among the ranges (upstream's advice): `KUBE-FW-*` sends the call on
/// to `KUBE-EXT-*`, it is DNATed to pod-b and answered; nothing is reported.
#[test]
fn iptables_source_ranges_with_the_pod_cidr_report_nothing() {
    if !require_root("iptables_source_ranges_twin") {
        return;
    }
    let (lab, agent) = lab_with(IpFamily::V4, &["192.0.2.0/24", lab::POD_CIDR]);
    assert!(lab_node_subjects(Kind::SourceRangesDrop).is_empty());
    let pod = lab.connect(lab::NS_POD_A, None, to_lb()).unwrap();
    assert_eq!(pod.outcome, Outcome::Ok, "{pod:?}");
    agent.assert_reports_nothing_after(SETTLE);
    source_ranges::set_iptables_source_ranges(IpFamily::V4, None).unwrap();
    drop(lab);
}

/// IPv6: pod-a's call to [VIP6]:80 from outside the ranges dies in ip6tables' `FORWARD` and is
/// confirmed quoting the ip6tables rule; with the pod range listed it is answered, silent.
#[test]
fn ipv6_iptables_source_ranges_drop_is_confirmed_and_its_twin_is_silent() {
    if !require_root("ipv6_iptables_source_ranges_drop") {
        return;
    }
    let call = || v6::pod_a_call6(lab::SERVICE_PORT, Duration::from_secs(2)).unwrap();
    let (lab, agent) = lab_with(IpFamily::V6, &["2001:db8:51::/48"]);
    let pod = call();
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::SourceRangesDrop, WAIT);
    assert_eq!(e.src, IpAddr::V6(v6::POD_A_IP6));
    assert_eq!(e.vip, Some(IpAddr::V6(v6::VIP6)));
    assert_eq!(e.service.as_deref(), Some("default/web"));
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        "kube-proxy's iptables rules (ip6tables): filter chain KUBE-PROXY-FIREWALL has -d \
             2001:db8:113::10/128 -p tcp --dport 80",
    );
    assert_contains(&ev, "source outside { 2001:db8:51::/48 }");
    drop(agent);
    source_ranges::set_iptables_source_ranges(IpFamily::V6, None).unwrap();
    drop(lab);

    let (lab, agent) = lab_with(IpFamily::V6, &["2001:db8:51::/48", v6::POD_CIDR6]);
    let pod = call();
    assert_eq!(pod.outcome, Outcome::Ok, "{pod:?}");
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}
