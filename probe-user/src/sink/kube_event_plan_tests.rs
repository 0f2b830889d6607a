//! The planner with an injected clock: create vs patch vs hold, both rate limits, names, notes.

use std::time::{Duration, SystemTime};

use probe_contract::{
    LoopbackKind,
    kube_event::{fnv1a, kind_of_reason, reason},
};

use super::*;
use crate::sink::kube_event_doc::{ObjectRef, note};

const NODE: &str = "node-a";

fn ev(kind: LoopbackKind, key: &str, count: u64) -> LoopbackEvent {
    LoopbackEvent {
        kind,
        count,
        remedy: vec!["call web.shop.svc instead of 203.0.113.10".to_string()],
        ..crate::test_events::hairpin(key)
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn wall(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
}

/// `p` observes the hairpin `k1` at `count`, `t` s in (on both clocks).
fn hairpin_k1(p: &mut EventPlanner, n: &Names, count: u64, t: u64) -> Result<Write, Held> {
    p.observe(&ev(LoopbackKind::Hairpin, "k1", count), n, secs(t), wall(t))
}

fn names(service: &str, pod: &str) -> Names {
    Names {
        service: Some(service.to_string()),
        service_uid: None,
        client_pod: Some(pod.to_string()),
    }
}

#[test]
fn first_report_creates_then_repeats_patch_the_series_at_most_once_a_minute() {
    let mut p = EventPlanner::new(PlanConfig::default(), NODE);
    let n = names("shop/web", "shop/client-0");
    let w = hairpin_k1(&mut p, &n, 1, 0);
    let Ok(Write::Create(doc)) = w else {
        panic!("{w:?}")
    };
    assert_eq!(doc.series, None);
    assert_eq!(doc.reason, "LoopbackHairpin");
    assert_eq!(doc.namespace, "shop");
    assert_eq!(
        doc.regarding,
        ObjectRef {
            kind: "Service",
            namespace: "shop".into(),
            name: "web".into(),
            uid: None,
        }
    );
    assert_eq!(
        doc.related.as_ref().map(|r| r.name.as_str()),
        Some("client-0")
    );
    assert_eq!(doc.instance, NODE);

    // Repeats within the minute: held, not written.
    for (i, t) in [1, 10, 59].into_iter().enumerate() {
        let r = hairpin_k1(&mut p, &n, 2 + i as u64, t);
        assert_eq!(r, Err(Held::Throttled));
    }
    assert_eq!(p.pending(), 1);
    assert!(p.due(secs(59)).is_empty());
    // The window passes: the held repeat is written as a patch with the latest count.
    let due = p.due(secs(60));
    assert_eq!(due.len(), 1);
    let Write::Patch(doc) = &due[0] else {
        panic!("{due:?}")
    };
    let series = doc.series.expect("a patch carries the series");
    assert_eq!(series.count, 4);
    assert_eq!(series.last_observed, wall(59));
    assert_eq!(doc.event_time, wall(0), "eventTime stays the first write's");
    assert_eq!(p.pending(), 0);
    assert!(p.due(secs(200)).is_empty(), "nothing new: nothing written");
    // Same count again: unchanged.
    let r = hairpin_k1(&mut p, &n, 4, 300);
    assert_eq!(r, Err(Held::Unchanged));
    // A new repeat after the window: patched at once.
    let r = hairpin_k1(&mut p, &n, 5, 301);
    assert!(matches!(r, Ok(Write::Patch(_))), "{r:?}");
}

#[test]
fn a_storm_of_distinct_aggregates_is_bounded_by_the_bucket() {
    let cfg = PlanConfig::default();
    let mut p = EventPlanner::new(cfg.clone(), NODE);
    let mut writes = 0;
    let mut limited = 0;
    // 1,000 distinct aggregates within one second, each of its own Service (one Service's
    // many would be folded into a flood Event: see the E1 test).
    for i in 0..1000 {
        match p.observe(
            &ev(LoopbackKind::VipPortUnserved, &format!("k{i}"), 1),
            &names(&format!("shop/web-{i}"), "shop/client-0"),
            Duration::from_millis(i),
            wall(0),
        ) {
            Ok(_) => writes += 1,
            Err(Held::RateLimited) => limited += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(writes, cfg.burst);
    assert_eq!(limited, 1000 - cfg.burst);
    // Over ten minutes, one write per refill period.
    let mut later = 0;
    for s in 1..=600 {
        later += p.due(secs(s)).len() as u32;
    }
    assert_eq!(later, 600 / 6);
    assert_eq!(p.pending(), 1000 - 10 - 100);
}

#[test]
fn the_bucket_refills_but_does_not_bank_idle_time_beyond_its_burst() {
    let cfg = PlanConfig {
        burst: 2,
        refill_every: secs(10),
        ..PlanConfig::default()
    };
    let mut p = EventPlanner::new(cfg, NODE);
    let mut write = |i: u32, t: u64| {
        p.observe(
            &ev(LoopbackKind::VipAsSource, &format!("k{i}"), 1),
            &Names::default(),
            secs(t),
            wall(t),
        )
        .is_ok()
    };
    assert!(write(0, 0) && write(1, 0));
    assert!(!write(2, 5));
    assert!(write(3, 10));
    // Idle for an hour: still only the burst.
    assert!(write(4, 3600) && write(5, 3600));
    assert!(!write(6, 3600));
}

#[test]
fn without_a_service_the_event_regards_the_node_in_default() {
    let mut p = EventPlanner::new(PlanConfig::default(), NODE);
    let e = ev(LoopbackKind::HealthcheckBlackhole, "hc", 3);
    let Ok(Write::Create(doc)) = p.observe(&e, &Names::default(), secs(0), wall(0)) else {
        panic!()
    };
    assert_eq!(doc.namespace, "default");
    assert_eq!(doc.regarding.kind, "Node");
    assert_eq!(doc.regarding.name, NODE);
    assert_eq!(doc.related, None, "no pod known");
    assert_eq!(doc.reason, "HealthCheckBlackhole");
    // Created already repeated: the series goes with the create.
    assert_eq!(doc.series.map(|s| s.count), Some(3));
}

#[test]
fn the_service_table_name_is_used_when_attribution_has_none_and_pods_only_on_hairpins() {
    let mut e = ev(LoopbackKind::VipPortUnserved, "u", 1);
    e.service = Some("shop/web".into());
    let doc = event_doc(&e, &names("bad", "shop/client-0"), NODE, wall(0));
    assert_eq!(doc.regarding.name, "web", "a malformed name falls back");
    assert_eq!(doc.related, None, "related is only for a hairpin's client");
    assert_eq!(doc.reason, "VipPortUnserved");
}

#[test]
fn names_are_deterministic_valid_and_distinct() {
    let a = event_name(
        NODE,
        "hairpin/l4/10.0.0.1->203.0.113.10:80",
        LoopbackKind::Hairpin,
    );
    assert_eq!(
        a,
        event_name(
            NODE,
            "hairpin/l4/10.0.0.1->203.0.113.10:80",
            LoopbackKind::Hairpin
        )
    );
    assert!(a.starts_with("clb-probe.node-a.hairpin."), "{a}");
    assert_ne!(
        a,
        event_name(
            NODE,
            "hairpin/l4/10.0.0.2->203.0.113.10:80",
            LoopbackKind::Hairpin
        )
    );
    assert_ne!(
        a,
        event_name(
            "node-b",
            "hairpin/l4/10.0.0.1->203.0.113.10:80",
            LoopbackKind::Hairpin
        )
    );
    // A pinned value: the hash must not change between releases (restarted agents patch).
    assert_eq!(
        event_name("n", "k", LoopbackKind::VipAsSource),
        format!("clb-probe.n.vip-as-source.{:016x}", fnv1a(b"k"))
    );
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    let long = event_name(&"x".repeat(300), "k", LoopbackKind::Hairpin);
    assert!(long.len() <= 253, "{}", long.len());
    let odd = event_name("Node_A.", "k", LoopbackKind::Hairpin);
    assert!(
        odd.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
        "{odd}"
    );
}

#[test]
fn notes_say_cause_and_first_remedy_and_stay_under_1_kib() {
    let e = ev(LoopbackKind::Hairpin, "k", 1);
    let n = note(&e);
    assert!(
        n.contains("10.244.1.7") && n.contains("203.0.113.10:80"),
        "{n}"
    );
    assert!(
        n.ends_with("Remedy: call web.shop.svc instead of 203.0.113.10"),
        "{n}"
    );
    let mut long = e.clone();
    long.remedy = vec!["é".repeat(2000)];
    let n = note(&long);
    assert!(n.len() <= NOTE_MAX && n.ends_with('…'), "{}", n.len());
    assert_eq!(truncate("abc".into(), 3), "abc");
}

#[test]
fn a_note_names_the_first_fix_and_the_command_that_applies_it() {
    let mut e = ev(LoopbackKind::Hairpin, "k", 1);
    let fix = |id: &str, patch: bool| probe_contract::Fix {
        id: id.into(),
        provider: "generic".into(),
        change: format!("change of {id}"),
        service: patch.then(|| "shop/web".into()),
        patch: patch.then(|| serde_json::json!({"spec": {}})),
        undo: patch.then(|| serde_json::json!({"spec": {}})),
        preconditions: vec![],
        side_effects: vec![],
        source: "https://example.invalid/".into(),
    };
    e.fixes = vec![fix("etp-cluster", true), fix("call-by-service-name", false)];
    let n = note(&e);
    assert!(
        n.ends_with(
            "Fix: kubectl clb-probe fix -n shop web --apply etp-cluster (change of etp-cluster)."
        ),
        "{n}"
    );
    assert!(!n.contains("Remedy:"), "{n}");
    e.fixes.remove(0);
    let n = note(&e);
    assert!(
        n.ends_with("Fix: call-by-service-name: change of call-by-service-name."),
        "{n}"
    );
}

#[test]
fn reasons_map_back_to_kinds() {
    for k in [
        LoopbackKind::HealthcheckBlackhole,
        LoopbackKind::Hairpin,
        LoopbackKind::VipPortUnserved,
        LoopbackKind::VipAsSource,
    ] {
        assert_eq!(kind_of_reason(reason(k)), Some(k));
    }
    assert_eq!(kind_of_reason("Other"), None);
}

#[test]
fn tracked_aggregates_are_bounded() {
    let cfg = PlanConfig {
        max_tracked: 3,
        ..PlanConfig::default()
    };
    let mut p = EventPlanner::new(cfg, NODE);
    for i in 0..10 {
        let _ = p.observe(
            &ev(LoopbackKind::VipAsSource, &format!("k{i}"), 1),
            &Names::default(),
            secs(i),
            wall(i),
        );
    }
    assert!(p.tracked.len() <= 3);
}

fn resolution(key: &str, episode: u32) -> LoopResolution {
    LoopResolution {
        key: format!("hairpin/{key}"),
        kind: LoopbackKind::Hairpin,
        service: Some("shop/web".into()),
        vip: Some("203.0.113.10".parse().unwrap()),
        vip_port: Some(80),
        first_seen: "2026-11-25T01:00:00Z".into(),
        last_seen: "2026-11-25T01:01:00Z".into(),
        resolved_at: "2026-11-25T01:06:00Z".into(),
        lasted_s: 60,
        count: 3,
        episode,
        aggregates: vec![key.to_string()],
        proof: vec![
            "not confirmed again for 300 s, while 2 answered connections to 203.0.113.10:80/tcp from the loop's own clients (10.244.1.7) passed packets since".into(),
            "conntrack: tcp 10.244.1.7:40000 -> 203.0.113.10:80 (TIME_WAIT), answered, source-NATed on this node, latest packet 5 s ago".into(),
        ],
        changed: vec!["spec.externalTrafficPolicy: Local -> Cluster".into()],
    }
}

#[test]
fn a_resolution_is_a_normal_event_on_the_warnings_object_and_a_recurrence_a_new_warning() {
    let mut p = EventPlanner::new(PlanConfig::default(), NODE);
    let n = Names {
        service_uid: Some("uid-web".into()),
        ..names("shop/web", "shop/client-0")
    };
    let Ok(Write::Create(warning)) = hairpin_k1(&mut p, &n, 3, 0) else {
        panic!("no create")
    };
    assert_eq!(warning.event_type, "Warning");
    let Some(Write::Create(done)) = p.resolved(&resolution("k1", 0), secs(400), wall(400)) else {
        panic!("no resolved Event")
    };
    assert_eq!(
        (done.event_type, done.reason, done.action),
        ("Normal", "LoopbackResolved", "Resolved")
    );
    assert_eq!(
        done.regarding, warning.regarding,
        "the same Service, uid included"
    );
    assert_eq!(done.related, warning.related);
    assert_ne!(done.name, warning.name);
    assert!(
        done.note.contains("lasted 60 s (confirmed 3 times"),
        "{}",
        done.note
    );
    assert!(
        done.note
            .contains("; conntrack: tcp 10.244.1.7:40000 -> 203.0.113.10:80 (TIME_WAIT)"),
        "the Event quotes the proof's 5-tuple: {}",
        done.note
    );
    assert!(
        done.note
            .contains("spec.externalTrafficPolicy: Local -> Cluster"),
        "{}",
        done.note
    );
    let v = serde_json::to_value(crate::sink::kube_events::to_event(&done)).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["reason"].as_str()),
        (Some("Normal"), Some("LoopbackResolved"))
    );
    // It recurs (the aggregate's count goes on at 4): a new Warning, counted from 1.
    let Ok(Write::Create(again)) = hairpin_k1(&mut p, &n, 4, 500) else {
        panic!("no new Warning")
    };
    assert_ne!(again.name, warning.name);
    assert_ne!(again.name, done.name);
    assert_eq!(again.series, None);
    let Ok(Write::Patch(repeat)) = hairpin_k1(&mut p, &n, 6, 600) else {
        panic!("no patch")
    };
    assert_eq!(repeat.name, again.name);
    assert_eq!(repeat.series.map(|s| s.count), Some(3));
}

#[test]
fn resolutions_held_by_the_bucket_are_written_when_it_refills() {
    let cfg = PlanConfig {
        burst: 1,
        ..PlanConfig::default()
    };
    let refill = cfg.refill_every;
    let mut p = EventPlanner::new(cfg, NODE);
    assert!(p.resolved(&resolution("a", 0), secs(0), wall(0)).is_some());
    assert!(p.resolved(&resolution("b", 0), secs(1), wall(1)).is_none());
    let later = p.due(secs(1) + refill);
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].doc().reason, "LoopbackResolved");
    assert!(p.due(secs(1) + refill * 3).is_empty());
}

