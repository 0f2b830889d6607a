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
//! 9. **Scale** ([`scale`], only with `--only scale`): the service table at cluster scale.
//! 10. **Fleet** ([`fleet`], only with `--only fleet`): a fleet's load on the API server (real
//!     agents against the fake API holding 1,000 and 5,000 nodes), the plugin's time and RSS.
//!
//! The output is spliced section by section ([`doc`]): a run replaces the sections of the parts
//! it ran (each under a line saying when, with what command, at which commit and on what
//! machine) and their summary lines, and keeps every other section of `BENCHMARKS.md` as it is.
//! `--only ratio,footprint` runs some parts; `CLB_BENCH_PROBE=<path>` benches a prebuilt agent
//! (`CLB_BENCH_PLUGIN=<path>` a prebuilt plugin for the fleet part) (e.g. the previous commit's, for a
//! before/after). Runs share fixed namespace names: one bench at a time on a machine, so a run
//! takes `/run/clb-bench.lock` (flock, non-blocking) first and fails at once when another
//! holds it.
//!
//! No figure is asserted on: benchmarks report, tests assert. `--quick` is a smoke run of a
//! few seconds per part (spliced into `target/bench-quick.md` unless `--out` says otherwise).

mod classes;
mod datapath;
pub(crate) mod detect;
mod doc;
pub mod fleet;
pub mod fleet_api;
mod fleet_tables;
mod flood;
pub(crate) mod footprint;
mod latency;
pub(crate) mod lock;
pub(crate) mod net;
pub(crate) mod ratio;
pub mod report;
pub mod scale;
pub mod scale_api;
pub mod scale_conntrack;
pub mod scale_plot;
pub mod scale_rules;
pub mod storm;
mod tcx;
pub(crate) mod tools;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use self::{net::BenchNet, report::Table};

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
    /// Part 1: one agent column per value, each agent started with `--capture-bytes VALUE`
    /// (issue 40: the packet prefix the kernel copies into each record), side by side in every
    /// round; default: one agent with the agent's default.
    #[arg(long, value_delimiter = ',', value_name = "BYTES,...")]
    pub capture_bytes: Vec<u32>,
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
    /// With `--only scale`: the numbers of Services measured.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    pub scale_sizes: Vec<usize>,
    /// With `--only scale`: seconds of each CPU window.
    #[arg(long, default_value_t = 10)]
    pub scale_window: u64,
    /// With `--only scale`: the kube-proxy modes measured (a before/after of one reader
    /// change needs only its own mode; pair it with `--out` so BENCHMARKS.md is left alone).
    #[arg(long, value_delimiter = ',', default_value = "iptables,nftables")]
    pub scale_modes: Vec<scale::Mode>,
    /// With `--only scale`: leave the old timer reader (the baseline) out.
    #[arg(long)]
    pub scale_no_baseline: bool,
    /// With `--only scale`: add a row per size with the agent given API access (test-support's
    /// fake API in the bench namespace holding the same Services and EndpointSlices).
    #[arg(long)]
    pub scale_api: bool,
    /// With `--scale-api`: only the rows with API access (a before/after of the API path;
    /// pair it with `--out`).
    #[arg(long, requires = "scale_api")]
    pub scale_api_only: bool,
    /// With `--only scale`: what marks a new service table in the agent's log (any of these;
    /// the line also needs `services=N`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "service table read,service table from the API"
    )]
    pub scale_table_pattern: Vec<String>,
    /// With `--only scale`: conntrack entries in the bench namespace while each agent runs
    /// (its RSS is read with them; the issue's target counts 500,000). Default: 500000, 0 with
    /// --quick.
    #[arg(long)]
    pub scale_conntrack: Option<usize>,
    /// With `--only fleet`: the fleet's nodes, growing (the plugin is timed at each).
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    pub fleet_sizes: Vec<usize>,
    /// With `--only fleet`: the Services (with their EndpointSlices) the fake API holds.
    #[arg(long, default_value_t = 30_000)]
    pub fleet_services: usize,
    /// With `--only fleet`: real agents run side by side, each on a fleet node (and in a
    /// network namespace) of its own (1 to 8).
    #[arg(long, default_value_t = 3)]
    pub fleet_agents: usize,
    /// With `--only fleet`: seconds of the steady window and of the changing one.
    #[arg(long, default_value_t = 120)]
    pub fleet_window: u64,
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
            a.scale_sizes = vec![100, 1000];
            a.scale_window = 3;
            a.fleet_sizes = vec![20, 60];
            a.fleet_services = 200;
            a.fleet_agents = 2;
            a.fleet_window = 4;
        }
        a
    }

    fn runs(&self, part: Part) -> bool {
        let only_when_named = matches!(part, Part::Scale | Part::Fleet);
        (self.only.is_empty() && !only_when_named) || self.only.contains(&part)
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
    /// 9: the service table at cluster scale ([`scale`]; ~10-15 minutes, so only when named).
    Scale,
    /// 10: a fleet's load on the API server and the plugin at 1,000 and 5,000 nodes
    /// ([`fleet`]; ~10 minutes, so only when named).
    Fleet,
}

