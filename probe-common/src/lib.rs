//! Types shared by clb-probe's eBPF programs and its userspace agent.
//!
//! Every struct here crosses the kernel/user boundary through a map or the ring buffer, so each
//! is `#[repr(C)]`, has explicit padding (no implicit holes, no `bool`, no `Option`), and its layout
//! (size, alignment, every field's offset) is pinned by compile-time assertions that hold on
//! bpfel, x86_64 and aarch64 alike: a change on one side that the other does not see fails the
//! build instead of corrupting events.
#![no_std]

use core::mem::size_of;

/// What the node's address sets say an address is. Stored as the LPM tries' value.
pub mod tag {
    /// Not in any set (never stored; the lookup missed).
    pub const NONE: u8 = 0;
    /// An address of any interface of the node (NIC, bridges, veth ends).
    pub const NODE: u8 = 1;
    /// An address bound on the VIP interface (kube-ipvs0): a ClusterIP or an LB VIP.
    pub const VIP: u8 = 2;
    /// A local pod: a route to a non-NIC device (veth /32, a bridge subnet), or `--pod-cidr`.
    pub const POD: u8 = 3;
    /// Number of tags, for array sizing.
    pub const COUNT: usize = 4;
}

/// Kinds of records on the ring buffer.
pub mod kind {
    /// NIC ingress packet whose source is one of the node's own (node, vip or pod).
    pub const SUSPECT: u8 = 1;
    /// `kfree_skb` of a suspect packet, or of a packet addressed to a bound VIP.
    pub const DROP: u8 = 2;
    /// NIC egress TCP SYN whose source is a bound VIP (`vip_as_source`, sending side).
    pub const VIP_EGRESS: u8 = 3;
}

/// The IPv4 prefilter in front of the host hash and the prefix trie: a bitmap (an array map
/// of [`prefilter::WORDS`] u64 words, which the verifier inlines into plain loads) that says
/// "certainly not local" for nearly every ordinary packet, so it pays no hash or trie
/// look-up. Bits are a superset: a set bit only means "look it up".
///
/// Three regions: host addresses (/32) by hash; two bits per /16 network ([`prefilter::net16`]:
/// nothing local in it, a prefix longer than /16 inside it, or covered by a /16 or shorter
/// prefix); and, for the /16s of the second kind, their /24s by hash. Other nodes' pods in the
/// local pod CIDR's /16 (10.244.2.x beside 10.244.1.0/24) are then answered by three loads
/// instead of a trie walk.
///
/// `raw` is the address's four bytes as they lie in the packet, read as a little-endian u32
/// (what a BPF program on bpfel loads; `u32::from_le_bytes(octets)` in userspace).
pub mod prefilter {
    /// u64 words in the map: 2^16 host bits, 2^17 /16 bits (two each), 2^16 /24 bits.
    pub const WORDS: u32 = 4096;
    /// Bits 0..HOST_BITS: host addresses by hash.
    pub const HOST_BITS: u32 = 65536;
    /// Word of the first /16 pair: 32 /16s per word, two bits each.
    pub const NET16_WORD: u32 = HOST_BITS / 64;
    /// First bit of the /24 region.
    pub const NET24_FIRST: u32 = HOST_BITS * 3;
    /// Bits of the /24 region.
    pub const NET24_BITS: u32 = 65536;
    /// Fibonacci hashing multiplier (2^32 / golden ratio).
    const K: u32 = 0x9E37_79B1;

    /// What a /16 network's two bits say.
    pub mod net16 {
        /// No prefix shorter than /32 overlaps it.
        pub const NONE: u64 = 0;
        /// Only prefixes longer than /16 lie in it: ask the /24 bit.
        pub const PARTIAL: u64 = 1;
        /// A /16 or shorter prefix covers it: look it up (bit 1; PARTIAL may be set as well).
        pub const COVERED: u64 = 2;
    }

    /// The bit of host address `raw`.
    #[inline(always)]
    pub fn host_bit(raw: u32) -> u32 {
        raw.wrapping_mul(K) >> 16
    }

    /// The /16 network of `raw` (its first two octets, as a number: 10.244 is 0x0af4).
    #[inline(always)]
    pub fn net16(raw: u32) -> u32 {
        ((raw & 0xff) << 8) | ((raw >> 8) & 0xff)
    }

