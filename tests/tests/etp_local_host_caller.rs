//! Issue 51, shape 2's last piece: the node's own (host-network) call to an
//! externalTrafficPolicy Local LB IP on a node without a local endpoint. In kube-proxy's
//! nftables mode before kubernetes#132456 (1.34; 1.33.6 by #133969) `filter-output` checks
//! `no-endpoint-services` before `nat-output` DNATs, so the node's call dies at the output
//! hook, where the skb has no device yet: the drop program takes its namespace from the
//! sending socket, and the agent confirms `etp_local_drop` saying the caller is the node. The
//! twin (a local endpoint: no drop element) is answered and reported as nothing. In iptables
//! mode the node's call is not dropped (`KUBE-EXTERNAL-SERVICES` is jumped from `INPUT` and
//! `FORWARD` only, and the `KUBE-EXT-*` chain routes `--src-type LOCAL` traffic to the
//! cluster-wide endpoints): answered, nothing reported.
//!
//! The same socket-derived namespace reports the node's own call that kube-proxy's
//! `loadBalancerSourceRanges` firewall drops at the output hook (nftables `filter-output`'s
//! `firewall-check`, iptables `OUTPUT`'s `KUBE-PROXY-FIREWALL`): `source_ranges_drop` from the
//! node, checked here too (the pod's call and the twins are in source_ranges*.rs).
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{
    net::{IpAddr, SocketAddrV4},
    time::Duration,
};

use probe_contract::{LoopbackKind, Outcome as Fate, facts::SourceKind};
use probe_tests::agent::{Agent, assert_contains, lines};
use test_support::lab::{
    self, LabGuard, Outcome, etp_local,
    source_ranges::{self, IpFamily},
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);

/// `default/web-local`'s LB IP:port.
fn lb() -> SocketAddrV4 {
    SocketAddrV4::new(lab::VIP, lab::VIP_NFT_ETP_LOCAL_PORT)
}

/// The node's own call to `default/web-local`'s LB IP:port; asserts its outcome.
fn assert_nodes_call(lab: &LabGuard, expected: Outcome) {
    let node = lab.connect(lab::NS_NODE, None, lb()).unwrap();
    assert_eq!(node.outcome, expected, "{node:?}");
}

/// The nftables-mode lab with `default/web-local` written (`local_endpoint`: pod-b is its
/// endpoint, else only the other node's pod), the agent on its node.
fn nftables_lab(test: &str, local_endpoint: bool) -> Option<(LabGuard, Agent)> {
    let lab = LabGuard::for_test_nftables(test)?;
    lab.set_nft_web_local(local_endpoint).unwrap();
    let agent = Agent::on_node_nic_with_table(&[]);
    Some((lab, agent))
}

/// The node's own call dies in `filter-output` on the `no-endpoint-services` element: confirmed
/// as `etp_local_drop` from the node, the evidence naming the element and the host caller.
#[test]
fn nftables_no_endpoint_drop_of_the_nodes_own_call_is_confirmed_as_a_host_caller() {
    let Some((lab, agent)) = nftables_lab("nftables_host_caller_drop", false) else {
        return;
    };
    assert_nodes_call(&lab, Outcome::Timeout);
    let e = agent.only_event(LoopbackKind::EtpLocalDrop, WAIT);
    assert_eq!(e.src, IpAddr::V4(lab::NODE_IP));
    assert_eq!(e.facts.source, SourceKind::Node);
    assert_eq!(e.vip, Some(IpAddr::V4(lab::VIP)));
    assert_eq!(e.vip_port, Some(lab::VIP_NFT_ETP_LOCAL_PORT));
    assert_eq!(e.outcome, Fate::Dropped);
    assert_eq!(e.drop_reason.as_deref(), Some("NETFILTER_DROP"));
    assert_eq!(e.service.as_deref(), Some("default/web-local"));
    assert_eq!(e.nic, None);
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        &format!(
            "the caller is this node: {} is a node address and the packet came in on no \
             interface",
            lab::NODE_IP
        ),
    );
    assert_contains(
        &ev,
        "kube-proxy's filter-output checks no-endpoint-services before its nat-output DNAT",
    );
    assert_contains(
        &ev,
        "map no-endpoint-services has the element 203.0.113.10 . tcp . 8445 comment \
             \"default/web-local:http\" : drop",
    );
    let remedy = lines(&e.remedy);
    assert_contains(&remedy, "a host-network caller on this node called");
    assert_contains(&remedy, "kubernetes#132456");
    drop(lab);
}

