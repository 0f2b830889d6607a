//! A real OTLP/gRPC receiver for the tests: the OpenTelemetry protocol's own generated
//! services (opentelemetry-proto, `LogsService` and `MetricsService`) served by tonic on
//! 127.0.0.1, an ephemeral port, inside a lab namespace (where the agent runs). It records
//! every request; in [`Mode::Hang`] it records and then never answers.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    thread::JoinHandle,
};

use opentelemetry_proto::tonic::{
    collector::{
        logs::v1::{
            ExportLogsServiceRequest, ExportLogsServiceResponse,
            logs_service_server::{LogsService, LogsServiceServer},
        },
        metrics::v1::{
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
            metrics_service_server::{MetricsService, MetricsServiceServer},
        },
    },
    common::v1::{AnyValue, KeyValue, any_value},
    logs::v1::LogRecord,
    metrics::v1::{metric::Data, number_data_point},
};
use tokio::sync::oneshot;

/// How the receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Accepts every export.
    Accept,
    /// Records each request, then never answers (a collector that hangs).
    Hang,
}

#[derive(Default)]
struct Seen {
    logs: Mutex<Vec<ExportLogsServiceRequest>>,
    metrics: Mutex<Vec<ExportMetricsServiceRequest>>,
}

struct Svc {
    seen: Arc<Seen>,
    mode: Mode,
}

impl Svc {
    async fn answer(&self) {
        if self.mode == Mode::Hang {
            std::future::pending::<()>().await;
        }
    }
}

/// One OTLP service of the receiver: each export is recorded in `seen.$field`, then answered
/// as the mode says.
macro_rules! export_service {
    ($service:ident, $request:ident, $response:ident, $field:ident) => {
        #[tonic::async_trait]
        impl $service for Svc {
            async fn export(
                &self,
                request: tonic::Request<$request>,
            ) -> Result<tonic::Response<$response>, tonic::Status> {
                self.seen.$field.lock().unwrap().push(request.into_inner());
                self.answer().await;
                Ok(tonic::Response::new($response::default()))
            }
        }
    };
}

export_service!(
    LogsService,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
    logs
);
export_service!(
    MetricsService,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
    metrics
);

/// The running receiver; stopped on drop (a hung answer is dropped with it).
pub struct Receiver {
    addr: SocketAddr,
    seen: Arc<Seen>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// One log record, its attributes as JSON-like values.
#[derive(Clone, Debug)]
pub struct Record {
    pub body: String,
    pub event_name: String,
    pub attributes: BTreeMap<String, serde_json::Value>,
    /// The resource's attributes (service.name, k8s.node.name).
    pub resource: BTreeMap<String, serde_json::Value>,
}

/// One number data point of a metric: (attributes, value).
pub type Point = (BTreeMap<String, String>, f64);

/// A metric as last exported: monotonic sum (counter) or gauge, and its points.
#[derive(Clone, Debug)]
pub struct Metric {
    pub monotonic_sum: bool,
    pub points: Vec<Point>,
}

impl Receiver {
    /// Listens on 127.0.0.1:0 inside network namespace `netns`.
    pub fn start_in_netns(netns: &str, mode: Mode) -> Receiver {
        let listener = test_support::lab::in_netns(netns, || {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .expect("bind the OTLP receiver");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let svc_seen = seen.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let server = tonic::transport::Server::builder()
                    .add_service(LogsServiceServer::new(Svc {
                        seen: svc_seen.clone(),
                        mode,
                    }))
                    .add_service(MetricsServiceServer::new(Svc {
                        seen: svc_seen,
                        mode,
                    }))
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
                // Dropping the server drops every connection and hung answer with it.
                tokio::select! {
                    _ = server => {}
                    _ = stopped => {}
                }
            });
            rt.shutdown_background();
        });
        Receiver {
            addr,
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`: the agent's `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every log record received so far, in order.
    pub fn records(&self) -> Vec<Record> {
        let mut out = Vec::new();
        for req in self.seen.logs.lock().unwrap().iter() {
            for rl in &req.resource_logs {
                let resource = rl
                    .resource
                    .as_ref()
                    .map(|r| attrs(&r.attributes))
                    .unwrap_or_default();
                for sl in &rl.scope_logs {
                    for r in &sl.log_records {
                        out.push(record(r, &resource));
                    }
                }
            }
        }
        out
    }

    /// Export requests of each signal received so far.
    pub fn requests(&self) -> (usize, usize) {
        (
            self.seen.logs.lock().unwrap().len(),
            self.seen.metrics.lock().unwrap().len(),
        )
    }

    /// The resource attributes of the latest metrics export.
    pub fn metrics_resource(&self) -> BTreeMap<String, serde_json::Value> {
        let seen = self.seen.metrics.lock().unwrap();
        seen.last()
            .and_then(|req| req.resource_metrics.first())
            .and_then(|rm| rm.resource.as_ref())
            .map(|r| attrs(&r.attributes))
            .unwrap_or_default()
    }

    /// Each metric by name as the latest metrics export carried it.
    pub fn latest_metrics(&self) -> BTreeMap<String, Metric> {
        let mut out = BTreeMap::new();
        let seen = self.seen.metrics.lock().unwrap();
        let Some(req) = seen.last() else {
            return out;
        };
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    let (monotonic_sum, points) = match &m.data {
                        Some(Data::Sum(s)) => (s.is_monotonic, &s.data_points),
                        Some(Data::Gauge(g)) => (false, &g.data_points),
                        _ => continue,
                    };
                    let points = points
                        .iter()
                        .map(|p| {
                            let labels = attrs(&p.attributes)
                                .into_iter()
                                .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
                                .collect();
                            let v = match p.value {
                                Some(number_data_point::Value::AsDouble(v)) => v,
                                Some(number_data_point::Value::AsInt(v)) => v as f64,
                                None => f64::NAN,
                            };
                            (labels, v)
                        })
                        .collect();
                    out.insert(
                        m.name.clone(),
                        Metric {
                            monotonic_sum,
                            points,
                        },
                    );
                }
            }
        }
        out
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn record(r: &LogRecord, resource: &BTreeMap<String, serde_json::Value>) -> Record {
    Record {
        body: r
            .body
            .as_ref()
            .map(value)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        event_name: r.event_name.clone(),
        attributes: attrs(&r.attributes),
        resource: resource.clone(),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, serde_json::Value> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(value).unwrap_or_default(),
            )
        })
        .collect()
}

/// An OTLP value as JSON (strings, integers, lists; others as null).
fn value(v: &AnyValue) -> serde_json::Value {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone().into(),
        Some(any_value::Value::IntValue(i)) => (*i).into(),
        Some(any_value::Value::BoolValue(b)) => (*b).into(),
        Some(any_value::Value::DoubleValue(d)) => (*d).into(),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().map(value).collect(),
        _ => serde_json::Value::Null,
    }
}
