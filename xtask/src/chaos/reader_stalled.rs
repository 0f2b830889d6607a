//! The event reader stopped (SIGSTOP) under a flood, in a cgroup with the DaemonSet's memory limit.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    observe::{blackhole_confirmed, suspects_vip},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self, BenchNet},
    tools::{Agent, RawSender, pause, proc_usage, trafgen, trafgen_config},
};

/// The DaemonSet's memory limit (deploy/helm/clb-probe/values.yaml, `resources.limits`).
const DAEMONSET_MEMORY_LIMIT_MIB: u64 = 256;

/// A memory cgroup (v1 or v2) nested under this process's own, removed on drop.
struct MemCgroup {
    dir: PathBuf,
    /// The cgroup this process was in (where the calling thread goes back to).
    base: PathBuf,
    v2: bool,
}

impl MemCgroup {
    fn new(limit_bytes: u64) -> Result<MemCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup")?;
        let (base, v2) = if let Some(p) = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
        {
            (PathBuf::from(format!("/sys/fs/cgroup/memory{p}")), false)
        } else {
            let p = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .context("no memory cgroup")?;
            (PathBuf::from(format!("/sys/fs/cgroup{p}")), true)
        };
        let dir = base.join(format!("clb-chaos-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let cg = MemCgroup { dir, base, v2 };
        if v2 {
            cg.write("memory.max", &limit_bytes.to_string())?;
        } else {
            cg.write("memory.limit_in_bytes", &limit_bytes.to_string())?;
        }
        Ok(cg)
    }

    /// Starts `f`'s children in the cgroup, so everything the agent allocates from its first
    /// page is charged there. cgroup v1 moves the calling thread alone (its children follow
    /// it); v2 cannot, so there the child is moved after `f` (charges before that stay out).
    fn spawn_in<T>(&self, f: impl FnOnce() -> Result<T>, pid_of: impl Fn(&T) -> i32) -> Result<T> {
        if self.v2 {
            let t = f()?;
            self.write("cgroup.procs", &pid_of(&t).to_string())?;
            return Ok(t);
        }
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() }.to_string();
        self.write("tasks", &tid)?;
        let t = f();
        std::fs::write(self.base.join("tasks"), &tid).context("leaving the chaos cgroup")?;
        t
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        std::fs::write(self.dir.join(file), value)
            .with_context(|| format!("writing {value} to {}", self.dir.join(file).display()))
    }

    fn read_u64(&self, file: &str, key: Option<&str>) -> u64 {
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        match key {
            None => text.trim().parse().unwrap_or(0),
            Some(k) => text
                .lines()
                .find_map(|l| l.strip_prefix(k).map(|v| v.trim().parse().unwrap_or(0)))
                .unwrap_or(0),
        }
    }

    /// (peak bytes, OOM kills).
    fn peak_and_ooms(&self) -> (u64, u64) {
        if self.v2 {
            (
                self.read_u64("memory.peak", None),
                self.read_u64("memory.events", Some("oom_kill ")),
            )
        } else {
            (
                self.read_u64("memory.max_usage_in_bytes", None),
                self.read_u64("memory.oom_control", Some("oom_kill ")),
            )
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Empty once the agent has exited (it is stopped before this drops).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("chaos: could not remove {}", self.dir.display());
    }
}

/// `clbprobe_events_suppressed_total` by stage.
fn suppressed_by_stage(metrics: &str) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix("clbprobe_events_suppressed_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let stage = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("stage=\""))
            .map(|s| s.trim_end_matches(['"', '}']).to_string())
            .unwrap_or_default();
        *out.entry(stage).or_insert(0) += value.parse::<f64>().map_or(0, |v| v as u64);
    }
    out
}

