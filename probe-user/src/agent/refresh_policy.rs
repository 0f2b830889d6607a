//! The service-table refresher's decisions ([`super::services`] says why each rule is as it
//! is): when a read starts and whether it is whole, when a table is made from the API, when the
//! safety net and a failed read's retry come, and when a start that waits for the API's lists
//! gives up on them. Pure, with the times given: the refresher's loop turns its channels and
//! timers into [`Signal`]s, asks [`RefreshPolicy::next`] what to do, and does it.

use std::time::{Duration, Instant};

/// How long a signal waits for the rest of its burst of commits.
pub const SETTLE: Duration = Duration::from_millis(200);
/// The least time between the starts of two reads.
pub const MIN_GAP: Duration = Duration::from_secs(1);
/// Reads start at least this many times their own duration apart (but at most [`MAX_GAP`]):
/// a full read of a large table (a dump of 100,000 rules takes a second) under a
/// writer that changes the rules every second then costs about 1/20 = 5% of a core, paid in
/// freshness. A change after a quiet spell is read after [`SETTLE`].
pub const READ_DUTY: u32 = 20;
/// The longest a change waits behind the previous read: freshness wins over the duty bound
/// when one read takes more than 1.5 s (10,000 Services: 5 s reads, 30 s apart, ~17% of a
/// core under continuous churn, against 100% for the old 5 s timer).
pub const MAX_GAP: Duration = Duration::from_secs(30);
/// A failed read is retried after this (or on the next signal).
pub const RETRY: Duration = Duration::from_secs(5);
/// How long a start that read only the dataplane's part waits for the API's lists before it
/// reads the rules whole (API access refused, an API server that never answers).
pub const API_WAIT: Duration = Duration::from_secs(15);

/// The least time between two tables made from the API (a relist or a rollout applies many
/// objects at once).
pub const API_EVERY: Duration = Duration::from_millis(200);
/// Tables from the API are made at least this many times their own making's duration apart:
/// at 30,000 Services one takes ~130 ms (60,000 entries), so under continuous API churn
/// (endpoints move every second on a large cluster) the agent spends at most ~1/10 of a core
/// on them, and a change waits at most ~1.3 s (the freshness target is 2 s).
pub const API_DUTY: u32 = 10;

/// When to read next, from the signals seen. Pure: the times are given.
///
/// Two kinds of read are paced apart: a whole read (every dump parsed again: the first, the
/// safety net, a full restore) and a small one (only the chains a commit named). Each kind
/// starts at least [`READ_DUTY`] times its own last duration after the last read of that
/// kind (whole: at most [`MAX_GAP`]), and every read at least [`MIN_GAP`] after the last one:
/// each kind then costs at most ~5% of a core, and the 1.6 s dump kube-proxy's full restore
/// forced does not hold the next Service's 0.1 s read back by 30 s.
#[derive(Debug, Default)]
pub struct Pacer {
    /// When the first unanswered signal came.
    pending_since: Option<Instant>,
    last_start: Option<Instant>,
    last_whole_start: Option<Instant>,
    last_small_start: Option<Instant>,
    /// How long the last read of each kind took.
    whole_took: Duration,
    small_took: Duration,
}

impl Pacer {
    /// Something may have changed.
    pub fn signal(&mut self, now: Instant) {
        self.pending_since.get_or_insert(now);
    }

    /// When the pending read is due (None: nothing pending); `whole`: it will be a whole read.
    pub fn due(&self, whole: bool) -> Option<Instant> {
        let since = self.pending_since?;
        let Some(last) = self.last_start else {
            return Some(since);
        };
        let (kind_start, took) = if whole {
            (self.last_whole_start, self.whole_took)
        } else {
            (self.last_small_start, self.small_took)
        };
        let mut due = (since + SETTLE).max(last + MIN_GAP);
        if let Some(kind_start) = kind_start {
            due = due.max(kind_start + (took * READ_DUTY).min(MAX_GAP));
        }
        Some(due)
    }

    /// A read starts: every signal so far is answered by it.
    pub fn started(&mut self, now: Instant, whole: bool) {
        self.pending_since = None;
        self.last_start = Some(now);
        if whole {
            self.last_whole_start = Some(now);
        } else {
            self.last_small_start = Some(now);
        }
    }

    /// The read that started last took `took`.
    pub fn finished(&mut self, took: Duration, whole: bool) {
        if whole {
            self.whole_took = took;
        } else {
            self.small_took = took;
        }
    }
}

/// When the polled IPVS change test (a dump of every virtual service: IPVS's generic-netlink
/// family has no notifications) may run again: at least [`READ_DUTY`] times its own last
/// duration after the last one started, and at most [`MAX_GAP`] (issue #52: at 10,000 Services
/// under the VM tier's emulation a dump each second was half a core with nothing changing).
/// With the API's table on, the test is not run at all (the refresher's `polls_ipvs`). Pure.
#[derive(Debug, Default)]
pub struct DigestPacer {
    last_start: Option<Instant>,
    took: Duration,
}

impl DigestPacer {
    /// Whether the test may run at `now` (the poll tick adds its own least gap).
    pub fn due(&self, now: Instant) -> bool {
        self.last_start
            .is_none_or(|last| now >= last + (self.took * READ_DUTY).min(MAX_GAP))
    }

