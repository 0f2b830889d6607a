//! The agent's own surfaces against a hostile local user (issue 24, items 1-5, 8 and 12),
//! each as a test: a squatter on the agent's lock, a flood of half-sent requests against
//! `/healthz`, an output nobody reads, the live view out of descriptors, outputs planted as
//! links or FIFOs, SIGHUP/SIGQUIT in both tc modes, and the live-view socket's creation under
//! umask 000. The unprivileged user is uid 65534: this test binary re-run under `setpriv`
//! ([`as_nobody`]), doing the one thing [`helper_process_for_the_other_tests`] is told.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, SocketAddrV4, TcpStream},
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::Path,
    process::{Command, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use probe_tests::agent::{
    Agent, agent_on_node_nic_args, assert_contains, assert_nothing_attached, error_line,
    probe_command, stderr, tempdir::TempDir, wait_for,
};
use test_support::lab::{self, LabGuard, Scenario, Variants, in_netns};

const METRICS: &str = "127.0.0.1:19968";
/// The agent's `sink::http::MAX_CONNECTIONS`.
const HTTP_CAP: usize = 1024;
/// What makes this binary a helper process instead of a test run (see [`as_nobody`]).
const HELPER_ENV: &str = "CLB_HOSTILE_HELPER";

/// `cmd` starts under umask 000: what it creates gets only the modes it asks for.
fn under_umask_000(cmd: &mut Command) {
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        })
    };
}

/// The agent on the lab's node with its live view on `socket`, its stdout discarded.
fn agent_on_socket(socket: &Path) -> Command {
    let mut cmd = Agent::command(lab::NS_NODE);
    cmd.args(["--nic", lab::NODE_NIC, "--socket"])
        .arg(socket)
        .stdout(Stdio::null());
    cmd
}

/// Runs `probe` with `args` (in `netns` if given); None when it was still running after
/// `limit` (then SIGKILLed: a defect here is an agent that blocks and ignores SIGTERM).
fn probe_run(netns: Option<&str>, args: &[&str], limit: Duration, umask0: bool) -> Option<Output> {
    let mut cmd = probe_command(netns, args);
    cmd.env("CLB_PROBE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if umask0 {
        under_umask_000(&mut cmd);
    }
    let mut child = cmd.spawn().expect("run probe");
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child.wait_with_output().unwrap())
}

/// This test binary, re-run in `netns` as uid/gid 65534 (no groups, so no capabilities),
/// as the helper that `role` names.
fn as_nobody(netns: &str, role: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, "setpriv"])
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_process_for_the_other_tests",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, role);
    cmd
}

/// Not a test: the unprivileged process the tests start through [`as_nobody`] (it does
/// nothing in a normal run). Roles:
/// - `squat`: binds the agent's lock name for this namespace, says `squatting`, holds it
///   (never accepting) until stdin closes;
/// - `connect:<path>:<stop file>`: connects to the unix socket `path` in a tight loop until
///   the stop file exists, then prints `connected=<successes> attempts=<n>`.
#[test]
fn helper_process_for_the_other_tests() {
    let Ok(role) = std::env::var(HELPER_ENV) else {
        return;
    };
    if role == "squat" {
        use std::os::{linux::net::SocketAddrExt as _, unix::fs::MetadataExt as _};
        let ino = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        let name = format!("clb-probe/agent/netns:{ino}");
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let _held = std::os::unix::net::UnixListener::bind_addr(&addr).expect("squat the lock");
        // SAFETY: getuid has no preconditions.
        println!("squatting @{name} as uid {}", unsafe { libc::getuid() });
        let mut rest = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut rest);
    } else if let Some(args) = role.strip_prefix("connect:") {
        let (path, stop) = args.split_once(':').unwrap();
        let (mut connected, mut attempts) = (0u64, 0u64);
        // The test's directory gone (a failed test) ends it too.
        let dir = Path::new(path).parent().unwrap();
        while !Path::new(stop).exists() && dir.exists() {
            for _ in 0..1000 {
                attempts += 1;
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    connected += 1;
                }
            }
        }
        println!("connected={connected} attempts={attempts}");
    }
}

