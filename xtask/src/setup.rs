//! `cargo xtask setup`: everything the build and the tests need on a fresh machine.
//! Idempotent: each step checks first and says what it does; a failing step stops with what
//! to do about it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
// Where things are found and installed (lookups shared with the tests).
use test_support::tools::{home, node_prefix, venv_bin, venv_dir, venv_has_module, which};

/// Debian packages the demo needs, and the command each provides (checked before
/// installing): the lab's namespaces, kube-proxy's rules and sets, its Python servers.
const DEMO_PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip"),
    ("iptables", "iptables"),
    ("ipset", "ipset"),
    // kube-proxy's nftables mode in the lab, and the probe's nftables reader.
    ("nftables", "nft"),
    ("conntrack", "conntrack"),
    ("procps", "sysctl"),
    ("kmod", "modprobe"),
    ("python3", "python3"),
];

/// What the tests, the image, the benchmarks and the VM tier need beyond the demo's.
const PACKAGES: &[(&str, &str)] = &[
    ("bpftool", "bpftool"),
    ("tcpdump", "tcpdump"),
    ("tmux", "tmux"),
    ("iputils-ping", "ping"),
    // promtool checks the metrics exposition; the server scrapes the agent in a test.
    ("prometheus", "promtool"),
    // `cargo xtask bench`: packet generator, TCP stream.
    ("netsniff-ng", "trafgen"),
    ("iperf3", "iperf3"),
    // The Prometheus Operator schema check (npm package, see `node_models`).
    ("nodejs", "node"),
    ("npm", "npm"),
    // `cargo xtask image` and the image test.
    ("buildah", "buildah"),
    ("podman", "podman"),
    // crun (podman's default) cannot run on a hybrid cgroup hierarchy; runc can.
    ("runc", "runc"),
    // The arm64 agent: Debian's cross linker (with the arm64 libc it links against), and
    // qemu-user to run the arm64 binaries here (`.cargo/config.toml` names both).
    ("gcc-aarch64-linux-gnu", "aarch64-linux-gnu-gcc"),
    // The arm64 libc's start files and headers: only a Recommends of the cross gcc, so
    // `--no-install-recommends` left them out on a fresh machine (`cannot find Scrt1.o`).
    (
        "libc6-dev-arm64-cross",
        "/usr/aarch64-linux-gnu/lib/Scrt1.o",
    ),
    ("qemu-user-static", "qemu-aarch64-static"),
    // The VM tier's arm64 run (`cargo xtask vm-test --arch arm64`).
    ("qemu-system-arm", "qemu-system-aarch64"),
    // The real kubectl against the fake API server (`kubectl describe service`, `kubectl get
    // lbr`'s printer columns, the plugin's `watch`). Debian's client is old (1.20) but speaks
    // these; a newer kubectl already on the machine is kept.
    ("kubernetes-client", "kubectl"),
];

/// A cargo subcommand installed from crates.io (`cargo install --locked`, pinned), when the
/// task that uses it first runs: the image build and the lint stage, not every setup.
pub struct CargoTool {
    pub krate: &'static str,
    pub version: &'static str,
    pub bin: &'static str,
}

/// Licenses, bans, duplicate versions and advisories (`deny.toml`).
pub const DENY: CargoTool = CargoTool {
    krate: "cargo-deny",
    version: "0.20.2",
    bin: "cargo-deny",
};

/// The images' CycloneDX SBOMs.
pub const CYCLONEDX: CargoTool = CargoTool {
    krate: "cargo-cyclonedx",
    version: "0.5.9",
    bin: "cargo-cyclonedx",
};

/// Installs `tool` unless its pinned version is there.
pub fn cargo_tool(tool: CargoTool) -> anyhow::Result<()> {
    let bin = cargo_bin().join(tool.bin);
    let present = Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(tool.version))
        // cargo subcommands print their version after the subcommand name.
        || Command::new(&bin)
            .args([tool.bin.trim_start_matches("cargo-"), "--version"])
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).contains(tool.version)
            });
    if present {
        return Ok(());
    }
    say(&format!(
        "installing {} {} (cargo install --locked; a few minutes, once)",
        tool.krate, tool.version
    ));
    // A tool that reads a lock file once per run needs no optimizer: opt-level 1, no LTO, no
    // debug info and parallel codegen cut its cold build (cargo-deny: 254 s of a cold CI run,
    // issue 54) to a fraction, for a check that still takes about a second.
    run(Command::new("cargo")
        .args([
            "install",
            "--locked",
            "--force",
            tool.krate,
            "--version",
            tool.version,
        ])
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1")
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "false"))
    .with_context(|| format!("cargo install {} failed", tool.krate))
}

