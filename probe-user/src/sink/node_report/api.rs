//! The report object's and the Node condition's writes through the API.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams},
};
use probe_contract::{
    condition::{Condition, ConditionStatus},
    report::{API_VERSION, KIND, ReportStatus, object_name, rfc3339},
};
use serde_json::json;
use tracing::warn;

use super::{FIELD_MANAGER, condition::condition};
use crate::hub::outputs::ReportStats;

/// The status is rewritten at least this often, unchanged or not: a report older than
/// the plugin's `report::cluster::STALE_AFTER` means the agent is gone or cannot write.
pub const HEARTBEAT: Duration = Duration::from_secs(300);
/// One API call's time limit.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes one node's report object (and, with `--node-condition on`, its Node condition).
pub struct ReportWriter {
    reports: Api<DynamicObject>,
    nodes: Api<Node>,
    name: String,
    created: bool,
    /// `--node-condition on`.
    pub node_condition: bool,
    /// `--resolve-after` in seconds: how long a loop stays active without a confirmation
    /// (the tracker's window, so the report, the condition and the gauge agree).
    pub active_window_s: i64,
    /// `--node-report-interval` in ms: the least time between two writes of the report, and
    /// the first wait of a failed write's backoff (it doubles up to the [`HEARTBEAT`]).
    pub write_interval_ms: u64,
    /// The condition last written and its transition time; before the first write, the one
    /// the Node holds (E13: a restart keeps its `lastTransitionTime`).
    last_condition: Option<(Condition, String)>,
    /// Whether the Node's own condition was read (once, before the first write).
    condition_read: bool,
    pub stats: Arc<ReportStats>,
}

impl ReportWriter {
    /// Err: `node` is not a valid object name (nothing is ever written then).
    pub fn new(
        client: Client,
        node: &str,
    ) -> Result<ReportWriter, probe_contract::report::InvalidNodeName> {
        Ok(ReportWriter {
            reports: Api::all_with(client.clone(), &report_resource()),
            nodes: Api::all(client),
            name: object_name(node)?,
            created: false,
            node_condition: false,
            active_window_s: super::loops::ACTIVE_WINDOW,
            write_interval_ms: super::gate::MIN_INTERVAL_MS,
            last_condition: None,
            condition_read: false,
            stats: Arc::default(),
        })
    }

    /// Patches the Node's `LoadBalancerLoopback` condition (strategic merge on
    /// `nodes/NAME/status`, as node-problem-detector) when it differs from the last one
    /// written, or `heartbeat` asks for a refresh. `now`: RFC 3339.
    pub async fn write_condition(
        &mut self,
        status: &ReportStatus,
        now: &str,
        heartbeat: bool,
    ) -> Result<(), kube::Error> {
        let c = condition(status);
        if !self.condition_read {
            self.read_condition().await;
        }
        let transition = match &self.last_condition {
            Some((last, _)) if *last == c && !heartbeat => return Ok(()),
            Some((last, at)) if last.status == c.status => at.clone(),
            _ => now.to_string(),
        };
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.nodes
            .patch_status(
                &self.name,
                &params,
                &Patch::Strategic(super::condition::patch(&c, now, &transition)),
            )
            .await?;
        self.last_condition = Some((c, transition));
        Ok(())
    }

    /// E13: the `LoadBalancerLoopback` condition the Node holds (a previous run's), so an
    /// unchanged status keeps its `lastTransitionTime` across restarts. Unreadable (no
    /// `get nodes`, no condition yet): the first write sets the transition time to now.
    async fn read_condition(&mut self) {
        let Ok(node) = self.nodes.get(&self.name).await else {
            return;
        };
        self.condition_read = true;
        let held = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == probe_contract::condition::TYPE);
        if let Some(held) = held {
            let Some(status) = ConditionStatus::parse(&held.status) else {
                return;
            };
            if let Some(at) = held.last_transition_time {
                self.last_condition = Some((
                    Condition {
                        status,
                        reason: held.reason.unwrap_or_default(),
                        message: held.message.unwrap_or_default(),
                    },
                    rfc3339(at.0.as_second()),
                ));
            }
        }
    }

    fn params() -> PatchParams {
        // Force: this agent is the only writer of its node's report; a field another manager
        // took over (an operator's edit) goes back to the agent's state.
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Creates the object (metadata only, owned by the Node) if not done yet, then applies
    /// `status` through the status subresource.
    pub async fn write(&mut self, status: &ReportStatus) -> Result<(), kube::Error> {
        if status.node != self.name {
            // The name check's second half: a status about another node is never written.
            return Err(kube::Error::Service(
                format!(
                    "refusing to write node {:?}'s status into {:?}",
                    status.node, self.name
                )
                .into(),
            ));
        }
        if !self.created {
            self.ensure().await?;
        }
        let body = json!({"apiVersion": API_VERSION, "kind": KIND, "status": status});
        match self
            .reports
            .patch_status(&self.name, &Self::params(), &Patch::Apply(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                    // Deleted under us (or with its Node): recreate on the next write.
                    self.created = false;
                }
                Err(e)
            }
        }
    }

    async fn ensure(&mut self) -> Result<(), kube::Error> {
        let mut metadata = json!({"name": self.name});
        match self.nodes.get(&self.name).await {
            Ok(node) => {
                if let Some(uid) = node.metadata.uid {
                    metadata["ownerReferences"] = json!([{
                        "apiVersion": "v1", "kind": "Node", "name": self.name, "uid": uid,
                    }]);
                }
            }
            Err(e) => warn!(
                node = %self.name,
                error = %e,
                "node report: cannot read the Node (get nodes): the report is created without an ownerReference and outlives the Node"
            ),
        }
        let body = json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata});
        self.reports
            .patch(&self.name, &Self::params(), &Patch::Apply(&body))
            .await?;
        self.created = true;
        Ok(())
    }
}

/// The LoopbackReport API resource, for `kube::Api<DynamicObject>`.
fn report_resource() -> kube::core::ApiResource {
    probe_contract::report::RESOURCE.api_resource()
}
