//! Issue #51 shape 3 (the stale UDP conntrack black hole) in kube-proxy's IPVS mode, on real
//! IPVS (the VM tier): does it exist there? The lab node has kube-proxy's IPVS sysctls
//! (`net/ipv4/vs/conntrack=1`, `expire_nodest_conn=1`: kubernetes `pkg/proxy/ipvs/proxier.go`,
//! `NewProxier`) and the statsd Service as kube-proxy's IPVS mode makes it (a UDP virtual
//! service on the ClusterIP, bound on kube-ipvs0); pod A's sender keeps one source port.
//!
//! What the kernel does (`net/netfilter/ipvs/ip_vs_core.c`, `ip_vs_in_hook`): IPVS forwards
//! each packet by its own connection table, not by conntrack's NAT. A connection whose real
//! server is gone is expired under `expire_nodest_conn` (with its conntrack entry) and the
//! next datagram is scheduled afresh; a packet without an IPVS connection is scheduled whatever
//! conntrack holds for it (`ip_vs_update_conntrack` leaves a confirmed entry as it is). So
//! neither way into the black hole holds:
//! - the real server deleted and a new one added (kube-proxy deletes a UDP real server at
//!   once, `pkg/proxy/ipvs/graceful_termination.go`): the datagrams reach the new one;
//! - the sender started before the virtual service existed: its conntrack entry stays
//!   un-NATed, and the datagrams reach the endpoint anyway;
//! - the Service scaled to zero and back (kubernetes#139628's own sequence): kube-proxy keeps
//!   the virtual service with no real server (`pkg/proxy/ipvs/proxier.go`, `syncProxyRules`
//!   syncs every Service port's virtual service, endpoints or not; `syncEndpoint` deletes each
//!   gone real server, a UDP one at once), then adds the new endpoint's: the datagrams sent
//!   meanwhile reach nobody, and once it is back they reach the new endpoint.
//!
//! Each test fails if the datagrams stop reaching the current endpoint, or if the agent
//! reports `stale_udp_conntrack` (the un-NATed entry looks like iptables mode's shape).
//! Runs only inside `cargo xtask vm-test` (`CLB_VM` set; it prints a skip line elsewhere).

use std::time::Duration;

use probe_tests::{
    agent::{Agent, wait_for},
    say,
    stale_udp::stale_events,
};
use test_support::lab::{
    self, KubeProxyMode, LabGuard, UpOptions, Variants,
    stale_udp::{self, NEW_ENDPOINT_PORT, OLD_ENDPOINT_PORT, SENDER_PORT, STATSD_CLUSTER_IP},
};

const EVERY: Duration = Duration::from_millis(300);
/// How long the agent is watched once the datagrams reach the endpoint: four stale-UDP dumps
/// (every 5 s) and more, so an entry it took for stale would have been seen in two.
const QUIET: Duration = Duration::from_secs(22);
/// Datagrams arriving, on a slow guest.
const ARRIVE: Duration = Duration::from_secs(20);
/// Each half of the time the Service stays at zero under the sender: one stale-UDP dump and
/// more each.
const ZERO: Duration = Duration::from_secs(6);

/// The IPVS-mode lab with the agent on its node.
fn ipvs_lab_and_agent() -> (LabGuard, Agent) {
    let lab = LabGuard::up_in(
        KubeProxyMode::Ipvs,
        &Variants::default(),
        &UpOptions::default(),
    )
    .expect("IPVS-mode lab up");
    let agent = Agent::on_node_nic_with_table(&[]);
    (lab, agent)
}

/// The IPVS-mode lab and its agent, the statsd Service served and the sender's datagrams
/// reaching its first real server.
fn sending_to_the_first_real_server() -> (LabGuard, Agent, stale_udp::Sender) {
    let (lab, agent) = ipvs_lab_and_agent();
    stale_udp::serve_statsd().expect("the statsd Service and its sink");
    let sender = stale_udp::Sender::start(SENDER_PORT, EVERY).expect("sender");
    wait_delivered(OLD_ENDPOINT_PORT, 0);
    show("on the first real server");
    (lab, agent, sender)
}

/// Waits until pod B has received more than `than` datagrams on `port`; the count then.
fn wait_delivered(port: u16, than: u64) -> u64 {
    wait_for("datagrams at pod B", ARRIVE, || {
        stale_udp::delivered(port).ok().filter(|n| *n > than)
    })
    .unwrap_or_else(|| {
        panic!(
            "no datagram reached pod B:{port} (still {than}); IPVS: {:?}; conntrack: {:?}",
            stale_udp::ipvs_connections(),
            stale_udp::entries()
        )
    })
}

/// What the node holds for the sender: its conntrack entries and IPVS connections.
fn show(step: &str) {
    say!(
        "ipvs-stale-udp: {step}: conntrack -L:\n{}ipvsadm -Lnc:\n{}",
        stale_udp::entries().unwrap_or_default(),
        stale_udp::ipvs_connections().unwrap_or_default()
    );
}

