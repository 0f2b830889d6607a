//! `cargo xtask vm-test`: the VM test tier. Boots stock Debian kernels under QEMU (software
//! emulation unless the CPU has real VT-x/AMD-V), one boot per kernel (`--kernel 5.10|6.1|6.12|
//! all`, see [`kernel::KERNELS`]), and runs one shell command inside each, as root; its output
//! and exit code come back to the host.
//!
//! Without `-c` it runs **the suite** ([`suite`]): the test binaries are built on the host once
//! (`cargo build -p clb-probe -p xtask`, `cargo test -p probe-tests --no-run`, `cargo test -p
//! clb-probe --lib --no-run`, all with `--message-format=json` to find the executables, in
//! cargo's target dir: `CARGO_TARGET_DIR` if set, else the workspace's `target/`), then each
//! kernel's boot runs the IPVS generic-netlink reader against real IPVS, then its share of the
//! IPVS-mode lab tests ([`suite::PLAN`], which says why each runs where): the three kinds with
//! their twins on 5.10 and 6.1 (one kernel per drop-reason class), with the hairpin shapes and
//! the self-loop on 5.10; the clsact datapath tests and the iptables-mode older-kernel script
//! on 6.1; the rest of `ipvs` and `probe check`'s IPVS prediction on 6.12; issue #51's
//! source-range and detector-miss shapes, in their own nftables- and iptables-mode labs, and the
//! node's own call's `etp_local_drop` (nftables mode), on 5.10 and 6.12. Two one-vCPU guests boot at once (`--lanes`, `--cpus`).
//! `loopback.rs` stays on the host: in the VM it repeated what `ipvs.rs` asserts, at 400 s of
//! emulated CPU. `--smoke` runs the short IPVS smoke scenario instead.
//!
//! The guest's root is the host's `/` (shared read-only over 9p, so host-built binaries run
//! unchanged: same glibc, same paths), under the unpacked Debian packages the host lacks
//! (kernel modules, kmod, ipvsadm, ...; see [`kernel`]), under a tmpfs that takes the writes. The
//! command runs with the workspace as its working directory; a writable 9p share at `/clb-vm` in
//! the guest carries the command script in and `output.log` / `rc` out. Facts and reasons:
//! shared/VM-TIER.md.
//!
//! Running a host-built integration test binary inside:
//! `cargo xtask vm-test --env RUST_LOG=debug -c 'target/debug/deps/integration-abc123 --test-threads=1'`
//! (build it first with `cargo test --no-run`; any path under the host's `/` works).
//! In the guest `CLB_VM=1` and `CLB_VM_RESULTS=/clb-vm` are set; files written there come back
//! to the host folder given with `--out`. Everything else the guest writes is thrown away.
//!
//! `--arch arm64` boots Debian's arm64 6.1 kernel under qemu-system-aarch64 instead, over an
//! arm64 root from apt's arm64 architecture, and its suite runs cross-built binaries: see
//! [`arm64`].

mod apt;
pub mod arm64;
mod initramfs;
mod jobs;
mod kernel;
mod qemu;
pub mod suite;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, bail};
use jobs::label;
pub use jobs::{Job, KernelRun, prepare, run_jobs, run_with_output, verdict};
pub use kernel::{KERNELS, KernelSpec};
pub use qemu::Ending;

pub use crate::arch::Arch;
use crate::workspace_root;

/// The default command's script: the IPVS smoke scenario that proves the tier works.
pub const SMOKE: &str = include_str!("smoke.sh");
const STAGE2: &str = include_str!("stage2.sh");

/// The host packages an `arch` run needs, with the command each provides. arm64 takes its
/// busybox from its own root.
pub fn host_packages_for(arch: Arch) -> &'static [(&'static str, &'static str)] {
    match arch {
        Arch::Amd64 => host_packages(),
        Arch::Arm64 => &[("qemu-system-arm", "qemu-system-aarch64"), ("kmod", "kmod")],
    }
}

