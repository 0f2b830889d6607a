//! Names on the first event and Events on the right object, in any kube-proxy mode: the real
//! agent in the lab with the fake API server (test_support::kubeapi) whose first lists are held (a
//! slow first cache sync), and the real `kubectl describe service` against the same server.
//! Used by tests/tests/kube_events.rs (iptables, nftables) and tests/tests/ipvs.rs (IPVS, in
//! the VM tier).

use std::{process::Command, time::Duration};

use probe_contract::LoopbackKind;
use test_support::{
    kubeapi::fixtures,
    lab::{self, KubeProxyMode, LabGuard, Scenario, UpOptions, Variants},
};

use crate::{
    agent::wait_for,
    kube_fixture::KubeFixture,
    written::{clb_events, is},
};

const WAIT: Duration = Duration::from_secs(20);
/// How long the agent may take to read its first table of the lab's Services from the rules
/// (after the API's held lists have kept it waiting, `API_WAIT`): the VM tier's emulated
/// kernels took 48 s to start one agent on a loaded machine (CI run 41).
const TABLE_WAIT: Duration = Duration::from_secs(240);

/// A failure to drive, the kind it confirms and what its event must be named with.
pub struct Case {
    pub scenario: Scenario,
    pub kind: LoopbackKind,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Service the API names (`default/<name>`).
    pub service: &'static str,
    /// The sender is the lab's client pod (named `default/client-...`).
    pub client_pod: bool,
}

/// The first case is driven while the API's lists are held (the agent's cache has not synced
/// yet): its event waits for the sync and comes out named. Every case's first event carries
/// the API's Service (with its uid) and, for a pod sender, the pod; each kind's Event regards
/// that Service and `kubectl describe service` lists it.
pub fn first_events_named_and_described(mode: KubeProxyMode, cases: &[Case]) {
    let lab = LabGuard::up_in(mode, &Variants::default(), &UpOptions::default()).expect("lab up");
    let api = KubeFixture::builder().tag("kube-names").start();
    api.hold_lists();
    let mut agent = api.start_agent(&[]);
    // The first case is confirmed from the rules' table: waited for before its traffic, so a
    // slow machine delays the test instead of failing it.
    wait_for(
        "a service table holding the lab's Services",
        TABLE_WAIT,
        || {
            let tables = agent.count_log("service table read (");
            let empty = agent.count_log(" services=0 ");
            (tables > empty).then_some(())
        },
    )
    .unwrap_or_else(|| panic!("no service table:\n{}", agent.log.join("\n")));
    let first = &cases[0];
    let _ = lab.traffic(first.scenario).expect("traffic");
    // Confirmed while the cache has no list yet: held (the log says so), or, without the
    // hold, already written unnamed. Either way the lists go now.
    wait_for("the first confirmation", WAIT, || {
        let held = agent.count_log("held (at most 2 s)") > 0;
        let written = agent.events().iter().any(|e| e.kind == first.kind);
        (held || written).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{} not confirmed:\n{}",
            first.kind.as_str(),
            agent.log.join("\n")
        )
    });
    api.release_lists();
    for case in &cases[1..] {
        let _ = lab.traffic(case.scenario).expect("traffic");
    }
    let services = api.objects("services");
    for case in cases {
        let e = agent.wait_event(case.kind.as_str(), WAIT, |es| {
            es.iter().find(|e| e.kind == case.kind).cloned()
        });
        let (ns, name) = case.service.split_once('/').unwrap();
        let uid = services
            .iter()
            .find(|s| s["metadata"]["name"] == name && s["metadata"]["namespace"] == ns)
            .map(|s| s["metadata"]["uid"].clone())
            .expect("the fixture Service");
        // The fake API's Service object (JSON, not an agent output).
        let api_uid = uid.as_str();
        let svc = e.facts.service.as_ref();
        assert_eq!(
            (
                svc.map(|s| s.namespace.as_str()),
                svc.map(|s| s.name.as_str()),
                svc.and_then(|s| s.uid.as_deref()),
            ),
            (Some(ns), Some(name), api_uid),
            "{} (first event): {e:#?}",
            case.kind.as_str()
        );
        if case.client_pod {
            assert_eq!(
                e.client_pod.as_deref(),
                Some(format!("default/{}", fixtures::CLIENT_POD).as_str()),
                "{} (first event): {e:#?}",
                case.kind.as_str()
            );
        }
        let event = wait_for("its Event", WAIT, || {
            clb_events(&api)
                .into_iter()
                .find(|ev| is(&ev.reason, case.reason))
        })
        .unwrap_or_else(|| panic!("no {} Event: {:#?}", case.reason, clb_events(&api)));
        let regarding = event.regarding.clone().unwrap_or_default();
        assert!(is(&regarding.kind, "Service"), "{event:#?}");
        assert!(is(&regarding.name, name), "{event:#?}");
        assert_eq!(regarding.uid.as_deref(), api_uid, "{event:#?}");
        assert!(is(&event.metadata.namespace, ns), "{event:#?}");
    }
    // The real kubectl finds them where an operator looks.
    let mut by_service: Vec<&str> = cases.iter().map(|c| c.service).collect();
    by_service.dedup();
    for service in by_service {
        let (ns, name) = service.split_once('/').unwrap();
        // The server listens inside the node's namespace.
        let out = Command::new("ip")
            .args(["netns", "exec", lab::NS_NODE, "kubectl", "--kubeconfig"])
            .arg(api.kubeconfig())
            .args(["-n", ns, "describe", "service", name])
            .env_remove("KUBECONFIG")
            .output()
            .expect("kubectl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let events = text.split("Events:").nth(1).unwrap_or_default();
        for case in cases.iter().filter(|c| c.service == service) {
            assert!(
                events.contains(case.reason),
                "kubectl describe service {name} lists no {}:\n{text}",
                case.reason
            );
        }
    }
    assert!(agent.stop().success());
    drop(api);
    drop(lab);
}