    /// The word holding the two bits of `net16`, and their shift in it.
    #[inline(always)]
    pub fn net16_slot(net16: u32) -> (u32, u32) {
        (NET16_WORD + (net16 >> 5), (net16 & 31) * 2)
    }

    /// The bit of the /24 network holding `raw` (its first three octets), by hash.
    #[inline(always)]
    pub fn net24_bit(raw: u32) -> u32 {
        NET24_FIRST + ((raw & 0x00ff_ffff).wrapping_mul(K) >> 16)
    }

    // The regions fill the map exactly.
    const _: () = assert!(NET24_FIRST + NET24_BITS == WORDS * 64);
    const _: () = assert!(NET16_WORD * 64 + 65536 * 2 == NET24_FIRST);

    #[cfg(test)]
    mod tests {
        use super::*;

        fn raw(o: [u8; 4]) -> u32 {
            u32::from_le_bytes(o)
        }

        #[test]
        fn each_address_maps_into_its_own_region() {
            // A spread of addresses, every octet value in every position.
            for i in 0..=255u32 {
                for o in [
                    [i as u8, 0, 0, 0],
                    [1, i as u8, 255, 3],
                    [10, 244, i as u8, 9],
                ] {
                    let a = raw(o);
                    assert!(host_bit(a) < HOST_BITS);
                    let (word, shift) = net16_slot(net16(a));
                    assert!((NET16_WORD..NET24_FIRST / 64).contains(&word) && shift < 64);
                    assert_eq!(shift % 2, 0);
                    assert!((NET24_FIRST..WORDS * 64).contains(&net24_bit(a)));
                }
            }
        }

        #[test]
        fn networks_are_the_leading_octets() {
            assert_eq!(net16(raw([10, 244, 1, 7])), 0x0af4);
            assert_eq!(net16(raw([255, 1, 0, 0])), 0xff01);
            // Every address of a /24 shares its bit; the /16's pair is shared by its /24s.
            let bit = net24_bit(raw([10, 244, 1, 0]));
            assert!((0..=255).all(|d| net24_bit(raw([10, 244, 1, d])) == bit));
            assert_ne!(net24_bit(raw([10, 244, 2, 0])), bit);
            assert_eq!(
                net16_slot(net16(raw([10, 244, 1, 0]))),
                net16_slot(net16(raw([10, 244, 200, 9])))
            );
            // Adjacent /16s: neighbouring pairs of one word.
            let (w0, s0) = net16_slot(0x0af4);
            let (w1, s1) = net16_slot(0x0af5);
            assert_eq!((w0, s0 + 2), (w1, s1));
        }
    }
}

/// Indices of the per-CPU `STATS` array.
pub mod stat {
    /// Events not sent because their class's per-CPU per-second budget was spent (all
    /// classes; by class from [`BUDGET_SUPPRESSED_BY_CLASS`]).
    pub const BUDGET_SUPPRESSED: u32 = 0;
    /// Events not sent because the ring buffer was full.
    pub const RINGBUF_FULL: u32 = 1;
    /// Events not sent because the same flow was reported within the dedup window.
    pub const DEDUP_SUPPRESSED: u32 = 2;
    /// Events written to the ring buffer.
    pub const EMITTED: u32 = 3;
    /// Egress openers recorded in `EGRESS_FLOWS` (un-SNATed pod flows, node TCP openers to
    /// non-local addresses).
    pub const EGRESS_RECORDED: u32 = 4;
    /// Drops seen on the `kfree_skb` tracepoint that matched (suspect source, VIP destination,
    /// a watched destination, or an outside packet to one of the LB's probe ports).
    pub const DROPS_MATCHED: u32 = 5;
    /// Records that woke the reader at once: confirming records (drops) while the reader had
    /// caught up, within the per-CPU wake-up budget (`ProbeConfig::wakeups_per_sec`).
    pub const WAKEUPS: u32 = 6;
    /// Confirming records submitted without a wake-up because the per-CPU wake-up budget was
    /// spent: the reader's backstop timer or the batch threshold picks them up.
    pub const WAKEUP_BUDGET_SUPPRESSED: u32 = 7;
    /// First of [`crate::budget::CLASSES`] slots: events not sent because the budget of their
    /// class was spent, at `BUDGET_SUPPRESSED_BY_CLASS + budget::class(kind, src_tag)`.
    pub const BUDGET_SUPPRESSED_BY_CLASS: u32 = 8;
    /// Number of slots.
    pub const COUNT: u32 = BUDGET_SUPPRESSED_BY_CLASS + crate::budget::CLASSES as u32;
}

