//! Hostile HTTP clients while `/healthz` is probed.

use std::{
    io::Write as _,
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;
use test_support::lab::in_netns;

use super::{
    observe::{get, probe_health},
    row::{METRICS_PORT, Row},
};
use crate::bench::{
    net::{self},
    report::percentile,
    tools::Agent,
};

/// Hostile HTTP clients while `/healthz` is probed.
pub(super) fn http_storm(
    probe: &Path,
    work: &Path,
    clients: usize,
    slow: usize,
    secs: u64,
) -> Result<Row> {
    let agent = Agent::start(probe, work, METRICS_PORT)?;
    let addr = format!("127.0.0.1:{METRICS_PORT}");
    let pid = agent.pid();
    let report = in_netns(net::NS_NODE, || {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut held = Vec::new();
        // The pipeliner: requests it never reads the answers to.
        let mut p = TcpStream::connect(&addr)?;
        p.set_write_timeout(Some(Duration::from_secs(1)))?;
        let _ = p.write_all(
            "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                .repeat(20_000)
                .as_bytes(),
        );
        held.push(p);
        for _ in 0..slow {
            let mut s = TcpStream::connect(&addr)?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHo")?;
            held.push(s);
        }
        let (done, failed, health) = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..clients)
                .map(|_| {
                    let addr = addr.clone();
                    scope.spawn(move || {
                        let (mut ok, mut bad) = (0u64, 0u64);
                        while Instant::now() < deadline {
                            match get(&addr, "/metrics", Duration::from_secs(5)) {
                                Some(200) => ok += 1,
                                _ => bad += 1,
                            }
                        }
                        (ok, bad)
                    })
                })
                .collect();
            let health = probe_health(&addr, pid, deadline);
            let (mut done, mut failed) = (0, 0);
            for w in workers {
                let (ok, bad) = w.join().unwrap_or((0, 0));
                done += ok;
                failed += bad;
            }
            (done, failed, health)
        });
        drop(held);
        Ok((done, failed, health))
    })?;
    let (done, failed, health) = report;
    let (answered, (missed, over_1s)) = (health.answered_ms(), health.missed_and_slow());
    let (probes, threads, rss) = (health.probes, health.threads, health.rss);
    drop(agent);
    Ok(Row {
        fault: format!(
            "{clients} concurrent clients fetching /metrics for {secs} s, {slow} slow clients (half a request each), one client pipelining 20,000 requests and never reading"
        ),
        checked: "/healthz probed every 100 ms throughout answers 200 (within 1 s); agent threads and RSS".into(),
        figure: format!(
            "/healthz {} probes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {done} /metrics answered ({failed} refused or cut while queued); agent peak {threads} threads, {} MiB RSS",
            probes.len(),
            percentile(&answered, 50.0),
            percentile(&answered, 99.0),
            answered.iter().copied().fold(0.0, f64::max),
            rss / 1024,
        ),
        verdict: if missed == 0 && over_1s == 0 {
            Ok("nothing lost".into())
        } else {
            Err(format!("{missed} /healthz probes unanswered, {over_1s} over 1 s"))
        },
    })
}
