//! SIGKILL during a spoofed flood, then a restart; SIGTERM under the flood.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    observe::{prog_ids_of, suspects_vip, wait_gone},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self, BenchNet},
    tools::{Agent, pause, trafgen, trafgen_config},
};

/// SIGKILL mid-flood, then restart under the same flood; then SIGTERM under it.
pub(super) fn sigkill_during_flood(
    bench_net: &BenchNet,
    probe: &Path,
    work: &Path,
    rounds: usize,
) -> Result<Row> {
    let conf = work.join("flood.cfg");
    std::fs::write(&conf, trafgen_config(bench_net, 0, Some(net::VIP)))?;
    let mut unload_ms = Vec::new();
    let mut ready_ms = Vec::new();
    let mut stop_ms = Vec::new();
    let mut problems = Vec::new();
    for round in 0..rounds {
        let mut first = Agent::start(probe, work, METRICS_PORT)?;
        let _flood = trafgen(&conf)?;
        pause(Duration::from_secs(1))?;
        let pid = first.pid();
        let held = prog_ids_of(pid);
        if held.len() < 3 {
            problems.push(format!("round {round}: the agent holds programs {held:?}"));
        }
        // SAFETY: our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = first.proc.child.wait();
        let (left, took) = wait_gone(&held);
        unload_ms.push(took.as_secs_f64() * 1e3);
        if !left.is_empty() {
            problems.push(format!(
                "round {round}: programs {left:?} still loaded 5 s after SIGKILL"
            ));
        }
        drop(first);
        // The restart finds the killed agent's stale socket and the flood still running.
        let mut second = Agent::start(probe, work, METRICS_PORT)?;
        ready_ms.push(second.startup.as_secs_f64() * 1e3);
        let before = suspects_vip(&second);
        pause(Duration::from_millis(500))?;
        let after = suspects_vip(&second);
        if after <= before {
            problems.push(format!(
                "round {round}: the restarted agent counted no suspects"
            ));
        }
        let held = prog_ids_of(second.pid());
        let t = Instant::now();
        // SAFETY: our own child.
        unsafe { libc::kill(second.pid(), libc::SIGTERM) };
        let status = loop {
            if let Some(s) = second.proc.child.try_wait()? {
                break Some(s);
            }
            if t.elapsed() > Duration::from_secs(10) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        stop_ms.push(t.elapsed().as_secs_f64() * 1e3);
        match status {
            Some(s) if s.success() => {}
            other => problems.push(format!("round {round}: SIGTERM under the flood: {other:?}")),
        }
        let (left, _) = wait_gone(&held);
        if !left.is_empty() {
            problems.push(format!(
                "round {round}: programs {left:?} left after SIGTERM"
            ));
        }
    }
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    Ok(Row {
        fault: format!("SIGKILL during a spoofed flood (trafgen, VIP source), then restart; {rounds} round(s)"),
        checked: "every program the killed agent held is freed by the kernel (nothing attached, nothing pinned); the restart replaces its stale socket, is ready and counts the flood; SIGTERM under the flood exits 0 and frees its programs".into(),
        figure: format!(
            "programs freed {:.0} ms after SIGKILL (max); ready {:.0} ms after restart (max); SIGTERM to exit {:.0} ms (max)",
            max(&unload_ms),
            max(&ready_ms),
            max(&stop_ms)
        ),
        verdict: if problems.is_empty() {
            Ok("nothing lost".into())
        } else {
            Err(problems.join("; "))
        },
    })
}
