//! Live-view clients that never read or write garbage, while `/healthz` is probed.

use std::{
    io::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;
use test_support::lab::in_netns;

use super::{
    observe::{live_status, probe_health, proc_threads},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self},
    report::percentile,
    tools::Agent,
};

/// Many live-view clients that never read, some writing garbage, while `/healthz` is probed.
pub(super) fn live_view_clients(
    probe: &Path,
    work: &Path,
    clients: usize,
    secs: u64,
) -> Result<Row> {
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    let pid = agent.pid();
    let socket = work.join("agent.sock");
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..clients {
        match std::os::unix::net::UnixStream::connect(&socket) {
            Ok(mut s) => {
                if i % 10 == 0 {
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let garbage: Vec<u8> = (0..4096u32)
                        .map(|b| (b.wrapping_mul(2_654_435_761) >> 13) as u8)
                        .collect();
                    let _ = s.write_all(&garbage);
                }
                held.push(s);
            }
            Err(_) => refused += 1,
        }
    }
    let addr = format!("127.0.0.1:{METRICS_PORT}");
    let health = in_netns(net::NS_NODE, || {
        Ok(probe_health(
            &addr,
            pid,
            Instant::now() + Duration::from_secs(secs),
        ))
    })?;
    // A new client still gets its snapshot while the others are held.
    let fresh = live_status(&socket).is_some();
    drop(held);
    let alive = proc_threads(pid) > 0;
    drop(agent);
    let (answered, (missed, over_1s)) = (health.answered_ms(), health.missed_and_slow());
    let (probes, threads, rss) = (health.probes, health.threads, health.rss);
    let mut problems = Vec::new();
    if missed > 0 || over_1s > 0 {
        problems.push(format!(
            "{missed} /healthz probes unanswered, {over_1s} over 1 s"
        ));
    }
    if !fresh {
        problems.push("a new live-view client got no snapshot".into());
    }
    if !alive {
        problems.push("the agent died".into());
    }
    Ok(Row {
        fault: format!(
            "{clients} live-view clients held open for {secs} s, none reading, one in ten writing 4 KiB of garbage"
        ),
        checked: "/healthz probed every 100 ms answers 200 within 1 s; a new live-view client still gets its snapshot; agent threads and RSS".into(),
        figure: format!(
            "/healthz {} probes: p50 {:.1} ms, max {:.1} ms; {refused} connections refused; agent peak {threads} threads, {} MiB RSS",
            probes.len(),
            percentile(&answered, 50.0),
            answered.iter().copied().fold(0.0, f64::max),
            rss / 1024,
        ),
        verdict: if problems.is_empty() {
            Ok("nothing lost".into())
        } else {
            Err(problems.join("; "))
        },
    })
}
