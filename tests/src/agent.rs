//! Running the real `probe agent` inside the lab's node namespace, and reading what it wrote.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

/// The `probe` binary under test: `CLB_PROBE_BIN` (set by `cargo xtask test`), else the
/// workspace's debug build.
pub fn probe_bin() -> PathBuf {
    std::env::var_os("CLB_PROBE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/debug/probe")
                .canonicalize()
                .expect("target/debug/probe: run `cargo build -p probe-user` first")
        })
}

/// True when running as root; otherwise prints a skip line for the calling test.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!("skipping {test}: needs root (network namespaces, eBPF)");
    false
}

/// A running agent; SIGTERM and wait on drop.
pub struct Agent {
    child: Option<Child>,
    pub dir: tempdir::TempDir,
    stderr_lines: mpsc::Receiver<String>,
    pub log: Vec<String>,
}

pub mod tempdir {
    use std::path::{Path, PathBuf};

    /// A scratch directory removed on drop.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!(
                "clb-probe-test-{tag}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Agent {
    /// Starts `probe agent` in `netns` with `--events` and `--record` files, plus `extra`
    /// arguments, and waits until it reports attached (or fails).
    pub fn start(netns: &str, extra: &[&str]) -> Agent {
        Agent::start_with_env(netns, extra, &[])
    }

    /// [`Agent::start`] with extra environment variables (the agent's test hooks).
    pub fn start_with_env(netns: &str, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let dir = tempdir::TempDir::new("agent");
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(probe_bin())
            .arg("agent")
            .arg("--events")
            .arg(dir.path().join("events.jsonl"))
            .arg("--record")
            .arg(dir.path().join("record.jsonl"))
            .args(extra)
            // A socket of its own unless the test names one: the default path is refused
            // while another agent (another test, on this shared machine) serves it.
            .args(
                (!extra.contains(&"--socket"))
                    .then(|| ["--socket".into(), dir.path().join("probe.sock")])
                    .into_iter()
                    .flatten(),
            )
            .env("CLB_PROBE_LOG", "info,clb_probe=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn probe agent");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("  agent| {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut agent = Agent {
            child: Some(child),
            dir,
            stderr_lines: rx,
            log: Vec::new(),
        };
        agent.wait_log("attached and address sets loaded", Duration::from_secs(60));
        agent
    }

