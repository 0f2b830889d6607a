//! Which loops a node report calls *active* and which *resolved* (pure, injected clock).
//!
//! - **Active**: a confirmed aggregate (a correlator report: new or repeat) was seen within the
//!   agent's `--resolve-after` window ([`Loops::new`]; [`ACTIVE_WINDOW`], 10 min, without an
//!   agent's). The same window as the tracker's (`crate::resolution`), so the report, the Node
//!   condition it drives and `clbprobe_loopback_active` agree on what "active" means: confirmed
//!   within the window and not resolved (the gauge follows at the tracker's next check, at
//!   most 30 s later). The correlator reports every repeat of an aggregate, so a loop that
//!   keeps happening keeps its `lastSeen` fresh.
//! - **Resolved**: an aggregate of a loop the agent resolved with proof (`crate::resolution`:
//!   unconfirmed for `--resolve-after` while the loop's own clients were seen answered), at
//!   once, with `resolvedAt` and `proof`; else an active loop not seen for the window, with
//!   `resolvedAt = lastSeen + window` and no proof: *quiet* (the tracker's word and gauge),
//!   not proven fixed; a proof that comes later is added to it. Listed for [`RESOLVED_KEEP`]
//!   (24 h), then forgotten. A resolved loop seen again is active again (and leaves the
//!   resolved list).
//!
//! Times are the agent's wall clock when it saw the report (Unix seconds), not the kernel's
//! monotonic timestamps: the report is read on other machines. Bounded: at most
//! [`MAX_ACTIVE`] active loops (the least recently seen is dropped, counted in `dropped`),
//! [`MAX_RESOLVED`] resolved ones and [`MAX_CLIENT_PODS`] client pods per loop.

use std::collections::{BTreeMap, BTreeSet};

use probe_contract::LoopbackEvent;

use super::status::{ActiveLoop, ResolvedLoop, rfc3339};

pub const ACTIVE_WINDOW: i64 = 600;
pub const RESOLVED_KEEP: i64 = 24 * 3600;
pub const MAX_ACTIVE: usize = 100;
pub const MAX_RESOLVED: usize = 100;
pub const MAX_CLIENT_PODS: usize = 10;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    kind: String,
    service: Option<String>,
    vip: String,
    client_pods: BTreeSet<String>,
    count: u64,
    first: i64,
    last: i64,
    first_fix: Option<String>,
    /// Fix ids, best first, from the latest event that had any.
    fixes: Vec<String>,
}

/// The node's loops, by aggregate key.
#[derive(Debug)]
pub struct Loops {
    /// Seconds without a confirmation before an active loop is no longer active.
    active_window: i64,
    active: BTreeMap<String, Entry>,
    /// (key, loop), oldest resolution first.
    resolved: Vec<(String, ResolvedLoop, i64)>,
    /// Active loops dropped for [`MAX_ACTIVE`].
    pub dropped: u64,
}

