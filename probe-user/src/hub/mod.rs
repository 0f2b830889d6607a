//! The hub: what the agent shares with its surfaces (metrics endpoint, live-view socket,
//! OTLP metrics): the correlation loop publishes into [`Shared`]; a surface gets a [`View`],
//! which can only take a [`Snapshot`], subscribe to reports and read the writers' counters.
//! The Kubernetes writers get their channels one by one from the agent, not a view.
//!
//! It stands below `agent/` (which fills it) and `sink/` (which read it) and imports neither:
//! what it hands out is the output contract's (`probe-contract`); the live state it reads
//! from is the kernel's counters, the [`capability`] flags and the writers' counters
//! ([`KubeEventStats`], [`outputs`]), which live here for that reason: the writers count,
//! `/metrics` reads, and neither imports the other.

pub mod capability;
pub mod evidence;
pub mod outputs;
pub mod test_traffic;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use probe_contract::{
    Confirmation, CorrelatorStats, LoopLifecycle, LoopResolution, LoopbackEvent, NodeStatus,
    Snapshot,
};
use tokio::sync::{broadcast, watch};

use self::capability::Capabilities;
use crate::kernel::{DropReasons, counters::Counters, reader::ReaderStats};

/// How many recent confirmed aggregates the live view gets on connect.
pub const RECENT_EVENTS: usize = 200;

/// Everything the agent shares with its surfaces and writers, behind the methods they use:
/// the correlation loop publishes and records, the writers subscribe and count, the surfaces
/// read a [`View`]. Cheap to clone (all `Arc`s and channel handles).
#[derive(Clone)]
pub struct Shared {
    status: watch::Receiver<NodeStatus>,
    counters: Arc<Counters>,
    reader: Arc<ReaderStats>,
    drop_reasons: Arc<DropReasons>,
    /// Every report (new confirmations and repeats), for `probe watch` / `probe events`.
    reports: broadcast::Sender<Arc<Confirmation>>,
    /// Latest state of each confirmed aggregate (by its key), for a surface that connects late.
    confirmed: Arc<Mutex<BTreeMap<String, LoopbackEvent>>>,
    correlator: Arc<Mutex<CorrelatorStats>>,
    /// What can be confirmed on this node (`clbprobe_capability`).
    capabilities: Arc<Capabilities>,
    /// Kubernetes attribution's connection (`clbprobe_kube_connected`).
    kube: Arc<crate::kube::KubeStatus>,
    version: &'static str,
    /// Kubernetes Events written (`clbprobe_kube_event_writes_total`).
    kube_events: Arc<KubeEventStats>,
    /// The node report's writer (`clbprobe_kube_writes_failed_total`,
    /// `clbprobe_node_report_refused`).
    node_report: Arc<outputs::ReportStats>,
    /// `--events` / `--record` writers (`clbprobe_output_*`), by output name.
    outputs: Arc<Vec<(&'static str, Arc<outputs::OutputStats>)>>,
    /// `--otlp-endpoint`'s counters (`clbprobe_otlp_*`); None when OTLP export is off.
    otlp: Option<Arc<outputs::OtlpStats>>,
    /// The loops by state and the latest resolutions (`clbprobe_loopback_active{kind}`, ...),
    /// as the correlation loop's resolution tracker last published them.
    loops: Arc<Mutex<LoopLifecycle>>,
    /// Every resolution, for the Kubernetes Events writer (`LoopbackResolved`).
    resolutions: broadcast::Sender<Arc<LoopResolution>>,
    /// Each confirmed loop's first packets (`GET /evidence`): the correlation loop fills it.
    evidence: Arc<Mutex<evidence::EvidenceStore>>,
    /// `probe check`'s latest risks (the node report's check pass; empty without it), for
    /// the evidence bundles.
    check_risks: Arc<Mutex<Vec<probe_contract::report::RiskStatus>>>,
    /// This node's name (`--node-name`), when given.
    node_name: Option<String>,
    /// The agent's own test connections (verify, canary): counters, and the canary's flows
    /// whose confirmations [`Shared::publish`] marks.
    test_traffic: Arc<test_traffic::TestTraffic>,
    /// The agent's stop: true once it stops (the writers drain, then end).
    stop: watch::Receiver<bool>,
}

/// What the agent hands the hub when it makes it: the live state the hub reads from and the
/// writers' counters made before it; everything else the hub makes itself.
pub struct HubInputs {
    pub status: watch::Receiver<NodeStatus>,
    pub counters: Counters,
    pub reader: Arc<ReaderStats>,
    pub drop_reasons: DropReasons,
    pub capabilities: Arc<Capabilities>,
    pub kube: Arc<crate::kube::KubeStatus>,
    pub outputs: Vec<(&'static str, Arc<outputs::OutputStats>)>,
    pub otlp: Option<Arc<outputs::OtlpStats>>,
    pub evidence: evidence::EvidenceMode,
    pub node_name: Option<String>,
    pub stop: watch::Receiver<bool>,
}

/// How many reports and resolutions a writer may fall behind before it loses the oldest.
const REPORTS_QUEUE: usize = 1024;
const RESOLUTIONS_QUEUE: usize = 256;

impl Shared {
    pub fn new(inputs: HubInputs) -> Shared {
        Shared {
            status: inputs.status,
            counters: Arc::new(inputs.counters),
            reader: inputs.reader,
            drop_reasons: Arc::new(inputs.drop_reasons),
            reports: broadcast::channel(REPORTS_QUEUE).0,
            confirmed: Default::default(),
            correlator: Default::default(),
            capabilities: inputs.capabilities,
            kube: inputs.kube,
            version: env!("CARGO_PKG_VERSION"),
            kube_events: Default::default(),
            node_report: Default::default(),
            outputs: Arc::new(inputs.outputs),
            otlp: inputs.otlp,
            loops: Default::default(),
            resolutions: broadcast::channel(RESOLUTIONS_QUEUE).0,
            evidence: Arc::new(Mutex::new(evidence::EvidenceStore::new(inputs.evidence))),
            check_risks: Default::default(),
            node_name: inputs.node_name,
            test_traffic: Default::default(),
            stop: inputs.stop,
        }
    }

