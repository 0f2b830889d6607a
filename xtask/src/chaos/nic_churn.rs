//! The probed NIC down/up, renamed, deleted and re-created.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    observe::{live_status, node_ifindex, node_ip},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self},
    tools::{Agent, metric_sum, pause},
};

/// The probed NIC taken down and up, renamed away and back, deleted and re-created (a new veth
/// pair with the node's address; the sender's end goes with the old one): after each, the NIC is attached
/// at its current ifindex; an absence is said once (one WARN per episode), not per resync.
pub(super) fn nic_churn(probe: &Path, work: &Path) -> Result<Row> {
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    let ip = node_ip;
    let ifindex = || node_ifindex(net::NODE_IF);
    let socket = work.join("agent.sock");
    // Converged: nic0 attached at its current ifindex (or, while absent, not attached).
    let converge = |present: bool| -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let want = if present { ifindex() } else { None };
            let status = live_status(&socket);
            let nic = status.as_ref().and_then(|s| {
                s.attached
                    .iter()
                    .find(|(name, _)| name == net::NODE_IF)
                    .map(|(_, i)| u64::from(*i))
            });
            if status.is_some() && nic == want {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    };
    let node_ip = format!("{}/24", net::NODE_IP);
    let mut steps: Vec<(&str, Option<Duration>)> = Vec::new();
    ip(&["link", "set", net::NODE_IF, "down"])?;
    pause(Duration::from_millis(300))?;
    ip(&["link", "set", net::NODE_IF, "up"])?;
    steps.push(("down/up", converge(true)));
    ip(&["link", "set", net::NODE_IF, "down"])?;
    ip(&["link", "set", net::NODE_IF, "name", "nic0-away"])?;
    steps.push(("renamed away", converge(false)));
    // Address churn on the node while the NIC is away: resyncs that must not repeat the WARN.
    for i in 0..5 {
        let a = format!("192.0.2.{}/32", 100 + i);
        ip(&["addr", "add", &a, "dev", "lo"])?;
        ip(&["addr", "del", &a, "dev", "lo"])?;
    }
    pause(Duration::from_millis(300))?;
    ip(&["link", "set", "nic0-away", "name", net::NODE_IF])?;
    ip(&["link", "set", net::NODE_IF, "up"])?;
    steps.push(("renamed back", converge(true)));
    ip(&["link", "del", net::NODE_IF])?;
    steps.push(("deleted", converge(false)));
    ip(&[
        "link",
        "add",
        net::NODE_IF,
        "type",
        "veth",
        "peer",
        "name",
        "nic0-peer",
    ])?;
    ip(&["addr", "add", &node_ip, "dev", net::NODE_IF])?;
    ip(&["link", "set", net::NODE_IF, "up"])?;
    steps.push(("re-created", converge(true)));
    let attached = metric_sum(
        &agent.metrics().unwrap_or_default(),
        "clbprobe_attached_interfaces",
        &[],
    );
    let log = std::fs::read_to_string(work.join("agent.log")).unwrap_or_default();
    let absent_warns = log
        .lines()
        .filter(|l| l.contains("configured NIC is absent"))
        .count();
    drop(agent);
    let mut problems: Vec<String> = steps
        .iter()
        .filter(|(_, t)| t.is_none())
        .map(|(s, _)| format!("{s}: not converged in 10 s"))
        .collect();
    if attached != 2 {
        problems.push(format!("{attached} attachments at the end (want 2)"));
    }
    if absent_warns != 2 {
        problems.push(format!(
            "the absent NIC was said {absent_warns} times for 2 absences"
        ));
    }
    Ok(Row {
        fault: "the probed NIC down/up, renamed away and back (with address changes meanwhile), deleted and re-created".into(),
        checked: "after each: attached at its current ifindex (detached while absent); one WARN per absence; one attachment per interface at the end".into(),
        figure: format!(
            "converged: {}; {absent_warns} absence WARN(s)",
            steps
                .iter()
                .map(|(s, t)| format!(
                    "{s} {}",
                    t.map_or("-".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        verdict: if problems.is_empty() {
            Ok("nothing lost".into())
        } else {
            Err(problems.join("; "))
        },
    })
}
