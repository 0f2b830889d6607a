//! The log records: each confirmed loopback ([`super::EVENT_NAME`], WARN) and each loop's
//! resolution ([`RESOLVED_EVENT_NAME`], INFO), queued without blocking and exported in
//! batches, every loss counted.

use std::{
    net::IpAddr,
    sync::{Arc, atomic::Ordering},
    time::SystemTime,
};

use opentelemetry::{
    InstrumentationScope,
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLoggerProvider};
use probe_contract::{LoopResolution, LoopbackEvent};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{EVENT_NAME, EXPORT_TIMEOUT, LOG_BATCH, LOG_QUEUE_EVENTS, OtlpConfig, SCOPE, resource};
use crate::hub::outputs::OtlpStats;

/// The log records' side of the sink: a [`crate::sink::Writer`] of the hub's reports.
pub struct OtlpLogs {
    pub(super) tx: mpsc::Sender<Record>,
    pub(super) stats: Arc<OtlpStats>,
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
        self.queue(Record::Loop(Box::new(event.clone())));
    }

    /// Queues a loop's resolution (`crate::resolution`); never blocks.
    pub fn write_resolution(&self, r: &LoopResolution) {
        self.queue(Record::Resolved(Box::new(r.clone())));
    }

    fn queue(&self, record: Record) {
        if self.tx.try_send(record).is_err() {
            self.stats.logs_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl crate::sink::Writer for OtlpLogs {
    /// One record per line the JSON stream shows (the same dedup), whether or not `--events`
    /// is on.
    async fn report(&mut self, report: &probe_contract::Confirmation) {
        if report.write_json {
            self.write(&report.event);
        }
    }

    async fn resolution(&mut self, r: &LoopResolution) {
        self.write_resolution(r);
    }

    /// A record missed is a record lost: counted (`clbprobe_otlp_dropped_total{signal="logs"}`).
    fn lag_policy(&self) -> crate::sink::LagPolicy {
        crate::sink::LagPolicy::Tell
    }

    async fn lost(&mut self, n: u64) {
        self.stats.logs_dropped.fetch_add(n, Ordering::Relaxed);
    }
}

/// What one log record tells.
#[derive(Debug)]
pub(super) enum Record {
    /// A confirmed loopback ([`EVENT_NAME`], WARN).
    Loop(Box<LoopbackEvent>),
    /// A loop resolved ([`RESOLVED_EVENT_NAME`], INFO).
    Resolved(Box<LoopResolution>),
}

/// The event name of a resolution's record.
pub const RESOLVED_EVENT_NAME: &str = "clb_probe.loop_resolved";

/// The attributes of a resolution's record: kind, loop, node, Service, VIP and port, how long
/// it lasted, its proof and what changed.
pub fn resolution_attributes(r: &LoopResolution, node: &str) -> Vec<(&'static str, AnyValue)> {
    let s = |v: &str| AnyValue::String(v.to_string().into());
    let list = |v: &[String]| AnyValue::ListAny(Box::new(v.iter().map(|l| s(l)).collect()));
    let mut out = vec![
        ("clb_probe.kind", s(r.kind.as_str())),
        ("clb_probe.loop", s(&r.key)),
        ("clb_probe.node", s(node)),
        ("clb_probe.lasted_s", AnyValue::Int(r.lasted_s as i64)),
        ("clb_probe.count", AnyValue::Int(r.count as i64)),
        ("clb_probe.episode", AnyValue::Int(i64::from(r.episode))),
        ("clb_probe.proof", list(&r.proof)),
        ("clb_probe.changed", list(&r.changed)),
    ];
    push_service(&mut out, r.service.as_deref(), r.vip, r.vip_port);
    out
}

/// The Service, VIP and port attributes a record has, in that order (absent facts left out).
fn push_service(
    out: &mut Vec<(&'static str, AnyValue)>,
    service: Option<&str>,
    vip: Option<IpAddr>,
    vip_port: Option<u16>,
) {
    let s = |v: &str| AnyValue::String(v.to_string().into());
    if let Some(v) = service {
        out.push(("clb_probe.service", s(v)));
    }
    if let Some(v) = vip {
        out.push(("clb_probe.vip", s(&v.to_string())));
    }
    if let Some(v) = vip_port {
        out.push(("clb_probe.vip_port", AnyValue::Int(i64::from(v))));
    }
}

/// The exporting task: a batch at a time, each with its deadline; one WARN when exports start
/// failing, one INFO when they work again. Ends when the sink is dropped.
async fn export_logs(
    exporter: opentelemetry_otlp::LogExporter,
    mut rx: mpsc::Receiver<Record>,
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
                match &e {
                    Record::Loop(e) => fill_record(&mut r, e, &node),
                    Record::Resolved(res) => fill_resolved(&mut r, res, &node),
                }
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
            failed => {
                stats.logs_dropped.fetch_add(n, Ordering::Relaxed);
                if !failing {
                    match failed {
                        Ok(Err(e)) => {
                            warn!(error = %e, "exporting OTLP log records (lost records are counted in clbprobe_otlp_dropped_total)");
                        }
                        _ => {
                            warn!(timeout = ?EXPORT_TIMEOUT, "exporting OTLP log records timed out (lost records are counted in clbprobe_otlp_dropped_total)");
                        }
                    }
                    failing = true;
                }
            }
        }
    }
}

/// The attributes of a confirmed event's record (docs/metrics-and-otlp.md), absent facts left out.
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
    push_service(&mut out, e.service.as_deref(), e.vip, e.vip_port);
    if let Some(v) = &e.client_pod {
        out.push(("clb_probe.client_pod", s(v)));
    }
    if let Some(fix) = e.fixes.first() {
        out.push(("clb_probe.fix", s(&fix.short())));
        out.push(("clb_probe.fix_id", s(&fix.id)));
    }
    out
}

/// A record's event name, its timestamps (now) and its severity.
fn stamp(
    r: &mut opentelemetry_sdk::logs::SdkLogRecord,
    event_name: &'static str,
    severity: Severity,
    severity_text: &'static str,
) {
    let now = SystemTime::now();
    r.set_event_name(event_name);
    r.set_timestamp(now);
    r.set_observed_timestamp(now);
    r.set_severity_number(severity);
    r.set_severity_text(severity_text);
}

fn fill_record(r: &mut opentelemetry_sdk::logs::SdkLogRecord, e: &LoopbackEvent, node: &str) {
    stamp(r, EVENT_NAME, Severity::Warn, "WARN");
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

fn fill_resolved(r: &mut opentelemetry_sdk::logs::SdkLogRecord, res: &LoopResolution, node: &str) {
    stamp(r, RESOLVED_EVENT_NAME, Severity::Info, "INFO");
    r.set_body(AnyValue::String(
        format!(
            "loop resolved: {} {} after {} s",
            res.kind.as_str(),
            res.service.as_deref().unwrap_or(&res.key),
            res.lasted_s
        )
        .into(),
    ));
    r.add_attributes(resolution_attributes(res, node));
}