    /// A kernel record with packet bytes, for the evidence of the loop it may confirm.
    pub fn evidence_packet(&self, record: &probe_contract::record::KernelRecord) {
        if let Ok(mut e) = self.evidence.lock() {
            e.packet(record);
        }
    }

    /// A confirmation about to be published: its loop takes its packets.
    pub fn evidence_confirmed(&self, event: &LoopbackEvent) {
        if let Ok(mut e) = self.evidence.lock() {
            e.confirmed(event);
        }
    }

    /// The read-only handle a surface gets.
    pub fn view(&self) -> View {
        View(self.clone())
    }

    pub fn snapshot(&self) -> Snapshot {
        let counters = self.counters.snapshot();
        let mut drops_by_reason = BTreeMap::new();
        for (code, _, _, n) in &counters.drops {
            *drops_by_reason
                .entry(self.drop_reasons.name(*code))
                .or_insert(0) += n;
        }
        let confirmed = self.confirmed();
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
            loops: self.loops.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }

    /// The tracker's latest view, and a resolution to broadcast (no receiver is fine).
    pub fn publish_loops(&self, lifecycle: LoopLifecycle, resolution: Option<LoopResolution>) {
        if let Ok(mut l) = self.loops.lock() {
            *l = lifecycle;
        }
        if let Some(r) = resolution {
            let _ = self.resolutions.send(Arc::new(r));
        }
    }

    /// Records a report for late joiners and broadcasts it (no receiver is fine).
    pub fn publish(&self, mut report: Confirmation) {
        // Marked here, before any writer or the late-joiner map sees it.
        if self.test_traffic.is_canary(&report.event) {
            report.event.facts.canary = true;
        }
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

    /// Every report from now on (bounded: a receiver that lags loses the oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Confirmation>> {
        self.reports.subscribe()
    }

    /// Every resolution from now on (bounded like the reports).
    pub fn subscribe_resolutions(&self) -> broadcast::Receiver<Arc<LoopResolution>> {
        self.resolutions.subscribe()
    }

    /// The agent's stop signal (true once it stops).
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop.clone()
    }

    /// The node's status as last published.
    pub fn status(&self) -> NodeStatus {
        self.status.borrow().clone()
    }

    /// The correlator's counters, as of its latest tick.
    pub fn set_correlator_stats(&self, stats: &CorrelatorStats) {
        if let Ok(mut s) = self.correlator.lock() {
            s.clone_from(stats);
        }
    }

