//! The agent under exactly the DaemonSet's capabilities, then without each one.

use std::{
    io::BufRead as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    observe::{prog_ids_of, wait_gone},
    row::Row,
};
use crate::bench::net::{self};

/// The DaemonSet's capabilities (deploy/daemonset.yaml).
const DAEMONSET_CAPS: [&str; 5] = ["bpf", "perfmon", "net_admin", "syslog", "sys_resource"];

/// The agent under exactly the DaemonSet's set, then without each one.
pub(super) fn capabilities(probe: &Path, work: &Path) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut sets: Vec<(String, Vec<&str>)> =
        vec![("the DaemonSet's set".into(), DAEMONSET_CAPS.to_vec())];
    for drop in DAEMONSET_CAPS {
        sets.push((
            format!("without CAP_{}", drop.to_uppercase()),
            DAEMONSET_CAPS
                .iter()
                .copied()
                .filter(|c| *c != drop)
                .collect(),
        ));
    }
    for (name, caps) in sets {
        let bounding = format!(
            "-all{}",
            caps.iter().map(|c| format!(",+{c}")).collect::<String>()
        );
        let socket = work.join("caps.sock");
        let t = Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", net::NS_NODE, "setpriv"])
            .arg(format!("--bounding-set={bounding}"))
            .args(["--inh-caps=-all", "--"])
            .arg(probe)
            .args([
                "agent",
                "--nic",
                net::NODE_IF,
                "--vip-iface",
                net::VIP_IF,
                "--socket",
            ])
            .arg(&socket)
            .env("CLB_PROBE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().context("stderr")?;
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Ready ("attached and address sets loaded"), or exited: whichever comes first.
        let mut log = Vec::new();
        let mut ran = false;
        while t.elapsed() < Duration::from_secs(30) && child.try_wait()?.is_none() {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(20)) {
                ran |= line.contains("attached and address sets loaded");
                log.push(line);
                if ran {
                    break;
                }
            }
        }
        let elapsed = t.elapsed();
        let held = prog_ids_of(child.id() as i32);
        if ran {
            // SAFETY: our own child (ip netns exec and setpriv exec the agent).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let status = child.wait()?;
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(2)) {
            log.push(line);
        }
        let last = log
            .iter()
            .rfind(|l| !l.trim().is_empty())
            .cloned()
            .unwrap_or_default();
        let (left, _) = wait_gone(&held);
        let required = ["bpf", "perfmon", "net_admin"];
        let dropped: Vec<&str> = DAEMONSET_CAPS
            .iter()
            .copied()
            .filter(|c| !caps.contains(c))
            .collect();
        let verdict = match dropped.first() {
            None if ran && status.success() && left.is_empty() => Ok("works".to_string()),
            Some(d) if required.contains(d) => {
                let cap = format!("CAP_{}", d.to_uppercase());
                if !ran && status.code() == Some(1) && last.contains(&cap) && left.is_empty() {
                    Ok(format!("exit 1 naming {cap}"))
                } else {
                    Err(format!(
                        "{cap} dropped: ran={ran} status={status} last line {last:?}"
                    ))
                }
            }
            // Optional ones: the agent runs; say what it said about them.
            Some(_) if ran && status.success() && left.is_empty() => Ok(format!(
                "runs ({})",
                log.iter()
                    .filter(|l| l.contains("WARN"))
                    .map(|l| l
                        .split_once("WARN")
                        .map_or(l.as_str(), |(_, r)| r)
                        .trim()
                        .to_string())
                    .next()
                    .unwrap_or_else(|| "no warning".into())
            )),
            _ => Err(format!(
                "ran={ran} status={status} last line {last:?}, left {left:?}"
            )),
        };
        rows.push(Row {
            fault: format!("capabilities: {name}"),
            checked: "works with the set; without a required one: one line naming it, exit 1, nothing loaded".into(),
            figure: format!("{:.0} ms to ready or exit", elapsed.as_secs_f64() * 1e3),
            verdict,
        });
    }
    Ok(rows)
}
