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
//! exist: anyone who can connect to a bound VIP's unserved ports (an unprivileged local user, a
//! tenant pod) makes one new aggregate per port, and a series is never pruned (a counter that
//! vanished and came back would read as a reset). Past the cap, a new (vip, port) is counted
//! under `vip="other", port="other"` of its kind: the totals stay exact, the series bounded.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use hyper::StatusCode;
use prometheus_client::{
    encoding::{
        EncodeLabelSet,
        text::{encode_eof, encode_registry},
    },
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::sync::broadcast;

use super::process::ProcessStats;
use crate::{
    correlate::LoopbackEvent,
    event::Tag,
    hub::{NodeStatus, Shared, Snapshot},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    kind: String,
    vip: String,
    port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SuspectLabels {
    nic: String,
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetClassLabels {
    record: String,
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SetLabels {
    set: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OwnerLabels {
    owner: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindOwnerLabels {
    kind: String,
    owner: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapabilityLabels {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutputLabels {
    output: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    kernel: String,
}

/// Confirmed-event totals by (kind, vip, port), fed from the report stream.
#[derive(Debug, Default)]
pub struct EventTotals {
    totals: BTreeMap<(String, String, String), u64>,
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

/// `clbprobe_loopback_events_total` series with their own (vip, port) labels; further pairs are
/// counted under [`OVERFLOW_LABEL`] (README, "Metrics"). A node has a few dozen VIP ports that
/// matter; 500 keeps them all and /metrics small (each series is about 100 bytes).
pub const EVENT_SERIES: usize = 500;
/// The `vip` and `port` label value of the overflow series.
pub const OVERFLOW_LABEL: &str = "other";

impl EventTotals {
    pub fn add(&mut self, e: &LoopbackEvent) {
        self.seq += 1;
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
        let mut labels = (
            e.kind.as_str().to_string(),
            e.vip.map(|v| v.to_string()).unwrap_or_default(),
            e.vip_port.map(|p| p.to_string()).unwrap_or_default(),
        );
        if !self.totals.contains_key(&labels) && self.totals.len() >= EVENT_SERIES {
            labels.1 = OVERFLOW_LABEL.to_string();
            labels.2 = OVERFLOW_LABEL.to_string();
        }
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
            set_sizes: Tag::ALL
                .iter()
                .map(|t| {
                    let n = snap.status.set_sizes.get(t.as_str()).copied().unwrap_or(0);
                    (t.as_str().to_string(), n as u64)
                })
                .collect(),
            addresses_left_out: Tag::ALL
                .iter()
                .map(|t| {
                    let n = snap.status.left_out.get(t.as_str()).copied().unwrap_or(0);
                    (t.as_str().to_string(), n as u64)
                })
                .collect(),
            address_capacity: u64::from(snap.status.address_capacity),
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
        }
    }
}

/// Renders the exposition text (pure).
pub fn render(input: &MetricsInput) -> String {
    let mut reg = Registry::with_prefix("clbprobe");

    let events = Family::<EventLabels, Counter>::default();
    for ((kind, vip, port), n) in &input.events {
        events
            .get_or_create(&EventLabels {
                kind: kind.clone(),
                vip: vip.clone(),
                port: port.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "loopback_events",
        "Confirmed load-balancer loopback events, by kind, VIP and VIP port",
        events,
    );

    let suspects = Family::<SuspectLabels, Counter>::default();
    for (nic, source, n) in &input.suspects {
        suspects
            .get_or_create(&SuspectLabels {
                nic: nic.clone(),
                source: source.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "suspect_packets",
        "Packets arriving on a NIC with one of the node's own addresses as source (exact kernel counts)",
        suspects,
    );

    let drops = Family::<ReasonLabels, Counter>::default();
    for (reason, n) in &input.drops_by_reason {
        drops
            .get_or_create(&ReasonLabels {
                reason: reason.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "kernel_drops",
        "Kernel drops of suspect packets and of packets to bound VIPs, by kernel drop reason",
        drops,
    );

    let suppressed = Family::<StageLabels, Counter>::default();
    for (stage, n) in &input.suppressed {
        suppressed
            .get_or_create(&StageLabels {
                stage: stage.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "events_suppressed",
        "Events not delivered: kernel budget, full ring buffer, kernel per-flow dedup, userspace queue",
        suppressed,
    );

    let by_class = Family::<BudgetClassLabels, Counter>::default();
    for (record, source, n) in &input.budget_suppressed_by_class {
        by_class
            .get_or_create(&BudgetClassLabels {
                record: record.clone(),
                source: source.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "events_budget_suppressed",
        "Kernel records the per-CPU budget suppressed, by record kind and source (each pair has its own budget)",
        by_class,
    );

    let sets = Family::<SetLabels, Gauge>::default();
    for (set, n) in &input.set_sizes {
        sets.get_or_create(&SetLabels { set: set.clone() })
            .set(*n as i64);
    }
    reg.register(
        "local_addresses",
        "Prefixes of the node's address sets held in the kernel maps the datapath matches against",
        sets,
    );
    let left_out = Family::<SetLabels, Gauge>::default();
    for (set, n) in &input.addresses_left_out {
        left_out
            .get_or_create(&SetLabels { set: set.clone() })
            .set(*n as i64);
    }
    reg.register(
        "local_addresses_left_out",
        "Prefixes of the node not in the kernel maps because they are full (--address-entries): their traffic is not seen",
        left_out,
    );
    let capacity = Gauge::<i64>::default();
    capacity.set(input.address_capacity as i64);
    reg.register(
        "local_addresses_capacity",
        "Entries each kernel address map holds (--address-entries; IPv4 and IPv6 hosts and prefixes each have a map)",
        capacity,
    );

    let owners = Family::<OwnerLabels, Gauge>::default();
    for (owner, n) in &input.owner_counts {
        owners
            .get_or_create(&OwnerLabels {
                owner: owner.clone(),
            })
            .set(*n as i64);
    }
    reg.register(
        "local_address_owners",
        "Local addresses (node and VIP sets) by what made them local: the VIP interface \
         (kube-ipvs0), an address on a NIC (nic:NAME), a local route of table local \
         (route:PROTOCOL, 66 = cloud guest agent)",
        owners,
    );

    let by_owner = Family::<KindOwnerLabels, Counter>::default();
    for ((kind, owner), n) in &input.events_by_owner {
        by_owner
            .get_or_create(&KindOwnerLabels {
                kind: kind.clone(),
                owner: owner.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "loopback_events_by_owner",
        "Confirmed loopback events whose local address has a known owner, by kind and owner \
         (see local_address_owners)",
        by_owner,
    );

    let build = Family::<BuildLabels, Gauge>::default();
    build
        .get_or_create(&BuildLabels {
            version: input.version.clone(),
            kernel: input.kernel.clone(),
        })
        .set(1);
    reg.register("build_info", "Build and kernel of this agent", build);

    let caps = Family::<CapabilityLabels, Gauge>::default();
    for (name, available) in &input.capabilities {
        caps.get_or_create(&CapabilityLabels { name: name.clone() })
            .set(i64::from(*available));
    }
    reg.register(
        "capability",
        "1 when the agent can confirm what this needs (drop_hook, drop_sites, conntrack), 0 when it cannot (said once in the log)",
        caps,
    );

    let kube_writes = Family::<ResultLabels, Counter>::default();
    for (result, n) in &input.kube_event_writes {
        kube_writes
            .get_or_create(&ResultLabels {
                result: result.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "kube_event_writes",
        "Kubernetes Event writes by result: created, patched, failed (403, unreachable), rate_limited (held by the token bucket), dropped (reports missed by the writer)",
        kube_writes,
    );

    let gauge = |v: u64| {
        let g = Gauge::<i64>::default();
        g.set(v as i64);
        g
    };
    reg.register(
        "attached_interfaces",
        "Interfaces with the tc programs attached",
        gauge(input.attached_interfaces),
    );
    reg.register(
        "ready",
        "1 when programs are attached and the address sets loaded",
        gauge(u64::from(input.ready)),
    );
    reg.register(
        "kube_connected",
        "1 when Kubernetes attribution lists and watches pods, Services and EndpointSlices; 0 without API access (events are then not named)",
        gauge(u64::from(input.kube_connected)),
    );
    reg.register(
        "vip_interface_present",
        "1 when the --vip-iface interface exists (health-check blackholes are detected only then)",
        gauge(u64::from(input.vip_iface_present)),
    );
    reg.register(
        "correlator_pending",
        "Suspects, drops and hairpin candidates awaiting confirmation",
        gauge(input.pending),
    );
    let counter = |v: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(v);
        c
    };
    reg.register(
        "unconfirmed_suspects",
        "Suspects that no rule confirmed (counted, never reported as loopback)",
        counter(input.unconfirmed_suspects),
    );
    reg.register(
        "kernel_events_read",
        "Records read from the kernel ring buffer",
        counter(input.events_read),
    );
    reg.register(
        "kernel_reader_wakeups",
        "Immediate ring buffer reader wake-ups by records that can confirm an event",
        counter(input.reader_wakeups),
    );
    reg.register(
        "kernel_reader_wakeups_suppressed",
        "Confirming records left to the reader's timer: the per-CPU wake-up budget was spent",
        counter(input.reader_wakeups_suppressed),
    );

    let lost = Family::<OutputLabels, Counter>::default();
    let stalled = Family::<OutputLabels, Gauge>::default();
    for (output, n, now) in &input.outputs {
        let labels = OutputLabels {
            output: output.clone(),
        };
        lost.get_or_create(&labels).inc_by(*n);
        stalled.get_or_create(&labels).set(i64::from(*now));
    }
    reg.register(
        "output_lines_lost",
        "JSON lines --events / --record did not write: its writer fell behind (a reader that stops reading, a stalled disk) or the write failed; detection is never held back",
        lost,
    );
    reg.register(
        "output_stalled",
        "1 while a write to --events / --record has been blocked for more than a second",
        stalled,
    );

    let exported = Family::<SignalLabels, Counter>::default();
    let dropped = Family::<SignalLabels, Counter>::default();
    for (signal, e, d) in &input.otlp {
        let labels = SignalLabels {
            signal: signal.clone(),
        };
        exported.get_or_create(&labels).inc_by(*e);
        dropped.get_or_create(&labels).inc_by(*d);
    }
    reg.register(
        "otlp_exported",
        "--otlp-endpoint: log records (signal=logs, one per confirmed event) and metric exports (signal=metrics) the receiver accepted",
        exported,
    );
    reg.register(
        "otlp_dropped",
        "--otlp-endpoint: log records lost (queue full: the receiver is slow or down; export failed or timed out) and metric exports that failed; detection is never held back",
        dropped,
    );

    let gauges = |values: &BTreeMap<String, u64>| {
        let f = Family::<KindLabels, Gauge>::default();
        for (kind, n) in values {
            f.get_or_create(&KindLabels { kind: kind.clone() })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        f
    };
    let counters = |values: &BTreeMap<String, u64>| {
        let f = Family::<KindLabels, Counter>::default();
        for (kind, n) in values {
            f.get_or_create(&KindLabels { kind: kind.clone() })
                .inc_by(*n);
        }
        f
    };
    let l = &input.loops;
    reg.register(
        "loopback_active",
        "Confirmed loops still recurring (confirmed within --resolve-after), by kind",
        gauges(&l.active),
    );
    reg.register(
        "loopback_quiet",
        "Loops no longer confirmed but not proven gone: no answered traffic of their shape seen since, by kind",
        gauges(&l.quiet),
    );
    reg.register(
        "loopback_resolutions",
        "Loops resolved: unconfirmed for --resolve-after while their traffic was seen answered, by kind",
        counters(&l.resolutions),
    );
    reg.register(
        "loopback_regressions",
        "Resolved loops confirmed again (each opens a new Warning Event), by kind",
        counters(&l.regressions),
    );

    let mut out = String::new();
    encode_registry(&mut out, &reg).expect("writing to a String cannot fail");
    if let Some(p) = &input.process {
        encode_registry(&mut out, &process_registry(p)).expect("writing to a String");
    }
    encode_eof(&mut out).expect("writing to a String cannot fail");
    out
}

/// The standard `process_*` families (no prefix).
fn process_registry(p: &ProcessStats) -> Registry {
    use std::sync::atomic::AtomicU64;
    let mut reg = Registry::default();
    let counter = Counter::<f64, AtomicU64>::default();
    counter.inc_by(p.cpu_seconds);
    reg.register(
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds",
        counter,
    );
    for (name, help, value) in [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            p.resident_bytes as f64,
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            p.virtual_bytes as f64,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors",
            p.open_fds as f64,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors",
            p.max_fds as f64,
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            p.start_time_seconds,
        ),
    ] {
        let gauge = Gauge::<f64, AtomicU64>::default();
        gauge.set(value);
        reg.register(name, help, gauge);
    }
    reg
}

/// The classic Prometheus text format (0.0.4) from the OpenMetrics text: counters are named
/// with their `_total` suffix in `# HELP`/`# TYPE`, and there is no `# EOF`. Served to scrapers
/// that do not ask for OpenMetrics (curl, older agents); `promtool check metrics` reads it.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Confirmed-event totals fed from the report broadcast by a task of their own (aborted by
/// the caller): `/metrics` and the OTLP exporter each keep one.
pub fn feed_totals(shared: &Shared) -> (Arc<Mutex<EventTotals>>, tokio::task::JoinHandle<()>) {
    let totals = Arc::new(Mutex::new(EventTotals::default()));
    let mut reports = shared.subscribe();
    let feed = {
        let totals = totals.clone();
        tokio::spawn(async move {
            loop {
                match reports.recv().await {
                    Ok(report) => {
                        if let Ok(mut t) = totals.lock() {
                            t.add(&report.event);
                        }
                    }
                    // Cumulative counts: the next report of an aggregate carries what was missed.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        })
    };
    (totals, feed)
}

/// Everything one rendering shows, read now: the kernel's counters, the hub's, the totals.
pub fn gather(shared: &Shared, totals: &Mutex<EventTotals>) -> MetricsInput {
    let snap = shared.snapshot();
    let mut input = totals
        .lock()
        .map(|t| MetricsInput::from_snapshot(&snap, &t, shared.version))
        .unwrap_or_default();
    let now = crate::event::monotonic_ns();
    input.outputs = shared
        .outputs
        .iter()
        .map(|(name, s)| {
            let lost = s.lost.load(std::sync::atomic::Ordering::Relaxed);
            (name.to_string(), lost, s.stalled(now))
        })
        .collect();
    if let Some(otlp) = &shared.otlp {
        input.otlp = otlp.snapshot();
    }
    input
}

/// Serves `/metrics`, `/healthz` and `/readyz` on an already bound listener until `stop`
/// resolves (see [`super::http`] for the connection bounds).
pub async fn serve(
    listener: std::net::TcpListener,
    shared: Shared,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (totals, feed) = feed_totals(&shared);
    // The last rendering and when: a flood of scrapes costs at most one rendering (kernel
    // counters read, registry encoded) per RENDER_REUSE, so `/healthz` keeps its share.
    let cache: Mutex<Option<(std::time::Instant, String)>> = Mutex::new(None);
    let route = move |path: &str, headers: &hyper::HeaderMap| -> super::http::Reply {
        match path {
            "/metrics" => {
                let wants_openmetrics = headers
                    .get_all(hyper::header::ACCEPT)
                    .iter()
                    .any(|v| v.to_str().is_ok_and(|v| v.contains("openmetrics")));
                let mut cached = cache.lock().unwrap_or_else(|e| e.into_inner());
                let text = match &*cached {
                    Some((at, text)) if at.elapsed() < RENDER_REUSE => text.clone(),
                    _ => {
                        let text = render(&gather(&shared, &totals));
                        *cached = Some((std::time::Instant::now(), text.clone()));
                        text
                    }
                };
                drop(cached);
                if wants_openmetrics {
                    (
                        StatusCode::OK,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        text,
                    )
                } else {
                    (
                        StatusCode::OK,
                        "text/plain; version=0.0.4; charset=utf-8",
                        to_prometheus_text(&text),
                    )
                }
            }
            "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
            "/readyz" => {
                let (ready, body) = readiness(&shared.status.borrow());
                let status = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (status, "text/plain", body)
            }
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found\n".to_string(),
            ),
        }
    };
    let result = super::http::serve(listener, route, stop).await;
    feed.abort();
    result
}

/// How long one `/metrics` rendering is served again (scrapers come every 10 s or more).
pub const RENDER_REUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// `/readyz`: ready once programs are attached and the address sets loaded; the body names
/// what health-check detection still waits for (an absent VIP interface does not make the
/// agent unready: the other detections work, and the interface may appear later).
pub fn readiness(status: &NodeStatus) -> (bool, String) {
    if !status.ready {
        return (false, "not ready: attaching\n".to_string());
    }
    let mut body = "ready".to_string();
    if !status.vip_iface_present {
        body.push_str(&format!(
            "; VIP interface {:?} absent: health-check blackholes are not detected until it appears",
            status.vip_iface
        ));
    }
    // Still ready: the addresses that fit are watched, and a node's address count must not be
    // able to take every agent out of its DaemonSet's rollout.
    let left_out: usize = status.left_out.values().sum();
    if left_out > 0 {
        body.push_str(&format!(
            "; {left_out} addresses over --address-entries ({}) are not watched",
            status.address_capacity
        ));
    }
    body.push('\n');
    (true, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> MetricsInput {
        MetricsInput {
            version: "0.1.0".into(),
            kernel: "6.18.44".into(),
            process: Some(ProcessStats {
                cpu_seconds: 1.5,
                resident_bytes: 20 << 20,
                ..ProcessStats::default()
            }),
            events: vec![
                (
                    (
                        "healthcheck_blackhole".into(),
                        "203.0.113.10".into(),
                        String::new(),
                    ),
                    3,
                ),
                (("hairpin".into(), "203.0.113.10".into(), "80".into()), 1),
            ],
            events_by_owner: vec![(("healthcheck_blackhole".into(), "route:66".into()), 3)],
            owner_counts: vec![("kube-ipvs0".into(), 1), ("route:66".into(), 1)],
            suspects: vec![("eth0".into(), "vip".into(), 7)],
            drops_by_reason: vec![("IP_LOCAL_SOURCE".into(), 5)],
            suppressed: vec![("budget".into(), 2), ("ringbuf".into(), 0)],
            budget_suppressed_by_class: vec![
                ("suspect".into(), "pod".into(), 2),
                ("drop".into(), "vip".into(), 0),
            ],
            set_sizes: vec![("vip".into(), 2), ("node".into(), 4), ("pod".into(), 2)],
            addresses_left_out: vec![("vip".into(), 50), ("node".into(), 0)],
            address_capacity: 256,
            attached_interfaces: 2,
            ready: true,
            vip_iface_present: true,
            unconfirmed_suspects: 1,
            pending: 0,
            events_read: 9,
            reader_wakeups: 4,
            reader_wakeups_suppressed: 1,
            capabilities: vec![("drop_hook".into(), true), ("drop_sites".into(), false)],
            kube_connected: false,
            kube_event_writes: vec![("created".into(), 1), ("failed".into(), 2)],
            outputs: vec![("events".into(), 3, true)],
            otlp: vec![("logs".into(), 4, 2), ("metrics".into(), 5, 1)],
            loops: probe_contract::LoopLifecycle {
                active: [("hairpin".to_string(), 0)].into_iter().collect(),
                quiet: [("hairpin".to_string(), 1)].into_iter().collect(),
                resolutions: [("hairpin".to_string(), 2)].into_iter().collect(),
                regressions: [("hairpin".to_string(), 1)].into_iter().collect(),
                resolved: Vec::new(),
            },
        }
    }

    #[test]
    fn renders_every_family_with_bounded_labels() {
        let text = render(&input());
        for line in [
            "clbprobe_loopback_events_total{kind=\"healthcheck_blackhole\",vip=\"203.0.113.10\",port=\"\"} 3",
            "clbprobe_loopback_events_total{kind=\"hairpin\",vip=\"203.0.113.10\",port=\"80\"} 1",
            "clbprobe_suspect_packets_total{nic=\"eth0\",source=\"vip\"} 7",
            "clbprobe_otlp_dropped_total{signal=\"logs\"} 2",
            "clbprobe_otlp_exported_total{signal=\"metrics\"} 5",
            "clbprobe_kernel_drops_total{reason=\"IP_LOCAL_SOURCE\"} 5",
            "clbprobe_events_suppressed_total{stage=\"budget\"} 2",
            "clbprobe_events_budget_suppressed_total{record=\"suspect\",source=\"pod\"} 2",
            "clbprobe_events_budget_suppressed_total{record=\"drop\",source=\"vip\"} 0",
            "clbprobe_local_addresses{set=\"vip\"} 2",
            "clbprobe_local_addresses_left_out{set=\"vip\"} 50",
            "clbprobe_local_addresses_capacity 256",
            "clbprobe_local_address_owners{owner=\"route:66\"} 1",
            "clbprobe_loopback_events_by_owner_total{kind=\"healthcheck_blackhole\",owner=\"route:66\"} 3",
            "clbprobe_build_info{version=\"0.1.0\",kernel=\"6.18.44\"} 1",
            "clbprobe_ready 1",
            "clbprobe_capability{name=\"drop_hook\"} 1",
            "clbprobe_capability{name=\"drop_sites\"} 0",
            "clbprobe_kube_connected 0",
            "clbprobe_vip_interface_present 1",
            "clbprobe_kernel_reader_wakeups_total 4",
            "clbprobe_kernel_reader_wakeups_suppressed_total 1",
            "clbprobe_kube_event_writes_total{result=\"failed\"} 2",
            "clbprobe_output_lines_lost_total{output=\"events\"} 3",
            "clbprobe_output_stalled{output=\"events\"} 1",
            "clbprobe_loopback_active{kind=\"hairpin\"} 0",
            "clbprobe_loopback_quiet{kind=\"hairpin\"} 1",
            "clbprobe_loopback_resolutions_total{kind=\"hairpin\"} 2",
            "clbprobe_loopback_regressions_total{kind=\"hairpin\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.trim_end().ends_with("# EOF"));
    }

    /// promtool is the reference checker of the exposition format.
    #[test]
    fn promtool_accepts_the_exposition() {
        let Ok(mut child) = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("skipping: promtool not installed (cargo xtask setup installs it)");
            return;
        };
        use std::io::Write as _;
        let text = to_prometheus_text(&render(&input()));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn sample_event() -> LoopbackEvent {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        LoopbackEvent {
            kind: crate::correlate::LoopbackKind::VipPortUnserved,
            key: "vip_port_unserved/203.0.113.10:443/tcp".into(),
            src: ip("198.19.1.10"),
            src_port: 40000,
            dst: ip("203.0.113.10"),
            dst_port: 443,
            vip: Some(ip("203.0.113.10")),
            vip_port: Some(443),
            proto: crate::event::Proto::Tcp,
            drop_reason: Some("NO_SOCKET".into()),
            drop_location: None,
            snat: crate::correlate::SnatState::Unknown,
            outcome: crate::correlate::Outcome::Refused,
            count: 1,
            evidence: vec![],
            remedy: vec![],
            first_seen_ns: 0,
            last_seen_ns: 0,
            nic: None,
            service: None,
            layer: None,
            client_pod: None,
            node: None,
            fixes: Vec::new(),
            facts: Default::default(),
            listener: None,
        }
    }

    #[test]
    fn event_totals_follow_cumulative_counts_and_never_go_back() {
        let mut t = EventTotals::default();
        let mut e = sample_event();
        e.count = 1;
        t.add(&e);
        e.count = 4; // three repeats whose reports were missed
        t.add(&e);
        e.count = 1; // evicted and re-created
        t.add(&e);
        let total: u64 = t.totals.values().sum();
        assert_eq!(total, 5);
    }

    /// More aggregates than the table remembers, each reported again right after the next one
    /// is created (as a live aggregate is): every occurrence counted exactly once.
    #[test]
    fn event_totals_stay_exact_past_the_bookkeeping_bound() {
        let mut t = EventTotals::default();
        let mut e = sample_event();
        let n = 3 * EVENT_TOTALS_KEYS as u64;
        for i in 0..n {
            e.key = format!("vip_port_unserved/203.0.113.10:{i}/tcp");
            e.count = 1;
            t.add(&e);
            if i > 0 {
                e.key = format!("vip_port_unserved/203.0.113.10:{}/tcp", i - 1);
                e.count = 2;
                t.add(&e);
            }
        }
        let total: u64 = t.totals.values().sum();
        assert_eq!(total, n + (n - 1));
        assert!(t.last.len() <= EVENT_TOTALS_KEYS && t.by_age.len() == t.last.len());
    }

    /// 5,000 distinct unserved ports (what uid 65534 made by connecting to them): the series stay
    /// under the cap plus one overflow series per kind, and the total is exact.
    #[test]
    fn event_series_are_capped_with_an_exact_overflow() {
        let mut t = EventTotals::default();
        let mut e = sample_event();
        for port in 0..5_000u16 {
            e.key = format!("vip_port_unserved/203.0.113.10:{port}/tcp");
            e.vip_port = Some(port);
            e.count = 1;
            t.add(&e);
            e.count = 3; // two repeats
            t.add(&e);
        }
        let input = MetricsInput {
            events: t.totals.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            ..MetricsInput::default()
        };
        let text = render(&input);
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("clbprobe_loopback_events_total{"))
            .collect();
        assert_eq!(series.len(), EVENT_SERIES + 1, "{}", series.len());
        let sum: u64 = series
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(sum, 15_000);
        let other = series
            .iter()
            .find(|l| l.contains("vip=\"other\",port=\"other\""))
            .expect("the overflow series");
        assert!(
            other.ends_with(&format!(" {}", 3 * (5_000 - EVENT_SERIES))),
            "{other}"
        );
        // A pair with its own series keeps counting there after the cap is reached.
        let own = (
            "vip_port_unserved".to_string(),
            "203.0.113.10".to_string(),
            "0".to_string(),
        );
        assert_eq!(t.totals[&own], 3);
        e.vip_port = Some(0);
        e.key = "a new aggregate on port 0".into();
        e.count = 1;
        t.add(&e);
        assert_eq!(t.totals[&own], 4);
    }
}
