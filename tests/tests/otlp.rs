//! OTLP export end to end: the real agent in the lab's node namespace with `--otlp-endpoint`
//! pointing at a real OTLP/gRPC receiver (the protocol's own generated services, see
//! `probe_tests::otlp`) on 127.0.0.1 there. A confirmed hairpin must arrive as log records
//! with its attributes, one per line of the agent's JSON stream, and the `/metrics` counters as
//! OTLP metrics. A receiver that is down or hangs must cost only counted drops: the loop is
//! still confirmed, and SIGTERM still ends the agent cleanly.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{collections::BTreeMap, time::Duration};

use probe_contract::{LoopbackEvent, LoopbackKind};
use probe_tests::{
    agent::{Agent, node_metric, require_root, wait_for},
    kube_fixture::KubeFixture,
    otlp::{Mode, Receiver, Record},
};
use serde_json::json;
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants};

const METRICS: &str = "127.0.0.1:19476";
const WAIT: Duration = Duration::from_secs(30);
const CLIENT_POD: &str = "default/client-5d8f7c9b6-x2x9q";

/// The fake API server (so events name their Service and pod) and an agent exporting to
/// `endpoint`, metrics every second.
fn start(endpoint: &str) -> (KubeFixture, Agent) {
    let api = KubeFixture::lab();
    let mut agent = api.start_agent(&[
        "--metrics-addr",
        METRICS,
        "--kube-events",
        "off",
        "--otlp-endpoint",
        endpoint,
        "--otlp-interval",
        "1",
        // A loop resolves 2 s after its fix (the first test applies one).
        "--resolve-after",
        "2",
    ]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    (api, agent)
}

/// The agent's JSON lines of `kind`, once there is one.
fn json_events(agent: &Agent, kind: LoopbackKind) -> Vec<LoopbackEvent> {
    agent.wait_event(kind.as_str(), WAIT, |es| {
        let of_kind: Vec<LoopbackEvent> = es.iter().filter(|e| e.kind == kind).cloned().collect();
        (!of_kind.is_empty()).then_some(of_kind)
    })
}

/// Drives pod-a's hairpin; the agent's hairpin JSON lines, the first naming pod-a.
fn hairpin_named(lab: &LabGuard, agent: &Agent) -> Vec<LoopbackEvent> {
    assert_eq!(lab.traffic(Scenario::Hairpin).unwrap(), Outcome::Timeout);
    let lines = json_events(agent, LoopbackKind::Hairpin);
    assert_eq!(
        lines[0].client_pod.as_deref(),
        Some(CLIENT_POD),
        "{:#?}",
        lines[0]
    );
    lines
}

/// What a record must say about its JSON line: every attribute from the event's own field,
/// spelled as the line spells it (the record's attributes are OTLP's, read as JSON values).
fn assert_record_matches(r: &Record, e: &LoopbackEvent) {
    let a = &r.attributes;
    let ctx = || format!("record {r:#?}\nJSON line {e:#?}");
    assert_eq!(r.event_name, "clb_probe.loopback", "{}", ctx());
    assert_eq!(a["clb_probe.kind"], json!(e.kind), "{}", ctx());
    assert_eq!(a["clb_probe.key"], json!(e.key), "{}", ctx());
    assert_eq!(a["clb_probe.node"], json!(e.node), "{}", ctx());
    assert_eq!(a["clb_probe.service"], json!(e.service), "{}", ctx());
    assert_eq!(a["clb_probe.vip"], json!(e.vip), "{}", ctx());
    assert_eq!(a["clb_probe.vip_port"], json!(e.vip_port), "{}", ctx());
    assert_eq!(a["clb_probe.client_pod"], json!(e.client_pod), "{}", ctx());
    assert_eq!(a["clb_probe.src"], json!(e.src), "{}", ctx());
    assert_eq!(a["clb_probe.dst"], json!(e.dst), "{}", ctx());
    assert_eq!(a["clb_probe.count"], json!(e.count), "{}", ctx());
    assert_eq!(a["clb_probe.evidence"], json!(e.evidence), "{}", ctx());
    let fix = e
        .fixes
        .first()
        .unwrap_or_else(|| panic!("no fix: {}", ctx()));
    assert_eq!(a["clb_probe.fix_id"], json!(fix.id), "{}", ctx());
    assert_eq!(
        a["clb_probe.fix"],
        format!("{}: {}", fix.id, fix.change),
        "{}",
        ctx()
    );
    assert_eq!(r.resource["service.name"], "clb-probe", "{}", ctx());
    assert_eq!(r.resource["k8s.node.name"], "clb-node", "{}", ctx());
}

#[test]
fn a_confirmed_hairpin_arrives_as_log_records_and_the_counters_as_metrics() {
    let Some(lab) = LabGuard::for_test("otlp", &Variants::default()) else {
        return;
    };
    let receiver = Receiver::start_in_netns(lab::NS_NODE, Mode::Accept);
    let (_api, mut agent) = start(&receiver.endpoint());

    let first = hairpin_named(&lab, &agent);
    // The attributes under test are all there to compare (attribution named them).
    assert!(first[0].service.is_some(), "{:#?}", first[0]);
    assert!(!first[0].fixes.is_empty(), "{:#?}", first[0]);

    // One record per JSON line, each saying what its line says. The JSON line is written first
    // (the record goes through its exporter's queue), so wait until they agree.
    let (lines, records) = wait_for("a record per JSON line", WAIT, || {
        let lines = agent.events();
        let records = receiver.records();
        (!lines.is_empty() && records.len() == lines.len()).then_some((lines, records))
    })
    .unwrap_or_else(|| {
        panic!(
            "JSON lines:\n{:#?}\nrecords:\n{:#?}",
            agent.events(),
            receiver.records()
        )
    });
    assert!(
        lines.iter().all(|e| e.kind == LoopbackKind::Hairpin),
        "only the hairpin: {lines:#?}"
    );
    let by_line: BTreeMap<(String, u64), &LoopbackEvent> = lines
        .iter()
        .map(|e| ((e.key.clone(), e.count), e))
        .collect();
    for r in &records {
        let id = (
            r.attributes["clb_probe.key"].as_str().unwrap().to_string(),
            r.attributes["clb_probe.count"].as_u64().unwrap(),
        );
        let line = by_line
            .get(&id)
            .unwrap_or_else(|| panic!("a record with no JSON line: {r:#?}\n{lines:#?}"));
        assert_record_matches(r, line);
        assert!(r.body.contains("hairpin"), "{r:#?}");
    }

    // The counters as metrics: the same names as /metrics (counters without `_total`, as
    // OTLP names them), the hairpin counted, gauges as gauges.
    let metrics = wait_for("the hairpin counted in OTLP metrics", WAIT, || {
        let m = receiver.latest_metrics();
        m.get("clbprobe_loopback_events")
            .is_some_and(|e| {
                e.points
                    .iter()
                    .any(|(l, v)| l.get("kind").map(String::as_str) == Some("hairpin") && *v >= 1.0)
            })
            .then_some(m)
    })
    .unwrap_or_else(|| panic!("no hairpin in {:#?}", receiver.latest_metrics()));
    let events = &metrics["clbprobe_loopback_events"];
    assert!(events.monotonic_sum, "{events:#?}");
    let (labels, n) = events
        .points
        .iter()
        .find(|(l, _)| l["kind"] == "hairpin")
        .unwrap();
    assert_eq!(labels["vip"], lab::VIP.to_string());
    assert_eq!(labels["port"], "80");
    // Never more than /metrics says now (the export was collected earlier).
    let scraped = node_metric(
        METRICS,
        &format!(
            "clbprobe_loopback_events_total{{kind=\"hairpin\",vip=\"{}\",port=\"80\"}}",
            lab::VIP
        ),
    );
    assert!(
        *n >= 1.0 && *n <= scraped as f64,
        "{n} vs /metrics {scraped}"
    );
    for counter in [
        "clbprobe_suspect_packets",
        "clbprobe_kernel_events_read",
        "clbprobe_otlp_exported",
        "clbprobe_otlp_dropped",
    ] {
        assert!(
            metrics.get(counter).is_some_and(|m| m.monotonic_sum),
            "{counter}: {:#?}",
            metrics.get(counter)
        );
    }
    let resource = receiver.metrics_resource();
    assert_eq!(resource["service.name"], "clb-probe", "{resource:#?}");
    assert_eq!(resource["k8s.node.name"], "clb-node", "{resource:#?}");
    let ready = &metrics["clbprobe_ready"];
    assert!(!ready.monotonic_sum);
    assert_eq!(ready.points[0].1, 1.0, "{ready:#?}");
    // What the receiver accepted is counted; nothing was lost.
    assert!(node_metric(METRICS, "clbprobe_otlp_exported_total{signal=\"logs\"}") >= 1);
    assert_eq!(
        node_metric(METRICS, "clbprobe_otlp_dropped_total{signal=\"logs\"}"),
        0
    );

    // The fix (pod-a's egress masqueraded; a second first, so the answered call is later
    // than the failure to conntrack's second): the loop's resolution is one INFO record.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(lab.traffic(Scenario::HairpinSnat).unwrap(), Outcome::Ok);
    let resolved = wait_for("the resolution's record", WAIT, || {
        receiver
            .records()
            .into_iter()
            .find(|r| r.event_name == "clb_probe.loop_resolved")
    })
    .unwrap_or_else(|| panic!("no resolution record: {:#?}", receiver.records()));
    let a = &resolved.attributes;
    assert_eq!(a["clb_probe.kind"], "hairpin", "{resolved:#?}");
    assert_eq!(
        a["clb_probe.service"],
        json!(first[0].service),
        "{resolved:#?}"
    );
    assert_eq!(a["clb_probe.vip"], lab::VIP.to_string(), "{resolved:#?}");
    assert_eq!(a["clb_probe.node"], "clb-node", "{resolved:#?}");
    assert!(
        a["clb_probe.proof"][0]
            .as_str()
            .is_some_and(|p| p.contains("answered connections to")),
        "{resolved:#?}"
    );
    assert!(
        resolved.body.starts_with("loop resolved: hairpin"),
        "{resolved:#?}"
    );

    assert!(agent.stop().success());
    drop(lab);
}

/// With the receiver in `mode` (None: nothing listens), the hairpin is still confirmed, the
/// lost records are counted, and SIGTERM ends the agent cleanly.
fn unreachable_receiver_costs_counted_drops(mode: Option<Mode>) {
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let receiver = mode.map(|m| Receiver::start_in_netns(lab::NS_NODE, m));
    let endpoint = match &receiver {
        Some(r) => r.endpoint(),
        // A port nothing listens on: bound and released in the namespace.
        None => {
            let free = Receiver::start_in_netns(lab::NS_NODE, Mode::Accept);
            let endpoint = free.endpoint();
            drop(free);
            endpoint
        }
    };
    let (_api, mut agent) = start(&endpoint);
    hairpin_named(&lab, &agent);
    // The record of that line is lost, and counted (after the export's deadline when the
    // receiver hangs).
    let dropped = wait_for("the lost record counted", WAIT, || {
        let n = node_metric(METRICS, "clbprobe_otlp_dropped_total{signal=\"logs\"}");
        (n >= 1).then_some(n)
    });
    assert!(
        dropped.is_some(),
        "no drop counted:\n{}",
        agent.log_lines().join("\n")
    );
    assert_eq!(
        node_metric(METRICS, "clbprobe_otlp_exported_total{signal=\"logs\"}"),
        0
    );
    // Detection went on meanwhile: a second loop is confirmed too.
    assert_eq!(
        lab.traffic(Scenario::VipPortUnserved).unwrap(),
        Outcome::Refused
    );
    json_events(&agent, LoopbackKind::VipPortUnserved);
    if let Some(r) = &receiver {
        assert!(r.requests().0 >= 1, "the hung receiver was reached");
    }
    assert!(agent.stop().success(), "SIGTERM ends the agent cleanly");
    drop(receiver);
    drop(lab);
}

#[test]
fn a_receiver_that_is_down_costs_counted_drops_only() {
    if !require_root("otlp") {
        return;
    }
    unreachable_receiver_costs_counted_drops(None);
}

#[test]
fn a_receiver_that_hangs_costs_counted_drops_only() {
    if !require_root("otlp") {
        return;
    }
    unreachable_receiver_costs_counted_drops(Some(Mode::Hang));
}
