//! What to write to the API server for a confirmed loopback, and when: pure (no I/O, no clock;
//! the caller passes the time), so the rate limits are unit-tested to the second.
//!
//! - One `events.k8s.io/v1` Event per aggregate, named deterministically
//!   (`clb-probe.<node>.<kind>.<hash of the aggregate key>`): a restarted agent finds its Event
//!   again (create answers 409, the writer patches).
//! - Regarding: the Service when attribution names one (the Event lands in its namespace and in
//!   `kubectl describe service`): the existing object, `namespace/name` with the API's uid,
//!   never the service table's `namespace/name:port` label (the port goes in the note);
//!   otherwise the Node, in namespace `default`, as the kubelet files Node events. Related:
//!   the client Pod of a hairpin, when known.
//! - Repeats patch the Event's `series` (count, lastObservedTime), never a new Event.
//! - At most one write per aggregate per [`PlanConfig::per_aggregate`] (60 s); a repeat inside
//!   that window is remembered and written by [`EventPlanner::due`] once the window has passed.
//! - A global token bucket (burst 10, one token per 6 s: 10 writes a minute sustained, per
//!   agent) bounds a storm of distinct aggregates; what it holds back stays pending.
//! - A resolved loop ([`EventPlanner::resolved`]) gets a Normal `LoopbackResolved` Event
//!   regarding the same object; if it recurs, its Warning is a new Event (the aggregate key
//!   and its episode number named in the hash), counted from 1, so the resolution stays
//!   visible beside it.
//!
//! Fairness under a flood (hostile round 3, E1). Anyone who can connect to a bound VIP makes a
//! new `vip_port_unserved` aggregate per port, 20 a second is easy; the bucket gives one token
//! per 6 s, so serving the oldest first (as before) left a real loop that started later
//! waiting forever. Now:
//! - Aggregates are grouped in lanes: (kind, the object the Event regards, VIP). The flood
//!   above is one lane; a health-check blackhole, another Service's hairpin, another VIP's
//!   unserved port are lanes of their own.
//! - Each token goes to the lane written least recently (a lane never written first), then the
//!   most severe kind (health-check blackhole, then hairpin and self-loop, then VIP as source,
//!   then unserved port: the cheapest to make), then the newest aggregate of that lane. So a
//!   new real loop of another lane waits for at most one token, whatever the flood's size.
//!   A report is the occasion to write the fairest pending write, which is usually its own.
//! - A lane gets [`PlanConfig::flood_after`] (5) Events of its own; its further aggregates are
//!   folded into one flood Event of the lane (note `Flood: N distinct ... aggregates`, the
//!   newest examples, its `series.count` the confirmations of all of them), written like any
//!   aggregate (at most once per window). A lane with no new aggregate for
//!   [`FLOOD_QUIET`] gets its own Events again; a lane is forgotten with its last aggregate.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use probe_contract::{LoopResolution, LoopbackEvent, LoopbackKind};

use super::kube_event_doc::{
    EventDoc, NOTE_MAX, Names, Series, event_doc, event_name, resolved_doc, truncate,
};

/// The limits; [`Default`] is what the agent runs with.
#[derive(Clone, Debug)]
pub struct PlanConfig {
    /// At most one write per aggregate within this.
    pub per_aggregate: Duration,
    /// Token bucket: how many writes may go at once...
    pub burst: u32,
    /// ...and one more token per this.
    pub refill_every: Duration,
    /// Aggregates remembered (names, counts); the least recently seen go first.
    pub max_tracked: usize,
    /// Events of their own per lane (kind, object, VIP); further aggregates of the lane are
    /// folded into the lane's flood Event.
    pub flood_after: usize,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            per_aggregate: Duration::from_secs(60),
            burst: 10,
            refill_every: Duration::from_secs(6),
            max_tracked: 4096,
            flood_after: 5,
        }
    }
}

/// A lane without a new aggregate for this long is no longer flooded: its next aggregates get
/// Events of their own again.
pub const FLOOD_QUIET: Duration = Duration::from_secs(600);
/// Newest aggregates a flood Event names.
const FLOOD_EXAMPLES: usize = 5;

/// A write to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// POST the Event (on 409, the writer patches instead: a restarted agent).
    Create(EventDoc),
    /// PATCH the Event's series (and note: the remedy may have changed).
    Patch(EventDoc),
}

impl Write {
    pub fn doc(&self) -> &EventDoc {
        match self {
            Write::Create(d) | Write::Patch(d) => d,
        }
    }
}