/// Debian packages the host needs for the VM tier, with the command each provides (for
/// `setup::apt`).
pub fn host_packages() -> &'static [(&'static str, &'static str)] {
    &[
        ("qemu-system-x86", "qemu-system-x86_64"),
        ("busybox-static", "busybox"),
        // Decompresses the kernel for a direct (PVH) boot; without it the bzImage boots slower.
        ("xz-utils", "xz"),
    ]
}

#[derive(clap::Args, Debug, Clone)]
pub struct VmArgs {
    /// The guest's architecture: amd64 (qemu-system-x86_64, the host's userland) or arm64
    /// (Debian's arm64 kernel under qemu-system-aarch64, TCG, with an arm64 userland and
    /// cross-built test binaries; only the 6.1 kernel; see TESTING.md, "VM tier").
    #[arg(long, value_enum, default_value_t = Arch::Amd64)]
    pub arch: Arch,
    /// Which kernel to boot: 5.10 (bullseye), 6.1 (bookworm), 6.12 (trixie), or all three,
    /// one boot each.
    #[arg(long, default_value = "all", value_parser = ["5.10", "6.1", "6.12", "all"])]
    pub kernel: String,
    /// Shell command (bash) run as root inside the guest, in the workspace folder (the host's
    /// path, shared read-only with a throwaway writable layer). Default: the suite (test
    /// binaries built on the host first; see the module doc).
    #[arg(long, short = 'c', conflicts_with = "smoke")]
    pub command: Option<String>,
    /// Run the short IPVS smoke scenario instead of the suite.
    #[arg(long)]
    pub smoke: bool,
    /// Only download and unpack the selected kernels into the cache; boot nothing (keeps
    /// downloads out of a shared VM lock).
    #[arg(long, conflicts_with_all = ["command", "smoke"])]
    pub fetch_only: bool,
    /// Environment variable for the command, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Keep the run folder (console log, output, initramfs) and print where it is.
    #[arg(long)]
    pub keep: bool,
    /// Use this host folder as the guest's writable `/clb-vm` share (created if missing) and keep
    /// it: the command's `output.log` and `rc`, plus whatever the command writes to
    /// `$CLB_VM_RESULTS` (a subfolder per kernel when several boot). Default: a throwaway folder.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Hard limit on each boot; QEMU is killed after it (the longest boot, 5.10's, took
    /// 14 min here beside another boot and a release build).
    #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
    pub timeout: u64,
    /// How many kernels boot at once. With one vCPU per guest (`--cpus 1`), two at once each
    /// run about 1.1 times slower than alone (measured), so the matrix takes about half as long.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub lanes: usize,
    /// vCPUs per guest. Under TCG each vCPU is a host thread: two lanes of two vCPUs each ran
    /// 2.1-2.5 times slower than one boot alone (four threads on the 2 cores), worse than one
    /// after another.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cpus: u32,
    /// Niceness of the QEMU processes (0-19). `cargo xtask test` boots the guests beside the
    /// host's integration tests at 10, so the host tests (their agents, labs and timeouts) get
    /// the CPU first and the guests take what those leave idle.
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = clap::value_parser!(i32).range(0..=19))]
    pub nice: i32,
    /// The guest's memory, MiB. 1 GiB holds the suite and the scale bench up to 10,000
    /// Services; the IPVS row at 30,000 with 500,000 conntrack entries needs more (issue #52,
    /// BENCHMARKS 9o: 4096).
    #[arg(long, default_value_t = 1024, value_name = "MIB", value_parser = clap::value_parser!(u32).range(256..=65536))]
    pub memory_mib: u32,
}

impl Default for VmArgs {
    fn default() -> Self {
        Self {
            arch: Arch::Amd64,
            kernel: "all".into(),
            command: None,
            smoke: false,
            fetch_only: false,
            env: Vec::new(),
            keep: false,
            out: None,
            timeout: 1800,
            lanes: 2,
            cpus: 1,
            nice: 0,
            memory_mib: 1024,
        }
    }
}

