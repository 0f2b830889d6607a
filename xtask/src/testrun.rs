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

use std::{
    process::Command,
    sync::mpsc::{Receiver, Sender},
};

use anyhow::{Context as _, bail};

use crate::{setup, workspace_root};

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Prints how long a step took: CI's log then says where its budget went.
fn took(name: &str, start: std::time::Instant) {
    eprintln!("test: {name}: took {:.0} s", start.elapsed().as_secs_f64());
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
        eprintln!("test: step times (wall; [beside]: the lane beside the host tests, at nice 10):");
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
    if !args.no_lint {
        // The nightly's rustfmt: rustfmt.toml groups and merges imports (`group_imports`,
        // `imports_granularity`), options only the nightly applies (issue #50). The nightly is
        // there already: the eBPF build needs it (setup adds its rustfmt).
        timed(clock, "cargo +nightly fmt --check", || {
            crate::setup::run(
                Command::new("cargo")
                    .current_dir(root)
                    .args(["+nightly", "fmt", "--all", "--", "--check"]),
            )
        })?;
    }
    // One host build that every later step reuses (crate::build), while nothing else wants
    // the CPU; then the unit tests, the last step that needs cargo's lock on target/.
    let built = timed(
        clock,
        "build (host, debug: binaries, tests, examples)",
        || crate::build::host(root),
    )?;
    timed(clock, "unit tests", || unit_tests(root, totals))?;
    if args.unit_only || !setup::is_root() {
        if !args.unit_only {
            eprintln!(
                "test: SKIPPING the integration tests and the VM tier: they need root (network \
                 namespaces, eBPF, QEMU). Run `sudo -E cargo xtask test`."
            );
        }
        let mut lane = Beside::default();
        lane.compile_and_lint(args, root, None);
        return lane.merge_into(totals, clock);
    }
    // Two lanes from here. The host tests (integration tests, the chaos and bench smokes) wait
    // on agents, labs and timers most of the time; beside them, at nice 10 so they get the CPU
    // first, the arm64 build, the lint gates and then the VM tier's guests take what they
    // leave idle (`Beside::run` says why the guests' waits allow for it). The image test, which
    // needs the arm64 agent, runs when that is built.
    let (arm64_built, arm64_ready) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let lane = s.spawn(|| {
            let mut lane = Beside::default();
            lane.run(args, root, arm64_built);
            lane
        });
        let host = host_tests(args, root, &built, totals, clock, &arm64_ready);
        eprintln!("test: host tests done; waiting for the lane beside them");
        let wait = std::time::Instant::now();
        let lane = lane
            .join()
            .expect("the lane beside the host tests panicked");
        clock.add("waited for the lane beside the host tests", wait);
        host.and(lane.merge_into(totals, clock))
    })
}

/// What runs beside the host tests, with its own clock and totals (merged at the end).
#[derive(Default)]
struct Beside {
    clock: Clock,
    totals: Totals,
    /// The first failure; every step still runs, so one run reports them all.
    result: Option<anyhow::Error>,
    vm: Option<(Vec<crate::vm::KernelRun>, f64)>,
}

