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

use crate::correlate::{LoopbackEvent, LoopbackKind};

use probe_contract::LoopResolution;
pub use probe_contract::kube_event::{
    ACTION, REPORTING_CONTROLLER, RESOLVED_ACTION, RESOLVED_REASON, kind_of_reason, reason,
};
/// The API server's limit on `note` (bytes).
pub const NOTE_MAX: usize = 1024;

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

/// A Kubernetes object an Event points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    pub kind: &'static str,
    /// Empty for cluster-scoped objects (Node).
    pub namespace: String,
    pub name: String,
    /// `metadata.uid`, when the API told it.
    pub uid: Option<String>,
}

impl ObjectRef {
    /// `namespace/name` (or the service table's `namespace/name:port`, whose port is not
    /// part of the object's name); `None` when it is not in that form.
    pub fn namespaced(kind: &'static str, ns_name: &str) -> Option<Self> {
        let (ns, name) = ns_name.split_once('/')?;
        let name = name.split(':').next().unwrap_or(name);
        (!ns.is_empty() && !name.is_empty()).then(|| Self {
            kind,
            namespace: ns.to_string(),
            name: name.to_string(),
            uid: None,
        })
    }
}

/// What attribution knows about a confirmed event (all optional: without API access or for
/// an address no Pod/Service owns, the Event regards the Node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    /// `namespace/name` of the Service.
    pub service: Option<String>,
    /// The Service's `metadata.uid` from the API.
    pub service_uid: Option<String>,
    /// `namespace/name` of the client Pod (hairpin).
    pub client_pod: Option<String>,
}

impl Names {
    /// What attribution put on `event`: the API's Service (with its uid) first, else the
    /// service table's name.
    pub fn of(event: &LoopbackEvent) -> Names {
        let api = event.facts.service.as_ref();
        Names {
            service: api.map(|s| s.key()).or_else(|| event.service.clone()),
            service_uid: api.and_then(|s| s.uid.clone()),
            client_pod: event.client_pod.clone(),
        }
    }
}

