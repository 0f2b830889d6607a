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
//! [`MAX_ACTIVE`] active loops and [`MAX_FLOODS`] floods (below), [`MAX_RESOLVED`] resolved
//! ones and [`MAX_CLIENT_PODS`] client pods per loop.
//!
//! **Fair slots under a flood (E5).** An unprivileged user makes a new aggregate with every
//! connect to an unserved port of an LB IP: 150 a second would fill 100 slots kept by
//! recency and push out the one real loop (and the Node condition, which names the first,
//! would follow the attacker). So the slots are shared by *group*: a loop's kind and its
//! Service (else its VIP's address, without the port, which the flood varies).
//! - A group keeps its [`MAX_PER_GROUP`] most recently seen loops; older ones of the group
//!   are folded into the group's *flood*: one entry (`flood` set: "flood: N more ... loops
//!   on ADDRESS", with the count and a few examples), so a flood is named as one.
//! - Past [`MAX_ACTIVE`], a loop of the least severe kind ([`severity`]) goes first, from the
//!   largest group, its oldest loop: a new real loop of another kind, Service or VIP always
//!   gets a slot. Past [`MAX_FLOODS`] floods, the least severe, least recently seen flood is
//!   forgotten (counted in `dropped`).
//! - [`Loops::active`] lists the most severe kind first; at the same kind, loops of a group
//!   without a flood before a flooding group's, then most recently seen; floods last. The
//!   Node condition names the first loop that is not a flood: the most severe real loop.
//!
//! A flood not seen for the window is listed as resolved like a loop (its address, no proof).

use std::collections::{BTreeMap, BTreeSet};

use probe_contract::{
    LoopbackEvent, LoopbackKind,
    report::{ActiveLoop, ResolvedLoop, rfc3339},
};

pub const ACTIVE_WINDOW: i64 = 600;
pub const RESOLVED_KEEP: i64 = 24 * 3600;
pub const MAX_ACTIVE: usize = 100;
pub const MAX_RESOLVED: usize = 100;
pub const MAX_CLIENT_PODS: usize = 10;
/// Loops of one group (kind, Service or VIP address) listed one by one; the rest is its flood.
pub const MAX_PER_GROUP: usize = 10;
/// Floods listed (one per group).
pub const MAX_FLOODS: usize = 20;
/// Examples a flood entry names.
const FLOOD_EXAMPLES: usize = 3;

/// How bad a kind is for the node, higher worse (the report's order, the condition's pick):
/// its row's `harm` (`probe_contract::KindSpec::harm`); a kind this agent does not know, 0.
pub fn severity(kind: &str) -> u8 {
    LoopbackKind::parse(kind).map_or(0, |k| k.spec().harm)
}

/// The many loops of one group beyond [`MAX_PER_GROUP`], as one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Flood {
    kind: String,
    service: Option<String>,
    /// The group's address (the VIP without the port).
    address: String,
    /// Loops folded in.
    loops: u64,
    /// Their confirmations.
    count: u64,
    first: i64,
    last: i64,
    /// The first few folded loops' `vip`.
    examples: Vec<String>,
}

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
    /// (kind, Service or VIP address): the unit of fairness.
    group: String,
    /// The VIP's address without the port.
    address: String,
    /// A confirmation not caused by the agent's canary was seen.
    user_seen: bool,
}

/// The node's loops, by aggregate key.
#[derive(Debug)]
pub struct Loops {
    /// Seconds without a confirmation before an active loop is no longer active.
    active_window: i64,
    active: BTreeMap<String, Entry>,
    /// By group.
    floods: BTreeMap<String, Flood>,
    /// (key, loop), oldest resolution first.
    resolved: Vec<(String, ResolvedLoop, i64)>,
    /// Floods forgotten for [`MAX_FLOODS`].
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

/// The VIP's (else the destination's) address, without the port.
fn address_of(e: &LoopbackEvent) -> String {
    e.vip.unwrap_or(e.dst).to_string()
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
/// [`probe_contract::report::MAX_FIX_IDS`].
pub fn fix_ids(fixes: &[probe_contract::Fix]) -> Vec<String> {
    fixes
        .iter()
        .take(probe_contract::report::MAX_FIX_IDS)
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
            floods: BTreeMap::new(),
            resolved: Vec::new(),
            dropped: 0,
        }
    }