    /// The test started at `started` and took `took`.
    pub fn ran(&mut self, started: Instant, took: Duration) {
        self.last_start = Some(started);
        self.took = took;
    }
}

/// What the refresher saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// An nf_tables commit, or a polled change test that changed: something may have changed.
    Changed,
    /// The API's table changed.
    ApiChanged,
    /// The wait [`Action::Wait`] named is over: the safety net's time may have come.
    Woke,
    /// The read [`Action::Read`] started is over.
    ReadDone {
        took: Duration,
        whole: bool,
        /// False: it failed, and the last good table stays.
        ok: bool,
    },
    /// The table [`Action::MakeFromApi`] asked for is made (or found unchanged).
    MadeFromApi { started: Instant, took: Duration },
}

/// What the refresher knows for [`RefreshPolicy::next`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    /// The API's lists are complete, the rules said kube-proxy's mode and a table was read:
    /// the table can be the API's.
    pub api_ready: bool,
    /// The next read is whole whatever was signalled: the first read, no commit subscription,
    /// or commits that touched more than their chains can say.
    pub touched_whole: bool,
    /// The last table read has no Services (a start that read the dataplane's part only).
    pub no_services: bool,
}

/// What the refresher does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The table is the API's from now on (and one is made next).
    ApiOn,
    /// Make a table from the API; then [`Signal::MadeFromApi`].
    MakeFromApi,
    /// Read the dataplane; then [`Signal::ReadDone`]. `whole`: the kind it is paced as;
    /// `everything`: every chain, whatever the commits named.
    Read { whole: bool, everything: bool },
    /// The API's lists are not complete after [`API_WAIT`]: the rules are read whole meanwhile
    /// (a read is pending).
    ApiLate,
    /// Nothing before `until` or the next signal.
    Wait { until: Instant },
}

/// The refresher's timers and what they wait for.
#[derive(Debug)]
pub struct RefreshPolicy {
    pacer: Pacer,
    /// `--services-every`: the safety net's interval.
    every: Duration,
    /// When the safety net (or a failed read's retry) reads whole.
    safety: Instant,
    /// What no commit message says (the first read, the safety net, a failed read, a signal
    /// from the polled tests) is read whole.
    read_whole: bool,
    /// The table is the API's (see the services module's docs).
    api_on: bool,
    /// The API's table changed since the last one made from it.
    api_dirty: bool,
    /// The next table from the API is made no sooner.
    api_next: Instant,
    /// A facts-first start: the whole rules are read if the API's lists are not complete by
    /// then.
    whole_unless_api: Option<Instant>,
}

impl RefreshPolicy {
    /// At the refresher's start, the first read pending; `api`: the agent has API access.
    pub fn new(now: Instant, every: Duration, api: bool) -> RefreshPolicy {
        let mut pacer = Pacer::default();
        pacer.signal(now);
        RefreshPolicy {
            pacer,
            every,
            safety: now + every,
            read_whole: true,
            api_on: false,
            api_dirty: false,
            api_next: now,
            whole_unless_api: api.then(|| now + API_WAIT),
        }
    }

    /// Whether the table is the API's.
    pub fn api_on(&self) -> bool {
        self.api_on
    }

    pub fn step(&mut self, signal: Signal, now: Instant) {
        match signal {
            Signal::Changed => self.pacer.signal(now),
            Signal::ApiChanged => self.api_dirty = true,
            Signal::Woke => {
                if now >= self.safety {
                    self.pacer.signal(now);
                    self.read_whole = true;
                    self.safety = now + self.every;
                }
            }
            Signal::ReadDone { took, whole, ok } => {
                self.pacer.finished(took, whole);
                if ok {
                    self.safety = now + self.every;
                } else {
                    self.safety = now + RETRY;
                    self.read_whole = true;
                }
            }
            Signal::MadeFromApi { started, took } => {
                self.api_next = started + API_EVERY.max(took * API_DUTY);
            }
        }
    }

    /// What to do now. Asked again after each action but [`Action::Wait`].
    pub fn next(&mut self, seen: Seen, now: Instant) -> Action {
        if !self.api_on && seen.api_ready {
            self.api_on = true;
            self.api_dirty = true;
            return Action::ApiOn;
        }
        if self.api_dirty && self.api_on && now >= self.api_next {
            self.api_dirty = false;
            return Action::MakeFromApi;
        }
        let whole = self.read_whole || seen.touched_whole;
        let due = self.pacer.due(whole);
        if due.is_some_and(|due| due <= now) {
            self.pacer.started(now, whole);
            let everything = std::mem::take(&mut self.read_whole);
            return Action::Read { whole, everything };
        }
        let mut until = due.map_or(self.safety, |due| due.min(self.safety));
        if self.api_dirty && self.api_on {
            until = until.min(self.api_next);
        }
        if self.api_on {
            self.whole_unless_api = None;
        }
        if let Some(at) = self.whole_unless_api {
            if now >= at {
                self.whole_unless_api = None;
                if seen.no_services {
                    self.read_whole = true;
                    self.pacer.signal(now);
                    return Action::ApiLate;
                }
            } else {
                until = until.min(at);
            }
        }
        Action::Wait { until }
    }
}

#[cfg(test)]
#[path = "refresh_policy_tests.rs"]
mod tests;
