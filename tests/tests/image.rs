//! The container image (`cargo xtask image`), run the way the DaemonSet runs it: podman,
//! rootful, in the host network of the lab's node namespace, read-only root filesystem, every
//! capability dropped and exactly the DaemonSet's added back (read from the generated
//! manifests). It confirms every lab failure; with one capability fewer it exits with the
//! agent's one-line error. The image holds the binary under test (`CLB_PROBE_BIN`) so CI
//! needs no release build; `cargo xtask image` builds the same image with the release one.
//! The arm64 image (`CLB_PROBE_ARM64_BIN`, cross-compiled) runs its agent under qemu-user.

use std::{collections::BTreeSet, process::Command, time::Duration};

use probe_tests::agent::{probe_arm64_bin, probe_bin, require_root, tempdir::TempDir, wait_for};
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants};

const TAG: &str = "localhost/clb-probe:test";
const NAME: &str = "clb-probe-image-test";
const ARM64_TAG: &str = "localhost/clb-probe:test-arm64";

/// The DaemonSet's added capabilities, from the manifests generated from the chart.
fn daemonset_capabilities() -> Vec<String> {
    let ds = std::fs::read_to_string(xtask::chart::plain_manifests()).unwrap();
    ds.lines()
        .skip_while(|l| !l.trim_start().starts_with("add:"))
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("- "))
        .filter_map(|l| l.trim().strip_prefix("- ").map(String::from))
        .collect()
}

/// `podman run` as the DaemonSet runs the agent, with `caps` added back.
fn podman_run(caps: &[String], events_dir: &std::path::Path) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["run", "--rm", "--name", NAME])
        .arg(format!("--network=ns:/run/netns/{}", lab::NS_NODE))
        .args(["--read-only", "--cap-drop=all"])
        .arg(format!("--cap-add={}", caps.join(",")))
        // As the chart's seccompProfile: Unconfined (bpf(2) is outside default profiles).
        .args(["--security-opt", "seccomp=unconfined"])
        .arg(format!("--volume={}:/out", events_dir.display()));
    // crun cannot run on a hybrid cgroup hierarchy (this machine's); runc can.
    if !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        cmd.arg("--runtime=runc");
    }
    // The runtime's default limits exceed what a machine without CAP_SYS_RESOURCE (this one,
    // itself a container) may set; the agent needs few of either.
    let mut nofile = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut nofile) };
    cmd.arg(format!(
        "--ulimit=nofile={0}:{0}",
        nofile.rlim_cur.min(65536)
    ))
    .arg("--ulimit=nproc=4096:4096")
    .arg(TAG)
    .args([
        "agent",
        "--nic",
        lab::NODE_NIC,
        "--events",
        "/out/events.jsonl",
    ]);
    cmd
}

/// Removes the container on drop (also when the test fails).
struct Container;

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "5", NAME])
            .output();
    }
}

