//! Prometheus exposition: `/metrics`, `/healthz` (the process answers), `/readyz` (programs
//! attached and address sets loaded).
//!
//! Kernel counters are read at scrape time (summed per-CPU maps) and exposed as counters; the
//! registry is rebuilt per scrape from plain data ([`MetricsInput`]), so rendering is a pure
//! function and testable without a kernel. Confirmed events are counted from the report stream:
//! each report carries its aggregate's cumulative `count`, and the increment since the last
//! report of that aggregate is added, so a missed (lagged) report loses nothing and a counter
//! never goes backwards.
//!
//! Label values stay bounded: NIC names, tags, kernel reason names, suppression stages; VIP and
//! port appear only on confirmed events, and at most [`EVENT_SERIES`] (kind, vip, port) series
//! have their own labels: anyone who can connect to a bound VIP's unserved ports (an
//! unprivileged local user, a tenant pod) makes one new aggregate per port. No first come,
//! first served for the life of the process (hostile round 3, E10): a new (kind, vip, port)
//! always gets its own series; at the cap, one series goes, taken from the largest (kind, vip)
//! group (the flood's own, as long as it is the largest), the least recently reported of it,
//! and its count is added to `vip="other", port="other"` of its kind. So every kind's total
//! (own series plus `other`) stays exact and never goes down, a kept series never goes down,
//! and a real loop of another kind or VIP keeps its series while one VIP is flooded. An
//! evicted series vanishes from /metrics (Prometheus ends the series); if its (vip, port)
//! comes back it starts again from its new increments, which Prometheus reads as a new series
//! start (its `rate`/`increase` count the new increments only, the old ones stay in `other`).

//! Rooms: this file holds the inputs (the report-fed [`EventTotals`], the [`MetricsInput`] a
//! rendering reads, [`gather`]); [`render`] turns them into the exposition text (pure);
//! [`endpoint`] serves `/metrics`, `/healthz` and `/readyz`.

mod endpoint;
mod render;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

pub use endpoint::{RENDER_REUSE, readiness, serve};
use probe_contract::{LoopbackEvent, Snapshot, Tag};
pub use render::{render, to_prometheus_text};

use super::process::ProcessStats;
use crate::hub::View;

/// (kind, vip, port) labels of `clbprobe_loopback_events_total`.
type SeriesLabels = (String, String, String);

/// Confirmed-event totals by (kind, vip, port), fed from the report stream.
#[derive(Debug, Default)]
pub struct EventTotals {
    totals: BTreeMap<SeriesLabels, u64>,
    /// When each own-label series (not `other`) was last reported (a sequence number).
    reported: HashMap<SeriesLabels, u64>,
    /// By (kind, owner label of the event's local address), for events that name one.
    by_owner: BTreeMap<(String, String), u64>,
    /// Last cumulative count seen per aggregate key, and when (a sequence number).
    last: HashMap<String, (u64, u64)>,
    /// The keys of `last` by sequence number: the least recently reported first.
    by_age: BTreeMap<u64, String>,
    seq: u64,
}

/// Aggregates whose last count is remembered. Above the correlator's own bound (1024 by
/// default), evicting the least recently reported: an aggregate forgotten here has been evicted
/// by the correlator too, so its next report restarts at 1 and is counted from there.
/// (Forgetting an aggregate that is still live would count its whole total again.)
pub const EVENT_TOTALS_KEYS: usize = 4096;

/// `clbprobe_loopback_events_total` series with their own (vip, port) labels; a further pair
/// takes the place of the least recently reported series of the largest (kind, vip) group,
/// whose count goes to [`OVERFLOW_LABEL`] (module doc; docs/metrics-and-otlp.md). A node has a
/// few dozen VIP ports that
/// matter; 500 keeps them all and /metrics small (each series is about 100 bytes).
pub const EVENT_SERIES: usize = 500;
/// The `vip` and `port` label value of the overflow series.
pub const OVERFLOW_LABEL: &str = "other";

