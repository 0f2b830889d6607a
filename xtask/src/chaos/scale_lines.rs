//! The scale row's confirmation lines, timed: each hairpin line's arrival against its
//! suspect's send (matched by the suspect's source port), split by how it was confirmed
//! (`dropped`: the kernel's drop paired at once; otherwise conntrack after the settle window),
//! and the first slow ones named on the log against the re-syncs and re-reads around them
//! (how the 2 s stalls of netlink socket closes during nf_tables commits were found).

use probe_contract::{LoopbackEvent, LoopbackKind};

use crate::bench::report::percentile;

/// A line later than this after its suspect is named on the log.
const SLOW_NS: u64 = 100_000_000;
/// The suspects' source ports start here (suspect `i` has port `SPORT_BASE + i`).
const SPORT_BASE: u64 = 40_000;

pub(super) struct LineTiming {
    /// Suspect sent to its line, per line.
    pub latency_ms: Vec<f64>,
    /// Lines that arrived while a service-table re-read ran.
    pub during_reread: usize,
    /// Lines later than [`SLOW_NS`].
    pub slow: usize,
    /// `outcome: n lines, median, p99` per outcome.
    pub by_outcome: String,
}

impl LineTiming {
    /// `events`: (arrival, JSON line) as the agent printed them; `sent_ns`: each suspect's
    /// send; `rereads`, `resyncs`: (start, end) spans. All CLOCK_MONOTONIC ns.
    pub(super) fn of(
        events: &[(u64, String)],
        sent_ns: &[u64],
        rereads: &[(u64, u64)],
        resyncs: &[(u64, u64)],
    ) -> LineTiming {
        let lines: Vec<(u64, u64, String)> = events
            .iter()
            .filter_map(|(at, l)| {
                let e: LoopbackEvent = serde_json::from_str(l).ok()?;
                let i = (e.kind == LoopbackKind::Hairpin)
                    .then_some(u64::from(e.src_port))?
                    .checked_sub(SPORT_BASE)?;
                let outcome = e.outcome.as_str().to_string();
                Some((*at, *sent_ns.get(i as usize)?, outcome))
            })
            .collect();
        let ms = |at: u64, sent: u64| at.saturating_sub(sent) as f64 / 1e6;
        let origin = sent_ns.first().copied().unwrap_or(0);
        let rel = |ns: u64| ns.saturating_sub(origin) / 1_000_000;
        let spans = |v: &[(u64, u64)]| {
            v.iter()
                .map(|(a, b)| (rel(*a), rel(*b)))
                .collect::<Vec<_>>()
        };
        let slow: Vec<_> = lines
            .iter()
            .filter(|(at, sent, _)| at.saturating_sub(*sent) > SLOW_NS)
            .collect();
        for (at, sent, outcome) in slow.iter().take(5) {
            eprintln!(
                "chaos: scale: slow line: sent at {} ms, line at {} ms ({outcome}); re-syncs {:?}; re-reads {:?}",
                rel(*sent),
                rel(*at),
                spans(resyncs),
                spans(rereads),
            );
        }
        let mut by_outcome: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
        for (at, sent, outcome) in &lines {
            by_outcome
                .entry(outcome.as_str())
                .or_default()
                .push(ms(*at, *sent));
        }
        LineTiming {
            latency_ms: lines.iter().map(|(at, sent, _)| ms(*at, *sent)).collect(),
            during_reread: lines
                .iter()
                .filter(|(at, _, _)| rereads.iter().any(|(a, b)| a <= at && at <= b))
                .count(),
            slow: slow.len(),
            by_outcome: by_outcome
                .iter()
                .map(|(o, v)| {
                    format!(
                        "{o}: {} lines, {:.0} ms median, {:.0} ms p99",
                        v.len(),
                        percentile(v, 50.0),
                        percentile(v, 99.0)
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

#[cfg(test)]
mod tests {
    use test_support::assert_contains;

    use super::*;

    #[test]
    fn lines_are_matched_to_their_suspects_and_split_by_outcome() {
        let ms = 1_000_000;
        let sent = [0, 50 * ms, 100 * ms];
        // A whole event line as the agent writes it (only kind, src_port, outcome matter).
        let line = |kind: LoopbackKind, port: u16, outcome: &str| {
            serde_json::json!({
                "kind": kind, "key": "k", "src": "198.19.1.10", "src_port": port,
                "dst": "198.18.0.2", "dst_port": 30080, "vip": null, "vip_port": null,
                "proto": "tcp", "drop_reason": null, "drop_location": null, "snat": "no",
                "outcome": outcome, "count": 1, "evidence": [], "remedy": [],
                "first_seen_ns": 0, "last_seen_ns": 0, "nic": null, "service": null,
                "layer": null,
            })
            .to_string()
        };
        let hairpin = LoopbackKind::Hairpin;
        let events = vec![
            (3 * ms, line(hairpin, 40_000, "dropped")),
            (2_050 * ms, line(hairpin, 40_001, "dropped")),
            (1_900 * ms, line(hairpin, 40_002, "no_reply")),
            (
                5 * ms,
                line(LoopbackKind::VipPortUnserved, 40_000, "refused"),
            ),
            (6 * ms, "not json".to_string()),
        ];
        let t = LineTiming::of(&events, &sent, &[(2_000 * ms, 2_100 * ms)], &[]);
        assert_eq!(t.latency_ms, vec![3.0, 2000.0, 1800.0]);
        assert_eq!(t.during_reread, 1);
        assert_eq!(t.slow, 2);
        assert!(
            t.by_outcome.starts_with("dropped: 2 lines"),
            "{}",
            t.by_outcome
        );
        assert_contains(&t.by_outcome, "no_reply: 1 lines");
    }
}