/// What one boot produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The matrix name of the kernel (`5.10`, `6.1`, `6.12`).
    pub kernel_name: &'static str,
    /// `uname -r` of the guest kernel.
    pub kernel_release: String,
    /// The kernel package booted, `name=version` (the pinned one unless it fell back).
    pub kernel_package: String,
    /// The command's exit code (None when the guest never ran it to the end).
    pub exit_code: Option<i32>,
    /// How QEMU ended.
    pub ending: Ending,
    /// The command's combined stdout and stderr.
    pub output: String,
    /// The whole serial console.
    pub console_log: PathBuf,
}

/// Single-quotes `s` for sh/bash.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Where the writable results share is mounted in the guest.
pub const GUEST_RESULTS: &str = "/clb-vm";

/// The guest's `cmd.sh`: exports (`CLB_VM=1`, `CLB_VM_RESULTS`, then the caller's), `cd` into
/// the workspace, then the command.
pub fn command_script(command: &str, env: &[String], cwd: &Path) -> anyhow::Result<String> {
    let mut s = format!(
        "# written by cargo xtask vm-test\nexport CLB_VM=1 CLB_VM_RESULTS={GUEST_RESULTS}\n"
    );
    for kv in env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))?;
        if k.is_empty()
            || k.starts_with(|c: char| c.is_ascii_digit())
            || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            bail!("--env {kv:?}: {k:?} is not a variable name");
        }
        s.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    let ws = shell_quote(&cwd.display().to_string());
    s.push_str(&format!(
        "cd {ws} || {{ echo \"vm-test: the workspace \"{ws}\" is not visible in the \
         guest\"; exit {}; }}\n",
        qemu::INFRA_FAILURE
    ));
    s.push_str(command);
    s.push('\n');
    Ok(s)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn have(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .any(|d| d.join(cmd).is_file())
}

/// Installs the host packages of [`host_packages_for`] whose command is missing.
fn ensure_host_packages(arch: Arch) -> anyhow::Result<()> {
    let missing: Vec<&str> = host_packages_for(arch)
        .iter()
        .filter(|(_, c)| !have(c))
        .map(|(p, _)| *p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "the VM tier needs {missing:?}: run `sudo cargo xtask setup` or apt-get install them"
        );
    }
    eprintln!("vm: installing {missing:?}");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    if !install()?.success() {
        Command::new("apt-get").args(["update", "-qq"]).status()?;
        if !install()?.success() {
            bail!("apt-get install {missing:?} failed");
        }
    }
    Ok(())
}

/// Usage errors clap cannot see (exit 2 in `main`): `--arch arm64` boots only the 6.1 kernel.
pub fn check_args(args: &VmArgs) -> Result<(), String> {
    match args.arch {
        Arch::Amd64 => Ok(()),
        Arch::Arm64 => arm64::kernel_of(&args.kernel).map(drop),
    }
}

/// The kernels `--arch` and `--kernel` select.
pub fn kernels_for(arch: Arch, choice: &str) -> anyhow::Result<Vec<&'static KernelSpec>> {
    match arch {
        Arch::Amd64 => kernels_of(choice),
        Arch::Arm64 => Ok(vec![arm64::kernel_of(choice).map_err(anyhow::Error::msg)?]),
    }
}

/// The kernels `--kernel` selects.
pub fn kernels_of(choice: &str) -> anyhow::Result<Vec<&'static KernelSpec>> {
    if choice == "all" {
        return Ok(KERNELS.iter().collect());
    }
    kernel::spec(choice).map(|k| vec![k]).with_context(|| {
        let names: Vec<_> = KERNELS.iter().map(|k| k.name).collect();
        format!("--kernel {choice:?}: not one of {names:?} or \"all\"")
    })
}

/// Boots `spec`'s kernel once and runs `args.command`, the smoke scenario, or the suite built
/// in `bins`; `out` is the results folder (None: a throwaway one).
pub fn boot(
    args: &VmArgs,
    spec: &'static KernelSpec,
    bins: Option<&suite::Bins>,
    out: Option<&Path>,
) -> anyhow::Result<Outcome> {
    let kernel = ensure_kernel(args.arch, spec)?;
    let run_dir = std::env::temp_dir().join(format!(
        "clb-vm-{}-{}{}",
        std::process::id(),
        spec.name,
        if args.arch == Arch::Arm64 {
            "-arm64"
        } else {
            ""
        }
    ));
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)?;
    }
    let results = match out {
        Some(d) => std::path::absolute(d)?,
        None => run_dir.join("results"),
    };
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    let outcome = boot_in(args, spec, bins, &kernel, &run_dir, &results);
    if !args.keep {
        let _ = std::fs::remove_dir_all(&run_dir);
    }
    outcome
}

