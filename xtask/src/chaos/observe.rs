//! What the rows observe: the programs the kernel holds, the agent's VIP map, its status,
//! HTTP answers, threads; the same checks for every row.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::Result;
use probe_contract::{LoopbackEvent, LoopbackKind, Message, NodeStatus};

use crate::bench::{
    net::{self},
    tools::Agent,
};

/// Whether `agent` writes a confirmed health-check black hole to `port` within `within`
/// (its lines read every 20 ms).
pub(super) fn blackhole_confirmed(agent: &Agent, port: u16, within: Duration) -> bool {
    let t = Instant::now();
    loop {
        let seen = agent.events.lock().is_ok_and(|v| {
            v.iter().any(|(_, l)| {
                serde_json::from_str::<LoopbackEvent>(l).is_ok_and(|e| {
                    e.kind == LoopbackKind::HealthcheckBlackhole && e.dst_port == port
                })
            })
        });
        if seen || t.elapsed() > within {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The agent's VIP map ([`kernel_vips`] of `pid`) read every `poll` until it equals `want` or
/// `within` has passed since `since`: the last map read (None: none read or readable).
pub(super) fn kernel_vips_until(
    pid: i32,
    want: &BTreeSet<std::net::Ipv4Addr>,
    since: Instant,
    within: Duration,
    poll: Duration,
) -> Option<BTreeSet<std::net::Ipv4Addr>> {
    let mut got = None;
    while since.elapsed() < within {
        got = kernel_vips(pid);
        if got.as_ref() == Some(want) {
            break;
        }
        std::thread::sleep(poll);
    }
    got
}

/// Ids of every BPF program loaded on the host (`bpftool prog show`).
pub(super) fn loaded_ids() -> BTreeSet<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// Ids of the programs a process holds (its bpf-prog and bpf-link fds' `prog_id`): other
/// agents run on this shared machine, so only this process's own programs are judged.
pub(super) fn prog_ids_of(pid: i32) -> BTreeSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return BTreeSet::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Waits up to 5 s for the kernel to free `ids` (links and programs go after an RCU grace
/// period); the ids still loaded then, and how long it took.
pub(super) fn wait_gone(ids: &BTreeSet<u64>) -> (BTreeSet<u64>, Duration) {
    let t = Instant::now();
    loop {
        let left: BTreeSet<u64> = ids.intersection(&loaded_ids()).copied().collect();
        if left.is_empty() || t.elapsed() > Duration::from_secs(5) {
            return (left, t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(super) fn suspects_vip(agent: &Agent) -> u64 {
    agent
        .metrics()
        .map(|m| {
            crate::bench::tools::metric_sum(
                &m,
                "clbprobe_suspect_packets_total",
                &[("source", "vip")],
            )
        })
        .unwrap_or(0)
}

/// The agent's status from its live-view socket (the first snapshot), if it sent one.
pub(super) fn live_status(socket: &Path) -> Option<NodeStatus> {
    let stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut line = String::new();
    let _ = std::io::BufReader::new(stream).read_line(&mut line);
    match serde_json::from_str(&line).ok()? {
        Message::Snapshot { snapshot } => Some(snapshot.status),
        Message::Report { .. } => None,
    }
}

/// One HTTP/1.0 GET in the calling thread's namespace: the status, or None.
pub(super) fn get(addr: &str, path: &str, timeout: Duration) -> Option<u16> {
    let sock: std::net::SocketAddr = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sock, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

pub(super) fn proc_threads(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

pub(super) fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The IPv4 VIPs in the agent's `HOSTS_V4` kernel map (found by the agent's own map fds).
pub(super) fn kernel_vips(pid: i32) -> Option<BTreeSet<std::net::Ipv4Addr>> {
    let ids: BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("map_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect();
    let id = ids.into_iter().find(|id| {
        let out = sh("bpftool", &["-j", "map", "show", "id", &id.to_string()]);
        serde_json::from_str::<serde_json::Value>(&out).is_ok_and(|v| v["name"] == "HOSTS_V4")
    })?;
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "id", &id.to_string()])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let byte = |x: &serde_json::Value| {
        x.as_str()
            .and_then(|s| u8::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    Some(
        v.as_array()?
            .iter()
            .filter(|e| e["value"].get(0).and_then(byte) == Some(2)) // tag::VIP
            .filter_map(|e| {
                let k: Vec<u8> = e["key"].as_array()?.iter().filter_map(byte).collect();
                (k.len() == 4).then(|| std::net::Ipv4Addr::new(k[0], k[1], k[2], k[3]))
            })
            .collect(),
    )
}

/// The IPv4 addresses bound on kube-ipvs0.
pub(super) fn iface_vips() -> BTreeSet<std::net::Ipv4Addr> {
    let out = sh(
        "ip",
        &[
            "-n",
            net::NS_NODE,
            "-j",
            "-4",
            "addr",
            "show",
            "dev",
            net::VIP_IF,
        ],
    );
    serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| {
            v.get(0)?["addr_info"].as_array().map(|a| {
                a.iter()
                    .filter_map(|i| i["local"].as_str()?.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// `ip -n clb-node <args>`; an error when it fails.
pub(super) fn node_ip(args: &[&str]) -> Result<()> {
    let ok = Command::new("ip")
        .args(["-n", net::NS_NODE])
        .args(args)
        .status()?
        .success();
    if !ok {
        anyhow::bail!("ip -n {} {args:?} failed", net::NS_NODE);
    }
    Ok(())
}

/// `ip -n clb-node -batch <file>`: many address changes in one call.
pub(super) fn node_ip_batch(file: &Path) -> Result<()> {
    node_ip(&["-batch", &file.display().to_string()])
}

/// The ifindex of `name` in clb-node, None while it is absent.
pub(super) fn node_ifindex(name: &str) -> Option<u64> {
    let out = Command::new("ip")
        .args(["-n", net::NS_NODE, "-j", "link", "show", name])
        .output()
        .ok()?;
    serde_json::from_slice::<serde_json::Value>(&out.stdout).ok()?[0]["ifindex"].as_u64()
}

/// What [`probe_health`] saw: each `/healthz` answer (status, milliseconds) and the agent's
/// peak thread count and peak RSS.
pub(super) struct HealthProbes {
    pub probes: Vec<(Option<u16>, f64)>,
    pub threads: u64,
    pub rss: u64,
}

/// Asks `addr` for `/healthz` every 100 ms until `deadline` (in the calling thread's
/// namespace), noting the agent `pid`'s peak threads and RSS meanwhile.
pub(super) fn probe_health(addr: &str, pid: i32, deadline: Instant) -> HealthProbes {
    let mut seen = HealthProbes {
        probes: Vec::new(),
        threads: 0,
        rss: 0,
    };
    while Instant::now() < deadline {
        let t = Instant::now();
        let status = get(addr, "/healthz", Duration::from_secs(5));
        seen.probes.push((status, t.elapsed().as_secs_f64() * 1e3));
        seen.threads = seen.threads.max(proc_threads(pid));
        seen.rss = seen.rss.max(
            crate::bench::tools::proc_usage(pid)
                .map(|u| u.1)
                .unwrap_or(0),
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

impl HealthProbes {
    /// The milliseconds of the probes answered 200.
    pub fn answered_ms(&self) -> Vec<f64> {
        self.probes
            .iter()
            .filter(|(s, _)| *s == Some(200))
            .map(|(_, ms)| *ms)
            .collect()
    }

    /// How many probes went unanswered (not 200), and how many answered took over 1 s.
    pub fn missed_and_slow(&self) -> (usize, usize) {
        let answered = self.answered_ms();
        let slow = answered.iter().filter(|ms| **ms > 1000.0).count();
        (self.probes.len() - answered.len(), slow)
    }
}
