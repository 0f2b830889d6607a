//! `--otlp-endpoint`: the `/metrics` counters as OTLP metrics and every confirmed loopback as
//! one OTLP log record, over gRPC (opentelemetry-otlp's tonic exporter) to a collector.
//!
//! Never on the correlation path, and bounded everywhere:
//! - Logs. [`OtlpLogs::write`] is called where `--events` writes its JSON line (the same
//!   dedup: one record per line the JSON stream shows) and only queues the event
//!   ([`LOG_QUEUE_EVENTS`], `try_send`). A task takes up to [`LOG_BATCH`] events at a time and
//!   exports them as one request with a deadline of [`EXPORT_TIMEOUT`]. A full queue (the
//!   receiver is slow or down) or a failed export loses those records, counted in
//!   `clbprobe_otlp_dropped_total{signal="logs"}`; detection goes on.
//! - Metrics. The SDK's periodic reader (a thread of its own) collects every `--otlp-interval`
//!   from observable instruments whose values are the `/metrics` rendering itself
//!   ([`super::metrics::render`], parsed back by [`parse_openmetrics`]): the same families,
//!   labels (as attributes) and values, so the two can never disagree (a family is rendered
//!   once it has a sample, so each new one gets its instrument at the next tick). Counters are
//!   cumulative monotonic sums named without `_total` (OTLP's convention: a collector's
//!   Prometheus exporter adds it back), gauges are gauges. A failed export is counted in
//!   `clbprobe_otlp_dropped_total{signal="metrics"}`; the next one carries the cumulative values.
//!
//! Plain gRPC only (`http://`): the collector is a node-local agent or an in-cluster Service;
//! TLS to it is not built in (the agent's only TLS stack is kube's, for the API server).

use std::{
    borrow::Cow,
    collections::BTreeMap,
    pin::Pin,
    sync::{Arc, Mutex, atomic::Ordering},
    task::{Context, Poll},
    time::{Duration, Instant, SystemTime},
};

use opentelemetry::{
    InstrumentationScope, KeyValue,
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
    metrics::MeterProvider as _,
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    logs::{LogBatch, LogExporter as _, SdkLoggerProvider},
    metrics::{
        PeriodicReader, SdkMeterProvider, Temporality, data::ResourceMetrics,
        exporter::PushMetricExporter,
    },
};
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use crate::hub::outputs::OtlpStats;
use crate::{correlate::LoopbackEvent, hub::Shared};

/// Confirmed events waiting for the log exporter: confirmations are few and aggregated, so
/// this is a long burst (as `--events`' queue).
pub const LOG_QUEUE_EVENTS: usize = 256;
/// Log records per export request.
pub const LOG_BATCH: usize = 64;
/// One export's deadline (retries included): a receiver that hangs costs this, then a drop.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// `--otlp-interval`'s default, in seconds: between metric exports.
pub const DEFAULT_INTERVAL_SECS: u64 = 10;
/// The instrumentation scope of both signals.
pub const SCOPE: &str = "clb-probe";
/// The log records' event name.
pub const EVENT_NAME: &str = "clb_probe.loopback";

/// `--otlp-endpoint` and `--otlp-interval`.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    pub endpoint: String,
    pub interval: Duration,
}

/// `--otlp-endpoint`'s parser: `http://HOST:PORT` (a path is allowed; `https` is not: TLS to
/// the collector is not built in).
pub fn parse_endpoint(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|e| {
        format!("not a URL ({e}): give http://HOST:PORT, e.g. http://otel-collector:4317")
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "https is not supported (the agent has no TLS client for OTLP): give the collector's plain gRPC endpoint, http://HOST:PORT".into(),
            );
        }
        _ => return Err("give http://HOST:PORT, e.g. http://otel-collector:4317".into()),
    }
    match uri.host() {
        Some(h) if !h.is_empty() => {}
        _ => return Err("no host: give http://HOST:PORT".into()),
    }
    Ok(s.to_string())
}