impl EventTotals {
    pub fn add(&mut self, e: &LoopbackEvent) {
        self.seq += 1;
        // The canary's own loops are not users' traffic (`clbprobe_canary_tests_total` counts
        // them): the count is remembered, so a user's next occurrence adds only itself.
        if e.facts.canary {
            if let Some((_, seq)) = self.last.insert(e.key.clone(), (e.count, self.seq)) {
                self.by_age.remove(&seq);
            }
            self.by_age.insert(self.seq, e.key.clone());
            return;
        }
        let prev = match self.last.insert(e.key.clone(), (e.count, self.seq)) {
            Some((count, seq)) => {
                self.by_age.remove(&seq);
                count
            }
            None => 0,
        };
        self.by_age.insert(self.seq, e.key.clone());
        // An aggregate evicted and re-created restarts at 1: count it from there.
        let delta = if e.count >= prev {
            e.count - prev
        } else {
            e.count
        };
        let labels = (
            e.kind.as_str().to_string(),
            e.vip.map(|v| v.to_string()).unwrap_or_default(),
            e.vip_port.map(|p| p.to_string()).unwrap_or_default(),
        );
        if !self.totals.contains_key(&labels) && self.reported.len() >= EVENT_SERIES {
            self.evict_series();
        }
        self.reported.insert(labels.clone(), self.seq);
        *self.totals.entry(labels).or_insert(0) += delta;
        if let Some(owner) = &e.facts.owner {
            let labels = (e.kind.as_str().to_string(), owner.label());
            *self.by_owner.entry(labels).or_insert(0) += delta;
        }
        while self.last.len() > EVENT_TOTALS_KEYS {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.last.remove(&oldest);
        }
    }
}

impl EventTotals {
    /// Makes room for one own-label series: the least recently reported of the largest
    /// (kind, vip) group goes, its count into its kind's `other` (module doc).
    fn evict_series(&mut self) {
        // Per group: (size, its least recently reported series).
        let mut groups: HashMap<(&str, &str), (usize, u64, &SeriesLabels)> = HashMap::new();
        for (labels, &seq) in &self.reported {
            let g = groups
                .entry((labels.0.as_str(), labels.1.as_str()))
                .or_insert((0, seq, labels));
            g.0 += 1;
            if seq < g.1 {
                (g.1, g.2) = (seq, labels);
            }
        }
        // The largest group; among equals, the one whose oldest series is the oldest.
        let Some(victim) = groups
            .into_values()
            .max_by_key(|&(size, seq, _)| (size, std::cmp::Reverse(seq)))
            .map(|(_, _, labels)| labels.clone())
        else {
            return;
        };
        self.reported.remove(&victim);
        let count = self.totals.remove(&victim).unwrap_or(0);
        let other = (
            victim.0,
            OVERFLOW_LABEL.to_string(),
            OVERFLOW_LABEL.to_string(),
        );
        *self.totals.entry(other).or_insert(0) += count;
    }
}

