//! The writers' counters, here below both the writers (`sink::json`, `sink::otlp`, the node
//! report's writer) and `/metrics`, which reads them, like the other counters the hub shares.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

/// A write blocked this long marks the output stalled.
pub const STALLED_AFTER: Duration = Duration::from_secs(1);

/// What the metrics endpoint reads about one output.
#[derive(Debug, Default)]
pub struct OutputStats {
    /// Lines dropped: the queue was full, or the write failed.
    pub lost: AtomicU64,
    pub written: AtomicU64,
    /// CLOCK_MONOTONIC ns when the write in progress started; 0 when none is.
    pub(crate) writing_since: AtomicU64,
}

impl OutputStats {
    /// Whether a write has been blocked for longer than [`STALLED_AFTER`] at `now_ns`.
    pub fn stalled(&self, now_ns: u64) -> bool {
        let since = self.writing_since.load(Ordering::Relaxed);
        since != 0 && now_ns.saturating_sub(since) > STALLED_AFTER.as_nanos() as u64
    }
}

/// `--otlp-endpoint`'s counters (written by `sink::otlp`, read by `/metrics`).
#[derive(Debug, Default)]
pub struct OtlpStats {
    /// Log records (confirmed events) the receiver accepted.
    pub logs_exported: AtomicU64,
    /// Log records lost: the queue was full (the receiver is slow or down), or their export
    /// failed or timed out.
    pub logs_dropped: AtomicU64,
    /// Metric exports (each the whole set of counters) the receiver accepted.
    pub metrics_exported: AtomicU64,
    /// Metric exports that failed or timed out (the next one carries the cumulative values).
    pub metrics_dropped: AtomicU64,
}

impl OtlpStats {
    /// (signal, exported, dropped), for the metrics.
    pub fn snapshot(&self) -> Vec<(String, u64, u64)> {
        [
            ("logs", &self.logs_exported, &self.logs_dropped),
            ("metrics", &self.metrics_exported, &self.metrics_dropped),
        ]
        .into_iter()
        .map(|(s, e, d)| {
            (
                s.to_string(),
                e.load(Ordering::Relaxed),
                d.load(Ordering::Relaxed),
            )
        })
        .collect()
    }
}

/// The writer's counters, for `/metrics` (E7, E12): `clbprobe_kube_writes_failed_total{object}`
/// (`report`, `condition`) and `clbprobe_node_report_refused{reason}` (1 while this agent
/// refuses to write at all, and why).
#[derive(Debug, Default)]
pub struct ReportStats {
    pub report_failed: AtomicU64,
    pub condition_failed: AtomicU64,
    /// Why nothing is written (empty: the writer writes).
    pub refused: Mutex<String>,
}

impl ReportStats {
    /// (object, failed writes), for the metrics.
    pub fn failed(&self) -> Vec<(String, u64)> {
        vec![
            ("report".into(), self.report_failed.load(Ordering::Relaxed)),
            (
                "condition".into(),
                self.condition_failed.load(Ordering::Relaxed),
            ),
        ]
    }

    /// The reason this agent refuses to write, if it does.
    pub fn refused(&self) -> Option<String> {
        self.refused
            .lock()
            .ok()
            .map(|r| r.clone())
            .filter(|r| !r.is_empty())
    }
}
