//! `cargo xtask test`: the README's test command, and exactly what CI runs.
//!
//! 1. setup when something is missing; 2. format and lint gates; 3. unit tests (no root);
//! 4. the root-only integration tests against the lab and the real kernel, one at a time
//!    (they share the lab's fixed namespaces), or a clear skip line when not root;
//! 5. the VM tier (root only, `--no-vm` skips it): `cargo xtask vm-test --kernel all`'s
//!    default suite on Debian's 5.10, 6.1 and 6.12 kernels, with real IPVS.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{setup, workspace_root};

/// The arm64 agent's Rust target.
const ARM64: &str = "aarch64-unknown-linux-gnu";

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Prints how long a step took: CI's log then says where its budget went.
fn took(name: &str, start: std::time::Instant) {
    eprintln!("test: {name}: took {:.0} s", start.elapsed().as_secs_f64());
}

fn step(name: &str, cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("test: {name}");
    let start = std::time::Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    took(name, start);
    if !status.success() {
        bail!("{name} failed ({status})");
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
fn test_step(name: &str, cmd: &mut Command, totals: &mut Totals) -> anyhow::Result<()> {
    use std::io::{BufRead as _, BufReader};
    eprintln!("test: {name}");
    let start = std::time::Instant::now();
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
    took(name, start);
    if !status.success() {
        bail!("{name} failed ({status})");
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
    setup::ensure()?;
    took("setup", start);
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    if !args.no_lint {
        step(
            "cargo fmt --check",
            cargo().args(["fmt", "--all", "--", "--check"]),
        )?;
        step(
            "cargo clippy -D warnings (userspace, xtask, tests)",
            cargo().args([
                "clippy",
                "--workspace",
                "--exclude",
                "probe-ebpf",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        )?;
        // The eBPF crate only builds for the BPF target, with the nightly.
        step(
            "cargo clippy -D warnings (eBPF programs, bpfel-unknown-none)",
            Command::new("cargo").args([
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
            ]),
        )?;
        eprintln!("test: cargo deny (licenses, bans, sources, advisories)");
        let start = std::time::Instant::now();
        crate::supply::deny()?;
        took("cargo deny", start);
    }
    // The default members: probe-common, probe-user (incl. the correlator's recorded
    // streams), xtask. No root needed.
    let mut totals = Totals::default();
    let result = suites(args, &root, &mut totals);
    println!(
        "summary: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    result
}

fn suites(args: &TestArgs, root: &std::path::Path, totals: &mut Totals) -> anyhow::Result<()> {
    test_step("unit tests", cargo().arg("test"), totals)?;
    // The kernel/user record layouts are pinned at compile time on every target; their unit
    // tests also run on arm64 itself (qemu-user: `.cargo/config.toml`'s runner).
    test_step(
        "probe-common's unit tests on arm64 (cross-compiled, qemu-user)",
        cargo().args(["test", "-p", "probe-common", "--target", ARM64]),
        totals,
    )?;
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
    step(
        "build the probe binary",
        cargo().args(["build", "-p", "probe-user"]),
    )?;
    let probe = root.join("target/debug/probe");
    // The arm64 image test's agent (cross-compiled; the image test runs it under qemu-user).
    step(
        "build the arm64 probe binary (cross-compiled)",
        cargo().args(["build", "-p", "probe-user", "--target", ARM64]),
    )?;
    let probe_arm64 = root.join("target").join(ARM64).join("debug/probe");
    let mut cmd = cargo();
    cmd.args([
        "test",
        "-p",
        "probe-tests",
        "--tests",
        "--",
        "--test-threads=1",
    ])
    .env("CLB_PROBE_BIN", &probe)
    .env("CLB_PROBE_ARM64_BIN", &probe_arm64);
    if let Some(f) = &args.filter {
        cmd.arg(f);
    }
    test_step(
        "integration tests (root, real kernel, lab namespaces)",
        &mut cmd,
        totals,
    )?;
    if args.no_chaos {
        eprintln!("test: SKIPPING the chaos smoke run (--no-chaos)");
    } else {
        // SIGKILL under a flood, hostile HTTP clients, capability drops, fuzzed parsers: the
        // short version (a couple of minutes; written to target/chaos-quick.md).
        eprintln!("test: chaos smoke run (cargo xtask chaos --quick)");
        let quick = crate::chaos::ChaosArgs {
            quick: true,
            scale_only: false,
            out: None,
        };
        let start = std::time::Instant::now();
        let result = crate::chaos::run(&quick);
        took("chaos smoke run", start);
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
        // assert. Spliced into target/bench-quick.md.
        eprintln!("test: benchmark smoke run (cargo xtask bench --quick)");
        let quick = crate::bench::BenchArgs {
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
        };
        let start = std::time::Instant::now();
        let result = crate::bench::run(&quick);
        took("benchmark smoke run", start);
        match result {
            Ok(()) => totals.passed += 1,
            Err(e) => {
                totals.failed += 1;
                return Err(e.context("the benchmark smoke run failed"));
            }
        }
    }
    if args.no_vm {
        eprintln!("test: SKIPPING the VM tier (--no-vm)");
        return Ok(());
    }
    // The VM tier (root only, like everything after the unit tests; we are root here): Debian's
    // pinned 5.10, 6.1 and 6.12 kernels under QEMU, one boot each, two at a time. `vm-test`'s
    // default command builds the test binaries on the host (cargo's target dir) once and runs,
    // inside each: the IPVS generic-netlink reader against real IPVS, the three kinds in the
    // IPVS-mode lab, and that kernel's share of the rest (`vm::suite::PLAN`). Its libtest
    // summaries count.
    // The arm64 run (Debian's arm64 6.1 under qemu-system-aarch64, TCG): the IPVS smoke, the
    // datapath smoke and the IPVS lab's three kinds with cross-built binaries. It boots in the
    // same two lanes as the amd64 kernels, after them.
    eprintln!(
        "test: VM tier (Debian 5.10, 6.1, 6.12 kernels under QEMU: real IPVS, clsact, older \
         drop reasons and drop sites; then Debian's arm64 6.1 under qemu-system-aarch64)"
    );
    let start = std::time::Instant::now();
    let amd64 = crate::vm::VmArgs::default();
    let mut jobs = Vec::new();
    let mut prepared = crate::vm::prepare(&amd64).map(|j| jobs.extend(j));
    if args.no_arm64_vm {
        eprintln!("test: SKIPPING the VM tier's arm64 run (--no-arm64-vm)");
    } else {
        let arm = crate::vm::VmArgs {
            arch: crate::vm::Arch::Arm64,
            kernel: "6.1".into(),
            ..crate::vm::VmArgs::default()
        };
        prepared = prepared.and(crate::vm::prepare(&arm).map(|j| jobs.extend(j)));
    }
    took("VM tier: building and fetching", start);
    if let Err(e) = prepared {
        totals.failed += 1;
        return Err(e.context("the VM tier could not be prepared"));
    }
    let runs = crate::vm::run_jobs(&jobs, amd64.lanes);
    took("VM tier", start);
    for run in &runs {
        for line in run.outcome.iter().flat_map(|o| o.output.lines()) {
            totals.add_line(line);
        }
        if run.verdict.is_err() && run.outcome.as_ref().is_none_or(|o| o.exit_code.is_none()) {
            // A boot that never reported counts as one failure (its tests printed no summary).
            totals.failed += 1;
        }
    }
    crate::vm::verdict(&runs).context("the VM tier failed")
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