/// Port of the agent's `/metrics` inside the bench node namespace.
const METRICS_PORT: u16 = 19977;
/// After a generator starts, before a window opens (queues fill, rates settle).
const WARMUP: Duration = Duration::from_millis(500);

pub fn run(args: &BenchArgs) -> Result<()> {
    let args = args.effective();
    if !test_support::lab::is_root() {
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
    let probe = build_agent(&root, args.quick)?;
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
            let (overhead, cost, s, r) =
                datapath::datapath(&args, &net, &probe, &work, &mut summary)?;
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
            let flood = flood::flood(&args, &net, &probe, &work, &mut summary)?;
            tag(&mut rows, &mut summary, &flood.table);
            tables.push(flood.table);
            peak_rss = flood.peak_rss_mib;
        }
        if args.runs(Part::Latency) {
            tables.push(latency::latency(&args, &probe, &work, &mut summary)?);
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
        if args.runs(Part::Scale) {
            let window = Duration::from_secs(args.scale_window);
            let plan = scale::Plan {
                sizes: &args.scale_sizes,
                modes: &args.scale_modes,
                baseline: !args.scale_no_baseline,
                api: args.scale_api,
                api_only: args.scale_api_only,
                conntrack: args
                    .scale_conntrack
                    .unwrap_or(if args.quick { 0 } else { 500_000 }),
                table_patterns: &args.scale_table_pattern,
                window,
            };
            let points = scale::measure(&probe, &work, METRICS_PORT, &plan)?;
            let plots = scale::plot(&points, &root)?;
            for t in scale::tables(&points, window, &plots, &mut summary) {
                tag(&mut rows, &mut summary, &t);
                tables.push(t);
            }
        }
        if args.runs(Part::Fleet) {
            let plan = fleet::Plan {
                sizes: args.fleet_sizes.clone(),
                services: args.fleet_services,
                agents: args.fleet_agents,
                window: Duration::from_secs(args.fleet_window),
                settle: Duration::from_secs(if args.quick { 3 } else { 20 }),
                verify_timeout_s: if args.quick { 20 } else { 60 },
            };
            let plugin = build_plugin(&root, args.quick)?;
            let measured = fleet::measure(&probe, &plugin, &work, METRICS_PORT, &plan)?;
            for t in [
                fleet_tables::load_table(&measured, &mut summary),
                fleet_tables::plugin_table(&measured, &mut summary),
            ] {
                tag(&mut rows, &mut summary, &t);
                tables.push(t);
            }
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

/// The agent the bench runs: the release build (what the DaemonSet runs) for figures; the
/// smoke run (`--quick`, figures never read) takes the debug build the tests already made, so
/// CI does not compile the workspace a third time (minutes on a cold machine).
/// `CLB_BENCH_PROBE=<path>` runs a prebuilt one.
fn build_agent(root: &Path, quick: bool) -> Result<PathBuf> {
    build_bin(root, quick, "probe", "CLB_BENCH_PROBE", "agent")
}

/// The plugin `--only fleet` times: the release build (debug for `--quick`), as the agent;
/// `CLB_BENCH_PLUGIN=<path>` times a prebuilt one.
fn build_plugin(root: &Path, quick: bool) -> Result<PathBuf> {
    build_bin(
        root,
        quick,
        "kubectl-clb_probe",
        "CLB_BENCH_PLUGIN",
        "plugin",
    )
}

/// Builds the workspace binary `bin` (release, or debug for `--quick`) and returns its path;
/// the path in the environment variable `prebuilt` instead, when set: a before/after
/// comparison runs a binary built elsewhere (e.g. the previous commit's).
fn build_bin(root: &Path, quick: bool, bin: &str, prebuilt: &str, what: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(prebuilt) {
        eprintln!("bench: using {prebuilt}={}", path.to_string_lossy());
        return Ok(PathBuf::from(path));
    }
    let profile = if quick { "debug" } else { "release" };
    eprintln!("bench: cargo build ({profile}) --bin {bin}");
    let mut build = crate::build::workspace_cargo(root, "build");
    build.args(["--bin", bin]);
    if !quick {
        build.arg("--release");
    }
    let status = build.status().context("running cargo build")?;
    if !status.success() {
        bail!("building the {profile} {what} failed ({status})");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join(profile).join(bin))
}

fn read_sysctl(key: &str) -> Result<String> {
    Ok(test_support::lab::cmd::run(&["sysctl", "-n", key])?
        .trim()
        .to_string())
}

fn write_sysctl(key: &str, value: &str) -> Result<()> {
    test_support::lab::cmd::run(&["sysctl", "-q", "-w", &format!("{key}={value}")]).map(drop)
}

/// The line under each section this run writes: when, with what command, on what machine.
fn measured_line(args: &BenchArgs, root: &Path) -> String {
    let run = |argv: &[&str]| {
        test_support::lab::cmd::run(argv)
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

#[cfg(test)]
mod tests;
