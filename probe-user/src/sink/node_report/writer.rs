//! `--node-report on`: the agent's `LoopbackReport` writer.
//!
//! Off the correlation path, like the Events sink: it subscribes to the report broadcast
//! (bounded; a lagging writer loses reports, not the correlator's time) and keeps its own
//! [`Loops`]. `probe check`'s rules run on a thread of their own every [`CHECK_EVERY`], and
//! within [`CHECK_MIN_GAP`] of a change of the node's addresses or service table (they read
//! the node and shell out), against the Services the attribution cache already holds.
//! Once a second the writer builds the status; a change (or [`HEARTBEAT`] without one) is
//! offered to the [`Gate`] (one write per 10 s, coalesced, newest wins), and a write is
//! server-side apply of `status` through the status subresource, field manager
//! [`super::FIELD_MANAGER`], with a time limit. A conflict, a 403 or an unreachable API is
//! counted (`clbprobe_kube_writes_failed_total{object="report"|"condition"}`), one WARN per
//! failing stretch and one INFO when it works again; the state stays pending and is retried
//! with an exponential [`Backoff`] from the 10 s limit up to the [`HEARTBEAT`] (E7: a broken
//! RBAC is not a request every 10 s). The Node condition is patched after a written report
//! and retried on its own backoff: its failure never rewrites the report. Before its first
//! patch the writer reads the condition the Node holds, so a restart keeps the
//! `lastTransitionTime` of an unchanged status (E13).
//!
//! Only its own node (E12): in a Pod (`POD_NAME` and `POD_NAMESPACE` from the downward API,
//! as the chart sets them) the writer reads its own Pod first and writes nothing, neither the
//! report nor the condition, unless the Pod's `spec.nodeName` is the node it was told
//! (`--node-name`): a stolen token or a wrong flag cannot write another node's report. One
//! ERROR and `clbprobe_node_report_refused{reason}` say why; detection keeps running. Outside
//! a Pod (a binary on the host) there is no scheduler's word: the Node must have one of its
//! `InternalIP`s among this host's addresses (the address sync's), else the same refusal; a
//! Node without one, or unreadable, is believed (one WARN). Neither check stops a stolen token
//! used elsewhere: the API's RBAC, which cannot scope `nodes/status` to one node, is that bound.
//!
//! The object is named after this node ([`probe_contract::report::object_name`], checked), created
//! once by server-side apply of its metadata with an ownerReference to the Node (so it is
//! deleted with the Node; without `get nodes` it is created without one, and that is said).

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant, SystemTime},
};

use crate::hub::outputs::ReportStats;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams},
};
use probe_contract::{
    Confirmation, LoopResolution,
    condition::{Condition, ConditionStatus},
};
use serde_json::json;
use tokio::sync::{
    broadcast::{self, error::RecvError},
    watch,
};
use tracing::{error, info, warn};

use probe_contract::report::{
    API_VERSION, CapabilityStatus, KIND, ReportStatus, RiskStatus, object_name, rfc3339,
};

use super::{
    FIELD_MANAGER,
    condition::condition,
    gate::{Backoff, Gate},
    loops::{Loops, first_fix, fix_ids},
};
use crate::hub::capability::{Capabilities, Capability};

/// The status is rewritten at least this often, unchanged or not: a report older than
/// the plugin's `report::cluster::STALE_AFTER` means the agent is gone or cannot write.
pub const HEARTBEAT: Duration = Duration::from_secs(300);
/// How often `probe check`'s rules run for the report.
pub const CHECK_EVERY: Duration = Duration::from_secs(60);
/// The least time between two passes when the node's addresses or service table changed:
/// the report's write limit (one per 10 s), so a faster pass could not reach the API sooner,
/// and churn at 10,000 Services costs one pass per 10 s at most.
pub const CHECK_MIN_GAP: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_secs(1);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What does not change while the agent runs.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    pub node: String,
    pub agent_version: String,
    pub kernel: String,
}

