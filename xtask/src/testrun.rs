//! `cargo xtask test`: the README's test command, and exactly what CI runs.
//!
//! 1. setup when something is missing; 2. fmt; 3. every compilation, once ([`crate::build`]:
//!    the host build every later step reuses, the arm64 build, the lint gates' check builds);
//!    4. the VM tier (root only, `--no-vm` skips it: Debian's 5.10, 6.1
//!    and 6.12 kernels and the arm64 run, with real IPVS) starts in a thread, its guests at a
//!    lower priority, 5. beside the host tests: unit tests (no root), the deny checks, the root-only
//!    integration tests against the lab and the real kernel, one at a time (they share the
//!    lab's fixed namespaces), the chaos and bench smokes; 6. the VM tier is waited for, and a
//!    table of step times and one `summary:` line close the run.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{setup, workspace_root};

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Prints how long a step took: CI's log then says where its budget went.
fn took(name: &str, start: std::time::Instant) {
    eprintln!("test: {name}: took {:.0} s", start.elapsed().as_secs_f64());
}

/// Runs `cmd`; an error when it fails.
fn run_step(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// Totals over every `cargo test` run, for one closing line CI can read.
#[derive(Debug, Default)]
pub struct Totals {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl Totals {
    /// Adds a libtest summary line (`test result: ok. 5 passed; 0 failed; 1 ignored; ...`).
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result:") else {
            return;
        };
        for part in rest.split(';') {
            let words: Vec<&str> = part.split_whitespace().collect();
            let (Some(n), Some(what)) = (
                words
                    .iter()
                    .rev()
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok()),
                words.last(),
            ) else {
                continue;
            };
            match *what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Runs a `cargo test`, echoing its output, and adds its summaries to `totals`.
fn test_step(cmd: &mut Command, totals: &mut Totals) -> anyhow::Result<()> {
    use std::io::{BufRead as _, BufReader};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        println!("{line}");
        totals.add_line(&line);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// Skip the fmt/clippy gates (they also run in CI).
    #[arg(long)]
    pub no_lint: bool,
    /// Only the unit tests (no root, no kernel).
    #[arg(long)]
    pub unit_only: bool,
    /// Skip the VM tier (Debian's 5.10, 6.1 and 6.12 kernels under QEMU, and the arm64 run).
    #[arg(long)]
    pub no_vm: bool,
    /// Skip only the VM tier's arm64 run (`vm-test --arch arm64`, about 5 min warm).
    #[arg(long)]
    pub no_arm64_vm: bool,
    /// Skip the benchmark smoke run (`cargo xtask bench --quick`, figures not asserted).
    #[arg(long)]
    pub no_bench: bool,
    /// Skip the chaos smoke run (`cargo xtask chaos --quick`, figures not asserted).
    #[arg(long)]
    pub no_chaos: bool,
    /// Passed to the integration test binary (a test name filter).
    pub filter: Option<String>,
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let mut clock = Clock::default();
    setup::ensure()?;
    clock.add("setup", start);
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    let mut totals = Totals::default();
    let result = stages(args, &root, &mut totals, &mut clock);
    clock.print(start);
    println!(
        "summary: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    result
}

/// Each step's wall time, for the closing table (TESTING.md's budget is per step).
#[derive(Default)]
struct Clock {
    steps: Vec<(String, f64)>,
}

impl Clock {
    fn add(&mut self, name: &str, since: std::time::Instant) {
        took(name, since);
        self.steps
            .push((name.to_string(), since.elapsed().as_secs_f64()));
    }

    fn print(&self, start: std::time::Instant) {
        eprintln!("test: step times (wall; the VM tier runs beside the host steps after it):");
        for (name, secs) in &self.steps {
            eprintln!("test:   {secs:>6.0} s  {name}");
        }
        eprintln!("test:   {:>6.0} s  total", start.elapsed().as_secs_f64());
        // .ci/run's start (epoch seconds): the wall time CI's limit counts, xtask's build too.
        let since_ci = std::env::var("CLB_CI_START")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .zip(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok(),
            )
            .map(|(ci, now)| now.as_secs().saturating_sub(ci));
        if let Some(secs) = since_ci {
            eprintln!("test:   {secs:>6} s  since .ci/run started");
        }
    }
}

/// Runs `f` as one timed step.
fn timed<T>(clock: &mut Clock, name: &str, f: impl FnOnce() -> T) -> T {
    eprintln!("test: {name}");
    let start = std::time::Instant::now();
    let out = f();
    clock.add(name, start);
    out
}

fn stages(
    args: &TestArgs,
    root: &std::path::Path,
    totals: &mut Totals,
    clock: &mut Clock,
) -> anyhow::Result<()> {
    use crate::build::workspace_cargo;
    if !args.no_lint {
        timed(clock, "cargo fmt --check", || {
            run_step(cargo().args(["fmt", "--all", "--", "--check"]))
        })?;
    }
    // Every compilation first, while nothing else wants the CPU: one host build that every
    // later step reuses (crate::build), then the arm64 one, then the lint gates' check builds.
    let vm = !args.unit_only && !args.no_vm && setup::is_root();
    let arm64 = !args.unit_only && setup::is_root();
    timed(
        clock,
        "build (host, debug: binaries, tests, examples)",
        || crate::build::host(root).map(drop),
    )?;
    if arm64 {
        timed(
            clock,
            "build (arm64, debug: the agent, the arm64 VM tests)",
            || crate::build::arm64(root).map(drop),
        )?;
    }
    if !args.no_lint {
        timed(
            clock,
            "cargo clippy -D warnings (userspace, xtask, tests)",
            || {
                run_step(workspace_cargo(root, "clippy").args([
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ]))
            },
        )?;
        // The eBPF crate only builds for the BPF target, with the nightly.
        timed(
            clock,
            "cargo clippy -D warnings (eBPF programs, bpfel-unknown-none)",
            || {
                run_step(Command::new("cargo").args([
                    "+nightly",
                    "clippy",
                    "-p",
                    "probe-ebpf",
                    "--bins",
                    "--target",
                    "bpfel-unknown-none",
                    "-Z",
                    "build-std=core",
                    "--target-dir",
                    "target/ebpf-clippy",
                    "--",
                    "-D",
                    "warnings",
                ]))
            },
        )?;
    }
    // The VM tier's binaries are the host build's and the arm64 build's; prepare fetches the
    // kernels and the arm64 root. Its boots then start at once, in a thread, beside the host
    // tests: those leave most of the 2 cores idle (waits on agents, labs, timers), and the
    // guests, at a lower priority, take it.
    let vm_tier = if vm {
        Some(timed(
            clock,
            "VM tier: prepare (kernels, arm64 root)",
            || prepare_vm(args),
        )?)
    } else {
        None
    };
    let vm_start = std::time::Instant::now();
    std::thread::scope(|s| {
        let vm_thread = vm_tier.map(|jobs| {
            eprintln!(
                "test: VM tier started beside the host tests (Debian 5.10, 6.1, 6.12 kernels \
                 under QEMU: real IPVS, clsact, older drop reasons and drop sites; Debian's \
                 arm64 6.1 under qemu-system-aarch64)"
            );
            s.spawn(move || {
                let runs = crate::vm::run_jobs(&jobs, LANES);
                took("VM tier (wall, from its start)", vm_start);
                (runs, vm_start.elapsed().as_secs_f64())
            })
        });
        let host = host_tests(args, root, totals, clock, arm64);
        let vm_result = vm_thread.map(|t| {
            eprintln!("test: waiting for the VM tier");
            let wait = std::time::Instant::now();
            let (runs, vm_secs) = t.join().expect("the VM tier's thread panicked");
            clock.add("VM tier: waited for after the host tests", wait);
            clock.steps.push((
                "VM tier (wall, from its start, beside the host tests)".into(),
                vm_secs,
            ));
            vm_totals(&runs, totals);
            crate::vm::verdict(&runs).context("the VM tier failed")
        });
        if args.no_vm {
            eprintln!("test: SKIPPING the VM tier (--no-vm)");
        } else if vm_result.is_none() && !args.unit_only {
            eprintln!("test: SKIPPING the VM tier: it needs root (QEMU, network namespaces)");
        }
        host.and(vm_result.unwrap_or(Ok(())))
    })
}

/// Two one-vCPU guests at once (see `vm-test --lanes`).
const LANES: usize = 2;

/// The VM tier's boots, prepared: the amd64 kernels, then the arm64 run, in the lanes' order.
fn prepare_vm(args: &TestArgs) -> anyhow::Result<Vec<crate::vm::Job>> {
    let amd64 = crate::vm::VmArgs {
        nice: VM_NICE,
        timeout: VM_TIMEOUT,
        ..crate::vm::VmArgs::default()
    };
    let mut jobs = crate::vm::prepare(&amd64).context("the VM tier could not be prepared")?;
    if args.no_arm64_vm {
        eprintln!("test: SKIPPING the VM tier's arm64 run (--no-arm64-vm)");
    } else {
        let arm = crate::vm::VmArgs {
            arch: crate::vm::Arch::Arm64,
            kernel: "6.1".into(),
            ..amd64
        };
        jobs.extend(crate::vm::prepare(&arm).context("the arm64 VM run could not be prepared")?);
    }
    Ok(jobs)
}

/// The guests' niceness beside the host tests (`vm-test --nice`).
const VM_NICE: i32 = 10;

/// Each boot's hard limit here: the guests share the CPU with the host tests, so a boot takes
/// longer than alone (5.10's: 721 s in two lanes after the host tests), and machines differ by
/// 2x. CI's own limit is 5,400 s.
const VM_TIMEOUT: u64 = 3000;

/// Adds the boots' libtest summaries to `totals`; a boot that never reported is one failure.
fn vm_totals(runs: &[crate::vm::KernelRun], totals: &mut Totals) {
    for run in runs {
        for line in run.outcome.iter().flat_map(|o| o.output.lines()) {
            totals.add_line(line);
        }
        if run.verdict.is_err() && run.outcome.as_ref().is_none_or(|o| o.exit_code.is_none()) {
            // A boot that never reported counts as one failure (its tests printed no summary).
            totals.failed += 1;
        }
    }
}

/// The host's test steps: unit tests, arm64 unit tests, then (root) the integration tests and
/// the chaos and bench smokes. Every executable comes from the build the lint stage made.
fn host_tests(
    args: &TestArgs,
    root: &std::path::Path,
    totals: &mut Totals,
    clock: &mut Clock,
    arm64: bool,
) -> anyhow::Result<()> {
    use crate::build::{ARM64, workspace_cargo};
    // Unit tests: every member's library and binaries, and the doc tests (no root).
    timed(clock, "unit tests", || {
        test_step(
            workspace_cargo(root, "test").args(["--lib", "--bins"]),
            totals,
        )?;
        test_step(workspace_cargo(root, "test").arg("--doc"), totals)
    })?;
    // The kernel/user record layouts are pinned at compile time on every target; their unit
    // tests also run on arm64 itself (qemu-user: `.cargo/config.toml`'s runner).
    timed(
        clock,
        "probe-common's unit tests on arm64 (cross-compiled, qemu-user)",
        || {
            test_step(
                cargo().args(["test", "-p", "probe-common", "--target", ARM64]),
                totals,
            )
        },
    )?;
    deny(args, clock)?;
    if args.unit_only {
        return Ok(());
    }
    if !setup::is_root() {
        eprintln!(
            "test: SKIPPING the integration tests and the VM tier: they need root (network \
             namespaces, eBPF, QEMU). Run `sudo -E cargo xtask test`."
        );
        return Ok(());
    }
    let probe = root.join("target/debug/probe");
    let probe_arm64 = root.join("target").join(ARM64).join("debug/probe");
    // One at a time: every lab test builds the same fixed namespaces (clb-node, clb-lb, ...).
    let mut cmd = workspace_cargo(root, "test");
    cmd.args(["--test", "*", "--", "--test-threads=1"])
        .env("CLB_PROBE_BIN", &probe);
    if arm64 {
        cmd.env("CLB_PROBE_ARM64_BIN", &probe_arm64);
    }
    if let Some(f) = &args.filter {
        cmd.arg(f);
    }
    timed(
        clock,
        "integration tests (root, real kernel, lab namespaces)",
        || test_step(&mut cmd, totals),
    )?;
    if args.no_chaos {
        eprintln!("test: SKIPPING the chaos smoke run (--no-chaos)");
    } else {
        // SIGKILL under a flood, hostile HTTP clients, capability drops, fuzzed parsers: the
        // short version (a couple of minutes; written to target/chaos-quick.md).
        let quick = crate::chaos::ChaosArgs {
            quick: true,
            scale_only: false,
            out: None,
        };
        let result = timed(clock, "chaos smoke run (cargo xtask chaos --quick)", || {
            crate::chaos::run(&quick)
        });
        match result {
            Ok(()) => totals.passed += 1,
            Err(e) => {
                totals.failed += 1;
                return Err(e.context("the chaos smoke run failed"));
            }
        }
    }
    if args.no_bench {
        eprintln!("test: SKIPPING the benchmark smoke run (--no-bench)");
    } else {
        // Keeps `cargo xtask bench` working (trafgen, iperf3, tcpdump, bpftool prog run, the
        // flood, the latency run) without asserting on any figure: benchmarks report, tests
        // assert. Spliced into target/bench-quick.md. Its figures are not comparable with a
        // quiet run's: the VM tier runs beside it.
        let result = timed(
            clock,
            "benchmark smoke run (cargo xtask bench --quick)",
            || crate::bench::run(&bench_quick()),
        );
        match result {
            Ok(()) => totals.passed += 1,
            Err(e) => {
                totals.failed += 1;
                return Err(e.context("the benchmark smoke run failed"));
            }
        }
    }
    Ok(())
}

/// The supply-chain gate (`deny.toml`). It runs among the host tests, beside the VM tier: its
/// checks take seconds, but a machine without cargo-deny first builds it (about 3 min of CPU),
/// which the host side's slack under the VM tier absorbs.
fn deny(args: &TestArgs, clock: &mut Clock) -> anyhow::Result<()> {
    if args.no_lint {
        return Ok(());
    }
    timed(
        clock,
        "cargo deny (licenses, bans, sources, advisories)",
        crate::supply::deny,
    )
}

/// `cargo xtask bench --quick`'s arguments: every part for a second or three.
fn bench_quick() -> crate::bench::BenchArgs {
    crate::bench::BenchArgs {
        rounds: 1,
        secs: 1,
        flood_secs: 3,
        latency_events: 20,
        cycles: 4,
        window_ms: 300,
        starts: 2,
        only: Vec::new(),
        quick: true,
        storm_only: false,
        scale_sizes: vec![100, 1000],
        scale_window: 3,
        scale_modes: vec![
            crate::bench::scale::Mode::Iptables,
            crate::bench::scale::Mode::Nftables,
        ],
        scale_no_baseline: false,
        out: None,
        detect: false,
        baseline_agent: None,
    }
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn sums_libtest_summaries() {
        let mut t = Totals::default();
        t.add_line("test result: ok. 71 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.38s");
        t.add_line(
            "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 5 filtered out",
        );
        t.add_line("running 5 tests");
        assert_eq!((t.passed, t.failed, t.ignored), (74, 2, 1));
    }
}
