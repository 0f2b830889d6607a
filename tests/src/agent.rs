//! Running the real `probe agent` inside the lab's node namespace, and reading what it wrote.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use probe_contract::{LoopbackEvent, LoopbackKind, record::KernelEvent};
use serde_json::Value;
pub use test_support::assert_contains;

// The kernel observer lives in its own file; the tests name it through `agent` as before.
pub use crate::kernel_view::{
    assert_nothing_attached, hex_bytes, kernel_has_tcx, our_loaded_programs, our_map_dump,
    our_tc_attachments, our_tc_links, percpu_map_sum,
};

/// `probe agent --nic lab::NODE_NIC` followed by `extra`: the command line of a one-shot run
/// (one the test expects to refuse) in the lab's node, for [`probe_command`].
pub fn agent_on_node_nic_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    [&["agent"], &node_nic_args(extra)[..]].concat()
}

/// `--nic lab::NODE_NIC` followed by `extra`: the agent's arguments on the lab's node.
fn node_nic_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    [&["--nic", test_support::lab::NODE_NIC], extra].concat()
}

/// The `probe` binary under test: `CLB_PROBE_BIN` (set by `cargo xtask test`), else the one
/// cargo built beside this test executable (`<target dir>/<profile>/probe`, the test being
/// `<target dir>/<profile>/deps/<test>-<hash>`), so `CARGO_TARGET_DIR` is honoured.
pub fn probe_bin() -> PathBuf {
    std::env::var_os("CLB_PROBE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the test executable's path");
            exe.parent()
                .and_then(Path::parent)
                .expect("a test executable under <target dir>/<profile>/deps")
                .join("probe")
                .canonicalize()
                .expect("probe beside the tests: run `cargo build -p clb-probe` first")
        })
}

/// The target directory: `CARGO_TARGET_DIR`, else the workspace's `target/`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// `probe ARGS`: run inside network namespace `netns` (`ip netns exec`) when given, else
/// here.
pub fn probe_command(netns: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(probe_bin());
            c
        }
        None => Command::new(probe_bin()),
    };
    cmd.args(args);
    cmd
}

