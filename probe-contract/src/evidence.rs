//! The agent's evidence of its confirmed loops (`GET /evidence`, `GET /evidence/{id}`,
//! `GET /evidence/{id}/capture.pcapng`), as `kubectl clb-probe evidence` reads it.
//!
//! Per confirmed loop (one aggregate, [`crate::LoopbackEvent::key`]) the agent keeps the first
//! packets the kernel recorded for it, with their first bytes (`probe agent --capture-bytes`),
//! and serves them as pcapng beside this JSON.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{LoopbackEvent, LoopbackKind, Proto};

/// The request header that carries the evidence token (issue #49, H9): `GET /evidence` hands
/// out every loop's client pods, namespaces and first packets, so the agent serves it only to
/// a request carrying the token of the Secret [`TOKEN_SECRET`] (key [`TOKEN_KEY`]) in its own
/// namespace. The API server's pod proxy forwards this header (it strips only the caller's own
/// credentials), so whoever may `get` that Secret, and nobody else, may read the evidence:
/// the API's authorization, by possession.
pub const TOKEN_HEADER: &str = "x-clb-probe-evidence-token";
/// The Secret holding the evidence token, in the agent's namespace (the chart mounts it,
/// optional: no Secret, no `/evidence`).
pub const TOKEN_SECRET: &str = "clb-probe-evidence";
/// The Secret's key.
pub const TOKEN_KEY: &str = "token";
/// A token file or Secret value longer than this is refused (a token is 32-64 bytes).
pub const TOKEN_MAX_BYTES: usize = 4096;

/// Packets kept per loop: the first ones (a loop repeats the same packet; the first show how
/// it started).
pub const PACKETS_PER_LOOP: usize = 16;
/// Loops kept; the oldest confirmed is forgotten first.
pub const MAX_LOOPS: usize = 256;

/// `GET /evidence`: the loops with evidence, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceIndex {
    /// This node's name (`--node-name`), when known.
    #[serde(default)]
    pub node: Option<String>,
    /// `headers` (payload bytes zeroed) or `full`.
    pub mode: String,
    pub loops: Vec<LoopSummary>,
}

/// One loop in the index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopSummary {
    /// The id of `GET /evidence/{id}`: 16 hex digits of the loop's key.
    pub id: String,
    /// The aggregate key ([`crate::LoopbackEvent::key`]).
    pub key: String,
    pub kind: LoopbackKind,
    /// `namespace/name`, when the loop named one.
    #[serde(default)]
    pub service: Option<String>,
    /// Confirmations of the loop so far.
    pub count: u64,
    /// Packets kept (at most [`PACKETS_PER_LOOP`]).
    pub packets: usize,
}

/// Which hook saw a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// tc/tcx NIC ingress (`clb_ingress`): a suspect.
    TcIngress,
    /// tc/tcx NIC egress (`clb_egress`): a SYN with a VIP as source.
    TcEgress,
    /// The `kfree_skb` tracepoint (`clb_kfree_skb`): a drop.
    KfreeSkb,
}

impl Hook {
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::TcIngress => "tc_ingress",
            Hook::TcEgress => "tc_egress",
            Hook::KfreeSkb => "kfree_skb",
        }
    }
}

/// One kept packet, as the pcapng's packet of the same index shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketSummary {
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    pub hook: Hook,
    /// The interface it arrived on or left through, when known.
    #[serde(default)]
    pub iface: Option<String>,
    /// The kernel's drop reason name, for a drop.
    #[serde(default)]
    pub drop_reason: Option<String>,
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
    pub proto: Proto,
    /// Bytes in the capture (from the IP header on).
    pub captured: usize,
}

/// `GET /evidence/{id}`: one loop's bundle; the packets themselves are at `capture`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceBundle {
    pub id: String,
    #[serde(default)]
    pub node: Option<String>,
    /// The path of this loop's pcapng on the same port.
    pub capture: String,
    /// The loop's latest confirmation (its evidence lines, remedy, facts and fixes).
    pub event: LoopbackEvent,
    pub packets: Vec<PacketSummary>,
    /// The conntrack entries the proof read (the evidence lines that cite conntrack).
    pub conntrack: Vec<String>,
    /// The rules the evidence cites (iptables, nftables, IPVS lines).
    pub rules: Vec<String>,
    /// `probe check`'s risks for the loop's Service (from the node report's check pass; empty
    /// when the node report is off or none names it).
    pub check: Vec<crate::report::RiskStatus>,
}
