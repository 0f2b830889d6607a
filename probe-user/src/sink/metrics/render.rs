//! The exposition text of a [`MetricsInput`]: the label sets and the pure rendering (one
//! registry built per call, OpenMetrics; [`to_prometheus_text`] for scrapers that ask for the
//! Prometheus text format).

use std::collections::BTreeMap;

use probe_contract::metrics::{self as m, Family, Type};
use prometheus_client::{
    encoding::text::{encode_eof, encode_registry},
    metrics::{counter::Counter, family::Family as Series, gauge::Gauge},
    registry::Registry,
};

use super::MetricsInput;
use crate::sink::process::ProcessStats;

/// One sample of a family: its label values (in the family's label order) and its value.
type Row = (Vec<String>, u64);

fn row<const N: usize>(labels: [&String; N], value: u64) -> Row {
    (labels.into_iter().cloned().collect(), value)
}

/// A family's rows: one per item, made by `to_row`.
fn rows<T>(items: impl IntoIterator<Item = T>, to_row: impl Fn(T) -> Row) -> Vec<Row> {
    items.into_iter().map(to_row).collect()
}

/// Renders the exposition text (pure): every family of the contract's table, in its order.
pub fn render(input: &MetricsInput) -> String {
    let mut reg = Registry::with_prefix(m::PREFIX);
    for (family, rows) in samples(input) {
        register(&mut reg, &family, rows);
    }
    let mut out = String::new();
    encode_registry(&mut out, &reg).expect("writing to a String cannot fail");
    if let Some(p) = &input.process {
        encode_registry(&mut out, &process_registry(p)).expect("writing to a String");
    }
    encode_eof(&mut out).expect("writing to a String cannot fail");
    out
}

/// Each family of [`m::FAMILIES`] with its samples from the input, in the table's order.
fn samples(input: &MetricsInput) -> Vec<(Family, Vec<Row>)> {
    let mut all = labelled(input);
    all.extend(single(input));
    let position = |f: &Family| m::FAMILIES.iter().position(|t| t.short == f.short);
    all.sort_by_key(|(f, _)| position(f));
    all
}

/// The families with labels: a row per label set.
fn labelled(input: &MetricsInput) -> Vec<(Family, Vec<Row>)> {
    let by_kind = |values: &BTreeMap<String, u64>| -> Vec<Row> {
        values.iter().map(|(k, n)| row([k], *n)).collect()
    };
    let pairs = |values: &[(String, u64)]| -> Vec<Row> {
        values.iter().map(|(k, n)| row([k], *n)).collect()
    };
    let l = &input.loops;
    vec![
        (
            m::LOOPBACK_EVENTS,
            rows(&input.events, |((k, v, p), n)| row([k, v, p], *n)),
        ),
        (
            m::SUSPECT_PACKETS,
            rows(&input.suspects, |(nic, src, n)| row([nic, src], *n)),
        ),
        (m::KERNEL_DROPS, pairs(&input.drops_by_reason)),
        (m::EVENTS_SUPPRESSED, pairs(&input.suppressed)),
        (
            m::EVENTS_BUDGET_SUPPRESSED,
            rows(&input.budget_suppressed_by_class, |(r, s, n)| {
                row([r, s], *n)
            }),
        ),
        (m::LOCAL_ADDRESSES, pairs(&input.set_sizes)),
        (
            m::LOCAL_ADDRESSES_LEFT_OUT,
            pairs(&input.addresses_left_out),
        ),
        (m::LOCAL_ADDRESS_OWNERS, pairs(&input.owner_counts)),
        (
            m::LOOPBACK_EVENTS_BY_OWNER,
            rows(&input.events_by_owner, |((k, o), n)| row([k, o], *n)),
        ),
        (m::BUILD_INFO, vec![row([&input.version, &input.kernel], 1)]),
        (
            m::CAPABILITY,
            rows(&input.capabilities, |(c, ok)| row([c], u64::from(*ok))),
        ),
        (m::KUBE_EVENT_WRITES, pairs(&input.kube_event_writes)),
        (m::KUBE_WRITES_FAILED, pairs(&input.kube_writes_failed)),
        (
            m::NODE_REPORT_REFUSED,
            rows(&input.node_report_refused, |r| row([r], 1)),
        ),
        (
            m::OUTPUT_LINES_LOST,
            rows(&input.outputs, |(o, n, _)| row([o], *n)),
        ),
        (
            m::OUTPUT_STALLED,
            rows(&input.outputs, |(o, _, now)| row([o], u64::from(*now))),
        ),
        (
            m::OTLP_EXPORTED,
            rows(&input.otlp, |(s, e, _)| row([s], *e)),
        ),
        (m::OTLP_DROPPED, rows(&input.otlp, |(s, _, d)| row([s], *d))),
        (m::LOOPBACK_ACTIVE, by_kind(&l.active)),
        (m::LOOPBACK_QUIET, by_kind(&l.quiet)),
        (m::LOOPBACK_RESOLUTIONS, by_kind(&l.resolutions)),
        (m::LOOPBACK_REGRESSIONS, by_kind(&l.regressions)),
        (m::CANARY_TESTS, pairs(&input.canary_tests)),
        (m::VERIFY_REQUESTS, pairs(&input.verify_requests)),
        (m::VERIFY_RATE_LIMITED, pairs(&input.verify_rate_limited)),
    ]
}

