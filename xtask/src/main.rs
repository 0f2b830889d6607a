//! `cargo xtask <command>`: developer and CI tasks for clb-probe.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod lab_cmd;

#[derive(Parser)]
#[command(name = "xtask", about = "Developer and CI tasks for clb-probe")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the build and tests need (Debian packages, nightly rust-src, bpf-linker).
    Setup {
        /// Only the build toolchain (nightly rust-src, bpf-linker): for the image build.
        #[arg(long)]
        toolchain_only: bool,
    },
    /// The README's test command: lint, unit tests, then the root-only integration tests.
    Test(xtask::testrun::TestArgs),
    /// The README's run command: the lab, the agent on its node, the failures driven and shown.
    Demo(xtask::demo::DemoArgs),
    /// Boot a stock Debian kernel with real IPVS under QEMU and run a command in it.
    VmTest(xtask::vm::VmArgs),
    /// Measure what the probe costs (datapath, per-packet, flood, latency, footprint) side by
    /// side in one run and write BENCHMARKS.md (needs root).
    Bench(xtask::bench::BenchArgs),
    /// Render the Helm chart into the plain manifests (deploy/clb-probe.yaml).
    Manifests,
    /// Build the container images (Debian rootfs from the Debian mirror + the release agent)
    /// for amd64 and arm64 with buildah into local storage, their manifest list
    /// localhost/clb-probe:<version> and their SBOMs in target/image/ (needs root).
    Image(xtask::image::ImageArgs),
    /// Two release builds of this checkout in fresh target directories, compared byte for byte.
    Repro,
    /// `cargo deny check` with deny.toml (licenses, bans, sources; advisories when a database
    /// is here or fetchable). Part of `cargo xtask test`'s lint stage.
    Deny,
    /// Faults and hostile load against the real agent (SIGKILL under a flood, hostile HTTP
    /// clients, capability drops, fuzzed parsers); writes RELIABILITY.md (needs root).
    Chaos(xtask::chaos::ChaosArgs),
    /// The network-namespace lab that reproduces the loopback failures (needs root).
    Lab(lab_cmd::LabArgs),
    /// One TCP attempt from inside a lab namespace; prints ok, refused, reset or timeout.
    #[command(hide = true)]
    LabClient(lab_cmd::ClientArgs),
}

/// `cargo run` hands xtask its package's variables (CARGO_MANIFEST_DIR, CARGO_PKG_*, OUT_DIR
/// with xtask's build script, ...), and every cargo xtask starts inherited them. ring's build
/// script watches some (`rerun-if-env-changed`), so ring, rustls, kube and the agent were
/// compiled again whenever a plain `cargo build` and `cargo xtask demo`/`test` alternated
/// (measured: the demo's agent build took 100 s after `cargo build -p clb-probe
/// --no-default-features`, cargo naming CARGO_MANIFEST_DIR). Cargo's own variables (CARGO,
/// CARGO_HOME, CARGO_TARGET_DIR) stay.
fn forget_cargo_run_env() {
    const RUN_VARS: [&str; 6] = [
        "OUT_DIR",
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
    ];
    // `vars_os`: `vars` panics on a variable that is not UTF-8.
    let package_vars: Vec<std::ffi::OsString> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| k.to_str().is_some_and(|k| k.starts_with("CARGO_PKG_")))
        .collect();
    for var in RUN_VARS
        .map(std::ffi::OsString::from)
        .into_iter()
        .chain(package_vars)
    {
        // SAFETY: called first thing in main, before any thread exists.
        unsafe { std::env::remove_var(var) };
    }
}

fn main() -> ExitCode {
    forget_cargo_run_env();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup { toolchain_only } => if toolchain_only {
            xtask::setup::toolchain()
        } else {
            xtask::setup::all()
        }
        .map(|()| ExitCode::SUCCESS),
        Command::Bench(args) if needs_plots(&args) => return rerun_with_plots(),
        Command::Bench(args) => xtask::bench::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Chaos(args) => xtask::chaos::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Test(args) => xtask::testrun::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Demo(args) => xtask::demo::run(&args).map(|()| ExitCode::SUCCESS),
        Command::VmTest(args) => match xtask::vm::check_args(&args) {
            Ok(()) => xtask::vm::run(&args).map(|()| ExitCode::SUCCESS),
            Err(usage) => {
                eprintln!("error: {usage}");
                return ExitCode::from(2);
            }
        },
        Command::Manifests => xtask::chart::write_manifests().map(|()| ExitCode::SUCCESS),
        Command::Image(args) => xtask::image::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Repro => xtask::supply::repro().map(|()| ExitCode::SUCCESS),
        Command::Deny => xtask::supply::deny().map(|()| ExitCode::SUCCESS),
        Command::Lab(args) => lab_cmd::run(args),
        Command::LabClient(args) => lab_cmd::client(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The bench's scale part plots; this build of xtask lacks plotters (the `plots` feature is off
/// in the alias's light build, so the demo compiles none of it).
fn needs_plots(args: &xtask::bench::BenchArgs) -> bool {
    !cfg!(feature = "plots") && args.only.contains(&xtask::bench::Part::Scale)
}

/// `cargo run --package xtask --features plots -- <these arguments>`: the same command, with
/// the plots.
fn rerun_with_plots() -> ExitCode {
    let status = xtask::build::cargo()
        .args([
            "run",
            "--quiet",
            "--package",
            "xtask",
            "--features",
            "plots",
            "--",
        ])
        .args(std::env::args_os().skip(1))
        .current_dir(xtask::workspace_root())
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: starting cargo run --features plots: {e}");
            ExitCode::FAILURE
        }
    }
}
