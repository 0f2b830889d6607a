//! The throughput ratio, resolved: many short windows with the agent's programs attached,
//! with nothing, with an empty classifier on the same hooks, and with tcpdump, in rotating
//! order under one continuous trafgen stream; the median of the per-cycle ratios with a
//! seeded bootstrap 95% interval, and a verdict against the target that says why when it
//! cannot decide: agent / nothing against 0.98, and agent / empty classifier against 0.99.
//! The empty classifier (two instructions, no packet read) on the agent's own hooks is the
//! physical limit of a tc-attached probe: what it costs is the hook itself (the tcx dispatch,
//! the skb's trip through it), which no program on that hook can avoid; agent / empty is
//! the share of that limit the agent's own work keeps.
//!
//! Why it is built this way (the honest part):
//! - The agent is started once and stays running for the whole series: its threads, its ring
//!   reader and its `kfree_skb` hook are there in every window, "nothing" included. What a
//!   window toggles is exactly the per-packet cost: whether the agent's own loaded
//!   `clb_ingress`/`clb_egress` (its programs, its live maps) run on the NIC's tcx hooks.
//!   The agent's links are detached once, before the first window; after that the bench holds
//!   a tcx link of the same programs and creates/closes it between windows (one syscall each),
//!   so neither a load, a verification nor an agent start ever falls inside a window. The
//!   agent's userspace cost on idle ordinary traffic is polling a ring every 50 ms (measured
//!   in the flood part: ~1% of a core under a flood), so what is left out is nothing the
//!   per-packet question depends on.
//! - tcpdump cannot be toggled without a restart: it is started before its window (the window
//!   opens once it prints "listening on" and a settle pause has passed) and stopped after.
//! - trafgen runs through the whole series; a window is the sink's packet counter read twice
//!   from /proc/<pid>/net/dev (a file read, no process spawned).
//! - The machine is shared (other builds run on the same two CPUs): the speed drifts from one
//!   second to the next. Adjacent windows see nearly the same drift, so each cycle's ratio
//!   cancels most of it; the median of many ratios and its bootstrap interval say how well.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    net::{self, BenchNet},
    report::{Table, median, spread},
    tcx::Toggle,
    tools::{self, Agent, pause},
};

/// The target for agent / nothing.
pub const TARGET: f64 = 0.98;
/// The target for agent / the empty classifier on the same hooks.
pub const TARGET_EMPTY: f64 = 0.99;
/// Resamples of the bootstrap; the seed makes the interval reproducible from the data.
const RESAMPLES: usize = 10_000;
const SEED: u64 = 0x5eed_c1b0_0098;
/// After a toggle, before a window opens.
const SETTLE: Duration = Duration::from_millis(150);

/// A small deterministic generator (splitmix64): the bootstrap needs reproducibility, not
/// cryptographic quality, and no dependency.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is negligible for the sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The median of paired ratios with its percentile-bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
}

impl Estimate {
    pub fn width(&self) -> f64 {
        self.hi - self.lo
    }
}

