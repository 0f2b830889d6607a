//! From confirmed to resolved: each confirmed loop ([`loop_key`]: kind and Service, else kind
//! and VIP; the node is the agent's own) is tracked until the failure has stopped *and* the
//! traffic that triggered it is seen to flow again. One loop gathers the aggregates of its
//! clients (ten pods hairpinning through one Service are one loop, ten Warning Events).
//!
//! - **Active** while it recurs. The correlator reports every repeat of an aggregate, so a
//!   loop that keeps happening keeps its last sighting fresh.
//! - Not confirmed for `--resolve-after` (default 5 min: longer than an LB's health-check
//!   interval and a client's retries), the agent looks for [`proof`]: answered conntrack
//!   connections of the loop's shape whose latest packet passed after the last sighting.
//!   With proof the loop is **resolved** (a [`LoopResolution`]: a Normal Event
//!   `LoopbackResolved`, `clbprobe_loopback_active{kind}` falls, a resolution is counted).
//!   Without, it is **quiet**: it stopped, but nothing shows the traffic still flows (no
//!   client calls, or conntrack unreadable), so nothing is claimed; it is looked at again on
//!   each check until proof comes or it recurs.
//! - A resolved loop that is confirmed again is active again, in a new episode, and counted
//!   as a **regression** (its Warning Event is a new one).
//!
//! What changed: with API access, the Service's fields the fixes touch are kept from the
//! loop's first sighting and compared at resolution ([`service_fields`], [`changed`]).
//!
//! Pure: the agent's correlation loop feeds it confirmations, wall-clock milliseconds (the
//! last sighting is the kernel's timestamp of the latest occurrence, not when the report
//! reached the loop: a report held for the API's names must not make a call placed right
//! after the failure look older than it) and the proof look-ups' results; the look-ups
//! themselves run off that loop.

pub mod proof;

use std::collections::{BTreeMap, VecDeque};

use probe_contract::{LoopLifecycle, LoopResolution, LoopbackEvent, LoopbackKind, report::rfc3339};
pub use proof::Shape;

use crate::service::ServiceFacts;

/// How many loops are tracked at most (the least recently seen resolved, then quiet, then
/// active loop is forgotten first).
pub const MAX_TRACKED: usize = 1000;
/// How many resolutions the lifecycle view keeps.
pub const RECENT_RESOLVED: usize = 50;

/// The window and how often quiet loops are looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrackerConfig {
    /// Seconds without a confirmation before proof is looked for.
    pub resolve_after_s: u64,
}

impl TrackerConfig {
    /// How often the agent looks for proof: a fifth of the window, between 1 and 30 s.
    pub fn check_every_s(&self) -> u64 {
        (self.resolve_after_s / 5).clamp(1, 30)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Active,
    Quiet,
    Resolved,
}

/// The aggregates one loop remembers at most (their Warning Events get a new episode).
pub const MAX_AGGREGATES: usize = 64;

/// A loop's identity: `kind/namespace/name` when the event names a Service, else
/// `kind/vip:port` (or the VIP, or the destination). Pure.
pub fn loop_key(e: &LoopbackEvent) -> String {
    let what = match (&e.service, e.vip, e.vip_port) {
        (Some(service), _, _) => service.clone(),
        (None, Some(vip), Some(port)) => std::net::SocketAddr::new(vip, port).to_string(),
        (None, Some(vip), None) => vip.to_string(),
        (None, None, _) => e.dst.to_string(),
    };
    format!("{}/{what}", e.kind.as_str())
}

#[derive(Clone, Debug)]
struct Tracked {
    kind: LoopbackKind,
    /// The aggregate keys seen in this loop (bounded by [`MAX_AGGREGATES`]).
    aggregates: std::collections::BTreeSet<String>,
    service: Option<String>,
    vip: Option<std::net::IpAddr>,
    vip_port: Option<u16>,
    shape: Option<Shape>,
    /// Unix milliseconds.
    first: i64,
    last: i64,
    /// Reports of the loop (all its aggregates) before this episode, and in all.
    count_base: u64,
    count: u64,
    episode: u32,
    state: State,
    /// A proof look-up is out.
    pending: bool,
    /// The Service's fields at the episode's first sighting.
    service_before: Option<BTreeMap<String, String>>,
}

/// What a confirmation meant to the tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// A loop not tracked before (or forgotten).
    New,
    /// An active (or quiet) loop, again.
    Repeat,
    /// A resolved loop, confirmed again: a new episode.
    Regression { episode: u32 },
}

/// A proof look-up to run: the loop's traffic shape and how long it has been quiet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProofRequest {
    pub key: String,
    pub shape: Shape,
    pub quiet_for_ms: u64,
}

/// The node's loops.
#[derive(Debug)]
pub struct Tracker {
    cfg: TrackerConfig,
    loops: BTreeMap<String, Tracked>,
    resolved: VecDeque<LoopResolution>,
    resolutions: BTreeMap<String, u64>,
    regressions: BTreeMap<String, u64>,
    /// The [`Tracker::lifecycle`] view changed since [`Tracker::take_changed`] (a loop's
    /// repeats alone do not change it: the hub is not republished per report).
    changed: bool,
}