#[cfg(test)]
mod budget_tests {
    use super::{budget, kind, stat, tag};

    #[test]
    fn every_kind_and_source_has_its_own_class_within_the_slots() {
        let mut seen = [false; budget::CLASSES];
        for k in [kind::SUSPECT, kind::DROP, kind::VIP_EGRESS] {
            for t in [tag::NONE, tag::NODE, tag::VIP, tag::POD] {
                let c = budget::class(k, t);
                assert!(c < budget::CLASSES && !seen[c], "class {c} of ({k}, {t})");
                seen[c] = true;
            }
        }
        assert!(stat::BUDGET_SUPPRESSED_BY_CLASS + budget::CLASSES as u32 <= stat::COUNT);
    }
}

#[cfg(test)]
mod probe_ports_tests {
    use super::probe_ports;

    #[test]
    fn every_port_has_one_bit_within_the_words() {
        assert_eq!(probe_ports::slot(0), (0, 1));
        assert_eq!(probe_ports::slot(10256), (160, 1 << 16));
        assert_eq!(
            probe_ports::slot(u16::MAX),
            (probe_ports::WORDS - 1, 1 << 63)
        );
    }
}

/// Address family, as stored in records (not the kernel's AF_* numbers, to keep them one byte).
pub mod family {
    pub const V4: u8 = 4;
    pub const V6: u8 = 6;
}

/// The value of the address LPM tries (`LOCAL_V4`, `LOCAL_V6`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddrValue {
    /// One of [`tag`].
    pub tag: u8,
    pub _pad: [u8; 3],
}

/// Key of the per-CPU suspect counters: exact counts by interface, source tag and protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SuspectKey {
    pub ifindex: u32,
    /// One of [`tag`].
    pub tag: u8,
    /// IP protocol number (6 TCP, 17 UDP, 1 ICMP, ...).
    pub proto: u8,
    pub _pad: [u8; 2],
}

/// Key of the per-CPU drop counters: drops of matched packets by kernel reason and match.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropKey {
    /// The kernel's `enum skb_drop_reason` value (numbers differ between kernels).
    pub reason: u32,
    /// Source tag of the dropped packet, or [`tag::NONE`] when only its destination matched.
    pub src_tag: u8,
    /// Destination tag of the dropped packet.
    pub dst_tag: u8,
    pub _pad: [u8; 2],
}

/// Key of the LRU map of egress openers seen on NIC egress: un-SNATed pod flows (TCP SYNs and
/// UDP) and the node's own TCP SYNs to non-local addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EgressKey {
    /// Source address (a pod, or the node); IPv4 in the first 4 bytes, rest zero.
    pub addr: [u8; 16],
    /// Source port, host byte order.
    pub port: u16,
    pub proto: u8,
    /// One of [`family`].
    pub family: u8,
}

/// Value of the egress LRU map: where the pod went, and when (CLOCK_MONOTONIC ns).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressValue {
    pub daddr: [u8; 16],
    /// Destination port, host byte order.
    pub dport: u16,
    pub _pad: [u8; 2],
    pub ifindex: u32,
    /// The flow's first opener (kept across SYN retransmits and further UDP datagrams).
    pub ts_ns: u64,
    /// The latest opener of the same flow.
    pub last_ns: u64,
}

/// Key of the per-source index of `EGRESS_FLOWS` (`EGRESS_SOURCES`): a source address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EgressSourceKey {
    /// IPv4 in the first 4 bytes, rest zero.
    pub addr: [u8; 16],
    /// One of [`family`].
    pub family: u8,
    pub _pad: [u8; 3],
}

