//! Issue #51, shape 3 over IPv6: the stale UDP conntrack black hole (kubernetes#139628) on the
//! dual-stack lab node (real conntrack). Pod A sends statsd-like datagrams from one fixed
//! source port to the Service's IPv6 ClusterIP, DNATed to pod B's [IPv6]:8125; kube-proxy's
//! IPv6 rules then move the endpoint to 8126 and nothing deletes the entry, so the datagrams
//! keep going to 8125, unanswered. The agent confirms `stale_udp_conntrack` naming the
//! Service, the stale endpoint and the sender, with the remedy's `conntrack -D -f ipv6` line,
//! which is run here and must delete the entry. Silent twins: the entry while its endpoint is
//! current, and after the remedy's line the sender's new entry to the current endpoint, which
//! answers (replied).
//!
//! kube-proxy's iptables mode (the IPv6 proxier's `ip6tables` nat chains) and its nftables
//! mode (the table `ip6 kube-proxy`): one test each, the shape and its twins in one lab.
//!
//! Root only (prints a skip line otherwise). One at a time: they share the lab.

use std::{net::IpAddr, time::Duration};

use probe_tests::{
    agent::{Agent, lines, wait_for},
    stale_udp::{stale_event_of_the_first_endpoint, stale_events},
};
use test_support::lab::{
    KubeProxyMode, LabGuard,
    stale_udp::{self, NEW_ENDPOINT_PORT, OLD_ENDPOINT_PORT, SENDER_PORT, STATSD_PORT},
    stale_udp6::{self, STATSD_CLUSTER_IP6},
    v6::{POD_A_IP6, POD_B_IP6},
};

/// Two dumps (every 5 s) after the service table has the change, with room for a slow machine.
const WAIT: Duration = Duration::from_secs(40);
/// How long a silent twin is watched: three dumps and more.
const QUIET: Duration = Duration::from_secs(17);
const EVERY: Duration = Duration::from_millis(300);

#[test]
fn ipv6_iptables_mode_a_fixed_port_udp_sender_on_a_stale_dnat_is_confirmed_and_its_twins_are_silent()
 {
    confirmed_with_silent_twins(KubeProxyMode::Iptables);
}

#[test]
fn ipv6_nftables_mode_a_fixed_port_udp_sender_on_a_stale_dnat_is_confirmed_and_its_twins_are_silent()
 {
    confirmed_with_silent_twins(KubeProxyMode::Nftables);
}

/// The node's IPv6 entry to the ClusterIP once its text holds every one of `want` and none
/// of `unwanted`.
fn wait_for_entry(what: &str, want: &[&str], unwanted: &[&str]) -> String {
    let entries = || stale_udp::entries_to(IpAddr::V6(STATSD_CLUSTER_IP6));
    wait_for(what, Duration::from_secs(5), || {
        entries().ok().filter(|e| {
            want.iter().all(|w| e.contains(w)) && !unwanted.iter().any(|u| e.contains(u))
        })
    })
    .unwrap_or_else(|| panic!("{what}: {:?}", entries()))
}

/// The remedy's line that deletes the sender's IPv6 entry.
fn delete_line() -> String {
    format!(
        "conntrack -D -f ipv6 -p udp --orig-src {POD_A_IP6} --orig-dst {STATSD_CLUSTER_IP6} \
         --sport {SENDER_PORT} --dport {STATSD_PORT}"
    )
}

/// The dual-stack lab in `mode` with the Service's IPv6 rules and pod B's sink; the agent on
/// its node reading the rules: the entry silent while current, confirmed once the endpoint
/// moved, deleted by the remedy's line, and the new (replied) entry silent.
fn confirmed_with_silent_twins(mode: KubeProxyMode) {
    let test = format!("the stale UDP black hole over IPv6 ({} mode)", mode.name());
    let Some(lab) = LabGuard::for_test_dual_stack(&test, mode) else {
        return;
    };
    stale_udp6::serve_statsd6().expect("the IPv6 statsd Service and its sink");
    let agent = Agent::start_with_table(test_support::lab::NS_NODE, &[]);

    // The endpoint is current: the entry is DNATed to it (the reply tuple's source port);
    // unanswered (statsd), and no report.
    let sender =
        stale_udp::Sender::start_to(stale_udp6::statsd6(), SENDER_PORT, EVERY).expect("sender");
    let old = format!("sport={OLD_ENDPOINT_PORT}");
    wait_for_entry("the entry", &[&old, "[UNREPLIED]"], &[]);
    std::thread::sleep(QUIET);
    assert_eq!(stale_events(&agent).len(), 0, "{:#?}", agent.events());

    // kube-proxy moves the endpoint; the entry stays, refreshed by every datagram.
    stale_udp6::move_endpoint6().expect("move the endpoint");
    let e = stale_event_of_the_first_endpoint(&agent, IpAddr::V6(POD_B_IP6), WAIT);
    assert_eq!(
        (e.src, e.src_port),
        (IpAddr::V6(POD_A_IP6), SENDER_PORT),
        "{e:#?}"
    );
    assert_eq!(
        (e.vip, e.vip_port),
        (Some(IpAddr::V6(STATSD_CLUSTER_IP6)), Some(STATSD_PORT)),
        "{e:#?}"
    );
    let evidence = lines(&e.evidence);
    for want in [
        format!(
            "conntrack: udp [{POD_A_IP6}]:{SENDER_PORT} -> [{STATSD_CLUSTER_IP6}]:{STATSD_PORT} \
             DNATed to [{POD_B_IP6}]:{OLD_ENDPOINT_PORT}"
        ),
        format!("current endpoints: [{POD_B_IP6}]:{NEW_ENDPOINT_PORT}"),
    ] {
        assert!(evidence.contains(&want), "{want}: {evidence}");
    }
    let delete = delete_line();
    let remedy = lines(&e.remedy);
    assert!(remedy.contains(&delete), "{remedy}");
    assert!(remedy.contains("#139629"), "{remedy}");

    // The remedy's line really deletes the IPv6 entry: the sender's next datagram makes a new
    // one through the current rules, which the endpoint answers (twin: replied, silent).
    stale_udp::run_in_node(&delete).expect("the remedy's conntrack -D");
    let new = format!("sport={NEW_ENDPOINT_PORT}");
    let entry = wait_for_entry("the new, replied entry", &[&new], &[&old, "[UNREPLIED]"]);
    std::thread::sleep(QUIET);
    assert_eq!(
        stale_events(&agent).len(),
        1,
        "{:#?}\n{entry}",
        agent.events()
    );
    drop((sender, agent, lab));
}
