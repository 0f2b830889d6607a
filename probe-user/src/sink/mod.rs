//! Where confirmed events and kernel events go: JSON lines and OTLP log records; metrics,
//! the live view and OTLP metrics subscribe to the same reports.

pub mod http;
pub mod json;
pub mod kube_event_doc;
pub mod kube_event_plan;
pub mod kube_events;
pub mod live;
pub mod metrics;
pub mod otlp;
pub mod process;

use tracing::info;

use probe_contract::record::KernelEvent;

use probe_contract::Report;

/// The fan-out of the correlation loop.
#[derive(Default)]
pub struct Sinks {
    /// `--events`: confirmed loopback events.
    pub json: Option<json::JsonLines>,
    /// `--record`: raw kernel events, replayable through the correlator.
    pub record: Option<json::JsonLines>,
    /// `--otlp-endpoint`: confirmed loopback events as OTLP log records.
    pub otlp: Option<otlp::OtlpLogs>,
}

impl Sinks {
    /// Each open output's counters, by name (the surfaces show a stalled or lossy output).
    pub fn output_stats(
        &self,
    ) -> Vec<(
        &'static str,
        std::sync::Arc<crate::hub::outputs::OutputStats>,
    )> {
        [("events", &self.json), ("record", &self.record)]
            .into_iter()
            .filter_map(|(name, out)| Some((name, out.as_ref()?.stats())))
            .collect()
    }

    pub fn report(&mut self, report: &Report) {
        if report.is_new {
            info!(
                kind = report.event.kind.as_str(),
                src = %report.event.src,
                dst = %report.event.dst,
                "confirmed loopback"
            );
        }
        if report.write_json
            && let Some(out) = &mut self.json
        {
            out.write(&report.event);
        }
        // One record per line the JSON stream shows (the same dedup), whether or not
        // `--events` is on.
        if report.write_json
            && let Some(out) = &self.otlp
        {
            out.write(&report.event);
        }
    }

    /// A loop resolved: one OTLP log record (the Event and the metrics go through the hub).
    pub fn resolution(&mut self, r: &probe_contract::LoopResolution) {
        if let Some(out) = &self.otlp {
            out.write_resolution(r);
        }
    }

    pub fn record(&mut self, ev: &KernelEvent) {
        if let Some(out) = &mut self.record {
            out.write(ev);
        }
    }
}