impl NodeFacts {
    pub fn of_this_node(node: &str) -> NodeFacts {
        NodeFacts {
            node: node.to_string(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
        }
    }
}

/// The latest `probe check` result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckState {
    pub mode: String,
    /// `kube-proxy`, `cilium`, `unknown` (empty: not read).
    pub dataplane: String,
    /// [`crate::check::readiness::Prediction::summary`] (empty: not an IPVS/iptables node).
    pub nftables_readiness: String,
    pub risks: Vec<RiskStatus>,
}

/// `probe check`'s risks (severity `risk`), with their Services and first fixes (pure).
pub fn check_state(
    inputs: &crate::check::Inputs,
    services: &[probe_core::service::ServiceFacts],
) -> CheckState {
    let mut inputs = inputs.clone();
    if !services.is_empty() {
        crate::check::services::merge(&mut inputs, services);
    }
    let mut findings = crate::check::rules::judge(&inputs);
    crate::check::attach_fixes(&mut findings, services, inputs.kube_proxy_runs());
    let report = probe_contract::check::CheckReport::new(findings);
    let risks = report
        .findings
        .iter()
        .filter(|f| f.severity == probe_contract::check::Severity::Risk)
        .take(probe_contract::report::MAX_RISKS)
        .map(|f| {
            let services = super::risks::risk_services(f, &inputs.lb_targets);
            RiskStatus {
                kind: f.kind.as_str().to_string(),
                subject: f.subject.clone(),
                service: services.first().cloned(),
                services,
                summary: f.summary.clone(),
                first_fix: first_fix(&f.fixes, &f.remedy),
                fixes: fix_ids(&f.fixes),
            }
        })
        .collect();
    CheckState {
        // The dataplane as `probe check` names it (`none` without kube-proxy's rules).
        mode: match (&inputs.dataplane, inputs.services.source) {
            (Some(d), _) => d.mode.as_str().into(),
            (None, Some(s)) => crate::check::dataplane::mode_of(s).as_str().into(),
            (None, None) => "unknown".into(),
        },
        dataplane: inputs
            .dataplane
            .as_ref()
            .map(|d| d.serving().to_string())
            .unwrap_or_default(),
        nftables_readiness: match inputs.dataplane.as_ref().map(|d| d.mode) {
            Some(probe_contract::check::Mode::Ipvs | probe_contract::check::Mode::Iptables) => {
                crate::check::readiness::predict(
                    &inputs,
                    services,
                    None,
                    probe_contract::check::Mode::Nftables,
                )
                .summary()
            }
            _ => String::new(),
        },
        risks,
    }
}

/// The status at `now` (Unix seconds) from everything the agent knows (pure).
pub fn build(
    facts: &NodeFacts,
    caps: &Capabilities,
    check: &CheckState,
    loops: &Loops,
    now: i64,
) -> ReportStatus {
    let active_loops = loops.active();
    ReportStatus {
        node: facts.node.clone(),
        agent_version: facts.agent_version.clone(),
        kernel: facts.kernel.clone(),
        kube_proxy_mode: if check.mode.is_empty() {
            "unknown".into()
        } else {
            check.mode.clone()
        },
        dataplane: check.dataplane.clone(),
        nftables_readiness: check.nftables_readiness.clone(),
        capabilities: Capability::ALL
            .iter()
            .filter(|c| !caps.get(**c))
            .map(|c| CapabilityStatus {
                name: c.name().into(),
                available: false,
                cannot_confirm: c.lost().into(),
            })
            .collect(),
        risk_count: u32::try_from(check.risks.len()).unwrap_or(u32::MAX),
        risks: check.risks.clone(),
        active_loop_count: u32::try_from(active_loops.len()).unwrap_or(u32::MAX),
        active_loops,
        resolved_loops: loops.resolved(),
        last_update: rfc3339(now),
    }
}