/// The twin: with a local endpoint kube-proxy writes no drop element; the node's call is
/// short-circuited to the endpoint, answered, and nothing is reported.
#[test]
fn nftables_nodes_own_call_with_a_local_endpoint_is_answered_and_reports_nothing() {
    let Some((lab, agent)) = nftables_lab("nftables_host_caller_twin", true) else {
        return;
    };
    assert_nodes_call(&lab, Outcome::Ok);
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}

/// iptables mode: the same Service without a local endpoint or a detector still answers the
/// node's call (routed to the cluster-wide endpoints by `--src-type LOCAL`), nothing reported.
#[test]
fn iptables_nodes_own_call_is_not_dropped_and_reports_nothing() {
    let Some(lab) = LabGuard::for_test_iptables_lb_ip_unbound("iptables_host_caller") else {
        return;
    };
    etp_local::set_web_local(None).expect("default/web-local's rules");
    let agent = Agent::on_node_nic_with_table(&[]);
    assert_nodes_call(&lab, Outcome::Ok);
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}

/// Ranges that leave the lab's pods (198.19.1.0/24) and node (198.18.0.2) out.
const OUTSIDE: &[&str] = &["192.0.2.0/24", "198.51.100.0/24"];

/// What each mode's confirmation of the node's source-range drop says: the node as the caller.
fn assert_nodes_source_ranges_drop(agent: &Agent) {
    let e = agent.only_event(LoopbackKind::SourceRangesDrop, WAIT);
    assert_eq!(e.src, IpAddr::V4(lab::NODE_IP));
    assert_eq!(e.facts.source, SourceKind::Node);
    assert_eq!(e.vip, Some(IpAddr::V4(lab::VIP)));
    assert_eq!(e.vip_port, Some(lab::SERVICE_PORT));
    assert_eq!(e.drop_reason.as_deref(), Some("NETFILTER_DROP"));
    assert_eq!(e.nic, None);
    let remedy = lines(&e.remedy);
    assert_contains(
        &remedy,
        &format!("a host-network caller on this node ({})", lab::NODE_IP),
    );
}

/// nftables mode: `default/web`'s firewall leaves the node out; its call dies in
/// `filter-output` (`firewall-check`) and is confirmed from the node.
#[test]
fn nftables_source_ranges_drop_of_the_nodes_own_call_is_confirmed_from_the_node() {
    let Some(lab) = LabGuard::for_test_nftables("nftables_host_caller_ranges") else {
        return;
    };
    source_ranges::set_source_ranges(Some(OUTSIDE)).unwrap();
    let agent = Agent::on_node_nic_with_table(&[]);
    let to = SocketAddrV4::new(lab::VIP, lab::SERVICE_PORT);
    let node = lab.connect(lab::NS_NODE, None, to).unwrap();
    assert_eq!(node.outcome, Outcome::Timeout, "{node:?}");
    assert_nodes_source_ranges_drop(&agent);
    source_ranges::set_source_ranges(None).unwrap();
    drop(lab);
}

/// iptables mode: the node's call dies in `OUTPUT`'s `KUBE-PROXY-FIREWALL`, confirmed from the
/// node.
#[test]
fn iptables_source_ranges_drop_of_the_nodes_own_call_is_confirmed_from_the_node() {
    let Some(lab) = LabGuard::for_test_iptables_lb_ip_unbound("iptables_host_caller_ranges") else {
        return;
    };
    source_ranges::set_iptables_source_ranges(IpFamily::V4, Some(OUTSIDE))
        .expect("default/web's firewall");
    let agent = Agent::on_node_nic_with_table(&[]);
    let to = SocketAddrV4::new(lab::VIP, lab::SERVICE_PORT);
    let node = lab.connect(lab::NS_NODE, None, to).unwrap();
    assert_eq!(node.outcome, Outcome::Timeout, "{node:?}");
    assert_nodes_source_ranges_drop(&agent);
    source_ranges::set_iptables_source_ranges(IpFamily::V4, None).unwrap();
    drop(lab);
}
