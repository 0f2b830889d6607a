//! Issue #51 shape 4: the LB's own node probes refused. A Google Cloud health checker's
//! address (35.191.0.10, in the documented 35.191.0.0/16) on the LB's side of the lab probes
//! the node's kube-proxy healthz port, :10256. Nothing listens there in the lab's node (a
//! kube-proxy-free node without the healthz bind): the kernel answers with a RST and frees the
//! SYN as `NO_SOCKET`, and the agent confirms `lb_probe_refused` naming the provider's range,
//! the port and the remedy. The twin: a listener on :10256 answers, nothing is reported.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{
    io::Write,
    net::{IpAddr, SocketAddrV4, TcpListener},
    time::Duration,
};

use probe_contract::{LoopbackKind, Outcome as Fate};
use probe_tests::agent::{Agent, lines, require_root};
use test_support::lab::{
    self, LabGuard, Outcome, Variants,
    lb_probe::{GCE_PROBE_IP, HEALTHZ_PORT, add_probe_source, block_probe, remove_probe_source},
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);

fn healthz() -> SocketAddrV4 {
    SocketAddrV4::new(lab::NODE_IP, HEALTHZ_PORT)
}

#[test]
fn a_refused_healthz_probe_from_a_gce_range_is_confirmed() {
    if !require_root("lb_probe_refused") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    add_probe_source(GCE_PROBE_IP).unwrap();
    let agent = Agent::start_with_table(lab::NS_NODE, &["--nic", lab::NODE_NIC]);
    let probe = lab
        .connect(lab::NS_LB, Some(GCE_PROBE_IP), healthz())
        .unwrap();
    assert_eq!(probe.outcome, Outcome::Refused, "{probe:?}");
    let e = agent.only_event(LoopbackKind::LbProbeRefused, WAIT);
    assert_eq!(e.src, IpAddr::V4(GCE_PROBE_IP));
    assert_eq!(e.dst, IpAddr::V4(lab::NODE_IP));
    assert_eq!(e.dst_port, HEALTHZ_PORT);
    assert_eq!(e.outcome, Fate::Refused);
    assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"));
    assert_eq!(e.nic.as_deref(), Some(lab::NODE_NIC));
    let ev = lines(&e.evidence);
    assert!(ev.contains("kube-proxy's healthz port"), "{ev}");
    assert!(
        ev.contains("Google Cloud's documented probe range 35.191.0.0/16"),
        "{ev}"
    );
    let remedy = lines(&e.remedy);
    for needle in ["healthzBindAddress", "kubeProxyReplacementHealthzBindAddr"] {
        assert!(remedy.contains(needle), "{needle}: {remedy}");
    }
    remove_probe_source(GCE_PROBE_IP).unwrap();
    drop(lab);
}

/// The twin: kube-proxy's healthz port served on the node; the probe is answered and nothing
/// is reported.
#[test]
fn an_answered_healthz_probe_reports_nothing() {
    if !require_root("lb_probe_twin") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    add_probe_source(GCE_PROBE_IP).unwrap();
    let healthz_server = lab::in_netns(lab::NS_NODE, || {
        Ok(TcpListener::bind(("0.0.0.0", HEALTHZ_PORT))?)
    })
    .unwrap();
    // kube-proxy's healthz answer, to the one probe.
    std::thread::spawn(move || {
        if let Ok((mut conn, _)) = healthz_server.accept() {
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let agent = Agent::start_with_table(lab::NS_NODE, &["--nic", lab::NODE_NIC]);
    let probe = lab
        .connect(lab::NS_LB, Some(GCE_PROBE_IP), healthz())
        .unwrap();
    assert_eq!(probe.outcome, Outcome::Ok, "{probe:?}");
    std::thread::sleep(SETTLE);
    assert!(agent.events().is_empty(), "{:#?}", agent.events());
    remove_probe_source(GCE_PROBE_IP).unwrap();
    drop(lab);
}

/// A host firewall that leaves the provider's probe range out: kube-proxy's healthz listens,
/// but the probe is dropped in the input hook (`NETFILTER_DROP`); confirmed as a drop whose
/// remedy is to allow the range.
#[test]
fn a_firewalled_healthz_probe_is_confirmed_as_a_drop() {
    if !require_root("lb_probe_firewall") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    add_probe_source(GCE_PROBE_IP).unwrap();
    let _healthz = lab::in_netns(lab::NS_NODE, || {
        Ok(TcpListener::bind(("0.0.0.0", HEALTHZ_PORT))?)
    })
    .unwrap();
    block_probe(Some(("35.191.0.0/16", HEALTHZ_PORT))).unwrap();
    let agent = Agent::start_with_table(lab::NS_NODE, &["--nic", lab::NODE_NIC]);
    let probe = lab
        .connect(lab::NS_LB, Some(GCE_PROBE_IP), healthz())
        .unwrap();
    assert_eq!(probe.outcome, Outcome::Timeout, "{probe:?}");
    let e = agent.only_event(LoopbackKind::LbProbeRefused, WAIT);
    assert_eq!(e.src, IpAddr::V4(GCE_PROBE_IP));
    assert_eq!(e.outcome, Fate::Dropped);
    assert_eq!(e.drop_reason.as_deref(), Some("NETFILTER_DROP"));
    let remedy = lines(&e.remedy);
    assert!(
        remedy.contains("allow TCP 10256 from 35.191.0.0/16"),
        "{remedy}"
    );
    block_probe(None).unwrap();
    remove_probe_source(GCE_PROBE_IP).unwrap();
    drop(lab);
}
