//! Rendering, totals and readiness, without a kernel.

use super::*;

fn input() -> MetricsInput {
    MetricsInput {
        version: "0.1.0".into(),
        kernel: "6.18.44".into(),
        process: Some(ProcessStats {
            cpu_seconds: 1.5,
            resident_bytes: 20 << 20,
            ..ProcessStats::default()
        }),
        events: vec![
            (
                (
                    "healthcheck_blackhole".into(),
                    "203.0.113.10".into(),
                    String::new(),
                ),
                3,
            ),
            (("hairpin".into(), "203.0.113.10".into(), "80".into()), 1),
        ],
        events_by_owner: vec![(("healthcheck_blackhole".into(), "route:66".into()), 3)],
        owner_counts: vec![("kube-ipvs0".into(), 1), ("route:66".into(), 1)],
        suspects: vec![("eth0".into(), "vip".into(), 7)],
        drops_by_reason: vec![("IP_LOCAL_SOURCE".into(), 5)],
        suppressed: vec![("budget".into(), 2), ("ringbuf".into(), 0)],
        budget_suppressed_by_class: vec![
            ("suspect".into(), "pod".into(), 2),
            ("drop".into(), "vip".into(), 0),
        ],
        set_sizes: vec![("vip".into(), 2), ("node".into(), 4), ("pod".into(), 2)],
        addresses_left_out: vec![("vip".into(), 50), ("node".into(), 0)],
        address_capacity: 256,
        drop_destinations_left_out: 7,
        attached_interfaces: 2,
        ready: true,
        vip_iface_present: true,
        unconfirmed_suspects: 1,
        pending: 0,
        events_read: 9,
        reader_wakeups: 4,
        reader_wakeups_suppressed: 1,
        capabilities: vec![("drop_hook".into(), true), ("drop_sites".into(), false)],
        kube_connected: false,
        kube_event_writes: vec![("created".into(), 1), ("failed".into(), 2)],
        outputs: vec![("events".into(), 3, true)],
        otlp: vec![("logs".into(), 4, 2), ("metrics".into(), 5, 1)],
        kube_writes_failed: vec![("report".into(), 0), ("condition".into(), 7)],
        node_report_refused: Some("pod_on_other_node".into()),
        canary_tests: vec![("confirmed".into(), 2), ("clean".into(), 5)],
        verify_requests: vec![("done".into(), 1)],
        verify_rate_limited: vec![("requester".into(), 2)],
        loops: probe_contract::LoopLifecycle {
            active: [("hairpin".to_string(), 0)].into_iter().collect(),
            quiet: [("hairpin".to_string(), 1)].into_iter().collect(),
            resolutions: [("hairpin".to_string(), 2)].into_iter().collect(),
            regressions: [("hairpin".to_string(), 1)].into_iter().collect(),
            resolved: Vec::new(),
        },
    }
}