/// Why [`EventPlanner::observe`] wrote nothing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Written less than `per_aggregate` ago; [`EventPlanner::due`] writes it later.
    Throttled,
    /// The global bucket is empty; [`EventPlanner::due`] writes it when a token is back.
    RateLimited,
    /// Nothing new since the last write.
    Unchanged,
}

#[derive(Debug)]
struct Tracked {
    doc: EventDoc,
    /// (kind, regarding, VIP): see the module doc.
    lane: String,
    /// 0 is the most severe.
    severity: u8,
    /// Counted in its lane's flood Event, never written on its own.
    folded: bool,
    /// The Event exists (a create was handed out).
    created: bool,
    last_write: Option<Duration>,
    /// The count last handed out in a write.
    written_count: u64,
    /// Observed count (the aggregate's `count` less `base`; for a flood Event, the sum over
    /// the folded aggregates).
    count: u64,
    /// The aggregate's count before this episode's first confirmation (0 in the first).
    base: u64,
    last_seen: Duration,
}

impl Tracked {
    fn dirty(&self) -> bool {
        !self.folded && (!self.created || self.count != self.written_count)
    }
}

/// One lane's state; dropped with the lane's last tracked entry.
#[derive(Debug, Default)]
struct Lane {
    /// Tracked entries of the lane (its flood Event included).
    members: usize,
    /// Aggregates given an Event of their own since the lane was last quiet.
    own_events: usize,
    /// Aggregates folded into the flood Event, and the newest of them.
    folded: u64,
    examples: std::collections::VecDeque<String>,
    /// When the lane's last write was handed out, and its last new aggregate seen.
    last_write: Option<Duration>,
    last_new: Duration,
}

/// The planner. `now` is a monotonic time since any fixed origin; `wall` the matching wall
/// clock, for the Event's timestamps.
#[derive(Debug)]
pub struct EventPlanner {
    cfg: PlanConfig,
    node: String,
    tracked: HashMap<String, Tracked>,
    lanes: HashMap<String, Lane>,
    tokens: u32,
    /// When the bucket last gained (or was found full).
    refilled_at: Option<Duration>,
    /// Resolutions per aggregate key: the episode its next Warning opens.
    episodes: HashMap<String, u32>,
    /// `LoopbackResolved` Events the bucket held back (bounded; the oldest goes first).
    held_resolved: std::collections::VecDeque<EventDoc>,
}

/// 0 is written first (the kind's row of the contract's `KINDS`).
fn severity(kind: LoopbackKind) -> u8 {
    kind.spec().severity
}

fn lane_of(event: &LoopbackEvent, doc: &EventDoc) -> String {
    let r = &doc.regarding;
    let vip = event.vip.map(|v| v.to_string()).unwrap_or_default();
    format!(
        "{}|{}/{}/{}|{vip}",
        event.kind.as_str(),
        r.kind,
        r.namespace,
        r.name
    )
}

/// The tracked key of a lane's flood Event (aggregate keys never start with it).
fn flood_key(lane: &str) -> String {
    format!("flood|{lane}")
}

/// What a flood Event says: how many aggregates, the newest, and the latest one's own note.
fn flood_note(kind: LoopbackKind, lane: &Lane, own: usize, latest: &str) -> String {
    let examples: Vec<&str> = lane.examples.iter().rev().map(String::as_str).collect();
    truncate(
        format!(
            "Flood: {} distinct {} aggregates beyond the first {own} of this kind, object and VIP, written as this one Event (all are counted in clbprobe_loopback_events_total). Newest: {}. Latest: {latest}",
            lane.folded,
            kind.as_str(),
            examples.join(", "),
        ),
        NOTE_MAX,
    )
}

impl EventPlanner {
    pub fn new(cfg: PlanConfig, node: &str) -> Self {
        Self {
            tokens: cfg.burst,
            cfg,
            node: node.to_string(),
            tracked: HashMap::new(),
            lanes: HashMap::new(),
            refilled_at: None,
            episodes: HashMap::new(),
            held_resolved: std::collections::VecDeque::new(),
        }
    }

    /// A loop resolved: the Normal Event to create now (or later, when the bucket allows),
    /// regarding what the loop's (first) Warning regarded. The next confirmation of each of its
    /// aggregates opens a new Warning.
    pub fn resolved(
        &mut self,
        r: &LoopResolution,
        now: Duration,
        wall: SystemTime,
    ) -> Option<Write> {
        // Each aggregate of the loop: its next confirmation opens a new Warning.
        let mut warning = None;
        for key in &r.aggregates {
            *self.episodes.entry(key.clone()).or_insert(0) += 1;
            if let Some(t) = self.untrack(key) {
                warning.get_or_insert(t.doc);
            }
        }
        let doc = resolved_doc(r, warning.as_ref(), &self.node, wall);
        self.held_resolved.push_back(doc);
        while self.held_resolved.len() > MAX_HELD_RESOLVED {
            self.held_resolved.pop_front();
        }
        self.take_held_resolved(now)
    }