/// Everything one scrape renders, as plain data.
#[derive(Debug, Default)]
pub struct MetricsInput {
    pub version: String,
    pub kernel: String,
    /// The agent process (CPU, memory, fds): the standard unprefixed `process_*` families.
    pub process: Option<ProcessStats>,
    pub events: Vec<((String, String, String), u64)>,
    /// (kind, owner label) -> confirmed events whose local address has that owner.
    pub events_by_owner: Vec<((String, String), u64)>,
    /// (owner label, local addresses it owns): `kube-ipvs0`, `nic:eth0`, `route:66`.
    pub owner_counts: Vec<(String, u64)>,
    /// (nic, source tag) -> packets.
    pub suspects: Vec<(String, String, u64)>,
    pub drops_by_reason: Vec<(String, u64)>,
    /// (stage, count).
    pub suppressed: Vec<(String, u64)>,
    /// The `budget` stage by class, (record kind, source, count): each class has its own
    /// per-CPU budget, so this says which records were shed (a flood of one class, or the
    /// drops and VIP-source suspects that confirm a health-check blackhole).
    pub budget_suppressed_by_class: Vec<(String, String, u64)>,
    /// Prefixes the kernel maps hold, by set.
    pub set_sizes: Vec<(String, u64)>,
    /// Prefixes of the node left out of full maps, by set.
    pub addresses_left_out: Vec<(String, u64)>,
    /// `--address-entries`.
    pub address_capacity: u64,
    /// No-endpoint drop addresses over `--address-entries`.
    pub drop_destinations_left_out: u64,
    pub attached_interfaces: u64,
    pub ready: bool,
    /// Whether `--vip-iface` exists (health-check detection waits for it otherwise).
    pub vip_iface_present: bool,
    pub unconfirmed_suspects: u64,
    pub pending: u64,
    pub events_read: u64,
    /// Immediate reader wake-ups by confirming records; confirming records the per-CPU wake-up
    /// budget left to the reader's timer.
    pub reader_wakeups: u64,
    pub reader_wakeups_suppressed: u64,
    /// (capability, available).
    pub capabilities: Vec<(String, bool)>,
    pub kube_connected: bool,
    /// Kubernetes Event writes: (result, count).
    pub kube_event_writes: Vec<(String, u64)>,
    /// `--events` / `--record`: (output, lines lost, stalled now).
    pub outputs: Vec<(String, u64, bool)>,
    /// `--otlp-endpoint`: (signal, exported, dropped); empty when OTLP export is off.
    pub otlp: Vec<(String, u64, u64)>,
    /// Confirmed loops by state, resolutions and regressions, by kind.
    pub loops: probe_contract::LoopLifecycle,
    /// The node report's failed writes, by object (`report`, `condition`); empty without
    /// `--node-report on`.
    pub kube_writes_failed: Vec<(String, u64)>,
    /// Why the node report writes nothing (E12), if it does not.
    pub node_report_refused: Option<String>,
    /// The canary's tests by outcome; verify requests answered by phase.
    pub canary_tests: Vec<(String, u64)>,
    pub verify_requests: Vec<(String, u64)>,
    /// Verify requests refused by a rate limit, by limit (node, requester).
    pub verify_rate_limited: Vec<(String, u64)>,
}

impl MetricsInput {
    pub fn from_snapshot(snap: &Snapshot, events: &EventTotals, version: &str) -> Self {
        let ifname = |ifindex: u32| {
            snap.status
                .attached
                .iter()
                .find(|(_, i)| *i == ifindex)
                .map(|(n, _)| n.clone())
                .unwrap_or_else(|| format!("if{ifindex}"))
        };
        let mut suspects: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (ifindex, tag, _, n) in &snap.counters.suspects {
            *suspects
                .entry((ifname(*ifindex), tag.as_str().to_string()))
                .or_insert(0) += n;
        }
        let c = &snap.counters;
        Self {
            version: version.to_string(),
            kernel: snap
                .status
                .features
                .as_ref()
                .map(|f| f.kernel.clone())
                .unwrap_or_default(),
            process: super::process::read(),
            events: events.totals.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            events_by_owner: events
                .by_owner
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            owner_counts: snap
                .status
                .owner_counts
                .iter()
                .map(|(k, v)| (k.clone(), *v as u64))
                .collect(),
            suspects: suspects
                .into_iter()
                .map(|((nic, source), n)| (nic, source, n))
                .collect(),
            drops_by_reason: snap
                .drops_by_reason
                .iter()
                .map(|(r, n)| (r.clone(), *n))
                .collect(),
            suppressed: vec![
                ("budget".into(), c.budget_suppressed),
                ("ringbuf".into(), c.ringbuf_full),
                ("dedup".into(), c.dedup_suppressed),
                ("queue".into(), snap.userspace_queue_full),
            ],
            budget_suppressed_by_class: c
                .budget_suppressed_by_class
                .iter()
                .map(|(record, source, n)| (record.to_string(), source.to_string(), *n))
                .collect(),
            set_sizes: per_tag(&snap.status.set_sizes),
            addresses_left_out: per_tag(&snap.status.left_out),
            address_capacity: u64::from(snap.status.address_capacity),
            drop_destinations_left_out: snap.status.drop_destinations_left_out as u64,
            attached_interfaces: snap.status.attached.len() as u64,
            ready: snap.status.ready,
            vip_iface_present: snap.status.vip_iface_present,
            unconfirmed_suspects: snap.correlator.suspects_unconfirmed,
            pending: snap.correlator.pending,
            events_read: snap.events_read,
            reader_wakeups: c.wakeups,
            reader_wakeups_suppressed: c.wakeup_budget_suppressed,
            capabilities: snap.capabilities.clone(),
            kube_connected: snap.kube_connected,
            kube_event_writes: snap.kube_event_writes.clone(),
            outputs: Vec::new(),
            otlp: Vec::new(),
            loops: probe_contract::LoopLifecycle {
                resolved: Vec::new(),
                ..snap.loops.clone()
            },
            kube_writes_failed: Vec::new(),
            node_report_refused: None,
            canary_tests: Vec::new(),
            verify_requests: Vec::new(),
            verify_rate_limited: Vec::new(),
        }
    }
}

