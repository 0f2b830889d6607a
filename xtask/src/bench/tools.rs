//! The processes a bench round runs: the agent under test, the traffic generators, tcpdump,
//! and the small readers (HTTP in a namespace, /proc, bpf_stats). Every child is killed and
//! reaped on drop.

use std::{
    io::{BufRead as _, BufReader},
    net::Ipv4Addr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::net::{self, BenchNet};

/// Set by SIGINT/SIGTERM: every wait loop gives up, the guards clean up.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Ctrl-C (and SIGTERM) end the bench through its guards instead of killing it mid-way.
pub fn install_stop_handler() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Sleeps `d`, in short steps, failing when the bench was asked to stop.
pub fn pause(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if STOP.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

use probe_contract::clock::monotonic_ns;

/// A child in its own process group (trafgen forks workers), killed as a group on drop.
pub struct Proc {
    pub child: Child,
    name: String,
}

impl Proc {
    fn spawn(name: &str, cmd: &mut Command) -> Result<Proc> {
        // SAFETY: setpgid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpgid(0, 0);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name} ({cmd:?})"))?;
        Ok(Proc {
            child,
            name: name.to_string(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Fails when the process has already exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited early ({status})", self.name);
        }
        Ok(())
    }

    /// SIGTERM to the group, SIGKILL after 5 s; reaped.
    pub fn stop(&mut self) {
        let pgid = self.pid();
        // SAFETY: plain kill(2) on our own child's group.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                // Workers of the group may outlive the leader.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                return;
            }
            sleep(Duration::from_millis(20));
        }
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn in_ns(ns: &str, argv: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(argv);
    c
}

/// The agent under test in the bench node namespace.
pub struct Agent {
    pub proc: Proc,
    /// Each confirmed-event line from the agent's stdout (`--events -`), with the
    /// CLOCK_MONOTONIC ns it arrived at.
    pub events: Arc<Mutex<Vec<(u64, String)>>>,
    /// Where `--record` goes.
    pub record: PathBuf,
    pub metrics_port: u16,
    /// From spawn to `/readyz` 200.
    pub startup: Duration,
    /// The network namespace it runs in (its metrics address is that namespace's loopback).
    netns: String,
}

impl Agent {
    pub fn start(probe: &Path, dir: &Path, metrics_port: u16) -> Result<Agent> {
        Self::start_with_log(probe, dir, metrics_port, "warn")
    }

    /// [`Agent::start`] with `CLB_PROBE_LOG` set to `log` (its stderr goes to `agent.log`).
    pub fn start_with_log(probe: &Path, dir: &Path, metrics_port: u16, log: &str) -> Result<Agent> {
        Self::start_in(net::NS_NODE, probe, dir, metrics_port, log, &[])
    }

    /// The agent in network namespace `netns` (the bench node's, [`net::NS_NODE`], or one of
    /// the fleet's other nodes, which have its NIC and `kube-ipvs0` by their names), with
    /// `CLB_PROBE_LOG=log` and extra environment `env`.
    pub fn start_in(
        netns: &str,
        probe: &Path,
        dir: &Path,
        metrics_port: u16,
        log: &str,
        env: &[(&str, &str)],
    ) -> Result<Agent> {
        let record = dir.join("record.jsonl");
        let _ = std::fs::remove_file(&record);
        let log_file = std::fs::File::create(dir.join("agent.log"))?;
        let addr = format!("127.0.0.1:{metrics_port}");
        let socket = dir.join("agent.sock");
        let t0 = Instant::now();
        // A profiler around the agent, for looking into a figure by hand (e.g.
        // `CLB_BENCH_AGENT_WRAP="heaptrack -o /tmp/agent"`); never set by the bench itself.
        let wrap = std::env::var("CLB_BENCH_AGENT_WRAP").unwrap_or_default();
        let probe_path = probe.display().to_string();
        let (record_path, socket_path) =
            (record.display().to_string(), socket.display().to_string());
        let argv: Vec<&str> = wrap
            .split_whitespace()
            .chain([
                probe_path.as_str(),
                "agent",
                "--nic",
                net::NODE_IF,
                "--vip-iface",
                net::VIP_IF,
                "--pod-cidr",
                net::POD_CIDR,
                "--metrics-addr",
                &addr,
                "--events",
                "-",
                "--record",
                &record_path,
                "--socket",
                &socket_path,
            ])
            .collect();
        let mut proc = Proc::spawn(
            "the agent",
            in_ns(netns, &argv)
                .env("CLB_PROBE_LOG", log)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log_file),
        )?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let stdout = proc.child.stdout.take().context("agent stdout")?;
        let sink = Arc::clone(&events);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let at = monotonic_ns();
                if let Ok(mut v) = sink.lock() {
                    v.push((at, line));
                }
            }
        });
        loop {
            proc.check_running().with_context(|| {
                format!(
                    "the agent did not start; its log ({}):\n{}",
                    dir.join("agent.log").display(),
                    std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
                )
            })?;
            if let Some((200, _)) = test_support::lab::http_get_in(netns, &addr, "/readyz") {
                break;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("the agent was not ready after 60 s");
            }
            pause(Duration::from_millis(10))?;
        }
        Ok(Agent {
            startup: t0.elapsed(),
            proc,
            events,
            record,
            metrics_port,
            netns: netns.to_string(),
        })
    }

    pub fn metrics(&self) -> Option<String> {
        let addr = format!("127.0.0.1:{}", self.metrics_port);
        match test_support::lab::http_get_in(&self.netns, &addr, "/metrics") {
            Some((200, body)) => Some(body),
            _ => None,
        }
    }

    /// The agent's own process: the `ip netns exec` child execs into it.
    pub fn pid(&self) -> i32 {
        self.proc.pid()
    }
}