#[test]
fn renders_every_family_with_bounded_labels() {
    let text = render(&input());
    for line in [
        "clbprobe_loopback_events_total{kind=\"healthcheck_blackhole\",vip=\"203.0.113.10\",port=\"\"} 3",
        "clbprobe_loopback_events_total{kind=\"hairpin\",vip=\"203.0.113.10\",port=\"80\"} 1",
        "clbprobe_suspect_packets_total{nic=\"eth0\",source=\"vip\"} 7",
        "clbprobe_otlp_dropped_total{signal=\"logs\"} 2",
        "clbprobe_otlp_exported_total{signal=\"metrics\"} 5",
        "clbprobe_kernel_drops_total{reason=\"IP_LOCAL_SOURCE\"} 5",
        "clbprobe_events_suppressed_total{stage=\"budget\"} 2",
        "clbprobe_events_budget_suppressed_total{record=\"suspect\",source=\"pod\"} 2",
        "clbprobe_events_budget_suppressed_total{record=\"drop\",source=\"vip\"} 0",
        "clbprobe_local_addresses{set=\"vip\"} 2",
        "clbprobe_local_addresses_left_out{set=\"vip\"} 50",
        "clbprobe_drop_destinations_left_out 7",
        "clbprobe_local_addresses_capacity 256",
        "clbprobe_local_address_owners{owner=\"route:66\"} 1",
        "clbprobe_loopback_events_by_owner_total{kind=\"healthcheck_blackhole\",owner=\"route:66\"} 3",
        "clbprobe_build_info{version=\"0.1.0\",kernel=\"6.18.44\"} 1",
        "clbprobe_ready 1",
        "clbprobe_capability{name=\"drop_hook\"} 1",
        "clbprobe_capability{name=\"drop_sites\"} 0",
        "clbprobe_kube_connected 0",
        "clbprobe_vip_interface_present 1",
        "clbprobe_kernel_reader_wakeups_total 4",
        "clbprobe_kernel_reader_wakeups_suppressed_total 1",
        "clbprobe_kube_event_writes_total{result=\"failed\"} 2",
        "clbprobe_kube_writes_failed_total{object=\"condition\"} 7",
        "clbprobe_node_report_refused{reason=\"pod_on_other_node\"} 1",
        "clbprobe_output_lines_lost_total{output=\"events\"} 3",
        "clbprobe_output_stalled{output=\"events\"} 1",
        "clbprobe_loopback_active{kind=\"hairpin\"} 0",
        "clbprobe_loopback_quiet{kind=\"hairpin\"} 1",
        "clbprobe_loopback_resolutions_total{kind=\"hairpin\"} 2",
        "clbprobe_loopback_regressions_total{kind=\"hairpin\"} 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(text.trim_end().ends_with("# EOF"));
}

/// The exposition is the contract's table: every family, in its order, with its type and help,
/// and no family the table does not list.
#[test]
fn the_exposition_is_the_contract_table() {
    use probe_contract::metrics::{FAMILIES, Type};
    let text = render(&input());
    let rendered: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE clbprobe_"))
        .collect();
    let table: Vec<String> = FAMILIES
        .iter()
        .map(|f| {
            let kind = match f.kind {
                Type::Counter => "counter",
                Type::Gauge => "gauge",
            };
            format!("{} {kind}", f.short)
        })
        .collect();
    assert_eq!(rendered, table);
    for f in FAMILIES {
        assert!(
            text.contains(&format!("# HELP {} {}", f.name(), f.help)),
            "{}",
            f.name()
        );
    }
}

/// promtool is the reference checker of the exposition format.
#[test]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn promtool_accepts_the_exposition() {
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        eprintln!("skipping: promtool not installed (cargo xtask setup installs it)");
        return;
    };
    use std::io::Write as _;
    let text = to_prometheus_text(&render(&input()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Adds to `t` the unserved port `port` of 203.0.113.10, seen `count` times in all.
fn add_unserved(t: &mut EventTotals, port: u16, count: u64) {
    let mut e = sample_event();
    e.key = format!("vip_port_unserved/203.0.113.10:{port}/tcp");
    e.vip_port = Some(port);
    e.count = count;
    t.add(&e);
}

fn sample_event() -> LoopbackEvent {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    LoopbackEvent {
        key: "vip_port_unserved/203.0.113.10:443/tcp".into(),
        vip: Some(ip("203.0.113.10")),
        vip_port: Some(443),
        drop_reason: Some("NO_SOCKET".into()),
        count: 1,
        ..LoopbackEvent::between(
            probe_contract::LoopbackKind::VipPortUnserved,
            (ip("198.19.1.10"), 40000),
            (ip("203.0.113.10"), 443),
            probe_contract::Proto::Tcp,
            probe_contract::Outcome::Refused,
        )
    }
}

#[test]
fn event_totals_follow_cumulative_counts_and_never_go_back() {
    let mut t = EventTotals::default();
    let mut e = sample_event();
    e.count = 1;
    t.add(&e);
    e.count = 4; // three repeats whose reports were missed
    t.add(&e);
    e.count = 1; // evicted and re-created
    t.add(&e);
    let total: u64 = t.totals.values().sum();
    assert_eq!(total, 5);
}

/// More aggregates than the table remembers, each reported again right after the next one
/// is created (as a live aggregate is): every occurrence counted exactly once.
#[test]
fn event_totals_stay_exact_past_the_bookkeeping_bound() {
    let mut t = EventTotals::default();
    let mut e = sample_event();
    let n = 3 * EVENT_TOTALS_KEYS as u64;
    for i in 0..n {
        e.key = format!("vip_port_unserved/203.0.113.10:{i}/tcp");
        e.count = 1;
        t.add(&e);
        if i > 0 {
            e.key = format!("vip_port_unserved/203.0.113.10:{}/tcp", i - 1);
            e.count = 2;
            t.add(&e);
        }
    }
    let total: u64 = t.totals.values().sum();
    assert_eq!(total, n + (n - 1));
    assert!(t.last.len() <= EVENT_TOTALS_KEYS && t.by_age.len() == t.last.len());
}

/// 5,000 distinct unserved ports (what uid 65534 made by connecting to them): the series stay
/// under the cap plus one overflow series per kind, the newest kept, and the total is exact.
#[test]
fn event_series_are_capped_with_an_exact_overflow() {
    let mut t = EventTotals::default();
    for port in 0..5_000u16 {
        add_unserved(&mut t, port, 1);
        add_unserved(&mut t, port, 3); // two repeats
    }
    let input = MetricsInput {
        events: t.totals.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        ..MetricsInput::default()
    };
    let text = render(&input);
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("clbprobe_loopback_events_total{"))
        .collect();
    assert_eq!(series.len(), EVENT_SERIES + 1, "{}", series.len());
    let sum: u64 = series
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, 15_000);
    let other = series
        .iter()
        .find(|l| l.contains("vip=\"other\",port=\"other\""))
        .expect("the overflow series");
    assert!(
        other.ends_with(&format!(" {}", 3 * (5_000 - EVENT_SERIES))),
        "{other}"
    );
    // The newest pairs keep their own series, and keep counting there; the oldest went to
    // `other`.
    let own = (
        "vip_port_unserved".to_string(),
        "203.0.113.10".to_string(),
        "4999".to_string(),
    );
    assert_eq!(t.totals[&own], 3);
    assert!(
        !t.totals
            .contains_key(&(own.0.clone(), own.1.clone(), "0".to_string()))
    );
    let mut e = sample_event();
    e.vip_port = Some(4999);
    e.key = "a new aggregate on port 4999".into();
    e.count = 1;
    t.add(&e);
    assert_eq!(t.totals[&own], 4);
}

