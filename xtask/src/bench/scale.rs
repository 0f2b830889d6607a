//! Part 9 (`--only scale`): the service table at cluster scale. For each kube-proxy mode
//! (iptables on the nf_tables backend, nftables) and each size (`--scale-sizes`, Services with
//! one endpoint each and a NodePort for the first 2,000, the shape of chaos's scale row), the
//! agent is started twice: with the change-driven reader (the default) and with the old
//! timer-driven one (`--services-reader timer --services-every 5`, the old defaults) as the
//! baseline. Each start measures, in the bench node namespace:
//!
//! - ready: spawn to `/readyz` 200;
//! - CPU of the agent and its children (`iptables-save`, `nft`: utime + stime + cutime + cstime
//!   of the agent, so a child counts when it is reaped) over three windows of
//!   `--scale-window` seconds: rules unchanged; kube-proxy-like re-syncs each second with the
//!   content unchanged (`iptables-restore --noflush` of every KUBE chain / `flush table` and the
//!   whole `ip kube-proxy` table in one `nft -f` transaction); re-syncs with one Service's
//!   endpoint changed per sync;
//! - freshness: a Service added (then removed, then added: three samples), from the commit
//!   returning to the agent's log line with the new count (`service table read ... services=`;
//!   its timestamp);
//! - read latency: `read_ms` of those lines (a full read that produced a new table);
//! - RSS: VmHWM (peak) at the end.
//!
//! The re-sync commands run in the bench's process, not the agent's: only the agent's cost is
//! measured. Plots (plotters, SVG) go to `benchmarks/scale-<mode>.svg`, linked from the section.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};

use super::{
    net,
    report::{Table, median},
    tools::{Agent, clock_ticks_per_sec, pause},
};

const NODEPORTS: usize = 2_000;
/// Samples of freshness per start.
const FRESHNESS_SAMPLES: usize = 3;
const TABLE_WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    Change,
    Timer,
}