/// Rust targets besides the host's: the arm64 agent.
const RUST_TARGETS: &[&str] = &["aarch64-unknown-linux-gnu"];

fn has_rust_target(target: &str) -> bool {
    output(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_ok_and(|s| s.lines().any(|l| l.trim() == target))
}

/// The standard library for the arm64 agent (stable toolchain).
pub fn rust_targets() -> anyhow::Result<()> {
    for target in RUST_TARGETS {
        if has_rust_target(target) {
            continue;
        }
        say(&format!("adding the Rust target {target}"));
        run(Command::new("rustup").args(["target", "add", target]))
            .with_context(|| format!("rustup target add {target} failed"))?;
    }
    say("Rust targets: present");
    Ok(())
}

/// bpf-linker release that links LLVM dynamically (see shared/TOOLCHAIN.md).
const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn say(step: &str) {
    eprintln!("setup: {step}");
}

/// Whether `cmd` is on the PATH, or, for an absolute path (a package without a command), is a
/// file.
fn have(cmd: &str) -> bool {
    if cmd.starts_with('/') {
        return Path::new(cmd).is_file();
    }
    which(cmd).is_some()
}

/// Runs `cmd` to its end; an error when it cannot start or fails.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` to its end: its stdout, or an error with its exit status and stderr.
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` with `input` on its standard input, its stdout discarded; an error with its exit
/// status and stderr when it fails.
pub(crate) fn feed(cmd: &mut Command, input: &str) -> anyhow::Result<()> {
    use std::{io::Write as _, process::Stdio};
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Installs Debian packages whose command is missing. `extra` adds (package, command) pairs
/// that only some tasks need (e.g. qemu for the VM tier).
pub fn apt(extra: &[(&str, &str)]) -> anyhow::Result<()> {
    apt_only(DEMO_PACKAGES.iter().chain(PACKAGES).chain(extra))
}

/// Installs those of `packages` whose command is missing.
fn apt_only<'a>(packages: impl Iterator<Item = &'a (&'a str, &'a str)>) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .filter(|(_, cmd)| !have(cmd))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        say("Debian packages: all present");
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages {missing:?}: run `sudo cargo xtask setup` (or apt-get install them)"
        );
    }
    say(&format!("installing Debian packages {missing:?}"));
    run(Command::new("apt-get").args(["update", "-qq"]))
        .context("apt-get update failed: check the machine's package sources")?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .context("apt-get install failed")?;
    Ok(())
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    let s = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("no nightly toolchain: run `rustup toolchain install nightly`")?;
    Ok(PathBuf::from(s.trim()))
}

/// The nightly toolchain with rust-src (the eBPF build uses `-Z build-std=core`), clippy (the
/// eBPF crate's lint) and rustfmt (the house's import grouping).
pub fn nightly() -> anyhow::Result<()> {
    if nightly_sysroot().is_err() {
        say("installing the nightly toolchain");
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let sysroot = nightly_sysroot()?;
    if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        say("adding rust-src to the nightly toolchain");
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))
        .context("rustup component add rust-src failed")?;
    }
    // clippy for the eBPF crate (linted on its own target with the nightly).
    if !nightly_runs("clippy") {
        say("adding clippy to the nightly toolchain");
        run(Command::new("rustup").args(["component", "add", "clippy", "--toolchain", "nightly"]))
            .context("rustup component add clippy failed")?;
    }
    // rustfmt for `cargo +nightly fmt`: rustfmt.toml's import grouping is nightly-only.
    if !nightly_runs("fmt") {
        say("adding rustfmt to the nightly toolchain");
        run(Command::new("rustup").args(["component", "add", "rustfmt", "--toolchain", "nightly"]))
            .context("rustup component add rustfmt failed")?;
    }
    say("nightly rust-src, clippy and rustfmt: present");
    Ok(())
}

fn cargo_bin() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cargo"));
    home.join("bin")
}

/// bpf-linker, linked against the nightly's own libLLVM (the linker must speak the same LLVM
/// as rustc's bitcode). The LLVM prefix lives under ~/.local/share so its rpath stays valid.
pub fn bpf_linker() -> anyhow::Result<()> {
    let linker = cargo_bin().join("bpf-linker");
    let sysroot = nightly_sysroot()?;
    let lib_dir = sysroot.join("lib");
    let llvm = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| format!("no libLLVM.so.* in {}", lib_dir.display()))?;
    // libLLVM.so.22.1-rust-1.97.0-nightly -> 22
    let major = llvm
        .trim_start_matches("libLLVM.so.")
        .split('.')
        .next()
        .unwrap_or_default()
        .to_string();
    let stamp = home().join(".local/share/clb-probe/bpf-linker.llvm");
    if linker.is_file()
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == llvm)
        && Command::new(&linker)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        say(&format!("bpf-linker: present, linked to {llvm}"));
        return Ok(());
    }
    let prefix = home().join(".local/share/clb-probe/llvm");
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)?;
    for name in ["libLLVM.so".to_string(), llvm.clone()] {
        let link = prefix_lib.join(&name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(lib_dir.join(&llvm), &link)
            .with_context(|| format!("symlinking {}", link.display()))?;
    }
    say(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against {llvm} (about a minute)"
    ));
    run(Command::new("cargo")
        .args(["+nightly", "install", "--force", "bpf-linker"])
        .args(["--version", BPF_LINKER_VERSION])
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{major}"))
        .env("LLVM_PREFIX", &prefix))
    .context("building bpf-linker failed (see the cargo output above)")?;
    std::fs::write(&stamp, &llvm)?;
    Ok(())
}

fn is_mounted(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(path))
}

/// bpffs and tracefs: not needed by the agent itself (it pins nothing and hooks through BTF),
/// but bpftool and the tests' leak checks read them.
pub fn mounts() -> anyhow::Result<()> {
    for (fs, path) in [("bpf", "/sys/fs/bpf"), ("tracefs", "/sys/kernel/tracing")] {
        if is_mounted(path) {
            continue;
        }
        if !is_root() {
            say(&format!("{path} is not mounted (needs root); skipping"));
            continue;
        }
        say(&format!("mounting {fs} on {path}"));
        if !Path::new(path).is_dir() {
            std::fs::create_dir_all(path)?;
        }
        run(Command::new("mount").args(["-t", fs, fs, path]))?;
    }
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// True when everything `setup` provides is already there (cheap checks only).
pub fn is_complete() -> bool {
    DEMO_PACKAGES.iter().all(|(_, c)| have(c))
        && has_ebpf_toolchain()
        && PACKAGES.iter().all(|(_, c)| have(c))
        && PYTHON_TOOLS.iter().all(|(_, bin)| venv_bin(bin).is_file())
        && venv_has_module("helm_python")
        && node_prefix().join(NODE_MODELS.1).is_dir()
        && RUST_TARGETS.iter().all(|t| has_rust_target(t))
        && nightly_runs("clippy")
        && nightly_runs("fmt")
}

/// `cargo +nightly <subcommand> --version` runs: the nightly has that component.
fn nightly_runs(subcommand: &str) -> bool {
    Command::new("cargo")
        .args(["+nightly", subcommand, "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// True when what the demo needs is there: the lab's packages and the eBPF object, from the
/// eBPF toolchain or checked in for this machine's architecture. Not the arm64 cross
/// toolchain, podman, buildah, QEMU or the manifest checkers: those are the tests', the
/// image's and the VM tier's.
fn is_demo_complete() -> bool {
    DEMO_PACKAGES.iter().all(|(_, c)| have(c)) && (has_ebpf_toolchain() || has_prebuilt_ebpf())
}

/// The eBPF build's toolchain: the nightly's rust-src (`-Z build-std=core`) and bpf-linker.
fn has_ebpf_toolchain() -> bool {
    nightly_sysroot().is_ok_and(|s| s.join("lib/rustlib/src/rust/library/core").is_dir())
        && cargo_bin().join("bpf-linker").is_file()
}

/// The checked-in eBPF object for this machine's architecture, which probe-user's build script
/// embeds when the eBPF toolchain is absent (docs/decisions.md, "The eBPF object of a first
/// run"): the demo then needs neither the nightly's rust-src nor a source build of bpf-linker.
fn has_prebuilt_ebpf() -> bool {
    crate::workspace_root()
        .join(format!(
            "probe-user/ebpf-prebuilt/bpfel-{}.o",
            std::env::consts::ARCH
        ))
        .is_file()
}

/// Python tools the deployment checks and the tests use, pinned, in a venv of their own (PyPI),
/// each with the command it installs (the "already there" check).
const PYTHON_TOOLS: &[(&str, &str)] = &[
    ("yamllint==1.38.0", "yamllint"),
    ("kubernetes-validate==1.37.0", "kubernetes-validate"),
    // The official MCP SDK: its client drives `kubectl clb-probe mcp` (tests/tests/mcp.rs).
    ("mcp==2.3.0", "mcp"),
];

/// Helm's own library for Python (libhelm_c, no helm binary): renders and lints the chart.
const HELM_PYTHON: &str = "helm-python-sdk==0.2.2";

/// The Prometheus Operator's API schemas, compiled to validators (npm; generated from the
/// operator's Go API types), and where they land under `node_prefix()`.
const NODE_MODELS: (&str, &str) = (
    "@kubernetes-models/prometheus-operator@6.0.0",
    "node_modules/@kubernetes-models/prometheus-operator",
);

/// The Prometheus Operator schemas for the chart's PodMonitor and PrometheusRule.
pub fn node_models() -> anyhow::Result<()> {
    if node_prefix().join(NODE_MODELS.1).is_dir() {
        say("npm Prometheus Operator schemas: present");
        return Ok(());
    }
    say(&format!("installing {} (npm)", NODE_MODELS.0));
    std::fs::create_dir_all(node_prefix())?;
    run(Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(node_prefix())
        .arg(NODE_MODELS.0))
    .context("npm install of the Prometheus Operator schemas failed")
}

/// yamllint, kubernetes-validate and Helm's library for the manifest checks; the MCP SDK for
/// the MCP server's test.
pub fn python_tools() -> anyhow::Result<()> {
    if PYTHON_TOOLS.iter().all(|(_, bin)| venv_bin(bin).is_file()) && venv_has_module("helm_python")
    {
        say("python tools (yamllint, kubernetes-validate, mcp, helm-python-sdk): present");
        return Ok(());
    }
    say("installing yamllint, kubernetes-validate, mcp and helm-python-sdk into a venv");
    if !venv_bin("pip").is_file() {
        run(Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(venv_dir()))
        .context("python3 -m venv failed (Debian: apt-get install python3-venv)")?;
    }
    run(Command::new(venv_bin("pip"))
        .args(["install", "-q", "--disable-pip-version-check"])
        .args(PYTHON_TOOLS.iter().map(|(spec, _)| *spec))
        .arg(HELM_PYTHON))
    .context("pip install of the manifest checkers and the MCP SDK failed")
}

/// Everything: the build toolchain, the test tools, the mounts.
pub fn all() -> anyhow::Result<()> {
    apt(&[])?;
    toolchain()?;
    python_tools()?;
    node_models()?;
    mounts()?;
    say("done");
    Ok(())
}

/// Only what building the agent needs (the container image's build stage).
pub fn toolchain() -> anyhow::Result<()> {
    nightly()?;
    bpf_linker()?;
    rust_targets()
}

/// `cargo xtask demo`'s setup: only what the demo needs, when something of it is missing.
pub fn ensure_demo() -> anyhow::Result<()> {
    if !is_demo_complete() {
        say("something the demo needs is missing: installing it (the rest: cargo xtask setup)");
        apt_only(DEMO_PACKAGES.iter())?;
        if !has_prebuilt_ebpf() {
            nightly()?;
            bpf_linker()?;
        }
    }
    mounts()
}

/// Runs setup only when something is missing, so the README's two commands work alone.
pub fn ensure() -> anyhow::Result<()> {
    if is_complete() {
        return mounts();
    }
    say("something the build needs is missing: running setup first");
    all()
}
