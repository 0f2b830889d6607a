//! `cargo xtask bench`: what the probe costs, measured side by side in one run, written to
//! `BENCHMARKS.md` with the kernel, CPU and date.
//!
//! Everything runs in the bench's own two namespaces ([`net`]): a sender and a "node" joined
//! by a veth pair, the node forwarding ordinary traffic into an ifb sink. The agent is the
//! release build, started and stopped by the bench like the DaemonSet would (tcx attach,
//! address sets from the node namespace, `--pod-cidr` so the ordinary path pays the trie
//! look-up a real node pays).
//!
//! 1. **Datapath overhead**: packets/s into the sink (64-byte UDP from trafgen, one sender
//!    CPU) and TCP throughput (iperf3), with nothing attached, with the agent, and with
//!    `tcpdump` on the same NIC filtering for local sources. Each round measures the three
//!    one after the other; ratios are per round, quoted as median (min–max).
//!    1b. **Paired ratio** ([`ratio`]): many short windows (nothing, agent, tcpdump) under one
//!    continuous stream, the agent toggled by a tcx link of its own programs; the median ratio
//!    with a bootstrap 95% interval and a verdict against 0.98.
//! 2. **Per-packet cost**: `kernel.bpf_stats_enabled=1` for short separate windows (the stats
//!    cost time themselves, so never while a rate is measured): run_time_ns / run_cnt of each
//!    program on ordinary packets, on suspects only, and on a TCP stream.
//! 3. **Spoofed flood**: trafgen sends VIP- and node-source UDP (random ports: every packet a
//!    new flow) as fast as one CPU can for `--flood-secs`; agent CPU and RSS each second,
//!    `/metrics` fetched each second, then the kernel's exact suspect count against the
//!    packets the NIC received, and events emitted against suppressed.
//! 4. **Detection latency**: `--latency-events` health-check SYNs from the VIP to distinct
//!    NodePorts (distinct aggregates, so each is written); from the kernel's drop timestamp
//!    (the agent's `--record` stream) to the confirmed line arriving on the agent's stdout.
//! 5. **Footprint** ([`footprint`]): agent starts of their own: time to ready and its steps,
//!    idle RSS, each map's memory; peak RSS under the flood.
//! 6. **Traffic classes** ([`classes`]): ns per ordinary packet by class, test run and live.
//!
//! The output is spliced section by section ([`doc`]): a run replaces the sections of the parts
//! it ran (each under a line saying when, with what command, at which commit and on what
//! machine) and their summary lines, and keeps every other section of `BENCHMARKS.md` as it is.
//! `--only ratio,footprint` runs some parts; `CLB_BENCH_PROBE=<path>` benches a prebuilt agent (e.g. the previous commit's, for a
//! before/after). Runs share fixed namespace names: one bench at a time on a machine, so a run
//! takes `/run/clb-bench.lock` (flock, non-blocking) first and fails at once when another
//! holds it.
//!
//! No figure is asserted on: benchmarks report, tests assert. `--quick` is a smoke run of a
//! few seconds per part (spliced into `target/bench-quick.md` unless `--out` says otherwise).

mod classes;
pub(crate) mod detect;
mod doc;
pub(crate) mod footprint;
pub(crate) mod lock;
pub(crate) mod net;
pub(crate) mod ratio;
pub mod report;
pub mod storm;
mod tcx;
pub(crate) mod tools;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use probe_contract::{LoopbackEvent, LoopbackKind};

use self::{
    net::BenchNet,
    report::{Table, median, percentile, ratios, spread},
    tools::{Agent, RawSender, pause},
};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Rounds of the side-by-side comparisons (each: nothing, agent, tcpdump).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds each rate is measured over.
    #[arg(long, default_value_t = 5)]
    pub secs: u64,
    /// Seconds of the spoofed flood.
    #[arg(long, default_value_t = 30)]
    pub flood_secs: u64,
    /// Health-check drops timed for the detection latency.
    #[arg(long, default_value_t = 250)]
    pub latency_events: usize,
    /// Cycles of the paired throughput ratio (each: a nothing, an agent, a tcpdump window).
    #[arg(long, default_value_t = 60)]
    pub cycles: usize,
    /// Milliseconds of each paired-ratio window.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
    pub window_ms: u64,
    /// Agent starts timed for the footprint (startup, idle RSS).
    #[arg(long, default_value_t = 5)]
    pub starts: usize,
    /// Run only these parts (default: all); their sections of the output are replaced, the
    /// others kept.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Part>,
    /// A smoke run: one round, one-second windows, a 3 s flood, 20 latency events.
    #[arg(long)]
    pub quick: bool,
    /// Only section 7, correlation at scale (no namespaces, no agent).
    #[arg(long)]
    pub storm_only: bool,
    /// The Markdown file whose sections this run replaces (default: BENCHMARKS.md, or
    /// target/bench-quick.md with --quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Only detection latency and the flood's cost, repeated `--rounds` times (see
    /// `detect.rs`): section 8.
    #[arg(long)]
    pub detect: bool,
    /// With `--detect`: another agent binary measured in alternating rounds (before/after).
    #[arg(long, requires = "detect")]
    pub baseline_agent: Option<PathBuf>,
}

