//! Part 3: the spoofed flood: agent CPU and RSS, `/metrics`, the kernel's exact suspect count
//! against what the NIC received, events emitted against suppressed.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    BenchArgs, METRICS_PORT,
    net::{self, BenchNet},
    report::{Table, median, spread},
    tools::{self, Agent, pause},
};

pub(super) struct FloodResult {
    pub(super) table: Table,
    pub(super) peak_rss_mib: Vec<f64>,
}

/// Part 3.
pub(super) fn flood(
    args: &BenchArgs,
    net: &BenchNet,
    probe: &Path,
    work: &Path,
    summary: &mut Vec<(String, String)>,
) -> Result<FloodResult> {
    eprintln!("bench: spoofed flood, {} s", args.flood_secs);
    let config = work.join("flood.trafgen");
    // VIP- and node-source frames in turn, random ports: each packet a new flow.
    let mut text = tools::trafgen_config(net, 0, Some(net::VIP));
    text.push_str(&tools::trafgen_config(net, 0, Some(net::NODE_IP)));
    std::fs::write(&config, text)?;
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    pause(Duration::from_secs(1))?;
    let m0 = agent.metrics().context("/metrics before the flood")?;
    let (rx0, tx0) = (net.nic_rx_packets()?, net.tx_packets()?);
    let hz = tools::clock_ticks_per_sec() as f64;
    let (mut cpu, mut rss) = (Vec::new(), Vec::new());
    let (mut scrapes_ok, mut scrapes) = (0u32, 0u32);
    let mut sender = tools::trafgen(&config)?;
    let (mut ticks, _, _) = tools::proc_usage(agent.pid())?;
    let mut t = Instant::now();
    for _ in 0..args.flood_secs {
        pause(Duration::from_secs(1))?;
        let (now_ticks, now_rss, _) = tools::proc_usage(agent.pid())?;
        let dt = t.elapsed().as_secs_f64();
        cpu.push((now_ticks - ticks) as f64 / hz / dt * 100.0);
        rss.push(now_rss as f64 / 1024.0);
        (ticks, t) = (now_ticks, Instant::now());
        scrapes += 1;
        scrapes_ok += u32::from(agent.metrics().is_some());
    }
    sender.check_running()?;
    sender.stop();
    // The agent keeps reading what the flood left in the ring; counters are exact already.
    pause(Duration::from_secs(2))?;
    let (rx1, tx1) = (net.nic_rx_packets()?, net.tx_packets()?);
    let m1 = agent
        .metrics()
        .context("/metrics after the flood: the agent stopped answering")?;
    // Kept for whoever wants the raw figures behind the table.
    std::fs::write(work.join("flood-metrics-before.txt"), &m0)?;
    std::fs::write(work.join("flood-metrics-after.txt"), &m1)?;
    let (_, _, hwm) = tools::proc_usage(agent.pid())?;
    let delta = |fam: &str, want: &[(&str, &str)]| {
        tools::metric_sum(&m1, fam, want).saturating_sub(tools::metric_sum(&m0, fam, want))
    };
    let nic = [("nic", net::NODE_IF)];
    let counted = delta("clbprobe_suspect_packets_total", &nic);
    let (sent, received) = (tx1 - tx0, rx1 - rx0);
    let read = delta("clbprobe_kernel_events_read_total", &[]);
    let stages = ["dedup", "budget", "ringbuf", "queue"];
    let suppressed: Vec<(String, u64)> = stages
        .iter()
        .map(|s| {
            (
                s.to_string(),
                delta("clbprobe_events_suppressed_total", &[("stage", s)]),
            )
        })
        .collect();
    let drops = delta("clbprobe_kernel_drops_total", &[]);
    drop(agent);

    let secs = args.flood_secs as f64;
    let mut table = Table::new("3. Spoofed flood", &["measure", "value"]);
    table.note = format!(
        "trafgen on one CPU sends VIP-source ({vip}) and node-source ({node}) UDP frames in \
         turn, random ports (each packet a new flow), for {s} s into the probed NIC; the kernel \
         drops them all as local-source. Per-second samples of the agent; counters from its \
         `/metrics` before and after.",
        vip = net::VIP,
        node = net::NODE_IP,
        s = args.flood_secs,
    );
    let row = |t: &mut Table, k: &str, v: String| t.row(vec![k.to_string(), v]);
    row(
        &mut table,
        "packets sent (sender NIC)",
        format!("{sent} ({:.0} pps)", sent as f64 / secs),
    );
    row(
        &mut table,
        "packets received (probed NIC)",
        received.to_string(),
    );
    row(
        &mut table,
        "suspects counted by the kernel program",
        format!(
            "{counted} ({})",
            if counted == received {
                "exact: equals packets received"
            } else {
                "MISMATCH"
            }
        ),
    );
    row(
        &mut table,
        "their drops counted (all reasons)",
        drops.to_string(),
    );
    row(&mut table, "events read by the agent", read.to_string());
    for (stage, n) in &suppressed {
        row(
            &mut table,
            &format!("events suppressed: {stage}"),
            n.to_string(),
        );
    }
    row(
        &mut table,
        "events read / suspects",
        format!("{:.5}", read as f64 / counted.max(1) as f64),
    );
    row(
        &mut table,
        "agent CPU, % of one core (per second)",
        spread(&cpu, 1),
    );
    row(
        &mut table,
        "agent RSS during the flood, MiB",
        spread(&rss, 1),
    );
    row(
        &mut table,
        "agent peak RSS (VmHWM), MiB",
        format!("{:.1}", hwm as f64 / 1024.0),
    );
    row(
        &mut table,
        "`/metrics` answered during the flood",
        format!("{scrapes_ok}/{scrapes}, and after it: yes"),
    );
    summary.push((
        format!("spoofed flood, {} s", args.flood_secs),
        format!(
            "{sent} packets, {} counted by the kernel ({}); agent CPU {:.1}% of a core \
             (median), peak RSS {:.1} MiB; /metrics answered {scrapes_ok}/{scrapes}",
            counted,
            if counted == received {
                "exact"
            } else {
                "MISMATCH"
            },
            median(&cpu),
            hwm as f64 / 1024.0,
        ),
    ));
    Ok(FloodResult {
        table,
        peak_rss_mib: vec![hwm as f64 / 1024.0],
    })
}