/// After `QUIET`, pod B's `port` received more datagrams than `before` (the sender's reach
/// the current endpoint), and the agent reported no `stale_udp_conntrack`.
fn delivered_and_unreported(agent: &Agent, port: u16, before: u64) {
    std::thread::sleep(QUIET);
    let after = stale_udp::delivered(port).unwrap();
    say!("ipvs-stale-udp: pod B:{port} received {before} -> {after} datagrams");
    // More than a third of what the sender sent meanwhile: not one stray datagram.
    let sent = (QUIET.as_millis() / EVERY.as_millis()) as u64;
    assert!(after - before > sent / 3, "{before} -> {after} of {sent}");
    let stale = stale_events(agent);
    assert!(stale.is_empty(), "{stale:#?}");
}

/// Path (a): kube-proxy moves the Service's endpoint (new real server added, the old deleted
/// at once); the sender's next datagrams reach the new endpoint and none the old one; nothing
/// is reported.
#[test]
fn ipvs_mode_a_fixed_port_udp_sender_follows_the_real_server_change_and_nothing_is_reported() {
    if !lab::require_vm("ipvs_mode_stale_udp_real_server_change") {
        return;
    }
    say!(
        "ipvs-stale-udp: kernel {}",
        probe_tests::agent::sh(&["uname", "-r"]).trim()
    );
    let (lab, agent, sender) = sending_to_the_first_real_server();
    stale_udp::move_endpoint().expect("move the endpoint");
    let first_new = wait_delivered(NEW_ENDPOINT_PORT, 0);
    let old_then = stale_udp::delivered(OLD_ENDPOINT_PORT).unwrap();
    show("after the move");
    delivered_and_unreported(&agent, NEW_ENDPOINT_PORT, first_new);
    let old_now = stale_udp::delivered(OLD_ENDPOINT_PORT).unwrap();
    assert_eq!(
        old_then, old_now,
        "the deleted real server still gets datagrams"
    );
    drop((sender, agent, lab));
}

/// Path (b): the sender starts before the virtual service exists (its conntrack entry has no
/// NAT), then kube-proxy makes it; the entry stays un-NATed and UNREPLIED, refreshed by every
/// datagram, yet the datagrams reach the endpoint (IPVS schedules them); nothing is reported.
#[test]
fn ipvs_mode_a_sender_started_before_the_virtual_service_reaches_it_and_nothing_is_reported() {
    if !lab::require_vm("ipvs_mode_stale_udp_before_the_service") {
        return;
    }
    let (lab, agent) = ipvs_lab_and_agent();
    stale_udp::start_sink().expect("pod B's sink");
    let sender = stale_udp::Sender::start(SENDER_PORT, EVERY).expect("sender");
    // The reply tuple still names the ClusterIP: no NAT.
    let un_nated = format!("[UNREPLIED] src={STATSD_CLUSTER_IP} ");
    let entry = wait_for("the un-NATed entry", ARRIVE, || {
        stale_udp::entries().ok().filter(|e| e.contains(&un_nated))
    });
    assert!(entry.is_some(), "{:?}", stale_udp::entries());
    show("before the virtual service");
    stale_udp::write_service().expect("the statsd virtual service");
    let first = wait_delivered(OLD_ENDPOINT_PORT, 0);
    show("after the virtual service");
    delivered_and_unreported(&agent, OLD_ENDPOINT_PORT, first);
    // The shape's precondition held throughout: the same un-NATed entry carried them.
    let entries = stale_udp::entries().unwrap();
    assert!(entries.contains(&un_nated), "{entries}");
    drop((sender, agent, lab));
}

/// Path (c), kubernetes#139628's sequence: the Service scaled to zero under the sender (the
/// virtual service kept with no real server, as kube-proxy leaves it), then back up with a new
/// endpoint (pod B:8126 added as the real server). While at zero no datagram reaches pod B;
/// once back, the sender's next datagrams reach the new endpoint whatever conntrack kept from
/// before; nothing is reported. Were IPVS to keep following a stale entry, no datagram would
/// reach 8126 and the test fails.
#[test]
fn ipvs_mode_a_udp_service_scaled_to_zero_and_back_reaches_the_new_endpoint_and_nothing_is_reported()
 {
    if !lab::require_vm("ipvs_mode_stale_udp_scaled_to_zero_and_back") {
        return;
    }
    let (lab, agent, sender) = sending_to_the_first_real_server();
    stale_udp::scale_to_zero().expect("scale the Service to zero");
    // The sender goes on against the virtual service with no real server: a dump's period and
    // more, so whatever the first datagrams after the delete do has happened.
    std::thread::sleep(ZERO);
    let at_zero = stale_udp::delivered(OLD_ENDPOINT_PORT).unwrap();
    show("scaled to zero");
    std::thread::sleep(ZERO);
    assert_eq!(
        stale_udp::delivered(OLD_ENDPOINT_PORT).unwrap(),
        at_zero,
        "the deleted real server still gets datagrams"
    );
    assert_eq!(stale_udp::delivered(NEW_ENDPOINT_PORT).unwrap(), 0);
    stale_udp::scale_back_up_ipvs().expect("scale the Service back up");
    let first_new = wait_delivered(NEW_ENDPOINT_PORT, 0);
    show("scaled back up");
    delivered_and_unreported(&agent, NEW_ENDPOINT_PORT, first_new);
    assert_eq!(
        stale_udp::delivered(OLD_ENDPOINT_PORT).unwrap(),
        at_zero,
        "the deleted real server got datagrams after the scale-up"
    );
    drop((sender, agent, lab));
}
