//! Kubernetes attribution end to end: the real agent in the lab's node, its real kube client
//! and reflectors against the fake API server (`test_support::kubeapi`, listening on 127.0.0.1 inside
//! the node's namespace; it is a fake: no kube-apiserver can be installed here) with fixtures
//! carrying the lab's addresses. The lab drives real failures; confirmed events must carry
//! the pod and Service names and the named remedies, and without API access everything must
//! still work by address.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{net::IpAddr, process::Command, time::Duration};

use probe_contract::{
    LoopbackEvent, LoopbackKind,
    facts::{AddressOwner, Etp},
};
use probe_tests::{
    agent::{Agent, assert_contains, follow_events, lines, probe_bin, wait_for},
    kube_fixture::{
        KubeFixture, assert_unprogrammed_port_named, lab_objects_with_unprogrammed_port,
    },
};
use serde_json::Value;
use test_support::{
    kubeapi::fixtures,
    lab::{self, LabGuard, Outcome, Scenario, Variants, http_get_in},
};

const METRICS: &str = "127.0.0.1:19466";
const WAIT: Duration = Duration::from_secs(15);
const CLIENT_POD: &str = "default/client-5d8f7c9b6-x2x9q";

/// The agent's flags beside the kubeconfig: attribution only reads; Events (which write) are
/// tests/tests/kube_events.rs's.
const AGENT: &[&str] = &["--metrics-addr", METRICS, "--kube-events", "off"];

fn event(agent: &Agent, kind: LoopbackKind) -> LoopbackEvent {
    agent.wait_event(kind.as_str(), WAIT, |es| {
        es.iter().rev().find(|e| e.kind == kind).cloned()
    })
}

fn metric(name: &str) -> String {
    let (status, text) = http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    text.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .to_owned()
}

#[test]
fn hairpin_and_healthcheck_blackhole_carry_pod_and_service_names() {
    let Some(lab) = LabGuard::for_test("kube_names", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::lab();
    let mut agent = api.start_agent(AGENT);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    assert_eq!(
        metric("clbprobe_kube_connected"),
        "clbprobe_kube_connected 1"
    );

    // `probe events` follows the live socket from before the traffic.
    let (mut follower, rx) = follow_events(&agent.dir.path().join("probe.sock"));

    assert_eq!(lab.traffic(Scenario::Hairpin).unwrap(), Outcome::Timeout);
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );

    let hairpin = event(&agent, LoopbackKind::Hairpin);
    assert_eq!(
        hairpin.client_pod.as_deref(),
        Some(CLIENT_POD),
        "{hairpin:#?}"
    );
    assert_eq!(hairpin.node.as_deref(), Some("clb-node"));
    assert_eq!(hairpin.src, IpAddr::V4(lab::POD_A_IP), "addresses stay");
    let named = &hairpin.remedy;
    assert!(
        named.iter().any(|r| r.starts_with(&format!(
            "In pod {CLIENT_POD}: call web.default.svc.cluster.local:80 (Service default/web) instead of the LB address 203.0.113.10:80"
        ))),
        "{named:#?}"
    );
    // The in-cluster advice once; the Service's settings are evidence, not advice.
    assert_eq!(
        named.iter().filter(|r| r.contains("DNS")).count(),
        1,
        "{named:#?}"
    );
    let evidence = lines(&hairpin.evidence);
    assert!(
        evidence.contains(&format!("198.19.1.10 is pod {CLIENT_POD}")),
        "{evidence}"
    );
    assert_contains(
        &evidence,
        "belongs to Service default/web (externalTrafficPolicy: Cluster",
    );
    assert_eq!(hairpin.facts.etp_api, Some(Etp::Cluster), "{hairpin:#?}");

    let check = event(&agent, LoopbackKind::HealthcheckBlackhole);
    assert_eq!(check.node.as_deref(), Some("clb-node"));
    assert_eq!(check.client_pod, None);
    let named = &check.remedy;
    assert!(
        named[0].starts_with(
            "Cause: the LB of Service default/web health-checks this node from its own VIP 203.0.113.10 on NodePort 30080 (externalTrafficPolicy: Cluster"
        ),
        "{named:#?}"
    );
    assert!(
        named.iter().any(|r| r.contains("ipMode is VIP")),
        "{named:#?}"
    );

    // The live socket carries the same names (`probe events` prints LoopbackEvents).
    let mut followed: Vec<LoopbackEvent> = Vec::new();
    while !followed
        .iter()
        .any(|e| e.kind == LoopbackKind::Hairpin && e.client_pod.as_deref() == Some(CLIENT_POD))
    {
        let line = rx
            .recv_timeout(WAIT)
            .expect("probe events printed the named hairpin");
        followed.push(
            serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not a LoopbackEvent ({e}): {line}")),
        );
    }
    let _ = follower.kill();
    let _ = follower.wait();

    // `probe watch` shows the names beside the flow.
    let once = Command::new(probe_bin())
        .args(["watch", "--once", "--socket"])
        .arg(agent.dir.path().join("probe.sock"))
        .output()
        .unwrap();
    assert!(once.status.success());
    let text = String::from_utf8_lossy(&once.stdout);
    assert!(
        text.contains(&format!("[pod {CLIENT_POD}, svc default/web")),
        "{text}"
    );

    // Only this node's pods are watched, and attribution never writes.
    let requests = api.requests();
    assert!(
        requests.iter().any(|r| r.path.starts_with("/api/v1/pods?")
            && r.path.contains("fieldSelector=spec.nodeName%3Dclb-node")),
        "{requests:#?}"
    );
    assert!(requests.iter().all(|r| r.method == "GET"), "{requests:#?}");
    assert!(agent.stop().success());
    drop(lab);
}