/// The families of one value each (no labels).
fn single(input: &MetricsInput) -> Vec<(Family, Vec<Row>)> {
    let one = |v: u64| vec![(Vec::new(), v)];
    vec![
        (m::LOCAL_ADDRESSES_CAPACITY, one(input.address_capacity)),
        (
            m::DROP_DESTINATIONS_LEFT_OUT,
            one(input.drop_destinations_left_out),
        ),
        (m::ATTACHED_INTERFACES, one(input.attached_interfaces)),
        (m::READY, one(u64::from(input.ready))),
        (m::KUBE_CONNECTED, one(u64::from(input.kube_connected))),
        (
            m::VIP_INTERFACE_PRESENT,
            one(u64::from(input.vip_iface_present)),
        ),
        (m::CORRELATOR_PENDING, one(input.pending)),
        (m::UNCONFIRMED_SUSPECTS, one(input.unconfirmed_suspects)),
        (m::KERNEL_EVENTS_READ, one(input.events_read)),
        (m::KERNEL_READER_WAKEUPS, one(input.reader_wakeups)),
        (
            m::KERNEL_READER_WAKEUPS_SUPPRESSED,
            one(input.reader_wakeups_suppressed),
        ),
    ]
}

/// Registers one family: a plain metric when it has no labels, else one series per row.
fn register(reg: &mut Registry, family: &Family, rows: Vec<Row>) {
    let gauge_value = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    if family.labels.is_empty() {
        let value = rows.iter().map(|(_, n)| n).sum::<u64>();
        match family.kind {
            Type::Counter => {
                let c = Counter::<u64>::default();
                c.inc_by(value);
                reg.register(family.short, family.help, c);
            }
            Type::Gauge => {
                let g = Gauge::<i64>::default();
                g.set(gauge_value(value));
                reg.register(family.short, family.help, g);
            }
        }
        return;
    }
    let labels = |values: Vec<String>| -> Vec<(&'static str, String)> {
        debug_assert_eq!(values.len(), family.labels.len(), "{}", family.short);
        family.labels.iter().copied().zip(values).collect()
    };
    match family.kind {
        Type::Counter => {
            let series = Series::<Vec<(&'static str, String)>, Counter>::default();
            for (values, n) in rows {
                series.get_or_create(&labels(values)).inc_by(n);
            }
            reg.register(family.short, family.help, series);
        }
        Type::Gauge => {
            let series = Series::<Vec<(&'static str, String)>, Gauge>::default();
            for (values, n) in rows {
                series.get_or_create(&labels(values)).set(gauge_value(n));
            }
            reg.register(family.short, family.help, series);
        }
    }
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