fn ensure_kernel(arch: Arch, spec: &'static KernelSpec) -> anyhow::Result<kernel::Kernel> {
    match arch {
        Arch::Amd64 => kernel::ensure(&kernel::cache_root(), spec),
        Arch::Arm64 => arm64::ensure(&kernel::cache_root()),
    }
}

fn boot_in(
    args: &VmArgs,
    spec: &'static KernelSpec,
    bins: Option<&suite::Bins>,
    kernel: &kernel::Kernel,
    run_dir: &Path,
    results: &Path,
) -> anyhow::Result<Outcome> {
    // An --out folder may hold an earlier run's verdict.
    for stale in ["rc", "output.log"] {
        let _ = std::fs::remove_file(results.join(stale));
    }
    let initrd = run_dir.join("initramfs.cpio");
    initramfs::build(kernel, &initrd)?;
    let command = match &args.command {
        Some(c) => c.clone(),
        None if args.smoke => {
            std::fs::write(results.join("smoke.sh"), SMOKE)?;
            "bash /clb-vm/smoke.sh".to_string()
        }
        None => {
            let bins = bins.context("the suite's binaries were not built")?;
            let script = match kernel.arch {
                Arch::Arm64 => {
                    std::fs::write(results.join("smoke.sh"), SMOKE)?;
                    arm64::script(&bins.probe, &bins.tests)?
                }
                Arch::Amd64 => suite::script(bins, spec),
            };
            std::fs::write(results.join("suite.sh"), script)?;
            "bash /clb-vm/suite.sh".to_string()
        }
    };
    std::fs::write(
        results.join("cmd.sh"),
        command_script(&command, &args.env, &workspace_root())?,
    )?;
    std::fs::write(results.join("stage2.sh"), STAGE2)?;
    std::fs::write(
        results.join("vm.env"),
        format!(
            "CLB_VM_WORKSPACE={}\n",
            shell_quote(&workspace_root().display().to_string())
        ),
    )?;
    let boot = qemu::Boot {
        arch: kernel.arch,
        accel: match kernel.arch {
            Arch::Amd64 => qemu::detect_accel(),
            Arch::Arm64 => qemu::Accel::Tcg,
        },
        kernel: kernel.image.clone(),
        initrd,
        cmdline: qemu::kernel_cmdline_for(kernel.arch, &[]),
        pkgs: kernel.root.clone(),
        results: results.to_path_buf(),
        memory_mib: args.memory_mib,
        cpus: args.cpus,
        nice: args.nice,
        echo_prefix: format!("vm {}| ", label(kernel.arch, spec)),
    };
    eprintln!(
        "vm: booting {} ({}={}) with {:?}",
        kernel.release, kernel.package, kernel.version, boot.accel
    );
    // With --keep the log outlives the run folder's results share; it sits beside it.
    let console_log = run_dir.join("console.log");
    let ending = qemu::run(&boot, &console_log, Duration::from_secs(args.timeout))?;
    let exit_code = std::fs::read_to_string(results.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .or(match ending {
            Ending::Reported(c) if c != qemu::INFRA_FAILURE => Some(c),
            _ => None,
        });
    let output = std::fs::read_to_string(results.join("output.log")).unwrap_or_default();
    Ok(Outcome {
        kernel_name: spec.name,
        kernel_release: kernel.release.clone(),
        kernel_package: format!("{}={}", kernel.package, kernel.version),
        exit_code,
        ending,
        output,
        console_log,
    })
}

/// `cargo xtask vm-test`: boot each kernel, run, print PASS/FAIL per kernel; errors when a
/// command did not exit 0.
pub fn run(args: &VmArgs) -> anyhow::Result<()> {
    let runs = run_with_output(args)?;
    verdict(&runs)
}

#[cfg(test)]
mod tests;