/// The VIP held on the node's NIC as kube-vip holds it, with kube-vip's DaemonSet pod on the
/// node in the API: the health-check black hole names kube-vip and its pod as the VIP's
/// owner, and the remedy addresses that pod, not kube-proxy (issue 39, item 3).
#[test]
fn a_vip_an_announcer_holds_is_named_for_its_pod_on_the_node() {
    let Some(lab) = LabGuard::for_test(
        "kube_announcer",
        &Variants {
            vip_bound: false,
            ..Variants::default()
        },
    ) else {
        return;
    };
    let api = KubeFixture::builder()
        .object(fixtures::parse(fixtures::POD_KUBE_VIP))
        .start();
    let mut agent = api.start_agent(AGENT);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackholeAnnounced)
            .unwrap(),
        Outcome::Timeout
    );
    let check = event(&agent, LoopbackKind::HealthcheckBlackhole);
    let pod = format!("kube-system/{}", fixtures::KUBE_VIP_POD);
    let announcer = check
        .facts
        .owner
        .as_ref()
        .and_then(AddressOwner::announcer)
        .unwrap_or_else(|| panic!("no announcer: {check:#?}"));
    assert_eq!(announcer.name, "kube-vip", "{check:#?}");
    assert_eq!(announcer.pod.as_deref(), Some(pod.as_str()), "{check:#?}");
    let remedy = lines(&check.remedy);
    assert!(
        remedy.contains(&format!(
            "held on eth0 by kube-vip (pod {pod}), not bound by kube-proxy"
        )),
        "{remedy}"
    );
    assert!(!remedy.contains("kube-ipvs0"), "{remedy}");
    assert!(
        lines(&check.evidence).contains(&format!("host-network pod {pod} runs kube-vip")),
        "{check:#?}"
    );
    assert!(agent.stop().success());
    drop(lab);
}