/// Whether `t` renders an own series for (kind, vip, port), and its value.
fn own_series(t: &EventTotals, kind: &str, vip: &str, port: &str) -> Option<u64> {
    t.totals
        .get(&(kind.to_string(), vip.to_string(), port.to_string()))
        .copied()
}

/// E10 (hostile round 3): uid 65534 connects to 5,000 unserved ports of one bound VIP before
/// a real loop starts. The real loops (a health-check blackhole on another VIP, an unserved
/// port of a third VIP, a later hairpin) each still get their own series, the flood's series
/// stay bounded, and the totals stay exact.
#[test]
fn a_flood_of_one_vip_does_not_take_the_series_of_later_real_loops() {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let mut t = EventTotals::default();
    for port in 0..5_000u16 {
        add_unserved(&mut t, port, 1);
    }
    let mut blackhole = sample_event();
    blackhole.kind = probe_contract::LoopbackKind::HealthcheckBlackhole;
    blackhole.key = "healthcheck_blackhole/198.51.100.7".into();
    blackhole.vip = Some(ip("198.51.100.7"));
    blackhole.vip_port = None;
    let mut unserved = sample_event();
    unserved.key = "vip_port_unserved/198.51.100.8:8443/tcp".into();
    unserved.vip = Some(ip("198.51.100.8"));
    unserved.vip_port = Some(8443);
    for count in 1..=3 {
        blackhole.count = count;
        t.add(&blackhole);
        unserved.count = count;
        t.add(&unserved);
        // The flood goes on between the real loop's confirmations.
        for port in 0..1_000u16 {
            let port = 10_000 + 1_000 * u16::try_from(count).unwrap() + port;
            add_unserved(&mut t, port, 1);
        }
    }
    let mut hairpin = sample_event();
    hairpin.kind = probe_contract::LoopbackKind::Hairpin;
    hairpin.key = "hairpin/198.51.100.9:80/tcp".into();
    hairpin.vip = Some(ip("198.51.100.9"));
    hairpin.vip_port = Some(80);
    t.add(&hairpin);

    let before = (
        own_series(&t, "healthcheck_blackhole", "198.51.100.7", ""),
        own_series(&t, "vip_port_unserved", "198.51.100.8", "8443"),
        own_series(&t, "hairpin", "198.51.100.9", "80"),
    );
    assert_eq!(
        before,
        (Some(3), Some(3), Some(1)),
        "each real loop has its own series with its exact count"
    );
    assert!(
        t.totals.len() <= EVENT_SERIES + 5,
        "bounded: {}",
        t.totals.len()
    );
    let total: u64 = t.totals.values().sum();
    assert_eq!(total, 5_000 + 3 * 1_000 + 3 + 3 + 1, "the total is exact");
    let flood = t
        .totals
        .get(&(
            "vip_port_unserved".to_string(),
            OVERFLOW_LABEL.to_string(),
            OVERFLOW_LABEL.to_string(),
        ))
        .copied()
        .unwrap_or(0);
    assert!(flood >= 7_000, "the flood is folded into other: {flood}");
}