    fn take_held_resolved(&mut self, now: Duration) -> Option<Write> {
        if self.held_resolved.is_empty() || !self.take_token(now) {
            return None;
        }
        self.held_resolved.pop_front().map(Write::Create)
    }

    /// A report of a confirmed aggregate (new or repeat): the write to do now (the fairest
    /// pending one, usually this report's), or why not.
    pub fn observe(
        &mut self,
        event: &LoopbackEvent,
        names: &Names,
        now: Duration,
        wall: SystemTime,
    ) -> Result<Write, Held> {
        let episode = self.episodes.get(&event.key).copied().unwrap_or(0);
        let mut doc = event_doc(event, names, &self.node, wall);
        if episode > 0 {
            doc.name = event_name(&self.node, &format!("{}#{episode}", event.key), event.kind);
        }
        let lane_key = lane_of(event, &doc);
        let latest_note = doc.note.clone();
        let flood_template = doc.clone();
        let (folded, delta) = match self.tracked.get_mut(&event.key) {
            Some(t) => {
                // Keep the first eventTime; the rest follows the latest report.
                let event_time = t.doc.event_time;
                t.doc = EventDoc { event_time, ..doc };
                let before = t.count;
                t.count = t.count.max(event.count.saturating_sub(t.base));
                t.last_seen = now;
                t.doc.series = (t.count >= 2).then_some(Series {
                    count: t.count,
                    last_observed: wall,
                });
                (t.folded, t.count - before)
            }
            None => {
                let lane = self.lanes.entry(lane_key.clone()).or_default();
                if now.saturating_sub(lane.last_new) >= FLOOD_QUIET {
                    lane.own_events = 0;
                }
                lane.last_new = now;
                lane.members += 1;
                let folded = lane.own_events >= self.cfg.flood_after;
                if folded {
                    lane.folded += 1;
                    lane.examples.push_back(event.key.clone());
                    while lane.examples.len() > FLOOD_EXAMPLES {
                        lane.examples.pop_front();
                    }
                } else {
                    lane.own_events += 1;
                }
                let base = if episode > 0 {
                    event.count.saturating_sub(1)
                } else {
                    0
                };
                let count = event.count.saturating_sub(base);
                doc.series = (count >= 2).then_some(Series {
                    count,
                    last_observed: wall,
                });
                self.tracked.insert(
                    event.key.clone(),
                    Tracked {
                        doc,
                        lane: lane_key.clone(),
                        severity: severity(event.kind),
                        folded,
                        created: false,
                        last_write: None,
                        written_count: 0,
                        count,
                        base,
                        last_seen: now,
                    },
                );
                (folded, count)
            }
        };
        let target = if folded {
            self.fold(
                &lane_key,
                event.kind,
                flood_template,
                &latest_note,
                delta,
                now,
                wall,
            )
        } else {
            event.key.clone()
        };
        self.evict();
        match self.tracked.get(&target) {
            None => return Err(Held::Unchanged),
            Some(t) if !t.dirty() => return Err(Held::Unchanged),
            Some(t) if !self.window_open(t, now) => return Err(Held::Throttled),
            Some(_) => {}
        }
        let fairest = self.fairest(now).unwrap_or(target);
        self.try_write(&fairest, now)
    }

    /// Counts `delta` more confirmations in the lane's flood Event (created on the lane's
    /// first folded aggregate); its key.
    #[allow(clippy::too_many_arguments)]
    fn fold(
        &mut self,
        lane_key: &str,
        kind: LoopbackKind,
        template: EventDoc,
        latest_note: &str,
        delta: u64,
        now: Duration,
        wall: SystemTime,
    ) -> String {
        let key = flood_key(lane_key);
        let lane = self.lanes.get(lane_key).expect("a folded aggregate's lane");
        let note = flood_note(kind, lane, self.cfg.flood_after, latest_note);
        if !self.tracked.contains_key(&key) {
            self.lanes
                .get_mut(lane_key)
                .expect("looked up above")
                .members += 1;
            let doc = EventDoc {
                name: event_name(&self.node, &key, kind),
                series: None,
                ..template
            };
            self.tracked.insert(
                key.clone(),
                Tracked {
                    doc,
                    lane: lane_key.to_string(),
                    severity: severity(kind),
                    folded: false,
                    created: false,
                    last_write: None,
                    written_count: 0,
                    count: 0,
                    base: 0,
                    last_seen: now,
                },
            );
        }
        let t = self.tracked.get_mut(&key).expect("inserted above");
        t.count += delta;
        t.last_seen = now;
        t.doc.note = note;
        t.doc.series = (t.count >= 2).then_some(Series {
            count: t.count,
            last_observed: wall,
        });
        key
    }