/// Item 1: a capability-less process (uid 65534) holding the agent's lock name does not keep
/// the agent from starting: the agent says in one WARN that the holder is not an agent, and
/// a real second agent is still refused in one line naming the first.
#[test]
fn a_lock_squatter_does_not_keep_the_agent_out_and_a_second_agent_is_still_refused() {
    let Some(_lab) = LabGuard::for_test("lock_squatter", &Variants::default()) else {
        return;
    };
    let mut squatter = as_nobody(lab::NS_NODE, "squat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("squatter");
    let mut lines = BufReader::new(squatter.stdout.take().unwrap()).lines();
    let said = lines
        .by_ref()
        .map_while(Result::ok)
        // libtest prints the test's name on the same line first.
        .find(|l| l.contains("squatting @"))
        .expect("the squatter holds the lock");
    assert_contains(&said, "as uid 65534");

    let mut first = Agent::on_node_nic(&[]);
    assert_eq!(
        first.count_log("not an agent"),
        1,
        "one WARN names the squatter"
    );
    let dir = TempDir::new("hostile-second");
    let sock = dir.path().join("second.sock");
    let o = probe_run(
        Some(lab::NS_NODE),
        &agent_on_node_nic_args(&["--socket", sock.to_str().unwrap()]),
        Duration::from_secs(30),
        false,
    )
    .expect("the second agent refuses, it does not hang");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let line = error_line(&o);
    assert!(
        line.contains(&format!("PID {}", first.pid())) && line.contains("already watches"),
        "{line}"
    );
    assert!(!stderr(&o).contains("programs loaded"), "{}", stderr(&o));
    assert!(first.stop().success());
    drop(squatter.stdin.take());
    let _ = squatter.wait();
    assert_nothing_attached();
}

/// One `/healthz` probe as the kubelet makes it (its default timeout is 1 s; 2 s here for a
/// shared test machine): true when it answered 200 in time.
fn healthz_probe() -> bool {
    in_netns(lab::NS_NODE, || {
        let addr: SocketAddr = METRICS.parse()?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let status = text
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        Ok(status == "200" && text.ends_with("ok\n"))
    })
    .unwrap_or(false)
}

/// Item 2: the connection cap plus 100 clients, each sending half a request and reopened
/// whenever it is cut, for 20 one-second probe rounds (four header timeouts): every
/// `/healthz` probe answers.
#[test]
fn healthz_answers_every_probe_through_a_flood_of_half_sent_requests() {
    let Some(_lab) = LabGuard::for_test("healthz_flood", &Variants::default()) else {
        return;
    };
    let mut agent = Agent::on_node_nic(&["--metrics-addr", METRICS]);
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            in_netns(lab::NS_NODE, move || {
                let addr: SocketAddr = METRICS.parse()?;
                let open = || {
                    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
                    s.write_all(b"GET /healthz HTTP/1.1\r\nHo").ok()?;
                    s.set_nonblocking(true).ok()?;
                    Some(s)
                };
                let mut conns: Vec<Option<TcpStream>> = Vec::new();
                let mut reopened = 0u64;
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    conns.resize_with(HTTP_CAP + 100, || None);
                    for c in &mut conns {
                        let alive = c.as_mut().is_some_and(|s| {
                            matches!(s.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                        });
                        if !alive {
                            *c = open();
                            reopened += 1;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(reopened)
            })
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let mut failed = Vec::new();
    for round in 0..20 {
        let started = Instant::now();
        if !healthz_probe() {
            failed.push(round);
        }
        std::thread::sleep(Duration::from_secs(1).saturating_sub(started.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    let opened = flood.join().unwrap().expect("the flood ran");
    eprintln!("flood: {opened} connections opened; failed probe rounds: {failed:?}");
    assert!(
        opened > (HTTP_CAP + 100) as u64,
        "the flood kept its connections open"
    );
    assert_eq!(
        failed,
        Vec::<usize>::new(),
        "/healthz rounds that did not answer"
    );
    assert!(agent.stop().success());
    assert_nothing_attached();
}

/// A `/metrics` sample by its exact name and labels.
fn metric(name: &str) -> Option<f64> {
    let (_, text) = lab::http_get_in(lab::NS_NODE, METRICS, "/metrics")?;
    text.lines()
        .find(|l| l.rsplit_once(' ').is_some_and(|(n, _)| n == name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Item 3: `--events -` into a pipe nobody reads. Confirmations go on far past what the pipe
/// and the writer's queue hold (450 distinct unserved VIP ports, each its own event), lost
/// lines are counted, the output shows as stalled, and SIGTERM ends the agent, detached, its
/// socket removed. The ports are paced under the kernel's per-CPU budget (256 records a
/// second per class), which would otherwise shed the suspects themselves.
#[test]
fn an_output_nobody_reads_never_stops_detection_or_shutdown() {
    const PORTS: u16 = 450;
    let Some(lab) = LabGuard::for_test("stalled_output", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("hostile-stall");
    let socket = dir.path().join("probe.sock");
    let mut cmd = Agent::command(lab::NS_NODE);
    cmd.args(["--nic", lab::NODE_NIC, "--events", "-", "--record"])
        .arg(dir.path().join("record.jsonl"))
        .args(["--metrics-addr", METRICS, "--socket"])
        .arg(&socket)
        // The pipe is kept open and never read (Agent::stdout).
        .stdout(Stdio::piped());
    let mut agent = Agent::spawn_attached(cmd, dir);
    lab.traffic(Scenario::VipPortUnserved).expect("traffic");
    in_netns(lab::NS_POD_A, || {
        for port in 20_000..20_000 + PORTS {
            let _ = lab::connect_here(
                None,
                SocketAddrV4::new(lab::VIP, port),
                Duration::from_millis(500),
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    })
    .unwrap();
    let confirmed = wait_for("confirmations", Duration::from_secs(60), || {
        let n = agent.count_log("confirmed loopback");
        (n > usize::from(PORTS)).then_some(n)
    });
    assert!(
        confirmed.is_some(),
        "confirmations stopped at {} of {}",
        agent.count_log("confirmed loopback"),
        PORTS + 1
    );
    let lost = metric("clbprobe_output_lines_lost_total{output=\"events\"}").unwrap_or(0.0);
    assert!(lost > 0.0, "lost lines are counted: {lost}");
    assert_eq!(
        metric("clbprobe_output_stalled{output=\"events\"}"),
        Some(1.0),
        "the stalled output shows"
    );
    assert_eq!(
        metric("clbprobe_output_stalled{output=\"record\"}"),
        Some(0.0)
    );
    eprintln!(
        "stalled output: {} confirmations, {lost} lines lost",
        agent.count_log("confirmed loopback")
    );
    let stdout = agent.stdout.take();
    let asked = Instant::now();
    let status = agent.stop();
    eprintln!("stalled output: SIGTERM to exit {:?}", asked.elapsed());
    assert!(status.success(), "exit after SIGTERM: {status}");
    drop(stdout);
    assert_nothing_attached();
    assert!(!socket.exists(), "the socket is removed");
}

/// Item 4: the live view survives running out of descriptors. With RLIMIT_NOFILE 256, 400
/// live-view clients that never read exhaust the agent's descriptors; once they go,
/// `probe watch --once` works again, and exactly one WARN said accept failed (at most one a
/// minute; an INFO when accepting works again).
#[test]
fn the_live_view_survives_running_out_of_descriptors() {
    let Some(_lab) = LabGuard::for_test("live_view_emfile", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("hostile-emfile");
    let socket = dir.path().join("probe.sock");
    let mut cmd = agent_on_socket(&socket);
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            Ok(())
        })
    };
    let mut agent = Agent::spawn_attached(cmd, dir);
    let clients: Vec<_> = (0..400)
        .filter_map(|_| std::os::unix::net::UnixStream::connect(&socket).ok())
        .collect();
    agent.wait_log(
        "live view: accepting a connection failed",
        Duration::from_secs(20),
    );
    eprintln!("live view: {} clients connected", clients.len());
    std::thread::sleep(Duration::from_secs(3));
    drop(clients);
    let watch = wait_for("probe watch --once", Duration::from_secs(30), || {
        let o = probe_run(
            None,
            &["watch", "--once", "--socket", socket.to_str().unwrap()],
            Duration::from_secs(10),
            false,
        )?;
        o.status.success().then_some(o)
    });
    assert!(
        watch.is_some(),
        "probe watch --once never worked again:\n{}",
        agent.log.join("\n")
    );
    agent.wait_log(
        "live view: accepting connections again",
        Duration::from_secs(10),
    );
    assert_eq!(
        agent.count_log("live view: accepting a connection failed"),
        1,
        "one WARN for the episode"
    );
    assert!(agent.stop().success());
    assert_nothing_attached();
}

/// Item 5: `--events`/`--record` refuse a symbolic link (its target untouched), a FIFO (no
/// blocked start-up) and a directory, before anything is loaded; the same file for both is a
/// usage error (exit 2); files are appended to, and created 0600 under umask 000.
#[test]
fn outputs_never_clobber_files() {
    let Some(_lab) = LabGuard::for_test("outputs_clobber", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("hostile-outputs");
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let precious = d.join("precious");
    std::fs::write(&precious, "root's secret\n").unwrap();
    std::fs::set_permissions(&precious, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = d.join("link.jsonl");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let fifo = d.join("fifo.jsonl");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let socket = d.join("probe.sock");
    let base = agent_on_node_nic_args(&["--socket", socket.to_str().unwrap()]);
    for flag in ["--events", "--record"] {
        for (path, says) in [
            (&link, "symbolic link"),
            (&fifo, "a FIFO"),
            (&d.to_path_buf(), "a directory"),
        ] {
            let mut args = base.to_vec();
            args.extend([flag, path.to_str().unwrap()]);
            let o = probe_run(Some(lab::NS_NODE), &args, Duration::from_secs(20), false)
                .unwrap_or_else(|| panic!("{flag} {}: still running", path.display()));
            assert_eq!(o.status.code(), Some(1), "{flag} {path:?}: {}", stderr(&o));
            let line = error_line(&o);
            assert!(line.contains(flag) && line.contains(says), "{line}");
            assert!(!stderr(&o).contains("programs loaded"), "{}", stderr(&o));
        }
    }
    assert_eq!(
        std::fs::read_to_string(&precious).unwrap(),
        "root's secret\n"
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );

    let same = d.join("same.jsonl");
    let relative_same = format!("{}/./same.jsonl", d.display());
    let mut args = base.to_vec();
    args.extend([
        "--events",
        same.to_str().unwrap(),
        "--record",
        &relative_same,
    ]);
    let o = probe_run(Some(lab::NS_NODE), &args, Duration::from_secs(20), false).unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("the same output"), "{}", stderr(&o));
    assert!(!same.exists(), "nothing created");

    // Append, and 0600 under umask 000: a run stopped at once by a bad --nic after the
    // outputs are opened would not show it, so a real start.
    let events = d.join("events.jsonl");
    std::fs::write(&events, "{\"before\":\"restart\"}\n").unwrap();
    let record = d.join("record.jsonl");
    let mut cmd = Agent::command(lab::NS_NODE);
    cmd.args(["--nic", lab::NODE_NIC, "--events"])
        .arg(&events)
        .arg("--record")
        .arg(&record)
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null());
    under_umask_000(&mut cmd);
    let mut agent = Agent::spawn_attached(cmd, TempDir::new("hostile-outputs-agent"));
    assert!(agent.stop().success());
    assert_eq!(
        std::fs::read_to_string(&events).unwrap(),
        "{\"before\":\"restart\"}\n",
        "appended to, not truncated"
    );
    let mode = std::fs::metadata(&record).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "--record created under umask 000");
    assert_nothing_attached();
}

/// Item 8: SIGHUP and SIGQUIT end the agent as SIGTERM does, in both tc modes: exit 0,
/// nothing attached, the socket removed.
#[test]
fn sighup_and_sigquit_shut_down_cleanly_in_both_tc_modes() {
    let Some(_lab) = LabGuard::for_test("sighup_sigquit", &Variants::default()) else {
        return;
    };
    for mode in ["tcx", "netlink"] {
        for (name, sig) in [("SIGHUP", libc::SIGHUP), ("SIGQUIT", libc::SIGQUIT)] {
            let dir = TempDir::new("hostile-signals");
            let socket = dir.path().join("probe.sock");
            let mut args = vec!["--nic", lab::NODE_NIC, "--socket", socket.to_str().unwrap()];
            if mode == "netlink" {
                args.extend(["--tc-mode", "netlink"]);
            }
            let mut agent = Agent::start(lab::NS_NODE, &args);
            let asked = Instant::now();
            let status = agent.signal(sig);
            eprintln!("{mode} {name}: exit {status} after {:?}", asked.elapsed());
            assert!(status.success(), "{mode} {name}: {status}");
            assert_nothing_attached();
            assert!(!socket.exists(), "{mode} {name}: the socket is removed");
        }
    }
}

/// Item 12: the live-view socket is never connectable by another user, not even while it is
/// being created: 20 agent starts under umask 000 against uid 65534 connecting in a tight
/// loop; no connection succeeds.
#[test]
fn the_live_view_socket_is_never_connectable_by_another_user() {
    let Some(_lab) = LabGuard::for_test("socket_race", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("hostile-socket");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("probe.sock");
    let stop = dir.path().join("stop");
    let connector = as_nobody(
        lab::NS_NODE,
        &format!("connect:{}:{}", socket.display(), stop.display()),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("connector");
    for _ in 0..20 {
        let mut cmd = agent_on_socket(&socket);
        under_umask_000(&mut cmd);
        let mut agent = Agent::spawn_attached(cmd, TempDir::new("hostile-socket-agent"));
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(agent.stop().success());
    }
    std::fs::write(&stop, "").unwrap();
    let out = connector.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let line = said
        .lines()
        .find_map(|l| Some(&l[l.find("connected=")?..]))
        .unwrap_or_else(|| panic!("the connector said nothing: {said}"));
    eprintln!("uid 65534: {line}");
    assert!(line.starts_with("connected=0 "), "{line}");
    assert_nothing_attached();
}
