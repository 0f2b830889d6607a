//! The exposition text of a [`MetricsInput`]: the label sets and the pure rendering (one
//! registry built per call, OpenMetrics; [`to_prometheus_text`] for scrapers that ask for the
//! Prometheus text format).

use std::collections::BTreeMap;

use prometheus_client::{
    encoding::{
        EncodeLabelSet,
        text::{encode_eof, encode_registry},
    },
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::MetricsInput;
use crate::sink::process::ProcessStats;

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
struct ObjectLabels {
    object: String,
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

    let writes_failed = Family::<ObjectLabels, Counter>::default();
    for (object, n) in &input.kube_writes_failed {
        writes_failed
            .get_or_create(&ObjectLabels {
                object: object.clone(),
            })
            .inc_by(*n);
    }
    reg.register(
        "kube_writes_failed",
        "Failed writes of the node report's objects: report (the LoopbackReport), condition (the Node condition); retried with a backoff up to the heartbeat",
        writes_failed,
    );
    let refused = Family::<ReasonLabels, Gauge<i64>>::default();
    if let Some(reason) = &input.node_report_refused {
        refused
            .get_or_create(&ReasonLabels {
                reason: reason.clone(),
            })
            .set(1);
    }
    reg.register(
        "node_report_refused",
        "1 while the agent writes no node report or condition, by reason: pod_on_other_node (its Pod is scheduled on another node than --node-name), own_pod_unreadable (cannot read its Pod yet)",
        refused,
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
