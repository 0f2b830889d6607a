//! `--kube-events`: confirmed loopbacks as Kubernetes Events (`events.k8s.io/v1`, type
//! Warning), so they show in `kubectl describe service` and `kubectl get events`.
//!
//! Off the correlation path: this task subscribes to the report broadcast (bounded; when it
//! lags, the reports it missed are dropped and counted as `dropped`, the next report of the
//! same aggregate carries its count anyway). What to write and when is
//! [`super::kube_event_plan`]'s (pure); this module only does the HTTP. Each write has a
//! timeout; a refusal (403: RBAC) or an unreachable API server is counted as `failed` and said
//! in one log line until a write succeeds again: the agent keeps working either way.

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use probe_contract::{Confirmation, LoopResolution, kube_event::REPORTING_CONTROLLER};
use tracing::{info, warn};

use super::{
    LagPolicy, Subscription,
    kube_event_doc::{EventDoc, Names, ObjectRef},
    kube_event_plan::{EventPlanner, Held, PlanConfig, Write},
};

/// One write's time limit: a hung API server must not hold the queue forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often held writes (throttled, rate limited) are looked at.
const DUE_EVERY: Duration = Duration::from_secs(2);

/// Environment hook for tests: the per-aggregate write window in ms instead of 60 s.
pub const PER_AGGREGATE_ENV: &str = "CLB_PROBE_TEST_KUBE_EVENTS_EVERY_MS";

use crate::hub::KubeEventStats;

/// `--kube-events on` with API access (`--kubeconfig`, else the pod's service account, as
/// attribution): writes until the agent stops. A broken configuration is said once; the agent
/// works as without the flag.
pub async fn start(
    source: crate::kube::KubeSource,
    node: String,
    subscription: Subscription,
    stats: Arc<KubeEventStats>,
) {
    match crate::kube::connect(&source).await {
        Ok(client) => {
            subscription
                .feed(&mut EventsWriter::new(client, &node, stats))
                .await
        }
        Err(e) => warn!(error = %format!("{e:#}"), "no API client: Kubernetes Events are off"),
    }
}

/// The writer of the hub's reports and resolutions as Events: the planner decides, the API
/// writes; held writes are looked at every [`DUE_EVERY`].
struct EventsWriter {
    planner: EventPlanner,
    api: EventApi,
    origin: Instant,
    due: tokio::time::Interval,
}

impl EventsWriter {
    fn new(client: Client, node: &str, stats: Arc<KubeEventStats>) -> EventsWriter {
        let mut cfg = PlanConfig::default();
        // Test hook: the per-aggregate window (60 s) shortened so a test sees a patch.
        if let Some(ms) = std::env::var(PER_AGGREGATE_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            cfg.per_aggregate = Duration::from_millis(ms);
        }
        let mut due = tokio::time::interval(DUE_EVERY);
        due.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(node = %node, "writing confirmed loopbacks as Kubernetes Events");
        EventsWriter {
            planner: EventPlanner::new(cfg, node),
            api: EventApi {
                client,
                stats,
                failing: false,
            },
            origin: Instant::now(),
            due,
        }
    }

    async fn write_all(&mut self, writes: impl IntoIterator<Item = Write>) {
        for w in writes {
            self.api.write(w).await;
        }
    }
}