    /// A report of the aggregate `e` at `now` (Unix seconds).
    pub fn observe(&mut self, e: &LoopbackEvent, now: i64) {
        self.resolved.retain(|(k, _, _)| *k != e.key);
        let entry = self.active.entry(e.key.clone()).or_insert_with(|| Entry {
            group: String::new(),
            address: address_of(e),
            kind: e.kind.as_str().to_string(),
            service: None,
            vip: vip_of(e),
            client_pods: BTreeSet::new(),
            count: 0,
            first: now,
            last: now,
            first_fix: None,
            fixes: Vec::new(),
            user_seen: false,
        });
        entry.user_seen |= !e.facts.canary;
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
        entry.group = format!(
            "{}|{}",
            entry.kind,
            entry.service.as_deref().unwrap_or(&entry.address)
        );
        let group = entry.group.clone();
        self.bound(&group);
    }

    /// Keeps the slots fair (module doc): `group` (just seen) within [`MAX_PER_GROUP`], all
    /// within [`MAX_ACTIVE`] and [`MAX_FLOODS`].
    fn bound(&mut self, group: &str) {
        loop {
            let in_group: Vec<(&String, &Entry)> = self
                .active
                .iter()
                .filter(|(_, e)| e.group == group)
                .collect();
            if in_group.len() <= MAX_PER_GROUP {
                break;
            }
            let oldest = in_group
                .iter()
                .min_by(|a, b| a.1.last.cmp(&b.1.last).then(a.0.cmp(b.0)))
                .map(|(k, _)| (*k).clone());
            match oldest {
                Some(k) => self.fold(&k),
                None => break,
            }
        }
        while self.active.len() > MAX_ACTIVE {
            let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
            for e in self.active.values() {
                *sizes.entry(e.group.as_str()).or_default() += 1;
            }
            // Least severe, then the largest group, then the oldest loop.
            let victim = self
                .active
                .iter()
                .min_by(|a, b| {
                    let rank = |(k, e): &(&String, &Entry)| {
                        (
                            severity(&e.kind),
                            std::cmp::Reverse(sizes[e.group.as_str()]),
                            e.last,
                            (*k).clone(),
                        )
                    };
                    rank(a).cmp(&rank(b))
                })
                .map(|(k, _)| k.clone());
            match victim {
                Some(k) => self.fold(&k),
                None => break,
            }
        }
        while self.floods.len() > MAX_FLOODS {
            let victim = self
                .floods
                .iter()
                .min_by_key(|(g, f)| (severity(&f.kind), f.last, (*g).clone()))
                .map(|(g, _)| g.clone());
            if let Some(g) = victim {
                self.floods.remove(&g);
                self.dropped += 1;
            }
        }
    }

