//! `cargo xtask bench --detect`: detection latency and the spoofed flood's cost, alone and
//! repeated, optionally against a baseline agent binary (`--baseline-agent`) in alternating
//! rounds, so a before/after comparison shares the machine's state round by round.
//!
//! Each round, per agent: health-check SYNs from the VIP on an idle node (drop timestamp to
//! confirmed JSON line), then the spoofed flood of part 3 with more health-check SYNs sent
//! during it (does a confirming record still get through, and how fast), the agent's CPU each
//! second, the sender core's cost per flood packet (trafgen on one CPU: 1e9 / packets/s), the
//! kernel's exact counts, events read against suppressed, and the reader wake-ups the kernel
//! paid for (`clbprobe_kernel_reader_wakeups_total`; absent before it existed: "n/a").

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use probe_contract::{LoopbackEvent, LoopbackKind};

use super::{
    BenchArgs, METRICS_PORT,
    net::{self, BenchNet},
    report::{Table, median, percentile, spread},
    tools::{self, Agent, RawSender, pause},
};

/// Health-check SYNs are this far apart at least (well under the kernel's event budget).
const SYN_GAP: Duration = Duration::from_millis(15);
/// NodePorts of the idle and the under-flood SYNs: distinct aggregates, so each is written.
const IDLE_PORTS: u16 = 30000;
const FLOOD_PORTS: u16 = 31000;

#[derive(Default)]
struct Figures {
    idle_median: Vec<f64>,
    idle_p99: Vec<f64>,
    idle_confirmed: Vec<f64>,
    flood_median: Vec<f64>,
    flood_p99: Vec<f64>,
    flood_confirmed: Vec<f64>,
    agent_cpu: Vec<f64>,
    sender_pps: Vec<f64>,
    exact: Vec<bool>,
    read: Vec<f64>,
    suppressed: HashMap<&'static str, Vec<f64>>,
    wakeups: Vec<f64>,
    wakeups_suppressed: Vec<f64>,
}

const STAGES: [&str; 4] = ["dedup", "budget", "ringbuf", "queue"];

