//! Parts 1 and 2: the datapath overhead (packets/s and TCP throughput with nothing, the agent
//! and tcpdump, per round) and the per-packet cost of each program (bpf_stats, test runs).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    BenchArgs, METRICS_PORT, WARMUP,
    net::{self, BenchNet},
    report::{Table, median, ratios, spread},
    tools::{self, Agent, pause},
    write_sysctl,
};

/// Runs of each BPF_PROG_TEST_RUN measurement.
const TEST_RUN_REPEAT: u32 = 1_000_000;

/// Packets/s into the sink over one window, with `trafgen` sending `config`.
fn udp_rate(net: &BenchNet, config: &Path, secs: u64) -> Result<f64> {
    let mut sender = tools::trafgen(config)?;
    pause(WARMUP)?;
    let (p0, t0) = (net.sink_packets()?, Instant::now());
    pause(Duration::from_secs(secs))?;
    let (p1, t1) = (net.sink_packets()?, Instant::now());
    sender.check_running()?;
    sender.stop();
    Ok((p1 - p0) as f64 / (t1 - t0).as_secs_f64())
}

/// Gbit/s of one iperf3 TCP run.
fn tcp_rate(secs: u64) -> Result<f64> {
    let _server = tools::iperf3_server()?;
    Ok(tools::iperf3_client(secs)? / 1e9)
}

