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

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use crate::correlate::LoopbackEvent;

use probe_contract::LoopResolution;

pub use super::kube_event_doc::{
    EventDoc, NOTE_MAX, Names, ObjectRef, Series, event_doc, event_name, note, resolved_doc,
    resolved_note, truncate,
};
pub use probe_contract::kube_event::{
    ACTION, REPORTING_CONTROLLER, RESOLVED_ACTION, RESOLVED_REASON, kind_of_reason, reason,
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
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            per_aggregate: Duration::from_secs(60),
            burst: 10,
            refill_every: Duration::from_secs(6),
            max_tracked: 4096,
        }
    }
}

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
    /// The Event exists (a create was handed out).
    created: bool,
    last_write: Option<Duration>,
    /// The count last handed out in a write.
    written_count: u64,
    /// Observed count (the aggregate's `count` less `base`).
    count: u64,
    /// The aggregate's count before this episode's first confirmation (0 in the first).
    base: u64,
    last_seen: Duration,
}

impl Tracked {
    fn dirty(&self) -> bool {
        !self.created || self.count != self.written_count
    }
}

/// The planner. `now` is a monotonic time since any fixed origin; `wall` the matching wall
/// clock, for the Event's timestamps.
#[derive(Debug)]
pub struct EventPlanner {
    cfg: PlanConfig,
    node: String,
    tracked: HashMap<String, Tracked>,
    tokens: u32,
    /// When the bucket last gained (or was found full).
    refilled_at: Option<Duration>,
    /// Resolutions per aggregate key: the episode its next Warning opens.
    episodes: HashMap<String, u32>,
    /// `LoopbackResolved` Events the bucket held back (bounded; the oldest goes first).
    held_resolved: std::collections::VecDeque<EventDoc>,
}

impl EventPlanner {
    pub fn new(cfg: PlanConfig, node: &str) -> Self {
        Self {
            tokens: cfg.burst,
            cfg,
            node: node.to_string(),
            tracked: HashMap::new(),
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
            if let Some(t) = self.tracked.remove(key) {
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

    /// A report of a confirmed aggregate (new or repeat): the write to do now, or why not.
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
        let entry = self.tracked.entry(event.key.clone());
        let t = match entry {
            std::collections::hash_map::Entry::Occupied(o) => {
                let t = o.into_mut();
                // Keep the first eventTime; the rest follows the latest report.
                let event_time = t.doc.event_time;
                t.doc = EventDoc { event_time, ..doc };
                t
            }
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Tracked {
                doc,
                created: false,
                last_write: None,
                written_count: 0,
                count: 0,
                base: if episode > 0 {
                    event.count.saturating_sub(1)
                } else {
                    0
                },
                last_seen: now,
            }),
        };
        t.count = t.count.max(event.count.saturating_sub(t.base));
        t.last_seen = now;
        t.doc.series = (t.count >= 2).then_some(Series {
            count: t.count,
            last_observed: wall,
        });
        let key = event.key.clone();
        self.evict();
        self.try_write(&key, now)
    }

    /// Pending writes whose window has passed, oldest first, as far as the bucket allows.
    pub fn due(&mut self, now: Duration) -> Vec<Write> {
        let mut out = Vec::new();
        // Held resolutions first: they are few, and the oldest news.
        while let Some(w) = self.take_held_resolved(now) {
            out.push(w);
        }
        let mut pending: Vec<(Duration, String)> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.dirty() && self.window_open(t, now))
            .map(|(k, t)| (t.last_write.unwrap_or(t.last_seen), k.clone()))
            .collect();
        pending.sort();
        for (_, key) in pending {
            match self.try_write(&key, now) {
                Ok(w) => out.push(w),
                Err(Held::RateLimited) => break,
                Err(_) => {}
            }
        }
        out
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
            self.tracked.remove(&oldest);
        }
    }
}

/// How many `LoopbackResolved` Events wait for the bucket at most.
const MAX_HELD_RESOLVED: usize = 64;

#[cfg(test)]
#[path = "kube_event_plan_tests.rs"]
mod tests;
