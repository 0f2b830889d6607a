//! Part 9 (`--only scale`): the service table at cluster scale. For each kube-proxy mode
//! (iptables on the nf_tables backend, nftables) and each size (`--scale-sizes`, Services with
//! one endpoint each and a NodePort for the first 2,000, the shape of chaos's scale row), the
//! agent is started twice: with the change-driven reader (the default) and with the old
//! timer-driven one (`--services-reader timer --services-every 5`, the old defaults) as the
//! baseline. Each start measures, in the bench node namespace:
//!
//! - ready: spawn to `/readyz` 200;
//! - CPU of the agent and its children (`iptables-save`, `nft`: utime + stime + cutime + cstime
//!   of the agent and of its live children, so a child counts inside the window) over windows of
//!   `--scale-window` seconds: rules unchanged; kube-proxy-like re-syncs each second with the
//!   content unchanged (iptables mode: `iptables-restore --noflush` of every KUBE chain;
//!   nftables mode: kube-proxy's partial sync, one Service's chains rewritten); re-syncs with
//!   one Service's endpoint changed per sync; iptables mode: kube-proxy >= 1.28's partial
//!   syncs. nftables rules are loaded in `nft -f` transactions of 2,000 Services (one
//!   transaction of 30,000 did not finish);
//! - freshness: a Service added (then removed, then added: three samples), from the commit
//!   returning to the agent's log line with the new count (`service table read ... services=`;
//!   its timestamp);
//! - read latency: `read_ms` of those lines (a full read that produced a new table);
//! - RSS: VmHWM (peak) at the end.
//!
//! The re-sync commands run in the bench's process, not the agent's: only the agent's cost is
//! measured. Plots (plotters, SVG) go to `benchmarks/scale-<mode>.svg`, linked from the section.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};

use super::{
    net,
    report::{Table, median},
    scale_api::{self, ScaleApi},
    scale_conntrack::Fill,
    tools::{Agent, clock_ticks_per_sec, pause},
};
pub use super::{
    scale_plot::plot,
    scale_rules::{
        iptables_partial, iptables_rules, ipvs_addr, ipvs_delete, ipvs_move, ipvs_rules,
        ipvs_service, nft_load, nft_partial,
    },
};

/// The old timer reader is measured up to this many Services: at 10,000 it already spends
/// 35-81% of a core, and beyond it one read outlasts its own 5 s period (it never idles), so
/// a larger size says nothing new about it and would only lengthen the run.
const BASELINE_MAX: usize = 10_000;
/// Samples of freshness per start.
const FRESHNESS_SAMPLES: usize = 3;
const TABLE_WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// kube-proxy's iptables mode (the nf_tables backend).
    Iptables,
    /// kube-proxy's nftables mode.
    Nftables,
    /// kube-proxy's IPVS mode (a kernel with IPVS: the VM tier, see `cargo xtask vm-test`).
    Ipvs,
}

/// What one `--only scale` run measures.
pub struct Plan<'a> {
    pub sizes: &'a [usize],
    pub modes: &'a [Mode],
    /// The old timer reader beside the change-driven one (up to [`BASELINE_MAX`] Services).
    pub baseline: bool,
    /// A row with the agent given API access: the fake API holding the same Services
    /// ([`super::scale_api`]).
    pub api: bool,
    /// Only the rows with API access.
    pub api_only: bool,
    /// What marks a new service table in the agent's log (any of them).
    pub table_patterns: &'a [String],
    /// Conntrack entries created in the bench namespace before each agent start
    /// ([`super::scale_conntrack`]).
    pub conntrack: usize,
    pub window: Duration,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    Change,
    Timer,
    /// The change-driven reader with API access (the fake API holding the same Services).
    Api,
}

impl Reader {
    pub fn name(self) -> &'static str {
        match self {
            Reader::Change => "on change",
            Reader::Timer => "timer 5 s (old)",
            Reader::Api => "on change, with the API",
        }
    }
}

/// One start's figures.
#[derive(Debug, Clone)]
pub struct Point {
    pub mode: Mode,
    pub reader: Reader,
    pub services: usize,
    pub ready_ms: f64,
    /// Percent of one core: rules unchanged, re-sync unchanged, re-sync one changed, partial
    /// sync one changed.
    pub cpu: [f64; 4],
    pub syncs: [usize; 3],
    pub fresh_ms: Vec<f64>,
    pub read_ms: Vec<f64>,
    pub rss_mib: f64,
    /// Conntrack entries in the namespace while the agent ran.
    pub conntrack: usize,
}

