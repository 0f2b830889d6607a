//! Part 4: detection latency, from the kernel's drop timestamp to the confirmed line.

use std::{path::Path, time::Duration};

use anyhow::Result;
use probe_contract::{LoopbackEvent, LoopbackKind};

use super::{
    BenchArgs, METRICS_PORT, net,
    report::{Table, median, percentile},
    tools::{Agent, RawSender, pause},
};

/// Part 4.
pub(super) fn latency(
    args: &BenchArgs,
    probe: &Path,
    work: &Path,
    summary: &mut Vec<(String, String)>,
) -> Result<Table> {
    let n = args.latency_events;
    eprintln!("bench: detection latency, {n} health-check drops");
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    pause(Duration::from_secs(1))?;
    let sender = RawSender::new(net::NS_TX)?;
    let first_port = 30000u16;
    for i in 0..n as u16 {
        // Each to its own NodePort: its own aggregate, so each confirmed event is written.
        sender.syn(net::VIP, 40000 + i, net::NODE_IP, first_port + i)?;
        // Well under the kernel's per-CPU event budget.
        pause(Duration::from_millis(15))?;
    }
    pause(Duration::from_secs(2))?;
    let lines = agent.events.lock().map(|v| v.clone()).unwrap_or_default();
    let record = std::fs::read_to_string(&agent.record).unwrap_or_default();
    drop(agent);
    let mut drop_ts = std::collections::HashMap::new();
    for l in record.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
            continue;
        };
        if v["type"] == "drop"
            && let (Some(port), Some(ts)) = (v["packet"]["dport"].as_u64(), v["ts_ns"].as_u64())
        {
            drop_ts.entry(port).or_insert(ts);
        }
    }
    let mut ms = Vec::new();
    for (at, line) in &lines {
        let Ok(e) = serde_json::from_str::<LoopbackEvent>(line) else {
            continue;
        };
        if e.kind != LoopbackKind::HealthcheckBlackhole {
            continue;
        }
        if let Some(ts) = drop_ts.get(&u64::from(e.dst_port)) {
            ms.push(at.saturating_sub(*ts) as f64 / 1e6);
        }
    }
    summary.push((
        "detection latency, drop to JSON line".into(),
        format!(
            "median {:.1} ms, p99 {:.1} ms ({}/{n} confirmed)",
            median(&ms),
            percentile(&ms, 99.0),
            ms.len()
        ),
    ));
    let mut table = Table::new("4. Detection latency", &["measure", "value"]);
    table.note = format!(
        "{n} TCP SYNs from the bound VIP to the node, 15 ms apart, each to its own port; from \
         the kernel's drop timestamp to the confirmed `healthcheck_blackhole` line arriving on \
         the agent's stdout (`--events -`). Drop records wake the agent's ring-buffer reader \
         (budgeted per CPU, never one per record under a flood, see PERFORMANCE.md); other \
         records wait for its timer."
    );
    table.row(vec![
        "events confirmed / sent".into(),
        format!("{}/{n}", ms.len()),
    ]);
    table.row(vec!["median, ms".into(), format!("{:.1}", median(&ms))]);
    table.row(vec![
        "p99, ms".into(),
        format!("{:.1}", percentile(&ms, 99.0)),
    ]);
    table.row(vec![
        "min – max, ms".into(),
        format!(
            "{:.1} – {:.1}",
            percentile(&ms, 0.0),
            percentile(&ms, 100.0)
        ),
    ]);
    Ok(table)
}