impl Tracker {
    pub fn new(cfg: TrackerConfig) -> Self {
        Self {
            cfg,
            loops: BTreeMap::new(),
            resolved: VecDeque::new(),
            resolutions: BTreeMap::new(),
            regressions: BTreeMap::new(),
            changed: false,
        }
    }

    pub fn config(&self) -> TrackerConfig {
        self.cfg
    }

    /// A confirmation (new or repeat) of `e` whose latest occurrence was at `seen` (Unix
    /// milliseconds); `service` is the Service's [`service_fields`] when the API names it.
    pub fn observe(
        &mut self,
        e: &LoopbackEvent,
        service: Option<BTreeMap<String, String>>,
        seen: i64,
    ) -> Observed {
        let now = seen;
        let key = loop_key(e);
        let observed = match self.loops.get_mut(&key) {
            None => {
                self.loops.insert(
                    key.clone(),
                    Tracked {
                        kind: e.kind,
                        aggregates: Default::default(),
                        service: e.service.clone(),
                        vip: e.vip,
                        vip_port: e.vip_port,
                        shape: Shape::of(e),
                        first: now,
                        last: now,
                        count_base: 0,
                        count: 0,
                        episode: 0,
                        state: State::Active,
                        pending: false,
                        service_before: service.clone(),
                    },
                );
                Observed::New
            }
            Some(t) if t.state == State::Resolved => {
                t.episode += 1;
                t.first = now;
                t.count_base = t.count;
                t.aggregates.clear();
                t.service_before = service.clone();
                // The new episode's proof must come from its own clients.
                t.shape = Shape::of(e);
                t.state = State::Active;
                *self
                    .regressions
                    .entry(e.kind.as_str().to_string())
                    .or_default() += 1;
                Observed::Regression { episode: t.episode }
            }
            Some(t) => {
                self.changed |= t.state != State::Active;
                t.state = State::Active;
                Observed::Repeat
            }
        };
        self.changed |= observed != Observed::Repeat;
        let t = self.loops.get_mut(&key).expect("inserted above");
        t.last = t.last.max(now);
        // Confirmations across the loop's aggregates: each report is one.
        t.count += 1;
        if t.aggregates.len() < MAX_AGGREGATES {
            t.aggregates.insert(e.key.clone());
        }
        if e.service.is_some() {
            t.service = e.service.clone();
        }
        if t.vip.is_none() || t.shape.is_none() {
            t.vip = t.vip.or(e.vip);
            t.vip_port = t.vip_port.or(e.vip_port);
            t.shape = t.shape.clone().or_else(|| Shape::of(e));
        }
        // Each aggregate's client is one of the loop's own: its answered call is proof.
        if let Some(shape) = &mut t.shape {
            shape.widen(e);
        }
        if t.service_before.is_none() {
            t.service_before = service;
        }
        self.evict();
        observed
    }

    /// Whether [`Tracker::observe`] would keep the Service's fields for `e`'s loop (a new loop
    /// or episode, or none kept yet): the caller looks them up only then.
    pub fn needs_service(&self, e: &LoopbackEvent) -> bool {
        self.loops
            .get(&loop_key(e))
            .is_none_or(|t| t.state == State::Resolved || t.service_before.is_none())
    }

    /// The Service a tracked loop names.
    pub fn service_of(&self, key: &str) -> Option<&str> {
        self.loops.get(key)?.service.as_deref()
    }

    /// The loops due a proof look-up at `now` (Unix ms): not confirmed for the window, not
    /// resolved, none out for them already. Marks them pending.
    pub fn due(&mut self, now: i64) -> Vec<ProofRequest> {
        let window = self.cfg.resolve_after_s as i64 * 1000;
        let mut out = Vec::new();
        for (key, t) in &mut self.loops {
            if t.state == State::Resolved || t.pending || now - t.last < window {
                continue;
            }
            self.changed |= t.state != State::Quiet;
            t.state = State::Quiet;
            let Some(shape) = &t.shape else { continue };
            t.pending = true;
            out.push(ProofRequest {
                key: key.clone(),
                shape: shape.clone(),
                quiet_for_ms: (now - t.last).max(0) as u64,
            });
        }
        out
    }

