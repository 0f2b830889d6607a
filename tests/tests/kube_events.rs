//! `--kube-events`: the real agent on the lab writes confirmed loopbacks as Kubernetes Events
//! to the in-process fake API server (test_support::kubeapi: the real kube client on the wire, no
//! kube-apiserver here). The server listens inside the lab node's network namespace, where the
//! agent runs; its request log counts the writes.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{net::SocketAddrV4, time::Duration};

use k8s_openapi::api::events::v1::Event;
use probe_contract::{LoopbackEvent, LoopbackKind};
use probe_tests::{
    agent::{Agent, assert_contains, require_root, wait_for},
    kube_fixture::{KubeFixture, NODE_NAME},
    kube_names::Case,
    written::{clb_events, is},
};
use test_support::{
    kubeapi::FakeApiServer,
    lab::{self, LabGuard, Scenario, Variants},
};

const WAIT: Duration = Duration::from_secs(20);

/// Dropped in this order: the agent, the server, the lab.
struct Setup {
    agent: Agent,
    api: KubeFixture,
    lab: LabGuard,
}

impl Setup {
    /// Drives `scenario` in the lab; the agent's first event of `kind` (it must come).
    fn confirmed(&self, scenario: Scenario, kind: LoopbackKind) -> LoopbackEvent {
        self.lab.traffic(scenario).expect("traffic");
        self.agent.first_event_of(kind, WAIT)
    }
}

/// Lab up, the fake API server in the node's namespace, the agent pointed at it; None where
/// the test `kube_events_<tag>` cannot run (not root: it says it skips).
fn setup(
    tag: &str,
    extra: &[&str],
    every_ms: Option<&str>,
    prepare: impl FnOnce(&FakeApiServer),
) -> Option<Setup> {
    let lab = LabGuard::for_test(&format!("kube_events_{tag}"), &Variants::default())?;
    // The lab's Node, Pods, Services and EndpointSlices: attribution names the Service.
    let api = KubeFixture::builder().tag(tag).start();
    prepare(&api);
    let mut env = vec![];
    if let Some(ms) = every_ms {
        env.push((clb_probe_every_env(), ms));
    }
    let agent = api.start_agent_with_env(extra, &env);
    Some(Setup { agent, api, lab })
}

/// `CLB_PROBE_TEST_KUBE_EVENTS_EVERY_MS` (probe-user's kube_events::PER_AGGREGATE_ENV).
fn clb_probe_every_env() -> &'static str {
    "CLB_PROBE_TEST_KUBE_EVENTS_EVERY_MS"
}

fn writes(api: &FakeApiServer) -> (usize, usize) {
    let reqs = api.requests();
    let n = |m: &str| {
        reqs.iter()
            .filter(|r| r.method == m && r.path.contains("/events"))
            .count()
    };
    (n("POST"), n("PATCH"))
}

fn metric(ns: &str, addr: &str, line_prefix: &str) -> Option<u64> {
    probe_tests::agent::metric_sample(ns, addr, line_prefix)
}

#[test]
fn a_confirmed_failure_is_one_event_whose_series_grows() {
    let Some(s) = setup("series", &[], Some("1000"), |_| {}) else {
        return;
    };
    let first = s.confirmed(
        Scenario::HealthcheckBlackhole,
        LoopbackKind::HealthcheckBlackhole,
    );
    // Repeats, spread beyond the (shortened) per-aggregate window.
    std::thread::sleep(Duration::from_millis(1500));
    s.lab
        .traffic(Scenario::HealthcheckBlackhole)
        .expect("traffic");
    let event = wait_for("an Event with a series", WAIT, || {
        let es = clb_events(&s.api);
        es.iter()
            .find(|e| e.series.as_ref().is_some_and(|s| s.count >= 2))
            .cloned()
    })
    .unwrap_or_else(|| panic!("no Event with series.count >= 2: {:#?}", clb_events(&s.api)));
    let all = clb_events(&s.api);
    assert_eq!(all.len(), 1, "repeats must patch, not create: {all:#?}");
    assert!(is(&event.type_, "Warning"), "{event:#?}");
    assert!(is(&event.reason, "HealthCheckBlackhole"), "{event:#?}");
    assert!(is(&event.action, "Detected"), "{event:#?}");
    assert!(is(&event.reporting_instance, NODE_NAME), "{event:#?}");
    let note = event.note.clone().unwrap_or_default();
    assert!(note.contains(&lab::VIP.to_string()), "{event:#?}");
    // The event carries its fixes (the bound VIP's: ipMode Proxy first, no API facts needed)
    // and the Event's note names the first one.
    let fixes: Vec<&str> = first.fixes.iter().map(|f| f.id.as_str()).collect();
    assert!(fixes.contains(&"ip-mode-proxy"), "{first:#?}");
    assert!(note.contains(" Fix: "), "{event:#?}");
    // Regarding the Service the API named (not the service table's `name:port`), else the
    // Node.
    let regarding = event.regarding.clone().unwrap_or_default();
    let (kind, name, namespace) = match &first.facts.service {
        Some(svc) => ("Service", svc.name.as_str(), svc.namespace.as_str()),
        None => ("Node", NODE_NAME, "default"),
    };
    assert!(is(&regarding.kind, kind), "{event:#?}");
    assert!(is(&regarding.name, name), "{event:#?}");
    assert!(is(&event.metadata.namespace, namespace), "{event:#?}");
    let (posts, patches) = writes(&s.api);
    assert_eq!(posts, 1, "one create");
    assert!(patches >= 1, "repeats patch the series");
}