/// A confirmation of `kind` at `vip` (`port` when the kind has one), aggregate `key`.
fn at(kind: LoopbackKind, key: &str, vip: &str, port: Option<u16>, count: u64) -> LoopbackEvent {
    LoopbackEvent {
        vip: Some(vip.parse().unwrap()),
        vip_port: port,
        ..ev(kind, key, count)
    }
}

/// E1 (hostile round 3): uid 65534 connects to 20 new unserved ports of a bound VIP a second
/// for 240 s; from t = 10 s the LB's health checks are black-holed (confirmed every 2 s). The
/// writer's loop is replayed: a report is observed as it comes, `due` every 2 s. The real
/// blackhole gets its Event, and the flood is written as a few Events, not one per port.
#[test]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn a_flood_of_unserved_ports_does_not_starve_a_real_blackhole() {
    let mut p = EventPlanner::new(PlanConfig::default(), NODE);
    let mut writes: Vec<(Duration, Write)> = Vec::new();
    let mut blackhole_count = 0;
    for ms in (0..240_000u64).step_by(50) {
        let now = Duration::from_millis(ms);
        let port = u16::try_from(ms / 50).unwrap();
        let flood = at(
            LoopbackKind::VipPortUnserved,
            &format!("vip_port_unserved/203.0.113.10:{port}/tcp"),
            "203.0.113.10",
            Some(port),
            1,
        );
        if let Ok(w) = p.observe(&flood, &Names::default(), now, wall(ms / 1000)) {
            writes.push((now, w));
        }
        if ms % 2_000 == 0 {
            if ms >= 10_000 {
                blackhole_count += 1;
                let blackhole = at(
                    LoopbackKind::HealthcheckBlackhole,
                    "healthcheck_blackhole/198.51.100.7",
                    "198.51.100.7",
                    None,
                    blackhole_count,
                );
                if let Ok(w) = p.observe(&blackhole, &Names::default(), now, wall(ms / 1000)) {
                    writes.push((now, w));
                }
            }
            writes.extend(p.due(now).into_iter().map(|w| (now, w)));
        }
    }
    let blackhole = writes
        .iter()
        .find(|(_, w)| w.doc().reason == reason(LoopbackKind::HealthcheckBlackhole));
    let unserved: std::collections::HashSet<&str> = writes
        .iter()
        .filter(|(_, w)| w.doc().reason == reason(LoopbackKind::VipPortUnserved))
        .map(|(_, w)| w.doc().name.as_str())
        .collect();
    eprintln!(
        "blackhole Event written at {:?}; {} writes, {} distinct unserved-port Events",
        blackhole.map(|(t, _)| *t),
        writes.len(),
        unserved.len()
    );
    let (written_at, _) = blackhole.expect("the real blackhole's Event is written");
    assert!(
        *written_at <= secs(20),
        "the blackhole waits for at most a few tokens: {written_at:?}"
    );
    assert!(
        unserved.len() <= PlanConfig::default().burst as usize,
        "the flood is aggregated: {} Events",
        unserved.len()
    );
    assert!(
        writes
            .iter()
            .any(|(_, w)| w.doc().note.starts_with("Flood: ")),
        "the flood is named as a flood"
    );
}