/// `PROBE_PORTS`: the TCP ports the LB's own node probes use (kube-proxy's healthz :10256 and
/// the healthCheckNodePorts the agent knows), one bit per port in an array map of [`WORDS`]
/// u64 words. The drop program reads one word, and only for the drop of an outside packet to a
/// node address (`lb_probe_refused`): never on the TC path.
pub mod probe_ports {
    /// u64 words: 65,536 ports, one bit each.
    pub const WORDS: u32 = 1024;

    /// The word holding `port`'s bit, and the bit's mask in it.
    #[inline(always)]
    pub fn slot(port: u16) -> (u32, u64) {
        (u32::from(port >> 6), 1u64 << (port & 63))
    }
}

/// Key of `DROP_DESTINATIONS`: a destination address that is not local but whose drops the
/// drop program reports (kube-proxy's nftables `no-endpoint-services` drop elements).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropDestinationKey {
    /// IPv4 in the first 4 bytes, rest zero.
    pub addr: [u8; 16],
    /// One of [`family`].
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Flows remembered per source in `EGRESS_SOURCES` (a power of two: the slot is masked).
pub const EGRESS_SOURCE_SLOTS: usize = 16;

/// Value of `EGRESS_SOURCES`: the latest [`EGRESS_SOURCE_SLOTS`] `EGRESS_FLOWS` keys recorded
/// for one source, as a ring. A slot is `port << 8 | proto` (0 = empty: proto is never 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressSourceFlows {
    /// Records written so far; the next one goes to slot `next % EGRESS_SOURCE_SLOTS`.
    pub next: u32,
    pub flows: [u32; EGRESS_SOURCE_SLOTS],
}

impl EgressSourceFlows {
    /// The slot of a flow: source port and protocol.
    pub const fn slot(port: u16, proto: u8) -> u32 {
        ((port as u32) << 8) | proto as u32
    }
}

/// An `EGRESS_FLOWS` entry idle this long is a new flow when its tuple opens again (the
/// source port reused for the same destination): its first time starts over.
pub const EGRESS_IDLE_NS: u64 = 30_000_000_000;

/// A flow as deduplicated in the kernel: the event kind plus the 5-tuple.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    /// One of [`kind`].
    pub kind: u8,
    pub _pad: u8,
}

/// The event budget's classes: each (record kind, source tag) pair has a budget of its own.
///
/// One budget shared first come first served let a flood of one class starve the records
/// that confirm another: a burst of suspects the node forwards (a hairpin storm, spoofed pod
/// sources) spent the second before a health check's records later in it, and a single
/// health check sends no second chance. Per kind alone is not enough: a NodePort health
/// check's drop carries kube-proxy's DNAT target, and only its VIP-source suspect says which
/// NodePort it was sent to, so pod-source suspects must not spend the VIP-source ones' share
/// either (nor pod-source rp_filter drops the VIP-source drops' share). The price is a higher
/// ceiling: up to 8 x `events_per_sec` records per CPU per second when eight classes flood at
/// once (suspects: node, vip, pod; drops: node, vip, pod, other; VIP egress: vip).
pub mod budget {
    /// Number of class slots: `kind` (1..=3) by source tag (0..=3); slots 0..=3 are unused.
    pub const CLASSES: usize = 16;

    /// The class of a record: its kind and its source's tag (masked: always in bounds).
    #[inline(always)]
    pub const fn class(kind: u8, src_tag: u8) -> usize {
        (((kind & 3) as usize) << 2) | (src_tag & 3) as usize
    }
}

/// Per-CPU event budget: in each one-second window on each CPU, at most
/// `ProbeConfig::events_per_sec` records of each class ([`budget::class`]), and at most
/// `wakeups_per_sec` immediate reader wake-ups.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub window_start_ns: u64,
    /// Records sent in the window, by [`budget::class`].
    pub used: [u32; budget::CLASSES],
    pub wakeups: u32,
    pub _pad: u32,
}

