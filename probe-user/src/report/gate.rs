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

#[cfg(test)]
mod tests {
    use super::*;

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