/// Sum of a metric family's samples whose labels contain every `want` pair.
pub fn metric_sum(text: &str, family: &str, want: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let (name, labels) = match name_labels.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (name_labels, ""),
            };
            if name != family {
                return None;
            }
            let ok = want
                .iter()
                .all(|(k, v)| labels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok().map(|v| v as u64))?
        })
        .sum()
}

/// (utime + stime in clock ticks, VmRSS kB, VmHWM kB) of `pid`.
pub fn proc_usage(pid: i32) -> Result<(u64, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the `(comm)`: state is field 3; utime 14, stime 15.
    let rest = stat.rsplit_once(')').context("/proc/pid/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((ticks, kb("VmRSS:"), kb("VmHWM:")))
}

pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf is always safe.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as u64
}

/// A trafgen packet config: `n_ordinary` UDP frames to the sink for each frame from
/// `suspect_src` (none when `None`), 60 bytes each (64 on the wire with the FCS).
pub fn trafgen_config(net: &BenchNet, n_ordinary: usize, suspect_src: Option<Ipv4Addr>) -> String {
    let frame = |src: Ipv4Addr, dst: Ipv4Addr| {
        format!(
            "{{ eth(da={da}, sa={sa}, type=0x0800), ipv4(saddr={src}, daddr={dst}, ttl=64), \
             udp(sport=drnd(1024, 65000), dport=9), fill(0x00, 18) }}\n",
            da = net.node_mac,
            sa = net.tx_mac,
        )
    };
    let mut s = String::new();
    for _ in 0..n_ordinary {
        s.push_str(&frame(net::TX_IP, net::SINK_DST));
    }
    if let Some(src) = suspect_src {
        s.push_str(&frame(src, net::NODE_IP));
    }
    s
}