#[test]
fn the_image_confirms_every_failure_with_only_the_daemonsets_capabilities() {
    if !require_root("image") {
        return;
    }
    if test_support::tools::which("podman").is_none()
        || test_support::tools::which("buildah").is_none()
    {
        eprintln!("skipping the image test: podman/buildah not installed (cargo xtask setup)");
        return;
    }
    xtask::image::build(&probe_bin(), TAG).expect("cargo xtask image");
    let caps = daemonset_capabilities();
    assert_eq!(caps.len(), 5, "{caps:?}");

    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let events = TempDir::new("image");

    // One capability fewer: the agent's one-line error, exit 1, nothing attached.
    for missing in ["NET_ADMIN", "BPF"] {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        let out = podman_run(&fewer, events.path()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(out.status.code(), Some(1), "without {missing}: {stderr}");
        assert_eq!(lines.len(), 1, "one line without {missing}: {stderr}");
        assert!(lines[0].contains(&format!("CAP_{missing}")), "{stderr}");
    }

    let _container = Container;
    let mut agent = podman_run(&caps, events.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("podman run");
    let file = events.path().join("events.jsonl");
    let stderr = agent.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    let attached = wait_for(
        "the agent in the image attached",
        Duration::from_secs(60),
        || {
            log.extend(rx.try_iter());
            log.iter()
                .any(|l| l.contains("attached and address sets loaded"))
                .then_some(())
        },
    );
    assert!(
        attached.is_some(),
        "the agent did not attach:\n{}",
        log.join("\n")
    );

    for (scenario, outcome) in [
        (Scenario::HealthcheckBlackhole, Outcome::Timeout),
        (Scenario::Hairpin, Outcome::Timeout),
        (Scenario::VipPortUnserved, Outcome::Refused),
    ] {
        assert_eq!(lab.traffic(scenario).unwrap(), outcome, "{scenario}");
    }
    let kinds = wait_for("three kinds confirmed", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&file).ok()?;
        let kinds: BTreeSet<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<probe_contract::LoopbackEvent>(l).ok())
            .map(|e| e.kind.as_str().to_string())
            .collect();
        (kinds.len() >= 3).then_some(kinds)
    });
    log.extend(rx.try_iter());
    let kinds = kinds.unwrap_or_else(|| {
        panic!(
            "events: {:?}\nlog:\n{}",
            std::fs::read_to_string(&file),
            log.join("\n")
        )
    });
    for kind in ["healthcheck_blackhole", "hairpin", "vip_port_unserved"] {
        assert!(kinds.contains(kind), "{kind} not confirmed: {kinds:?}");
    }
    // SIGTERM: the agent detaches and exits 0.
    let _ = Command::new("podman")
        .args(["stop", "-t", "10", NAME])
        .output();
    let status = agent.wait().unwrap();
    log.extend(rx.try_iter());
    assert!(status.success(), "agent exit {status}:\n{}", log.join("\n"));
    assert!(
        log.iter().any(|l| l.contains("detached")),
        "{}",
        log.join("\n")
    );
}

/// Removes a buildah working container (and its mount) on drop.
struct WorkingContainer(String);

impl Drop for WorkingContainer {
    fn drop(&mut self) {
        let _ = Command::new("buildah").args(["rm", &self.0]).output();
    }
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_arm64_image_runs_its_agent_under_qemu_user() {
    if !require_root("arm64 image") {
        return;
    }
    for tool in ["podman", "buildah", "qemu-aarch64-static"] {
        if test_support::tools::which(tool).is_none() {
            eprintln!("skipping the arm64 image test: {tool} not installed (cargo xtask setup)");
            return;
        }
    }
    let (tag, _) = xtask::image::build_arch(
        &probe_arm64_bin(),
        ARM64_TAG,
        xtask::image::Arch::Arm64,
        None,
    )
    .expect("cargo xtask image --arch arm64");
    let arch = stdout_of(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Os}}/{{.Architecture}}",
        &tag,
    ]));
    assert_eq!(arch, "linux/arm64");

    // The image's own files: its agent, run by qemu-user against the image's arm64 libc.
    let ctr = WorkingContainer(stdout_of(Command::new("buildah").args(["from", &tag])));
    let root = std::path::PathBuf::from(stdout_of(Command::new("buildah").args(["mount", &ctr.0])));
    let agent = root.join("usr/local/bin/probe");
    let elf = std::fs::read(&agent).unwrap();
    // ELF e_machine (offset 18, little endian): 183 is EM_AARCH64.
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!(
        u16::from_le_bytes([elf[18], elf[19]]),
        183,
        "not an arm64 binary"
    );
    let out = Command::new("qemu-aarch64-static")
        .arg("-L")
        .arg(&root)
        .arg(&agent)
        .arg("--version")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "probe --version under qemu-aarch64: {out:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("probe {}", env!("CARGO_PKG_VERSION"))
    );
}
