//! `--node-report on`: the agent's `LoopbackReport` writer.
//!
//! Off the correlation path, like the Events sink: a [`Writer`] of the hub's reports
//! (bounded; a lagging writer loses reports, not the correlator's time) that keeps its own
//! [`Loops`] ([`ReportTask`]). `probe check`'s rules run on a thread of their own every [`CHECK_EVERY`], and
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

use probe_contract::{Confirmation, LoopResolution, report::ReportStatus};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{
    api::{HEARTBEAT, ReportWriter, WRITE_TIMEOUT},
    checks::CHECK_EVERY,
    gate::{Backoff, Gate},
    loops::Loops,
    status::{CheckState, NodeFacts, build, change_key},
    this_node::is_this_node,
};
use crate::{
    hub::{capability::Capabilities, outputs::ReportStats},
    sink::{LagPolicy, Subscription, Writer},
};

/// How often the status is built and offered without a report.
const TICK: Duration = Duration::from_secs(1);

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

/// `--node-report on` with API access: writes until the agent stops.
pub async fn start(
    source: crate::kube::KubeSource,
    settings: WriterSettings,
    facts: NodeFacts,
    caps: Arc<Capabilities>,
    subscription: Subscription,
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
    run(writer, facts, caps, subscription, checks).await;
}

/// Runs until the agent stops (or the report broadcast closes).
pub async fn run(
    writer: ReportWriter,
    facts: NodeFacts,
    caps: Arc<Capabilities>,
    subscription: Subscription,
    checks: watch::Receiver<CheckState>,
) {
    info!(node = %facts.node, "writing the node's LoopbackReport");
    let mut task = ReportTask::new(writer, facts, caps, checks);
    subscription.feed(&mut task).await;
}

/// The report's writer of the hub's reports: it keeps the loops; after every report,
/// resolution, check result and [`TICK`] it builds the status, offers a change to the
/// [`Gate`], and writes the report, then the condition, when each is due.
pub struct ReportTask {
    api: ReportWriter,
    facts: NodeFacts,
    caps: Arc<Capabilities>,
    checks: watch::Receiver<CheckState>,
    checks_open: bool,
    origin: Instant,
    loops: Loops,
    gate: Gate<ReportStatus>,
    /// The last status offered, without what moves with every repeat ([`change_key`]).
    last_content: Option<ReportStatus>,
    /// When it was offered (Unix seconds).
    last_offer: i64,
    /// E7: a failing write backs off from the rate limit (10 s by default), doubling, up to
    /// the heartbeat; the report and the condition each on their own.
    report_backoff: Backoff,
    condition_backoff: Backoff,
    /// The status of the last written report, until its condition is patched.
    condition_pending: Option<ReportStatus>,
    /// The next condition patch refreshes an unchanged condition too.
    condition_heartbeat: bool,
    tick: tokio::time::Interval,
}

impl ReportTask {
    fn new(
        api: ReportWriter,
        facts: NodeFacts,
        caps: Arc<Capabilities>,
        checks: watch::Receiver<CheckState>,
    ) -> ReportTask {
        let backoff = || Backoff::new(api.write_interval_ms, HEARTBEAT.as_millis() as u64);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ReportTask {
            facts,
            caps,
            checks,
            checks_open: true,
            origin: Instant::now(),
            loops: Loops::new(api.active_window_s),
            gate: Gate::new(api.write_interval_ms),
            last_content: None,
            last_offer: i64::MIN,
            report_backoff: backoff(),
            condition_backoff: backoff(),
            condition_pending: None,
            condition_heartbeat: false,
            tick,
            api,
        }
    }

    /// One pass: the status now, offered if it changed, and the writes that are due.
    async fn pass(&mut self) {
        let now = unix_now();
        self.loops.tick(now);
        let check = self.checks.borrow().clone();
        // Not before the first `probe check` pass (or CHECK_EVERY without one): a report
        // without its risks would read as a clean node.
        if check.mode.is_empty() && self.origin.elapsed() < CHECK_EVERY {
            return;
        }
        self.offer(
            build(&self.facts, &self.caps, &check, &self.loops, now),
            now,
        );
        let now_ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.write_report(now_ms).await;
        self.write_condition(now_ms).await;
    }