/// Average ns per run of each of our programs while `f` runs with bpf_stats on.
fn ns_per_run(f: impl FnOnce() -> Result<()>) -> Result<Vec<(String, f64, u64)>> {
    write_sysctl("kernel.bpf_stats_enabled", "1")?;
    let before = tools::prog_stats()?;
    let r = f();
    let after = tools::prog_stats();
    write_sysctl("kernel.bpf_stats_enabled", "0")?;
    r?;
    let after = after?;
    let mut out: Vec<(String, f64, u64)> = Vec::new();
    for (name, id, t1, c1) in after {
        let (t0, c0) = before
            .iter()
            .find(|(_, i, ..)| *i == id)
            .map_or((0, 0), |(_, _, t, c)| (*t, *c));
        if c1 > c0 && t1 >= t0 {
            let (ns, runs) = ((t1 - t0) as f64, c1 - c0);
            // Programs of one name (several agents, or one re-attached): their runs summed.
            match out.iter_mut().find(|(n, ..)| *n == name) {
                Some((_, avg, n)) => {
                    let total = *avg * *n as f64 + ns;
                    *n += runs;
                    *avg = total / *n as f64;
                }
                None => out.push((name, ns / runs as f64, runs)),
            }
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nothing,
    /// The agent, with `--capture-bytes` at this value (None: its default).
    Agent(Option<u32>),
    Tcpdump,
}

/// Part 2's windows, with the agent attached: bpf_stats on live traffic, then test runs.
fn per_packet_costs(
    ordinary: &Path,
    suspects: &Path,
    secs: u64,
    work: &Path,
    costs: &mut Vec<(String, String, f64, u64)>,
) -> Result<()> {
    let window = Duration::from_secs(secs.min(2));
    for (case, config) in [("ordinary UDP", ordinary), ("suspects only", suspects)] {
        for (name, ns, runs) in ns_per_run(|| {
            let mut g = tools::trafgen(config)?;
            pause(window)?;
            g.stop();
            Ok(())
        })? {
            costs.push((case.to_string(), name, ns, runs));
        }
    }
    for (name, ns, runs) in ns_per_run(|| tcp_rate(secs.min(2)).map(drop))? {
        costs.push(("TCP stream".to_string(), name, ns, runs));
    }
    // The classifier alone (BPF_PROG_TEST_RUN), on the same live maps.
    let ordinary_syn = tools::ether(&tools::tcp_syn(net::TX_IP, 40000, net::SINK_DST, 80));
    let suspect_syn = tools::ether(&tools::tcp_syn(net::VIP, 40000, net::NODE_IP, 30080));
    for (case, frame) in [
        ("test run: ordinary SYN", &ordinary_syn),
        (
            "test run: VIP-source SYN (repeats deduplicated)",
            &suspect_syn,
        ),
    ] {
        let ns = tools::test_run("clb_ingress", frame, TEST_RUN_REPEAT, work)?;
        costs.push((
            case.to_string(),
            "clb_ingress".into(),
            ns,
            u64::from(TEST_RUN_REPEAT),
        ));
    }
    Ok(())
}

#[derive(Default)]
struct Series {
    base: Vec<f64>,
    /// The first agent variant (the one part 2 and the summary read).
    probe: Vec<f64>,
    /// Every agent variant, in the order of `--capture-bytes`.
    agents: Vec<(Option<u32>, Vec<f64>)>,
    tcpdump: Vec<f64>,
}

impl Series {
    fn new(variants: &[Option<u32>]) -> Self {
        Series {
            agents: variants.iter().map(|v| (*v, Vec::new())).collect(),
            ..Series::default()
        }
    }

    fn push(&mut self, mode: Mode, v: f64) {
        match mode {
            Mode::Nothing => self.base.push(v),
            Mode::Agent(c) => {
                if self.agents.first().is_some_and(|(f, _)| *f == c) {
                    self.probe.push(v);
                }
                if let Some((_, s)) = self.agents.iter_mut().find(|(f, _)| *f == c) {
                    s.push(v);
                }
            }
            Mode::Tcpdump => self.tcpdump.push(v),
        }
    }

    /// One table row; rates shown times `scale` in `unit`, ratios as measured.
    fn row(&self, case: &str, unit: &str, scale: f64, digits: usize) -> Vec<String> {
        let shown = |v: &[f64]| {
            let v: Vec<f64> = v.iter().map(|x| x * scale).collect();
            format!("{} {unit}", spread(&v, digits))
        };
        let mut row = vec![case.to_string(), shown(&self.base)];
        for (_, s) in &self.agents {
            row.push(shown(s));
            row.push(spread(&ratios(s, &self.base), 3));
        }
        row.push(shown(&self.tcpdump));
        row.push(spread(&ratios(&self.tcpdump, &self.base), 3));
        row
    }
}

/// Part 1 and 2; also the agent's startup times and idle RSS of each round.
pub(super) fn datapath(
    args: &BenchArgs,
    net: &BenchNet,
    probe: &Path,
    work: &Path,
    summary: &mut Vec<(String, String)>,
) -> Result<(Table, Table, Vec<f64>, Vec<f64>)> {
    let ordinary = work.join("ordinary.trafgen");
    let mixed = work.join("suspects-1pct.trafgen");
    let suspects = work.join("suspects-only.trafgen");
    std::fs::write(&ordinary, tools::trafgen_config(net, 1, None))?;
    std::fs::write(&mixed, tools::trafgen_config(net, 99, Some(net::NODE_IP)))?;
    std::fs::write(&suspects, tools::trafgen_config(net, 0, Some(net::VIP)))?;

    let variants: Vec<Option<u32>> = if args.capture_bytes.is_empty() {
        vec![None]
    } else {
        args.capture_bytes.iter().map(|b| Some(*b)).collect()
    };
    let (mut udp, mut udp_mixed, mut tcp) = (
        Series::new(&variants),
        Series::new(&variants),
        Series::new(&variants),
    );
    let mut costs: Vec<(String, String, f64, u64)> = Vec::new();
    let (mut startups, mut idle_rss) = (Vec::new(), Vec::new());
    let secs = args.secs;
    // The set-ups in a different order each round (rotating), so a drift of the machine's
    // speed during a round (steal time on a shared host) does not favour one.
    let modes: Vec<Mode> = std::iter::once(Mode::Nothing)
        .chain(variants.iter().map(|v| Mode::Agent(*v)))
        .chain(std::iter::once(Mode::Tcpdump))
        .collect();
    for round in 0..args.rounds {
        for k in 0..modes.len() {
            let mode = modes[(round + k) % modes.len()];
            eprintln!("bench: round {}/{}: {mode:?}", round + 1, args.rounds);
            // Whatever this mode attaches lives until the end of this block.
            let agent = match mode {
                Mode::Agent(capture) => {
                    let bytes = capture.map(|b| b.to_string());
                    let env: Vec<(&str, &str)> = bytes
                        .as_deref()
                        .map(|b| vec![("CLB_PROBE_CAPTURE_BYTES", b)])
                        .unwrap_or_default();
                    let agent =
                        Agent::start_in(net::NS_NODE, probe, work, METRICS_PORT, "warn", &env)?;
                    startups.push(agent.startup.as_secs_f64() * 1e3);
                    pause(Duration::from_secs(1))?;
                    idle_rss.push(tools::proc_usage(agent.pid())?.1 as f64 / 1024.0);
                    Some(agent)
                }
                _ => None,
            };
            let dump = match mode {
                Mode::Tcpdump => Some(tools::tcpdump()?),
                _ => None,
            };
            udp.push(mode, udp_rate(net, &ordinary, secs)?);
            udp_mixed.push(mode, udp_rate(net, &mixed, secs)?);
            tcp.push(mode, tcp_rate(secs)?);
            // Part 2 with the first agent variant only: the others differ in what a record
            // carries, not in the per-packet path part 2 measures.
            if agent.is_some() && mode == Mode::Agent(variants[0]) {
                per_packet_costs(&ordinary, &suspects, secs, work, &mut costs)?;
            }
            drop(dump);
            drop(agent);
        }
    }

    let mut header = vec!["traffic".to_string(), "nothing attached".to_string()];
    for v in &variants {
        match v {
            None => header.extend(["agent attached".into(), "agent / nothing".into()]),
            Some(b) => header.extend([
                format!("agent, --capture-bytes {b}"),
                format!("agent ({b}) / nothing"),
            ]),
        }
    }
    header.extend([
        "tcpdump (local-source filter)".into(),
        "tcpdump / nothing".into(),
    ]);
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut overhead = Table::new("1. Datapath overhead", &header);
    overhead.note = format!(
        "Through a veth NIC into a forwarding sink. UDP: 64-byte frames from trafgen on one \
         CPU, packets/s reaching the sink; \"1% suspects\" adds one node-source frame per 99 \
         ordinary ones (dropped by the kernel as local-source, so the agent's drop program and \
         events run too). TCP: one iperf3 stream, Gbit/s. tcpdump: `tcpdump -i {nic} -w \
         /dev/null 'src host {node} or src host {vip}'`. Target: agent / nothing >= 0.98 on \
         ordinary traffic.",
        nic = net::NODE_IF,
        node = net::NODE_IP,
        vip = net::VIP,
    );
    overhead.row(udp.row("64-byte UDP, ordinary", "kpps", 1e-3, 1));
    overhead.row(udp_mixed.row("64-byte UDP, 1% suspects", "kpps", 1e-3, 1));
    overhead.row(tcp.row("TCP stream (iperf3)", "Gbit/s", 1.0, 2));

    let mut cost = Table::new(
        "2. Per-packet cost in the kernel",
        &["traffic", "program", "ns per run", "runs"],
    );
    cost.note = format!(
        "Live traffic: `kernel.bpf_stats_enabled=1` (run_time_ns / run_cnt) in windows of \
         their own, one per round; each run also pays the two clock reads the stats take (on \
         a VM, not free). Test run: `bpftool prog run` (BPF_PROG_TEST_RUN, {TEST_RUN_REPEAT} \
         repeats) of one frame through the attached program and its live maps: the program \
         alone. Target: ordinary packets under 50 ns."
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    let ratio = ratios(&udp.probe, &udp.base);
    let alone: Vec<f64> = costs
        .iter()
        .filter(|c| c.0 == "test run: ordinary SYN")
        .map(|c| c.2)
        .collect();
    let path_ns = 1e9 / median(&udp.base);
    summary.push((
        "ordinary 64-byte UDP, agent / nothing (target >= 0.98)".into(),
        format!(
            "{:.3}: {}; per-round spread {} on this machine; from the program's own cost \
             ({:.1} ns on a {:.0} ns packet path) {:.3} is expected",
            median(&ratio),
            met(median(&ratio) >= 0.98),
            spread(&ratio, 3),
            median(&alone),
            path_ns,
            path_ns / (path_ns + median(&alone)),
        ),
    ));
    summary.push((
        "ordinary packet, ns per run of clb_ingress (target < 50)".into(),
        format!(
            "{:.1} alone (test run): {}; {:.1} on live traffic with bpf_stats' clock reads",
            median(&alone),
            met(median(&alone) < 50.0),
            median(
                &costs
                    .iter()
                    .filter(|c| c.0 == "ordinary UDP" && c.1 == "clb_ingress")
                    .map(|c| c.2)
                    .collect::<Vec<_>>()
            ),
        ),
    ));
    summary.push((
        "tcpdump on the same NIC, / nothing (ordinary UDP)".into(),
        format!("{:.3}", median(&ratios(&udp.tcpdump, &udp.base))),
    ));
    let mut keys: Vec<(String, String)> = costs
        .iter()
        .map(|(c, n, ..)| (c.clone(), n.clone()))
        .collect();
    keys.sort();
    keys.dedup();
    for (case, name) in keys {
        let of = |c: &&(String, String, f64, u64)| c.0 == case && c.1 == name;
        let ns: Vec<f64> = costs.iter().filter(of).map(|c| c.2).collect();
        let runs: u64 = costs.iter().filter(of).map(|c| c.3).sum();
        cost.row(vec![case, name, spread(&ns, 1), runs.to_string()]);
    }
    Ok((overhead, cost, startups, idle_rss))
}
