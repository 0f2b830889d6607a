//! The report's write rate limit (pure, injected clock in milliseconds): at most one write per
//! [`MIN_INTERVAL_MS`] (10 s) per node; states offered in between are coalesced into one
//! pending state, the newest (the queue is that one slot: bounded by construction). A failed
//! write puts its state back only when nothing newer was offered meanwhile, so a retry never
//! overwrites a newer state with an older one.

/// One write per node per 10 s.
pub const MIN_INTERVAL_MS: u64 = 10_000;

#[derive(Debug)]
pub struct Gate<T> {
    every_ms: u64,
    last_write_ms: Option<u64>,
    pending: Option<T>,
    /// States replaced by a newer one before they were written.
    pub coalesced: u64,
}

impl<T> Default for Gate<T> {
    fn default() -> Self {
        Gate::new(MIN_INTERVAL_MS)
    }
}

impl<T> Gate<T> {
    pub fn new(every_ms: u64) -> Self {
        Gate {
            every_ms,
            last_write_ms: None,
            pending: None,
            coalesced: 0,
        }
    }

    /// A new state to write; replaces (coalesces) one not written yet.
    pub fn offer(&mut self, state: T) {
        if self.pending.replace(state).is_some() {
            self.coalesced += 1;
        }
    }

    /// The state to write now, if one is pending and the interval since the last write (or
    /// attempt: a failing API is not hammered either) has passed.
    pub fn take(&mut self, now_ms: u64) -> Option<T> {
        self.pending.as_ref()?;
        if let Some(last) = self.last_write_ms
            && now_ms < last.saturating_add(self.every_ms)
        {
            return None;
        }
        self.last_write_ms = Some(now_ms);
        self.pending.take()
    }

    /// A write of `state` failed: pending again unless a newer state was offered since.
    pub fn failed(&mut self, state: T) {
        if self.pending.is_none() {
            self.pending = Some(state);
        }
    }

    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }
}

/// A failing write's exponential backoff (E7, pure, injected clock in milliseconds): after
/// the `n`th failure in a row the next attempt waits `first_ms * 2^(n-1)`, capped at
/// `max_ms` (the writer's heartbeat: a broken RBAC costs the API one request per heartbeat,
/// not one per rate-limit interval). A success starts over.
#[derive(Debug)]
pub struct Backoff {
    first_ms: u64,
    max_ms: u64,
    failures: u32,
    not_before_ms: u64,
}

impl Backoff {
    pub fn new(first_ms: u64, max_ms: u64) -> Self {
        Backoff {
            first_ms,
            max_ms,
            failures: 0,
            not_before_ms: 0,
        }
    }

    /// Whether an attempt may go out at `now_ms`.
    pub fn ready(&self, now_ms: u64) -> bool {
        now_ms >= self.not_before_ms
    }

    /// An attempt at `now_ms` failed; returns the wait before the next one.
    pub fn failed(&mut self, now_ms: u64) -> u64 {
        self.failures = self.failures.saturating_add(1);
        let shift = (self.failures - 1).min(32);
        let wait = self.first_ms.saturating_mul(1u64 << shift).min(self.max_ms);
        self.not_before_ms = now_ms.saturating_add(wait);
        wait
    }

    /// An attempt succeeded: the next failure waits `first_ms` again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before_ms = 0;
    }

    /// Failures in a row (0: working).
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_starts_over_after_a_success() {
        let mut b = Backoff::new(10_000, 300_000);
        assert!(b.ready(0));
        let waits: Vec<u64> = (0..7).map(|_| b.failed(0)).collect();
        assert_eq!(
            waits,
            [10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000]
        );
        assert!(!b.ready(299_999));
        assert!(b.ready(300_000));
        b.succeeded();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.failed(1_000), 10_000);
        for _ in 0..100 {
            b.failed(0);
        }
        assert!(b.ready(300_000), "capped, never overflows");
    }

    #[test]
    fn one_write_per_interval_newest_state_wins() {
        let mut g = Gate::new(10_000);
        assert_eq!(g.take(0), None, "nothing offered");
        g.offer(1);
        assert_eq!(g.take(0), Some(1), "the first write goes at once");
        g.offer(2);
        g.offer(3);
        g.offer(4);
        assert_eq!(g.coalesced, 2);
        assert_eq!(g.take(9_999), None, "inside the interval");
        assert_eq!(g.take(10_000), Some(4), "coalesced: only the newest");
        assert_eq!(g.take(20_000), None, "nothing new");
        // Quiet for a while: the next change goes out at once.
        g.offer(5);
        assert_eq!(g.take(60_000), Some(5));
    }

    #[test]
    fn a_failed_write_retries_after_the_interval_unless_superseded() {
        let mut g = Gate::new(10_000);
        g.offer("a");
        let s = g.take(0).unwrap();
        g.failed(s);
        assert!(g.is_pending());
        assert_eq!(g.take(5_000), None, "a failing API is not hammered");
        let s = g.take(10_000).unwrap();
        assert_eq!(s, "a");
        g.offer("b");
        g.failed(s);
        assert_eq!(
            g.take(20_000),
            Some("b"),
            "the older state never overwrites the newer"
        );
        assert_eq!(g.take(40_000), None);
    }

    #[test]
    fn writes_in_an_hour_of_constant_change_stay_at_the_limit() {
        let mut g = Gate::new(10_000);
        let mut writes = 0;
        for t in (0..3_600_000u64).step_by(100) {
            g.offer(t);
            if g.take(t).is_some() {
                writes += 1;
            }
        }
        assert_eq!(writes, 360);
    }
}