#[test]
fn a_storm_of_distinct_failures_stays_under_the_rate_limit() {
    let Some(s) = setup("storm", &[], None, |_| {}) else {
        return;
    };
    let started = std::time::Instant::now();
    s.lab.traffic(Scenario::VipPortUnserved).expect("traffic");
    // 40 distinct aggregates: the VIP called on 40 ports nothing serves.
    for port in 2001..2041 {
        let _ = lab::connect_in(
            lab::NS_POD_A,
            None,
            SocketAddrV4::new(lab::VIP, port),
            Duration::from_millis(500),
        );
    }
    let confirmed = wait_for("the storm confirmed", WAIT, || {
        let es = s.agent.events();
        let ports: std::collections::BTreeSet<u64> = es
            .iter()
            .filter(|e| e.kind == LoopbackKind::VipPortUnserved)
            .filter_map(|e| e.vip_port.map(u64::from))
            .collect();
        (ports.len() >= 30).then_some(ports.len())
    })
    .expect("at least 30 distinct unserved ports confirmed");
    std::thread::sleep(Duration::from_secs(2));
    let (posts, patches) = writes(&s.api);
    // Burst 10, one more token per 6 s (kube_event_plan::PlanConfig::default()).
    let allowed = 10 + started.elapsed().as_secs() as usize / 6 + 1;
    assert!(
        posts + patches <= allowed,
        "{} writes for {confirmed} aggregates in {:?}: over the limit {allowed}",
        posts + patches,
        started.elapsed()
    );
    assert!(posts >= 1, "some Events written");
    assert!(posts + patches < confirmed, "the bucket held some back");
}

#[test]
fn denied_events_are_counted_once_logged_and_the_agent_keeps_confirming() {
    let metrics = "127.0.0.1:9977";
    let Some(mut s) = setup("forbidden", &["--metrics-addr", metrics], None, |api| {
        api.forbid("events", "create");
        api.forbid("events", "patch");
    }) else {
        return;
    };
    s.confirmed(
        Scenario::HealthcheckBlackhole,
        LoopbackKind::HealthcheckBlackhole,
    );
    s.confirmed(Scenario::VipPortUnserved, LoopbackKind::VipPortUnserved);
    let failed = wait_for("failed writes counted", WAIT, || {
        metric(
            lab::NS_NODE,
            metrics,
            "clbprobe_kube_event_writes_total{result=\"failed\"}",
        )
        .filter(|n| *n >= 2)
    });
    assert!(failed.is_some(), "two denied creates counted as failed");
    assert!(clb_events(&s.api).is_empty());
    assert_eq!(
        s.agent.count_log("cannot write Kubernetes Events"),
        1,
        "said once while it keeps failing"
    );
}