    /// Waits for a stderr line containing `needle`; panics with the log on timeout or exit.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        if self.log.iter().any(|l| l.contains(needle)) {
            return;
        }
        while Instant::now() < deadline {
            match self.stderr_lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.log.push(line);
                    if hit {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                        panic!(
                            "agent exited ({status}) before {needle:?}:\n{}",
                            self.log.join("\n")
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!(
            "no {needle:?} from the agent in {timeout:?}:\n{}",
            self.log.join("\n")
        );
    }

    fn read_jsonl(&self, name: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join(name))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect()
    }

    /// Confirmed events written so far.
    pub fn events(&self) -> Vec<Value> {
        self.read_jsonl("events.jsonl")
    }

    /// Kernel events recorded so far.
    pub fn records(&self) -> Vec<Value> {
        self.read_jsonl("record.jsonl")
    }

    /// How many agent log lines so far contain `needle` (drains what is pending).
    pub fn count_log(&mut self, needle: &str) -> usize {
        while let Ok(line) = self.stderr_lines.try_recv() {
            self.log.push(line);
        }
        self.log.iter().filter(|l| l.contains(needle)).count()
    }

    /// Polls `f` over the recorded kernel events until it returns Some, or panics.
    pub fn wait_record<T>(
        &self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&[Value]) -> Option<T>,
    ) -> T {
        wait_for(what, timeout, || f(&self.records()))
            .unwrap_or_else(|| panic!("{what}: not recorded; records:\n{:#?}", self.records()))
    }

    /// Polls `f` over the confirmed events until it returns Some, or panics.
    pub fn wait_event<T>(
        &self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&[Value]) -> Option<T>,
    ) -> T {
        wait_for(what, timeout, || f(&self.events())).unwrap_or_else(|| {
            panic!(
                "{what}: no such event; events:\n{:#?}\nrecords:\n{:#?}",
                self.events(),
                self.records()
            )
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("agent already stopped");
        // `ip netns exec` execs the agent, so the child's pid is the agent's.
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        wait_exit(&mut child, Duration::from_secs(15))
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("agent already stopped");
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agent did not exit within {timeout:?} of SIGTERM");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Polls `f` every 100 ms until Some or timeout.
pub fn wait_for<T>(_what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// One sample of the `/metrics` served at `addr` in the lab's node namespace, by exact name
/// and labels (`clbprobe_x_total{a="b"}`); 0 when absent.
pub fn node_metric(addr: &str, name: &str) -> u64 {
    let (_, text) =
        xtask::lab::http_get_in(xtask::lab::NS_NODE, addr, "/metrics").expect("metrics");
    text.lines()
        .find(|l| l.rsplit_once(' ').is_some_and(|(n, _)| n == name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Runs a command and returns stdout; panics with stderr on failure.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Names of our programs that are attached through a BPF link to a tc hook (tcx), anywhere.
/// Debian 12's bpftool (7.1) predates tcx: `bpftool net` does not list tcx attachments and
/// `bpftool link` shows them as type 11 without the device, so links are matched to our
/// programs by id.
pub fn our_tc_links() -> Vec<String> {
    let programs: Value = serde_json::from_slice(
        &Command::new("bpftool")
            .args(["-j", "prog", "show"])
            .output()
            .expect("bpftool")
            .stdout,
    )
    .unwrap_or(Value::Null);
    let ours: std::collections::HashMap<u64, String> = programs
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p.get("id")?.as_u64()?, p.get("name")?.as_str()?.to_string())))
        .filter(|(_, n)| n == "clb_ingress" || n == "clb_egress")
        .collect();
    let links: Value = serde_json::from_slice(
        &Command::new("bpftool")
            .args(["-j", "link", "show"])
            .output()
            .expect("bpftool")
            .stdout,
    )
    .unwrap_or(Value::Null);
    links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| ours.get(&l.get("prog_id")?.as_u64()?).cloned())
        .collect()
}

/// Our programs still loaded anywhere on the host (`bpftool prog show`).
pub fn our_loaded_programs() -> Vec<String> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("name")?.as_str().map(String::from))
                .filter(|n| n.starts_with("clb_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Sum of a per-CPU map's values for keys matching `pred`, read with bpftool
/// (an observer independent of the agent).
pub fn percpu_map_sum(map: &str, pred: impl Fn(&[u8]) -> bool) -> u64 {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "name", map])
        .output()
        .expect("bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let mut total = 0;
    for entry in v.as_array().into_iter().flatten() {
        let key = hex_bytes(entry.get("key"));
        if !pred(&key) {
            continue;
        }
        for cpu in entry
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let bytes = hex_bytes(cpu.get("value"));
            let mut buf = [0u8; 8];
            buf[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
            total += u64::from_le_bytes(buf);
        }
    }
    total
}

/// bpftool prints bytes as `["0x0a", ...]`.
pub fn hex_bytes(v: Option<&Value>) -> Vec<u8> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether this kernel has tcx (>= 6.6): the agent attaches through tcx links there, through
/// cls_bpf filters under clsact otherwise (which outlive a SIGKILLed agent).
pub fn kernel_has_tcx() -> bool {
    let release = sh(&["uname", "-r"]);
    let mut nums = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    (major, minor) >= (6, 6)
}

/// Our programs attached to a tc hook, either way: tcx links ([`our_tc_links`]) plus cls_bpf
/// filters named `clb_*` (`bpftool net`, which lists clsact filters of the namespace it runs
/// in: run in every named namespace and the current one).
pub fn our_tc_attachments() -> Vec<String> {
    let mut found = our_tc_links();
    let names = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut runs: Vec<Vec<String>> = vec![vec!["bpftool".into(), "-j".into(), "net".into()]];
    for ns in names.lines().filter_map(|l| l.split_whitespace().next()) {
        runs.push(
            ["ip", "netns", "exec", ns, "bpftool", "-j", "net"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        );
    }
    for argv in runs {
        let Ok(out) = Command::new(&argv[0]).args(&argv[1..]).output() else {
            continue;
        };
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        for per_ns in v.as_array().into_iter().flatten() {
            for f in per_ns
                .get("tc")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(name) = f.get("name").and_then(Value::as_str)
                    && name.starts_with("clb_")
                {
                    found.push(name.to_string());
                }
            }
        }
    }
    found
}

/// A kernel drop of a local-source packet as this kernel reports it: `IP_LOCAL_SOURCE` where
/// the kernel has that reason (6.18 here), else (6.1 and older) `NOT_SPECIFIED` at the
/// route-input site `ip_rcv_finish_core*` (compiler suffixes such as `.constprop.0`).
pub fn is_local_source_drop(reason: &str, location: &str) -> bool {
    reason == "IP_LOCAL_SOURCE"
        || (reason == "NOT_SPECIFIED" && location.starts_with("ip_rcv_finish_core"))
}