fn resource(node: &str) -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "clb-probe"),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("k8s.node.name", node.to_string()),
            KeyValue::new("host.name", node.to_string()),
        ])
        .build()
}

/// The log records' side of the sink, held by [`super::Sinks`].
pub struct OtlpLogs {
    tx: mpsc::Sender<LoopbackEvent>,
    stats: Arc<OtlpStats>,
}

impl OtlpLogs {
    /// Starts the exporting task; must run inside the tokio runtime (tonic's channel spawns its
    /// worker there). Nothing connects yet: a receiver that is down costs only drops later.
    pub fn start(cfg: &OtlpConfig, node: String, stats: Arc<OtlpStats>) -> anyhow::Result<Self> {
        let mut exporter = opentelemetry_otlp::LogExporter::builder()
            .with_tonic()
            .with_endpoint(cfg.endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| anyhow::anyhow!("--otlp-endpoint {}: {e}", cfg.endpoint))?;
        exporter.set_resource(&resource(&node));
        let (tx, rx) = mpsc::channel(LOG_QUEUE_EVENTS);
        tokio::spawn(export_logs(exporter, rx, stats.clone(), node));
        Ok(Self { tx, stats })
    }

    pub fn stats(&self) -> Arc<OtlpStats> {
        self.stats.clone()
    }

