//! A storm of address changes on kube-ipvs0: the agent's CPU and its debounce.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    observe::{iface_vips, kernel_vips_until, node_ip_batch},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self},
    tools::{Agent, proc_usage},
};

/// A storm of `rate` address changes a second on kube-ipvs0 for `secs` s (one `ip -batch` every
/// 100 ms: half adds, half deletes of the previous tick's adds): the agent's CPU over the storm,
/// how long after the last change its kernel map equals the interface (the debounce), exactly.
pub(super) fn address_storm(probe: &Path, work: &Path, rate: usize, secs: u64) -> Result<Row> {
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    let pid = agent.pid();
    let batch = work.join("storm.batch");
    let per_tick = rate / 10;
    let addr = |i: usize| format!("198.19.{}.{}", (i / 250) % 250, i % 250 + 1);
    let cpu0 = proc_usage(pid)?.0;
    let start = Instant::now();
    let (mut next, mut live, mut changes, mut late_ticks) = (0usize, Vec::new(), 0usize, 0usize);
    let mut tick = start;
    let mut last_change = start;
    while start.elapsed() < Duration::from_secs(secs) {
        let mut lines = String::new();
        for a in live.drain(..) {
            lines.push_str(&format!("addr del {a}/32 dev {}\n", net::VIP_IF));
        }
        for _ in 0..per_tick / 2 {
            let a = addr(next);
            next += 1;
            lines.push_str(&format!("addr add {a}/32 dev {}\n", net::VIP_IF));
            live.push(a);
        }
        changes += lines.lines().count();
        std::fs::write(&batch, lines)?;
        node_ip_batch(&batch)?;
        last_change = Instant::now();
        tick += Duration::from_millis(100);
        match tick.checked_duration_since(Instant::now()) {
            Some(d) => std::thread::sleep(d),
            None => late_ticks += 1,
        }
    }
    let storm = start.elapsed();
    let cpu1 = proc_usage(pid)?.0;
    let want = iface_vips();
    let got = kernel_vips_until(
        pid,
        &want,
        last_change,
        Duration::from_secs(30),
        Duration::from_millis(20),
    );
    let settled = last_change.elapsed();
    let cpu_pct = (cpu1 - cpu0) as f64
        / crate::bench::tools::clock_ticks_per_sec() as f64
        / storm.as_secs_f64()
        * 100.0;
    let got = got.unwrap_or_default();
    let rss = proc_usage(pid).map(|u| u.2).unwrap_or(0);
    drop(agent);
    let verdict = if got == want {
        Ok("nothing lost".into())
    } else {
        Err(format!(
            "{} VIPs missing from the map (e.g. {:?}), {} extra (e.g. {:?})",
            want.difference(&got).count(),
            want.difference(&got).take(5).collect::<Vec<_>>(),
            got.difference(&want).count(),
            got.difference(&want).take(5).collect::<Vec<_>>()
        ))
    };
    Ok(Row {
        fault: format!(
            "{changes} address changes on kube-ipvs0 in {:.0} s ({rate}/s asked, {late_ticks} late ticks of 100 ms)",
            storm.as_secs_f64()
        ),
        checked: "the agent's CPU over the storm; after the last change its HOSTS_V4 map holds exactly the interface's VIPs (diff printed when not)".into(),
        figure: format!(
            "agent CPU {cpu_pct:.0}% of one core during the storm; kernel map equal {:.0} ms after the last change ({} VIPs); agent peak RSS {} MiB",
            settled.as_secs_f64() * 1e3,
            want.len(),
            rss / 1024
        ),
        verdict,
    })
}