/// One ring-buffer record. Fixed size; alignment 8 (the ring buffer allows at most 8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketEvent {
    /// CLOCK_MONOTONIC ns (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Drop site (kernel text address) for [`kind::DROP`]; 0 otherwise.
    pub location: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Interface the packet was seen on (tc) or arrived on (`skb_iif`, drops).
    pub ifindex: u32,
    /// `enum skb_drop_reason` value for drops; 0 otherwise.
    pub reason: u32,
    /// Inode number of the network namespace of the drop; 0 when unknown.
    pub netns: u32,
    /// Host byte order.
    pub sport: u16,
    /// Host byte order.
    pub dport: u16,
    /// One of [`kind`].
    pub kind: u8,
    /// Tag of the source address.
    pub src_tag: u8,
    /// Tag of the destination address.
    pub dst_tag: u8,
    pub proto: u8,
    /// One of [`family`].
    pub family: u8,
    /// TCP flags byte (FIN=0x01 SYN=0x02 RST=0x04 PSH=0x08 ACK=0x10), 0 for other protocols.
    pub tcp_flags: u8,
    pub _pad: [u8; 2],
}

/// Most bytes of a packet a record carries (from its network header on): the IP header, the
/// TCP or UDP header and a few bytes of payload, enough to show the looping packet in a
/// capture. The agent's `--capture-bytes` (0 = none) sets how many within it.
pub const CAPTURE_MAX: usize = 128;

/// A record with the first bytes of its packet: a [`PacketEvent`] followed by up to
/// [`CAPTURE_MAX`] bytes from the network header. Written instead of a bare [`PacketEvent`]
/// when `ProbeConfig::capture_bytes` is not 0; the reader tells the two apart by length.
/// Only records (anomalies) carry it: ordinary packets are never copied.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapturedPacketEvent {
    pub event: PacketEvent,
    /// Bytes of `data` holding the packet (0: it could not be read); the rest is stale.
    pub cap_len: u16,
    pub _pad: [u8; 6],
    pub data: [u8; CAPTURE_MAX],
}

/// Offsets into kernel structs, read from the running kernel's BTF by the agent and passed to
/// the `kfree_skb` program as a global: aya-ebpf has no CO-RE field relocations, and these
/// offsets differ between kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub skb_head: u32,
    pub skb_network_header: u32,
    pub skb_dev: u32,
    pub skb_iif: u32,
    pub dev_nd_net: u32,
    pub net_ns_inum: u32,
    /// 1 when the offsets above were filled in; the drop program does nothing otherwise.
    pub valid: u32,
    /// `sk_buff.tail`: the end of the linear data, as an offset from `head` (64-bit kernels'
    /// `sk_buff_data_t`), so a drop's capture never reads past the packet.
    pub skb_tail: u32,
    /// `sk_buff.sk`: the sending socket, whose namespace a packet has before it has a device
    /// (this host's own packet dropped at the output hook; `skb->dev` is set in `ip_output`).
    pub skb_sk: u32,
    /// `sock.__sk_common.skc_net.net`: a socket's network namespace (request and timewait
    /// sockets share `sock_common`, so the same offset holds for them).
    pub sk_net: u32,
}

/// Tunables passed to the programs as globals at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// A flow already reported is not reported again within this many ns.
    pub dedup_ns: u64,
    /// Records per second per CPU of each budget class (see [`budget`]) before the budget
    /// suppresses that class.
    pub events_per_sec: u64,
    /// Ring buffer fill (bytes) past which a submit wakes the reader; below it the reader polls.
    pub wakeup_bytes: u64,
    /// Immediate reader wake-ups per second per CPU for confirming records (drops): each costs
    /// an inter-processor interrupt on the dropping CPU, so a flood cannot buy one per record.
    pub wakeups_per_sec: u64,
    /// Inode of the agent's network namespace; drops in other namespaces are ignored. 0 = all.
    pub netns_ino: u32,
    /// `SKB_CONSUMED`'s value on this kernel (not a drop), or u32::MAX when the kernel has none.
    pub reason_consumed: u32,
    /// Bytes of each recorded packet copied into its record, from the network header on (at
    /// most [`CAPTURE_MAX`]; 0 = no copy, plain [`PacketEvent`] records).
    pub capture_bytes: u32,
    pub _pad: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            dedup_ns: 1_000_000_000,
            events_per_sec: 256,
            // 64 records of the default, captured size (a bare record is 72 bytes: with
            // `capture_bytes` 0 a batch is larger, the wake-ups fewer).
            wakeup_bytes: 64 * size_of::<CapturedPacketEvent>() as u64,
            wakeups_per_sec: 100,
            netns_ino: 0,
            reason_consumed: u32::MAX,
            capture_bytes: CAPTURE_MAX as u32,
            _pad: 0,
        }
    }
}