impl BenchArgs {
    fn effective(&self) -> BenchArgs {
        let mut a = self.clone();
        if self.quick {
            a.rounds = 1;
            a.secs = 1;
            a.flood_secs = 3;
            a.latency_events = 20;
            a.cycles = 4;
            a.window_ms = 300;
            a.starts = 2;
        }
        a
    }

    fn runs(&self, part: Part) -> bool {
        self.only.is_empty() || self.only.contains(&part)
    }
}

/// The parts of the bench, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// 1 and 2: the round-by-round comparison and the per-packet cost.
    Datapath,
    /// 1b: the paired-window throughput ratio with its bootstrap interval.
    Ratio,
    Flood,
    Latency,
    Footprint,
    /// Correlation at scale (a full egress table, a hairpin storm; no namespaces).
    Storm,
    /// 6: ns per ordinary packet by traffic class, test run and live.
    Classes,
}

/// Port of the agent's `/metrics` inside the bench node namespace.
const METRICS_PORT: u16 = 19977;
/// Runs of each BPF_PROG_TEST_RUN measurement.
const TEST_RUN_REPEAT: u32 = 1_000_000;
/// After a generator starts, before a window opens (queues fill, rates settle).
const WARMUP: Duration = Duration::from_millis(500);

pub fn run(args: &BenchArgs) -> Result<()> {
    let args = args.effective();
    if !crate::lab::is_root() {
        bail!("cargo xtask bench needs root (namespaces, eBPF, bpf_stats): run it with sudo");
    }
    let _lock = lock::take()?;
    let root = crate::workspace_root();
    let measured = measured_line(&args, &root);
    // Each part's summary lines, tagged with its first table's section when it returns.
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let tag = |rows: &mut Vec<_>, summary: &mut Vec<(String, String)>, t: &Table| {
        let key = doc::section_key(&t.title).unwrap_or_default();
        rows.extend(summary.drain(..).map(|(w, f)| (key.clone(), w, f)));
    };
    if args.storm_only {
        let mut summary = Vec::new();
        let table = storm::correlation_at_scale(&root, args.quick, &mut summary)?;
        tag(&mut rows, &mut summary, &table);
        return write(&args, &root, &measured, &[table], &rows);
    }
    // trafgen, iperf3, tcpdump, bpftool: setup's packages; installs what is missing.
    crate::setup::ensure()?;
    let probe = build_agent(&root)?;
    let work = root.join("target/bench");
    std::fs::create_dir_all(&work)?;
    tools::install_stop_handler();
    let stats_before = read_sysctl("kernel.bpf_stats_enabled").unwrap_or_else(|_| "0".into());

    let result = (|| -> Result<Vec<Table>> {
        if args.detect {
            return detect::run(&args, &probe, &work);
        }
        let net = BenchNet::up()?;
        eprintln!(
            "bench: namespaces up; {} round(s) of {} s windows",
            args.rounds, args.secs
        );
        let mut tables = Vec::new();
        let mut summary = Vec::new();
        let (mut startups, mut idle_rss) = (Vec::new(), Vec::new());
        if args.runs(Part::Datapath) {
            let (overhead, cost, s, r) = datapath(&args, &net, &probe, &work, &mut summary)?;
            tag(&mut rows, &mut summary, &overhead);
            tables.push(overhead);
            tables.push(cost);
            (startups, idle_rss) = (s, r);
        }
        if args.runs(Part::Ratio) {
            let plan = ratio::Plan {
                cycles: args.cycles,
                window: Duration::from_millis(args.window_ms),
            };
            tables.push(ratio::measure(
                &plan,
                &net,
                &probe,
                &work,
                METRICS_PORT,
                &mut summary,
            )?);
            tag(&mut rows, &mut summary, &tables[tables.len() - 1]);
        }
        let mut peak_rss = Vec::new();
        if args.runs(Part::Flood) {
            let flood = flood(&args, &net, &probe, &work, &mut summary)?;
            tag(&mut rows, &mut summary, &flood.table);
            tables.push(flood.table);
            peak_rss = flood.peak_rss_mib;
        }
        if args.runs(Part::Latency) {
            tables.push(latency(&args, &probe, &work, &mut summary)?);
            tag(&mut rows, &mut summary, &tables[tables.len() - 1]);
        }
        if args.runs(Part::Footprint) {
            let mut starts = footprint::starts(args.starts, &probe, &work, METRICS_PORT)?;
            starts.startup_ms.extend(startups);
            starts.idle_rss_mib.extend(idle_rss);
            tables.push(footprint::table(&starts, &peak_rss, &mut summary));
            tag(&mut rows, &mut summary, &tables[tables.len() - 1]);
        }
        if args.runs(Part::Classes) {
            tables.push(classes::classes(&args, &net, &probe, &work, &mut summary)?);
            tag(&mut rows, &mut summary, &tables[tables.len() - 1]);
        }
        if args.runs(Part::Storm) {
            tables.push(storm::correlation_at_scale(
                &root,
                args.quick,
                &mut summary,
            )?);
            tag(&mut rows, &mut summary, &tables[tables.len() - 1]);
        }
        Ok(tables)
    })();
    let _ = write_sysctl("kernel.bpf_stats_enabled", &stats_before);
    let tables = result?;
    write(&args, &root, &measured, &tables, &rows)
}