/// Median of `ratios` and the 2.5th–97.5th percentiles of the medians of `resamples`
/// resamples (with replacement, same size), drawn from a generator seeded with `seed`.
/// None when there is nothing to estimate from.
pub fn bootstrap_median(ratios: &[f64], resamples: usize, seed: u64) -> Option<Estimate> {
    if ratios.is_empty() || resamples == 0 {
        return None;
    }
    let mut rng = SplitMix64::new(seed);
    let mut sample = vec![0.0; ratios.len()];
    let mut medians = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        for s in sample.iter_mut() {
            *s = ratios[rng.below(ratios.len())];
        }
        medians.push(median(&sample));
    }
    Some(Estimate {
        median: median(ratios),
        lo: super::report::percentile(&medians, 2.5),
        hi: super::report::percentile(&medians, 97.5),
        n: ratios.len(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The whole interval is at or above the target.
    Met,
    /// The whole interval is below the target.
    Refuted,
    /// The interval holds the target.
    NotResolved,
}

/// The verdict on `est` against `target` and one sentence saying why, with the interval's
/// width against `resolution` (the difference the measurement is asked to tell apart) and,
/// when unresolved, roughly how many windows would narrow it to that (width ~ 1/sqrt(n)).
pub fn judge(est: &Estimate, target: f64, resolution: f64) -> (Verdict, String) {
    let width = est.width();
    let interval = format!(
        "95% interval {:.3}–{:.3} (width {:.3}, n={})",
        est.lo, est.hi, width, est.n
    );
    if est.lo >= target {
        (
            Verdict::Met,
            format!("met: {interval} lies at or above {target:.2}"),
        )
    } else if est.hi < target {
        (
            Verdict::Refuted,
            format!("refuted: {interval} lies below {target:.2}"),
        )
    } else if width > resolution {
        let needed = (est.n as f64 * (width / resolution).powi(2)).ceil();
        (
            Verdict::NotResolved,
            format!(
                "not resolved: {interval} holds {target:.2} and is wider than the {:.0}% to \
                 resolve; ~{needed:.0} windows of this noise would narrow it to {resolution:.2}",
                resolution * 100.0
            ),
        )
    } else {
        (
            Verdict::NotResolved,
            format!(
                "not resolved: {interval} is narrower than {:.0}% but holds {target:.2}: the \
                 ratio is within {:.3} of the target either way",
                resolution * 100.0,
                width
            ),
        )
    }
}

/// What a window measures with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    Nothing,
    Agent,
    /// The empty classifier on every hook the agent's programs hold.
    Empty,
    Tcpdump,
}

const ARMS: [Arm; 4] = [Arm::Nothing, Arm::Agent, Arm::Empty, Arm::Tcpdump];

/// The order of the windows in cycle `i`: each arm takes each position equally often, and
/// each is next to each other arm (rotations, then their reversals).
fn cycle_order(i: usize) -> [Arm; 4] {
    let n = ARMS.len();
    let r = i % n;
    let mut o = std::array::from_fn(|k| ARMS[(r + k) % n]);
    if (i / n) % 2 == 1 {
        o.reverse();
    }
    o
}

/// Received packets of `dev` in the network namespace of process `pid` (/proc/<pid>/net/dev).
fn rx_packets(pid: i32, dev: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))?;
    net_dev_rx_packets(&text, dev).with_context(|| format!("no {dev} in /proc/{pid}/net/dev"))
}

/// The receive packet count of `dev` in /proc/net/dev text (bytes come first, then packets).
fn net_dev_rx_packets(text: &str, dev: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        (name.trim() == dev).then(|| rest.split_whitespace().nth(1)?.parse::<u64>().ok())?
    })
}

/// The processes of group `pgid` (trafgen and its workers).
fn group_pids(pgid: i32) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after "(comm)": state, ppid, pgrp, ...
        let pgrp = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<i32>().ok());
        if pgrp == Some(pgid) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// CPU time spent on the sending path so far, ns: the run time of trafgen's threads (`pids`)
/// plus the irq and softirq time of the CPUs they last ran on (the forwarding runs in softirq
/// on the sending CPU; with irq time accounting it is not the task's; trafgen pins its
/// worker). Packets per CPU-second of this is the rate the path
/// would reach on a core of its own: the share of the CPU the scheduler grants trafgen on a
/// shared machine drops out, the cost of each packet stays.
fn path_cpu_ns(pids: &[i32]) -> Result<u64> {
    let mut ns = 0u64;
    let mut cpus = Vec::new();
    for pid in pids {
        if let Some(cpu) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                // "processor" is field 39; fields after "(comm)" start at field 3.
                s.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(36)?
                    .parse::<usize>()
                    .ok()
            })
            && !cpus.contains(&cpu)
        {
            cpus.push(cpu);
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    let stat = std::fs::read_to_string("/proc/stat")?;
    for cpu in cpus {
        ns += irq_softirq_ns(
            &stat,
            &format!("cpu{cpu} "),
            super::tools::clock_ticks_per_sec(),
        )
        .with_context(|| format!("no cpu{cpu} line in /proc/stat"))?;
    }
    Ok(ns)
}

/// irq + softirq time of the /proc/stat line starting with `cpu` ("cpu " for all, "cpu0 "),
/// ns.
fn irq_softirq_ns(stat: &str, cpu: &str, hz: u64) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with(cpu))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq ...
    Some((f.get(5)? + f.get(6)?) * 1_000_000_000 / hz.max(1))
}

/// The paired series' settings.
pub struct Plan {
    pub cycles: usize,
    pub window: Duration,
}