/// The event reader stopped (SIGSTOP) during a spoofed flood, in a cgroup with the
/// DaemonSet's memory limit: suppression counted by stage, the kernel's suspect counter equal
/// to the packets the NIC received, the agent answering and confirming again after SIGCONT.
pub(super) fn reader_stalled(
    bench_net: &BenchNet,
    probe: &Path,
    work: &Path,
    stall: Duration,
) -> Result<Row> {
    let conf = work.join("stall-flood.cfg");
    std::fs::write(&conf, trafgen_config(bench_net, 0, Some(net::VIP)))?;
    let cgroup = MemCgroup::new(DAEMONSET_MEMORY_LIMIT_MIB << 20)?;
    let agent = cgroup.spawn_in(|| Agent::start(probe, work, METRICS_PORT), Agent::pid)?;
    let mut problems = Vec::new();
    let m0 = agent.metrics().unwrap_or_default();
    let (rx0, sus0, sup0) = (
        bench_net.nic_rx_packets()?,
        suspects_vip(&agent),
        suppressed_by_stage(&m0),
    );
    let mut flood = trafgen(&conf)?;
    pause(Duration::from_secs(1))?;
    // SAFETY: our own child.
    unsafe { libc::kill(agent.pid(), libc::SIGSTOP) };
    pause(stall)?;
    // SAFETY: as above.
    unsafe { libc::kill(agent.pid(), libc::SIGCONT) };
    let resumed = Instant::now();
    let addr = format!("127.0.0.1:{METRICS_PORT}");
    let healthy_after = loop {
        if let Some((200, _)) = test_support::lab::http_get_in(net::NS_NODE, &addr, "/healthz") {
            break Some(resumed.elapsed());
        }
        if resumed.elapsed() > Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if healthy_after.is_none() {
        problems.push("/healthz not answered within 10 s of SIGCONT".to_string());
    }
    pause(Duration::from_secs(1))?;
    flood.stop();
    pause(Duration::from_millis(500))?;
    let m1 = agent.metrics().unwrap_or_default();
    let (rx1, sus1, sup1) = (
        bench_net.nic_rx_packets()?,
        suspects_vip(&agent),
        suppressed_by_stage(&m1),
    );
    let (received, counted) = (rx1 - rx0, sus1.saturating_sub(sus0));
    // Exact, bar the odd packet that is not the flood's (neighbour discovery on the veth).
    if counted > received || received - counted > 10 {
        problems.push(format!(
            "{counted} suspects counted for {received} packets received"
        ));
    }
    let suppressed: Vec<String> = sup1
        .iter()
        .map(|(stage, n)| format!("{stage} {}", n - sup0.get(stage).copied().unwrap_or(0)))
        .collect();
    if sup1.values().sum::<u64>() <= sup0.values().sum::<u64>() {
        problems.push("nothing counted as suppressed during the stall".into());
    }
    // Recovered: a health check from the VIP is confirmed after the stall (a new NodePort
    // each try, up to 5 tries 2 s apart: the backlog and the budget may hold the first).
    let sender = RawSender::new(net::NS_TX)?;
    let recovered = Instant::now();
    let mut tries = 0;
    let confirmed = (0..5u16).any(|attempt| {
        tries += 1;
        let port = 32100 + attempt;
        if sender
            .syn(net::VIP, 42100 + attempt, net::NODE_IP, port)
            .is_err()
        {
            return false;
        }
        blackhole_confirmed(&agent, port, Duration::from_secs(2))
    });
    let recovered = recovered.elapsed();
    if !confirmed {
        problems.push("no health check confirmed in 5 tries after the stall".into());
    }
    let rss = proc_usage(agent.pid()).map(|u| u.2).unwrap_or(0);
    let (peak, ooms) = cgroup.peak_and_ooms();
    if ooms > 0 {
        problems.push(format!("{ooms} OOM kill(s) in the cgroup"));
    }
    drop(agent);
    drop(cgroup);
    Ok(Row {
        fault: format!(
            "event reader stopped (SIGSTOP) for {} s during a spoofed flood, in a memory cgroup limited to the DaemonSet's {DAEMONSET_MEMORY_LIMIT_MIB} MiB",
            stall.as_secs()
        ),
        checked: "suppression counted by stage; the kernel's suspect counter equals the packets the NIC received; /healthz answers after SIGCONT; a later health check is confirmed (a new one every 2 s, up to 5); no OOM kill".into(),
        figure: format!(
            "{received} flood packets, {counted} counted; suppressed by stage: {}; /healthz {} ms after SIGCONT; a health check confirmed on try {tries} ({:.1} s after the flood); agent peak RSS {} MiB, cgroup peak {} MiB of {DAEMONSET_MEMORY_LIMIT_MIB}",
            suppressed.join(", "),
            healthy_after.map_or("-".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3)),
            recovered.as_secs_f64(),
            rss / 1024,
            peak >> 20,
        ),
        verdict: if problems.is_empty() {
            Ok("nothing lost".into())
        } else {
            Err(problems.join("; "))
        },
    })
}