/// `ip:port`, `[v6]:port`, or the IP alone; the destination when no VIP is known.
fn vip_of(e: &LoopbackEvent) -> String {
    let ip = e.vip.unwrap_or(e.dst);
    match (e.vip_port, ip) {
        (Some(port), std::net::IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
        (Some(port), ip) => format!("{ip}:{port}"),
        (None, ip) => ip.to_string(),
    }
}

/// The first fix of an event (`id: change`), else its first remedy line that is a remedy
/// (the "Cause:" line explains, it fixes nothing).
pub fn first_fix(fixes: &[probe_contract::Fix], remedy: &[String]) -> Option<String> {
    fixes
        .first()
        .map(|f| format!("{}: {}", f.id, f.change))
        .or_else(|| remedy.iter().find(|r| !r.starts_with("Cause:")).cloned())
}

/// The fixes' ids, best fit first (the order they were computed in), the first
/// [`super::status::MAX_FIX_IDS`].
pub fn fix_ids(fixes: &[probe_contract::Fix]) -> Vec<String> {
    fixes
        .iter()
        .take(super::status::MAX_FIX_IDS)
        .map(|f| f.id.clone())
        .collect()
}

impl Default for Loops {
    fn default() -> Self {
        Loops::new(ACTIVE_WINDOW)
    }
}

impl Loops {
    /// `active_window`: the agent's `--resolve-after`, in seconds (at least 1).
    pub fn new(active_window: i64) -> Self {
        Loops {
            active_window: active_window.max(1),
            active: BTreeMap::new(),
            resolved: Vec::new(),
            dropped: 0,
        }
    }

    /// A report of the aggregate `e` at `now` (Unix seconds).
    pub fn observe(&mut self, e: &LoopbackEvent, now: i64) {
        self.resolved.retain(|(k, _, _)| *k != e.key);
        let entry = self.active.entry(e.key.clone()).or_insert_with(|| Entry {
            kind: e.kind.as_str().to_string(),
            service: None,
            vip: vip_of(e),
            client_pods: BTreeSet::new(),
            count: 0,
            first: now,
            last: now,
            first_fix: None,
            fixes: Vec::new(),
        });
        entry.last = now;
        // The aggregate's own count (repeats included); never goes back.
        entry.count = entry.count.max(e.count);
        if e.service.is_some() {
            entry.service = e.service.clone();
        }
        if let Some(pod) = &e.client_pod
            && entry.client_pods.len() < MAX_CLIENT_PODS
        {
            entry.client_pods.insert(pod.clone());
        }
        if let Some(fix) = first_fix(&e.fixes, &e.remedy) {
            entry.first_fix = Some(fix);
        }
        if !e.fixes.is_empty() {
            entry.fixes = fix_ids(&e.fixes);
        }
        while self.active.len() > MAX_ACTIVE {
            let oldest = self
                .active
                .iter()
                .min_by_key(|(_, e)| e.last)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.active.remove(&k);
                self.dropped += 1;
            }
        }
    }

    /// The agent resolved a loop with proof: each of its aggregates still active moves to the
    /// resolved list now, with the proof's first line.
    pub fn resolve(&mut self, r: &probe_contract::LoopResolution, now: i64) {
        for key in &r.aggregates {
            self.move_to_resolved(key, now, r.proof.first().cloned());
            // Already listed as quiet (the window passed before the proof came): proven now.
            if let Some((_, quiet, at)) = self
                .resolved
                .iter_mut()
                .find(|(k, l, _)| k == key && l.proof.is_none())
            {
                quiet.proof = r.proof.first().cloned();
                quiet.resolved_at = rfc3339(now);
                *at = now;
            }
        }
        self.resolved.sort_by_key(|(_, _, at)| *at);
    }

    /// Moves loops not seen for the window to resolved, forgets resolutions older than 24 h.
    /// Returns whether anything changed.
    pub fn tick(&mut self, now: i64) -> bool {
        let before = (self.active.len(), self.resolved.len());
        let expired: Vec<(String, i64)> = self
            .active
            .iter()
            .filter(|(_, e)| now - e.last >= self.active_window)
            .map(|(k, e)| (k.clone(), e.last + self.active_window))
            .collect();
        for (key, resolved_at) in expired {
            self.move_to_resolved(&key, resolved_at, None);
        }
        self.resolved.sort_by_key(|(_, _, at)| *at);
        self.resolved.retain(|(_, _, at)| now - at < RESOLVED_KEEP);
        let excess = self.resolved.len().saturating_sub(MAX_RESOLVED);
        self.resolved.drain(..excess);
        before != (self.active.len(), self.resolved.len())
    }

    /// The active loop `key`, if any, to the resolved list, resolved at `at`.
    fn move_to_resolved(&mut self, key: &str, at: i64, proof: Option<String>) {
        let Some(e) = self.active.remove(key) else {
            return;
        };
        self.resolved.push((
            key.to_string(),
            ResolvedLoop {
                kind: e.kind,
                service: e.service,
                vip: e.vip,
                count: e.count,
                first_seen: rfc3339(e.first),
                last_seen: rfc3339(e.last),
                resolved_at: rfc3339(at),
                proof,
            },
            at,
        ));
    }

    /// Active loops, most recently seen first (then by key, for a stable order).
    pub fn active(&self) -> Vec<ActiveLoop> {
        let mut v: Vec<(&String, &Entry)> = self.active.iter().collect();
        v.sort_by(|a, b| b.1.last.cmp(&a.1.last).then(a.0.cmp(b.0)));
        v.into_iter()
            .map(|(_, e)| ActiveLoop {
                kind: e.kind.clone(),
                service: e.service.clone(),
                vip: e.vip.clone(),
                client_pods: e.client_pods.iter().cloned().collect(),
                count: e.count,
                first_seen: rfc3339(e.first),
                last_seen: rfc3339(e.last),
                first_fix: e.first_fix.clone(),
                fixes: e.fixes.clone(),
            })
            .collect()
    }

    /// Resolved loops, most recent resolution first.
    pub fn resolved(&self) -> Vec<ResolvedLoop> {
        self.resolved
            .iter()
            .rev()
            .map(|(_, r, _)| r.clone())
            .collect()
    }
}

