//! The record stream (`probe agent --record FILE`, one [`KernelEvent`] a line): what the
//! kernel reported, in userspace types.
//!
//! The agent's `kernel::reader` turns ring-buffer records (`probe_common::PacketEvent`) into
//! these; the correlator consumes only these (never the raw records), so it can be tested on
//! recorded streams from any kernel, and `correlate::replay` reads a recording back.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{Proto, Tag};

/// TCP flag bits as carried in `Packet::tcp_flags`.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;
}

/// The packet a kernel event is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub proto: Proto,
    /// TCP flags byte (see [`tcp_flags`]); 0 for other protocols.
    pub tcp_flags: u8,
    pub src_tag: Option<Tag>,
    pub dst_tag: Option<Tag>,
}

/// A kernel drop reason: the running kernel's number and its name from the kernel's BTF
/// (`enum skb_drop_reason`), without the `SKB_DROP_REASON_` prefix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DropReason {
    pub code: u32,
    pub name: String,
}

impl DropReason {
    /// The name of a drop on a kernel whose `kfree_skb` passes no reason (< 5.17): only the
    /// drop site tells what happened there.
    pub const UNREPORTED: &'static str = "UNREPORTED";

    /// Whether the kernel gave a reason at all.
    pub fn is_reported(&self) -> bool {
        self.name != Self::UNREPORTED
    }
}

/// An event out of the kernel. `ts_ns` is CLOCK_MONOTONIC (the kernel's `bpf_ktime_get_ns`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KernelEvent {
    /// A packet with one of the node's own addresses as source arrived on a NIC.
    Suspect {
        ts_ns: u64,
        /// Interface name (the NIC it arrived on).
        nic: String,
        packet: Packet,
    },
    /// The kernel dropped a suspect packet, or a packet addressed to a bound VIP.
    Drop {
        ts_ns: u64,
        /// Interface the packet arrived on (`skb_iif`), when known.
        iface: Option<String>,
        packet: Packet,
        reason: DropReason,
        /// Drop site as `symbol+0xoff` from /proc/kallsyms, when resolvable.
        location: Option<String>,
        /// The drop happened in another network namespace than the agent's: a pod's own (the
        /// kernel reports only self-addressed local pod packets from there; `iface` is then
        /// absent, that namespace's interface numbers name nothing here).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        foreign_netns: bool,
    },
    /// A TCP SYN left a NIC with a bound VIP as its source (appended: older recordings stay
    /// readable).
    VipEgress {
        ts_ns: u64,
        /// Interface name (the NIC it left through).
        nic: String,
        packet: Packet,
    },
}

impl KernelEvent {
    pub fn ts_ns(&self) -> u64 {
        match self {
            KernelEvent::Suspect { ts_ns, .. }
            | KernelEvent::Drop { ts_ns, .. }
            | KernelEvent::VipEgress { ts_ns, .. } => *ts_ns,
        }
    }

    pub fn packet(&self) -> &Packet {
        match self {
            KernelEvent::Suspect { packet, .. }
            | KernelEvent::Drop { packet, .. }
            | KernelEvent::VipEgress { packet, .. } => packet,
        }
    }
}

/// What the reader passes on for one ring-buffer record: the event, and the first bytes of
/// its packet from the network header on (IPv4 or IPv6 header first) when the kernel copied
/// them (`probe agent --capture-bytes`, on by default); empty when it did not. The bytes go
/// to the evidence capture only (`GET /evidence`), never into the record stream or events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRecord {
    pub event: KernelEvent,
    pub packet_bytes: Vec<u8>,
}

/// A pod's connection opener that left the node without SNAT (from the `EGRESS_FLOWS` map).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRecord {
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
    pub proto: Proto,
    /// CLOCK_MONOTONIC ns when the flow's first opener left (a SYN retransmit or the next
    /// UDP datagram does not move it).
    pub ts_ns: u64,
    /// When the latest opener of the same flow left (absent: only the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ns: Option<u64>,
    pub nic: String,
}

impl EgressRecord {
    /// The latest opener of this flow that left no later than `t` (`None`: the flow started
    /// after `t`). A flow still sending after `t` was sending at `t`.
    pub fn latest_by(&self, t: u64) -> Option<u64> {
        (self.ts_ns <= t).then(|| self.last_ns.unwrap_or(self.ts_ns).clamp(self.ts_ns, t))
    }
}

#[cfg(test)]
mod tests {
    use super::Proto;

    #[test]
    fn protocol_numbers_round_trip() {
        for (raw, ipv6) in [(6, false), (17, true), (1, false), (58, true), (132, false)] {
            assert_eq!(Proto::from_raw(raw).to_raw(ipv6), raw);
        }
    }
}
