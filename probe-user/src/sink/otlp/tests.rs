//! Endpoints, records and the metric families, without a receiver.

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::Ordering},
};

use opentelemetry::logs::AnyValue;
use probe_contract::LoopbackEvent;
use tokio::sync::mpsc;

use super::*;
use crate::hub::outputs::OtlpStats;

fn event() -> LoopbackEvent {
    LoopbackEvent {
        count: 2,
        evidence: vec!["first line".into(), "second line".into()],
        ..crate::test_events::hairpin("hairpin/198.19.1.10>203.0.113.10:80/tcp")
    }
}

#[test]
fn records_carry_the_event_s_facts_and_leave_out_what_it_lacks() {
    let bare: BTreeMap<_, _> = attributes(&event(), "node-a").into_iter().collect();
    assert_eq!(bare["clb_probe.kind"], AnyValue::from("hairpin"));
    assert_eq!(bare["clb_probe.node"], AnyValue::from("node-a"));
    assert_eq!(bare["clb_probe.vip"], AnyValue::from("203.0.113.10"));
    assert_eq!(bare["clb_probe.vip_port"], AnyValue::Int(80));
    assert_eq!(bare["clb_probe.count"], AnyValue::Int(2));
    assert_eq!(
        bare["clb_probe.evidence"],
        AnyValue::ListAny(Box::new(vec![
            AnyValue::from("first line"),
            AnyValue::from("second line")
        ]))
    );
    for absent in ["clb_probe.service", "clb_probe.client_pod", "clb_probe.fix"] {
        assert!(!bare.contains_key(absent), "{absent}");
    }
    let mut e = event();
    e.node = Some("clb-node".into());
    e.service = Some("default/web".into());
    e.client_pod = Some("default/client".into());
    let fix = |id: &str, change: &str| probe_contract::Fix {
        id: id.into(),
        provider: "generic".into(),
        change: change.into(),
        service: None,
        patch: None,
        undo: None,
        preconditions: vec![],
        side_effects: vec![],
        source: String::new(),
    };
    e.fixes = vec![
        fix("etp-cluster", "Set externalTrafficPolicy: Cluster"),
        fix("second", "not this one"),
    ];
    let full: BTreeMap<_, _> = attributes(&e, "node-a").into_iter().collect();
    assert_eq!(full["clb_probe.node"], AnyValue::from("clb-node"));
    assert_eq!(full["clb_probe.service"], AnyValue::from("default/web"));
    assert_eq!(
        full["clb_probe.client_pod"],
        AnyValue::from("default/client")
    );
    assert_eq!(
        full["clb_probe.fix"],
        AnyValue::from("etp-cluster: Set externalTrafficPolicy: Cluster")
    );
    assert_eq!(full["clb_probe.fix_id"], AnyValue::from("etp-cluster"));
}

#[test]
fn a_full_queue_drops_and_counts_and_never_blocks() {
    let (tx, _rx) = mpsc::channel(2);
    let stats = Arc::new(OtlpStats::default());
    let sink = OtlpLogs {
        tx,
        stats: stats.clone(),
    };
    // Were a write to wait for the exporter, this would never end.
    for _ in 0..100 {
        sink.write(&event());
    }
    assert_eq!(stats.logs_dropped.load(Ordering::Relaxed), 98);
}

#[test]
fn endpoints_are_checked() {
    assert!(parse_endpoint("http://127.0.0.1:4317").is_ok());
    assert!(parse_endpoint("http://otel-collector.monitoring:4317/").is_ok());
    for bad in [
        "",
        "not a url",
        "127.0.0.1:4317",
        "https://c:4317",
        "ftp://c:1",
        "http://:4317",
    ] {
        assert!(parse_endpoint(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_metrics_rendering_parses_back_into_the_same_families_and_values() {
    let mut input = super::super::metrics::MetricsInput {
        version: "0.1.0".into(),
        kernel: "6.12 \"x\"".into(),
        events: vec![(("hairpin".into(), "203.0.113.10".into(), "80".into()), 3)],
        otlp: vec![("logs".into(), 1, 2)],
        ..Default::default()
    };
    input.suspects = vec![("eth0".into(), "vip".into(), 7)];
    let text = super::super::metrics::render(&input);
    let families: BTreeMap<_, _> = parse_openmetrics(&text)
        .into_iter()
        .map(|f| (f.name.clone(), f))
        .collect();
    let events = &families["clbprobe_loopback_events"];
    assert!(events.counter);
    assert!(events.help.starts_with("Confirmed load-balancer loopback"));
    assert_eq!(
        events.samples,
        vec![(
            vec![
                ("kind".into(), "hairpin".into()),
                ("vip".into(), "203.0.113.10".into()),
                ("port".into(), "80".into())
            ],
            3.0
        )]
    );
    assert_eq!(
        families["clbprobe_otlp_dropped"].samples,
        vec![(vec![("signal".into(), "logs".into())], 2.0)]
    );
    let build = &families["clbprobe_build_info"];
    assert!(!build.counter);
    assert_eq!(
        build.samples[0].0,
        vec![
            ("version".into(), "0.1.0".into()),
            ("kernel".into(), "6.12 \"x\"".into())
        ]
    );
    assert!(!families["clbprobe_ready"].counter);
    // Every sample line of the text is one family's sample: nothing is lost.
    let lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let samples: usize = families.values().map(|f| f.samples.len()).sum();
    assert_eq!(lines, samples, "{text}");
}