    /// Queues one event; never blocks (a full queue loses it, counted).
    pub fn write(&self, event: &LoopbackEvent) {
        if self.tx.try_send(event.clone()).is_err() {
            self.stats.logs_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The exporting task: a batch at a time, each with its deadline; one WARN when exports start
/// failing, one INFO when they work again. Ends when the sink is dropped.
async fn export_logs(
    exporter: opentelemetry_otlp::LogExporter,
    mut rx: mpsc::Receiver<LoopbackEvent>,
    stats: Arc<OtlpStats>,
    node: String,
) {
    // A provider without processors: only the record factory (records go out through
    // `exporter` here, where their fate is counted).
    let provider = SdkLoggerProvider::builder().build();
    let scope = InstrumentationScope::builder(SCOPE)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let logger = provider.logger_with_scope(scope.clone());
    let mut events = Vec::with_capacity(LOG_BATCH);
    let mut failing = false;
    while rx.recv_many(&mut events, LOG_BATCH).await > 0 {
        let records: Vec<_> = events
            .drain(..)
            .map(|e| {
                let mut r = logger.create_log_record();
                fill_record(&mut r, &e, &node);
                r
            })
            .collect();
        let pairs: Vec<_> = records.iter().map(|r| (r, &scope)).collect();
        let n = pairs.len() as u64;
        let res =
            tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(LogBatch::new(&pairs))).await;
        match res {
            Ok(Ok(())) => {
                stats.logs_exported.fetch_add(n, Ordering::Relaxed);
                if failing {
                    info!("exporting OTLP log records again");
                    failing = false;
                }
            }
            Ok(Err(e)) => {
                stats.logs_dropped.fetch_add(n, Ordering::Relaxed);
                if !failing {
                    warn!(error = %e, "exporting OTLP log records (lost records are counted in clbprobe_otlp_dropped_total)");
                    failing = true;
                }
            }
            Err(_) => {
                stats.logs_dropped.fetch_add(n, Ordering::Relaxed);
                if !failing {
                    warn!(timeout = ?EXPORT_TIMEOUT, "exporting OTLP log records timed out (lost records are counted in clbprobe_otlp_dropped_total)");
                    failing = true;
                }
            }
        }
    }
}

/// The attributes of a confirmed event's record (README, "OTLP export"), absent facts left out.
pub fn attributes(e: &LoopbackEvent, node: &str) -> Vec<(&'static str, AnyValue)> {
    let s = |v: &str| AnyValue::String(v.to_string().into());
    let mut out = vec![
        ("clb_probe.kind", s(e.kind.as_str())),
        ("clb_probe.key", s(&e.key)),
        ("clb_probe.node", s(e.node.as_deref().unwrap_or(node))),
        ("clb_probe.src", s(&e.src.to_string())),
        ("clb_probe.dst", s(&e.dst.to_string())),
        ("clb_probe.dst_port", AnyValue::Int(i64::from(e.dst_port))),
        ("clb_probe.count", AnyValue::Int(e.count as i64)),
        (
            "clb_probe.evidence",
            AnyValue::ListAny(Box::new(e.evidence.iter().map(|l| s(l)).collect())),
        ),
    ];
    if let Some(v) = &e.service {
        out.push(("clb_probe.service", s(v)));
    }
    if let Some(v) = e.vip {
        out.push(("clb_probe.vip", s(&v.to_string())));
    }
    if let Some(v) = e.vip_port {
        out.push(("clb_probe.vip_port", AnyValue::Int(i64::from(v))));
    }
    if let Some(v) = &e.client_pod {
        out.push(("clb_probe.client_pod", s(v)));
    }
    if let Some(fix) = e.fixes.first() {
        out.push(("clb_probe.fix", s(&fix.short())));
        out.push(("clb_probe.fix_id", s(&fix.id)));
    }
    out
}

fn fill_record(r: &mut opentelemetry_sdk::logs::SdkLogRecord, e: &LoopbackEvent, node: &str) {
    let now = SystemTime::now();
    r.set_event_name(EVENT_NAME);
    r.set_timestamp(now);
    r.set_observed_timestamp(now);
    r.set_severity_number(Severity::Warn);
    r.set_severity_text("WARN");
    let service = e
        .service
        .as_deref()
        .map(|s| format!(" (Service {s})"))
        .unwrap_or_default();
    r.set_body(AnyValue::String(
        format!(
            "confirmed loopback: {} {} -> {}:{}{service}",
            e.kind.as_str(),
            e.src,
            e.dst,
            e.dst_port
        )
        .into(),
    ));
    r.add_attributes(attributes(e, node));
}

/// The metrics side: the SDK's meter provider and its periodic reader, shut down (bounded)
/// by [`OtlpMetrics::shutdown`].
pub struct OtlpMetrics {
    provider: SdkMeterProvider,
    feed: tokio::task::JoinHandle<()>,
    register: tokio::task::JoinHandle<()>,
}

/// The latest rendering's families by name (rendered at most once per [`REUSE`]).
type Current = Arc<dyn Fn() -> Arc<BTreeMap<String, Family>> + Send + Sync>;

/// One observable instrument for `family`, observing its samples in each collection.
fn register_family(meter: &opentelemetry::metrics::Meter, family: &Family, current: Current) {
    let name = family.name.clone();
    let observe = move |observe: &dyn Fn(f64, &[KeyValue])| {
        if let Some(f) = current().get(&name) {
            for (labels, v) in &f.samples {
                let attrs: Vec<_> = labels
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
                    .collect();
                observe(*v, &attrs);
            }
        }
    };
    let help: Cow<'static, str> = family.help.clone().into();
    if family.counter {
        meter
            .f64_observable_counter(family.name.clone())
            .with_description(help)
            .with_callback(move |i| observe(&|v, a| i.observe(v, a)))
            .build();
    } else {
        meter
            .f64_observable_gauge(family.name.clone())
            .with_description(help)
            .with_callback(move |i| observe(&|v, a| i.observe(v, a)))
            .build();
    }
}

/// The metric exporter, built, waiting for the hub.
pub struct PendingMetrics {
    exporter: opentelemetry_otlp::MetricExporter,
    cfg: OtlpConfig,
    /// The resource's node name (as the log records').
    node: String,
}

/// One family of the `/metrics` rendering, parsed back.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The OTLP name: the family's name (counters without `_total`; an info's sample name).
    pub name: String,
    pub help: String,
    pub counter: bool,
    /// (labels, value) per sample.
    pub samples: Vec<Sample>,
}

/// How long one rendering is reused within a collection (one per family callback).
const REUSE: Duration = Duration::from_secs(1);

type Cache = Arc<Mutex<Option<(Instant, Arc<BTreeMap<String, Family>>)>>>;

impl OtlpMetrics {
    /// The exporter, built where the other outputs are opened (before anything is attached);
    /// must run inside the tokio runtime.
    pub fn exporter(cfg: &OtlpConfig, node: String) -> anyhow::Result<PendingMetrics> {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(cfg.endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_temporality(Temporality::Cumulative)
            .build()
            .map_err(|e| anyhow::anyhow!("--otlp-endpoint {}: {e}", cfg.endpoint))?;
        Ok(PendingMetrics {
            exporter,
            cfg: cfg.clone(),
            node,
        })
    }

    /// Registers one observable instrument per family `/metrics` renders now and starts the
    /// periodic reader.
    pub fn start(pending: PendingMetrics, shared: &Shared, stats: Arc<OtlpStats>) -> Self {
        let PendingMetrics {
            exporter,
            cfg,
            node,
        } = pending;
        let exporter = Counted {
            inner: exporter,
            stats,
            runtime: tokio::runtime::Handle::current(),
            failing: Default::default(),
        };
        let reader = PeriodicReader::builder(exporter)
            .with_interval(cfg.interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(resource(&node))
            .with_reader(reader)
            .build();
        let (totals, feed) = super::metrics::feed_totals(shared);
        let cache: Cache = Default::default();
        let shared = shared.clone();
        let current = move || -> Arc<BTreeMap<String, Family>> {
            let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, families)) = &*c
                && at.elapsed() < REUSE
            {
                return families.clone();
            }
            let text = super::metrics::render(&super::metrics::gather(&shared, &totals));
            let families: Arc<BTreeMap<_, _>> = Arc::new(
                parse_openmetrics(&text)
                    .into_iter()
                    .map(|f| (f.name.clone(), f))
                    .collect(),
            );
            *c = Some((Instant::now(), families.clone()));
            families
        };
        let current: Current = Arc::new(current);
        let meter = provider.meter_with_scope(
            InstrumentationScope::builder(SCOPE)
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        // A family shows in the rendering once it has a sample (an empty one is left out):
        // each new family gets its instrument at the next tick.
        let mut registered = std::collections::HashSet::new();
        let mut every = tokio::time::interval(cfg.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let register = tokio::spawn(async move {
            loop {
                every.tick().await;
                for family in current().values() {
                    if registered.insert(family.name.clone()) {
                        register_family(&meter, family, current.clone());
                    }
                }
            }
        });
        info!(endpoint = %cfg.endpoint, interval = ?cfg.interval, "exporting OTLP metrics and log records");
        Self {
            provider,
            feed,
            register,
        }
    }

    /// Stops the reader: one last export, bounded (a receiver that hangs does not hold the
    /// agent's exit).
    pub fn shutdown(self) {
        self.feed.abort();
        self.register.abort();
        let _ = self.provider.shutdown_with_timeout(Duration::from_secs(1));
    }
}

/// The OTLP metric exporter, counting each export's fate. The periodic reader polls it on
/// its own thread: each poll enters the agent's runtime (tonic's timers and channel live
/// there).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    stats: Arc<OtlpStats>,
    runtime: tokio::runtime::Handle,
    failing: std::sync::atomic::AtomicBool,
}

struct InRuntime<F> {
    runtime: tokio::runtime::Handle,
    fut: Pin<Box<F>>,
}

impl<F: Future> Future for InRuntime<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _entered = self.runtime.enter();
        self.fut.as_mut().poll(cx)
    }
}

