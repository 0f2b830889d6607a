//! A confirmed loop's life on one node, as the agent tracks it (`probe-user`'s `resolution`):
//! *active* while it recurs; *quiet* when it has stopped recurring but nothing proves the
//! traffic that triggered it still flows; *resolved* when it has not recurred for the agent's
//! `--resolve-after` window while that traffic was seen answered ([`LoopResolution::proof`]).
//! A resolved loop that recurs is active again and counted as a regression.

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::event::LoopbackKind;

/// One resolution: the loop, how long it lasted, the proof, what changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopResolution {
    /// The loop: `kind/namespace/name`, or `kind/vip:port` when no Service is named.
    pub key: String,
    pub kind: LoopbackKind,
    /// `namespace/name` when the loop named one.
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub vip: Option<IpAddr>,
    #[serde(default)]
    pub vip_port: Option<u16>,
    /// RFC 3339, the agent's wall clock.
    pub first_seen: String,
    pub last_seen: String,
    pub resolved_at: String,
    /// From the first to the last confirmation of this episode, in seconds.
    pub lasted_s: u64,
    /// Reports of this episode's aggregates (first confirmations and repeats).
    pub count: u64,
    /// 0 for the loop's first episode; n after n regressions.
    #[serde(default)]
    pub episode: u32,
    /// The aggregates ([`crate::LoopbackEvent::key`]: one per client and flow shape) confirmed
    /// in this episode (at most 64).
    #[serde(default)]
    pub aggregates: Vec<String>,
    /// Why it is called resolved: the quiet window, and the answered connections of the loop's
    /// shape whose latest packet came after its last confirmation.
    pub proof: Vec<String>,
    /// The Service's fields that differ since the loop was first seen (`field: before ->
    /// after`), when the agent reads the API; empty when nothing changed or it does not.
    #[serde(default)]
    pub changed: Vec<String>,
}

/// The node's loops by state and kind, and the latest resolutions (bounded, newest last).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoopLifecycle {
    /// Loops confirmed within the window (or since then unproven but recurring), by kind.
    pub active: BTreeMap<String, u64>,
    /// Loops past the window without proof that their traffic still flows, by kind.
    pub quiet: BTreeMap<String, u64>,
    /// Resolutions since the agent started, by kind.
    pub resolutions: BTreeMap<String, u64>,
    /// Loops confirmed again after their resolution, by kind.
    pub regressions: BTreeMap<String, u64>,
    pub resolved: Vec<LoopResolution>,
}
