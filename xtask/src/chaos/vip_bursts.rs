//! VIPs bound and removed on kube-ipvs0 in bursts: the kernel's VIP set follows.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    observe::{iface_vips, kernel_vips_until, node_ip_batch},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self},
    tools::Agent,
};

/// `count` VIPs bound on kube-ipvs0 in bursts of `burst` (one `ip -batch` each), then
/// removed the same way: after each phase the kernel's VIP set equals the interface's.
pub(super) fn vip_bursts(probe: &Path, work: &Path, count: usize, burst: usize) -> Result<Row> {
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    let pid = agent.pid();
    let addr = |i: usize| format!("198.18.{}.{}", i / 250, i % 250 + 1);
    let batch = work.join("vips.batch");
    let mut phases = Vec::new();
    let mut problems = Vec::new();
    for verb in ["add", "del"] {
        let t = Instant::now();
        for chunk in (0..count).collect::<Vec<_>>().chunks(burst) {
            let lines: String = chunk
                .iter()
                .map(|i| format!("addr {verb} {}/32 dev {}\n", addr(*i), net::VIP_IF))
                .collect();
            std::fs::write(&batch, lines)?;
            node_ip_batch(&batch)?;
        }
        let bound = t.elapsed();
        let want = iface_vips();
        let got = kernel_vips_until(
            pid,
            &want,
            t,
            Duration::from_secs(60),
            Duration::from_millis(100),
        )
        .unwrap_or_default();
        if got != want {
            let missing: Vec<_> = want.difference(&got).take(5).collect();
            let extra: Vec<_> = got.difference(&want).take(5).collect();
            problems.push(format!(
                "after {verb}: {} missing from the map (e.g. {missing:?}), {} extra (e.g. {extra:?})",
                want.difference(&got).count(),
                got.difference(&want).count()
            ));
        }
        phases.push(format!(
            "{}: ip done in {:.1} s, kernel map equal {:.1} s after the first burst ({} VIPs left)",
            if verb == "add" { "added" } else { "removed" },
            bound.as_secs_f64(),
            t.elapsed().as_secs_f64(),
            want.len()
        ));
    }
    drop(agent);
    Ok(Row {
        fault: format!(
            "{count} VIPs bound on kube-ipvs0 in bursts of {burst}, then removed the same way"
        ),
        checked: "after each phase the agent's HOSTS_V4 kernel map holds exactly the interface's addresses as VIPs (diff printed when not)".into(),
        figure: phases.join("; "),
        verdict: if problems.is_empty() {
            Ok("nothing lost".into())
        } else {
            Err(problems.join("; "))
        },
    })
}