impl super::Writer for EventsWriter {
    async fn report(&mut self, report: &Confirmation) {
        let planned = self.planner.observe(
            &report.event,
            &Names::of(&report.event),
            self.origin.elapsed(),
            SystemTime::now(),
        );
        match planned {
            Ok(w) => self.api.write(w).await,
            Err(Held::RateLimited) => {
                self.api.stats.rate_limited.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }

    async fn resolution(&mut self, r: &LoopResolution) {
        let writes = self
            .planner
            .resolved(r, self.origin.elapsed(), SystemTime::now());
        self.write_all(writes).await;
    }

    /// Missed reports and resolutions are counted as `dropped`; the next report of the same
    /// aggregate carries its count anyway.
    fn lag_policy(&self) -> LagPolicy {
        LagPolicy::Tell
    }

    async fn lost(&mut self, n: u64) {
        self.api.stats.dropped.fetch_add(n, Ordering::Relaxed);
    }

    async fn tick_due(&mut self) {
        self.due.tick().await;
    }

    async fn tick(&mut self) {
        let writes = self.planner.due(self.origin.elapsed());
        self.write_all(writes).await;
    }
}

/// The Events API: one write at a time, each with its time limit.
struct EventApi {
    client: Client,
    stats: Arc<KubeEventStats>,
    /// Said once per failing stretch.
    failing: bool,
}

impl EventApi {
    async fn write(&mut self, w: Write) {
        let doc = w.doc().clone();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &doc.namespace);
        let result = tokio::time::timeout(WRITE_TIMEOUT, async {
            match w {
                Write::Create(doc) => {
                    match api.create(&PostParams::default(), &to_event(&doc)).await {
                        Ok(_) => Ok("created"),
                        // A restarted agent: the Event of this aggregate is already there.
                        Err(kube::Error::Api(s)) if s.code == 409 => patch(&api, &doc).await,
                        Err(e) => Err(e),
                    }
                }
                Write::Patch(doc) => match patch(&api, &doc).await {
                    // Expired (the API server keeps Events for --event-ttl, 1 h by default).
                    Err(kube::Error::Api(s)) if s.code == 404 => api
                        .create(&PostParams::default(), &to_event(&doc))
                        .await
                        .map(|_| "created"),
                    other => other,
                },
            }
        })
        .await;
        let error = match result {
            Ok(Ok("created")) => {
                self.stats.created.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(Ok(_)) => {
                self.stats.patched.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => Some(format!(
                "forbidden ({}): the agent's service account needs create and patch on events.k8s.io events",
                s.message
            )),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer in {WRITE_TIMEOUT:?}")),
        };
        match error {
            None => {
                if self.failing {
                    info!("Kubernetes Events: writing again");
                }
                self.failing = false;
            }
            Some(e) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                if !self.failing {
                    warn!(
                        event = %doc.name,
                        namespace = %doc.namespace,
                        error = %e,
                        "cannot write Kubernetes Events (counted in clbprobe_kube_event_writes_total{{result=\"failed\"}}; said once until it works again)"
                    );
                }
                self.failing = true;
            }
        }
    }
}

/// A merge patch of what a repeat changes: the series and the note.
async fn patch(api: &Api<Event>, doc: &EventDoc) -> Result<&'static str, kube::Error> {
    let patch = serde_json::json!({
        "series": doc.series.map(|s| EventSeries {
            count: i32::try_from(s.count).unwrap_or(i32::MAX),
            last_observed_time: micro(s.last_observed),
        }),
        "note": doc.note,
    });
    api.patch(&doc.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| "patched")
}

fn micro(t: SystemTime) -> MicroTime {
    MicroTime(Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn object_ref(r: &ObjectRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(r.kind.into()),
        namespace: (!r.namespace.is_empty()).then(|| r.namespace.clone()),
        name: Some(r.name.clone()),
        uid: r.uid.clone(),
        ..Default::default()
    }
}

/// The Event object of a planned write.
pub fn to_event(doc: &EventDoc) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(doc.name.clone()),
            namespace: Some(doc.namespace.clone()),
            ..Default::default()
        },
        type_: Some(doc.event_type.into()),
        reason: Some(doc.reason.into()),
        action: Some(doc.action.into()),
        note: Some(doc.note.clone()),
        regarding: Some(object_ref(&doc.regarding)),
        related: doc.related.as_ref().map(object_ref),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(doc.instance.clone()),
        event_time: Some(micro(doc.event_time)),
        series: doc.series.map(|s| EventSeries {
            count: i32::try_from(s.count).unwrap_or(i32::MAX),
            last_observed_time: micro(s.last_observed),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_object_has_every_required_field() {
        let doc = EventDoc {
            namespace: "shop".into(),
            name: "clb-probe.node-a.hairpin.0123456789abcdef".into(),
            event_type: "Warning",
            action: "Detected",
            reason: "LoopbackHairpin",
            note: "cause. Remedy: fix".into(),
            regarding: ObjectRef {
                kind: "Service",
                namespace: "shop".into(),
                name: "web".into(),
                uid: Some("0000-web".into()),
            },
            related: Some(ObjectRef {
                kind: "Pod",
                namespace: "shop".into(),
                name: "client-0".into(),
                uid: None,
            }),
            instance: "node-a".into(),
            event_time: SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456),
            series: None,
        };
        let v = serde_json::to_value(to_event(&doc)).unwrap();
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["reportingController"], "clb-probe");
        assert_eq!(v["reportingInstance"], "node-a");
        assert_eq!(v["action"], "Detected");
        assert_eq!(v["regarding"]["kind"], "Service");
        assert_eq!(v["regarding"]["uid"], "0000-web");
        assert_eq!(v["related"]["name"], "client-0");
        assert_eq!(v["eventTime"], "2023-11-14T22:13:20.123456Z");
        assert!(v.get("series").is_none());
    }
}
