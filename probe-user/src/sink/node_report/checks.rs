//! `probe check`'s rules for the report, run on a thread of their own.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tracing::warn;

use super::status::{CheckState, check_state};

/// How often `probe check`'s rules run for the report.
pub const CHECK_EVERY: Duration = Duration::from_secs(60);
/// The least time between two passes when the node's addresses or service table changed:
/// the report's write limit (one per 10 s), so a faster pass could not reach the API sooner,
/// and churn at 10,000 Services costs one pass per 10 s at most.
pub const CHECK_MIN_GAP: Duration = Duration::from_secs(10);
/// How often the thread looks whether a pass is due.
const POLL: Duration = Duration::from_secs(1);

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
                std::thread::sleep(POLL);
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
