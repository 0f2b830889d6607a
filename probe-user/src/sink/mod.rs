//! Where confirmed events go, and how they get there.
//!
//! One way in: every writer of confirmed events (the `--events` JSON lines, OTLP log records,
//! `/metrics`' totals, the live view, the Kubernetes Events, the node report and its
//! condition) is a [`Writer`] fed by a [`Subscription`] to the hub's broadcast of reports and
//! of resolutions ([`Subscription::feed`], or [`Subscription::run`] in a task of its own);
//! the correlation loop only publishes (`hub::Shared::publish`). Each writer states what it
//! does when it fell behind ([`LagPolicy`]): count the lines it lost, resend its whole state,
//! or nothing when the next report carries what was missed. A writer that needs a period of
//! its own (or another input) has its [`Writer::tick`]. The feed reads until the agent stops,
//! then drains, so nothing published before the stop is left out.
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

use std::{future::Future, sync::Arc};

use probe_contract::{Confirmation, LoopResolution};
use tokio::sync::{
    broadcast::{
        self,
        error::{RecvError, TryRecvError},
    },
    watch,
};

use crate::hub::{Shared, View};

/// A writer's subscription to the hub's reports and resolutions, and the agent's stop signal.
pub struct Subscription {
    pub reports: broadcast::Receiver<Arc<Confirmation>>,
    pub resolutions: broadcast::Receiver<Arc<LoopResolution>>,
    pub stop: watch::Receiver<bool>,
}

/// What a writer does when its subscription fell behind the broadcast and missed items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LagPolicy {
    /// Nothing: the next report of the same aggregate carries what was missed (cumulative
    /// counts), so nothing is lost for good.
    Ignore,
    /// [`Writer::lost`] is told how many were missed (to count them as lost, or to resend
    /// the whole state).
    Tell,
}

/// What a writer does with what it receives. Each call is awaited before the next item is
/// read: a slow writer falls behind the broadcast, never the correlation loop.
pub trait Writer: Send + 'static {
    fn report(&mut self, report: &Confirmation) -> impl Future<Output = ()> + Send;

    fn resolution(&mut self, _resolution: &LoopResolution) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// What this writer does when it missed items; each writer states it.
    fn lag_policy(&self) -> LagPolicy;

    /// `n` items were missed (only with [`LagPolicy::Tell`]).
    fn lost(&mut self, _n: u64) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Resolves when the writer wants its [`Writer::tick`] (a period of its own, or another
    /// input it watches); never, for a writer that only follows the broadcast.
    fn tick_due(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    fn tick(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// True once the writer has nothing more to write to (its reader went away).
    fn finished(&self) -> bool {
        false
    }
}

/// What woke a writer's task.
enum Wake {
    Report(Arc<Confirmation>),
    Resolution(Arc<LoopResolution>),
    Lagged(u64),
    ResolutionsClosed,
    Tick,
    Stop,
}

impl Subscription {
    /// Subscribed now: everything published from here on, until the agent stops.
    pub fn to(hub: &Shared) -> Subscription {
        Subscription {
            reports: hub.subscribe(),
            resolutions: hub.subscribe_resolutions(),
            stop: hub.stop_signal(),
        }
    }

    /// [`Subscription::to`] for a surface, which holds a [`View`].
    pub fn to_view(hub: &View) -> Subscription {
        Subscription {
            reports: hub.subscribe(),
            resolutions: hub.subscribe_resolutions(),
            stop: hub.stop_signal(),
        }
    }

    /// Feeds `writer` in a task of its own ([`Subscription::feed`]).
    pub fn run<W: Writer>(self, mut writer: W) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move { self.feed(&mut writer).await })
    }

    /// Feeds `writer` until the stop (or the broadcast closes), then what was published before
    /// it; a writer that finishes is fed no more.
    pub async fn feed<W: Writer>(mut self, writer: &mut W) {
        let mut resolutions_open = true;
        while !writer.finished() {
            let wake = tokio::select! {
                biased;
                r = self.reports.recv() => match r {
                    Ok(r) => Wake::Report(r),
                    Err(RecvError::Lagged(n)) => Wake::Lagged(n),
                    Err(RecvError::Closed) => Wake::Stop,
                },
                r = self.resolutions.recv(), if resolutions_open => match r {
                    Ok(r) => Wake::Resolution(r),
                    Err(RecvError::Lagged(n)) => Wake::Lagged(n),
                    Err(RecvError::Closed) => Wake::ResolutionsClosed,
                },
                () = writer.tick_due() => Wake::Tick,
                _ = self.stop.wait_for(|stop| *stop) => Wake::Stop,
            };
            match wake {
                Wake::Report(r) => writer.report(&r).await,
                Wake::Resolution(r) => writer.resolution(&r).await,
                Wake::Lagged(n) => lagged(writer, n).await,
                Wake::ResolutionsClosed => resolutions_open = false,
                Wake::Tick => writer.tick().await,
                Wake::Stop => break,
            }
        }
        self.drain(writer).await;
    }

    /// What was published before the stop.
    async fn drain<W: Writer>(&mut self, writer: &mut W) {
        while !writer.finished() {
            match self.reports.try_recv() {
                Ok(r) => writer.report(&r).await,
                Err(TryRecvError::Lagged(n)) => lagged(writer, n).await,
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        while !writer.finished()
            && let Ok(r) = self.resolutions.try_recv()
        {
            writer.resolution(&r).await;
        }
    }
}

async fn lagged<W: Writer>(writer: &mut W, n: u64) {
    match writer.lag_policy() {
        LagPolicy::Ignore => {}
        LagPolicy::Tell => writer.lost(n).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts what it is fed.
    #[derive(Default)]
    struct Tally {
        reports: usize,
        lost: u64,
        policy: Option<LagPolicy>,
    }

    impl Writer for Tally {
        async fn report(&mut self, _report: &Confirmation) {
            self.reports += 1;
        }

        fn lag_policy(&self) -> LagPolicy {
            self.policy.unwrap_or(LagPolicy::Tell)
        }

        async fn lost(&mut self, n: u64) {
            self.lost += n;
        }
    }

    fn confirmation() -> Arc<Confirmation> {
        Arc::new(Confirmation {
            event: crate::sink::node_report::loops::tests_event("k1", None),
            is_new: true,
            write_json: true,
        })
    }

    /// Two items of room, five published before the writer reads: it missed three.
    async fn fed_behind(policy: LagPolicy) -> Tally {
        let (reports_tx, reports) = broadcast::channel(2);
        let (_resolutions_tx, resolutions) = broadcast::channel(2);
        let (stop_tx, stop) = watch::channel(false);
        let subscription = Subscription {
            reports,
            resolutions,
            stop,
        };
        for _ in 0..5 {
            reports_tx.send(confirmation()).unwrap();
        }
        stop_tx.send(true).unwrap();
        let mut tally = Tally {
            policy: Some(policy),
            ..Default::default()
        };
        subscription.feed(&mut tally).await;
        tally
    }

    #[tokio::test]
    async fn a_writer_that_is_told_counts_what_it_missed_and_gets_the_rest_after_the_stop() {
        let tally = fed_behind(LagPolicy::Tell).await;
        assert_eq!((tally.reports, tally.lost), (2, 3));
    }

    #[tokio::test]
    async fn a_writer_that_ignores_lags_is_never_told() {
        let tally = fed_behind(LagPolicy::Ignore).await;
        assert_eq!((tally.reports, tally.lost), (2, 0));
    }
}