/// An evicted series vanishes with its count in `other`; if its (vip, port) comes back it
/// starts again from its new increments (a new series for Prometheus), `other` never goes
/// down, and the kind's total stays exact.
#[test]
fn an_evicted_series_that_comes_back_starts_afresh_and_other_never_goes_down() {
    let mut t = EventTotals::default();
    add_unserved(&mut t, 0, 5);
    for port in 1..=EVENT_SERIES as u16 {
        add_unserved(&mut t, port, 1);
    }
    let other_key = (
        "vip_port_unserved".to_string(),
        OVERFLOW_LABEL.to_string(),
        OVERFLOW_LABEL.to_string(),
    );
    let own0 = (
        "vip_port_unserved".to_string(),
        "203.0.113.10".to_string(),
        "0".to_string(),
    );
    assert!(!t.totals.contains_key(&own0), "the oldest series went");
    assert_eq!(t.totals[&other_key], 5);
    add_unserved(&mut t, 0, 7);
    assert_eq!(
        t.totals.get(&own0),
        Some(&2),
        "back with its new increments"
    );
    assert!(t.totals[&other_key] >= 5);
    let total: u64 = t.totals.values().sum();
    assert_eq!(total, 7 + EVENT_SERIES as u64);
}

#[test]
fn readyz_says_when_no_endpoint_drop_addresses_are_left_out_and_stays_ready() {
    let mut status = probe_contract::NodeStatus {
        ready: true,
        vip_iface_present: true,
        address_capacity: 16,
        ..Default::default()
    };
    let (ready, body) = crate::sink::metrics::readiness(&status);
    assert!(ready);
    assert!(!body.contains("drop addresses"), "{body}");
    status.drop_destinations_left_out = 3;
    let (ready, body) = crate::sink::metrics::readiness(&status);
    assert!(
        ready,
        "a tenant's elements must not take the agent out of its rollout"
    );
    assert!(
        body.contains("3 of kube-proxy's drop destinations (no-endpoint drops and loadBalancerSourceRanges firewall entries) over --address-entries (16)"),
        "{body}"
    );
}