/// E14 (hostile round 3): node names of up to 253 characters are valid, `reportingInstance` is
/// limited to 128 by the API (`ReportingInstanceLengthLimit`, with reason and action 128 and
/// note 1024): the Events of such a node are within every limit, distinct per node, and the
/// plugin still takes them for an agent's.
#[test]
fn a_long_node_name_is_cut_to_the_apis_limits_and_still_recognised() {
    let label = "n".repeat(62);
    let long = |last: &str| format!("{label}.{label}.{label}.{label}{last}");
    let mut instances = Vec::new();
    for node in [long("a"), long("b"), "node-a".to_string()] {
        assert!(node.len() <= 253);
        let mut p = EventPlanner::new(PlanConfig::default(), &node);
        for (kind, names) in [
            (LoopbackKind::HealthcheckBlackhole, Names::default()),
            (LoopbackKind::Hairpin, names("shop/web", "shop/client-0")),
        ] {
            let w = p
                .observe(&ev(kind, kind.as_str(), 1), &names, secs(0), wall(0))
                .expect("written");
            let resolved = p
                .resolved(&resolution(kind.as_str(), 1), secs(1), wall(1))
                .expect("written");
            for doc in [w.doc(), resolved.doc()] {
                let event = super::super::kube_events::to_event(doc);
                let instance = event.reporting_instance.clone().unwrap();
                assert!(instance.len() <= 128, "{} bytes", instance.len());
                assert!(event.reporting_controller.as_ref().unwrap().len() <= 128);
                assert!(event.reason.as_ref().unwrap().len() <= 128);
                assert!(event.action.as_ref().unwrap().len() <= 128);
                assert!(event.note.as_ref().unwrap().len() <= NOTE_MAX);
                assert!(event.metadata.name.as_ref().unwrap().len() <= 253);
                assert_eq!(
                    clb_probe_client::plugin::forged_because(&event),
                    None,
                    "{instance}"
                );
                if node.len() <= 128 {
                    assert_eq!(instance, node, "a short name is kept as it is");
                }
                instances.push(instance);
            }
        }
    }
    instances.sort();
    instances.dedup();
    assert_eq!(instances.len(), 3, "one instance per node: {instances:?}");
}

