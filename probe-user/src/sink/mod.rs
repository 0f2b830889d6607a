//! Where confirmed events go, and how they get there.
//!
//! One way in: every writer of confirmed events (the `--events` JSON lines, OTLP log records,
//! `/metrics`' totals, the live view, the Kubernetes Events, the node report and its
//! condition) subscribes to the hub's broadcast of reports and of resolutions; the correlation
//! loop only publishes (`hub::Shared::publish`). Writers that must not lose a line unnoticed
//! count a subscription that fell behind as lost lines. [`Subscription`] is that
//! subscription for the writers that run as a task of their own ([`Subscription::run`]): read
//! until the agent stops, then drained, so nothing published before the stop is left out.
//! The one stream that is not confirmed events, `--record`'s kernel events, is written by the
//! correlation loop itself ([`json::JsonLines`], before correlation), to replay it later.
//!
//! The writers: [`json`] (`--events`, `--record`), [`otlp`] (log records and metrics),
//! [`metrics`] (`/metrics`), [`live`] (the socket `probe watch` reads), [`kube_events`] (the
//! Kubernetes Events, planned by [`kube_event_plan`] from [`kube_event_doc`]'s texts) and
//! [`node_report`] (the LoopbackReport and the Node condition); [`http`] and [`process`]
//! serve the HTTP ones.

pub mod evidence_http;
pub mod http;
pub mod json;
pub mod kube_event_doc;
pub mod kube_event_plan;
pub mod kube_events;
pub mod live;
pub mod metrics;
pub mod node_report;
pub mod otlp;
pub mod process;

use std::sync::Arc;

use probe_contract::{Confirmation, LoopResolution};
use tokio::sync::{broadcast, watch};

/// A writer's subscription to the hub's reports and resolutions, and the agent's stop signal.
pub struct Subscription {
    pub reports: broadcast::Receiver<Arc<Confirmation>>,
    pub resolutions: broadcast::Receiver<Arc<LoopResolution>>,
    pub stop: watch::Receiver<bool>,
}

/// What a writer does with what it receives.
pub trait Writer: Send + 'static {
    fn report(&mut self, report: &Confirmation);
    fn resolution(&mut self, _resolution: &LoopResolution) {}
    /// `n` items were missed: the subscription fell behind the broadcast.
    fn lost(&mut self, n: u64);
}

impl Subscription {
    /// Feeds `writer` until the stop, then what was published before it; the task ends there.
    pub fn run<W: Writer>(mut self, mut writer: W) -> tokio::task::JoinHandle<()> {
        use broadcast::error::{RecvError, TryRecvError};
        tokio::spawn(async move {
            let mut resolutions_open = true;
            loop {
                tokio::select! {
                    biased;
                    r = self.reports.recv() => match r {
                        Ok(r) => writer.report(&r),
                        Err(RecvError::Lagged(n)) => writer.lost(n),
                        Err(RecvError::Closed) => break,
                    },
                    r = self.resolutions.recv(), if resolutions_open => match r {
                        Ok(r) => writer.resolution(&r),
                        Err(RecvError::Lagged(n)) => writer.lost(n),
                        Err(RecvError::Closed) => resolutions_open = false,
                    },
                    _ = self.stop.wait_for(|stop| *stop) => break,
                }
            }
            loop {
                match self.reports.try_recv() {
                    Ok(r) => writer.report(&r),
                    Err(TryRecvError::Lagged(n)) => writer.lost(n),
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                }
            }
            while let Ok(r) = self.resolutions.try_recv() {
                writer.resolution(&r);
            }
        })
    }
}
