//! The metric side: the `/metrics` rendering parsed back into observable instruments, collected
//! by the SDK's periodic reader, every export's fate counted.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    pin::Pin,
    sync::{Arc, Mutex, atomic::Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use opentelemetry::{InstrumentationScope, KeyValue, metrics::MeterProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{
        PeriodicReader, SdkMeterProvider, Temporality, data::ResourceMetrics,
        exporter::PushMetricExporter,
    },
};
use tracing::{info, warn};

use super::{EXPORT_TIMEOUT, OtlpConfig, SCOPE, resource};
use crate::hub::{View, outputs::OtlpStats};

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
    pub fn start(pending: PendingMetrics, hub: &View, stats: Arc<OtlpStats>) -> Self {
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
        let (totals, feed) = crate::sink::metrics::feed_totals(hub);
        let cache: Cache = Default::default();
        let hub = hub.clone();
        let current = move || -> Arc<BTreeMap<String, Family>> {
            let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, families)) = &*c
                && at.elapsed() < REUSE
            {
                return families.clone();
            }
            let text = crate::sink::metrics::render(&crate::sink::metrics::gather(&hub, &totals));
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
        // The SDK's own timeout does not bound the final export (the exporter's deadline,
        // EXPORT_TIMEOUT, does: 5 s against a receiver that hangs). So the shutdown runs on a
        // thread of its own and is waited for at most SHUTDOWN_WAIT; the process exits anyway.
        let (done, wait) = std::sync::mpsc::channel();
        let provider = self.provider;
        let spawned = std::thread::Builder::new()
            .name("otlp-shutdown".into())
            .spawn(move || {
                let _ = provider.shutdown_with_timeout(SHUTDOWN_WAIT);
                let _ = done.send(());
            });
        if spawned.is_ok() && wait.recv_timeout(SHUTDOWN_WAIT).is_err() {
            warn!(
                wait = ?SHUTDOWN_WAIT,
                "the last OTLP metric export did not finish; exiting without it"
            );
        }
    }
}

/// How long SIGTERM waits for the last metric export: a receiver that hangs must not hold the
/// agent's exit (everything attached is already detached by then).
pub const SHUTDOWN_WAIT: Duration = Duration::from_millis(300);

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

/// The OpenMetrics text [`crate::sink::metrics::render`] writes, back as families (pure): `# HELP`
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