impl Beside {
    fn step(&mut self, name: &str, f: impl FnOnce(&mut Totals) -> anyhow::Result<()>) -> bool {
        let totals = &mut self.totals;
        match timed(&mut self.clock, name, || f(totals)) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("test: {name}: FAILED: {e:#}");
                self.result.get_or_insert(e);
                false
            }
        }
    }

    /// The lane: its thread at nice 10 (inherited by every process it starts: cargo, rustc,
    /// QEMU), then the builds and gates, then the VM tier. The host tests wait on agents, labs
    /// and timers: one integration file used 18% of a core over its run (tests/loopback.rs, 45 s
    /// of CPU in 248 s), so the guests beside them get most of the machine. Starved guests
    /// failed on time alone in CI runs 41-42 (an agent's start of 28-48 s, a lab's UDP server
    /// not up in 5 s); their waits are now stretched ([`crate::vm::suite::GUEST_PATIENCE`]).
    /// After the host tests instead (CI's run of 3471737), the run took the VM tier's time
    /// longer: 57 min (docs/ci-runs.md).
    fn run(&mut self, args: &TestArgs, root: &std::path::Path, arm64_built: Sender<bool>) {
        lower_this_threads_priority(VM_NICE);
        self.compile_and_lint(args, root, Some(arm64_built));
        if args.no_vm {
            eprintln!("test: SKIPPING the VM tier (--no-vm)");
            return;
        }
        let mut jobs = Vec::new();
        if !self.step("VM tier: prepare (kernels, arm64 root)", |_| {
            jobs = prepare_vm(args)?;
            Ok(())
        }) {
            return;
        }
        eprintln!(
            "test: VM tier started beside the host tests (Debian 5.10, 6.1, 6.12 kernels under \
             QEMU: real IPVS, clsact, older drop reasons and drop sites; Debian's arm64 6.1 \
             under qemu-system-aarch64)"
        );
        let start = std::time::Instant::now();
        let runs = crate::vm::run_jobs(&jobs, LANES);
        let secs = start.elapsed().as_secs_f64();
        took("VM tier (its boots, beside the host tests)", start);
        vm_totals(&runs, &mut self.totals);
        if let Err(e) = crate::vm::verdict(&runs) {
            self.result.get_or_insert(e.context("the VM tier failed"));
        }
        self.vm = Some((runs, secs));
    }

    /// The arm64 build (signalled on `arm64_built`), the lint gates, the arm64 unit tests.
    fn compile_and_lint(
        &mut self,
        args: &TestArgs,
        root: &std::path::Path,
        arm64_built: Option<Sender<bool>>,
    ) {
        if let Some(tx) = arm64_built {
            let ok = self.step(
                "build (arm64, debug: the agent, the arm64 VM tests)",
                |_| crate::build::arm64(root, crate::vm::arm64::TEST_FILES).map(drop),
            );
            let _ = tx.send(ok);
        }
        if !args.no_lint {
            self.step("cargo clippy -D warnings (userspace, xtask, tests)", |_| {
                crate::setup::run(crate::build::workspace_cargo(root, "clippy").args([
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ]))
            });
            // The demo's agent (README's first command) is built without default features
            // (no OTLP): lint that build too, so the first command cannot rot unseen.
            self.step(
                "cargo clippy -D warnings (the demo's agent: clb-probe without default features)",
                |_| {
                    crate::setup::run(crate::build::cargo().current_dir(root).args([
                        "clippy",
                        "-p",
                        "clb-probe",
                        "--no-default-features",
                        "--all-targets",
                        "--",
                        "-D",
                        "warnings",
                    ]))
                },
            );
            // The eBPF crate only builds for the BPF target, with the nightly.
            self.step(
                "cargo clippy -D warnings (eBPF programs, bpfel-unknown-none)",
                |_| {
                    crate::setup::run(Command::new("cargo").current_dir(root).args([
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
            );
            // A machine without cargo-deny builds it first (about 3 min of CPU).
            self.step("cargo deny (licenses, bans, sources, advisories)", |_| {
                crate::supply::deny()
            });
        }
        // The kernel/user record layouts are pinned at compile time on every target; their
        // unit tests also run on arm64 itself (qemu-user: `.cargo/config.toml`'s runner).
        self.step(
            "probe-common's unit tests on arm64 (cross-compiled, qemu-user)",
            |totals| {
                test_step(
                    cargo().current_dir(root).args([
                        "test",
                        "-p",
                        "probe-common",
                        "--target",
                        crate::build::ARM64,
                    ]),
                    totals,
                )
            },
        );
    }

    /// Adds this lane's counts and step times to the run's; its first failure, if any.
    fn merge_into(self, totals: &mut Totals, clock: &mut Clock) -> anyhow::Result<()> {
        totals.passed += self.totals.passed;
        totals.failed += self.totals.failed;
        totals.ignored += self.totals.ignored;
        for (name, secs) in self.clock.steps {
            clock.steps.push((format!("[beside] {name}"), secs));
        }
        if let Some((_, secs)) = self.vm {
            clock
                .steps
                .push(("[beside] VM tier (its boots)".into(), secs));
        }
        self.result.map_or(Ok(()), Err)
    }
}

/// Lowers the calling thread's CPU priority; on Linux niceness is per thread, and the
/// processes this thread starts inherit it.
fn lower_this_threads_priority(nice: i32) {
    // SAFETY: plain syscalls on the calling thread's own id.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if r != 0 {
        eprintln!(
            "test: could not lower the lane's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Unit tests: every member's library and binaries, then the doc tests (no root).
fn unit_tests(root: &std::path::Path, totals: &mut Totals) -> anyhow::Result<()> {
    use crate::build::workspace_cargo;
    test_step(
        workspace_cargo(root, "test").args(["--lib", "--bins"]),
        totals,
    )?;
    test_step(workspace_cargo(root, "test").arg("--doc"), totals)
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

/// The lane's (and the guests') niceness beside the host tests (`vm-test --nice`).
const VM_NICE: i32 = 10;

/// Each boot's hard limit here: the guests share the CPU with the host tests, so a boot takes
/// longer than alone, and machines differ by 2x. CI's own limit is 5,400 s.
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

/// The integration test file that needs the arm64 agent: it runs once that is built.
const NEEDS_ARM64: &str = "image";

/// The host's root-only steps: the integration tests (the executables of `built`, run here
/// rather than through `cargo test`, which would wait for the other lane's lock on target/),
/// then the chaos and bench smokes.
fn host_tests(
    args: &TestArgs,
    root: &std::path::Path,
    built: &[crate::build::Artifact],
    totals: &mut Totals,
    clock: &mut Clock,
    arm64_ready: &Receiver<bool>,
) -> anyhow::Result<()> {
    let target = crate::build::target_dir(root);
    let probe = target.join("debug/probe");
    let probe_arm64 = target.join(crate::build::ARM64).join("debug/probe");
    let mut files: Vec<(&str, &std::path::Path)> = built
        .iter()
        .filter(|(p, _, k, _)| p == "probe-tests" && k.iter().any(|k| k == "test"))
        .map(|(_, t, _, exe)| (t.as_str(), exe.as_path()))
        .collect();
    files.sort();
    // Last, so the arm64 build beside has the longest time to finish first.
    files.sort_by_key(|(t, _)| *t == NEEDS_ARM64);
    let mut failed = Vec::new();
    timed(
        clock,
        "integration tests (root, real kernel, lab namespaces)",
        || {
            for (file, exe) in &files {
                if *file == NEEDS_ARM64 {
                    eprintln!("test: tests/{file}.rs waits for the arm64 agent's build");
                    if !arm64_ready.recv().unwrap_or(false) {
                        eprintln!("test: the arm64 build failed; tests/{file}.rs runs without it");
                    }
                }
                // One test at a time: every lab test builds the same fixed namespaces
                // (clb-node, clb-lb, ...), and some observe every BPF program on the host.
                println!("     Running tests/{file}.rs ({})", exe.display());
                let mut cmd = Command::new(exe);
                cmd.arg("--test-threads=1")
                    .current_dir(root.join("tests"))
                    .env("CLB_PROBE_BIN", &probe)
                    .env("CLB_PROBE_ARM64_BIN", &probe_arm64);
                if let Some(f) = &args.filter {
                    cmd.arg(f);
                }
                if let Err(e) = test_step(&mut cmd, totals) {
                    eprintln!("test: tests/{file}.rs: {e:#}");
                    failed.push(format!("tests/{file}.rs"));
                }
            }
        },
    );
    // The smokes still run after a failing test file: one run names every failure.
    let integration = if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!(
            "integration tests failed in {}",
            failed.join(", ")
        ))
    };
    smokes(args, totals, clock).and(integration)
}

/// The chaos and bench smoke runs (root).
fn smokes(args: &TestArgs, totals: &mut Totals, clock: &mut Clock) -> anyhow::Result<()> {
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
            unpanicked("the chaos smoke run", || crate::chaos::run(&quick))
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
            || {
                unpanicked("the benchmark smoke run", || {
                    crate::bench::run(&bench_quick())
                })
            },
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

/// Runs `f`; a panic in it is its failure, not the whole run's end: the lane beside is still
/// joined and the closing table and `summary:` line still printed (a bench smoke's panic once
/// ended a CI run with neither).
fn unpanicked(what: &str, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("{what} panicked (its message is above)")))
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
        capture_bytes: Vec::new(),
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
        scale_api: false,
        scale_api_only: false,
        scale_conntrack: None,
        scale_table_pattern: crate::bench::scale::TABLE_PATTERNS
            .map(String::from)
            .to_vec(),
        // `--only fleet` is left out of the smoke run, as scale is (BenchArgs::runs).
        fleet_sizes: vec![20, 60],
        fleet_services: 200,
        fleet_agents: 1,
        fleet_window: 4,
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