/// What counts as a change worth a write: everything but the time of the update and an
/// active loop's `count` and `lastSeen` (they move with every repeat: a looping node would
/// write at the rate limit for as long as it loops). Those are refreshed by the next change
/// or the [`HEARTBEAT`], well inside the 10 min active window.
pub fn change_key(status: &ReportStatus) -> ReportStatus {
    let mut key = status.clone();
    key.last_update.clear();
    for l in &mut key.active_loops {
        l.count = 0;
        l.last_seen.clear();
    }
    // The order of active loops follows lastSeen: sorted so a reorder is not a change.
    key.active_loops
        .sort_by(|a, b| (&a.kind, &a.vip, &a.service).cmp(&(&b.kind, &b.vip, &b.service)));
    key
}

/// Whether a `probe check` pass is due, `since_last` after the last one (None: none yet):
/// the first at once, then every [`CHECK_EVERY`], and sooner after the node's addresses or
/// its service table changed, once [`CHECK_MIN_GAP`] has passed (pure).
pub fn check_due(since_last: Option<Duration>, changed: bool) -> bool {
    match since_last {
        None => true,
        Some(d) => d >= CHECK_EVERY || (changed && d >= CHECK_MIN_GAP),
    }
}

/// Runs `probe check`'s reading and rules on a thread of its own (it reads the node and runs
/// `ipset save`) when [`check_due`] says so: a bound or unbound LB IP (`owners`, the address
/// sync's owner map) or a new service table (`tables`) shows in the report's risks within
/// [`CHECK_MIN_GAP`], not a whole [`CHECK_EVERY`] later. A change of the API's objects alone
/// waits for the next periodic pass: pods churn, and a pass per pod change would cost more
/// than the names it refreshes. The service table is the agent's latest once there is one,
/// read here only before that; the kernel view is the agent's (`kernel`). Stops when the
/// receiver is gone.
pub fn spawn_checks(
    addr: crate::state::addrs::AddrConfig,
    index: Option<watch::Receiver<Arc<crate::kube::index::Index>>>,
    mut tables: watch::Receiver<Option<Arc<crate::state::ServiceTable>>>,
    mut owners: watch::Receiver<crate::state::addrs::Owners>,
    kernel: crate::check::KernelView,
) -> watch::Receiver<CheckState> {
    let (tx, rx) = watch::channel(CheckState::default());
    let spawned = std::thread::Builder::new()
        .name("report-check".into())
        .spawn(move || {
            let mut said = false;
            let mut last: Option<Instant> = None;
            let mut changed = false;
            loop {
                // A closed sender (the agent stopping) is no change; `tx` ends the loop.
                changed |= tables.has_changed().unwrap_or(false)
                    || owners.has_changed().unwrap_or(false);
                if check_due(last.map(|l| l.elapsed()), changed) {
                    owners.mark_unchanged();
                    let table = tables.borrow_and_update().as_deref().cloned();
                    last = Some(Instant::now());
                    changed = false;
                    match crate::check::gather::gather_with(&addr, table, Some(kernel.clone())) {
                        Ok(inputs) => {
                            let services: Vec<_> = index
                                .as_ref()
                                .map(|i| i.borrow().services().cloned().collect())
                                .unwrap_or_default();
                            let state = check_state(&inputs, &services);
                            if tx.send(state).is_err() {
                                return;
                            }
                            said = false;
                        }
                        Err(e) if !said => {
                            warn!(error = %format!("{e:#}"), "node report: reading the node for its risks failed (retried)");
                            said = true;
                        }
                        Err(_) => {}
                    }
                }
                std::thread::sleep(TICK);
                if tx.is_closed() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "node report: no risk checks (cannot start a thread)");
    }
    rx
}

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

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The agent's flags the writer follows.
#[derive(Clone, Debug)]
pub struct WriterSettings {
    /// `--node-condition on`.
    pub node_condition: bool,
    /// `--resolve-after`, in seconds ([`ReportWriter::active_window_s`]).
    pub active_window_s: i64,
    /// `--node-report-interval`, in ms ([`ReportWriter::write_interval_ms`]).
    pub write_interval_ms: u64,
    /// The counters `/metrics` shows.
    pub stats: Arc<ReportStats>,
    /// The node's local addresses (the address sync's owner map), for the check outside a
    /// Pod (E12).
    pub local: Option<watch::Receiver<crate::state::addrs::Owners>>,
}

/// `--node-report on` with API access: writes until the report broadcast closes.
pub async fn start(
    source: crate::kube::KubeSource,
    settings: WriterSettings,
    facts: NodeFacts,
    caps: Arc<Capabilities>,
    reports: broadcast::Receiver<Arc<Confirmation>>,
    resolutions: broadcast::Receiver<Arc<LoopResolution>>,
    checks: watch::Receiver<CheckState>,
) {
    let stats = settings.stats.clone();
    let client = match crate::kube::connect(&source).await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %format!("{e:#}"), "no API client: the node report is off");
            return;
        }
    };
    let writer = match ReportWriter::new(client.clone(), &facts.node) {
        Ok(mut w) => {
            w.node_condition = settings.node_condition;
            w.active_window_s = settings.active_window_s;
            w.write_interval_ms = settings.write_interval_ms;
            w.stats = stats.clone();
            w
        }
        Err(e) => {
            warn!("{e}");
            return;
        }
    };
    let here = is_this_node(
        &client,
        &facts.node,
        settings.local,
        Some(&stats),
        writer.write_interval_ms,
    )
    .await;
    if !here {
        return;
    }
    run(writer, facts, caps, reports, resolutions, checks).await;
}

