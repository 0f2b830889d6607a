//! The agent's own test connections (verify on demand, the canary: `agent::verify`): their
//! counters for `/metrics`, and the canary's connections in flight, so a confirmation the canary
//! caused is marked (`facts.canary`) before any writer sees it and is never counted as users'
//! traffic.

use std::{
    net::SocketAddr,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use probe_contract::{
    LoopbackEvent,
    verify::{Phase, VerifyOutcome},
};

/// How long a canary connection's flow is remembered after it was opened: the looping copy
/// comes back through the LB within its connect timeout, and the correlator confirms within
/// its hold (`kube::hold`, 2 s) after.
const FLOW_MEMORY_NS: u64 = 10_000_000_000;

/// The canary's flows kept at most (a round has a few targets, a few connections each).
const MAX_FLOWS: usize = 256;

#[derive(Debug, Default)]
pub struct TestTraffic {
    /// The canary's tests by outcome, in [`VerifyOutcome::ALL`]'s order.
    canary: [AtomicU64; 4],
    /// Requests answered, by phase: done, refused.
    verify: [AtomicU64; 2],
    /// Requests refused by a rate limit: the node's, a requester's.
    rate_limited: [AtomicU64; 2],
    /// (local, remote, opened at CLOCK_MONOTONIC ns) of the canary's connections.
    canary_flows: Mutex<Vec<(SocketAddr, SocketAddr, u64)>>,
}

fn outcome_slot(o: VerifyOutcome) -> usize {
    VerifyOutcome::ALL
        .iter()
        .position(|a| *a == o)
        .unwrap_or_default()
}

impl TestTraffic {
    pub fn count_canary(&self, outcome: VerifyOutcome) {
        self.canary[outcome_slot(outcome)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_request(&self, phase: Phase) {
        let slot = usize::from(phase != Phase::Done);
        self.verify[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// `clbprobe_canary_tests_total{outcome}`.
    pub fn canary_counts(&self) -> Vec<(String, u64)> {
        VerifyOutcome::ALL
            .into_iter()
            .map(|o| {
                let n = self.canary[outcome_slot(o)].load(Ordering::Relaxed);
                (o.as_str().to_owned(), n)
            })
            .collect()
    }

    pub fn count_rate_limited(&self, limit: crate::verify::rate::Limit) {
        self.rate_limited[limit as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `clbprobe_verify_rate_limited_total{limit}`.
    pub fn rate_limited_counts(&self) -> Vec<(String, u64)> {
        use crate::verify::rate::Limit;
        [Limit::Node, Limit::Requester]
            .into_iter()
            .map(|l| {
                (
                    l.as_str().to_owned(),
                    self.rate_limited[l as usize].load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// `clbprobe_verify_requests_total{phase}`.
    pub fn request_counts(&self) -> Vec<(String, u64)> {
        [(Phase::Done, 0), (Phase::Refused, 1)]
            .into_iter()
            .map(|(p, slot)| {
                (
                    p.as_str().to_owned(),
                    self.verify[slot].load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// A canary connection just opened from `local` to `remote`.
    pub fn note_canary_flow(&self, local: SocketAddr, remote: SocketAddr, now_ns: u64) {
        if let Ok(mut flows) = self.canary_flows.lock() {
            flows.retain(|(_, _, at)| now_ns.saturating_sub(*at) < FLOW_MEMORY_NS);
            if flows.len() >= MAX_FLOWS {
                flows.remove(0);
            }
            flows.push((local, remote, now_ns));
        }
    }

    /// Whether `e` is a loop of a canary connection: its source port is one the canary
    /// opened to the address the event names as called (the VIP, else the destination).
    /// Layer 4 loops keep the source port; a layer 7 LB's new connection is not matched (it
    /// is then counted as users' traffic, said in docs/agent.md).
    pub fn is_canary(&self, e: &LoopbackEvent) -> bool {
        let Ok(flows) = self.canary_flows.lock() else {
            return false;
        };
        flows.iter().any(|(local, remote, _)| {
            local.port() == e.src_port && (e.vip == Some(remote.ip()) || e.dst == remote.ip())
        })
    }
}