/// Splices the sections of `tables` and their summary `rows` into the output file (see
/// [`doc`]): BENCHMARKS.md, or target/bench-quick.md for a smoke run, or `--out`.
fn write(
    args: &BenchArgs,
    root: &Path,
    measured: &str,
    tables: &[Table],
    rows: &[(String, String, String)],
) -> Result<()> {
    let sections: Vec<doc::Section> = tables.iter().map(|t| doc::section(t, measured)).collect();
    for s in &sections {
        println!("{}\n", s.markdown);
    }
    for (k, w, f) in rows {
        println!("summary ({k}): {w}: {f}");
    }
    let out = args.out.clone().unwrap_or_else(|| {
        if args.quick {
            root.join("target/bench-quick.md")
        } else {
            root.join("BENCHMARKS.md")
        }
    });
    let old = match std::fs::read_to_string(&out) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
    };
    let text = doc::splice(&old, &sections, rows);
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    let keys: Vec<&str> = sections.iter().map(|s| s.key.as_str()).collect();
    eprintln!(
        "bench: section(s) {} written to {} (the rest of it kept)",
        keys.join(", "),
        out.display()
    );
    Ok(())
}

fn build_agent(root: &Path) -> Result<PathBuf> {
    // A before/after comparison runs a binary built elsewhere (e.g. the previous commit's).
    if let Some(path) = std::env::var_os("CLB_BENCH_PROBE") {
        eprintln!("bench: using CLB_BENCH_PROBE={}", path.to_string_lossy());
        return Ok(PathBuf::from(path));
    }
    eprintln!("bench: cargo build --release -p probe-user");
    let status = std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
        .args(["build", "--release", "-p", "probe-user", "--bin", "probe"])
        .current_dir(root)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building the release agent failed ({status})");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("release/probe"))
}

fn read_sysctl(key: &str) -> Result<String> {
    Ok(crate::lab::cmd::run(&["sysctl", "-n", key])?
        .trim()
        .to_string())
}

fn write_sysctl(key: &str, value: &str) -> Result<()> {
    crate::lab::cmd::run(&["sysctl", "-q", "-w", &format!("{key}={value}")]).map(drop)
}