    /// The active loop `key` into its group's flood.
    fn fold(&mut self, key: &str) {
        let Some(e) = self.active.remove(key) else {
            return;
        };
        let flood = self.floods.entry(e.group.clone()).or_insert_with(|| Flood {
            kind: e.kind.clone(),
            service: e.service.clone(),
            address: e.address.clone(),
            loops: 0,
            count: 0,
            first: e.first,
            last: e.last,
            examples: Vec::new(),
        });
        flood.loops += 1;
        flood.count = flood.count.saturating_add(e.count);
        flood.first = flood.first.min(e.first);
        flood.last = flood.last.max(e.last);
        if flood.examples.len() < FLOOD_EXAMPLES && !flood.examples.contains(&e.vip) {
            flood.examples.push(e.vip);
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
        let before = (self.active.len(), self.floods.len(), self.resolved.len());
        let expired: Vec<(String, i64)> = self
            .active
            .iter()
            .filter(|(_, e)| now - e.last >= self.active_window)
            .map(|(k, e)| (k.clone(), e.last + self.active_window))
            .collect();
        for (key, resolved_at) in expired {
            self.move_to_resolved(&key, resolved_at, None);
        }
        let window = self.active_window;
        let quiet: Vec<String> = self
            .floods
            .iter()
            .filter(|(_, f)| now - f.last >= window)
            .map(|(g, _)| g.clone())
            .collect();
        for group in quiet {
            if let Some(f) = self.floods.remove(&group) {
                let at = f.last + window;
                self.resolved.push((
                    format!("flood/{group}"),
                    ResolvedLoop {
                        kind: f.kind,
                        service: f.service,
                        vip: f.address,
                        count: f.count,
                        first_seen: rfc3339(f.first),
                        last_seen: rfc3339(f.last),
                        resolved_at: rfc3339(at),
                        proof: None,
                    },
                    at,
                ));
            }
        }
        self.resolved.sort_by_key(|(_, _, at)| *at);
        self.resolved.retain(|(_, _, at)| now - at < RESOLVED_KEEP);
        let excess = self.resolved.len().saturating_sub(MAX_RESOLVED);
        self.resolved.drain(..excess);
        before != (self.active.len(), self.floods.len(), self.resolved.len())
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

    /// Active loops, the most severe kind first, then those of a group without a flood, then
    /// the most recently seen (then by key, for a stable order); the floods last, the most
    /// severe first (module doc).
    pub fn active(&self) -> Vec<ActiveLoop> {
        let mut v: Vec<(&String, &Entry)> = self.active.iter().collect();
        let rank = |(k, e): &(&String, &Entry)| {
            (
                std::cmp::Reverse(severity(&e.kind)),
                self.floods.contains_key(&e.group),
                std::cmp::Reverse(e.last),
                (*k).clone(),
            )
        };
        v.sort_by_key(|a| rank(a));
        let mut floods: Vec<&Flood> = self.floods.values().collect();
        floods.sort_by_key(|f| {
            (
                std::cmp::Reverse(severity(&f.kind)),
                std::cmp::Reverse(f.last),
            )
        });
        let floods = floods.into_iter().map(|f| ActiveLoop {
            kind: f.kind.clone(),
            service: f.service.clone(),
            vip: f.address.clone(),
            count: f.count,
            first_seen: rfc3339(f.first),
            last_seen: rfc3339(f.last),
            flood: Some(format!(
                "flood: {} more {} loops on {} than the {MAX_PER_GROUP} listed, aggregated; e.g. {}",
                f.loops,
                f.kind,
                f.service.as_deref().unwrap_or(&f.address),
                f.examples.join(", ")
            )),
            ..Default::default()
        });
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
                flood: None,
                canary: !e.user_seen,
            })
            .chain(floods)
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
pub(crate) use probe_core::test_events::hairpin_for as tests_event;

#[cfg(test)]
mod tests {
    use probe_contract::LoopbackKind;

    use super::*;

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

    /// #40: a loop only the agent's canary tripped says so; a user's call clears it.
    #[test]
    fn a_loop_only_the_canary_tripped_is_marked_until_a_user_trips_it() {
        let mut l = Loops::default();
        let mut canary = ev("k1", 1, None);
        canary.facts.canary = true;
        l.observe(&canary, T0);
        assert!(l.active()[0].canary);
        l.observe(&ev("k1", 2, Some("shop/client-0")), T0 + 1);
        assert!(!l.active()[0].canary);
        canary.count = 3;
        l.observe(&canary, T0 + 2);
        assert!(!l.active()[0].canary, "a user's loop stays one");
    }

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
        // Each loop its own Service: past MAX_ACTIVE the oldest is folded into its group's
        // flood entry (listed after every single loop).
        let mut l = Loops::default();
        for i in 0..(MAX_ACTIVE + 3) {
            let mut e = ev(&format!("k{i}"), 1, None);
            e.service = Some(format!("shop/web-{i}"));
            l.observe(&e, T0 + i as i64);
        }
        let active = l.active();
        let single: Vec<_> = active.iter().filter(|a| a.flood.is_none()).collect();
        assert_eq!(single.len(), MAX_ACTIVE);
        assert_eq!(active.len() - single.len(), 3, "three floods of one");
        // The least recently seen went first.
        assert!(single.iter().all(|a| a.first_seen != rfc3339(T0)));
        // One Service's loops: its MAX_PER_GROUP newest, the rest one flood entry.
        let mut l = Loops::default();
        for i in 0..(MAX_PER_GROUP + 5) {
            l.observe(&ev(&format!("k{i}"), 2, None), T0 + i as i64);
        }
        let active = l.active();
        assert_eq!(active.len(), MAX_PER_GROUP + 1);
        let flood = active.last().unwrap();
        assert_eq!(flood.count, 10, "the five folded loops' confirmations");
        assert!(
            flood
                .flood
                .as_deref()
                .is_some_and(|f| f.starts_with("flood: 5 more hairpin loops on shop/web")),
            "{flood:?}"
        );
        // Floods are bounded too.
        let mut l = Loops::default();
        for g in 0..(MAX_FLOODS + 2) {
            for i in 0..(MAX_PER_GROUP + 1) {
                let mut e = ev(&format!("g{g}-k{i}"), 1, None);
                e.service = Some(format!("shop/web-{g}"));
                l.observe(&e, T0);
            }
        }
        assert!(l.active().iter().filter(|a| a.flood.is_some()).count() <= MAX_FLOODS);
        let mut l = Loops::default();
        for i in 0..(MAX_CLIENT_PODS + 5) {
            l.observe(&ev("k", 1, Some(&format!("ns/p{i:02}"))), T0);
        }
        assert_eq!(l.active()[0].client_pods.len(), MAX_CLIENT_PODS);
    }

    /// E5: an unprivileged user makes 150 distinct unserved VIP ports a second on the LB IP
    /// (cheap loops, one aggregate each) while the LB's health checks are black-holed (one
    /// real loop of another kind and VIP). After every second of the flood (8 report
    /// writes' worth) the real loop is in the report and the Node condition names it; the
    /// flood is one entry that says it is a flood, with its count and examples.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn a_flood_of_cheap_loops_never_hides_a_real_one_of_another_kind() {
        let mut l = Loops::default();
        let mut real = crate::test_events::hairpin("hc/203.0.113.99");
        real.kind = LoopbackKind::HealthcheckBlackhole;
        real.vip = Some("203.0.113.99".parse().unwrap());
        real.vip_port = Some(31000);
        real.service = Some("shop/lb".into());
        l.observe(&real, T0);
        let mut kept = 0;
        let mut condition_real = 0;
        for second in 1..=8i64 {
            for i in 0..150u16 {
                let port = 1000 + u16::try_from(second).unwrap() * 150 + i;
                let mut e = crate::test_events::hairpin(&format!("unserved/{port}"));
                e.kind = LoopbackKind::VipPortUnserved;
                e.vip_port = Some(port);
                l.observe(&e, T0 + second);
            }
            let facts = crate::sink::node_report::status::NodeFacts {
                node: "node-a".into(),
                ..Default::default()
            };
            let status = crate::sink::node_report::status::build(
                &facts,
                &Default::default(),
                &Default::default(),
                &l,
                T0 + second,
            );
            assert!(status.active_loops.len() <= MAX_ACTIVE + MAX_FLOODS);
            if status
                .active_loops
                .iter()
                .any(|a| a.kind == "healthcheck_blackhole")
            {
                kept += 1;
            }
            if crate::sink::node_report::condition::condition(&status).reason
                == "HealthcheckBlackhole"
            {
                condition_real += 1;
            }
            if second == 8 {
                let flood = status
                    .active_loops
                    .iter()
                    .find_map(|a| a.flood.as_ref())
                    .unwrap_or_else(|| panic!("no flood entry: {status:#?}"));
                assert!(flood.starts_with("flood: "), "{flood}");
                assert!(flood.contains("vip_port_unserved"), "{flood}");
            }
        }
        eprintln!(
            "E5: the real loop in {kept}/8 reports, the condition on it in {condition_real}/8"
        );
        assert_eq!((kept, condition_real), (8, 8));
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