/// Pins a record's layout: size, alignment and every field's offset. The layout is the contract
/// between the two halves, and this crate is compiled for each target that holds one (the eBPF
/// programs for bpfel, the agent for x86_64 and aarch64): a layout that differs on any of them
/// (an implicit hole, a `u64` aligned differently) fails that target's build, not a map update.
macro_rules! pin_layout {
    ($t:ty, size $size:literal, align $align:literal, { $($field:ident: $offset:literal),* $(,)? }) => {
        const _: () = assert!(size_of::<$t>() == $size);
        const _: () = assert!(core::mem::align_of::<$t>() == $align);
        $(const _: () = assert!(core::mem::offset_of!($t, $field) == $offset);)*
    };
}

pin_layout!(AddrValue, size 4, align 1, { tag: 0, _pad: 1 });
pin_layout!(SuspectKey, size 8, align 4, { ifindex: 0, tag: 4, proto: 5, _pad: 6 });
pin_layout!(DropKey, size 8, align 4, { reason: 0, src_tag: 4, dst_tag: 5, _pad: 6 });
pin_layout!(EgressKey, size 20, align 2, { addr: 0, port: 16, proto: 18, family: 19 });
pin_layout!(EgressValue, size 40, align 8, {
    daddr: 0, dport: 16, _pad: 18, ifindex: 20, ts_ns: 24, last_ns: 32,
});
pin_layout!(EgressSourceKey, size 20, align 1, { addr: 0, family: 16, _pad: 17 });
pin_layout!(DropDestinationKey, size 20, align 1, { addr: 0, family: 16, _pad: 17 });
pin_layout!(EgressSourceFlows, size 68, align 4, { next: 0, flows: 4 });
pin_layout!(FlowKey, size 40, align 2, {
    saddr: 0, daddr: 16, sport: 32, dport: 34, proto: 36, family: 37, kind: 38, _pad: 39,
});
pin_layout!(Budget, size 80, align 8, { window_start_ns: 0, used: 8, wakeups: 72, _pad: 76 });
// The ring buffer allows an alignment of at most 8.
pin_layout!(PacketEvent, size 72, align 8, {
    ts_ns: 0, location: 8, saddr: 16, daddr: 32, ifindex: 48, reason: 52, netns: 56, sport: 60,
    dport: 62, kind: 64, src_tag: 65, dst_tag: 66, proto: 67, family: 68, tcp_flags: 69, _pad: 70,
});
pin_layout!(KernelOffsets, size 40, align 4, {
    skb_head: 0, skb_network_header: 4, skb_dev: 8, skb_iif: 12, dev_nd_net: 16,
    net_ns_inum: 20, valid: 24, skb_tail: 28, skb_sk: 32, sk_net: 36,
});
pin_layout!(CapturedPacketEvent, size 208, align 8, { event: 0, cap_len: 72, _pad: 74, data: 80 });
pin_layout!(ProbeConfig, size 48, align 8, {
    dedup_ns: 0, events_per_sec: 8, wakeup_bytes: 16, wakeups_per_sec: 24, netns_ino: 32,
    reason_consumed: 36, capture_bytes: 40, _pad: 44,
});

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are repr(C), Copy, have explicit padding and no invalid bit patterns.
    unsafe impl aya::Pod for AddrValue {}
    unsafe impl aya::Pod for SuspectKey {}
    unsafe impl aya::Pod for DropKey {}
    unsafe impl aya::Pod for EgressKey {}
    unsafe impl aya::Pod for EgressValue {}
    unsafe impl aya::Pod for EgressSourceKey {}
    unsafe impl aya::Pod for DropDestinationKey {}
    unsafe impl aya::Pod for EgressSourceFlows {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for Budget {}
    unsafe impl aya::Pod for PacketEvent {}
    unsafe impl aya::Pod for CapturedPacketEvent {}
    unsafe impl aya::Pod for KernelOffsets {}
    unsafe impl aya::Pod for ProbeConfig {}
}