/// Re-sync `k` of a window (kube-proxy's, each second) of `n` Services in `mode`; `changed`:
/// Service `k` has its endpoint moved (and Service `k - 1`, moved by the previous one, is
/// back). iptables mode: a full restore of every KUBE chain (kube-proxy < 1.28, or its full
/// syncs); nftables mode: a partial sync of those Services (kube-proxy's nftables mode writes
/// only what changed; unchanged: Service `k` rewritten with the same content, as after an
/// update of its objects that does not change its rules).
fn resync(mode: Mode, n: usize, k: usize, changed: bool) -> Result<()> {
    let n1 = n.max(1);
    match mode {
        Mode::Iptables => apply_text(mode, n, iptables_rules(n, changed.then_some(k % n1))),
        Mode::Nftables if changed => apply_text(
            mode,
            n,
            nft_partial(&[((k + n1 - 1) % n1, false), (k % n1, true)], None),
        ),
        Mode::Nftables => apply_text(mode, n, nft_partial(&[(k % n1, false)], None)),
        // kube-proxy's IPVS sync sends nothing for an unchanged Service; the bench edits one
        // virtual server with its own settings (a netlink write that changes nothing).
        Mode::Ipvs if !changed => apply_text(
            mode,
            n,
            format!(
                "-E -t {}:80 -s rr\n",
                super::scale_rules::cluster_ip(k % n1)
            ),
        ),
        // Service k moved and left so (as the iptables partial syncs): back after n syncs.
        Mode::Ipvs => apply_text(
            mode,
            n,
            ipvs_move(k % n1, &node_ip(), (k / n1).is_multiple_of(2)),
        ),
    }
}

