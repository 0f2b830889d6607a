//! Issue #51 shape 2 over IPv6: kube-proxy drops a pod's IPv6 call to an
//! externalTrafficPolicy Local LB IP ([VIP6]:8445, `default/web-local`) on a node without a
//! local endpoint. nftables mode: the dual-stack layer's `ip6 kube-proxy` table
//! (`lab::nft6`) with the LB IP:port a `drop` element of `no-endpoint-services` and no
//! local-traffic detector; the twin has pod-b as a local endpoint. iptables mode: the same
//! rules as `etp_local_iptables.rs` in `ip6tables`, a detector (`-s <range>`) that misses
//! pod-a's IPv6 address; the twin's detector matches it. Each drop is confirmed
//! `etp_local_drop`, each twin answered with nothing reported.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{net::IpAddr, time::Duration};

use probe_contract::{LoopbackEvent, LoopbackKind, Outcome as EventOutcome, facts::ProxyMode};
use probe_tests::agent::{Agent, assert_contains, lines};
use test_support::lab::{
    self, KubeProxyMode, LabGuard, Outcome, etp_local, nft6, source_ranges::IpFamily, v6,
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);

/// pod-a's IPv6 call to [VIP6]:8445.
fn call() -> lab::Attempt {
    v6::pod_a_call6(lab::VIP_NFT_ETP_LOCAL_PORT, Duration::from_secs(2)).unwrap()
}

/// A fresh agent on the node (reading the rules as they are now), then pod-a's call, which
/// must end `expected`.
fn agent_then_call(expected: Outcome) -> Agent {
    let agent = Agent::on_node_nic_with_table(&[]);
    let pod = call();
    assert_eq!(pod.outcome, expected, "{pod:?}");
    agent
}

/// What both modes' confirmations say of the call.
fn assert_pod_a_ipv6_call_dropped(e: &LoopbackEvent, mode: ProxyMode) {
    assert_eq!(e.src, IpAddr::V6(v6::POD_A_IP6));
    assert_eq!(e.vip, Some(IpAddr::V6(v6::VIP6)));
    assert_eq!(e.vip_port, Some(lab::VIP_NFT_ETP_LOCAL_PORT));
    assert_eq!(e.outcome, EventOutcome::Dropped);
    assert_eq!(e.service.as_deref(), Some("default/web-local"));
    assert_eq!(e.facts.proxy_mode, Some(mode));
}

#[test]
fn ipv6_nftables_no_endpoint_drop_is_confirmed_and_its_twin_is_silent() {
    let Some(lab) =
        LabGuard::for_test_dual_stack("ipv6_nftables_etp_local_drop", KubeProxyMode::Nftables)
    else {
        return;
    };
    nft6::set_web_local6(false).unwrap();
    assert!(nft6::web_local6_dropped());
    let agent = agent_then_call(Outcome::Timeout);
    let e = agent.only_event(LoopbackKind::EtpLocalDrop, WAIT);
    assert_pod_a_ipv6_call_dropped(&e, ProxyMode::Nftables);
    assert_contains(
        &lines(&e.evidence),
        "kube-proxy's nftables rules (table ip6 kube-proxy): map no-endpoint-services has the \
         element 2001:db8:113::10 . tcp . 8445 comment \"default/web-local:http\" : drop",
    );
    drop(agent);

    // The twin: pod-b is a local endpoint, no drop element; a fresh agent.
    nft6::set_web_local6(true).unwrap();
    assert!(!nft6::web_local6_dropped());
    let agent = agent_then_call(Outcome::Ok);
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}

#[test]
fn ipv6_iptables_detector_miss_is_confirmed_and_its_twin_is_silent() {
    let Some(lab) =
        LabGuard::for_test_iptables_lb_ip_unbound("ipv6_iptables_etp_local_detector_miss")
    else {
        return;
    };
    lab.add_ipv6().expect("dual-stack layer");
    // A second pod pool's range (kubernetes#112820): pod-a (2001:db8:19:1::10) is outside it.
    let detector = "-s 2001:db8:19:2::/64";
    etp_local::set_web_local_in(IpFamily::V6, Some(detector)).unwrap();
    let agent = agent_then_call(Outcome::Timeout);
    let e = agent.only_event(LoopbackKind::EtpLocalDrop, WAIT);
    assert_pod_a_ipv6_call_dropped(&e, ProxyMode::Iptables);
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        "kube-proxy's iptables rules (ip6tables, table filter): chain KUBE-EXTERNAL-SERVICES \
         has -d 2001:db8:113::10/128 -p tcp --dport 8445 -m comment --comment \
         \"default/web-local:http has no local endpoints\" -j DROP",
    );
    assert_contains(
        &ev,
        &format!(
            "kube-proxy's local-traffic detector `{detector}` (chain {}",
            etp_local::WEB_LOCAL_EXT_CHAIN
        ),
    );
    assert_contains(&ev, "the pod 2001:db8:19:1::10 is outside it");
    assert_contains(
        &lines(&e.remedy),
        "--cluster-cidr must cover 2001:db8:19:1::10",
    );
    drop(agent);

    // The twin: the detector matches the lab's IPv6 pod range, the call is short-circuited to
    // pod-b and answered; a fresh agent.
    let detector = format!("-s {}", v6::POD_CIDR6);
    etp_local::set_web_local_in(IpFamily::V6, Some(&detector)).unwrap();
    let agent = agent_then_call(Outcome::Ok);
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}