/// trafgen on the sender's NIC, one CPU, until stopped.
pub fn trafgen(config: &Path) -> Result<Proc> {
    let mut p = Proc::spawn(
        "trafgen",
        in_ns(
            net::NS_TX,
            &[
                "trafgen",
                "--dev",
                net::TX_IF,
                "--conf",
                &config.display().to_string(),
                "--cpus",
                "1",
                "--no-sock-mem",
                // sendto(2), not the TX ring: the ring hands the NIC skbs whose linear part is
                // only the Ethernet header, which real NICs do not (the probe still classifies
                // those, through bpf_skb_load_bytes, at a cost no real traffic pays).
                "--gap",
                "0",
                "-q",
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null()),
    )?;
    pause(Duration::from_millis(300))?;
    p.check_running()?;
    Ok(p)
}

/// An iperf3 server in the node namespace (one test, then it exits).
pub fn iperf3_server() -> Result<Proc> {
    let p = Proc::spawn(
        "iperf3 -s",
        in_ns(
            net::NS_NODE,
            &["iperf3", "-s", "-1", "-B", &net::NODE_IP.to_string()],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null()),
    )?;
    // Until it listens.
    let end = Instant::now() + Duration::from_secs(5);
    while !test_support::lab::servers::listening(net::NS_NODE, 5201)? {
        if Instant::now() > end {
            bail!("iperf3 server not listening after 5 s");
        }
        pause(Duration::from_millis(20))?;
    }
    Ok(p)
}

/// One iperf3 TCP run from the sender; bits per second received.
pub fn iperf3_client(secs: u64) -> Result<f64> {
    let out = in_ns(
        net::NS_TX,
        &[
            "iperf3",
            "-c",
            &net::NODE_IP.to_string(),
            "-t",
            &secs.to_string(),
            "-J",
        ],
    )
    .stdin(Stdio::null())
    .output()
    .context("running iperf3 -c")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("iperf3 -J")?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .with_context(|| format!("no throughput in iperf3 output: {}", v["error"]))
}

/// tcpdump on the probed NIC with the filter a user would write for local sources, writing
/// to /dev/null; returns once it captures.
pub fn tcpdump() -> Result<Proc> {
    let filter = format!("src host {} or src host {}", net::NODE_IP, net::VIP);
    let mut p = Proc::spawn(
        "tcpdump",
        in_ns(
            net::NS_NODE,
            &[
                "tcpdump",
                "-i",
                net::NODE_IF,
                "-n",
                "-w",
                "/dev/null",
                &filter,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped()),
    )?;
    let stderr = p.child.stderr.take().context("tcpdump stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("tcpdump did not start capturing")?;
    Ok(p)
}

/// A raw IPv4 socket created in `ns` (it keeps sending there from any thread).
pub struct RawSender {
    fd: i32,
}

impl RawSender {
    pub fn new(ns: &str) -> Result<RawSender> {
        let fd = test_support::lab::in_netns(ns, || {
            // SAFETY: plain socket(2); the descriptor is owned by the RawSender from here.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
            if fd < 0 {
                bail!("raw socket in {ns}: {}", std::io::Error::last_os_error());
            }
            Ok(fd)
        })?;
        Ok(RawSender { fd })
    }

    /// Sends one TCP SYN `src:sport -> dst:dport` (IP header included; the kernel fills the
    /// IP checksum and length).
    pub fn syn(&self, src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Result<()> {
        let pkt = tcp_syn(src, sport, dst, dport);
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(dst).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: valid buffer and address for the call.
        let n = unsafe {
            libc::sendto(
                self.fd,
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        if n < 0 {
            bail!("sendto: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for RawSender {
    fn drop(&mut self) {
        // SAFETY: our own descriptor.
        unsafe { libc::close(self.fd) };
    }
}

fn checksum(data: &[u8], mut sum: u32) -> u16 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// IPv4 + TCP SYN with a valid TCP checksum.
pub fn tcp_syn(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&20u16.to_be_bytes());
    let pre: u32 = pseudo
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    let csum = checksum(&tcp, pre);
    tcp[16..18].copy_from_slice(&csum.to_be_bytes());
    ip.extend_from_slice(&tcp);
    ip
}

/// Our loaded programs (name `clb_*`), as `bpftool -j prog show` describes them.
fn our_progs() -> Result<Vec<serde_json::Value>> {
    let out = test_support::lab::cmd::run(&["bpftool", "-j", "prog", "show"])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("bpftool -j prog show")?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("clb_")))
        .cloned()
        .collect())
}

/// (name, program id, run_time_ns, run_cnt) of each of our programs (needs
/// `kernel.bpf_stats_enabled=1` to move). By id: another agent on the machine (a test beside
/// the smoke run) loads programs of the same names, and a by-name match once subtracted one
/// program's counters from another's (an overflow panic that ended a CI run, issue 54).
pub fn prog_stats() -> Result<Vec<(String, u64, u64, u64)>> {
    Ok(our_progs()?
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["id"].as_u64().unwrap_or(0),
                p["run_time_ns"].as_u64().unwrap_or(0),
                p["run_cnt"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

/// Average ns per run of our program `name` over `repeat` runs of `frame` through
/// BPF_PROG_TEST_RUN (`bpftool prog run`): the program alone, on its live maps, without the
/// rest of the stack or the clock reads bpf_stats adds.
pub fn test_run(name: &str, frame: &[u8], repeat: u32, dir: &Path) -> Result<f64> {
    test_run_prog(&["name", name], frame, repeat, dir)
}

/// [`test_run`] of the program `prog` names to bpftool (`["name", n]` or `["id", n]`).
pub fn test_run_prog(prog: &[&str; 2], frame: &[u8], repeat: u32, dir: &Path) -> Result<f64> {
    let input = dir.join(format!("{}.frame", prog[1]));
    std::fs::write(&input, frame)?;
    let out = test_support::lab::cmd::run(&[
        "bpftool",
        "prog",
        "run",
        prog[0],
        prog[1],
        "data_in",
        &input.display().to_string(),
        "repeat",
        &repeat.to_string(),
    ])?;
    // "Return value: 0, duration (average): 45ns"
    out.split("duration (average):")
        .nth(1)
        .and_then(|r| r.trim().trim_end_matches("ns").trim().parse::<f64>().ok())
        .with_context(|| format!("no duration in bpftool prog run output: {out}"))
}

/// An Ethernet frame around `ip` (addresses are not looked at by a test run).
pub fn ether(ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
    f.extend_from_slice(ip);
    f
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