/// `probe events --socket SOCKET` following the agent's live socket: the child and its
/// stdout's lines as they come. It has had 300 ms to connect, so it follows from before the
/// traffic that comes next.
pub fn follow_events(socket: &Path) -> (Child, mpsc::Receiver<String>) {
    let mut events = Command::new(probe_bin())
        .args(["events", "--socket"])
        .arg(socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("probe events");
    let (tx, rx) = mpsc::channel();
    let stdout = events.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    (events, rx)
}

/// A child process killed (and reaped) on drop, also when the test panics: a test's helper
/// server.
pub struct KilledOnDrop(pub Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The arm64 agent under test: `CLB_PROBE_ARM64_BIN`, else the cross-compiled debug build.
pub fn probe_arm64_bin() -> PathBuf {
    std::env::var_os("CLB_PROBE_ARM64_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            target_dir()
                .join("aarch64-unknown-linux-gnu/debug/probe")
                .canonicalize()
                .expect(
                    "target/aarch64-unknown-linux-gnu/debug/probe: run `cargo build -p \
                     clb-probe --target aarch64-unknown-linux-gnu` first",
                )
        })
}

/// The lab's root check, where the tests have always imported it from.
pub use test_support::lab::require_root;

/// A running agent; SIGTERM and wait on drop.
pub struct Agent {
    child: Option<Child>,
    pub dir: tempdir::TempDir,
    stderr_lines: mpsc::Receiver<String>,
    pub log: Vec<String>,
    /// The agent's stdout when the command piped it (kept open, read or not).
    pub stdout: Option<std::process::ChildStdout>,
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

    /// [`Agent::start`] for the lab's node: in `lab::NS_NODE` on its NIC (`--nic
    /// lab::NODE_NIC`), plus `extra` arguments. Most lab tests watch that one NIC.
    pub fn on_node_nic(extra: &[&str]) -> Agent {
        Agent::start(test_support::lab::NS_NODE, &node_nic_args(extra))
    }

    /// [`Agent::on_node_nic`], then waits for the first service-table read (see
    /// [`Agent::start_with_table`]).
    pub fn on_node_nic_with_table(extra: &[&str]) -> Agent {
        Agent::start_with_table(test_support::lab::NS_NODE, &node_nic_args(extra))
    }

    /// [`Agent::start`], then waits for the agent's first service-table read. Readiness does
    /// not wait for the table (it fills in behind, issue #25), so a test that asserts
    /// service-table evidence must not drive traffic before the table is there.
    pub fn start_with_table(netns: &str, extra: &[&str]) -> Agent {
        let mut agent = Agent::start(netns, extra);
        agent.wait_log("service table read", Duration::from_secs(60));
        agent
    }

    /// [`Agent::start`] with extra environment variables (the agent's test hooks).
    pub fn start_with_env(netns: &str, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let dir = tempdir::TempDir::new("agent");
        let mut cmd = Agent::command(netns);
        cmd.arg("--events")
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
            .envs(env.iter().copied())
            .stdout(Stdio::null());
        Agent::spawn_attached(cmd, dir)
    }

    /// `ip netns exec <netns> probe agent` with the tests' log filter, stdin closed: the start
    /// of a command for [`Agent::spawn`].
    pub fn command(netns: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", netns])
            .arg(probe_bin())
            .arg("agent")
            .env("CLB_PROBE_LOG", "info,clb_probe=debug")
            .stdin(Stdio::null());
        cmd
    }

    /// Spawns `cmd` (an agent command line, see [`Agent::command`]) with its stderr collected
    /// into [`Agent::log`]; stdout is whatever `cmd` set (piped: in [`Agent::stdout`]).
    /// Does not wait for anything.
    pub fn spawn(mut cmd: Command, dir: tempdir::TempDir) -> Agent {
        let mut child = cmd
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn probe agent");
        let stderr = child.stderr.take().unwrap();
        let stdout = child.stdout.take();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("  agent| {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Agent {
            child: Some(child),
            dir,
            stderr_lines: rx,
            log: Vec::new(),
            stdout,
        }
    }

    /// [`Agent::spawn`], then waits for the agent's ready line (attached, address sets loaded).
    pub fn spawn_attached(cmd: Command, dir: tempdir::TempDir) -> Agent {
        let mut agent = Agent::spawn(cmd, dir);
        agent.wait_log("attached and address sets loaded", Duration::from_secs(60));
        agent
    }

    /// Sends `signal` and returns the exit status (panics if it does not exit in 15 s).
    pub fn signal(&mut self, signal: i32) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("agent already stopped");
        // SAFETY: signalling our own child (`ip netns exec` execs the agent).
        unsafe { libc::kill(child.id() as i32, signal) };
        wait_exit(&mut child, Duration::from_secs(15))
    }

    /// Waits for a stderr line containing `needle`; panics with the log on timeout or exit.
    /// `timeout` is stretched by the machine's patience (`test_support::patient`).
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) {
        let timeout = test_support::patient(timeout);
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

    /// The complete lines of a JSON-lines file the agent is writing: a last line without its
    /// newline is still being written, and is read next time.
    fn read_jsonl(&self, name: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect()
    }

    /// Confirmed events written so far, read once as the output contract's type. A line that
    /// is not a [`LoopbackEvent`], or that says more or less than one (the contract's type
    /// written back differs from the line: a field the contract lacks or spells differently, a
    /// field left out), fails the test with the line shown.
    pub fn events(&self) -> Vec<LoopbackEvent> {
        self.read_typed("events.jsonl", "LoopbackEvent")
    }

    /// Kernel events recorded so far (`--record`), read as the contract's [`KernelEvent`]
    /// with the same check as [`Agent::events`].
    pub fn records(&self) -> Vec<KernelEvent> {
        self.read_typed("record.jsonl", "KernelEvent")
    }

    /// The complete lines of `name`, each deserialized once as `T`; a line that is not one,
    /// or that `T` written back differs from, fails the test with the line shown.
    fn read_typed<T: serde::de::DeserializeOwned + serde::Serialize>(
        &self,
        name: &str,
        type_name: &str,
    ) -> Vec<T> {
        self.read_jsonl(name)
            .into_iter()
            .map(|line| {
                let typed = T::deserialize(&line)
                    .unwrap_or_else(|err| panic!("not the contract's {type_name} ({err}): {line}"));
                let back = serde_json::to_value(&typed).expect("a contract type serialises");
                assert_eq!(
                    back, line,
                    "the line is not what the contract's {type_name} writes: {line}"
                );
                typed
            })
            .collect()
    }

    /// The agent's log lines so far (drains what is pending).
    pub fn log_lines(&mut self) -> &[String] {
        while let Ok(line) = self.stderr_lines.try_recv() {
            self.log.push(line);
        }
        &self.log
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
        f: impl Fn(&[KernelEvent]) -> Option<T>,
    ) -> T {
        wait_for(what, timeout, || f(&self.records()))
            .unwrap_or_else(|| panic!("{what}: not recorded; records:\n{:#?}", self.records()))
    }

    /// Polls `f` over the confirmed events until it returns Some, or panics.
    pub fn wait_event<T>(
        &self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&[LoopbackEvent]) -> Option<T>,
    ) -> T {
        wait_for(what, timeout, || f(&self.events())).unwrap_or_else(|| {
            panic!(
                "{what}: no such event; events:\n{:#?}\nrecords:\n{:#?}",
                self.events(),
                self.records()
            )
        })
    }

    /// The first confirmed event of `kind`, once there is one (events of other kinds may come
    /// before it).
    pub fn first_event_of(&self, kind: LoopbackKind, timeout: Duration) -> LoopbackEvent {
        self.wait_event(kind.as_str(), timeout, |es| {
            es.iter().find(|e| e.kind == kind).cloned()
        })
    }

    /// The first confirmed event, once there is one; every event so far must be of `kind`.
    pub fn only_event(&self, kind: LoopbackKind, timeout: Duration) -> LoopbackEvent {
        let events = self.wait_event(kind.as_str(), timeout, |es| {
            (!es.is_empty()).then(|| es.to_vec())
        });
        assert!(
            events.iter().all(|e| e.kind == kind),
            "expected only {} events, got {events:#?}",
            kind.as_str()
        );
        events[0].clone()
    }

    /// A healthy twin's end: lets the agent settle for `settle`, then asserts it reported
    /// nothing.
    #[track_caller]
    pub fn assert_reports_nothing_after(&self, settle: Duration) {
        std::thread::sleep(settle);
        let events = self.events();
        assert!(events.is_empty(), "{events:#?}");
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
    let timeout = test_support::patient(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agent did not exit within {timeout:?} of the signal");
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

/// Polls `f` every 100 ms until Some or timeout, stretched by the machine's patience
/// (`test_support::patient`: the VM tier's guests wait longer, a fast machine no less).
pub fn wait_for<T>(_what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + test_support::patient(timeout);
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
    let (_, text) = test_support::lab::http_get_in(test_support::lab::NS_NODE, addr, "/metrics")
        .expect("metrics");
    text.lines()
        .find(|l| l.rsplit_once(' ').is_some_and(|(n, _)| n == name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The value of the first sample of the `/metrics` served at `addr` in `ns` whose line starts
/// with `prefix` (a name, or a name and the start of its labels); None when the page or the
/// sample is missing, or the value is no `T`.
pub fn metric_sample<T: std::str::FromStr>(ns: &str, addr: &str, prefix: &str) -> Option<T> {
    let (_, text) = test_support::lab::http_get_in(ns, addr, "/metrics")?;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
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

/// `ip -n ns ARGS...` through [`sh`].
pub fn ip_in(ns: &str, args: &[&str]) -> String {
    sh(&[&["ip", "-n", ns], args].concat())
}

/// [`sh`] inside the lab's node namespace (`ip netns exec`).
pub fn sh_in_node(args: &[&str]) -> String {
    sh(&[&["ip", "netns", "exec", test_support::lab::NS_NODE], args].concat())
}

/// An event's list of lines (`evidence`, `remedy`) as one text, a line each.
pub fn lines(lines: &[String]) -> String {
    lines.join("\n")
}

/// Bytes (a command's output) as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An IPVS-mode `source_ranges_drop` (issue #51, either family): `src`'s call to `vip` on the
/// lab's service port, dropped by netfilter, every needle in its evidence. Returns the evidence.
#[track_caller]
pub fn assert_ipvs_source_ranges_drop(
    e: &LoopbackEvent,
    src: std::net::IpAddr,
    vip: std::net::IpAddr,
    needles: &[&str],
) -> String {
    assert_eq!(e.src, src);
    assert_eq!(e.vip, Some(vip));
    assert_eq!(e.vip_port, Some(test_support::lab::SERVICE_PORT));
    assert_eq!(e.outcome, probe_contract::Outcome::Dropped);
    assert_eq!(e.drop_reason.as_deref(), Some("NETFILTER_DROP"));
    assert_eq!(
        e.facts.proxy_mode,
        Some(probe_contract::facts::ProxyMode::Ipvs)
    );
    let ev = lines(&e.evidence);
    for needle in needles {
        assert!(ev.contains(needle), "{needle}: {ev}");
    }
    ev
}

/// Panics if `haystack` contains `needle`, showing the haystack.
#[track_caller]
pub fn assert_lacks(haystack: &str, needle: &str) {
    assert!(!haystack.contains(needle), "{needle:?} is in:\n{haystack}");
}

/// A finished command's stderr, as text.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The last non-empty stderr line: where the probe says its error.
pub fn error_line(o: &std::process::Output) -> String {
    stderr(o)
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .to_string()
}

/// A kernel drop of a local-source packet as this kernel reports it: `IP_LOCAL_SOURCE` where
/// the kernel has that reason (6.18 here), else (6.1 and older) `NOT_SPECIFIED` at the
/// route-input site `ip_rcv_finish_core*` (compiler suffixes such as `.constprop.0`).
pub fn is_local_source_drop(reason: &str, location: &str) -> bool {
    reason == "IP_LOCAL_SOURCE"
        || (reason == "NOT_SPECIFIED" && location.starts_with("ip_rcv_finish_core"))
}

/// [`is_local_source_drop`] of a confirmed event's drop reason and site.
pub fn dropped_as_local_source(e: &LoopbackEvent) -> bool {
    is_local_source_drop(
        e.drop_reason.as_deref().unwrap_or_default(),
        e.drop_location.as_deref().unwrap_or_default(),
    )
}

/// What a pod-a call that netfilter dropped on its way to the LB IP's `port` says: the call,
/// the drop (named on 5.17+, inferred from nf_hook_slow before) and the Service `service`.
pub fn assert_pod_a_call_dropped_by_netfilter(e: &LoopbackEvent, port: u16, service: &str) {
    use std::net::IpAddr;

    use test_support::lab;
    assert_eq!(e.src, IpAddr::V4(lab::POD_A_IP));
    assert_eq!(e.vip, Some(IpAddr::V4(lab::VIP)));
    assert_eq!(e.vip_port, Some(port));
    assert_eq!(e.outcome, probe_contract::Outcome::Dropped);
    assert_eq!(e.drop_reason.as_deref(), Some("NETFILTER_DROP"));
    assert_eq!(e.service.as_deref(), Some(service));
}

/// What a `source_ranges_drop` of pod-a's call to `default/web` (ranges 192.0.2.0/24 and
/// 198.51.100.0/24) says in every IPv4 mode beyond the mode's own rule: the caller is in none
/// of the ranges, and the remedy names the ranges, the pod, the pod-CIDR advice and
/// `upstream` (the mode's upstream references).
pub fn assert_pod_a_outside_the_ranges(e: &LoopbackEvent, upstream: &[&str]) {
    let ev = lines(&e.evidence);
    assert!(ev.contains("the caller 198.19.1.10 is in none"), "{ev}");
    let remedy = lines(&e.remedy);
    let every_mode = [
        "Service default/web sets loadBalancerSourceRanges (192.0.2.0/24, 198.51.100.0/24)",
        "the pod 198.19.1.10",
        "add the pod CIDR",
    ];
    for needle in every_mode.iter().chain(upstream) {
        assert!(remedy.contains(needle), "{needle}: {remedy}");
    }
}
