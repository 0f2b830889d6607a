//! Issue #51 shape 4: the LB's own node probes refused. A Google Cloud health checker's
//! address (35.191.0.10, in the documented 35.191.0.0/16) on the LB's side of the lab probes
//! the node's kube-proxy healthz port, :10256. Nothing listens there in the lab's node (a
//! kube-proxy-free node without the healthz bind): the kernel answers with a RST and frees the
//! SYN as `NO_SOCKET`, and the agent confirms `lb_probe_refused` naming the provider's range,
//! the port and the remedy. The twin: a listener on :10256 answers, nothing is reported. Also:
//! a host firewall dropping the range (`NETFILTER_DROP`), an ETP Local Service's
//! healthCheckNodePort named by the fake API, and Azure's IPv6 link-local probe source; and
//! `probe check` naming the unserved healthCheckNodePort before any probe.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{
    io::Write,
    net::{IpAddr, SocketAddrV4, TcpListener},
    time::Duration,
};

use probe_contract::{LoopbackKind, Outcome as Fate};
use probe_tests::{
    agent::{Agent, assert_contains, lines, wait_for},
    lab_check::lab_node_check,
};
use test_support::lab::{
    self, LabGuard, Outcome, Variants,
    lb_probe::{GCE_PROBE_IP, HEALTHZ_PORT, add_probe_source, block_probe, remove_probe_source},
};

const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(20);

fn healthz() -> SocketAddrV4 {
    SocketAddrV4::new(lab::NODE_IP, HEALTHZ_PORT)
}

/// A test's lab with the GCE probe address on the LB's side, or None where it cannot run (not
/// root: it says it skips). The address goes before the lab does.
fn lab_with_the_gce_probe(test: &str) -> Option<GceProbeLab> {
    let lab = LabGuard::for_test(test, &Variants::default())?;
    add_probe_source(GCE_PROBE_IP).unwrap();
    Some(GceProbeLab(lab))
}

/// The lab with [`GCE_PROBE_IP`] on the LB's side; removes it on drop.
struct GceProbeLab(LabGuard);

impl std::ops::Deref for GceProbeLab {
    type Target = LabGuard;

    fn deref(&self) -> &LabGuard {
        &self.0
    }
}

impl Drop for GceProbeLab {
    fn drop(&mut self) {
        let removed = remove_probe_source(GCE_PROBE_IP);
        // A failed test already says why; only a passing one fails on its clean-up.
        if !std::thread::panicking() {
            removed.unwrap();
        }
    }
}

/// A listener on `port` on every address of the node (kube-proxy's healthz, a
/// healthCheckNodePort's server).
fn listen_on_the_node(port: u16) -> TcpListener {
    lab::in_netns(lab::NS_NODE, || Ok(TcpListener::bind(("0.0.0.0", port))?)).unwrap()
}

/// Probes `to` from the GCE probe address, as the LB does every few seconds, until the agent
/// reports the refused probe (the agent writes the probe ports at its start and with each
/// service table: a probe in the first moments may come before them). Each probe must end in
/// `outcome`.
fn probe_until_reported(
    lab: &LabGuard,
    agent: &Agent,
    to: SocketAddrV4,
    outcome: Outcome,
) -> probe_contract::LoopbackEvent {
    wait_for("the refused probe", WAIT, || {
        let probe = lab.connect(lab::NS_LB, Some(GCE_PROBE_IP), to).ok()?;
        assert_eq!(probe.outcome, outcome, "{probe:?}");
        std::thread::sleep(Duration::from_millis(500));
        agent
            .events()
            .into_iter()
            .find(|e| e.kind == LoopbackKind::LbProbeRefused)
    })
    .unwrap_or_else(|| panic!("no lb_probe_refused; events: {:#?}", agent.events()))
}

