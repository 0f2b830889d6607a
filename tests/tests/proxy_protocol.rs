//! Issue 39, item 2: an LB with PROXY protocol on, short-circuited by kube-proxy. On the real
//! lab node (iptables mode, any kernel): pod A's call to the LB IP is DNATed by kube-proxy's
//! rules to a backend in pod B that requires the PROXY header, which resets it right after
//! the first data; the same call with the header the LB would add is answered (the twin).
//! `probe check`, with the Service from the fake API, names the risk for that Service and
//! port before the call fails; the agent confirms the reset call from the node's conntrack
//! (`proxy_protocol_short_circuit`) and counts the answered twin as nothing; the same Service
//! without the annotation is not named.
//!
//! Root only (prints a skip line otherwise); iptables mode only (the rules are written for it).

use std::{net::IpAddr, process::Command, time::Duration};

use probe_contract::{LoopbackKind, check::Kind};
use probe_tests::{
    agent::{lines, require_root, wait_for},
    lab_check::{lab_node_check, only_risk},
};
use serde_json::{Value, json};
use test_support::{
    kubeapi::fixtures,
    lab::{self, KubeProxyMode, LabGuard, Outcome, Variants, proxy_protocol},
};

/// Where the agent serves /metrics inside the node namespace.
const METRICS: &str = "127.0.0.1:19467";
/// Every report of the kind, repeats included, summed over its labels.
fn reports_counted() -> u64 {
    let prefix = "clbprobe_loopback_events_total{kind=\"proxy_protocol_short_circuit\"";
    let (_, body) = lab::http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("/metrics");
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
const WAIT: Duration = Duration::from_secs(15);

/// DigitalOcean's PROXY protocol annotation (digitalocean-cloud-controller-manager
/// `annDOEnableProxyProtocol`): the classic "broken header" case (kubernetes/ingress-nginx#3996).
const DO_PROXY_PROTOCOL: &str = "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol";

/// `default/ingress`: the captured `default/web` Service re-shaped as a DigitalOcean LB with
/// PROXY protocol on (when `proxy_protocol`) in front of pod B's backend on 9443.
fn ingress_service(proxy_protocol: bool) -> Value {
    let mut svc = fixtures::parse(fixtures::SERVICE_WEB);
    svc["metadata"]["name"] = json!("ingress");
    svc["metadata"]["annotations"] = if proxy_protocol {
        json!({ (DO_PROXY_PROTOCOL): "true" })
    } else {
        json!({ "service.beta.kubernetes.io/do-loadbalancer-name": "ingress" })
    };
    svc["spec"]["clusterIP"] = json!("198.18.100.20");
    svc["spec"]["clusterIPs"] = json!(["198.18.100.20"]);
    svc["spec"]["ports"] = json!([{
        "name": "https", "protocol": "TCP", "port": proxy_protocol::PROXY_PROTOCOL_PORT,
        "targetPort": proxy_protocol::PROXY_PROTOCOL_PORT, "nodePort": 30943
    }]);
    svc["status"]["loadBalancer"]["ingress"][0]["ports"] =
        json!([{ "port": proxy_protocol::PROXY_PROTOCOL_PORT, "protocol": "TCP" }]);
    svc
}

/// The node's conntrack entry of the call from `client` to the LB IP's PROXY protocol port,
/// as `conntrack -L` prints it.
fn conntrack_of(client: std::net::SocketAddrV4) -> String {
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab::NS_NODE,
            "conntrack",
            "-L",
            "-p",
            "tcp",
        ])
        .args(["--orig-src", &client.ip().to_string()])
        .args(["--orig-port-src", &client.port().to_string()])
        .args(["--orig-dst", &lab::VIP.to_string()])
        .output()
        .expect("conntrack -L");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_proxy_protocol_lb_short_circuited_resets_and_check_names_it_first() {
    use probe_tests::kube_fixture::KubeFixture;
    if !require_root("the PROXY protocol short-circuit") {
        return;
    }
    if KubeProxyMode::from_env().unwrap() != KubeProxyMode::Iptables {
        eprintln!("skipping: the PROXY protocol backend's rules are written for iptables mode");
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    proxy_protocol::serve_behind_lb().expect("PROXY protocol backend behind the LB IP");
    let api = KubeFixture::builder()
        .tag("proxy-protocol")
        .object(ingress_service(true))
        .start();

    // Before any call: the risk, named per Service and port, with its remedy.
    let subject = format!("{}:{}/tcp", lab::VIP, proxy_protocol::PROXY_PROTOCOL_PORT);
    let (code, report) = lab_node_check(&["--kubeconfig", api.kubeconfig()]);
    assert_eq!(code, 1, "{report:#?}");
    let f = only_risk(&report, Kind::ProxyProtocolShortCircuit, &subject);
    assert!(f.summary.contains("default/ingress"), "{f:#?}");
    assert!(
        f.evidence.iter().any(|e| e.contains(DO_PROXY_PROTOCOL)),
        "{f:#?}"
    );
    assert!(
        f.remedy
            .iter()
            .any(|r| r.contains("service.beta.kubernetes.io/do-loadbalancer-hostname")),
        "{f:#?}"
    );
    // The provider's fix: publish the LB as a hostname (advice: the DNS name is yours to fill).
    assert!(f.fixes.iter().any(|x| x.id == "do-lb-hostname"), "{f:#?}");

    // The agent, with the same API: it reads the node's conntrack while such an LB exists.
    let mut agent = api.start_agent(&["--metrics-addr", METRICS, "--kube-events", "off"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);

    // The failure, for real: pod A -> LB IP, DNATed to pod B on the node, no header: reset.
    let short = proxy_protocol::call_in(lab::NS_POD_A, false, lab::DEFAULT_TIMEOUT)
        .expect("pod A calls the LB IP");
    assert_eq!(short.outcome, Outcome::Reset, "{short:?}");
    // What the agent's correlation (correlate/proxy_protocol.rs) reads: the node's entry of
    // the call, DNATed, ASSURED, in CLOSE after the reset.
    let entry = conntrack_of(short.local.expect("the client's address"));
    assert!(
        entry.contains(" CLOSE ") && entry.contains("[ASSURED]") && entry.contains("sport=9443"),
        "{entry}"
    );
    // The agent confirms it, named and remedied.
    let e = agent.first_event_of(LoopbackKind::ProxyProtocolShortCircuit, WAIT);
    assert_eq!(e.outcome, probe_contract::Outcome::Reset, "{e:#?}");
    assert_eq!(
        (e.src, e.dst, e.dst_port),
        (
            IpAddr::V4(lab::POD_A_IP),
            IpAddr::V4(lab::POD_B_IP),
            proxy_protocol::PROXY_PROTOCOL_PORT
        ),
        "{e:#?}"
    );
    assert_eq!(
        (e.vip, e.vip_port),
        (
            Some(IpAddr::V4(lab::VIP)),
            Some(proxy_protocol::PROXY_PROTOCOL_PORT)
        ),
        "{e:#?}"
    );
    assert!(
        e.service
            .as_deref()
            .is_some_and(|s| s.starts_with("default/ingress")),
        "{e:#?}"
    );
    assert!(lines(&e.evidence).contains(DO_PROXY_PROTOCOL), "{e:#?}");
    assert!(e.fixes.iter().any(|x| x.id == "do-lb-hostname"), "{e:#?}");
    assert!(
        lines(&e.remedy).contains("service.beta.kubernetes.io/do-loadbalancer-hostname"),
        "{e:#?}"
    );
    // The twin: the same call with the header the LB adds is answered by the same backend.
    let with_header = proxy_protocol::call_in(lab::NS_POD_A, true, lab::DEFAULT_TIMEOUT)
        .expect("pod A calls the LB IP with a PROXY header");
    assert_eq!(with_header.outcome, Outcome::Ok, "{with_header:?}");
    // Its entry is closing cleanly (FIN: TIME_WAIT once both sides are done): no reset.
    let entry = conntrack_of(with_header.local.expect("the client's address"));
    assert!(
        entry.contains("dport=9443") && !entry.contains(" CLOSE "),
        "{entry}"
    );
    assert!(
        with_header
            .answer
            .as_deref()
            .is_some_and(|a| a.contains("proxy-protocol backend")),
        "{with_header:?}"
    );

    // Another reset call after the twin: the agent counts it (every report is counted, the
    // repeat included), and the twin between them added none.
    let second = proxy_protocol::call_in(lab::NS_POD_A, false, lab::DEFAULT_TIMEOUT)
        .expect("pod A calls the LB IP again");
    assert_eq!(second.outcome, Outcome::Reset, "{second:?}");
    let counted = wait_for("the second reset counted", WAIT, || {
        let n = reports_counted();
        (n >= 2).then_some(n)
    });
    assert_eq!(counted, Some(2), "the reset calls, not the answered twin");

    // Issue #49: verify confirms it too. Its test connections send bytes (a connection closed
    // without one gives the backend nothing to reset) and wait out the correlation's
    // conntrack dump interval; pod A's loop is tested from pod A.
    let out = probe_tests::kube_fixture::plugin_in_node(
        &api,
        &[
            "verify",
            "-n",
            "default",
            "ingress",
            "--node",
            probe_tests::kube_fixture::NODE_NAME,
            "-o",
            "json",
        ],
    );
    let v: clb_probe_client::plugin::verify::Verification = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| {
            panic!(
                "not a verification ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(out.status.code(), Some(3), "{v:#?}");
    let node = &v.nodes[probe_tests::kube_fixture::NODE_NAME];
    let from_pod = node
        .results
        .iter()
        .find(|r| {
            r.kind == "proxy_protocol_short_circuit"
                && r.target == subject
                && r.source.contains(&lab::POD_A_IP.to_string())
        })
        .unwrap_or_else(|| panic!("no PROXY-protocol result from pod A: {node:#?}"));
    assert_eq!(
        from_pod.outcome,
        probe_contract::verify::VerifyOutcome::Confirmed,
        "{from_pod:#?}"
    );
    assert!(from_pod.looped, "{from_pod:#?}");
    let _ = agent.stop();

    // The twin Service: the same node and rules, no PROXY protocol on the LB: not named.
    api.apply(ingress_service(false));
    let (_, report) = lab_node_check(&["--kubeconfig", api.kubeconfig()]);
    assert!(
        !report
            .findings
            .iter()
            .any(|f| f.kind == Kind::ProxyProtocolShortCircuit),
        "{report:#?}"
    );
    drop(api);
    drop(lab);
}