#[test]
fn kube_events_off_writes_nothing() {
    let Some(s) = setup("off", &["--kube-events", "off"], None, |_| {}) else {
        return;
    };
    s.confirmed(
        Scenario::HealthcheckBlackhole,
        LoopbackKind::HealthcheckBlackhole,
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(writes(&s.api), (0, 0));
    assert!(clb_events(&s.api).is_empty());
}

#[test]
fn a_hairpin_event_regards_the_service_and_relates_the_client_pod() {
    let Some(s) = setup("hairpin", &[], None, |_| {}) else {
        return;
    };
    let confirmed = s.confirmed(Scenario::Hairpin, LoopbackKind::Hairpin);
    let event = wait_for("the hairpin's Event", WAIT, || {
        clb_events(&s.api)
            .into_iter()
            .find(|e| is(&e.reason, "LoopbackHairpin"))
    })
    .unwrap_or_else(|| panic!("no LoopbackHairpin Event: {:#?}", clb_events(&s.api)));
    // Attribution named the client pod (the fake server holds the lab's pods): it is `related`.
    let pod = confirmed.client_pod.as_deref().expect("client_pod named");
    let (ns, name) = pod.split_once('/').unwrap();
    let related = event.related.clone().unwrap_or_default();
    assert!(is(&related.kind, "Pod"), "{event:#?}");
    assert!(is(&related.namespace, ns), "{event:#?}");
    assert!(is(&related.name, name), "{event:#?}");
    // The existing Service (the name without the service table's `:port`, and its uid).
    let svc = confirmed
        .facts
        .service
        .as_ref()
        .unwrap_or_else(|| panic!("no Service in the facts: {confirmed:#?}"));
    let regarding = event.regarding.clone().unwrap_or_default();
    assert!(is(&regarding.kind, "Service"), "{event:#?}");
    assert!(is(&regarding.name, &svc.name), "{event:#?}");
    assert_eq!(regarding.uid, svc.uid, "{event:#?}");
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("Service port: http (80/TCP)")
    );
}

/// [`probe_tests::kube_names::first_events_named_and_described`] as test `test` (root only).
fn first_events_named(test: &str, mode: lab::KubeProxyMode, cases: &[Case]) {
    if require_root(test) {
        probe_tests::kube_names::first_events_named_and_described(mode, cases);
    }
}

/// pod-a's hairpin: the kind every mode's run drives first.
fn hairpin_case() -> Case {
    case(
        Scenario::Hairpin,
        LoopbackKind::Hairpin,
        "LoopbackHairpin",
        true,
    )
}

fn case(scenario: Scenario, kind: LoopbackKind, reason: &'static str, client_pod: bool) -> Case {
    Case {
        scenario,
        kind,
        reason,
        service: "default/web",
        client_pod,
    }
}

/// kube-proxy iptables mode: the first hairpin of a run, confirmed before the agent's API
/// cache synced, still names its pod and Service; every kind that names a Service has its
/// Event on the existing Service (name and uid), listed by `kubectl describe service web`.
#[test]
fn iptables_first_events_are_named_and_on_the_service() {
    first_events_named(
        "kube_names_iptables",
        lab::KubeProxyMode::Iptables,
        &[
            hairpin_case(),
            case(
                Scenario::HealthcheckBlackhole,
                LoopbackKind::HealthcheckBlackhole,
                "HealthCheckBlackhole",
                false,
            ),
            case(
                Scenario::VipPortUnserved,
                LoopbackKind::VipPortUnserved,
                "VipPortUnserved",
                true,
            ),
            case(
                Scenario::VipAsSourceOut,
                LoopbackKind::VipAsSource,
                "VipAsSource",
                false,
            ),
        ],
    );
}

/// kube-proxy nftables mode (no LB IP is bound there: the hairpin is the kind that happens).
#[test]
fn nftables_first_events_are_named_and_on_the_service() {
    first_events_named(
        "kube_names_nftables",
        lab::KubeProxyMode::Nftables,
        &[hairpin_case()],
    );
}

