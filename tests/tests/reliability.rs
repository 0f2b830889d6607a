//! The defects found when the agent was attacked (issue 13), each as a test: stopping with
//! every option on, misbehaving HTTP clients, two agents in one namespace, the live-view
//! socket path, wrong interfaces and pod CIDRs, outputs checked before the kernel is touched,
//! and `probe events` on a closed pipe.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    os::unix::net::UnixListener,
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use probe_tests::agent::{
    Agent, agent_on_node_nic_args, assert_contains, assert_nothing_attached, error_line,
    our_tc_attachments, probe_bin, probe_command, stderr, tempdir::TempDir, wait_for,
};
use test_support::lab::{self, LabGuard, Variants, http_get_in, in_netns};

const METRICS: &str = "127.0.0.1:19967";

/// Runs `probe` with `args` (in `netns` if given); a run still going after `limit` is killed
/// and reported as such (what a defect looks like when the agent does not refuse).
fn probe_run(netns: Option<&str>, args: &[&str], limit: Duration) -> Output {
    let mut child = probe_command(netns, args)
        .env("CLB_PROBE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run probe");
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // SAFETY: signalling our own child (the agent: `ip netns exec` execs it).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let out = child.wait_with_output().unwrap();
            panic!(
                "probe {args:?} still running after {limit:?} (it should have refused):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// One raw HTTP exchange inside the node namespace: what the server wrote before closing.
fn raw_http(request: &str) -> String {
    let request = request.to_string();
    in_netns(lab::NS_NODE, move || {
        let mut s = TcpStream::connect(METRICS)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(request.as_bytes())?;
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        Ok(text)
    })
    .expect("raw HTTP exchange")
}

fn status_of(response: &str) -> Option<u16> {
    response.split_whitespace().nth(1)?.parse().ok()
}

fn metric(name: &str) -> Option<f64> {
    probe_tests::agent::metric_sample(lab::NS_NODE, METRICS, name)
}

/// Defects 1 and 2: `/healthz` keeps answering while one client pipelines requests and never
/// reads, and hundreds of others send half a request and stall; only GET/HEAD are served, the
/// query does not change the route; then SIGTERM ends the agent (with every surface on and
/// those clients still connected), detached, its socket removed.
#[test]
fn healthz_answers_through_misbehaving_clients_and_sigterm_ends_the_agent() {
    let Some(_lab) = LabGuard::for_test("healthz_and_sigterm", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("reliability-http");
    let socket = dir.path().join("probe.sock");
    let mut agent = Agent::on_node_nic(&[
        "--metrics-addr",
        METRICS,
        "--socket",
        socket.to_str().unwrap(),
        "--pod-cidr",
        lab::POD_CIDR,
    ]);

    // A pipelining client that stops reading: thousands of requests, none of the answers read.
    let pipeliner = in_netns(lab::NS_NODE, || {
        let mut s = TcpStream::connect(METRICS)?;
        s.set_write_timeout(Some(Duration::from_secs(2)))?;
        let burst = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(20_000);
        let _ = s.write_all(burst.as_bytes()); // blocks once buffers fill: expected
        Ok(s)
    })
    .expect("pipelining client");
    // Slow clients: half a request each, then silence.
    let slow: Vec<TcpStream> = in_netns(lab::NS_NODE, || {
        let mut v = Vec::new();
        for _ in 0..300 {
            let mut s = TcpStream::connect(METRICS)?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHo")?;
            v.push(s);
        }
        Ok(v)
    })
    .expect("slow clients");
    // A live-view client that never reads.
    let live = std::os::unix::net::UnixStream::connect(&socket).expect("live-view client");

    for round in 0..5 {
        let answer = http_get_in(lab::NS_NODE, METRICS, "/healthz");
        assert_eq!(
            answer,
            Some((200, "ok\n".to_string())),
            "/healthz round {round}"
        );
    }
    let query = raw_http("GET /healthz?x=1 HTTP/1.0\r\n\r\n");
    assert_eq!(status_of(&query), Some(200), "{query}");
    assert!(query.ends_with("\r\n\r\nok\n"), "{query}");
    let post = raw_http("POST /healthz HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(status_of(&post), Some(405), "{post}");
    assert!(
        post.to_ascii_lowercase().contains("allow: get, head"),
        "{post}"
    );
    let head = raw_http("HEAD /readyz HTTP/1.0\r\n\r\n");
    assert_eq!(status_of(&head), Some(200), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head:?}");

    let status = agent.stop();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    assert_nothing_attached();
    assert!(
        !socket.exists(),
        "the agent's own socket is removed at exit"
    );
    assert!(
        agent.dir.path().join("events.jsonl").exists(),
        "outputs are left in place"
    );
    drop((pipeliner, slow, live));
}

/// Defect 3: a second agent in the same namespace exits 1 in one line naming the first's PID,
/// and attaches nothing.
#[test]
fn a_second_agent_in_the_namespace_is_refused_naming_the_first() {
    let Some(_lab) = LabGuard::for_test("second_agent", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("reliability-second");
    let first_socket = dir.path().join("first.sock");
    let mut first = Agent::on_node_nic(&["--socket", first_socket.to_str().unwrap()]);
    let attached_before = {
        let mut a = our_tc_attachments();
        a.sort();
        a
    };
    for mode in [None, Some("netlink")] {
        let second_socket = dir.path().join("second.sock");
        let mut args = agent_on_node_nic_args(&["--socket", second_socket.to_str().unwrap()]);
        if let Some(mode) = mode {
            args.extend(["--tc-mode", mode]);
        }
        let o = probe_run(Some(lab::NS_NODE), &args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(1), "{mode:?}: {}", stderr(&o));
        let line = error_line(&o);
        assert!(
            line.contains(&format!("PID {}", first.pid())) && line.contains("already watches"),
            "{line}"
        );
        assert!(
            !stderr(&o).contains("programs loaded"),
            "the second agent loaded programs:\n{}",
            stderr(&o)
        );
        assert!(!second_socket.exists());
    }
    let mut attached_after = our_tc_attachments();
    attached_after.sort();
    assert_eq!(
        attached_before, attached_after,
        "the first agent's attachments"
    );
    assert!(
        first_socket.exists(),
        "the first agent's socket is untouched"
    );
    assert!(first.stop().success());
    assert_nothing_attached();
}

/// Defect 5: `--socket` replaces only a stale socket; a regular file, a directory and a live
/// socket (another agent's, in another namespace) are refused in one line and left as they
/// were; a missing directory other than the default is not created.
#[test]
fn the_socket_path_is_never_destroyed_or_hijacked() {
    let Some(_lab) = LabGuard::for_test("socket_path", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("reliability-socket");
    let refuse = |path: &Path, says: &str| {
        let attached_before = our_tc_attachments();
        let o = probe_run(
            Some(lab::NS_NODE),
            &agent_on_node_nic_args(&["--socket", path.to_str().unwrap()]),
            Duration::from_secs(20),
        );
        assert_eq!(
            o.status.code(),
            Some(1),
            "{}: {}",
            path.display(),
            stderr(&o)
        );
        let line = error_line(&o);
        assert!(line.contains(says), "{}: {line}", path.display());
        assert!(!stderr(&o).contains("programs loaded"), "{}", stderr(&o));
        assert_eq!(our_tc_attachments(), attached_before);
    };

    let file = dir.path().join("important.txt");
    std::fs::write(&file, "keep me\n").unwrap();
    refuse(&file, "not a socket");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me\n");

    let subdir = dir.path().join("a-directory");
    std::fs::create_dir(&subdir).unwrap();
    refuse(&subdir, "not a socket");
    assert!(subdir.is_dir());

    let missing = dir.path().join("no/such/dir/probe.sock");
    refuse(&missing, "does not exist");
    assert!(!dir.path().join("no").exists(), "created a directory");

    // A live socket: an agent serves it from the peer's namespace; the node's agent must not
    // take it over.
    let live = dir.path().join("live.sock");
    let mut peer_agent = Agent::start(
        lab::NS_PEER,
        &["--nic", "eth0", "--socket", live.to_str().unwrap()],
    );
    refuse(&live, "another agent is serving");
    let mut c = std::os::unix::net::UnixStream::connect(&live).expect("peer agent still serves");
    let mut first = String::new();
    BufReader::new(&mut c).read_line(&mut first).unwrap();
    assert_contains(&first, "\"snapshot\"");
    assert!(peer_agent.stop().success());

    // A stale socket (a killed agent's): replaced, and removed at exit.
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let mut agent = Agent::on_node_nic(&["--socket", stale.to_str().unwrap()]);
    assert!(std::os::unix::net::UnixStream::connect(&stale).is_ok());
    assert!(agent.stop().success());
    assert!(!stale.exists());
    assert_nothing_attached();
}

/// Defects 6 and 7 (usage part): conflicting interfaces and impossible pod CIDRs are usage
/// errors (exit 2) that say why. Run without capabilities (as nobody when we are root): a
/// regression then fails on the capability check instead of attaching to this host's NICs.
#[test]
fn wrong_interfaces_and_pod_cidrs_are_usage_errors() {
    for (args, says) in [
        (
            &["--nic", "eth0", "--vip-iface", "eth0"][..],
            "is also a --nic",
        ),
        (&["--vip-iface", ""], "--vip-iface is empty"),
        (&["--nic", "lo"], "--nic lo"),
        (&["--pod-cidr", "0.0.0.0/0"], "every address a pod address"),
        (&["--pod-cidr", "::/0"], "every address a pod address"),
        (
            &["--pod-cidr", "10.244.1.5/24"],
            "did you mean 10.244.1.0/24",
        ),
    ] {
        let mut full = vec!["agent"];
        full.extend_from_slice(args);
        full.extend(["--socket", "/tmp/clb-reliability-usage.sock"]);
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(probe_bin());
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            cmd = Command::new(probe_bin());
        }
        let o = cmd
            .args(&full)
            .env("CLB_PROBE_LOG", "info")
            .stdin(Stdio::null())
            .output()
            .expect("run probe");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
}

/// Defect 6 (runtime part): an absent VIP interface is a WARN and a metric, `/readyz` says
/// what is missing, and the agent keeps waiting: when the interface appears its VIPs are
/// watched. Defect 7: a pod CIDR over the NIC's own subnet is warned about.
#[test]
fn an_absent_vip_interface_is_said_and_waited_for() {
    let Some(_lab) = LabGuard::for_test("absent_vip_iface", &Variants::default()) else {
        return;
    };
    let dir = TempDir::new("reliability-vip");
    let mut agent = Agent::on_node_nic(&[
        "--vip-iface",
        "clbvip9",
        "--pod-cidr",
        "198.18.0.0/24",
        "--metrics-addr",
        METRICS,
        "--socket",
        dir.path().join("probe.sock").to_str().unwrap(),
    ]);
    assert_eq!(
        agent.count_log("VIP interface absent"),
        1,
        "{:?}",
        agent.log
    );
    assert!(agent.count_log("WARN") >= 1);
    assert_eq!(
        agent.count_log("overlaps eth0's subnet 198.18.0.0/24"),
        1,
        "{:?}",
        agent.log
    );
    assert_eq!(metric("clbprobe_vip_interface_present"), Some(0.0));
    let (status, body) = http_get_in(lab::NS_NODE, METRICS, "/readyz").unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains("clbvip9") && body.contains("absent"),
        "{body}"
    );

    let ip = |args: &[&str]| {
        let ok = Command::new("ip")
            .args(["-n", lab::NS_NODE])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip {args:?}");
    };
    // A bridge stands in for kube-proxy's dummy, as in the lab (no dummy module on this host).
    ip(&["link", "add", "clbvip9", "type", "bridge"]);
    ip(&["addr", "add", "203.0.113.99/32", "dev", "clbvip9"]);
    let seen = wait_for("the VIP interface is seen", Duration::from_secs(10), || {
        (metric("clbprobe_vip_interface_present") == Some(1.0)
            && metric("clbprobe_local_addresses{set=\"vip\"}") == Some(1.0))
        .then_some(())
    });
    ip(&["link", "del", "clbvip9"]);
    assert!(
        seen.is_some(),
        "the agent did not pick up the VIP interface"
    );
    agent.wait_log("VIP interface appeared", Duration::from_secs(5));
    assert!(agent.stop().success());
    assert_nothing_attached();
}

/// Defect 8: an output that cannot be written fails before any program is loaded.
#[test]
fn unwritable_outputs_fail_before_the_kernel_is_touched() {
    let Some(_lab) = LabGuard::for_test("outputs", &Variants::default()) else {
        return;
    };
    for (flag, says) in [("--events", "--events"), ("--record", "--record")] {
        let o = probe_run(
            Some(lab::NS_NODE),
            &agent_on_node_nic_args(&[
                flag,
                "/nonexistent-clb-dir/out.jsonl",
                "--socket",
                "/tmp/clb-reliability-outputs.sock",
            ]),
            Duration::from_secs(20),
        );
        assert_eq!(o.status.code(), Some(1), "{flag}: {}", stderr(&o));
        assert!(error_line(&o).contains(says), "{}", error_line(&o));
        assert!(
            !stderr(&o).contains("programs loaded"),
            "{flag}: loaded before checking the output:\n{}",
            stderr(&o)
        );
        assert_nothing_attached();
    }
}

/// Defect 8: `probe events | head -1` ends as soon as `head` has its line, quietly, with
/// success, even when no further event comes. The agent end is a socket of the test's own
/// speaking the live-view protocol (one snapshot with two confirmed aggregates, then silence):
/// what is tested is the client's handling of its closed stdout.
#[test]
fn probe_events_into_a_closed_pipe_exits_quietly() {
    let dir = TempDir::new("reliability-pipe");
    let socket = dir.path().join("probe.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        use probe_contract::{LoopbackEvent, LoopbackKind, Message, Outcome, Proto, Snapshot};
        let vip = "203.0.113.10".parse().unwrap();
        let event = |port: u16| LoopbackEvent {
            key: format!("vip_port_unserved/203.0.113.10:{port}/tcp"),
            vip: Some(vip),
            vip_port: Some(port),
            count: 1,
            first_seen_ns: 1,
            last_seen_ns: 1,
            ..LoopbackEvent::between(
                LoopbackKind::VipPortUnserved,
                ("198.19.1.10".parse().unwrap(), 40000),
                (vip, port),
                Proto::Tcp,
                Outcome::Refused,
            )
        };
        let snapshot = Message::Snapshot {
            snapshot: Box::new(Snapshot {
                confirmed: vec![event(443), event(8443)],
                ..Snapshot::default()
            }),
        };
        let snapshot = serde_json::to_string(&snapshot).unwrap() + "\n";
        s.write_all(snapshot.as_bytes()).unwrap();
        // Silence, connection open, until the client goes.
        let mut buf = [0u8; 1];
        let _ = s.read(&mut buf);
    });
    let pipeline = format!(
        "set -o pipefail; {} events --all --socket {} | head -1",
        probe_bin().display(),
        socket.display()
    );
    let mut child = Command::new("bash")
        .args(["-c", &pipeline])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            // Unblock the server thread whatever happened.
            let _ = std::os::unix::net::UnixStream::connect(&socket);
            panic!("`probe events | head -1` still running after head exited");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "quietly");
    // `probe events` prints LoopbackEvents.
    let first: probe_contract::LoopbackEvent =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "not a LoopbackEvent ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
    assert_eq!(first.count, 1);
    server.join().unwrap();
}
