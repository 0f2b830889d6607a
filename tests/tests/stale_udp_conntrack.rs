//! Issue #51, shape 3: the stale UDP conntrack black hole (kubernetes#139628). On the real
//! lab node (real conntrack): pod A sends statsd-like datagrams from one fixed
//! source port to a ClusterIP DNATed to pod B:8125; kube-proxy-shaped rules then move the
//! Service's endpoint to pod B:8126 and nothing deletes the entry, so the datagrams keep
//! going to 8125, unanswered. The agent confirms `stale_udp_conntrack` naming the Service
//! and the stale endpoint. Silent twins: the entry while its endpoint is current; after the
//! remedy's own `conntrack -D` line (the next datagram takes the new rules); a sender whose
//! source port changes with each datagram.
//!
//! In kube-proxy's iptables mode and in its nftables mode (the same Service written into the
//! lab's `ip kube-proxy` table): the confirmation reads conntrack and the service table, so
//! both confirm it the same way. And the issue's own case in iptables mode: the Service
//! scaled to zero, named from kube-proxy's REJECT rule (no nat chain is left).
//!
//! Root only (prints a skip line otherwise). One at a time: they share the lab.

use std::{net::IpAddr, time::Duration};

use probe_contract::LoopbackEvent;
use probe_tests::{agent::Agent, stale_udp::stale_events};
use test_support::lab::{self, KubeProxyMode, LabGuard, Variants, stale_udp};

/// Two dumps (every 5 s) after the service table has the change, with room for a slow machine.
const WAIT: Duration = Duration::from_secs(40);
/// How long a silent twin is watched: three dumps and more.
const QUIET: Duration = Duration::from_secs(17);
const EVERY: Duration = Duration::from_millis(300);

#[test]
fn a_fixed_port_udp_sender_on_a_stale_dnat_is_confirmed_and_its_twins_are_silent() {
    in_lab_serving_statsd(KubeProxyMode::Iptables, confirmed_with_silent_twins);
}

#[test]
fn in_nftables_mode_a_fixed_port_udp_sender_on_a_stale_dnat_is_confirmed_and_its_twins_are_silent()
{
    in_lab_serving_statsd(KubeProxyMode::Nftables, confirmed_with_silent_twins);
}

/// kubernetes#139628 itself, in iptables mode: the Service scaled to zero leaves no nat chain,
/// only kube-proxy's filter REJECT "<svc> has no endpoints"; the sender's entry, still DNATed
/// to pod B:8125, is confirmed naming the Service from that rule. Twin: after the remedy's
/// `conntrack -D`, nothing more is reported.
#[test]
fn a_udp_service_scaled_to_zero_is_named_from_kube_proxys_reject_rule() {
    in_lab_serving_statsd(
        KubeProxyMode::Iptables,
        scaled_to_zero_named_from_kube_proxys_reject_rule,
    );
}

/// Runs `steps` in [`lab_serving_statsd`] (where the test can run), the lab kept until they
/// end.
fn in_lab_serving_statsd(mode: KubeProxyMode, steps: fn()) {
    if let Some(lab) = lab_serving_statsd(mode) {
        steps();
        drop(lab);
    }
}

/// The lab in `mode` with the statsd Service's rules (endpoint pod B:8125) and pod B's sink;
/// None where the test cannot run (it printed its skip line).
fn lab_serving_statsd(mode: KubeProxyMode) -> Option<LabGuard> {
    let test = format!("the stale UDP conntrack black hole ({} mode)", mode.name());
    let lab = LabGuard::for_test_in(&test, mode, &Variants::default())?;
    assert_eq!(lab.mode().unwrap(), mode);
    stale_udp::serve_statsd().expect("the statsd Service and its sink");
    Some(lab)
}

/// Waits for the node's conntrack entry to the ClusterIP whose text holds every one of `want`.
fn wait_for_entry(what: &str, want: &[&str]) {
    assert!(
        probe_tests::agent::wait_for(what, Duration::from_secs(5), || {
            stale_udp::entries()
                .ok()
                .filter(|e| want.iter().all(|w| e.contains(w)))
        })
        .is_some(),
        "{:?}",
        stale_udp::entries()
    );
}

/// The first `stale_udp_conntrack` event: pod B's first endpoint, the statsd Service.
fn stale_event_of_the_first_endpoint(agent: &Agent) -> LoopbackEvent {
    probe_tests::stale_udp::stale_event_of_the_first_endpoint(
        agent,
        IpAddr::V4(lab::POD_B_IP),
        WAIT,
    )
}