/// A count per address tag, every tag of [`Tag::ALL`] in its order (0 where `counts` has none).
fn per_tag(counts: &BTreeMap<String, usize>) -> Vec<(String, u64)> {
    Tag::ALL
        .iter()
        .map(|t| {
            let n = counts.get(t.as_str()).copied().unwrap_or(0);
            (t.as_str().to_string(), n as u64)
        })
        .collect()
}

/// Confirmed-event totals fed from the report broadcast by a task of their own (aborted by
/// the caller): `/metrics` and the OTLP exporter each keep one.
pub fn feed_totals(hub: &View) -> (Arc<Mutex<EventTotals>>, tokio::task::JoinHandle<()>) {
    let totals = Arc::new(Mutex::new(EventTotals::default()));
    let feed = crate::sink::Subscription::to_view(hub).run(TotalsWriter(totals.clone()));
    (totals, feed)
}

/// The writer that adds each report to the totals.
struct TotalsWriter(Arc<Mutex<EventTotals>>);

impl crate::sink::Writer for TotalsWriter {
    async fn report(&mut self, report: &probe_contract::Confirmation) {
        if let Ok(mut t) = self.0.lock() {
            t.add(&report.event);
        }
    }

    /// Cumulative counts: the next report of an aggregate carries what was missed.
    fn lag_policy(&self) -> crate::sink::LagPolicy {
        crate::sink::LagPolicy::Ignore
    }
}

/// Everything one rendering shows, read now: the kernel's counters, the hub's, the totals.
pub fn gather(hub: &View, totals: &Mutex<EventTotals>) -> MetricsInput {
    let snap = hub.snapshot();
    let mut input = totals
        .lock()
        .map(|t| MetricsInput::from_snapshot(&snap, &t, hub.version()))
        .unwrap_or_default();
    let now = probe_contract::clock::monotonic_ns();
    input.outputs = hub
        .outputs()
        .iter()
        .map(|(name, s)| {
            let lost = s.lost.load(std::sync::atomic::Ordering::Relaxed);
            (name.to_string(), lost, s.stalled(now))
        })
        .collect();
    if let Some(otlp) = hub.otlp() {
        input.otlp = otlp.snapshot();
    }
    input.kube_writes_failed = hub.node_report().failed();
    input.node_report_refused = hub.node_report().refused();
    input.canary_tests = hub.test_traffic().canary_counts();
    input.verify_requests = hub.test_traffic().request_counts();
    input.verify_rate_limited = hub.test_traffic().rate_limited_counts();
    input
}

#[cfg(test)]
mod tests;