    /// Pending writes whose window has passed, fairest first (module doc), as far as the
    /// bucket allows.
    pub fn due(&mut self, now: Duration) -> Vec<Write> {
        let mut out = Vec::new();
        // Held resolutions first: they are few, and the oldest news.
        while let Some(w) = self.take_held_resolved(now) {
            out.push(w);
        }
        while let Some(key) = self.fairest(now) {
            match self.try_write(&key, now) {
                Ok(w) => out.push(w),
                Err(_) => break,
            }
        }
        out
    }

    /// The pending aggregate whose window is open that the next token goes to: the lane
    /// written least recently, the most severe kind, the newest aggregate.
    fn fairest(&self, now: Duration) -> Option<String> {
        self.tracked
            .iter()
            .filter(|(_, t)| t.dirty() && self.window_open(t, now))
            .min_by_key(|&(key, t)| {
                (
                    self.lanes.get(&t.lane).and_then(|l| l.last_write),
                    t.severity,
                    std::cmp::Reverse(t.last_seen),
                    key,
                )
            })
            .map(|(key, _)| key.clone())
    }

    /// Aggregates waiting for a write (throttled or rate limited).
    pub fn pending(&self) -> usize {
        self.tracked.values().filter(|t| t.dirty()).count()
    }

    fn window_open(&self, t: &Tracked, now: Duration) -> bool {
        t.last_write
            .is_none_or(|w| now.saturating_sub(w) >= self.cfg.per_aggregate)
    }

    fn try_write(&mut self, key: &str, now: Duration) -> Result<Write, Held> {
        let Some(t) = self.tracked.get(key) else {
            return Err(Held::Unchanged);
        };
        if !t.dirty() {
            return Err(Held::Unchanged);
        }
        if !self.window_open(t, now) {
            return Err(Held::Throttled);
        }
        if !self.take_token(now) {
            return Err(Held::RateLimited);
        }
        let t = self.tracked.get_mut(key).expect("looked up above");
        t.last_write = Some(now);
        t.written_count = t.count;
        if let Some(lane) = self.lanes.get_mut(&t.lane) {
            lane.last_write = Some(now);
        }
        let write = if t.created {
            Write::Patch(t.doc.clone())
        } else {
            t.created = true;
            Write::Create(t.doc.clone())
        };
        Ok(write)
    }

    fn take_token(&mut self, now: Duration) -> bool {
        let every = self.cfg.refill_every.max(Duration::from_millis(1));
        match self.refilled_at {
            None => self.refilled_at = Some(now),
            Some(at) => {
                let gained = now.saturating_sub(at).as_nanos() / every.as_nanos();
                if gained > 0 {
                    let gained = u32::try_from(gained).unwrap_or(u32::MAX);
                    self.tokens = self.tokens.saturating_add(gained).min(self.cfg.burst);
                    self.refilled_at = Some(at + every * gained.min(1 << 20));
                }
            }
        }
        if self.tokens == self.cfg.burst {
            // A full bucket does not bank time.
            self.refilled_at = Some(now);
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// Forgets `key`, and its lane with the lane's last entry.
    fn untrack(&mut self, key: &str) -> Option<Tracked> {
        let t = self.tracked.remove(key)?;
        if let Some(lane) = self.lanes.get_mut(&t.lane) {
            lane.members = lane.members.saturating_sub(1);
            if lane.members == 0 {
                self.lanes.remove(&t.lane);
            }
        }
        Some(t)
    }

    fn evict(&mut self) {
        while self.tracked.len() > self.cfg.max_tracked {
            let Some(oldest) = self
                .tracked
                .iter()
                .min_by_key(|(_, t)| t.last_seen)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            self.untrack(&oldest);
        }
    }
}

/// How many `LoopbackResolved` Events wait for the bucket at most.
const MAX_HELD_RESOLVED: usize = 64;

#[cfg(test)]
#[path = "kube_event_plan_tests.rs"]
mod tests;