/// A hairpin event for tests (the writer's too).
#[cfg(test)]
pub(crate) fn tests_event(key: &str, service: Option<&str>) -> LoopbackEvent {
    let mut e = tests::ev(key, 1, None);
    e.service = service.map(String::from);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use probe_contract::LoopbackKind;

    pub(super) fn ev(key: &str, count: u64, pod: Option<&str>) -> LoopbackEvent {
        LoopbackEvent {
            count,
            remedy: vec!["call web.shop.svc instead".to_string()],
            service: Some("shop/web".into()),
            client_pod: pod.map(String::from),
            ..crate::test_events::hairpin(key)
        }
    }

    const T0: i64 = 1_800_000_000;

    #[test]
    fn a_loop_is_active_while_seen_within_the_window_then_resolved() {
        let mut l = Loops::default();
        l.observe(&ev("k1", 1, Some("shop/client-0")), T0);
        l.observe(&ev("k1", 5, Some("shop/client-1")), T0 + 300);
        assert!(
            !l.tick(T0 + 300 + ACTIVE_WINDOW - 1),
            "still inside the window"
        );
        let a = l.active();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].count, 5);
        assert_eq!(a[0].vip, "203.0.113.10:80");
        assert_eq!(a[0].service.as_deref(), Some("shop/web"));
        assert_eq!(a[0].client_pods, ["shop/client-0", "shop/client-1"]);
        assert_eq!(a[0].first_seen, rfc3339(T0));
        assert_eq!(a[0].last_seen, rfc3339(T0 + 300));
        assert_eq!(a[0].first_fix.as_deref(), Some("call web.shop.svc instead"));
        assert!(l.tick(T0 + 300 + ACTIVE_WINDOW), "the window has passed");
        assert!(l.active().is_empty());
        let r = l.resolved();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].resolved_at, rfc3339(T0 + 300 + ACTIVE_WINDOW));
        assert_eq!(r[0].count, 5);
        // Kept 24 h after resolution, then forgotten.
        assert!(!l.tick(T0 + 300 + ACTIVE_WINDOW + RESOLVED_KEEP - 1));
        assert!(l.tick(T0 + 300 + ACTIVE_WINDOW + RESOLVED_KEEP));
        assert!(l.resolved().is_empty());
    }

    /// The tracker's resolution of `shop/web`'s hairpin: one aggregate, proved at `at`.
    fn resolution(
        aggregate: &str,
        count: u64,
        at: i64,
        proof: &[&str],
    ) -> probe_contract::LoopResolution {
        probe_contract::LoopResolution {
            key: "hairpin/shop/web".into(),
            kind: LoopbackKind::Hairpin,
            service: Some("shop/web".into()),
            vip: None,
            vip_port: None,
            first_seen: rfc3339(T0),
            last_seen: rfc3339(T0),
            resolved_at: rfc3339(at),
            lasted_s: 0,
            count,
            episode: 0,
            aggregates: vec![aggregate.into()],
            proof: proof.iter().map(|p| p.to_string()).collect(),
            changed: vec![],
        }
    }

    #[test]
    fn a_loop_resolved_with_proof_moves_at_once_and_carries_the_proof() {
        let mut l = Loops::default();
        l.observe(&ev("a", 3, Some("shop/client-0")), T0);
        l.observe(&ev("b", 1, None), T0);
        let r = resolution("a", 3, T0 + 60, &["answered since", "conntrack: ..."]);
        // Long before the 10-minute window: only the resolved aggregate moves.
        l.resolve(&r, T0 + 60);
        assert_eq!(l.active().len(), 1);
        let resolved = l.resolved();
        assert_eq!(resolved.len(), 1);
        assert_eq!(resolved[0].resolved_at, rfc3339(T0 + 60));
        assert_eq!(resolved[0].proof.as_deref(), Some("answered since"));
        assert_eq!(resolved[0].count, 3);
        // The unproven one goes by the window, without proof.
        l.tick(T0 + ACTIVE_WINDOW);
        assert!(l.resolved().iter().any(|r| r.proof.is_none()));
    }

    /// Issue 35 item 10: the report's "active" is the tracker's (confirmed within
    /// `--resolve-after`), so the Node condition and the gauge agree; a quiet loop proven
    /// later carries its proof.
    #[test]
    fn active_means_confirmed_within_the_agents_window_and_a_late_proof_is_kept() {
        let window = 120;
        let mut l = Loops::new(window);
        l.observe(&ev("k1", 1, None), T0);
        assert!(!l.tick(T0 + window - 1));
        assert_eq!(l.active().len(), 1);
        assert!(
            l.tick(T0 + window),
            "quiet at the tracker's window, not 10 min"
        );
        assert!(l.active().is_empty());
        assert_eq!(l.resolved()[0].proof, None, "quiet: no proof");
        let r = resolution("k1", 1, T0 + 200, &["answered since"]);
        l.resolve(&r, T0 + 200);
        let resolved = l.resolved();
        assert_eq!(resolved.len(), 1);
        assert_eq!(resolved[0].proof.as_deref(), Some("answered since"));
        assert_eq!(resolved[0].resolved_at, rfc3339(T0 + 200));
    }

    #[test]
    fn a_resolved_loop_seen_again_is_active_again_and_not_resolved() {
        let mut l = Loops::default();
        l.observe(&ev("k1", 1, None), T0);
        l.tick(T0 + ACTIVE_WINDOW);
        assert_eq!(l.resolved().len(), 1);
        l.observe(&ev("k1", 2, None), T0 + ACTIVE_WINDOW + 5);
        assert_eq!(l.active().len(), 1);
        assert!(l.resolved().is_empty());
    }

    #[test]
    fn bounded_active_loops_and_client_pods() {
        let mut l = Loops::default();
        for i in 0..(MAX_ACTIVE + 3) {
            l.observe(&ev(&format!("k{i}"), 1, None), T0 + i as i64);
        }
        assert_eq!(l.active().len(), MAX_ACTIVE);
        assert_eq!(l.dropped, 3);
        // The least recently seen went first.
        assert!(l.active().iter().all(|a| a.first_seen != rfc3339(T0)));
        let mut l = Loops::default();
        for i in 0..(MAX_CLIENT_PODS + 5) {
            l.observe(&ev("k", 1, Some(&format!("ns/p{i:02}"))), T0);
        }
        assert_eq!(l.active()[0].client_pods.len(), MAX_CLIENT_PODS);
    }

    /// Issue 35 item 9: without a fix, the first remedy that is one, never the "Cause:" line.
    #[test]
    fn the_first_fix_is_never_the_cause() {
        let remedy = [
            "Cause: pod 10.0.0.9 called its own Service".to_string(),
            "Restore the hairpin".to_string(),
        ];
        assert_eq!(
            first_fix(&[], &remedy).as_deref(),
            Some("Restore the hairpin")
        );
        assert_eq!(first_fix(&[], &remedy[..1]), None);
    }
}
