//! Part 5, the footprint: the agent started `--starts` times on its own (nothing else
//! running), each time: spawn to `/readyz` 200, the agent's own account of its startup steps
//! (its `startup:` log line), RSS one second after ready, and the maps it holds (from its
//! /proc/<pid>/fdinfo: exactly this agent's, whatever else runs on the machine).

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};

use super::{
    report::{Table, median, spread},
    tools::{self, Agent, pause},
};

/// What the starts measured.
#[derive(Debug, Default)]
pub struct Starts {
    pub startup_ms: Vec<f64>,
    pub idle_rss_mib: Vec<f64>,
    /// Each start's steps as the agent logged them, (step, ms).
    pub steps: Vec<Vec<(String, f64)>>,
    /// The maps of the last start.
    pub maps: Vec<MapInfo>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MapInfo {
    pub name: String,
    pub map_type: String,
    pub max_entries: u64,
    pub memlock: u64,
}

/// `n` starts of the agent, one after the other.
pub fn starts(n: usize, probe: &Path, work: &Path, metrics_port: u16) -> Result<Starts> {
    eprintln!("bench: footprint, {n} agent starts");
    let mut out = Starts::default();
    for _ in 0..n {
        let agent = Agent::start_with_log(probe, work, metrics_port, "warn,clb_probe::agent=info")?;
        out.startup_ms.push(agent.startup.as_secs_f64() * 1e3);
        pause(Duration::from_secs(1))?;
        out.idle_rss_mib
            .push(tools::proc_usage(agent.pid())?.1 as f64 / 1024.0);
        out.maps = agent_maps(agent.pid())?;
        drop(agent);
        let log = std::fs::read_to_string(work.join("agent.log")).unwrap_or_default();
        if let Some(steps) = log.lines().find_map(parse_steps) {
            out.steps.push(steps);
        }
    }
    Ok(out)
}

/// The steps of the agent's `startup: <step> <ms> ms, ...` log line.
pub fn parse_steps(line: &str) -> Option<Vec<(String, f64)>> {
    let rest = line.split_once("startup: ")?.1;
    let steps: Vec<(String, f64)> = rest
        .split(", ")
        .filter_map(|part| {
            let part = part.trim().trim_end_matches("ms").trim();
            let (name, ms) = part.rsplit_once(' ')?;
            Some((name.to_string(), ms.parse().ok()?))
        })
        .collect();
    (!steps.is_empty()).then_some(steps)
}

/// One `key:\tvalue` field of fdinfo text.
fn fdinfo_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// The BPF maps process `pid` holds, named by bpftool.
fn agent_maps(pid: i32) -> Result<Vec<MapInfo>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        if let Some(id) = fdinfo_field(&text, "map_id").and_then(|v| v.parse::<u64>().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let mut maps = Vec::new();
    for id in ids {
        let out =
            test_support::lab::cmd::run(&["bpftool", "-j", "map", "show", "id", &id.to_string()])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("bpftool -j map show")?;
        maps.push(MapInfo {
            name: v["name"].as_str().unwrap_or("?").to_string(),
            map_type: v["type"].as_str().unwrap_or("?").to_string(),
            max_entries: v["max_entries"].as_u64().unwrap_or(0),
            memlock: v["bytes_memlock"].as_u64().unwrap_or(0),
        });
    }
    // aya's own (.rodata/.bss of the programs, the log ring) sort after ours.
    maps.sort_by(|a, b| b.memlock.cmp(&a.memlock).then(a.name.cmp(&b.name)));
    Ok(maps)
}

/// The footprint table; `peak_rss` from the flood when it ran.
pub fn table(s: &Starts, peak_rss: &[f64], summary: &mut Vec<(String, String)>) -> Table {
    let mut t = Table::new("5. Footprint", &["measure", "value"]);
    t.note = "Startup: from spawning the agent to `/readyz` answering 200 (programs loaded and \
              attached, address sets loaded, service table read); its steps as the agent logs \
              them (`startup:` line, median over the starts). RSS: VmRSS 1 s after ready. \
              Maps: those the agent holds (its fdinfo), `bytes_memlock` and `max_entries` as \
              bpftool reports them, at the default sizes (see docs/agent.md, Map sizing)."
        .to_string();
    t.row(vec![
        "startup to ready, ms".into(),
        spread(&s.startup_ms, 0),
    ]);
    let mut names: Vec<String> = Vec::new();
    for run in &s.steps {
        for (n, _) in run {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    for name in names {
        let ms: Vec<f64> = s
            .steps
            .iter()
            .filter_map(|run| run.iter().find(|(n, _)| *n == name).map(|(_, ms)| *ms))
            .collect();
        t.row(vec![format!("  step: {name}, ms"), spread(&ms, 1)]);
    }
    t.row(vec![
        "RSS idle (1 s after ready), MiB".into(),
        spread(&s.idle_rss_mib, 1),
    ]);
    if !peak_rss.is_empty() {
        t.row(vec![
            "peak RSS under the flood, MiB".into(),
            spread(peak_rss, 1),
        ]);
    }
    let total: u64 = s.maps.iter().map(|m| m.memlock).sum();
    t.row(vec![
        "map memory, MiB (all maps)".into(),
        format!("{:.1}", total as f64 / (1024.0 * 1024.0)),
    ]);
    for m in &s.maps {
        t.row(vec![
            format!("  map {} ({}), KiB", m.name, m.map_type),
            format!(
                "{:.0} (max_entries {})",
                m.memlock as f64 / 1024.0,
                m.max_entries
            ),
        ]);
    }
    summary.push((
        "footprint (targets: RSS < 20 MiB, ready < 300 ms)".into(),
        format!(
            "ready {:.0} ms, idle RSS {:.1} MiB (medians of {}), maps {:.1} MiB",
            median(&s.startup_ms),
            median(&s.idle_rss_mib),
            s.startup_ms.len(),
            total as f64 / (1024.0 * 1024.0)
        ),
    ));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_agents_startup_line() {
        let line = "2026-11-23T03:50:00Z  INFO clb_probe::agent: startup: kernel-btf 12.5 ms, \
                    load 101 ms, attach 3.2 ms";
        assert_eq!(
            parse_steps(line),
            Some(vec![
                ("kernel-btf".into(), 12.5),
                ("load".into(), 101.0),
                ("attach".into(), 3.2)
            ])
        );
        assert_eq!(parse_steps("INFO attached"), None);
    }

    #[test]
    fn reads_fdinfo_fields() {
        let text = "pos:\t0\nflags:\t02000002\nmap_type:\t9\nmax_entries:\t65536\nmap_id:\t42\n";
        assert_eq!(fdinfo_field(text, "map_id"), Some("42"));
        assert_eq!(fdinfo_field(text, "max_entries"), Some("65536"));
        assert_eq!(fdinfo_field(text, "prog_id"), None);
    }
}
