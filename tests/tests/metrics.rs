//! The Prometheus surface end to end: the real agent in the lab's node namespace, the three
//! failures driven, `/metrics`, `/readyz` read over HTTP inside the namespace, and a real
//! Prometheus server (Debian's `prometheus`, on the namespace's loopback) scraping it and
//! answering a query for each kind.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use probe_tests::agent::{Agent, KilledOnDrop, tempdir::TempDir, wait_for};
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants, http_get_in};

const METRICS: &str = "127.0.0.1:19966";
const PROMETHEUS: &str = "127.0.0.1:19090";

/// A Prometheus server, killed on drop.
struct Prometheus(
    #[allow(dead_code)] KilledOnDrop,
    #[allow(dead_code)] TempDir,
);

fn start_prometheus(netns: &str) -> Option<Prometheus> {
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping the Prometheus scrape: `prometheus` not installed");
        return None;
    }
    let dir = TempDir::new("prometheus");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: clb-probe\n    static_configs:\n      - targets: ['{METRICS}']\n"
        ),
    )
    .unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", netns, "prometheus"])
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={PROMETHEUS}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    Some(Prometheus(KilledOnDrop(child), dir))
}

#[test]
fn failures_show_in_metrics_and_a_real_prometheus_scrapes_them() {
    let Some(lab) = LabGuard::for_test("metrics", &Variants::default()) else {
        return;
    };
    let agent = Agent::on_node_nic(&["--metrics-addr", METRICS]);
    let (status, body) = http_get_in(lab::NS_NODE, METRICS, "/readyz").expect("readyz");
    assert_eq!((status, body.trim()), (200, "ready"));
    assert_eq!(
        http_get_in(lab::NS_NODE, METRICS, "/healthz").unwrap().0,
        200
    );
    assert_eq!(http_get_in(lab::NS_NODE, METRICS, "/nope").unwrap().0, 404);
    let prometheus = start_prometheus(lab::NS_NODE);

    for (scenario, outcome) in [
        (Scenario::HealthcheckBlackhole, Outcome::Timeout),
        (Scenario::Hairpin, Outcome::Timeout),
        (Scenario::VipPortUnserved, Outcome::Refused),
    ] {
        assert_eq!(lab.traffic(scenario).unwrap(), outcome, "{scenario}");
    }
    agent.wait_event("three kinds confirmed", Duration::from_secs(10), |es| {
        let kinds: std::collections::BTreeSet<_> = es.iter().map(|e| e.kind.as_str()).collect();
        (kinds.len() == 3).then_some(())
    });

    // The metrics sink subscribes to the same reports as the JSON sink but on its own task: a
    // scrape right after the JSON line may come first, so wait until the three kinds are counted.
    let scrape = || {
        let (status, text) = http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("metrics");
        assert_eq!(status, 200);
        text
    };
    let text = wait_for(
        "/metrics counts the three kinds",
        Duration::from_secs(10),
        || {
            let text = scrape();
            (text.matches("clbprobe_loopback_events_total{").count() >= 3).then_some(text)
        },
    )
    .unwrap_or_else(scrape);
    for needle in [
        "clbprobe_loopback_events_total{kind=\"healthcheck_blackhole\",vip=\"203.0.113.10\",port=\"\"}",
        "clbprobe_loopback_events_total{kind=\"hairpin\",vip=\"203.0.113.10\",port=\"80\"}",
        "clbprobe_loopback_events_total{kind=\"vip_port_unserved\",vip=\"203.0.113.10\",port=\"443\"}",
        "clbprobe_suspect_packets_total{nic=\"eth0\",source=\"vip\"}",
        "clbprobe_suspect_packets_total{nic=\"eth0\",source=\"pod\"}",
        "clbprobe_kernel_drops_total{reason=\"IP_LOCAL_SOURCE\"}",
        "clbprobe_kernel_drops_total{reason=\"NO_SOCKET\"}",
        "clbprobe_events_suppressed_total{stage=\"budget\"}",
        "clbprobe_local_addresses{set=\"vip\"} 1",
        "clbprobe_build_info{",
        "clbprobe_ready 1",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // Counters, not gauges, and positive where traffic happened.
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(value("clbprobe_suspect_packets_total{nic=\"eth0\",source=\"vip\"}") >= 1.0);
    assert!(value("clbprobe_kernel_drops_total{reason=\"IP_LOCAL_SOURCE\"}") >= 1.0);

    let Some(_prometheus) = prometheus else {
        return;
    };
    let kinds = wait_for(
        "prometheus has all three kinds",
        Duration::from_secs(60),
        || {
            let (status, body) = http_get_in(
                lab::NS_NODE,
                PROMETHEUS,
                "/api/v1/query?query=clbprobe_loopback_events_total",
            )?;
            if status != 200 {
                return None;
            }
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            let kinds: std::collections::BTreeSet<String> = v["data"]["result"]
                .as_array()?
                .iter()
                .filter_map(|r| r["metric"]["kind"].as_str().map(String::from))
                .collect();
            (kinds.len() == 3).then_some(kinds)
        },
    )
    .expect("Prometheus scraped clbprobe_loopback_events_total for each kind");
    assert!(kinds.contains("hairpin") && kinds.contains("vip_port_unserved"));
    dashboard_panels_have_data();
}

/// Every query of the Grafana dashboard (the chart's files/dashboard.json), with its
/// variables set to "every agent" and a 1 m rate window, returns series from this
/// Prometheus after the lab drove the failures: each panel has data.
fn dashboard_panels_have_data() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/helm/clb-probe/files/dashboard.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let targets = dash["panels"].as_array().unwrap().iter().flat_map(|p| {
        p["targets"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(move |t| (p["title"].clone(), t))
    });
    let mut checked = 0;
    for (title, target) in targets {
        let expr = target["expr"]
            .as_str()
            .unwrap()
            .replace("$instance", ".+")
            .replace("$__rate_interval", "1m");
        let encoded: String = expr
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let series = wait_for(&format!("{title}: {expr}"), Duration::from_secs(30), || {
            let (status, body) = http_get_in(
                lab::NS_NODE,
                PROMETHEUS,
                &format!("/api/v1/query?query={encoded}"),
            )?;
            assert_eq!(status, 200, "{expr}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            let n = v["data"]["result"].as_array()?.len();
            (n > 0).then_some(n)
        });
        assert!(
            series.is_some(),
            "dashboard panel {title} has no data: {expr}"
        );
        checked += 1;
    }
    eprintln!("dashboard: {checked} panel queries returned series");
    assert!(checked >= 9);
}
