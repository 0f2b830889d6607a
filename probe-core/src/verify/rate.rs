//! How many verify requests a node tests (hostile round 4, issue #49): at most
//! `MAX_TESTS_PER_MINUTE` a minute in all, and at most `MAX_TESTS_PER_REQUESTER_PER_MINUTE` of
//! them from one requester, so one requester cannot take the node's whole minute. Pure: the
//! caller passes the time.
//!
//! The requester is the request's `verify.clb-probe.io/requester` annotation, which the plugin
//! sets to the user the API server authenticated (a SelfSubjectReview). It is trustworthy only
//! where the chart's ValidatingAdmissionPolicy is installed (it refuses a request whose
//! annotation is not its creator's user name); without it a requester may name anyone, and
//! only the node's limit holds (SECURITY.md).

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use probe_contract::verify::{MAX_TESTS_PER_MINUTE, MAX_TESTS_PER_REQUESTER_PER_MINUTE};

const MINUTE: Duration = Duration::from_secs(60);
/// Requesters remembered at most (each a few instants): past it the quietest are forgotten.
const MAX_REQUESTERS: usize = 1024;

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Node,
    Requester,
}

impl Limit {
    /// The metric's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Node => "node",
            Limit::Requester => "requester",
        }
    }

    /// The refusal's message.
    pub fn message(self, requester: &str) -> String {
        match self {
            Limit::Node => format!(
                "rate limited: this node tests at most {MAX_TESTS_PER_MINUTE} requests a minute; ask again later"
            ),
            Limit::Requester => format!(
                "rate limited: this node tests at most {MAX_TESTS_PER_REQUESTER_PER_MINUTE} requests a minute from one requester ({}); ask again later",
                if requester.is_empty() {
                    "unnamed"
                } else {
                    requester
                }
            ),
        }
    }
}

/// The tests taken in the last minute, in all and per requester.
#[derive(Debug, Default)]
pub struct RateLimits {
    node: VecDeque<Instant>,
    requesters: HashMap<String, VecDeque<Instant>>,
}

impl RateLimits {
    /// Takes a test for `requester` at `now`, or says which limit refuses it (a refused
    /// request takes nothing).
    pub fn admit(&mut self, requester: &str, now: Instant) -> Result<(), Limit> {
        let recent = |q: &mut VecDeque<Instant>| {
            while q.front().is_some_and(|t| now.duration_since(*t) >= MINUTE) {
                q.pop_front();
            }
        };
        recent(&mut self.node);
        if self.node.len() >= MAX_TESTS_PER_MINUTE {
            return Err(Limit::Node);
        }
        if !self.requesters.contains_key(requester) && self.requesters.len() >= MAX_REQUESTERS {
            self.requesters.retain(|_, q| {
                recent(q);
                !q.is_empty()
            });
            if self.requesters.len() >= MAX_REQUESTERS {
                // Every remembered requester tested within the minute: so did the node, past
                // its own limit long ago; refused as the node's.
                return Err(Limit::Node);
            }
        }
        let mine = self.requesters.entry(requester.to_owned()).or_default();
        recent(mine);
        if mine.len() >= MAX_TESTS_PER_REQUESTER_PER_MINUTE {
            return Err(Limit::Requester);
        }
        mine.push_back(now);
        self.node.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_requester_takes_part_of_the_minute_and_the_node_all_of_it() {
        let mut r = RateLimits::default();
        let t0 = Instant::now();
        for _ in 0..MAX_TESTS_PER_REQUESTER_PER_MINUTE {
            assert_eq!(r.admit("mallory", t0), Ok(()));
        }
        assert_eq!(r.admit("mallory", t0), Err(Limit::Requester));
        // Others still get the rest of the node's minute.
        let left = MAX_TESTS_PER_MINUTE - MAX_TESTS_PER_REQUESTER_PER_MINUTE;
        for i in 0..left {
            assert_eq!(r.admit(&format!("user-{i}"), t0), Ok(()));
        }
        assert_eq!(r.admit("alice", t0), Err(Limit::Node));
        // A minute later, all again.
        let later = t0 + MINUTE;
        assert_eq!(r.admit("mallory", later), Ok(()));
        assert_eq!(r.admit("alice", later), Ok(()));
    }

    #[test]
    fn refusals_take_nothing_and_many_requesters_stay_bounded() {
        let mut r = RateLimits::default();
        let t0 = Instant::now();
        for i in 0..5000 {
            let _ = r.admit(&format!("r{i}"), t0 + Duration::from_secs(61 * i));
        }
        assert!(r.requesters.len() <= MAX_REQUESTERS);
        let mut r = RateLimits::default();
        for _ in 0..100 {
            let _ = r.admit("mallory", t0);
        }
        assert_eq!(r.node.len(), MAX_TESTS_PER_REQUESTER_PER_MINUTE);
    }

    #[test]
    fn the_messages_name_the_limit_and_the_requester() {
        assert!(Limit::Requester.message("").contains("unnamed"));
        assert!(Limit::Requester.message("bob").contains("(bob)"));
        assert!(
            Limit::Node
                .message("bob")
                .contains("this node tests at most")
        );
    }
}