#[test]
fn without_api_access_events_are_confirmed_by_address() {
    let Some(lab) = LabGuard::for_test("kube_forbidden", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::lab();
    for resource in ["pods", "services", "endpointslices"] {
        api.forbid(resource, "list");
    }
    let mut agent = api.start_agent(AGENT);
    agent.wait_log("Kubernetes API not usable", WAIT);
    let (status, _) = http_get_in(lab::NS_NODE, METRICS, "/readyz").expect("readyz");
    assert_eq!(status, 200, "readiness does not depend on the API");

    assert_eq!(lab.traffic(Scenario::Hairpin).unwrap(), Outcome::Timeout);
    let hairpin = event(&agent, LoopbackKind::Hairpin);
    assert_eq!(hairpin.client_pod, None);
    assert_eq!(
        hairpin.node.as_deref(),
        Some("clb-node"),
        "the node name needs no API"
    );
    assert_eq!(hairpin.vip, Some(IpAddr::V4(lab::VIP)));
    assert!(
        !lines(&hairpin.evidence).contains("Kubernetes API"),
        "{hairpin:#?}"
    );
    assert_eq!(
        metric("clbprobe_kube_connected"),
        "clbprobe_kube_connected 0"
    );
    assert_eq!(agent.count_log("Kubernetes API not usable"), 1, "said once");
    assert!(agent.stop().success());
    drop(lab);
}

/// The service table from the API (`--service-table-from api`, the default with API access)
/// against the rules: the API's Service `default/web` also serves 443 on the LB IP, and the
/// lab's kube-proxy rules (like a kube-proxy that has not synced) do not. A pod's call to
/// VIP:443 is refused; the agent asks the dataplane (`KUBE-SERVICES` over netlink), finds no
/// rule, and names the disagreement: `vip_port_unserved` with `kube_proxy_lags` and
/// kube-proxy, not the Service, as the remedy. Without the port in the API the same call is
/// the plain unserved port (the twin, `loopback.rs` and `kube_events.rs`).
#[test]
fn a_port_the_api_serves_and_kube_proxy_did_not_program_is_named() {
    let Some(lab) = LabGuard::for_test("kube_not_programmed", &Variants::default()) else {
        return;
    };
    let objects = lab_objects_with_unprogrammed_port();
    let api = KubeFixture::builder().objects(objects).start();
    let mut agent = api.start_agent(AGENT);
    agent.wait_log("service table from the API", WAIT);

    assert_eq!(
        lab.traffic(Scenario::VipPortUnserved).unwrap(),
        Outcome::Refused
    );
    let e = event(&agent, LoopbackKind::VipPortUnserved);
    assert_unprogrammed_port_named(&e, "KUBE-SERVICES");
    // The served port is still served: the API's table did not make the rules' port unserved.
    assert_eq!(lab.traffic(Scenario::VipPortServed).unwrap(), Outcome::Ok);
    assert!(agent.stop().success());
    drop(lab);
}

/// kube-runtime restarts a watch after a non-410 error without a word to its consumer (no
/// relist, no event until an object changes): `clbprobe_kube_connected` must come back with
/// the restarted watches, not with the next change.
#[test]
fn connected_again_when_the_watches_resume_after_a_non_410_error() {
    let Some(lab) = LabGuard::for_test("kube_rewatch", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::lab();
    let mut agent = api.start_agent(AGENT);
    // The metrics read a snapshot taken every so often: wait for a state, do not sample it.
    let wait_connected = |want: u8| {
        let line = format!("clbprobe_kube_connected {want}");
        wait_for(&line, WAIT, || {
            (metric("clbprobe_kube_connected") == line).then_some(())
        })
    };
    wait_connected(1).expect("connected");
    let sources = [
        "/api/v1/pods?",
        "/api/v1/services?",
        "/apis/discovery.k8s.io/v1/endpointslices?",
    ];
    let is_watch = |path: &str| path.contains("watch=true") || path.contains("watch=1");
    wait_for("the three watches open", WAIT, || {
        let requests = api.requests();
        sources
            .iter()
            .all(|s| {
                requests
                    .iter()
                    .any(|r| r.path.starts_with(s) && is_watch(&r.path))
            })
            .then_some(())
    })
    .expect("the agent's watches");

    // The watches end (an API server restart) and their restarts are refused (403).
    let before = api.requests().len();
    for resource in ["pods", "services", "endpointslices"] {
        api.forbid(resource, "watch");
    }
    api.end_watches();
    agent.wait_log("Kubernetes API not usable", WAIT);
    wait_connected(0).expect("disconnected after the 403s");

    // Watches allowed again, nothing changed: only the restarted watches can tell.
    api.allow_all();
    wait_connected(1).unwrap_or_else(|| panic!("still disconnected:\n{}", agent.log.join("\n")));
    assert_eq!(agent.count_log("Kubernetes attribution connected"), 2);
    let relists = api.requests()[before..]
        .iter()
        .filter(|r| sources.iter().any(|s| r.path.starts_with(s)) && !is_watch(&r.path))
        .count();
    assert_eq!(relists, 0, "the watches resumed from their versions");
    assert!(agent.stop().success());
    drop(lab);
}

#[test]
fn a_service_added_after_a_410_relist_is_attributed() {
    let Some(lab) = LabGuard::for_test("kube_410", &Variants::default()) else {
        return;
    };
    let without_web: Vec<Value> = fixtures::lab()
        .into_iter()
        .filter(|o| o["metadata"]["name"] != "web" && o["metadata"]["name"] != "web-x7k2d")
        .collect();
    let api = KubeFixture::builder().objects(without_web).start();
    let mut agent = api.start_agent(AGENT);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    let before = api.requests().len();

    // History compacted under the agent's watches, then the Service appears.
    api.expire_history();
    api.apply(fixtures::parse(fixtures::SERVICE_WEB));
    api.apply(fixtures::parse(fixtures::ENDPOINTSLICE_WEB));
    wait_for("a relist and reconnect", WAIT, || {
        (agent.count_log("Kubernetes attribution connected") >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("no reconnect after the 410:\n{}", agent.log.join("\n")));
    let relists = api.requests()[before..]
        .iter()
        .filter(|r| r.path.starts_with("/api/v1/services?") && !r.path.contains("watch="))
        .count();
    assert!(relists >= 1, "services relisted after the 410");

    assert_eq!(lab.traffic(Scenario::Hairpin).unwrap(), Outcome::Timeout);
    let hairpin = event(&agent, LoopbackKind::Hairpin);
    assert_eq!(hairpin.client_pod.as_deref(), Some(CLIENT_POD));
    assert!(
        lines(&hairpin.remedy)
            .contains("call web.default.svc.cluster.local:80 (Service default/web)"),
        "{hairpin:#?}"
    );
    assert!(agent.stop().success());
    drop(lab);
}
