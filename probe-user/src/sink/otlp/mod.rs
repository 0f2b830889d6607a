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
//!   ([`crate::sink::metrics::render`], parsed back by [`parse_openmetrics`]): the same families,
//!   labels (as attributes) and values, so the two can never disagree (a family is rendered
//!   once it has a sample, so each new one gets its instrument at the next tick). Counters are
//!   cumulative monotonic sums named without `_total` (OTLP's convention: a collector's
//!   Prometheus exporter adds it back), gauges are gauges. A failed export is counted in
//!   `clbprobe_otlp_dropped_total{signal="metrics"}`; the next one carries the cumulative values.
//!
//! Plain gRPC only (`http://`): the collector is a node-local agent or an in-cluster Service;
//! TLS to it is not built in (the agent's only TLS stack is kube's, for the API server).
//!
//! Built with the `otlp` cargo feature (on by default); without it (`cargo xtask demo`'s
//! agent) the sink's types are empty ([`not_built`]) and `--otlp-endpoint` is refused by its
//! parser ([`EndpointError::NotBuilt`]).
//!
//! Rooms: this file holds the configuration and what both signals share; `logs` the log
//! records' queue and exporter, `metrics` the metric side.

#[cfg(feature = "otlp")]
mod logs;
#[cfg(feature = "otlp")]
mod metrics;
#[cfg(not(feature = "otlp"))]
mod not_built;

use std::time::Duration;

#[cfg(feature = "otlp")]
pub use logs::{OtlpLogs, RESOLVED_EVENT_NAME, attributes, resolution_attributes};
#[cfg(feature = "otlp")]
pub use metrics::{Family, OtlpMetrics, PendingMetrics, parse_openmetrics};
#[cfg(not(feature = "otlp"))]
pub use not_built::{OtlpLogs, OtlpMetrics, PendingMetrics};
#[cfg(feature = "otlp")]
use opentelemetry::KeyValue;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::Resource;

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

/// Why `--otlp-endpoint` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("not a URL ({0}): give http://HOST:PORT, e.g. http://otel-collector:4317")]
    NotAUrl(String),
    #[error(
        "https is not supported (the agent has no TLS client for OTLP): give the collector's plain gRPC endpoint, http://HOST:PORT"
    )]
    Https,
    #[error("give http://HOST:PORT, e.g. http://otel-collector:4317")]
    NotHttp,
    #[error("no host: give http://HOST:PORT")]
    NoHost,
    #[error(
        "this agent was built without OTLP export (the `otlp` cargo feature, on by default; `cargo xtask demo` builds its agent without it): build it with default features"
    )]
    NotBuilt,
}

/// `--otlp-endpoint`'s parser: `http://HOST:PORT` (a path is allowed; `https` is not: TLS to
/// the collector is not built in).
pub fn parse_endpoint(s: &str) -> Result<String, EndpointError> {
    let uri: http::Uri = s
        .parse()
        .map_err(|e: http::uri::InvalidUri| EndpointError::NotAUrl(e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(EndpointError::Https),
        _ => return Err(EndpointError::NotHttp),
    }
    match uri.host() {
        Some(h) if !h.is_empty() => {}
        _ => return Err(EndpointError::NoHost),
    }
    if !cfg!(feature = "otlp") {
        return Err(EndpointError::NotBuilt);
    }
    Ok(s.to_string())
}

#[cfg(feature = "otlp")]
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

#[cfg(test)]
mod endpoint_tests;
#[cfg(all(test, feature = "otlp"))]
mod tests;