impl<E: PushMetricExporter> PushMetricExporter for Counted<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        // Lazy: the deadline's timer is made at the first poll, inside the runtime.
        let export =
            async { tokio::time::timeout(EXPORT_TIMEOUT, self.inner.export(metrics)).await };
        let res = InRuntime {
            runtime: self.runtime.clone(),
            fut: Box::pin(export),
        }
        .await
        .unwrap_or(Err(opentelemetry_sdk::error::OTelSdkError::Timeout(
            EXPORT_TIMEOUT,
        )));
        match &res {
            Ok(()) => {
                self.stats.metrics_exported.fetch_add(1, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    info!("exporting OTLP metrics again");
                }
            }
            Err(e) => {
                self.stats.metrics_dropped.fetch_add(1, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    warn!(error = %e, "exporting OTLP metrics (failed exports are counted in clbprobe_otlp_dropped_total)");
                }
            }
        }
        res
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// The OpenMetrics text [`super::metrics::render`] writes, back as families (pure): `# HELP`
/// and `# TYPE` open a family, its samples follow. Counters lose `_total`, an info family is
/// named by its sample (`clbprobe_build_info`).
pub fn parse_openmetrics(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    let mut help: BTreeMap<&str, String> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, h)) = rest.split_once(' ') {
                help.insert(name, h.replace("\\n", "\n").replace("\\\\", "\\"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let Some((name, kind)) = rest.split_once(' ') else {
                continue;
            };
            let (otlp_name, counter) = match kind {
                "counter" => (name.to_string(), true),
                "info" => (format!("{name}_info"), false),
                _ => (name.to_string(), false),
            };
            out.push(Family {
                name: otlp_name,
                help: help.get(name).cloned().unwrap_or_default(),
                counter,
                samples: Vec::new(),
            });
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some(family) = out.last_mut() else {
            continue;
        };
        if let Some(sample) = parse_sample(line) {
            // `_created` and other suffixes than the counter's `_total` are not values.
            let (name, (labels, value)) = sample;
            let own = if family.counter {
                name.strip_suffix("_total") == Some(family.name.as_str())
            } else {
                name == family.name
            };
            if own {
                family.samples.push((labels, value));
            }
        }
    }
    out
}

/// A sample's labels, in order, and its value.
pub type Sample = (Vec<(String, String)>, f64);

/// `name{k="v",...} value`, with OpenMetrics' escapes in label values.
fn parse_sample(line: &str) -> Option<(&str, Sample)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices();
        let mut key = String::new();
        let end;
        loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    end = i + 1;
                    break;
                }
                ',' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        let (_, c) = chars.next()?;
                        match c {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                other => key.push(other),
            }
        }
        rest = &r[end..];
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((name, (labels, value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> LoopbackEvent {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        LoopbackEvent {
            kind: crate::correlate::LoopbackKind::Hairpin,
            key: "hairpin/198.19.1.10>203.0.113.10:80/tcp".into(),
            src: ip("198.19.1.10"),
            src_port: 40000,
            dst: ip("203.0.113.10"),
            dst_port: 80,
            vip: Some(ip("203.0.113.10")),
            vip_port: Some(80),
            proto: crate::event::Proto::Tcp,
            drop_reason: None,
            drop_location: None,
            snat: crate::correlate::SnatState::Unknown,
            outcome: crate::correlate::Outcome::Refused,
            count: 2,
            evidence: vec!["first line".into(), "second line".into()],
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
    fn records_carry_the_event_s_facts_and_leave_out_what_it_lacks() {
        let bare: BTreeMap<_, _> = attributes(&event(), "node-a").into_iter().collect();
        assert_eq!(bare["clb_probe.kind"], AnyValue::from("hairpin"));
        assert_eq!(bare["clb_probe.node"], AnyValue::from("node-a"));
        assert_eq!(bare["clb_probe.vip"], AnyValue::from("203.0.113.10"));
        assert_eq!(bare["clb_probe.vip_port"], AnyValue::Int(80));
        assert_eq!(bare["clb_probe.count"], AnyValue::Int(2));
        assert_eq!(
            bare["clb_probe.evidence"],
            AnyValue::ListAny(Box::new(vec![
                AnyValue::from("first line"),
                AnyValue::from("second line")
            ]))
        );
        for absent in ["clb_probe.service", "clb_probe.client_pod", "clb_probe.fix"] {
            assert!(!bare.contains_key(absent), "{absent}");
        }
        let mut e = event();
        e.node = Some("clb-node".into());
        e.service = Some("default/web".into());
        e.client_pod = Some("default/client".into());
        e.fixes = vec![
            probe_contract::Fix {
                id: "etp-cluster".into(),
                provider: "generic".into(),
                change: "Set externalTrafficPolicy: Cluster".into(),
                service: None,
                patch: None,
                undo: None,
                preconditions: vec![],
                side_effects: vec![],
                source: String::new(),
            },
            probe_contract::Fix {
                id: "second".into(),
                provider: "generic".into(),
                change: "not this one".into(),
                service: None,
                patch: None,
                undo: None,
                preconditions: vec![],
                side_effects: vec![],
                source: String::new(),
            },
        ];
        let full: BTreeMap<_, _> = attributes(&e, "node-a").into_iter().collect();
        assert_eq!(full["clb_probe.node"], AnyValue::from("clb-node"));
        assert_eq!(full["clb_probe.service"], AnyValue::from("default/web"));
        assert_eq!(
            full["clb_probe.client_pod"],
            AnyValue::from("default/client")
        );
        assert_eq!(
            full["clb_probe.fix"],
            AnyValue::from("etp-cluster: Set externalTrafficPolicy: Cluster")
        );
        assert_eq!(full["clb_probe.fix_id"], AnyValue::from("etp-cluster"));
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_never_blocks() {
        let (tx, _rx) = mpsc::channel(2);
        let stats = Arc::new(OtlpStats::default());
        let sink = OtlpLogs {
            tx,
            stats: stats.clone(),
        };
        // Were a write to wait for the exporter, this would never end.
        for _ in 0..100 {
            sink.write(&event());
        }
        assert_eq!(stats.logs_dropped.load(Ordering::Relaxed), 98);
    }

    #[test]
    fn endpoints_are_checked() {
        assert!(parse_endpoint("http://127.0.0.1:4317").is_ok());
        assert!(parse_endpoint("http://otel-collector.monitoring:4317/").is_ok());
        for bad in [
            "",
            "not a url",
            "127.0.0.1:4317",
            "https://c:4317",
            "ftp://c:1",
            "http://:4317",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_metrics_rendering_parses_back_into_the_same_families_and_values() {
        let mut input = super::super::metrics::MetricsInput {
            version: "0.1.0".into(),
            kernel: "6.12 \"x\"".into(),
            events: vec![(("hairpin".into(), "203.0.113.10".into(), "80".into()), 3)],
            otlp: vec![("logs".into(), 1, 2)],
            ..Default::default()
        };
        input.suspects = vec![("eth0".into(), "vip".into(), 7)];
        let text = super::super::metrics::render(&input);
        let families: BTreeMap<_, _> = parse_openmetrics(&text)
            .into_iter()
            .map(|f| (f.name.clone(), f))
            .collect();
        let events = &families["clbprobe_loopback_events"];
        assert!(events.counter);
        assert!(events.help.starts_with("Confirmed load-balancer loopback"));
        assert_eq!(
            events.samples,
            vec![(
                vec![
                    ("kind".into(), "hairpin".into()),
                    ("vip".into(), "203.0.113.10".into()),
                    ("port".into(), "80".into())
                ],
                3.0
            )]
        );
        assert_eq!(
            families["clbprobe_otlp_dropped"].samples,
            vec![(vec![("signal".into(), "logs".into())], 2.0)]
        );
        let build = &families["clbprobe_build_info"];
        assert!(!build.counter);
        assert_eq!(
            build.samples[0].0,
            vec![
                ("version".into(), "0.1.0".into()),
                ("kernel".into(), "6.12 \"x\"".into())
            ]
        );
        assert!(!families["clbprobe_ready"].counter);
        // Every sample line of the text is one family's sample: nothing is lost.
        let lines = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
        let samples: usize = families.values().map(|f| f.samples.len()).sum();
        assert_eq!(lines, samples, "{text}");
    }
}
