//! kube-ipvs0 deleted and re-created with its VIP, a health check each round.

use std::{
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    observe::{blackhole_confirmed, live_status, node_ifindex, node_ip},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self},
    report::percentile,
    tools::{Agent, RawSender, metric_sum},
};

/// kube-ipvs0 deleted and re-created (a new ifindex) with its VIP re-bound, `rounds` times; after
/// each, a health check from the VIP must be confirmed.
pub(super) fn vip_iface_churn(probe: &Path, work: &Path, rounds: u16) -> Result<Row> {
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    let sender = RawSender::new(net::NS_TX)?;
    let ip = node_ip;
    let vip = format!("{}/32", net::VIP);
    let gauge =
        |text: &str, family: &str, labels: &[(&str, &str)]| metric_sum(text, family, labels);
    let mut converge_ms = Vec::new();
    let mut missed = Vec::new();
    for round in 0..rounds {
        ip(&["link", "del", net::VIP_IF])?;
        ip(&["link", "add", net::VIP_IF, "type", "bridge"])?;
        ip(&["addr", "add", &vip, "dev", net::VIP_IF])?;
        let t = Instant::now();
        let ifindex = new_ifindex()?;
        // Converged: the live view's status has the new kube-ipvs0 attached and the VIP back.
        loop {
            let status = live_status(&work.join("agent.sock")).unwrap_or_default();
            let attached = status.attached;
            let has_new = attached
                .iter()
                .any(|(name, i)| name == net::VIP_IF && *i == ifindex);
            let has_vip = status.vips.contains(&IpAddr::V4(net::VIP));
            if has_new && has_vip && attached.len() == 2 {
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                missed.push(format!("round {round}: not converged in 10 s"));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        converge_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // Each round to its own NodePort: its own aggregate, so each confirmation is written.
        let port = 31000 + round;
        sender.syn(net::VIP, 42000 + round, net::NODE_IP, port)?;
        let confirmed = blackhole_confirmed(&agent, port, Duration::from_secs(5));
        if !confirmed {
            missed.push(format!(
                "round {round}: health check to :{port} not confirmed"
            ));
        }
    }
    let m = agent.metrics().unwrap_or_default();
    let attached = gauge(&m, "clbprobe_attached_interfaces", &[]);
    if attached != 2 {
        missed.push(format!(
            "{attached} attachments at the end (want 2: nic0, kube-ipvs0)"
        ));
    }
    drop(agent);
    let max = converge_ms.iter().copied().fold(0.0, f64::max);
    Ok(Row {
        fault: format!("kube-ipvs0 deleted and re-created with its VIP re-bound, {rounds} times"),
        checked: "after each: the VIP back in the set, the new interface attached, a health check from the VIP confirmed; one attachment per interface at the end".into(),
        figure: format!(
            "converged in {:.0} ms median, {max:.0} ms max; {} of {rounds} health checks confirmed",
            percentile(&converge_ms, 50.0),
            rounds as usize - missed.iter().filter(|m| m.contains("not confirmed")).count()
        ),
        verdict: if missed.is_empty() {
            Ok("nothing lost".into())
        } else {
            Err(missed.join("; "))
        },
    })
}

fn new_ifindex() -> Result<u32> {
    node_ifindex(net::VIP_IF)
        .map(|i| i as u32)
        .context("kube-ipvs0's ifindex")
}