/// The line under each section this run writes: when, with what command, on what machine.
fn measured_line(args: &BenchArgs, root: &Path) -> String {
    let run = |argv: &[&str]| {
        crate::lab::cmd::run(argv)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let kernel = run(&["uname", "-r"]);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = run(&["date", "-u", "+%Y-%m-%d %H:%M UTC"]);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let root = root.display().to_string();
    let commit = run(&["git", "-C", &root, "rev-parse", "--short", "HEAD"]);
    let dirty = !run(&[
        "git",
        "-C",
        &root,
        "status",
        "--porcelain",
        "--untracked-files=no",
    ])
    .is_empty();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let command = if argv.first().is_some_and(|a| a == "bench") {
        format!("cargo xtask {}", argv.join(" "))
    } else {
        "cargo xtask bench --quick (from cargo xtask test)".to_string()
    };
    let agent = std::env::var("CLB_BENCH_PROBE")
        .map(|p| format!(", agent CLB_BENCH_PROBE={p}"))
        .unwrap_or_default();
    format!(
        "_Measured {date} by `{command}` at {commit}{dirty}{agent}: kernel {kernel}, {cpu} \
         ({cpus} CPUs), load average {load} at the start{quick}._",
        commit = if commit.is_empty() { "?" } else { &commit },
        dirty = if dirty { " (with local changes)" } else { "" },
        quick = if args.quick {
            " (--quick smoke run: figures are indicative only)"
        } else {
            ""
        },
    )
}

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
    let mut out = Vec::new();
    for (name, t1, c1) in after {
        let (t0, c0) = before
            .iter()
            .find(|(n, ..)| *n == name)
            .map_or((0, 0), |(_, t, c)| (*t, *c));
        if c1 > c0 {
            out.push((name, (t1 - t0) as f64 / (c1 - c0) as f64, c1 - c0));
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Nothing,
    Agent,
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
    probe: Vec<f64>,
    tcpdump: Vec<f64>,
}

impl Series {
    fn of(&mut self, mode: Mode) -> &mut Vec<f64> {
        match mode {
            Mode::Nothing => &mut self.base,
            Mode::Agent => &mut self.probe,
            Mode::Tcpdump => &mut self.tcpdump,
        }
    }

    /// One table row; rates shown times `scale` in `unit`, ratios as measured.
    fn row(&self, case: &str, unit: &str, scale: f64, digits: usize) -> Vec<String> {
        let shown = |v: &[f64]| {
            let v: Vec<f64> = v.iter().map(|x| x * scale).collect();
            format!("{} {unit}", spread(&v, digits))
        };
        vec![
            case.to_string(),
            shown(&self.base),
            shown(&self.probe),
            spread(&ratios(&self.probe, &self.base), 3),
            shown(&self.tcpdump),
            spread(&ratios(&self.tcpdump, &self.base), 3),
        ]
    }
}

/// Part 1 and 2; also the agent's startup times and idle RSS of each round.
fn datapath(
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

    let (mut udp, mut udp_mixed, mut tcp) =
        (Series::default(), Series::default(), Series::default());
    let mut costs: Vec<(String, String, f64, u64)> = Vec::new();
    let (mut startups, mut idle_rss) = (Vec::new(), Vec::new());
    let secs = args.secs;
    // The three set-ups in a different order each round (rotating), so a drift of the
    // machine's speed during a round (steal time on a shared host) does not favour one.
    const MODES: [Mode; 3] = [Mode::Nothing, Mode::Agent, Mode::Tcpdump];
    for round in 0..args.rounds {
        for k in 0..MODES.len() {
            let mode = MODES[(round + k) % MODES.len()];
            eprintln!("bench: round {}/{}: {mode:?}", round + 1, args.rounds);
            // Whatever this mode attaches lives until the end of this block.
            let agent = match mode {
                Mode::Agent => {
                    let agent = Agent::start(probe, work, METRICS_PORT)?;
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
            udp.of(mode).push(udp_rate(net, &ordinary, secs)?);
            udp_mixed.of(mode).push(udp_rate(net, &mixed, secs)?);
            tcp.of(mode).push(tcp_rate(secs)?);
            if agent.is_some() {
                per_packet_costs(&ordinary, &suspects, secs, work, &mut costs)?;
            }
            drop(dump);
            drop(agent);
        }
    }

    let mut overhead = Table::new(
        "1. Datapath overhead",
        &[
            "traffic",
            "nothing attached",
            "agent attached",
            "agent / nothing",
            "tcpdump (local-source filter)",
            "tcpdump / nothing",
        ],
    );
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

struct FloodResult {
    table: Table,
    peak_rss_mib: Vec<f64>,
}

/// Part 3.
fn flood(
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

/// Part 4.
fn latency(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_is_short() {
        let a = BenchArgs {
            rounds: 5,
            secs: 5,
            flood_secs: 30,
            latency_events: 250,
            cycles: 60,
            window_ms: 1000,
            starts: 5,
            only: vec![Part::Ratio],
            quick: true,
            storm_only: false,
            out: None,
            detect: false,
            baseline_agent: None,
        }
        .effective();
        assert_eq!(
            (a.rounds, a.secs, a.flood_secs, a.latency_events),
            (1, 1, 3, 20)
        );
        assert_eq!((a.cycles, a.window_ms, a.starts), (4, 300, 2));
        assert!(a.runs(Part::Ratio) && !a.runs(Part::Datapath));
    }
}
