//! Issue #51 shape 1 over IPv6 in kube-proxy's nftables mode: the dual-stack layer's
//! `ip6 kube-proxy` table (`lab::nft6`, as kube-proxy's IPv6 proxier writes it) with
//! `default/web`'s firewall for [VIP6]:80 (`firewall-ips`, its chain's `ip6 saddr != { ranges }
//! drop`, `firewall-check` in prerouting before DNAT). pod-a's IPv6 call from outside the
//! ranges dies there and is confirmed `source_ranges_drop` naming the Service, the ranges and
//! the pod; the twin (the pod range listed) is short-circuited to pod-b, answered, and nothing
//! is reported.
//!
//! Root only (prints a skip line otherwise). One at a time: it shares the lab.

use std::{net::IpAddr, time::Duration};

use probe_contract::{LoopbackKind, Outcome as EventOutcome, facts::ProxyMode};
use probe_tests::agent::{Agent, lines};
use test_support::lab::{
    self, KubeProxyMode, LabGuard, Outcome,
    source_ranges::{self, IpFamily},
    v6,
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);
/// A range that leaves the lab's pods (2001:db8:19::/48) and node out.
const OUTSIDE: &str = "2001:db8:51::/48";

/// pod-a's IPv6 call to [VIP6]:80.
fn call() -> lab::Attempt {
    v6::pod_a_call6(lab::SERVICE_PORT, Duration::from_secs(2)).unwrap()
}

#[test]
fn ipv6_nftables_source_ranges_drop_is_confirmed_and_its_twin_is_silent() {
    let Some(lab) =
        LabGuard::for_test_dual_stack("ipv6_nftables_source_ranges_drop", KubeProxyMode::Nftables)
    else {
        return;
    };
    source_ranges::set_source_ranges_in(IpFamily::V6, Some(&[OUTSIDE])).unwrap();
    assert!(source_ranges::firewalled_in(IpFamily::V6));
    let agent = Agent::on_node_nic_with_table(&[]);
    let pod = call();
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::SourceRangesDrop, WAIT);
    assert_eq!(e.src, IpAddr::V6(v6::POD_A_IP6));
    assert_eq!(e.vip, Some(IpAddr::V6(v6::VIP6)));
    assert_eq!(e.vip_port, Some(lab::SERVICE_PORT));
    assert_eq!(e.outcome, EventOutcome::Dropped);
    assert_eq!(e.service.as_deref(), Some("default/web"));
    assert_eq!(e.facts.proxy_mode, Some(ProxyMode::Nftables));
    let ev = lines(&e.evidence);
    assert!(
        ev.contains(
            "kube-proxy's nftables rules (table ip6 kube-proxy): map firewall-ips has the \
             element 2001:db8:113::10 . tcp . 80 of default/web:http, whose chain drops every \
             new connection from a source outside { 2001:db8:51::/48 } (ip6 saddr"
        ),
        "{ev}"
    );
    assert!(
        ev.contains("the caller 2001:db8:19:1::10 is in none"),
        "{ev}"
    );
    let remedy = lines(&e.remedy);
    for needle in [
        "Service default/web sets loadBalancerSourceRanges (2001:db8:51::/48)",
        "the pod 2001:db8:19:1::10",
        "add the pod CIDR",
    ] {
        assert!(remedy.contains(needle), "{needle}: {remedy}");
    }
    drop(agent);

    // The twin, in the same lab: the pod range listed, a fresh agent.
    source_ranges::set_source_ranges_in(IpFamily::V6, Some(&[OUTSIDE, v6::POD_CIDR6])).unwrap();
    let agent = Agent::on_node_nic_with_table(&[]);
    let pod = call();
    assert_eq!(pod.outcome, Outcome::Ok, "{pod:?}");
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}