/// Runs the series with the release agent `probe` and returns its table; pushes the summary
/// lines.
pub fn measure(
    plan: &Plan,
    net: &BenchNet,
    probe: &Path,
    work: &Path,
    metrics_port: u16,
    summary: &mut Vec<(String, String)>,
) -> Result<Table> {
    eprintln!(
        "bench: paired ratio, {} cycles of 3 x {} ms",
        plan.cycles,
        plan.window.as_millis()
    );
    let ordinary = work.join("ordinary.trafgen");
    std::fs::write(&ordinary, tools::trafgen_config(net, 1, None))?;
    let agent = Agent::start(probe, work, metrics_port)?;
    let pid = agent.pid();
    let mut toggle = Toggle::take_over(pid)?;
    let empty_prog = super::tcx::load_empty_classifier()?;
    let mut sender = tools::trafgen(&ordinary)?;
    pause(Duration::from_millis(500))?;
    let senders = group_pids(sender.pid())?;
    let (mut base, mut with_agent, mut with_dump) = (Vec::new(), Vec::new(), Vec::new());
    let (mut base_cpu, mut agent_cpu, mut dump_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let (mut with_empty, mut empty_cpu) = (Vec::new(), Vec::new());
    // (packets/s, packets per CPU-second of the path) of one window.
    let window = || -> Result<(f64, f64)> {
        pause(SETTLE)?;
        let (p0, c0, t0) = (
            rx_packets(pid, net::SINK_IF)?,
            path_cpu_ns(&senders)?,
            Instant::now(),
        );
        pause(plan.window)?;
        let (p1, c1, t1) = (
            rx_packets(pid, net::SINK_IF)?,
            path_cpu_ns(&senders)?,
            Instant::now(),
        );
        let packets = (p1 - p0) as f64;
        Ok((
            packets / (t1 - t0).as_secs_f64(),
            packets / ((c1.saturating_sub(c0)).max(1) as f64 / 1e9),
        ))
    };
    for i in 0..plan.cycles {
        let (mut b, mut a, mut e, mut d) = ((0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0));
        for arm in cycle_order(i) {
            match arm {
                Arm::Nothing => {
                    toggle.off();
                    b = window()?;
                }
                Arm::Agent => {
                    toggle.on()?;
                    a = window()?;
                    toggle.off();
                }
                Arm::Empty => {
                    toggle.all_empty(&empty_prog)?;
                    e = window()?;
                    toggle.off();
                }
                Arm::Tcpdump => {
                    toggle.off();
                    let dump = tools::tcpdump()?;
                    d = window()?;
                    drop(dump);
                }
            }
        }
        // Per cycle, for whoever wants to see the windows behind the medians.
        eprintln!(
            "bench: cycle {i}: {:?}: nothing {:.0}/{:.0}, agent {:.0}/{:.0}, empty {:.0}/{:.0}, \
             tcpdump {:.0}/{:.0} (packets/s / per CPU-second)",
            cycle_order(i),
            b.0,
            b.1,
            a.0,
            a.1,
            e.0,
            e.1,
            d.0,
            d.1
        );
        base.push(b.0);
        with_agent.push(a.0);
        with_dump.push(d.0);
        with_empty.push(e.0);
        empty_cpu.push(e.1);
        base_cpu.push(b.1);
        agent_cpu.push(a.1);
        dump_cpu.push(d.1);
        if (i + 1) % 10 == 0 {
            eprintln!("bench: paired ratio: {}/{} cycles", i + 1, plan.cycles);
        }
    }
    sender.check_running()?;
    sender.stop();
    toggle.off();
    drop(toggle);
    drop(empty_prog);
    drop(agent);

    let agent_ratios = super::report::ratios(&with_agent, &base);
    let dump_ratios = super::report::ratios(&with_dump, &base);
    let agent_cpu_ratios = super::report::ratios(&agent_cpu, &base_cpu);
    let dump_cpu_ratios = super::report::ratios(&dump_cpu, &base_cpu);
    let empty_ratios = super::report::ratios(&with_empty, &base);
    let empty_cpu_ratios = super::report::ratios(&empty_cpu, &base_cpu);
    let agent_to_empty = super::report::ratios(&with_agent, &with_empty);
    let agent_to_empty_cpu = super::report::ratios(&agent_cpu, &empty_cpu);
    let mut table = Table::new(
        "1b. Throughput ratio, paired windows",
        &[
            "set-up",
            "rate (kpps)",
            "ratio, median",
            "bootstrap 95% interval",
            "ratios, p25–p75",
            "verdict",
        ],
    );
    table.note = format!(
        "64-byte ordinary UDP from one continuous trafgen stream; {n} cycles of four {w} ms \
         windows (nothing, agent, empty classifier, tcpdump) in rotating order, {settle} ms \
         settle after each switch. The agent runs through the whole series; what a window \
         switches is whether its own loaded clb_ingress/clb_egress run on {nic}'s tcx hooks \
         (the bench detaches the agent's links once and then creates/closes a tcx link of the \
         same programs between windows: no load, no start inside a window). The empty \
         classifier (`r0 = -1; exit`: it reads neither the packet nor a map) takes the \
         agent's place on every one of those hooks: the physical limit of a tc-attached \
         probe, the hook's own cost. tcpdump is started before its window and stopped after. \
         Ratio per cycle (the same cycle's nothing, or empty, window); median with a \
         percentile bootstrap ({RESAMPLES} resamples, fixed seed); \"agent / empty\" is judged \
         against {TARGET_EMPTY:.2}, the rest against {TARGET:.2}. The machine is shared with \
         other builds while this runs: the paired design is what cancels their drift.",
        n = plan.cycles,
        w = plan.window.as_millis(),
        settle = SETTLE.as_millis(),
        nic = net::NODE_IF,
    );
    let kpps = |v: &[f64]| spread(&v.iter().map(|x| x / 1e3).collect::<Vec<_>>(), 1);
    let path_ns = 1e9 / median(&base_cpu);
    for (rate, b) in [("packets/s", &base), ("packets per CPU-second", &base_cpu)] {
        table.row(vec![
            format!("nothing, {rate}"),
            kpps(b),
            "1".into(),
            "".into(),
            "".into(),
            "".into(),
        ]);
    }
    // (row, rates, ratios, what the ratio is to, target)
    for (name, rates, ratios, to, target) in [
        (
            "agent, packets/s",
            &with_agent,
            &agent_ratios,
            "nothing",
            TARGET,
        ),
        (
            "empty classifier, packets/s",
            &with_empty,
            &empty_ratios,
            "nothing",
            TARGET,
        ),
        (
            "agent / empty classifier, packets/s",
            &with_agent,
            &agent_to_empty,
            "empty classifier",
            TARGET_EMPTY,
        ),
        (
            "tcpdump (local-source filter), packets/s",
            &with_dump,
            &dump_ratios,
            "nothing",
            TARGET,
        ),
        (
            "agent, packets per CPU-second",
            &agent_cpu,
            &agent_cpu_ratios,
            "nothing",
            TARGET,
        ),
        (
            "empty classifier, packets per CPU-second",
            &empty_cpu,
            &empty_cpu_ratios,
            "nothing",
            TARGET,
        ),
        (
            "agent / empty classifier, packets per CPU-second",
            &agent_cpu,
            &agent_to_empty_cpu,
            "empty classifier",
            TARGET_EMPTY,
        ),
        (
            "tcpdump (local-source filter), packets per CPU-second",
            &dump_cpu,
            &dump_cpu_ratios,
            "nothing",
            TARGET,
        ),
    ] {
        let Some(est) = bootstrap_median(ratios, RESAMPLES, SEED) else {
            continue;
        };
        // The difference to resolve is the target's distance from 1.
        let (_, why) = judge(&est, target, 1.0 - target);
        table.row(vec![
            name.into(),
            kpps(rates),
            format!("{:.3}", est.median),
            format!("{:.3}–{:.3}", est.lo, est.hi),
            format!(
                "{:.3}–{:.3}",
                super::report::percentile(ratios, 25.0),
                super::report::percentile(ratios, 75.0)
            ),
            why.clone(),
        ]);
        if name.starts_with("empty classifier") {
            // In the table; the summary keeps what the targets judge.
            continue;
        }
        let label = if name.contains(" / ") {
            name.replacen(" / empty classifier,", ",", 1)
        } else {
            name.to_string()
        };
        summary.push((
            format!("ordinary UDP, {label} / {to}, paired windows (target >= {target:.2})"),
            format!("{:.3}, {why}", est.median),
        ));
    }
    table.note.push_str(&format!(
        " \"Packets per CPU-second\": packets over the CPU time the sending path used in the \
         window (trafgen's threads' run time plus the irq and softirq time of the CPU it \
         runs on, where the forwarding runs): the rate on a core of its own, so the share of the CPU the \
         scheduler gives trafgen on a busy machine drops out and the per-packet cost stays \
         (here {path_ns:.0} ns of path per packet with nothing attached). Packets/s is the \
         plain rate, at the mercy of that share."
    ));
    Ok(table)
}

#[cfg(test)]
#[path = "ratio_tests.rs"]
mod tests;
