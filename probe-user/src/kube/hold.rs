//! Names on the first event: a confirmed report is held (at most [`HOLD_MAX`]) while the API
//! cache cannot name it yet, so the first line, the first live-view row and the Event carry
//! the names the API knows.
//!
//! A report waits while the cache has not completed its first sync (every watched resource
//! listed once), or while it names a sender pod or a Service that the cache does not know yet
//! (the pod or Service appeared just before the loop; the cache catches up within one
//! rebuild). It is released, attributed with the latest index, when that index names it or
//! when its time is up; then it goes out as it is, and the aggregate's next update (attributed
//! anew) carries the names. Reports leave in the order they came: one waiting holds the later
//! ones behind it (bounded by the same limit). Pure: the caller passes the time and the index.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use probe_contract::{Confirmation, LoopbackEvent, facts::SourceKind};

use super::{enrich::enrich, index::Index};

/// The longest a report waits for names.
pub const HOLD_MAX: Duration = Duration::from_secs(2);

/// Whether `event`, attributed from `index`, still lacks a name the API should have.
pub fn lacks_names(event: &LoopbackEvent, index: &Index) -> bool {
    if !index.synced {
        return true;
    }
    // A pod's own address the cache does not know yet.
    let pod_unnamed = event.facts.source == SourceKind::Pod && event.client_pod.is_none();
    // A Service the node's rules name that the cache does not know yet.
    let service_unnamed = event.service.is_some() && event.facts.service.is_none();
    pod_unnamed || service_unnamed
}

/// Reports waiting for names, oldest first.
#[derive(Debug, Default)]
pub struct Hold {
    queue: VecDeque<(Instant, Confirmation)>,
}

impl Hold {
    /// The report attributed now if it can go (nothing waits and it is named, or the cache
    /// cannot name it); else it waits and None is returned.
    pub fn offer(
        &mut self,
        report: Confirmation,
        index: &Index,
        node: Option<&str>,
        now: Instant,
    ) -> Option<Confirmation> {
        if self.queue.is_empty() {
            let mut named = report.clone();
            enrich(&mut named.event, index, node);
            if !lacks_names(&named.event, index) {
                return Some(named);
            }
        }
        self.queue.push_back((now + HOLD_MAX, report));
        None
    }

    /// The reports that can go now (named, or out of time), attributed from `index`, in order.
    pub fn release(
        &mut self,
        index: &Index,
        node: Option<&str>,
        now: Instant,
    ) -> Vec<Confirmation> {
        let mut out = Vec::new();
        while let Some((deadline, report)) = self.queue.front() {
            let mut named = report.clone();
            enrich(&mut named.event, index, node);
            if now < *deadline && lacks_names(&named.event, index) {
                break;
            }
            self.queue.pop_front();
            out.push(named);
        }
        out
    }

    /// When the oldest waiting report must go at the latest.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.queue.front().map(|(d, _)| *d)
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use probe_contract::{LoopbackKind, SnatState};

    use super::*;
    use crate::{
        correlate::remedy,
        kube::index::tests::{pod, web_service},
    };

    fn report(src: &str) -> Confirmation {
        let mut event = remedy::placeholder(LoopbackKind::Hairpin, src.parse().unwrap(), 30080);
        event.vip = Some("203.0.113.10".parse().unwrap());
        event.vip_port = Some(80);
        event.snat = SnatState::No;
        event.facts.source = SourceKind::Pod;
        Confirmation {
            event,
            is_new: true,
            write_json: true,
        }
    }

    fn synced(pods: &[k8s_openapi::api::core::v1::Pod]) -> Index {
        let mut index = Index::build(pods, &[web_service("Cluster")], &[]);
        index.synced = true;
        index
    }

    #[test]
    fn a_report_waits_for_the_first_sync_and_goes_named() {
        let t0 = Instant::now();
        let mut hold = Hold::default();
        assert_eq!(
            hold.offer(report("10.0.0.9"), &Index::default(), None, t0),
            None,
            "no sync yet: held"
        );
        assert!(hold.release(&Index::default(), None, t0).is_empty());
        let index = synced(&[pod("shop", "client-1", &["10.0.0.9"])]);
        let out = hold.release(&index, Some("n"), t0 + Duration::from_millis(300));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].event.client_pod.as_deref(), Some("shop/client-1"));
        assert_eq!(
            out[0]
                .event
                .facts
                .service
                .as_ref()
                .map(|s| s.key())
                .as_deref(),
            Some("shop/web")
        );
        assert!(hold.is_empty());
    }

    #[test]
    fn an_unknown_pod_waits_at_most_the_limit_and_keeps_the_order() {
        let t0 = Instant::now();
        let index = synced(&[]);
        let mut hold = Hold::default();
        assert!(hold.offer(report("10.0.0.9"), &index, None, t0).is_none());
        // A later, nameable report queues behind it.
        let known = synced(&[pod("shop", "client-2", &["10.0.0.8"])]);
        assert!(hold.offer(report("10.0.0.8"), &known, None, t0).is_none());
        assert!(hold.release(&known, None, t0 + HOLD_MAX / 2).is_empty());
        assert_eq!(hold.next_deadline(), Some(t0 + HOLD_MAX));
        let out = hold.release(&known, None, t0 + HOLD_MAX);
        let pods: Vec<_> = out.iter().map(|r| r.event.client_pod.clone()).collect();
        assert_eq!(pods, vec![None, Some("shop/client-2".to_string())]);
    }

    #[test]
    fn a_named_report_goes_at_once() {
        let index = synced(&[pod("shop", "client-1", &["10.0.0.9"])]);
        let out = Hold::default().offer(report("10.0.0.9"), &index, None, Instant::now());
        assert_eq!(
            out.unwrap().event.client_pod.as_deref(),
            Some("shop/client-1")
        );
    }
}