/// A row of per-round figures quoted as their spread: its name, the figures, the digits shown.
type SpreadRow = (&'static str, fn(&Figures) -> &[f64], usize);

pub fn run(args: &BenchArgs, probe: &Path, work: &Path) -> Result<Vec<Table>> {
    let mut agents: Vec<(String, PathBuf)> = Vec::new();
    if let Some(base) = &args.baseline_agent {
        if !base.is_file() {
            bail!("--baseline-agent {}: no such file", base.display());
        }
        agents.push(("baseline".into(), base.clone()));
    }
    agents.push(("this build".into(), probe.to_path_buf()));
    let net = BenchNet::up()?;
    let config = work.join("flood.trafgen");
    let mut text = tools::trafgen_config(&net, 0, Some(net::VIP));
    text.push_str(&tools::trafgen_config(&net, 0, Some(net::NODE_IP)));
    std::fs::write(&config, text)?;
    let mut figures: Vec<Figures> = agents.iter().map(|_| Figures::default()).collect();
    for round in 0..args.rounds {
        for k in 0..agents.len() {
            // Alternate which agent goes first, so a drift of the machine favours neither.
            let i = (round + k) % agents.len();
            eprintln!(
                "bench: detect round {}/{}: {}",
                round + 1,
                args.rounds,
                agents[i].0
            );
            one_round(args, &net, &agents[i].1, work, &config, &mut figures[i])?;
        }
    }
    Ok(vec![table(args, &agents, &figures)])
}

fn one_round(
    args: &BenchArgs,
    net: &BenchNet,
    probe: &Path,
    work: &Path,
    config: &Path,
    f: &mut Figures,
) -> Result<()> {
    let n = args.latency_events.min(700) as u16;
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    pause(Duration::from_secs(1))?;
    let sender = RawSender::new(net::NS_TX)?;
    for i in 0..n {
        sender.syn(net::VIP, 40000 + i, net::NODE_IP, IDLE_PORTS + i)?;
        pause(SYN_GAP)?;
    }
    pause(Duration::from_millis(500))?;

    let m0 = agent.metrics().unwrap_or_default();
    let (rx0, tx0) = (net.nic_rx_packets()?, net.tx_packets()?);
    let hz = tools::clock_ticks_per_sec() as f64;
    let mut flood = tools::trafgen(config)?;
    let t_start = Instant::now();
    let flood_len = Duration::from_secs(args.flood_secs);
    // The SYNs under the flood spread over it, after a warm-up second.
    let gap = (flood_len.saturating_sub(Duration::from_secs(1)) / u32::from(n.max(1))).max(SYN_GAP);
    let (mut ticks, _, _) = tools::proc_usage(agent.pid())?;
    let mut t = Instant::now();
    let mut sent_under_flood = 0u16;
    let mut next_syn = t_start + Duration::from_secs(1);
    while t_start.elapsed() < flood_len {
        if sent_under_flood < n && Instant::now() >= next_syn {
            sender.syn(
                net::VIP,
                41000 + sent_under_flood,
                net::NODE_IP,
                FLOOD_PORTS + sent_under_flood,
            )?;
            sent_under_flood += 1;
            next_syn += gap;
        }
        if t.elapsed() >= Duration::from_secs(1) {
            let (now_ticks, _, _) = tools::proc_usage(agent.pid())?;
            let dt = t.elapsed().as_secs_f64();
            f.agent_cpu
                .push((now_ticks - ticks) as f64 / hz / dt * 100.0);
            (ticks, t) = (now_ticks, Instant::now());
        }
        pause(Duration::from_millis(2))?;
    }
    flood.check_running()?;
    let secs = t_start.elapsed().as_secs_f64();
    flood.stop();
    let (rx1, tx1) = (net.nic_rx_packets()?, net.tx_packets()?);
    pause(Duration::from_secs(2))?;
    let Some(m1) = agent.metrics() else {
        bail!("/metrics after the flood: the agent stopped answering");
    };
    let lines = agent.events.lock().map(|v| v.clone()).unwrap_or_default();
    let record = std::fs::read_to_string(&agent.record).unwrap_or_default();
    drop(agent);

    let delta = |fam: &str, want: &[(&str, &str)]| {
        tools::metric_sum(&m1, fam, want).saturating_sub(tools::metric_sum(&m0, fam, want))
    };
    let counted = delta("clbprobe_suspect_packets_total", &[("nic", net::NODE_IF)]);
    f.exact.push(counted == rx1 - rx0);
    f.sender_pps.push((tx1 - tx0) as f64 / secs);
    f.read
        .push(delta("clbprobe_kernel_events_read_total", &[]) as f64);
    for s in STAGES {
        f.suppressed
            .entry(s)
            .or_default()
            .push(delta("clbprobe_events_suppressed_total", &[("stage", s)]) as f64);
    }
    if m1.contains("clbprobe_kernel_reader_wakeups_total") {
        f.wakeups
            .push(delta("clbprobe_kernel_reader_wakeups_total", &[]) as f64);
        f.wakeups_suppressed
            .push(delta("clbprobe_kernel_reader_wakeups_suppressed_total", &[]) as f64);
    }

    let (idle, under) = latencies(&record, &lines);
    // The raw figures behind the table, for whoever wants the distribution.
    std::fs::write(
        work.join(format!("detect-latencies-{}.txt", probe_label(probe))),
        format!("idle ms: {idle:?}\nunder the flood ms: {under:?}\n"),
    )?;
    f.idle_median.push(median(&idle));
    f.idle_p99.push(percentile(&idle, 99.0));
    f.idle_confirmed.push(idle.len() as f64 / f64::from(n));
    if !under.is_empty() {
        f.flood_median.push(median(&under));
        f.flood_p99.push(percentile(&under, 99.0));
    }
    f.flood_confirmed
        .push(under.len() as f64 / f64::from(sent_under_flood.max(1)));
    Ok(())
}

fn probe_label(probe: &Path) -> String {
    probe
        .file_name()
        .map_or("agent".into(), |n| n.to_string_lossy().into_owned())
}

/// Drop timestamp to JSON line, ms, of the idle and the under-flood health-check SYNs.
fn latencies(record: &str, lines: &[(u64, String)]) -> (Vec<f64>, Vec<f64>) {
    let mut drop_ts = HashMap::new();
    for l in record.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
            continue;
        };
        if v["type"] == "drop"
            && v["packet"]["proto"] == "tcp"
            && let (Some(port), Some(ts)) = (v["packet"]["dport"].as_u64(), v["ts_ns"].as_u64())
        {
            drop_ts.entry(port).or_insert(ts);
        }
    }
    let (mut idle, mut under) = (Vec::new(), Vec::new());
    for (at, line) in lines {
        let Ok(e) = serde_json::from_str::<LoopbackEvent>(line) else {
            continue;
        };
        if e.kind != LoopbackKind::HealthcheckBlackhole {
            continue;
        }
        let port = u64::from(e.dst_port);
        if let Some(ts) = drop_ts.get(&port) {
            let ms = at.saturating_sub(*ts) as f64 / 1e6;
            if port >= u64::from(FLOOD_PORTS) {
                under.push(ms);
            } else {
                idle.push(ms);
            }
        }
    }
    (idle, under)
}