/// One Event as it should be after the write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventDoc {
    pub namespace: String,
    pub name: String,
    /// `Warning` for a loop, `Normal` for its resolution.
    pub event_type: &'static str,
    /// [`ACTION`] or [`RESOLVED_ACTION`].
    pub action: &'static str,
    pub reason: &'static str,
    pub note: String,
    pub regarding: ObjectRef,
    pub related: Option<ObjectRef>,
    /// `reportingInstance`: the node.
    pub instance: String,
    /// `eventTime`: the first time this agent wrote the Event.
    pub event_time: SystemTime,
    /// `series`: present once the aggregate repeated (count >= 2).
    pub series: Option<Series>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Series {
    pub count: u64,
    pub last_observed: SystemTime,
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

/// `clb-probe.<node>.<kind>.<16 hex of FNV-1a(key)>`: a valid object name (DNS subdomain),
/// the same for the same aggregate on the same node across restarts.
pub fn event_name(node: &str, key: &str, kind: LoopbackKind) -> String {
    let hash = fnv1a(key.as_bytes());
    let kind = kind.as_str().replace('_', "-");
    let mut node: String = node
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    // 253 bytes at most: a node name that long is shortened to its own hash.
    if node.len() + kind.len() + 16 + 12 > 253 {
        node = format!("{:016x}", fnv1a(node.as_bytes()));
    }
    let node = node.trim_matches(|c| c == '.' || c == '-');
    if node.is_empty() {
        format!("clb-probe.{kind}.{hash:016x}")
    } else {
        format!("clb-probe.{node}.{kind}.{hash:016x}")
    }
}

/// How many `LoopbackResolved` Events wait for the bucket at most.
const MAX_HELD_RESOLVED: usize = 64;

/// The `LoopbackResolved` Event of a resolution: regarding what the loop's Warning regarded
/// (else its Service, else the Node), named after the key and the episode. Pure.
pub fn resolved_doc(
    r: &LoopResolution,
    warning: Option<&EventDoc>,
    node: &str,
    wall: SystemTime,
) -> EventDoc {
    let regarding = warning
        .map(|w| w.regarding.clone())
        .or_else(|| {
            r.service
                .as_deref()
                .and_then(|s| ObjectRef::namespaced("Service", s))
        })
        .unwrap_or_else(|| ObjectRef {
            kind: "Node",
            namespace: String::new(),
            name: node.to_string(),
            uid: None,
        });
    let namespace = if regarding.namespace.is_empty() {
        "default".to_string()
    } else {
        regarding.namespace.clone()
    };
    EventDoc {
        namespace,
        name: event_name(node, &format!("{}#resolved{}", r.key, r.episode), r.kind),
        event_type: "Normal",
        action: RESOLVED_ACTION,
        reason: RESOLVED_REASON,
        note: resolved_note(r),
        regarding,
        related: warning.and_then(|w| w.related.clone()),
        instance: node.to_string(),
        event_time: wall,
        series: None,
    }
}

/// What stopped, for how long it had lasted, the proof, and what changed; cut to
/// [`NOTE_MAX`] bytes.
pub fn resolved_note(r: &LoopResolution) -> String {
    let at = match (r.vip, r.vip_port) {
        (Some(ip), Some(port)) => format!(" at {}", sock(ip, port)),
        (Some(ip), None) => format!(" at {ip}"),
        _ => String::new(),
    };
    let changed = if r.changed.is_empty() {
        " No change to the Service was seen (the fix may be elsewhere: the node, the LB, the clients).".to_string()
    } else {
        format!(" Changed since first seen: {}.", r.changed.join("; "))
    };
    truncate(
        format!(
            "Resolved: {}{at} is no longer confirmed; it lasted {} s (confirmed {} time{}, first {}, last {}). Proof: {}.{changed}",
            r.kind.as_str(),
            r.lasted_s,
            r.count,
            if r.count == 1 { "" } else { "s" },
            r.first_seen,
            r.last_seen,
            r.proof.first().map(String::as_str).unwrap_or("-"),
        ),
        NOTE_MAX,
    )
}

/// FNV-1a, 64 bit: stable across builds and Rust versions (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The cause in one sentence and the first remedy, cut to [`NOTE_MAX`] bytes.
pub fn note(event: &LoopbackEvent) -> String {
    let vip = event
        .vip
        .map(|v| match event.vip_port {
            Some(p) => sock(v, p),
            None => v.to_string(),
        })
        .unwrap_or_else(|| "the LB VIP".to_string());
    let proto = event.proto.as_str();
    let dst = sock(event.dst, event.dst_port);
    let port = service_port(event)
        .map(|p| format!(" Service port: {p}."))
        .unwrap_or_default();
    let cause = match event.kind {
        LoopbackKind::HealthcheckBlackhole => format!(
            "The load balancer's health checks from {vip} to {dst}/{proto} are dropped: the VIP is bound on this node, so the kernel drops them as a local source."
        ),
        LoopbackKind::Hairpin => format!(
            "Pod {} called the load balancer at {vip}/{proto} without SNAT; the LB sent it back to this node ({dst}) and the reply cannot reach the pod.",
            event.src
        ),
        LoopbackKind::VipPortUnserved => format!(
            "{vip}/{proto} is bound on this node but nothing serves that port: calls from {} are refused locally instead of reaching the load balancer.",
            event.src
        ),
        LoopbackKind::VipAsSource => format!(
            "A packet with the LB VIP {} as its source left this node for {dst}/{proto} without SNAT: a host-network call to the LB IP, forwarded to another node.",
            event.src
        ),
        LoopbackKind::ServiceSelfLoop => format!(
            "Pod {} called its own Service at {vip}/{proto} and was picked as the endpoint; without the hairpin SNAT the call came back with its own address as source and was dropped.",
            event.src
        ),
    };
    // The first (best-fitting) fix when there is one: the exact change, and the command that
    // applies it when it is a patch of the named Service.
    let text = match (event.fixes.first(), event.remedy.first()) {
        (Some(fix), _) => match (
            &fix.patch,
            fix.service.as_deref().and_then(|s| s.split_once('/')),
        ) {
            (Some(_), Some((ns, name))) => format!(
                "{cause}{port} Fix: kubectl clb-probe fix -n {ns} {name} --apply {} ({}).",
                fix.id, fix.change
            ),
            _ => format!("{cause}{port} Fix: {}.", fix.short()),
        },
        (None, Some(remedy)) => format!("{cause}{port} Remedy: {remedy}"),
        (None, None) => format!("{cause}{port}"),
    };
    truncate(text, NOTE_MAX)
}

/// The Service port the event went through, `http (80/TCP)`: from the API, else the port
/// name of the service table's `namespace/name:port`.
fn service_port(event: &LoopbackEvent) -> Option<String> {
    let proto = event.proto.as_str().to_ascii_uppercase();
    if let Some(s) = &event.facts.service {
        return match (&s.port_name, s.port) {
            (Some(name), Some(port)) => Some(format!("{name} ({port}/{proto})")),
            (None, Some(port)) => Some(format!("{port}/{proto}")),
            (Some(name), None) => Some(name.clone()),
            (None, None) => None,
        };
    }
    let label = event.service.as_deref()?;
    let (_, port) = label.split_once(':')?;
    Some(match event.vip_port {
        Some(p) => format!("{port} ({p}/{proto})"),
        None => port.to_string(),
    })
}

/// Cut to at most `max` bytes at a char boundary, ending in `…` when cut.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let ellipsis = '…';
    let mut end = max - ellipsis.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push(ellipsis);
    text
}

/// `ip:port`, with brackets for IPv6.
fn sock(ip: std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// The Event for a report, without its write state.
pub fn event_doc(event: &LoopbackEvent, names: &Names, node: &str, wall: SystemTime) -> EventDoc {
    let service = names
        .service
        .as_deref()
        .and_then(|s| ObjectRef::namespaced("Service", s))
        .map(|r| ObjectRef {
            uid: names.service_uid.clone(),
            ..r
        })
        .or_else(|| {
            event
                .service
                .as_deref()
                .and_then(|s| ObjectRef::namespaced("Service", s))
        });
    let regarding = service.unwrap_or_else(|| ObjectRef {
        kind: "Node",
        namespace: String::new(),
        name: node.to_string(),
        uid: None,
    });
    let related = match event.kind {
        LoopbackKind::Hairpin | LoopbackKind::ServiceSelfLoop => names
            .client_pod
            .as_deref()
            .and_then(|p| ObjectRef::namespaced("Pod", p)),
        _ => None,
    };
    let namespace = if regarding.namespace.is_empty() {
        "default".to_string()
    } else {
        regarding.namespace.clone()
    };
    EventDoc {
        namespace,
        name: event_name(node, &event.key, event.kind),
        event_type: "Warning",
        action: ACTION,
        reason: reason(event.kind),
        note: note(event),
        regarding,
        related,
        instance: node.to_string(),
        event_time: wall,
        series: (event.count >= 2).then_some(Series {
            count: event.count,
            last_observed: wall,
        }),
    }
}

#[cfg(test)]
#[path = "kube_event_plan_tests.rs"]
mod tests;