    /// Offers `status` to the gate when it changed, or when the [`HEARTBEAT`] is due.
    fn offer(&mut self, status: ReportStatus, now: i64) {
        let content = change_key(&status);
        let heartbeat = now.saturating_sub(self.last_offer) >= HEARTBEAT.as_secs() as i64;
        if heartbeat {
            self.condition_heartbeat = true;
        }
        if self.last_content.as_ref() != Some(&content) || heartbeat {
            self.gate.offer(status);
            self.last_content = Some(content);
            self.last_offer = now;
        }
    }

    /// The report, when the gate lets a status through and no backoff holds it.
    async fn write_report(&mut self, now_ms: u64) {
        if !self.report_backoff.ready(now_ms) {
            return;
        }
        let Some(status) = self.gate.take(now_ms) else {
            return;
        };
        match write_error(self.api.write(&status)).await {
            None => {
                if self.report_backoff.failures() > 0 {
                    info!("node report: written again");
                }
                self.report_backoff.succeeded();
                if self.api.node_condition {
                    // The condition's own retry: its failure never rewrites the report.
                    self.condition_pending = Some(status);
                }
            }
            Some(e) => {
                self.api.stats.report_failed.fetch_add(1, Ordering::Relaxed);
                let wait = self.report_backoff.failed(now_ms);
                if self.report_backoff.failures() == 1 {
                    warn!(error = %e, retry_in_s = wait / 1000, "node report: write failed (counted in clbprobe_kube_writes_failed_total{{object=\"report\"}}; retried with a backoff up to the heartbeat; said once until it works again; detection is not affected)");
                }
                self.gate.failed(status);
            }
        }
    }

    /// The Node condition of the last written report, when no backoff holds it.
    async fn write_condition(&mut self, now_ms: u64) {
        if !self.condition_backoff.ready(now_ms) {
            return;
        }
        let Some(status) = self.condition_pending.take() else {
            return;
        };
        let written =
            self.api
                .write_condition(&status, &status.last_update, self.condition_heartbeat);
        match write_error(written).await {
            None => {
                if self.condition_backoff.failures() > 0 {
                    info!("node condition: patched again");
                }
                self.condition_backoff.succeeded();
                self.condition_heartbeat = false;
            }
            Some(e) => {
                self.api
                    .stats
                    .condition_failed
                    .fetch_add(1, Ordering::Relaxed);
                let wait = self.condition_backoff.failed(now_ms);
                if self.condition_backoff.failures() == 1 {
                    warn!(error = %e, retry_in_s = wait / 1000, "node condition: patching nodes/status failed (counted in clbprobe_kube_writes_failed_total{{object=\"condition\"}}; retried with a backoff up to the heartbeat; said once until it works again)");
                }
                // Retried with this state unless a newer report was written meanwhile.
                self.condition_pending.get_or_insert(status);
            }
        }
    }
}

impl Writer for ReportTask {
    async fn report(&mut self, report: &Confirmation) {
        self.loops.observe(&report.event, unix_now());
        self.pass().await;
    }

    async fn resolution(&mut self, resolution: &LoopResolution) {
        self.loops.resolve(resolution, unix_now());
        self.pass().await;
    }

    /// Missed reports: the next report of the same aggregate carries its count.
    fn lag_policy(&self) -> LagPolicy {
        LagPolicy::Ignore
    }

    /// Every [`TICK`], and at once when `probe check` has a new result.
    async fn tick_due(&mut self) {
        tokio::select! {
            changed = self.checks.changed(), if self.checks_open => {
                self.checks_open = changed.is_ok();
            }
            _ = self.tick.tick() => {}
        }
    }

    async fn tick(&mut self) {
        self.pass().await;
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