/// E12, for everything that speaks as node `node` (the report and condition writer, the verify
/// answers): in a Pod, the Pod is scheduled on `node`; outside one, one of the Node's
/// InternalIPs is an address of this host (`local`). With `stats` (the node report's own
/// check), false is said in one ERROR and `clbprobe_node_report_refused{reason}`; without
/// (another speaker, which says it its own way), nothing is logged or counted.
pub async fn is_this_node(
    client: &Client,
    node: &str,
    local: Option<watch::Receiver<crate::state::addrs::Owners>>,
    stats: Option<&ReportStats>,
    first_wait_ms: u64,
) -> bool {
    let quiet = ReportStats::default();
    let (stats, speak) = match stats {
        Some(s) => (s, true),
        None => (&quiet, false),
    };
    match own_pod() {
        Some(pod) => scheduled_here(client, &pod, node, stats, first_wait_ms, speak).await,
        None => node_address_here(client, node, local, stats, speak).await,
    }
}

/// This agent's Pod (namespace, name), from the downward API's `POD_NAMESPACE` and
/// `POD_NAME`; None outside a Pod.
pub fn own_pod() -> Option<(String, String)> {
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    Some((var("POD_NAMESPACE")?, var("POD_NAME")?))
}

/// Why `node` is not the node the Pod is scheduled on (`spec.nodeName`), if it is not (pure).
pub fn node_mismatch(scheduled: Option<&str>, node: &str) -> Option<String> {
    match scheduled {
        Some(s) if s == node => None,
        Some(s) => Some(format!(
            "this agent's Pod runs on node {s:?}, not on {node:?} (--node-name / NODE_NAME)"
        )),
        None => Some(format!(
            "this agent's Pod is not scheduled on any node, so not on {node:?}"
        )),
    }
}

/// Whether one of the Node's `InternalIP`s is among this host's addresses: None when there is
/// nothing to compare (no InternalIP, or no local address known) (pure).
pub fn internal_ip_is_local(
    internal_ips: &[std::net::IpAddr],
    local: &crate::state::addrs::Owners,
) -> Option<bool> {
    if internal_ips.is_empty() || local.is_empty() {
        return None;
    }
    Some(
        internal_ips
            .iter()
            .any(|ip| local.keys().any(|p| p.is_host() && p.contains(*ip))),
    )
}