fn table(args: &BenchArgs, agents: &[(String, PathBuf)], figures: &[Figures]) -> Table {
    let mut header = vec!["measure"];
    header.extend(agents.iter().map(|(name, _)| name.as_str()));
    let mut t = Table::new(
        "8. Detection latency and the flood's cost (`--detect`)",
        &header,
    );
    t.note = format!(
        "{r} round(s) per agent, alternating; each: {n} health-check SYNs from the VIP 15 ms \
         apart on an idle node, then a {s} s spoofed flood (part 3's) with as many health-check \
         SYNs spread over it. Latency: the kernel's drop timestamp to the confirmed \
         `healthcheck_blackhole` line on the agent's stdout; median and p99 per round, quoted \
         as median (min–max) over rounds. Sender core: trafgen on one CPU, so 1e9 / packets/s \
         is what each flood packet costs that core, the probe's programs and wake-ups included. \
         Counters per round from `/metrics` before and after the flood.",
        r = args.rounds,
        n = args.latency_events.min(700),
        s = args.flood_secs,
    );
    let col =
        |pick: &dyn Fn(&Figures) -> String| -> Vec<String> { figures.iter().map(pick).collect() };
    let mut row = |name: &str, cells: Vec<String>| {
        let mut r = vec![name.to_string()];
        r.extend(cells);
        t.row(r);
    };
    let spreads: [SpreadRow; 8] = [
        ("idle: median, ms", |f| &f.idle_median, 1),
        ("idle: p99, ms", |f| &f.idle_p99, 1),
        ("idle: confirmed / sent", |f| &f.idle_confirmed, 3),
        ("under the flood: median, ms", |f| &f.flood_median, 1),
        ("under the flood: p99, ms", |f| &f.flood_p99, 1),
        (
            "under the flood: confirmed / sent",
            |f| &f.flood_confirmed,
            3,
        ),
        (
            "flood: agent CPU, % of a core (per second, all rounds)",
            |f| &f.agent_cpu,
            1,
        ),
        ("flood: sender packets/s (one core)", |f| &f.sender_pps, 0),
    ];
    for (name, pick, digits) in spreads {
        row(name, col(&|f| spread(pick(f), digits)));
    }
    row(
        "flood: sender core, ns per packet",
        col(&|f| {
            let ns: Vec<f64> = f.sender_pps.iter().map(|p| 1e9 / p).collect();
            spread(&ns, 0)
        }),
    );
    row(
        "flood: suspects counted = packets received",
        col(&|f| {
            let ok = f.exact.iter().filter(|e| **e).count();
            format!("{ok}/{} rounds exact", f.exact.len())
        }),
    );
    row("flood: events read", col(&|f| spread(&f.read, 0)));
    for s in STAGES {
        row(
            &format!("flood: events suppressed, {s}"),
            col(&|f| spread(f.suppressed.get(s).map_or(&[][..], |v| v), 0)),
        );
    }
    row(
        "flood: reader wake-ups by confirming records",
        col(&|f| spread(&f.wakeups, 0)),
    );
    row(
        "flood: confirming records past the wake-up budget",
        col(&|f| spread(&f.wakeups_suppressed, 0)),
    );
    t
}