    /// A look-up's result for `key`: what it found (None: nothing, or the look-up failed)
    /// and the Service's fields now. Returns the resolution when there is one. A loop
    /// confirmed again while the look-up was out stays active. Whether a hairpin's calls
    /// answered by the LB alone prove it is [`proof`]'s decision (enough of them); the
    /// Service's change is reported with the resolution, never taken as proof.
    pub fn proved(
        &mut self,
        key: &str,
        found: Option<proof::Found>,
        service_now: Option<BTreeMap<String, String>>,
        now: i64,
    ) -> Option<LoopResolution> {
        let t = self.loops.get_mut(key)?;
        t.pending = false;
        if t.state != State::Quiet {
            return None;
        }
        let found = found?;
        let changed = match (&t.service_before, &service_now) {
            (Some(before), Some(after)) => changed(before, after),
            _ => Vec::new(),
        };
        // What changed is reported, never a proof: a changed annotation nothing acted on
        // leaves the loop standing (issue #49).
        let mut proof = found.lines;
        if found.only_through_lb {
            proof.push(format!(
                "answered by the LB with no NAT on this node, {} calls or more from the loop's own clients to its own ports, none confirmed looping (a standing loop sends some back here)",
                proof::MIN_ANSWERED_THROUGH_LB
            ));
        }
        t.state = State::Resolved;
        self.changed = true;
        let resolution = LoopResolution {
            key: key.to_string(),
            kind: t.kind,
            service: t.service.clone(),
            vip: t.vip,
            vip_port: t.vip_port,
            first_seen: rfc3339(t.first.div_euclid(1000)),
            last_seen: rfc3339(t.last.div_euclid(1000)),
            resolved_at: rfc3339(now.div_euclid(1000)),
            lasted_s: ((t.last - t.first).max(0) / 1000) as u64,
            count: t.count.saturating_sub(t.count_base),
            episode: t.episode,
            aggregates: t.aggregates.iter().cloned().collect(),
            proof,
            changed,
        };
        *self
            .resolutions
            .entry(t.kind.as_str().to_string())
            .or_default() += 1;
        self.resolved.push_back(resolution.clone());
        while self.resolved.len() > RECENT_RESOLVED {
            self.resolved.pop_front();
        }
        Some(resolution)
    }

    /// Whether the [`Tracker::lifecycle`] view changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The loops by state and kind, the counters and the latest resolutions. Every kind is
    /// listed in each map (0 when none): a gauge falls to 0 rather than vanishing, and a
    /// counter exists from the start (a rate over a series that appears later misses its
    /// first increase).
    pub fn lifecycle(&self) -> LoopLifecycle {
        let zero: BTreeMap<String, u64> = ALL_KINDS
            .iter()
            .map(|k| (k.as_str().to_string(), 0))
            .collect();
        let (mut active, mut quiet) = (zero.clone(), zero.clone());
        for t in self.loops.values() {
            let by = match t.state {
                State::Active => &mut active,
                State::Quiet => &mut quiet,
                State::Resolved => continue,
            };
            *by.entry(t.kind.as_str().to_string()).or_default() += 1;
        }
        let mut resolutions = zero.clone();
        resolutions.extend(self.resolutions.clone());
        let mut regressions = zero;
        regressions.extend(self.regressions.clone());
        LoopLifecycle {
            active,
            quiet,
            resolutions,
            regressions,
            resolved: self.resolved.iter().cloned().collect(),
        }
    }

    fn evict(&mut self) {
        while self.loops.len() > MAX_TRACKED {
            let rank = |t: &Tracked| match t.state {
                State::Resolved => 0,
                State::Quiet => 1,
                State::Active => 2,
            };
            let Some(k) = self
                .loops
                .iter()
                .min_by_key(|(_, t)| (rank(t), t.last))
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            self.loops.remove(&k);
        }
    }
}

/// Every kind, for gauges that list each.
pub const ALL_KINDS: [LoopbackKind; LoopbackKind::ALL.len()] = LoopbackKind::ALL;

/// The Service's fields a fix changes, as `field -> value` (the fixes patch these:
/// traffic policies, type, LB class, the LB controller's annotations, the ingress `ipMode`).
/// Pure.
pub fn service_fields(s: &ServiceFacts) -> BTreeMap<String, String> {
    let mut f = BTreeMap::new();
    f.insert("spec.type".to_string(), s.service_type.to_string());
    f.insert(
        "spec.externalTrafficPolicy".to_string(),
        s.external_traffic_policy
            .as_deref()
            .unwrap_or("Cluster")
            .to_string(),
    );
    if let Some(class) = &s.load_balancer_class {
        f.insert("spec.loadBalancerClass".to_string(), class.clone());
    }
    for (i, ing) in s.ingress.iter().enumerate() {
        f.insert(
            format!("status.loadBalancer.ingress[{i}].ipMode"),
            ing.ip_mode.as_deref().unwrap_or("VIP").to_string(),
        );
    }
    for (k, v) in &s.annotations {
        f.insert(format!("metadata.annotations[{k}]"), v.clone());
    }
    f
}

/// `field: before -> after` for each field that differs (`(unset)` for a missing one). Pure.
pub fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let unset = "(unset)".to_string();
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let (b, a) = (
                before.get(k).unwrap_or(&unset),
                after.get(k).unwrap_or(&unset),
            );
            (b != a).then(|| format!("{k}: {b} -> {a}"))
        })
        .collect()
}

#[cfg(test)]
mod tests;
