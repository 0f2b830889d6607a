//! What the agent shares with its surfaces (metrics endpoint, live-view socket): read-only
//! views and a broadcast of reports. The correlation loop is the only writer.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::Ordering},
};

use serde::Serialize;
use tokio::sync::{broadcast, watch};

use super::{capability::Capabilities, nodesync::NodeStatus};
use crate::{
    correlate::{CorrelatorStats, LoopbackEvent, Report},
    kernel::{
        DropReasons,
        counters::{CounterSnapshot, Counters},
        reader::ReaderStats,
    },
    sink::kube_events::KubeEventStats,
};

/// How many recent confirmed aggregates the live view gets on connect.
pub const RECENT_EVENTS: usize = 200;

/// Everything a surface may read. Cheap to clone (all `Arc`s and channel handles).
#[derive(Clone)]
pub struct Shared {
    pub status: watch::Receiver<NodeStatus>,
    pub counters: Arc<Counters>,
    pub reader: Arc<ReaderStats>,
    pub drop_reasons: Arc<DropReasons>,
    /// Every report (new confirmations and repeats), for `probe watch` / `probe events`.
    pub reports: broadcast::Sender<Arc<Report>>,
    /// Latest state of each confirmed aggregate (by its key), for a surface that connects late.
    pub confirmed: Arc<Mutex<BTreeMap<String, LoopbackEvent>>>,
    pub correlator: Arc<Mutex<CorrelatorStats>>,
    /// What can be confirmed on this node (`clbprobe_capability`).
    pub capabilities: Arc<Capabilities>,
    /// Kubernetes attribution's connection (`clbprobe_kube_connected`).
    pub kube: Arc<crate::kube::KubeStatus>,
    pub version: &'static str,
    /// Kubernetes Events written (`clbprobe_kube_event_writes_total`).
    pub kube_events: Arc<KubeEventStats>,
    /// `--events` / `--record` writers (`clbprobe_output_*`), by output name.
    pub outputs: Arc<Vec<(&'static str, Arc<crate::sink::json::OutputStats>)>>,
}

/// A point-in-time view for the live view's header and tables.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub node: String,
    pub status: NodeStatus,
    pub counters: CounterSnapshot,
    /// Drops by reason name (kernel counters, suspects and VIP destinations).
    pub drops_by_reason: BTreeMap<String, u64>,
    pub userspace_queue_full: u64,
    pub events_read: u64,
    pub correlator: CorrelatorStats,
    pub confirmed: Vec<LoopbackEvent>,
    /// (capability, available).
    pub capabilities: Vec<(String, bool)>,
    /// Kubernetes attribution has a working API connection.
    pub kube_connected: bool,
    /// Kubernetes Event writes by result.
    pub kube_event_writes: Vec<(String, u64)>,
}

impl Shared {
    pub fn snapshot(&self) -> Snapshot {
        let counters = self.counters.snapshot();
        let mut drops_by_reason = BTreeMap::new();
        for (code, _, _, n) in &counters.drops {
            *drops_by_reason
                .entry(self.drop_reasons.name(*code))
                .or_insert(0) += n;
        }
        let confirmed = self
            .confirmed
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        Snapshot {
            node: node_name(),
            status: self.status.borrow().clone(),
            counters,
            drops_by_reason,
            userspace_queue_full: self.reader.queue_full.load(Ordering::Relaxed),
            events_read: self.reader.read.load(Ordering::Relaxed),
            correlator: self
                .correlator
                .lock()
                .map(|s| s.clone())
                .unwrap_or_default(),
            confirmed,
            capabilities: self.capabilities.snapshot(),
            kube_connected: self.kube.connected(),
            kube_event_writes: self.kube_events.snapshot(),
        }
    }

    /// Records a report for late joiners and broadcasts it (no receiver is fine).
    pub fn publish(&self, report: Report) {
        if let Ok(mut m) = self.confirmed.lock() {
            m.insert(report.event.key.clone(), report.event.clone());
            while m.len() > RECENT_EVENTS {
                let oldest = m
                    .iter()
                    .min_by_key(|(_, e)| e.last_seen_ns)
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => m.remove(&k),
                    None => break,
                };
            }
        }
        let _ = self.reports.send(Arc::new(report));
    }
}

/// The node's name: `NODE_NAME` (the DaemonSet sets it from the downward API), else the
/// hostname.
pub fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into())
        })
}