/// Issue 26, proof that a loop is gone: a hairpin is confirmed (its Warning Event, the active
/// gauge at 1); the node's own answered call to the LB resolves nothing (issue 35: proof
/// comes from the loop's own clients); the fix is applied (pod-a's egress masqueraded, as a CNI's SNAT or
/// `ip-masq-agent` would) and pod-a's calls to the LB succeed; with `--resolve-after 2`, the
/// loop unconfirmed while that answered traffic flows is resolved: a Normal
/// `LoopbackResolved` Event on the same Service quoting pod-a's call, the gauge at 0, one
/// resolution counted. The fix undone, the loop recurs: a second, new Warning Event and one
/// regression counted.
#[test]
fn a_fixed_loop_is_resolved_with_proof_and_its_recurrence_is_a_regression() {
    let metrics = "127.0.0.1:9978";
    let Some(mut s) = setup(
        "resolved",
        &["--metrics-addr", metrics, "--resolve-after", "2"],
        None,
        |_| {},
    ) else {
        return;
    };
    let gauge = |family: &str, want: u64| {
        wait_for(family, WAIT, || {
            metric(
                lab::NS_NODE,
                metrics,
                &format!("{family}{{kind=\"hairpin\"}}"),
            )
            .filter(|n| *n == want)
        })
    };
    s.confirmed(Scenario::Hairpin, LoopbackKind::Hairpin);
    let warning = wait_for("the hairpin's Warning", WAIT, || {
        clb_events(&s.api)
            .into_iter()
            .find(|e| is(&e.reason, "LoopbackHairpin"))
    })
    .expect("a LoopbackHairpin Event");
    assert_eq!(gauge("clbprobe_loopback_active", 1), Some(1));

    // Issue 35 item 10: another client's success is no proof. The node's own call to the LB
    // (the LB never sends it back to its source node) is answered while pod-a still loops;
    // the quiet hairpin's proof look-ups that run after that call (two at least, waited for
    // in the agent's log, so a slow machine waits longer instead of testing nothing) resolve
    // nothing.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        s.lab.traffic(Scenario::NodeToLbGuarded).expect("traffic"),
        lab::Outcome::Ok
    );
    let lookups = |agent: &mut Agent| {
        agent
            .log_lines()
            .iter()
            .filter(|l| l.contains("a quiet loop's proof look-up") && l.contains("hairpin"))
            .count()
    };
    let before = lookups(&mut s.agent);
    wait_for("two proof look-ups after the node's call", WAIT, || {
        (lookups(&mut s.agent) >= before + 2).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "no proof look-up of the quiet hairpin ran:\n{}",
            s.agent.log_lines().join("\n")
        )
    });
    assert!(
        !clb_events(&s.api)
            .iter()
            .any(|e| is(&e.reason, "LoopbackResolved")),
        "the node's answered call resolved pod-a's hairpin: {:#?}",
        clb_events(&s.api)
    );
    assert_eq!(s.agent.count_log("loop resolved"), 0);

    // The fix: masqueraded, pod-a's call is answered (the LB sends it to the peer node). A
    // second first: conntrack tells an entry's age to the second, and the proof must see the
    // answered call as later than the failure (a slower machine only widens the gap).
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        s.lab.traffic(Scenario::HairpinSnat).expect("traffic"),
        lab::Outcome::Ok
    );
    let resolved = wait_for("the LoopbackResolved Event", WAIT, || {
        clb_events(&s.api)
            .into_iter()
            .find(|e| is(&e.reason, "LoopbackResolved"))
    })
    .unwrap_or_else(|| {
        panic!(
            "no LoopbackResolved Event: {:#?}\n{}",
            clb_events(&s.api),
            s.agent.log_lines().join("\n")
        )
    });
    assert!(is(&resolved.type_, "Normal"), "{resolved:#?}");
    assert!(is(&resolved.action, "Resolved"), "{resolved:#?}");
    assert_eq!(resolved.regarding, warning.regarding, "{resolved:#?}");
    assert_ne!(resolved.metadata.name, warning.metadata.name);
    let note = resolved.note.as_deref().unwrap_or_default();
    assert!(
        note.contains(&format!(
            "answered connections to {}:80/tcp from the loop's own clients",
            lab::VIP
        )),
        "the proof names pod-a's answered calls to the LB: {note}"
    );
    assert!(
        note.contains(&format!("; conntrack: tcp {}:", lab::POD_A_IP))
            && note.contains("source-NATed on this node"),
        "the proof quotes pod-a's masqueraded call by its 5-tuple: {note}"
    );
    assert_contains(note, "No change to the Service was seen");
    assert_eq!(gauge("clbprobe_loopback_active", 0), Some(0));
    assert_eq!(gauge("clbprobe_loopback_resolutions_total", 1), Some(1));
    assert_eq!(s.agent.count_log("loop resolved"), 1);

    // The fix undone: the loop recurs, as a new Warning and a regression.
    s.lab.traffic(Scenario::Hairpin).expect("traffic");
    let warnings = wait_for("a second Warning", WAIT, || {
        let w: Vec<Event> = clb_events(&s.api)
            .into_iter()
            .filter(|e| is(&e.reason, "LoopbackHairpin"))
            .collect();
        (w.len() == 2).then_some(w)
    })
    .unwrap_or_else(|| panic!("no second Warning: {:#?}", clb_events(&s.api)));
    assert_ne!(warnings[0].metadata.name, warnings[1].metadata.name);
    assert_eq!(gauge("clbprobe_loopback_regressions_total", 1), Some(1));
    assert_eq!(gauge("clbprobe_loopback_active", 1), Some(1));
}
