//! Issue #36, the hostile-user pass, round 3: fairness under floods, with the real agent on the
//! lab and the in-process fake API server (`test_support::kubeapi`).
//!
//! - E1: a pod connects to a new unserved port of the bound VIP every 50 ms (one new
//!   `vip_port_unserved` aggregate each) while the LB's health checks are black-holed: the
//!   blackhole's Event is still written, and the flood takes a few Events, one of them named a
//!   flood. The plan itself is unit-tested to the second
//!   (`sink::kube_event_plan::tests::a_flood_of_unserved_ports_does_not_starve_a_real_blackhole`);
//!   E10 (metric series) and E14 (`reportingInstance` length) are unit tests of the sinks.
//!
//! Root only (the test prints a skip line otherwise); it shares the lab: one at a time.

use std::{
    net::SocketAddrV4,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::events::v1::Event;
use probe_contract::LoopbackKind;
use probe_tests::{
    kube_fixture::KubeFixture,
    written::{clb_events, is},
};
use test_support::lab::{self, LabGuard, Scenario, Variants};

/// Stops the attacker's thread when dropped (a failed assertion included), before the lab goes.
struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u16>>,
}

impl Flood {
    /// From the pod's namespace, a connect to a new unserved port of the VIP every 50 ms.
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut port = 2001u16;
                while !stop.load(Ordering::Relaxed) && port < 60_000 {
                    let _ = lab::connect_in(
                        lab::NS_POD_A,
                        None,
                        SocketAddrV4::new(lab::VIP, port),
                        Duration::from_millis(200),
                    );
                    port += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                port - 2001
            })
        };
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops it: the ports it called.
    fn stop(&mut self) -> u16 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn a_flood_of_unserved_ports_does_not_starve_the_blackhole_event() {
    let Some(lab) = LabGuard::for_test("hostile_flood_events", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder().tag("flood").start();
    let agent = api.start_agent(&[]);
    lab.traffic(Scenario::VipPortUnserved).expect("traffic");
    let mut flood = Flood::start();
    // The flood first, long enough to have spent the bucket's burst (10 writes) under the old
    // plan: 10 s, about 200 ports.
    std::thread::sleep(Duration::from_secs(10));
    // The LB's health checks black-holed, checked every 2 s, for 40 s at most.
    let deadline = Instant::now() + Duration::from_secs(40);
    let blackhole = loop {
        lab.traffic(Scenario::HealthcheckBlackhole)
            .expect("traffic");
        let found = clb_events(&api)
            .into_iter()
            .find(|e| is(&e.reason, "HealthCheckBlackhole"));
        if found.is_some() || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let ports = flood.stop();
    let events = clb_events(&api);
    let unserved: Vec<&Event> = events
        .iter()
        .filter(|e| !is(&e.reason, "HealthCheckBlackhole"))
        .collect();
    let confirmed = agent
        .events()
        .iter()
        .filter(|e| e.kind == LoopbackKind::VipPortUnserved)
        .count();
    eprintln!(
        "{ports} ports called, {confirmed} unserved-port reports, {} unserved-port Events, blackhole Event: {}",
        unserved.len(),
        blackhole.is_some()
    );
    assert!(
        confirmed >= 20,
        "the flood was confirmed ({confirmed} reports)"
    );
    assert!(
        blackhole.is_some(),
        "no HealthCheckBlackhole Event in 40 s under a flood of {ports} unserved ports: {} Events, all of the flood",
        events.len()
    );
    assert!(
        unserved.len() <= 10,
        "the flood is aggregated: {} Events",
        unserved.len()
    );
    assert!(
        unserved
            .iter()
            .any(|e| e.note.as_deref().unwrap_or_default().starts_with("Flood: ")),
        "the flood is named as a flood: {unserved:#?}"
    );
}

const METRICS: &str = "127.0.0.1:19471";

/// The `clbprobe_loopback_events_total` lines of the agent's /metrics.
fn event_series() -> Vec<String> {
    let (_, text) = lab::http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("metrics");
    text.lines()
        .filter(|l| l.starts_with("clbprobe_loopback_events_total{"))
        .map(str::to_string)
        .collect()
}

/// E10: the same flood fills the 500 own-label series of `clbprobe_loopback_events_total`
/// before the health checks are black-holed: the blackhole still gets a series of its own
/// (`vip="203.0.113.10"`), not only `vip="other"`.
#[test]
fn a_flood_of_unserved_ports_does_not_take_the_blackholes_metric_series() {
    let Some(lab) = LabGuard::for_test("hostile_flood_series", &Variants::default()) else {
        return;
    };
    let api = KubeFixture::builder().tag("flood-series").start();
    let agent = api.start_agent(&["--metrics-addr", METRICS]);
    lab.traffic(Scenario::VipPortUnserved).expect("traffic");
    let mut flood = Flood::start();
    let filled = probe_tests::agent::wait_for(
        "520 unserved ports confirmed",
        Duration::from_secs(90),
        || {
            let n = agent
                .events()
                .iter()
                .filter(|e| e.kind == LoopbackKind::VipPortUnserved)
                .count();
            (n >= 520).then_some(n)
        },
    );
    assert!(filled.is_some(), "the flood was confirmed on 520 ports");
    let vip = format!("vip=\"{}\"", lab::VIP);
    let deadline = Instant::now() + Duration::from_secs(30);
    let blackhole = loop {
        lab.traffic(Scenario::HealthcheckBlackhole)
            .expect("traffic");
        let series: Vec<String> = event_series()
            .into_iter()
            .filter(|l| l.contains("kind=\"healthcheck_blackhole\""))
            .collect();
        if series.iter().any(|l| l.contains(&vip)) || Instant::now() > deadline {
            break series;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let ports = flood.stop();
    let all = event_series();
    eprintln!(
        "{ports} ports called, {} series; the blackhole's: {blackhole:?}",
        all.len()
    );
    assert!(
        blackhole.iter().any(|l| l.contains(&vip)),
        "the blackhole has no series of its own after {ports} unserved ports: {blackhole:?}"
    );
    assert!(all.len() <= 500 + 5, "bounded: {} series", all.len());
    assert!(
        all.iter()
            .any(|l| l.contains("kind=\"vip_port_unserved\"") && l.contains("vip=\"other\"")),
        "the flood's oldest ports are folded into other"
    );
}