#[test]
fn a_refused_healthz_probe_from_a_gce_range_is_confirmed() {
    let Some(lab) = lab_with_the_gce_probe("lb_probe_refused") else {
        return;
    };
    let agent = Agent::on_node_nic_with_table(&[]);
    let e = probe_until_reported(&lab, &agent, healthz(), Outcome::Refused);
    assert_eq!(e.src, IpAddr::V4(GCE_PROBE_IP));
    assert_eq!(e.dst, IpAddr::V4(lab::NODE_IP));
    assert_eq!(e.dst_port, HEALTHZ_PORT);
    assert_eq!(e.outcome, Fate::Refused);
    assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"));
    assert_eq!(e.nic.as_deref(), Some(lab::NODE_NIC));
    let ev = lines(&e.evidence);
    assert_contains(&ev, "kube-proxy's healthz port");
    assert_contains(&ev, "Google Cloud's documented probe range 35.191.0.0/16");
    let remedy = lines(&e.remedy);
    for needle in ["healthzBindAddress", "kubeProxyReplacementHealthzBindAddr"] {
        assert!(remedy.contains(needle), "{needle}: {remedy}");
    }
    drop(lab);
}

/// The twin: kube-proxy's healthz port served on the node; the probe is answered and nothing
/// is reported.
#[test]
fn an_answered_healthz_probe_reports_nothing() {
    let Some(lab) = lab_with_the_gce_probe("lb_probe_twin") else {
        return;
    };
    let healthz_server = listen_on_the_node(HEALTHZ_PORT);
    // kube-proxy's healthz answer, to the one probe.
    std::thread::spawn(move || {
        if let Ok((mut conn, _)) = healthz_server.accept() {
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let agent = Agent::on_node_nic_with_table(&[]);
    let probe = lab
        .connect(lab::NS_LB, Some(GCE_PROBE_IP), healthz())
        .unwrap();
    assert_eq!(probe.outcome, Outcome::Ok, "{probe:?}");
    agent.assert_reports_nothing_after(SETTLE);
    drop(lab);
}

/// A host firewall that leaves the provider's probe range out: kube-proxy's healthz listens,
/// but the probe is dropped in the input hook (`NETFILTER_DROP`); confirmed as a drop whose
/// remedy is to allow the range.
#[test]
fn a_firewalled_healthz_probe_is_confirmed_as_a_drop() {
    let Some(lab) = lab_with_the_gce_probe("lb_probe_firewall") else {
        return;
    };
    let _healthz = listen_on_the_node(HEALTHZ_PORT);
    block_probe(Some(("35.191.0.0/16", HEALTHZ_PORT))).unwrap();
    let agent = Agent::on_node_nic_with_table(&[]);
    let e = probe_until_reported(&lab, &agent, healthz(), Outcome::Timeout);
    assert_eq!(e.src, IpAddr::V4(GCE_PROBE_IP));
    assert_eq!(e.outcome, Fate::Dropped);
    assert_eq!(e.drop_reason.as_deref(), Some("NETFILTER_DROP"));
    let remedy = lines(&e.remedy);
    assert_contains(&remedy, "allow TCP 10256 from 35.191.0.0/16");
    block_probe(None).unwrap();
    drop(lab);
}

/// `default/hc`: the captured `default/web` Service as an externalTrafficPolicy Local LB with
/// healthCheckNodePort 32000.
fn etp_local_service() -> serde_json::Value {
    use test_support::kubeapi::fixtures;
    let mut svc = fixtures::parse(fixtures::SERVICE_WEB);
    svc["metadata"]["name"] = serde_json::json!("hc");
    svc["spec"]["externalTrafficPolicy"] = serde_json::json!("Local");
    svc["spec"]["healthCheckNodePort"] = serde_json::json!(HC_PORT);
    svc
}

const HC_PORT: u16 = 32000;

/// With API access the agent watches the healthCheckNodePorts too: the LB's probe of
/// `default/hc`'s port, refused on a node where nothing serves it, names the Service.
#[test]
fn a_refused_health_check_node_port_probe_names_its_service() {
    use probe_tests::kube_fixture::KubeFixture;
    let Some(lab) = lab_with_the_gce_probe("lb_probe_refused (healthCheckNodePort)") else {
        return;
    };
    let api = KubeFixture::builder()
        .tag("lb-probe")
        .object(etp_local_service())
        .start();
    let mut agent = api.start_agent(&["--kube-events", "off"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    // The port joins the watched ones with the first table from the API.
    let to = SocketAddrV4::new(lab::NODE_IP, HC_PORT);
    let e = probe_until_reported(&lab, &agent, to, Outcome::Refused);
    assert_eq!(e.dst_port, HC_PORT);
    assert_eq!(e.service.as_deref(), Some("default/hc"), "{e:#?}");
    let ev = lines(&e.evidence);
    assert_contains(&ev, "the healthCheckNodePort of default/hc");
    drop(lab);
}

/// Azure's IPv6 probe comes from the link-local fe80::1234:5678:9abc (cilium#25242): refused
/// on the node's healthz over IPv6, confirmed naming Azure's source.
#[test]
fn a_refused_ipv6_probe_from_azures_link_local_source_is_confirmed() {
    use test_support::lab::{lb_probe, v6};
    let Some(lab) =
        LabGuard::for_test_dual_stack("lb_probe_refused (IPv6)", lab::KubeProxyMode::Iptables)
    else {
        return;
    };
    let agent = Agent::on_node_nic_with_table(&[]);
    let e = wait_for("the refused IPv6 probe", WAIT, || {
        let outcome = lb_probe::probe6_from_link_local(v6::NODE_IP6, HEALTHZ_PORT).unwrap();
        assert_eq!(outcome, "refused");
        std::thread::sleep(Duration::from_millis(500));
        agent
            .events()
            .into_iter()
            .find(|e| e.kind == LoopbackKind::LbProbeRefused)
    })
    .unwrap_or_else(|| panic!("no lb_probe_refused; events: {:#?}", agent.events()));
    assert_eq!(e.src, lb_probe::AZURE_PROBE_IP6.parse::<IpAddr>().unwrap());
    assert_eq!(e.dst, IpAddr::V6(v6::NODE_IP6));
    assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"));
    let ev = lines(&e.evidence);
    assert_contains(
        &ev,
        "Azure's documented probe range fe80::1234:5678:9abc/128",
    );
    drop(lab);
}

/// Before any probe: `probe check` names the healthCheckNodePort nothing serves as the risk
/// of the same kind; with a listener on it (kube-proxy's), no such risk.
#[test]
fn check_names_an_unserved_health_check_node_port_and_its_twin_is_not() {
    use probe_contract::check::{Kind, Severity};
    use probe_tests::kube_fixture::KubeFixture;
    let Some(lab) = LabGuard::for_test("probe check: lb_probe_refused", &Variants::default())
    else {
        return;
    };
    let api = KubeFixture::builder()
        .tag("lb-probe-check")
        .object(etp_local_service())
        .start();
    let subject = format!("tcp/{HC_PORT}");
    let report = lab_node_check(&["--kubeconfig", api.kubeconfig()]).1;
    let named: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.kind == Kind::LbProbeRefused && f.subject == subject)
        .collect();
    assert_eq!(named.len(), 1, "{report:#?}");
    assert_eq!(named[0].severity, Severity::Risk);
    assert!(named[0].summary.contains("default/hc"), "{:#?}", named[0]);
    assert_eq!(
        named[0].kind.predicted(),
        Some(LoopbackKind::LbProbeRefused)
    );
    let _served = listen_on_the_node(HC_PORT);
    let report = lab_node_check(&["--kubeconfig", api.kubeconfig()]).1;
    assert!(
        !report
            .findings
            .iter()
            .any(|f| f.kind == Kind::LbProbeRefused && f.subject == subject),
        "{report:#?}"
    );
    drop(lab);
}
