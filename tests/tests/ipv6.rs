//! The failures over IPv6 on this kernel, in the dual-stack lab (kube-proxy's iptables mode
//! with its ip6tables side, addresses from 2001:db8::/32): each is driven for real and must
//! come out as its kind with its IPv6 evidence, addresses carried unchanged in the JSON.
//!
//! IPv6 has no martian-source check: the LB's check from a bound VIP is answered and the
//! node's SYN-ACK dies locally as NO_SOCKET: still `healthcheck_blackhole`, never
//! `vip_port_unserved` on the LB's ephemeral port.
//!
//! Root only. One at a time: they share the lab.

use std::{net::IpAddr, time::Duration};

use probe_contract::{LoopbackEvent, LoopbackKind, Outcome as Fate, SnatState};
use probe_tests::agent::{Agent, assert_contains, lines, require_root};
use test_support::lab::{
    self, LabGuard, Variants,
    v6::{self, Scenario6},
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);

/// The iptables-mode lab with the dual-stack layer added.
fn dual_stack_lab() -> LabGuard {
    let lab = LabGuard::up_in(
        lab::KubeProxyMode::Iptables,
        &Variants::default(),
        &Default::default(),
    )
    .expect("lab up");
    lab.add_ipv6().expect("dual-stack layer");
    lab
}

/// Drives `scenario` with the agent on the node (the client's outcome must be the expected
/// one), or None where `test` cannot run (not root: it says it skips).
fn run(test: &str, scenario: Scenario6) -> Option<Agent> {
    if !require_root(test) {
        return None;
    }
    let lab = dual_stack_lab();
    let agent = Agent::on_node_nic(&[]);
    let (outcome, expected) = lab.run6(scenario).expect("traffic");
    assert_eq!(outcome, expected, "{scenario:?} over IPv6");
    std::thread::sleep(SETTLE);
    let _ = agent.events();
    drop(lab);
    Some(agent)
}

/// [`run`], then the one event of `kind`.
fn confirmed(test: &str, scenario: Scenario6, kind: LoopbackKind) -> Option<LoopbackEvent> {
    Some(run(test, scenario)?.only_event(kind, WAIT))
}

/// [`run`] for a twin: the agent reports nothing.
fn silent(test: &str, scenario: Scenario6) {
    if let Some(agent) = run(test, scenario) {
        assert!(agent.events().is_empty(), "{:#?}", agent.events());
    }
}

#[test]
fn ipv6_healthcheck_blackhole_is_the_reply_dropped_locally_not_an_unserved_port() {
    let Some(e) = confirmed(
        "ipv6_healthcheck_blackhole",
        Scenario6::HealthcheckBlackhole,
        LoopbackKind::HealthcheckBlackhole,
    ) else {
        return;
    };
    assert_eq!(e.src, IpAddr::V6(v6::VIP6));
    assert_eq!(e.vip, Some(IpAddr::V6(v6::VIP6)));
    assert_eq!(e.dst, IpAddr::V6(v6::NODE_IP6));
    assert_eq!(e.dst_port, lab::NODE_PORT);
    assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"));
    assert_eq!(e.outcome, Fate::Dropped);
    assert_eq!(e.nic.as_deref(), Some(lab::NODE_NIC));
    let ev = lines(&e.evidence);
    assert!(
        ev.contains(&format!("tc ingress on {}", lab::NODE_NIC)),
        "{ev}"
    );
    assert_contains(&ev, "IPv6 has no martian-source check");
}

#[test]
fn ipv6_healthcheck_twin_with_unbound_vip_reports_nothing() {
    silent("ipv6_healthcheck_ok", Scenario6::HealthcheckOk);
}

#[test]
fn ipv6_hairpin_is_confirmed() {
    let Some(e) = confirmed("ipv6_hairpin", Scenario6::Hairpin, LoopbackKind::Hairpin) else {
        return;
    };
    assert_eq!(e.src, IpAddr::V6(v6::POD_A_IP6));
    assert_eq!(e.vip, Some(IpAddr::V6(v6::VIP6)));
    assert_eq!(e.vip_port, Some(lab::SERVICE_PORT));
    assert_eq!(e.dst, IpAddr::V6(v6::NODE_IP6));
    assert_eq!(e.dst_port, lab::NODE_PORT);
    assert_eq!(e.snat, SnatState::No);
}

#[test]
fn ipv6_vip_port_unserved_is_confirmed() {
    let Some(e) = confirmed(
        "ipv6_vip_port_unserved",
        Scenario6::VipPortUnserved,
        LoopbackKind::VipPortUnserved,
    ) else {
        return;
    };
    assert_eq!(e.src, IpAddr::V6(v6::POD_A_IP6));
    assert_eq!(e.vip, Some(IpAddr::V6(v6::VIP6)));
    assert_eq!(e.vip_port, Some(lab::VIP_UNSERVED_PORT));
    assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"));
    assert_eq!(e.outcome, Fate::Refused);
}

#[test]
fn ipv6_served_vip_port_reports_nothing() {
    silent("ipv6_vip_port_served", Scenario6::VipPortServed);
}

/// The JSON contract, `probe events`, `probe watch --once` and `/metrics` carry the IPv6 VIP
/// as it is (no mapping to IPv4, no truncation in the view or the labels).
#[test]
fn ipv6_addresses_reach_events_watch_and_metrics_unchanged() {
    use std::{
        io::{BufRead as _, BufReader},
        process::{Command, Stdio},
    };

    if !require_root("ipv6_surfaces") {
        return;
    }
    const METRICS: &str = "127.0.0.1:19967";
    let lab = dual_stack_lab();
    let socket = std::env::temp_dir().join(format!("clb-ipv6-test-{}.sock", std::process::id()));
    let socket_arg = socket.to_str().unwrap().to_string();
    let agent = Agent::on_node_nic(&["--socket", &socket_arg, "--metrics-addr", METRICS]);
    let (outcome, expected) = lab.run6(Scenario6::HealthcheckBlackhole).expect("traffic");
    assert_eq!(outcome, expected);
    let e = agent.only_event(LoopbackKind::HealthcheckBlackhole, WAIT);
    let vip6 = v6::VIP6.to_string();
    assert_eq!(e.vip, Some(IpAddr::V6(v6::VIP6)));

    let mut events = Command::new(probe_tests::agent::probe_bin())
        .args(["events", "--all", "--socket", &socket_arg])
        .stdout(Stdio::piped())
        .spawn()
        .expect("probe events");
    let line = BufReader::new(events.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("healthcheck_blackhole"));
    let _ = events.kill();
    let _ = events.wait();
    // `probe events` prints LoopbackEvents.
    let line = line.expect("probe events printed the event");
    let v: LoopbackEvent = serde_json::from_str(&line)
        .unwrap_or_else(|err| panic!("not a LoopbackEvent ({err}): {line}"));
    assert_eq!((v.src, v.vip), (e.src, e.vip));
    assert_eq!(v.dst, IpAddr::V6(v6::NODE_IP6));

    let once = Command::new(probe_tests::agent::probe_bin())
        .args(["watch", "--once", "--socket", &socket_arg])
        .output()
        .unwrap();
    assert!(once.status.success());
    let text = String::from_utf8_lossy(&once.stdout);
    assert!(text.contains(&vip6), "{text}");

    let (status, metrics) = lab::http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("clbprobe_loopback_events_total{") && l.contains("healthcheck_blackhole")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(line.contains(&format!("vip=\"{vip6}\"")), "{line}");
    drop(agent);
    drop(lab);
}