/// The remedy's line that deletes the sender's entry.
fn delete_line() -> String {
    format!(
        "conntrack -D -p udp --orig-src {} --orig-dst {} --sport {} --dport {}",
        lab::POD_A_IP,
        stale_udp::STATSD_CLUSTER_IP,
        stale_udp::SENDER_PORT,
        stale_udp::STATSD_PORT
    )
}

/// The shape and its twins with kube-proxy's rules in the lab's mode, the Service serving
/// on its first endpoint.
fn confirmed_with_silent_twins() {
    let agent = Agent::start_with_table(lab::NS_NODE, &[]);

    // The endpoint is current: the sender's entry is DNATed to it; no report.
    let sender = stale_udp::Sender::start(stale_udp::SENDER_PORT, EVERY).expect("sender");
    // The reply tuple names the endpoint: `src=<pod B> ... sport=<endpoint port>`.
    let old = format!("sport={}", stale_udp::OLD_ENDPOINT_PORT);
    wait_for_entry("the entry", &[&old, "[UNREPLIED]"]);
    std::thread::sleep(QUIET);
    assert_eq!(stale_events(&agent).len(), 0, "{:#?}", agent.events());

    // kube-proxy moves the endpoint; the entry stays, refreshed by every datagram.
    stale_udp::move_endpoint().expect("move the endpoint");
    let e = stale_event_of_the_first_endpoint(&agent);
    assert_eq!(
        (e.src, e.src_port),
        (IpAddr::V4(lab::POD_A_IP), stale_udp::SENDER_PORT),
        "{e:#?}"
    );
    assert_eq!(
        (e.vip, e.vip_port),
        (
            Some(IpAddr::V4(stale_udp::STATSD_CLUSTER_IP)),
            Some(stale_udp::STATSD_PORT)
        )
    );
    let evidence = e.evidence.join("\n");
    assert!(
        evidence.contains(&format!(
            "current endpoints: {}:{}",
            lab::POD_B_IP,
            stale_udp::NEW_ENDPOINT_PORT
        )),
        "{evidence}"
    );
    let delete = delete_line();
    let remedy = e.remedy.join("\n");
    assert!(remedy.contains(&delete), "{remedy}");
    assert!(remedy.contains("#139629"), "{remedy}");

    // Twin: the remedy's line deletes the entry; the next datagram takes the new endpoint.
    stale_udp::run_in_node(&delete).expect("the remedy's conntrack -D");
    let new = format!("sport={}", stale_udp::NEW_ENDPOINT_PORT);
    wait_for_entry("the new entry", &[&new]);
    // Twin: a sender whose source port changes with each datagram (its entries are new).
    let changing = stale_udp::Sender::start(0, EVERY).expect("changing-port sender");
    std::thread::sleep(QUIET);
    assert_eq!(stale_events(&agent).len(), 1, "{:#?}", agent.events());
    drop((sender, changing, agent));
}

/// The Service scaled to zero under a fixed-port sender, in iptables mode (see the test).
fn scaled_to_zero_named_from_kube_proxys_reject_rule() {
    let agent = Agent::start_with_table(lab::NS_NODE, &[]);
    let sender = stale_udp::Sender::start(stale_udp::SENDER_PORT, EVERY).expect("sender");
    let old = format!("sport={}", stale_udp::OLD_ENDPOINT_PORT);
    wait_for_entry("the entry", &[&old]);
    stale_udp::scale_to_zero().expect("scale the Service to zero");
    let e = stale_event_of_the_first_endpoint(&agent);
    let evidence = e.evidence.join("\n");
    for want in [
        "current endpoints: none",
        &format!("\"{} has no endpoints\"", stale_udp::STATSD_SERVICE),
    ] {
        assert!(evidence.contains(want), "{want}: {evidence}");
    }
    let delete = delete_line();
    assert!(e.remedy.join("\n").contains(&delete), "{:?}", e.remedy);
    // Twin: the entry deleted, the next datagrams meet the REJECT (no DNAT): nothing more.
    stale_udp::run_in_node(&delete).expect("the remedy's conntrack -D");
    std::thread::sleep(QUIET);
    assert_eq!(stale_events(&agent).len(), 1, "{:#?}", agent.events());
    drop((sender, agent));
}