/// E12 outside a Pod (no scheduler's word): the Node named `node` must have one of its
/// `InternalIP`s on this host. A Node that cannot be read, has no InternalIP, or a host whose
/// addresses are not known within [`WRITE_TIMEOUT`] is not refused (said in one WARN): the
/// check guards against a wrong flag, not against every missing fact.
async fn node_address_here(
    client: &Client,
    node: &str,
    local: Option<watch::Receiver<crate::state::addrs::Owners>>,
    stats: &ReportStats,
    speak: bool,
) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    let ips: Vec<std::net::IpAddr> =
        match tokio::time::timeout(WRITE_TIMEOUT, nodes.get(node)).await {
            Ok(Ok(n)) => n
                .status
                .and_then(|s| s.addresses)
                .unwrap_or_default()
                .into_iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect(),
            _ => Vec::new(),
        };
    let mut owners = crate::state::addrs::Owners::default();
    if let Some(mut local) = local {
        let _ = tokio::time::timeout(WRITE_TIMEOUT, local.wait_for(|o| !o.is_empty())).await;
        owners = local.borrow().clone();
    }
    match internal_ip_is_local(&ips, &owners) {
        Some(true) => true,
        Some(false) => {
            if let Ok(mut r) = stats.refused.lock() {
                *r = "node_address_not_local".into();
            }
            if speak {
                error!(node = %node, internal_ips = ?ips, "node report: none of the Node's InternalIPs is an address of this host, so this is not node {node:?} (--node-name / NODE_NAME): refusing to write any node's report or condition (clbprobe_node_report_refused{{reason=\"node_address_not_local\"}}; detection keeps running)");
            }
            false
        }
        None => {
            if speak {
                warn!(node = %node, "node report: cannot check that this host is node {node:?} (the Node or its InternalIP unreadable, or no local address yet): believing the flag");
            }
            true
        }
    }
}