impl Reader {
    fn name(self) -> &'static str {
        match self {
            Reader::Change => "on change",
            Reader::Timer => "timer 5 s (old)",
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
    /// sync one changed (iptables mode; NaN in nftables mode).
    pub cpu: [f64; 4],
    pub syncs: [usize; 3],
    pub fresh_ms: Vec<f64>,
    pub read_ms: Vec<f64>,
    pub rss_mib: f64,
}

fn cluster_ip(i: usize) -> String {
    format!("10.{}.{}.{}", 96 + i / 62_500, i / 250 % 250, i % 250 + 1)
}

fn backend(i: usize, changed: bool) -> String {
    format!(
        "10.{}.{}.{}",
        if changed { 245 } else { 244 },
        i / 250 % 250,
        i % 250 + 1
    )
}

/// kube-proxy's nat chains for `n` Services as one `iptables-restore --noflush` input: every
/// chain is declared, so applying it again replaces the chains with the same content (a
/// kube-proxy full re-sync). `changed`: that Service's endpoint moved.
pub fn iptables_rules(n: usize, changed: Option<usize>) -> String {
    let mut s = String::with_capacity(n * 700);
    s.push_str(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    for i in 0..n {
        s.push_str(&service_chain_decls(i));
    }
    s.push_str(
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    for i in 0..n {
        s.push_str(&service_rules(i));
        s.push_str(&service_chain_rules(i, changed == Some(i)));
    }
    s.push_str(NODEPORTS_JUMP);
    s.push_str("COMMIT\n");
    s
}

/// A kube-proxy >= 1.28 partial sync of `n` Services as one `iptables-restore --noflush`
/// input: `KUBE-SERVICES` and `KUBE-NODEPORTS` rewritten whole (kube-proxy writes them on
/// every sync), the chains of Service `write` (re)written (its endpoint moved when `moved`),
/// the chains of Service `delete` deleted; every other chain untouched.
pub fn iptables_partial(
    n: usize,
    write: Option<usize>,
    moved: bool,
    delete: Option<usize>,
) -> String {
    let mut s = String::with_capacity(n * 200);
    s.push_str("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n");
    for i in write.into_iter().chain(delete) {
        s.push_str(&service_chain_decls(i));
    }
    for i in 0..n {
        s.push_str(&service_rules(i));
    }
    s.push_str(NODEPORTS_JUMP);
    if let Some(i) = write {
        s.push_str(&service_chain_rules(i, moved));
    }
    if let Some(i) = delete {
        s.push_str(&format!(
            "-X KUBE-SVC-CLBSCALE{i:07}\n-X KUBE-SEP-CLBSCALE{i:07}\n"
        ));
        if i < NODEPORTS {
            s.push_str(&format!("-X KUBE-EXT-CLBSCALE{i:07}\n"));
        }
    }
    s.push_str("COMMIT\n");
    s
}

const NODEPORTS_JUMP: &str = "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n";

/// Service `i`'s own chains, declared (a declaration flushes an existing chain).
fn service_chain_decls(i: usize) -> String {
    let mut s = format!(":KUBE-SVC-CLBSCALE{i:07} - [0:0]\n:KUBE-SEP-CLBSCALE{i:07} - [0:0]\n");
    if i < NODEPORTS {
        s.push_str(&format!(":KUBE-EXT-CLBSCALE{i:07} - [0:0]\n"));
    }
    s
}

/// Service `i`'s rules in `KUBE-SERVICES` and `KUBE-NODEPORTS`.
fn service_rules(i: usize) -> String {
    let (ip, name) = (cluster_ip(i), format!("scale/svc-{i}:http"));
    let mut s = format!(
        "-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport 80 -j KUBE-SVC-CLBSCALE{i:07}\n"
    );
    if i < NODEPORTS {
        s.push_str(&format!(
            "-A KUBE-NODEPORTS -p tcp -m comment --comment \"{name}\" -m tcp --dport {} -j KUBE-EXT-CLBSCALE{i:07}\n",
            30_000 + i
        ));
    }
    s
}

/// The rules of Service `i`'s own chains (`moved`: its endpoint is the other one).
fn service_chain_rules(i: usize, moved: bool) -> String {
    let name = format!("scale/svc-{i}:http");
    let b = backend(i, moved);
    let mut s = format!(
        "-A KUBE-SVC-CLBSCALE{i:07} -m comment --comment \"{name} -> {b}:8080\" -j KUBE-SEP-CLBSCALE{i:07}\n\
         -A KUBE-SEP-CLBSCALE{i:07} -s {b}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ\n\
         -A KUBE-SEP-CLBSCALE{i:07} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {b}:8080\n"
    );
    if i < NODEPORTS {
        s.push_str(&format!(
            "-A KUBE-EXT-CLBSCALE{i:07} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ\n\
             -A KUBE-EXT-CLBSCALE{i:07} -j KUBE-SVC-CLBSCALE{i:07}\n"
        ));
    }
    s
}

/// kube-proxy's `ip kube-proxy` table for `n` Services as one `nft -f` transaction that
/// replaces the table (created first when missing).
pub fn nft_rules(n: usize, changed: Option<usize>) -> String {
    let mut s = String::with_capacity(n * 600);
    // `flush table` keeps set and map elements: the table is deleted and written again, in
    // the same transaction (one commit, content unchanged when `changed` is None).
    s.push_str("add table ip kube-proxy\ndelete table ip kube-proxy\ntable ip kube-proxy {\n");
    s.push_str("\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n");
    if n > 0 {
        s.push_str("\t\telements = { ");
        for i in 0..n {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!(
                "{} . tcp . 80 : goto service-S{i:07}-scale/svc-{i}/tcp/http",
                cluster_ip(i)
            ));
        }
        s.push_str(" }\n");
    }
    s.push_str("\t}\n\tmap service-nodeports {\n\t\ttype inet_proto . inet_service : verdict\n");
    if n > 0 {
        s.push_str("\t\telements = { ");
        for i in 0..n.min(NODEPORTS) {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!(
                "tcp . {} : goto external-S{i:07}-scale/svc-{i}/tcp/http",
                30_000 + i
            ));
        }
        s.push_str(" }\n");
    }
    s.push_str(
        "\t}\n\tchain mark-for-masquerade {\n\t\tmeta mark set meta mark | 0x00004000\n\t}\n\
         \tchain masquerading {\n\t\tmeta mark & 0x00004000 == 0x00000000 return\n\t\tmeta mark set meta mark ^ 0x00004000\n\t\tmasquerade fully-random\n\t}\n\
         \tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t\tmeta l4proto . th dport vmap @service-nodeports\n\t}\n",
    );
    for i in 0..n {
        let b = backend(i, changed == Some(i));
        let ep = format!("endpoint-E{i:07}-scale/svc-{i}/tcp/http__{b}/8080");
        s.push_str(&format!(
            "\tchain service-S{i:07}-scale/svc-{i}/tcp/http {{\n\t\tip daddr {} tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n\t\tnumgen random mod 1 vmap {{ 0 : goto {ep} }}\n\t}}\n\
             \tchain {ep} {{\n\t\tip saddr {b} jump mark-for-masquerade\n\t\tmeta l4proto tcp dnat to {b}:8080\n\t}}\n",
            cluster_ip(i)
        ));
        if i < NODEPORTS {
            s.push_str(&format!(
                "\tchain external-S{i:07}-scale/svc-{i}/tcp/http {{\n\t\tjump mark-for-masquerade\n\t\tgoto service-S{i:07}-scale/svc-{i}/tcp/http\n\t}}\n"
            ));
        }
    }
    s.push_str("}\n");
    s
}

/// The rules of `n` Services in `mode`, `changed` moved: one commit, applied now.
fn apply(mode: Mode, n: usize, changed: Option<usize>) -> Result<()> {
    let text = match mode {
        Mode::Iptables => iptables_rules(n, changed),
        Mode::Nftables => nft_rules(n, changed),
    };
    apply_text(mode, n, text)
}

/// One commit of `text` (of `n` Services) in `mode`'s tool.
fn apply_text(mode: Mode, n: usize, text: String) -> Result<()> {
    let argv: &[&str] = match mode {
        Mode::Iptables => &["iptables-restore", "-w", "--noflush"],
        Mode::Nftables => &["nft", "-f", "-"],
    };
    let mut child = Command::new("ip")
        .args(["netns", "exec", net::NS_NODE])
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {argv:?}"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{argv:?} of {n} Services failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
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
}

struct Clear;
impl Drop for Clear {
    fn drop(&mut self) {
        clear();
    }
}

/// utime + stime + cutime + cstime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("/proc/pid/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let mut t = 0;
    for v in f.get(11..15).context("/proc/pid/stat fields")? {
        t += v.parse::<i64>()?.max(0) as u64;
    }
    Ok(t)
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

/// A `service table read` line of the agent's log: (seconds of day, services, read ms).
pub fn parse_table_line(line: &str) -> Option<(f64, usize, Option<f64>)> {
    if !line.contains("service table read") {
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

fn table_lines(work: &Path) -> Vec<(f64, usize, Option<f64>)> {
    std::fs::read_to_string(work.join("agent.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(parse_table_line)
        .collect()
}

/// Waits for a table line of `services` Services stamped after `after` (seconds of day).
fn wait_table(work: &Path, services: usize, after: f64) -> Result<(f64, Option<f64>)> {
    let t = Instant::now();
    loop {
        if let Some((at, _, read)) = table_lines(work)
            .into_iter()
            .find(|(at, n, _)| *n == services && *at >= after)
        {
            return Ok((at, read));
        }
        if t.elapsed() > TABLE_WAIT {
            bail!(
                "no service table of {services} Services in the agent's log after {TABLE_WAIT:?}"
            );
        }
        pause(Duration::from_millis(10))?;
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
    Ok(((cpu_ticks(pid)? - before) as f64 / hz / secs * 100.0, k))
}

/// One start: the rules of `n` Services loaded, the agent started with `reader`, measured.
fn point(
    probe: &Path,
    work: &Path,
    port: u16,
    mode: Mode,
    reader: Reader,
    n: usize,
    window: Duration,
) -> Result<Point> {
    clear();
    apply(mode, n, None)?;
    let env: &[(&str, &str)] = match reader {
        Reader::Change => &[],
        Reader::Timer => &[
            ("CLB_PROBE_SERVICES_READER", "timer"),
            ("CLB_PROBE_SERVICES_EVERY", "5"),
        ],
    };
    let agent = Agent::start_with(
        probe,
        work,
        port,
        "warn,clb_probe::agent::services=info",
        env,
    )?;
    let pid = agent.pid();
    let ready_ms = agent.startup.as_secs_f64() * 1e3;
    wait_table(work, n, 0.0)?;
    pause(Duration::from_secs(1))?;
    let (idle, _) = cpu_during(pid, window, |_| Ok(()))?;
    let (same, syncs_same) = cpu_during(pid, window, |_| apply(mode, n, None))?;
    let (changed, syncs_changed) = cpu_during(pid, window, |k| apply(mode, n, Some(k % n.max(1))))?;
    // kube-proxy >= 1.28 writes only what changed (and its two top chains).
    let (partial, syncs_partial) = match mode {
        Mode::Iptables => cpu_during(pid, window, |k| {
            apply_text(
                mode,
                n,
                iptables_partial(
                    n,
                    Some(k % n.max(1)),
                    (k / n.max(1)).is_multiple_of(2),
                    None,
                ),
            )
        })?,
        Mode::Nftables => (f64::NAN, 0),
    };
    // Back to the base content, then Services added and removed (iptables mode: as kube-proxy
    // >= 1.28 does, a partial sync; nftables mode: the whole table).
    apply(mode, n, None)?;
    pause(Duration::from_secs(2))?;
    let mut fresh_ms = Vec::new();
    for s in 0..FRESHNESS_SAMPLES {
        let count = if s % 2 == 0 { n + 1 } else { n };
        match mode {
            Mode::Iptables if count > n => {
                apply_text(mode, count, iptables_partial(count, Some(n), false, None))?
            }
            Mode::Iptables => {
                apply_text(mode, count, iptables_partial(count, None, false, Some(n)))?
            }
            Mode::Nftables => apply(mode, count, None)?,
        }
        let committed = now_of_day();
        let (seen, _) = wait_table(work, count, committed)?;
        fresh_ms.push((seen - committed) * 1e3);
    }
    let read_ms = table_lines(work)
        .into_iter()
        .filter_map(|(_, _, r)| r)
        .collect();
    let rss_mib = vm_hwm_mib(pid);
    drop(agent);
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
    })
}

/// Every point: for each mode and size, the change-driven reader then the timer baseline.
pub fn measure(
    probe: &Path,
    work: &Path,
    port: u16,
    sizes: &[usize],
    window: Duration,
) -> Result<Vec<Point>> {
    let _clear = Clear;
    let mut points = Vec::new();
    for mode in [Mode::Iptables, Mode::Nftables] {
        for &n in sizes {
            for reader in [Reader::Change, Reader::Timer] {
                eprintln!(
                    "bench: scale, {} mode, {n} Services, reader {}",
                    mode.name(),
                    reader.name()
                );
                let p = point(probe, work, port, mode, reader, n, window)?;
                eprintln!("bench: scale   {p:?}");
                points.push(p);
            }
        }
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
    ] {
        let _ = key;
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
             (`iptables-save`, `nft`) over {} s windows: rules unchanged; a kube-proxy-like \
             re-sync each second (the whole rule set re-committed, content unchanged); a \
             re-sync each second with one Service's endpoint changed; {} Freshness: a Service \
             added or removed ({}), from the commit to the agent's log line of the new table \
             ({FRESHNESS_SAMPLES} samples). Read: `read_ms` of the reads that produced a new \
             table. The baseline is the old reader (`--services-reader timer --services-every \
             5`: a full read and parse every 5 s, ready after the first read). The machine (2 \
             cores) is shared with other engineers' builds and tests: figures are indicative, \
             CPU% most of all.{plot}",
            mode.name(),
            match mode {
                Mode::Iptables => "7 nat",
                Mode::Nftables => "a map element and 2-3 chains",
            },
            window.as_secs(),
            match mode {
                Mode::Iptables =>
                    "a partial sync each second as kube-proxy >= 1.28 writes it \
                     (`KUBE-SERVICES` and `KUBE-NODEPORTS` rewritten whole, one Service's own \
                     chains rewritten with its endpoint moved, nothing else).",
                Mode::Nftables => "(no partial-sync column: this reader reads the table whole).",
            },
            match mode {
                Mode::Iptables => "a kube-proxy >= 1.28 partial sync",
                Mode::Nftables => "the whole table re-committed",
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
            ]);
        }
        if let Some(big) = points
            .iter()
            .filter(|p| p.mode == mode && p.reader == Reader::Change)
            .max_by_key(|p| p.services)
        {
            let old = points.iter().find(|p| {
                p.mode == mode && p.reader == Reader::Timer && p.services == big.services
            });
            summary.push((
                format!("service table, {} mode, {} Services", mode.name(), big.services),
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

/// One SVG per mode: CPU, read latency, freshness and RSS against Services (log scale), the
/// change-driven reader beside the timer baseline. Returns each mode's path relative to `root`.
pub fn plot(points: &[Point], root: &Path) -> Result<Vec<(Mode, String)>> {
    use plotters::prelude::*;
    let dir = root.join("benchmarks");
    std::fs::create_dir_all(&dir)?;
    let mut out = Vec::new();
    for mode in [Mode::Iptables, Mode::Nftables] {
        let ps: Vec<&Point> = points.iter().filter(|p| p.mode == mode).collect();
        if ps.is_empty() {
            continue;
        }
        let rel = format!("benchmarks/scale-{}.svg", mode.name());
        let path = root.join(&rel);
        let area = SVGBackend::new(&path, (1100, 800)).into_drawing_area();
        area.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let area = area
            .titled(
                &format!("Service table at scale, kube-proxy {} mode", mode.name()),
                ("sans-serif", 22),
            )
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let panels = area.split_evenly((2, 2));
        let xmax = ps.iter().map(|p| p.services).max().unwrap_or(100) as f64 * 1.5;
        let xmin = ps.iter().map(|p| p.services).min().unwrap_or(100) as f64 / 1.5;
        type Series = (&'static str, Reader, fn(&Point) -> f64);
        let panels_spec: [(&str, Vec<Series>); 4] = [
            (
                "CPU, % of one core",
                vec![
                    ("idle, on change", Reader::Change, |p| p.cpu[0]),
                    ("re-sync unchanged, on change", Reader::Change, |p| p.cpu[1]),
                    ("re-sync 1 changed, on change", Reader::Change, |p| p.cpu[2]),
                    ("partial sync 1 changed, on change", Reader::Change, |p| {
                        p.cpu[3]
                    }),
                    ("idle, timer (old)", Reader::Timer, |p| p.cpu[0]),
                    ("re-sync unchanged, timer (old)", Reader::Timer, |p| {
                        p.cpu[1]
                    }),
                ],
            ),
            (
                "read latency, ms (median)",
                vec![
                    ("on change", Reader::Change, |p| median(&p.read_ms)),
                    ("timer (old)", Reader::Timer, |p| median(&p.read_ms)),
                ],
            ),
            (
                "freshness, ms (median)",
                vec![
                    ("on change", Reader::Change, |p| median(&p.fresh_ms)),
                    ("timer (old)", Reader::Timer, |p| median(&p.fresh_ms)),
                ],
            ),
            (
                "RSS peak, MiB",
                vec![
                    ("on change", Reader::Change, |p| p.rss_mib),
                    ("timer (old)", Reader::Timer, |p| p.rss_mib),
                ],
            ),
        ];
        let colors = [BLUE, RED, GREEN, CYAN, MAGENTA, BLACK];
        for (panel, (caption, series)) in panels.iter().zip(panels_spec) {
            let ymax = series
                .iter()
                .flat_map(|(_, r, f)| ps.iter().filter(|p| p.reader == *r).map(|p| f(p)))
                .filter(|v| v.is_finite())
                .fold(1.0f64, f64::max)
                * 1.15;
            let mut chart = ChartBuilder::on(panel)
                .caption(caption, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(55)
                .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            chart
                .configure_mesh()
                .x_desc("Services")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            for (i, (label, reader, f)) in series.iter().enumerate() {
                let color = colors[i % colors.len()];
                let data: Vec<(f64, f64)> = ps
                    .iter()
                    .filter(|p| p.reader == *reader)
                    .map(|p| (p.services as f64, f(p)))
                    .filter(|(_, y)| y.is_finite())
                    .collect();
                chart
                    .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?
                    .label(*label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        data.iter()
                            .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                    )
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }
        area.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        out.push((mode, rel));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_agents_table_line() {
        let line = "2026-11-24T19:10:10.611351Z  INFO clb_probe::agent::services: service table read (change) source=Some(Iptables) services=2 nodeports=2 read_ms=40";
        let (at, n, read) = parse_table_line(line).unwrap();
        assert!((at - (19.0 * 3600.0 + 600.0 + 10.611351)).abs() < 1e-6);
        assert_eq!((n, read), (2, Some(40.0)));
        assert!(parse_table_line("2026-11-24T19:10:10Z INFO other line services=3").is_none());
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
        assert!(nft_rules(2, None).contains("10.96.0.2 . tcp . 80 : goto service-S0000001"));
        assert_ne!(nft_rules(2, None), nft_rules(2, Some(0)));
    }
}