/// The first load of `n` Services' rules (nftables mode: the table recreated, then batches).
fn load(mode: Mode, n: usize) -> Result<()> {
    let t = Instant::now();
    match mode {
        Mode::Iptables => apply_text(mode, n, iptables_rules(n, None))?,
        Mode::Nftables => {
            for tx in nft_load(n) {
                apply_text(mode, n, tx)?;
            }
        }
        Mode::Ipvs => {
            // Best effort: a kernel with IPVS built in has no modules to load.
            let _ = Command::new("modprobe")
                .args(["-a", "ip_vs", "ip_vs_rr"])
                .output();
            let (addrs, ipvs) = ipvs_rules(n, &node_ip());
            ip_batch(&addrs)?;
            apply_text(mode, n, ipvs)?;
        }
    }
    eprintln!(
        "bench: scale   {} rules of {n} Services loaded in {:.1} s",
        mode.name(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A kube-proxy partial sync: Service `write` (re)written (`moved`: its endpoint the other
/// one), Service `delete` removed; the others untouched. `n`: Services after it.
fn apply_partial(
    mode: Mode,
    n: usize,
    write: Option<usize>,
    moved: bool,
    delete: Option<usize>,
) -> Result<()> {
    let text = match mode {
        Mode::Iptables => iptables_partial(n, write, moved, delete),
        Mode::Nftables => {
            let writes: Vec<(usize, bool)> = write.map(|i| (i, moved)).into_iter().collect();
            nft_partial(&writes, delete)
        }
        Mode::Ipvs => {
            let mut text = String::new();
            if let Some(i) = write {
                if i + 1 == n && delete.is_none() && !moved {
                    // A new Service: its ClusterIP bound, its virtual servers created.
                    ip_batch(&ipvs_addr("add", i))?;
                    text.push_str(&ipvs_service(i, &node_ip(), false));
                } else {
                    text.push_str(&ipvs_move(i, &node_ip(), moved));
                }
            }
            if let Some(i) = delete {
                text.push_str(&ipvs_delete(i, &node_ip()));
                apply_text(mode, n, std::mem::take(&mut text))?;
                return ip_batch(&ipvs_addr("del", i));
            }
            text
        }
    };
    apply_text(mode, n, text)
}

/// One commit of `text` (of `n` Services) in `mode`'s tool.
fn apply_text(mode: Mode, n: usize, text: String) -> Result<()> {
    let argv: &[&str] = match mode {
        Mode::Iptables => &["iptables-restore", "-w", "--noflush"],
        Mode::Nftables => &["nft", "-f", "-"],
        Mode::Ipvs => &["ipvsadm", "-R"],
    };
    crate::setup::feed(
        Command::new("ip")
            .args(["netns", "exec", net::NS_NODE])
            .args(argv),
        &text,
    )
    .with_context(|| format!("{argv:?} of {n} Services"))
}

/// The node address kube-proxy's IPVS mode puts NodePort virtual servers on.
fn node_ip() -> String {
    net::NODE_IP.to_string()
}

/// `ip -batch -` of `lines` in the node namespace.
fn ip_batch(lines: &str) -> Result<()> {
    crate::setup::feed(
        Command::new("ip").args(["-n", net::NS_NODE, "-batch", "-"]),
        lines,
    )
}

/// Removes what [`apply`] put in the node namespace (both modes).
fn clear() {
    let node = |argv: &[&str]| {
        let _ = Command::new("ip")
            .args(["netns", "exec", net::NS_NODE])
            .args(argv)
            .output();
    };
    node(&["iptables", "-w", "-t", "nat", "-F"]);
    node(&["iptables", "-w", "-t", "nat", "-X"]);
    node(&["nft", "delete", "table", "ip", "kube-proxy"]);
    node(&["ipvsadm", "-C"]);
    // The ClusterIPs only: kube-ipvs0 also holds the bench's VIP.
    node(&[
        "ip",
        "-4",
        "addr",
        "flush",
        "dev",
        net::VIP_IF,
        "to",
        "10.96.0.0/12",
    ]);
}

struct Clear;
impl Drop for Clear {
    fn drop(&mut self) {
        clear();
    }
}

/// utime + stime + cutime + cstime of `pid` and of its live descendants, in clock ticks.
///
/// A child counts in its parent's cutime only once reaped: an `nft -j` of 30,000 Services runs
/// 35 s, longer than a window, and would count in none. Adding the live descendants' own
/// ticks at both ends of a window counts each child's share inside it (one reaped during the
/// window adds its whole life to cutime, minus the part counted live at the start).
fn cpu_ticks(pid: i32) -> Result<u64> {
    let mut total = stat_ticks(pid)?;
    let mut pending = children(pid);
    while let Some(child) = pending.pop() {
        // Gone since listed: counted in its parent's cutime instead.
        total += stat_ticks(child).unwrap_or(0);
        pending.extend(children(child));
    }
    Ok(total)
}

fn stat_ticks(pid: i32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("/proc/pid/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let mut t = 0;
    for v in f.get(11..15).context("/proc/pid/stat fields")? {
        t += v.parse::<i64>()?.max(0) as u64;
    }
    Ok(t)
}

/// The children of every thread of `pid` (`/proc/PID/task/TID/children`).
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

fn vm_hwm_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Seconds since midnight UTC now (the agent's log timestamps are UTC).
fn now_of_day() -> f64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    t % 86_400.0
}

/// The agent's log lines that say it has a new service table: the dataplane reader's, and
/// the line the agent logs when it takes the table from the API.
pub const TABLE_PATTERNS: [&str; 2] = ["service table read", "service table from the API"];

/// A line of the agent's log that contains one of `patterns` and a `services=` field:
/// (seconds of day, services, read ms).
pub fn parse_table_line(line: &str, patterns: &[String]) -> Option<(f64, usize, Option<f64>)> {
    if !patterns.iter().any(|p| line.contains(p.as_str())) {
        return None;
    }
    let ts = line.split_whitespace().next()?;
    let time = ts.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_string)
    };
    let services = field("services=")?.parse().ok()?;
    let read_ms = field("read_ms=").and_then(|v| v.parse().ok());
    Some((h * 3600.0 + m * 60.0 + s, services, read_ms))
}

/// The agent's log in `work`, read for its table lines.
#[derive(Clone, Copy)]
struct TableLog<'a> {
    work: &'a Path,
    patterns: &'a [String],
    mode: Mode,
}

impl TableLog<'_> {
    /// Whether a table of `logged` entries is the table of `services` Services: the agent's
    /// IPVS table counts virtual servers, so a Service with a NodePort is two there (a table
    /// taken from the API counts Services).
    fn is_count(&self, logged: usize, services: usize) -> bool {
        logged == services
            || (self.mode == Mode::Ipvs
                && logged == services + services.min(super::scale_rules::NODEPORTS))
    }

    fn lines(&self) -> Vec<(f64, usize, Option<f64>)> {
        std::fs::read_to_string(self.work.join("agent.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| parse_table_line(l, self.patterns))
            .collect()
    }

    /// Waits for a table line of `services` Services stamped after `after` (seconds of day).
    fn wait(&self, services: usize, after: f64) -> Result<(f64, Option<f64>)> {
        self.wait_for(services, after, TABLE_WAIT)
    }

    fn wait_for(&self, services: usize, after: f64, wait: Duration) -> Result<(f64, Option<f64>)> {
        let t = Instant::now();
        loop {
            if let Some((at, _, read)) = self
                .lines()
                .into_iter()
                .find(|(at, n, _)| self.is_count(*n, services) && *at >= after)
            {
                return Ok((at, read));
            }
            if t.elapsed() > wait {
                bail!(
                    "no service table of {services} Services in the agent's log after {wait:?} \
                     (lines matching {:?})",
                    self.patterns
                );
            }
            pause(Duration::from_millis(10))?;
        }
    }
}

/// CPU % of one core of `pid` (and its reaped children) while `during` runs.
fn cpu_during(
    pid: i32,
    window: Duration,
    mut during: impl FnMut(usize) -> Result<()>,
) -> Result<(f64, usize)> {
    let hz = clock_ticks_per_sec() as f64;
    let before = cpu_ticks(pid)?;
    let t = Instant::now();
    let mut k = 0;
    while t.elapsed() < window {
        let tick = Instant::now();
        during(k)?;
        k += 1;
        let spent = tick.elapsed();
        if spent < Duration::from_secs(1) {
            pause((Duration::from_secs(1) - spent).min(window.saturating_sub(t.elapsed())))?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    Ok((
        cpu_ticks(pid)?.saturating_sub(before) as f64 / hz / secs * 100.0,
        k,
    ))
}

/// One start: the rules of `n` Services loaded, the agent started with `reader`, measured.
fn point(
    probe: &Path,
    work: &Path,
    port: u16,
    mode: Mode,
    reader: Reader,
    n: usize,
    plan: &Plan,
) -> Result<Point> {
    let window = plan.window;
    let log = TableLog {
        work,
        patterns: plan.table_patterns,
        mode,
    };
    clear();
    load(mode, n)?;
    let api = match reader {
        Reader::Api => Some(ScaleApi::start(work, n)?),
        _ => None,
    };
    let conntrack = match plan.conntrack {
        0 => None,
        count => Some(Fill::new(count, n)?),
    };
    let kubeconfig = api
        .as_ref()
        .map(|a| a.kubeconfig().display().to_string())
        .unwrap_or_default();
    let env: Vec<(&str, &str)> = match reader {
        Reader::Change => vec![],
        Reader::Timer => vec![
            ("CLB_PROBE_SERVICES_READER", "timer"),
            ("CLB_PROBE_SERVICES_EVERY", "5"),
        ],
        Reader::Api => vec![
            ("CLB_PROBE_KUBECONFIG", kubeconfig.as_str()),
            ("NODE_NAME", scale_api::NODE_NAME),
        ],
    };
    // With the API, the agent's own modules at info too: the line of a table taken from the
    // API may come from either.
    let filter = match reader {
        Reader::Api => "warn,clb_probe::agent=info,clb_probe::kube=info",
        _ => "warn,clb_probe::agent::services=info",
    };
    let spawned = Instant::now();
    let agent = Agent::start_in(net::NS_NODE, probe, work, port, filter, &env)?;
    let pid = agent.pid();
    let ready_ms = agent.startup.as_secs_f64() * 1e3;
    log.wait(n, 0.0)?;
    // The first table's time (issue #52: 79 s at 30,000 Services without the API), for a
    // before/after by hand; it is no column of the section.
    eprintln!(
        "bench: scale   {} {n} Services, {}: first table {:.0} ms after the spawn",
        mode.name(),
        reader.name(),
        spawned.elapsed().as_secs_f64() * 1e3
    );
    pause(Duration::from_secs(1))?;
    let (idle, _) = cpu_during(pid, window, |_| Ok(()))?;
    // kube-proxy >= 1.28 writes only what changed (and its two top chains). Measured before
    // the full restores: a full restore not yet read is read whole, and the partial syncs
    // behind it wait for that read (its duty gap) instead of being read on their own.
    let (partial, syncs_partial) = match mode {
        Mode::Iptables => cpu_during(pid, window, |k| {
            apply_partial(
                mode,
                n,
                Some(k % n.max(1)),
                (k / n.max(1)).is_multiple_of(2),
                None,
            )
        })?,
        // Its re-sync columns already are kube-proxy's partial syncs (IPVS: per-Service
        // netlink writes).
        Mode::Nftables | Mode::Ipvs => (f64::NAN, 0),
    };
    let (same, syncs_same) = cpu_during(pid, window, |k| resync(mode, n, k, false))?;
    let (changed, syncs_changed) = cpu_during(pid, window, |k| resync(mode, n, k, true))?;
    // Back to the base content, read (a full restore: at 10,000 Services up to 30 s behind the
    // last whole read), then Services added and removed as kube-proxy's partial syncs do.
    match mode {
        Mode::Iptables => resync(mode, n, 0, false)?,
        Mode::Nftables => {
            let last = syncs_changed.saturating_sub(1) % n.max(1);
            apply_text(mode, n, nft_partial(&[(last, false)], None))?
        }
        // The Services the changed window moved (and left so), moved back.
        Mode::Ipvs => {
            let moved: String = (0..syncs_changed.min(n))
                .map(|i| ipvs_move(i, &node_ip(), false))
                .collect();
            if !moved.is_empty() {
                apply_text(mode, n, moved)?;
            }
        }
    }
    // Best effort: when the agent's last table already was the base content, no new table
    // is logged (MAX_GAP is 30 s).
    let _ = log.wait_for(n, now_of_day(), Duration::from_secs(35));
    pause(Duration::from_secs(1))?;
    pause(Duration::from_secs(2))?;
    let fresh_ms = match &api {
        None => fresh_from_rules(mode, n, log)?,
        Some(api) => fresh_from_api(mode, n, log, api)?,
    };
    let read_ms = log.lines().into_iter().filter_map(|(_, _, r)| r).collect();
    let rss_mib = vm_hwm_mib(pid);
    drop(agent);
    let conntrack = conntrack.map_or(0, |c| c.entries);
    Ok(Point {
        mode,
        reader,
        services: n,
        ready_ms,
        cpu: [idle, same, changed, partial],
        syncs: [syncs_same, syncs_changed, syncs_partial],
        fresh_ms,
        read_ms,
        rss_mib,
        conntrack,
    })
}

/// Freshness without the API: a Service added (then removed, then added) by a kube-proxy
/// partial sync, from the commit returning to the agent's table line with the new count.
fn fresh_from_rules(mode: Mode, n: usize, log: TableLog) -> Result<Vec<f64>> {
    let mut fresh_ms = Vec::new();
    for s in 0..FRESHNESS_SAMPLES {
        let count = if s % 2 == 0 { n + 1 } else { n };
        if count > n {
            apply_partial(mode, count, Some(n), false, None)?;
        } else {
            apply_partial(mode, count, None, false, Some(n))?;
        }
        let committed = now_of_day();
        let (seen, _) = log.wait(count, committed)?;
        fresh_ms.push((seen - committed) * 1e3);
    }
    Ok(fresh_ms)
}

/// Freshness with the API: a Service added, its EndpointSlice changed (its endpoint moved),
/// the Service removed; each from the API's change to the agent's table line. After each
/// change the bench commits the rules kube-proxy would (a partial sync), as kube-proxy does
/// after it: an agent that still takes its table from the dataplane sees it there, one that
/// takes it from the API does not wait for it.
fn fresh_from_api(mode: Mode, n: usize, log: TableLog, api: &ScaleApi) -> Result<Vec<f64>> {
    let mut fresh_ms = Vec::new();
    for step in 0..3 {
        let changed = now_of_day();
        // The API change, then the rules kube-proxy writes for it; the Services after it.
        let count = match step {
            0 => {
                api.add(n);
                apply_partial(mode, n + 1, Some(n), false, None)?;
                n + 1
            }
            1 => {
                api.move_endpoint(n, true);
                apply_partial(mode, n + 1, Some(n), true, None)?;
                n + 1
            }
            _ => {
                api.remove(n);
                apply_partial(mode, n, None, false, Some(n))?;
                n
            }
        };
        // A change the agent's table does not show (an endpoint, for a table without them)
        // is said and left out, not the whole row.
        match log.wait(count, changed) {
            Ok((seen, _)) => fresh_ms.push((seen - changed) * 1e3),
            Err(e) => eprintln!("bench: scale   a freshness sample left out: {e:#}"),
        }
    }
    Ok(fresh_ms)
}

/// Every point: for each mode and size, the change-driven reader then the timer baseline.
pub fn measure(probe: &Path, work: &Path, port: u16, plan: &Plan) -> Result<Vec<Point>> {
    let _clear = Clear;
    let mut points = Vec::new();
    let mut failed = Vec::new();
    for &mode in plan.modes {
        for &n in plan.sizes {
            for reader in [Reader::Change, Reader::Api, Reader::Timer] {
                if (reader == Reader::Timer && !plan.baseline)
                    || (reader == Reader::Api && !plan.api)
                    || (reader != Reader::Api && plan.api_only)
                {
                    continue;
                }
                if reader == Reader::Timer && n > BASELINE_MAX {
                    eprintln!(
                        "bench: scale, {} mode, {n} Services: the old reader is not measured \
                         above {BASELINE_MAX} (its reads outlast its own 5 s period there)",
                        mode.name()
                    );
                    continue;
                }
                eprintln!(
                    "bench: scale, {} mode, {n} Services, reader {}",
                    mode.name(),
                    reader.name()
                );
                // One start that fails (a table that never came within the wait) is said and
                // left out: the other rows of a half-hour run still count.
                match point(probe, work, port, mode, reader, n, plan) {
                    Ok(p) => {
                        eprintln!("bench: scale   {p:?}");
                        points.push(p);
                    }
                    Err(e) => {
                        eprintln!("bench: scale   FAILED: {e:#}");
                        failed.push(format!("{} {n} {}: {e:#}", mode.name(), reader.name()));
                    }
                }
            }
        }
    }
    if points.is_empty() {
        bail!("every scale start failed: {}", failed.join("; "));
    }
    for f in &failed {
        eprintln!("bench: scale: left out of the tables: {f}");
    }
    Ok(points)
}

fn fmt_ms(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0} (max {:.0})", median(v), max)
}

/// One table per mode (sections 9 and 9b) and the summary lines.
pub fn tables(
    points: &[Point],
    window: Duration,
    plots: &[(Mode, String)],
    summary: &mut Vec<(String, String)>,
) -> Vec<Table> {
    let mut out = Vec::new();
    for (mode, key, title) in [
        (
            Mode::Iptables,
            "9",
            "9. Service table at cluster scale: kube-proxy iptables mode (nf_tables backend)",
        ),
        (
            Mode::Nftables,
            "9b",
            "9b. Service table at cluster scale: kube-proxy nftables mode",
        ),
        (
            Mode::Ipvs,
            "9d",
            "9d. Service table at cluster scale: kube-proxy IPVS mode (VM tier)",
        ),
    ] {
        let _ = key;
        // A mode not measured in this run keeps its section as it was.
        if !points.iter().any(|p| p.mode == mode) {
            continue;
        }
        let mut t = Table::new(
            title,
            &[
                "Services",
                "reader",
                "ready, ms",
                "CPU idle, % core",
                "CPU re-sync unchanged, %",
                "CPU re-sync 1 changed, %",
                "CPU partial sync 1 changed, %",
                "read, ms (median, max)",
                "freshness, ms (median, max)",
                "RSS peak, MiB",
                "conntrack entries",
            ],
        );
        let plot = plots
            .iter()
            .find(|(m, _)| *m == mode)
            .map(|(_, p)| format!(" Plot: [{p}]({p})."))
            .unwrap_or_default();
        t.note = format!(
            "{} Services with one endpoint each, a NodePort for the first 2,000 ({} rules per \
             Service). Each row is one agent start: CPU of the agent and its children \
             (`iptables-save`, `nft`) over {} s windows: rules unchanged; {} {} Freshness: a \
             Service added or removed (a kube-proxy partial sync), from the commit to the \
             agent's log line of the new table ({FRESHNESS_SAMPLES} samples). Read: `read_ms` \
             of the reads that produced a new table. The baseline is the old reader \
             (`--services-reader timer --services-every 5`: a full read and parse every 5 s, \
             ready after the first read), measured up to {BASELINE_MAX} Services. RSS: VmHWM, \
             with the last column's conntrack entries in the namespace (ESTABLISHED TCP to \
             the ClusterIPs, created over ctnetlink before the start). Rows \"on change, with \
             the API\": the agent given test-support's fake API holding the same Services and \
             their EndpointSlices (with managedFields and kubectl's last-applied annotation, \
             as a cluster returns them); their freshness runs from the API change (a Service \
             added, its endpoint moved, the Service removed; the bench then commits the \
             partial sync kube-proxy would) to the agent's table line. The machine \
             (2 cores) is shared with other engineers' builds and tests: figures are \
             indicative, CPU% most of all.{plot}",
            mode.name(),
            match mode {
                Mode::Iptables => "7 nat",
                Mode::Nftables => "a map element and 2-3 chains",
                Mode::Ipvs => "a kube-ipvs0 address, 1-2 virtual servers with their real server",
            },
            window.as_secs(),
            match mode {
                Mode::Iptables =>
                    "a kube-proxy-like re-sync each second (a full `iptables-restore --noflush` \
                     of every KUBE chain, content unchanged); the same with one Service's \
                     endpoint changed per re-sync;",
                Mode::Nftables =>
                    "a re-sync each second as kube-proxy's nftables mode writes it, a partial \
                     sync (one Service's chains flushed and rewritten with the same content); \
                     the same with one Service's endpoint moved (its new endpoint chain, the old \
                     one deleted, the previous Service moved back);",
                Mode::Ipvs =>
                    "a re-sync each second as kube-proxy's IPVS mode writes one (per-Service \
                     netlink writes: one virtual server edited with its own settings); one \
                     Service's real server swapped per re-sync (the new added, the old deleted);",
            },
            match mode {
                Mode::Iptables =>
                    "a partial sync each second as kube-proxy >= 1.28 writes it \
                     (`KUBE-SERVICES` and `KUBE-NODEPORTS` rewritten whole, one Service's own \
                     chains rewritten with its endpoint moved, nothing else).",
                Mode::Nftables =>
                    "(no separate partial-sync column: the re-syncs already are partial). The \
                     table is loaded in `nft -f` transactions of 2,000 Services (one of 30,000 \
                     did not finish).",
                Mode::Ipvs =>
                    "(no partial-sync column). Rules: ClusterIPs bound to kube-ipvs0 (`ip \
                     -batch`), virtual and real servers (`ipvsadm -R`); kube-proxy's ipsets and \
                     iptables rules of IPVS mode left out. Run in the VM tier (QEMU, emulated \
                     CPU here): CPU and times are not comparable with 9 and 9b.",
            },
        );
        for p in points.iter().filter(|p| p.mode == mode) {
            t.rows.push(vec![
                p.services.to_string(),
                p.reader.name().into(),
                format!("{:.0}", p.ready_ms),
                format!("{:.1}", p.cpu[0]),
                format!("{:.1} ({} syncs)", p.cpu[1], p.syncs[0]),
                format!("{:.1} ({} syncs)", p.cpu[2], p.syncs[1]),
                if p.cpu[3].is_nan() {
                    "–".into()
                } else {
                    format!("{:.1} ({} syncs)", p.cpu[3], p.syncs[2])
                },
                fmt_ms(&p.read_ms),
                fmt_ms(&p.fresh_ms),
                format!("{:.0}", p.rss_mib),
                p.conntrack.to_string(),
            ]);
        }
        // The largest size's row with the API (what the DaemonSet runs), then the rules-only
        // reader's (a node without API access).
        for big in [Reader::Api, Reader::Change]
            .into_iter()
            .filter_map(|reader| {
                points
                    .iter()
                    .filter(|p| p.mode == mode && p.reader == reader)
                    .max_by_key(|p| p.services)
            })
        {
            let old = points.iter().find(|p| {
                p.mode == mode && p.reader == Reader::Timer && p.services == big.services
            });
            summary.push((
                format!(
                    "service table, {} mode, {} Services, {}",
                    mode.name(),
                    big.services,
                    big.reader.name()
                ),
                format!(
                    "CPU idle {:.1}% / re-sync unchanged {:.1}% / 1 changed {:.1}% / partial sync {} of a core (old reader: {}), freshness {} ms, ready {:.0} ms, RSS {:.0} MiB",
                    big.cpu[0],
                    big.cpu[1],
                    big.cpu[2],
                    if big.cpu[3].is_nan() { "–".to_string() } else { format!("{:.1}%", big.cpu[3]) },
                    old.map(|o| format!("{:.1}% / {:.1}% / {:.1}%, ready {:.0} ms", o.cpu[0], o.cpu[1], o.cpu[2], o.ready_ms))
                        .unwrap_or_else(|| "–".into()),
                    fmt_ms(&big.fresh_ms),
                    big.ready_ms,
                    big.rss_mib
                ),
            ));
        }
        out.push(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_agents_table_line() {
        let line = "2026-11-24T19:10:10.611351Z  INFO clb_probe::agent::services: service table read (change) source=Some(Iptables) services=2 nodeports=2 read_ms=40";
        let patterns: Vec<String> = TABLE_PATTERNS.map(String::from).to_vec();
        let (at, n, read) = parse_table_line(line, &patterns).unwrap();
        assert!((at - (19.0 * 3600.0 + 600.0 + 10.611351)).abs() < 1e-6);
        assert_eq!((n, read), (2, Some(40.0)));
        assert!(
            parse_table_line("2026-11-24T19:10:10Z INFO other line services=3", &patterns)
                .is_none()
        );
        // The line of a table taken from the API counts too, without a read time.
        let api = "2026-11-24T19:10:11.5Z  INFO clb_probe::agent::services: service table from the API services=30001";
        assert_eq!(parse_table_line(api, &patterns).unwrap().1, 30_001);
        assert!(parse_table_line(api, &["service table read".into()]).is_none());
    }

    #[test]
    fn a_resync_rewrites_the_same_rules_and_a_change_moves_one_endpoint() {
        let base = iptables_rules(3, None);
        assert_eq!(base, iptables_rules(3, None));
        let moved = iptables_rules(3, Some(1));
        let diff: Vec<_> = base
            .lines()
            .zip(moved.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(diff.len(), 3, "{diff:?}");
        let load = nft_load(2).concat();
        assert!(load.contains("10.96.0.2 . tcp . 80 : goto service-S0000001"));
        let (same, moved) = (
            nft_partial(&[(1, false)], None),
            nft_partial(&[(1, true)], None),
        );
        assert!(same.contains("dnat to 10.244.0.2:8080") && !same.contains("dnat to 10.245"));
        assert!(moved.contains("dnat to 10.245.0.2:8080"));
        // The chain of the endpoint it no longer has goes.
        assert!(moved.contains(
            "delete chain ip kube-proxy endpoint-E0000001-scale/svc-1/tcp/http__10.244.0.2/8080"
        ));
    }

    #[test]
    fn nftables_rules_come_in_batches_of_whole_services() {
        let txs = nft_load(4_500);
        // The table, then 2,000 + 2,000 + 500 Services.
        assert_eq!(txs.len(), 4);
        let svcs = |t: &str| t.matches("add chain ip kube-proxy service-S").count();
        assert_eq!(
            txs[1..].iter().map(|t| svcs(t)).collect::<Vec<_>>(),
            [2_000, 2_000, 500]
        );
        // A Service's chains and its map element commit together.
        assert!(txs[3].contains("10.96.17.250 . tcp . 80 : goto service-S0004499"));
        let partial = nft_partial(&[], Some(3));
        assert!(
            partial.contains("delete element ip kube-proxy service-ips { 10.96.0.4 . tcp . 80 }")
        );
    }

    #[test]
    fn ipvs_rules_are_kube_proxys_virtual_servers() {
        let (addrs, ipvs) = ipvs_rules(2_001, "10.200.0.2");
        assert_eq!(addrs.lines().count(), 2_001);
        assert!(addrs.starts_with("address add 10.96.0.1/32 dev kube-ipvs0\n"));
        // A ClusterIP virtual server for each, a NodePort one for the first 2,000.
        assert_eq!(ipvs.matches("-A -t 10.96.").count(), 2_001);
        assert_eq!(ipvs.matches("-A -t 10.200.0.2:").count(), 2_000);
        assert!(ipvs.contains("-a -t 10.96.0.1:80 -r 10.244.0.1:8080 -m -w 1\n"));
        let moved = ipvs_move(0, "10.200.0.2", true);
        assert!(moved.contains("-a -t 10.96.0.1:80 -r 10.245.0.1:8080 -m -w 1\n"));
        assert!(moved.contains("-d -t 10.200.0.2:30000 -r 10.244.0.1:8080\n"));
        assert_eq!(ipvs_delete(2_000, "10.200.0.2"), "-D -t 10.96.8.1:80\n");
    }
}