/// E12: whether the agent's own Pod is scheduled on `node`. Read until it can be (backed off
/// up to the heartbeat: a report waits for the API rather than trusting the flag); a Pod on
/// another node is one ERROR and `clbprobe_node_report_refused{reason="pod_on_other_node"}`,
/// and nothing is ever written.
async fn scheduled_here(
    client: &Client,
    (namespace, name): &(String, String),
    node: &str,
    stats: &ReportStats,
    first_wait_ms: u64,
    speak: bool,
) -> bool {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let mut backoff = Backoff::new(first_wait_ms, HEARTBEAT.as_millis() as u64);
    let set_refused = |reason: &str| {
        if let Ok(mut r) = stats.refused.lock() {
            *r = reason.to_string();
        }
    };
    loop {
        match tokio::time::timeout(WRITE_TIMEOUT, pods.get(name)).await {
            Ok(Ok(pod)) => {
                let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
                return match node_mismatch(scheduled, node) {
                    None => {
                        set_refused("");
                        true
                    }
                    Some(why) => {
                        set_refused("pod_on_other_node");
                        if speak {
                            error!(pod = %format!("{namespace}/{name}"), "node report: {why}: refusing to write any node's report or condition (clbprobe_node_report_refused{{reason=\"pod_on_other_node\"}}; detection keeps running)");
                        }
                        false
                    }
                };
            }
            failed => {
                let e = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                set_refused("own_pod_unreadable");
                let wait = backoff.failed(0);
                if speak && backoff.failures() == 1 {
                    warn!(pod = %format!("{namespace}/{name}"), error = %e, "node report: cannot read this agent's own Pod (get pods) to check the node it runs on: nothing is written until it can (retried with a backoff)");
                }
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
        }
    }
}

/// Runs until the report broadcast closes.
pub async fn run(
    mut writer: ReportWriter,
    facts: NodeFacts,
    caps: Arc<Capabilities>,
    mut reports: broadcast::Receiver<Arc<Confirmation>>,
    mut resolutions: broadcast::Receiver<Arc<LoopResolution>>,
    mut checks: watch::Receiver<CheckState>,
) {
    let mut resolutions_open = true;
    info!(node = %facts.node, "writing the node's LoopbackReport");
    let origin = Instant::now();
    let mut loops = Loops::new(writer.active_window_s);
    let mut gate: Gate<ReportStatus> = Gate::new(writer.write_interval_ms);
    let mut last_content: Option<ReportStatus> = None;
    let mut last_offer = i64::MIN;
    // E7: a failing write backs off from the rate limit (10 s by default), doubling, up to
    // the heartbeat; the report and the condition each on their own.
    let first_wait = writer.write_interval_ms;
    let backoff = || Backoff::new(first_wait, HEARTBEAT.as_millis() as u64);
    let mut report_backoff = backoff();
    let mut condition_backoff = backoff();
    let mut condition_pending: Option<ReportStatus> = None;
    let mut condition_heartbeat = false;
    let mut checks_open = true;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            report = reports.recv() => match report {
                Ok(r) => loops.observe(&r.event, unix_now()),
                // Missed reports: the next report of the same aggregate carries its count.
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            resolution = resolutions.recv(), if resolutions_open => match resolution {
                Ok(r) => loops.resolve(&r, unix_now()),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => resolutions_open = false,
            },
            changed = checks.changed(), if checks_open => checks_open = changed.is_ok(),
            _ = tick.tick() => {}
        }
        let now = unix_now();
        loops.tick(now);
        let check = checks.borrow().clone();
        // Not before the first `probe check` pass (or CHECK_EVERY without one): a report
        // without its risks would read as a clean node.
        if check.mode.is_empty() && origin.elapsed() < CHECK_EVERY {
            continue;
        }
        let status = build(&facts, &caps, &check, &loops, now);
        let content = change_key(&status);
        let heartbeat = now.saturating_sub(last_offer) >= HEARTBEAT.as_secs() as i64;
        if heartbeat {
            condition_heartbeat = true;
        }
        if last_content.as_ref() != Some(&content) || heartbeat {
            gate.offer(status);
            last_content = Some(content);
            last_offer = now;
        }
        let now_ms = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        if report_backoff.ready(now_ms)
            && let Some(status) = gate.take(now_ms)
        {
            match write_error(writer.write(&status)).await {
                None => {
                    if report_backoff.failures() > 0 {
                        info!("node report: written again");
                    }
                    report_backoff.succeeded();
                    if writer.node_condition {
                        // The condition's own retry: its failure never rewrites the report.
                        condition_pending = Some(status);
                    }
                }
                Some(e) => {
                    writer.stats.report_failed.fetch_add(1, Ordering::Relaxed);
                    let wait = report_backoff.failed(now_ms);
                    if report_backoff.failures() == 1 {
                        warn!(error = %e, retry_in_s = wait / 1000, "node report: write failed (counted in clbprobe_kube_writes_failed_total{{object=\"report\"}}; retried with a backoff up to the heartbeat; said once until it works again; detection is not affected)");
                    }
                    gate.failed(status);
                }
            }
        }
        if condition_backoff.ready(now_ms)
            && let Some(status) = condition_pending.take()
        {
            match write_error(writer.write_condition(
                &status,
                &status.last_update,
                condition_heartbeat,
            ))
            .await
            {
                None => {
                    if condition_backoff.failures() > 0 {
                        info!("node condition: patched again");
                    }
                    condition_backoff.succeeded();
                    condition_heartbeat = false;
                }
                Some(e) => {
                    writer
                        .stats
                        .condition_failed
                        .fetch_add(1, Ordering::Relaxed);
                    let wait = condition_backoff.failed(now_ms);
                    if condition_backoff.failures() == 1 {
                        warn!(error = %e, retry_in_s = wait / 1000, "node condition: patching nodes/status failed (counted in clbprobe_kube_writes_failed_total{{object=\"condition\"}}; retried with a backoff up to the heartbeat; said once until it works again)");
                    }
                    // Retried with this state unless a newer report was written meanwhile.
                    condition_pending.get_or_insert(status);
                }
            }
        }
    }
}

/// A write given [`WRITE_TIMEOUT`]: None when it worked, else why not.
async fn write_error<E: std::fmt::Display>(
    write: impl std::future::Future<Output = Result<(), E>>,
) -> Option<String> {
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("timed out".to_string()),
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;

/// The LoopbackReport API resource, for `kube::Api<DynamicObject>`.
fn report_resource() -> kube::core::ApiResource {
    use probe_contract::report::{API_VERSION, GROUP, KIND, PLURAL, VERSION};
    crate::kube::custom_resource(GROUP, VERSION, API_VERSION, KIND, PLURAL)
}