/// A lane past `flood_after` folds its new aggregates into one flood Event (patched with the
/// running count and the newest examples); quiet for [`FLOOD_QUIET`], it writes Events of its
/// own again.
#[test]
fn a_flooded_lane_folds_then_gets_its_own_events_again_once_quiet() {
    let cfg = PlanConfig {
        per_aggregate: secs(1),
        ..PlanConfig::default()
    };
    let mut p = EventPlanner::new(cfg.clone(), NODE);
    let observe = |p: &mut EventPlanner, port: u16, t: Duration| {
        let e = at(
            LoopbackKind::VipPortUnserved,
            &format!("vip_port_unserved/203.0.113.10:{port}/tcp"),
            "203.0.113.10",
            Some(port),
            1,
        );
        p.observe(&e, &Names::default(), t, wall(t.as_secs()))
    };
    let mut names = std::collections::BTreeSet::new();
    for port in 0..8u16 {
        if let Ok(w) = observe(&mut p, port, secs(u64::from(port) * 2)) {
            names.insert(w.doc().name.clone());
        }
    }
    // Five Events of their own, then the flood Event (created, then patched).
    assert_eq!(names.len(), cfg.flood_after + 1, "{names:?}");
    let flood = p
        .tracked
        .values()
        .find(|t| t.doc.note.starts_with("Flood: "))
        .expect("a flood Event");
    assert_eq!(flood.count, 3);
    assert!(
        flood
            .doc
            .note
            .starts_with("Flood: 3 distinct vip_port_unserved aggregates")
    );
    assert!(
        flood
            .doc
            .note
            .contains("Newest: vip_port_unserved/203.0.113.10:7/tcp, "),
        "{}",
        flood.doc.note
    );
    // Quiet for FLOOD_QUIET: the next aggregate of the lane is an Event of its own.
    let later = secs(16) + FLOOD_QUIET;
    let w = observe(&mut p, 100, later).expect("written");
    assert!(matches!(w, Write::Create(_)), "{w:?}");
    assert!(!w.doc().note.starts_with("Flood: "), "{w:?}");
}