    /// The latest state of each recently confirmed aggregate.
    pub fn confirmed(&self) -> Vec<LoopbackEvent> {
        self.confirmed
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// What can be confirmed on this node: the agent's tasks set it, the surfaces read it.
    pub fn capabilities(&self) -> &Arc<Capabilities> {
        &self.capabilities
    }

    /// The Kubernetes Events writer's counters.
    pub fn kube_event_stats(&self) -> Arc<KubeEventStats> {
        self.kube_events.clone()
    }

    /// The node report writer's counters.
    pub fn node_report_stats(&self) -> Arc<outputs::ReportStats> {
        self.node_report.clone()
    }

    /// `--otlp-endpoint`'s counters; None when OTLP export is off.
    pub fn otlp_stats(&self) -> Option<Arc<outputs::OtlpStats>> {
        self.otlp.clone()
    }

    /// `probe check`'s latest risks (empty when the node report's checks do not run).
    pub fn check_risks(&self) -> Vec<probe_contract::report::RiskStatus> {
        self.check_risks
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// The node report's latest check pass found these risks.
    pub fn set_check_risks(&self, risks: Vec<probe_contract::report::RiskStatus>) {
        if let Ok(mut r) = self.check_risks.lock() {
            *r = risks;
        }
    }

    /// The agent's own test connections (counted by verify and the canary).
    pub fn test_traffic(&self) -> &test_traffic::TestTraffic {
        &self.test_traffic
    }
}

/// What a surface (metrics, live view, OTLP metrics) may read of the hub: nothing it can
/// publish or reconfigure. Cheap to clone.
#[derive(Clone)]
pub struct View(Shared);

impl View {
    /// Everything read now (the kernel's counters, the correlator's, the loops, the writers').
    pub fn snapshot(&self) -> Snapshot {
        self.0.snapshot()
    }

    /// Every report from now on (bounded: a receiver that lags loses the oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Confirmation>> {
        self.0.subscribe()
    }

    /// Every resolution from now on.
    pub fn subscribe_resolutions(&self) -> broadcast::Receiver<Arc<LoopResolution>> {
        self.0.subscribe_resolutions()
    }

    /// The agent's stop signal (true once it stops).
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.0.stop_signal()
    }

    /// The node's status as last published (readiness).
    pub fn status(&self) -> NodeStatus {
        self.0.status()
    }

    pub fn version(&self) -> &'static str {
        self.0.version
    }

    /// The `--events` / `--record` writers' counters, by output name.
    pub fn outputs(&self) -> &[(&'static str, Arc<outputs::OutputStats>)] {
        &self.0.outputs
    }

    /// `--otlp-endpoint`'s counters; None when OTLP export is off.
    pub fn otlp(&self) -> Option<&outputs::OtlpStats> {
        self.0.otlp.as_deref()
    }

    /// The node report's writer's counters.
    pub fn node_report(&self) -> &outputs::ReportStats {
        &self.0.node_report
    }

    /// The confirmed loops' evidence (read under its lock; never held across an await).
    pub fn evidence(&self) -> std::sync::MutexGuard<'_, evidence::EvidenceStore> {
        self.0.evidence.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `probe check`'s latest risks (empty when the node report's checks do not run).
    pub fn check_risks(&self) -> Vec<probe_contract::report::RiskStatus> {
        self.0.check_risks()
    }

    pub fn node_name(&self) -> Option<&str> {
        self.0.node_name.as_deref()
    }

    /// The agent's own test connections' counters.
    pub fn test_traffic(&self) -> &test_traffic::TestTraffic {
        self.0.test_traffic()
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

/// `clbprobe_kube_event_writes_total{result}`.
#[derive(Debug, Default)]
pub struct KubeEventStats {
    pub created: AtomicU64,
    pub patched: AtomicU64,
    pub failed: AtomicU64,
    /// Held back by the global token bucket (written later, when a token is back).
    pub rate_limited: AtomicU64,
    /// Reports this task missed because it lagged behind the broadcast.
    pub dropped: AtomicU64,
}

impl KubeEventStats {
    /// (result, count), for the metrics.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        [
            ("created", &self.created),
            ("patched", &self.patched),
            ("failed", &self.failed),
            ("rate_limited", &self.rate_limited),
            ("dropped", &self.dropped),
        ]
        .into_iter()
        .map(|(r, n)| (r.to_string(), n.load(Ordering::Relaxed)))
        .collect()
    }
}
