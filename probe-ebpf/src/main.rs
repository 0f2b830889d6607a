//! clb-probe's kernel half.
//!
//! - `clb_ingress` (tc/tcx, NIC ingress): a packet whose *source* is one of the node's own
//!   addresses (node, bound VIP, local pod) is a suspect: counted exactly, evented once per flow.
//! - `clb_egress` (tc/tcx, NIC egress): TCP SYNs and UDP packets that leave the node with a pod
//!   source (so after POSTROUTING, i.e. not SNATed), and TCP SYNs with a node source to a
//!   non-local address, are remembered in an LRU map, so a hairpin coming back can be tied to
//!   the VIP the pod (or the node) called.
//! - `clb_kfree_skb` (tp_btf, raw tracepoint as fallback): kernel drops of suspect packets, of
//!   packets addressed to bound VIPs, and of self-addressed local pod packets (in any
//!   namespace: a pod's call to its own Service dies in the pod), with the kernel's reason and
//!   drop site.
//!
//! Hot path rule: an ordinary packet costs a header parse and one LPM lookup, and is returned
//! unchanged. Programs never change a verdict (they return TC_ACT_UNSPEC / TCX_NEXT).
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{
        BPF_RB_AVAIL_DATA, BPF_RB_CONS_POS, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_PROD_POS,
        TC_ACT_UNSPEC,
    },
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, classifier, map, raw_tracepoint},
    maps::{LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, lpm_trie::Key as LpmKey},
    programs::{BtfTracePointContext, RawTracePointContext, TcContext},
};
use probe_common::{
    AddrValue, Budget, DropKey, EGRESS_IDLE_NS, EgressKey, EgressValue, FlowKey, KernelOffsets,
    PacketEvent, ProbeConfig, SuspectKey, budget, family, kind, prefilter, stat, tag,
};

#[unsafe(no_mangle)]
static CONFIG: Global<ProbeConfig> = Global::new(ProbeConfig {
    dedup_ns: 1_000_000_000,
    events_per_sec: 256,
    wakeup_bytes: 64 * 72,
    wakeups_per_sec: 100,
    netns_ino: 0,
    reason_consumed: u32::MAX,
});

#[unsafe(no_mangle)]
static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    skb_head: 0,
    skb_network_header: 0,
    skb_dev: 0,
    skb_iif: 0,
    dev_nd_net: 0,
    net_ns_inum: 0,
    valid: 0,
    _pad: 0,
});

/// The node's own IPv4 host addresses (/32), tagged: one hash lookup answers most packets.
#[map]
static HOSTS_V4: aya_ebpf::maps::HashMap<u32, AddrValue> =
    aya_ebpf::maps::HashMap::with_max_entries(16384, 0);
/// The node's own IPv6 host addresses (/128), tagged.
#[map]
static HOSTS_V6: aya_ebpf::maps::HashMap<[u32; 4], AddrValue> =
    aya_ebpf::maps::HashMap::with_max_entries(16384, 0);
/// The node's own IPv4 prefixes shorter than /32 (pod CIDRs, bridge subnets), tagged.
#[map]
static LOCAL_V4: LpmTrie<u32, AddrValue> = LpmTrie::with_max_entries(16384, 0);
/// The node's own IPv6 prefixes shorter than /128, tagged.
#[map]
static LOCAL_V6: LpmTrie<[u32; 4], AddrValue> = LpmTrie::with_max_entries(16384, 0);
/// The IPv4 prefilter bitmap (see `probe_common::prefilter`): one or two plain loads decide
/// that an ordinary packet's address is not local, before any hash or trie look-up.
#[map]
static PREFILTER_V4: aya_ebpf::maps::Array<u64> =
    aya_ebpf::maps::Array::with_max_entries(prefilter::WORDS, 0);
/// Number of prefixes in LOCAL_V6: the IPv6 trie is not looked up when empty (IPv4 needs no
/// such count: the prefilter's network bits are all clear then).
#[map]
static TRIE_V6_SIZE: aya_ebpf::maps::Array<u32> = aya_ebpf::maps::Array::with_max_entries(1, 0);

/// Ifindexes of the monitored NICs (value unused): a drop of a local-source packet counts
/// only when the packet came in through one of them.
#[map]
static NICS: aya_ebpf::maps::HashMap<u32, u32> = aya_ebpf::maps::HashMap::with_max_entries(64, 0);

/// Exact suspect counters by (ifindex, tag, proto).
#[map]
static SUSPECTS: PerCpuHashMap<SuspectKey, u64> = PerCpuHashMap::with_max_entries(1024, 0);
/// Exact counters of matched drops by (reason, tags).
#[map]
static DROPS: PerCpuHashMap<DropKey, u64> = PerCpuHashMap::with_max_entries(1024, 0);
/// Pipeline counters, see `probe_common::stat`.
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);
/// Per-CPU event budget window, a count per class (`probe_common::budget`).
#[map]
static BUDGET: PerCpuArray<Budget> = PerCpuArray::with_max_entries(1, 0);

/// Un-SNATed pod egress flows and the node's own TCP openers to non-local addresses:
/// (source addr, sport, proto) -> (dst, dport, time).
#[map]
static EGRESS_FLOWS: LruHashMap<EgressKey, EgressValue> = LruHashMap::with_max_entries(65536, 0);
/// Per-source index of `EGRESS_FLOWS`: source address -> its latest recorded flows, so the
/// agent answers a suspect with a keyed look-up instead of walking 65,536 entries. Sized in
/// sources (the node's pods and addresses), not flows; LRU: the source silent longest goes.
#[map]
static EGRESS_SOURCES: LruHashMap<probe_common::EgressSourceKey, probe_common::EgressSourceFlows> =
    LruHashMap::with_max_entries(8192, 0);
/// Last report time of each flow, for in-kernel deduplication.
#[map]
static RECENT: LruHashMap<FlowKey, u64> = LruHashMap::with_max_entries(16384, 0);

/// Events to userspace (suspects and drops only; never ordinary packets).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);
/// Ring producer position + 1 at the last immediate wake-up (0: none yet). While the reader's
/// consumer position has not passed it, that wake-up is still being served and another one
/// would only cost an interrupt. Shared by all CPUs: a race costs one wake-up too many or
/// leaves a record to the reader's backstop timer, never a record.
#[map]
static WAKE_POS: aya_ebpf::maps::Array<u64> = aya_ebpf::maps::Array::with_max_entries(1, 0);

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// A parsed packet: addresses as raw network-order words (IPv4 in the first word), ports and
/// flags. Words, not byte arrays: LLVM scalarizes byte arrays into one spilled stack slot per
/// byte, which blows the verifier's 512-byte stack.
#[derive(Default)]
struct Packet {
    family: u8,
    proto: u8,
    tcp_flags: u8,
    saddr: [u32; 4],
    daddr: [u32; 4],
    sport: u16,
    dport: u16,
}

/// Our 16-byte address layout as words, for the records shared with userspace.
#[inline(always)]
fn bytes(words: [u32; 4]) -> [u8; 16] {
    // SAFETY: same size, any bit pattern is valid.
    unsafe { core::mem::transmute(words) }
}

#[inline(always)]
fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
}

/// Reads a `T` at `offset`: direct packet access when the bytes are in the skb's linear part
/// (nearly always), else `bpf_skb_load_bytes`. A sender or driver can hand over an skb whose
/// linear part holds only the Ethernet header (trafgen's PF_PACKET ring does; so can NICs
/// that split headers): without the fallback such packets would pass unclassified.
#[inline(always)]
fn field<T: Copy>(ctx: &TcContext, offset: usize) -> Option<T> {
    match ptr_at::<T>(ctx, offset) {
        Some(p) => Some(unsafe { *p }),
        None => ctx.load::<T>(offset).ok(),
    }
}

/// Reads ports and TCP flags at `l4`. Missing L4 (fragments, short packets) leaves them
/// zero: the addresses alone still classify the packet. One read per header: fewer bounds
/// checks, and no 1-byte reads (LLVM folds their `p + 1 > end` into `p >= end`, which the
/// verifier does not accept for a variable offset).
#[inline(always)]
fn parse_l4(ctx: &TcContext, l4: usize, pkt: &mut Packet) {
    match pkt.proto {
        IPPROTO_TCP => {
            if let Some(h) = field::<[u8; 14]>(ctx, l4) {
                pkt.sport = u16::from_be_bytes([h[0], h[1]]);
                pkt.dport = u16::from_be_bytes([h[2], h[3]]);
                pkt.tcp_flags = h[13];
            }
        }
        IPPROTO_UDP => {
            if let Some(h) = field::<[u8; 4]>(ctx, l4) {
                pkt.sport = u16::from_be_bytes([h[0], h[1]]);
                pkt.dport = u16::from_be_bytes([h[2], h[3]]);
            }
        }
        _ => {}
    }
}

/// Parses Ethernet + IPv4/IPv6 (fixed header), in one read; returns the packet (no ports
/// yet) and the L4 header's offset (0: none to read, a non-first fragment).
#[inline(always)]
fn parse_l3(ctx: &TcContext) -> Option<(Packet, usize)> {
    let ethertype = u16::from_be(field::<u16>(ctx, 12)?);
    let mut pkt = Packet::default();
    let mut l4 = 0;
    match ethertype {
        ETH_P_IP => {
            // Words as they lie in memory (network order); bytes by position.
            let h = field::<[u32; 5]>(ctx, ETH_HLEN)?;
            let (w0, w1, w2) = (h[0].to_le_bytes(), h[1].to_le_bytes(), h[2].to_le_bytes());
            let ihl = ((w0[0] & 0x0f) as usize) * 4;
            pkt.family = family::V4;
            pkt.proto = w2[1];
            pkt.saddr[0] = h[3];
            pkt.daddr[0] = h[4];
            // Non-first fragments carry no L4 header.
            let frag = u16::from_be_bytes([w1[2], w1[3]]) & 0x1fff;
            if frag == 0 && ihl >= 20 {
                l4 = ETH_HLEN + ihl;
            }
        }
        ETH_P_IPV6 => {
            let h = field::<[u32; 10]>(ctx, ETH_HLEN)?;
            pkt.family = family::V6;
            pkt.proto = h[1].to_le_bytes()[2];
            pkt.saddr = [h[2], h[3], h[4], h[5]];
            pkt.daddr = [h[6], h[7], h[8], h[9]];
            // Extension headers are not walked: such packets classify by address only.
            l4 = ETH_HLEN + 40;
        }
        _ => return None,
    }
    Some((pkt, l4))
}

/// [`parse_l3`] and the ports and TCP flags.
#[inline(always)]
fn parse(ctx: &TcContext) -> Option<Packet> {
    let (mut pkt, l4) = parse_l3(ctx)?;
    if l4 != 0 {
        parse_l4(ctx, l4, &mut pkt);
    }
    Some(pkt)
}

/// Whether bit `i` of the IPv4 prefilter is set.
#[inline(always)]
fn prefilter_bit(i: u32) -> bool {
    PREFILTER_V4
        .get(i >> 6)
        .is_some_and(|w| (*w >> (i & 63)) & 1 == 1)
}

/// The two prefilter bits of the /16 network holding `raw` (see `prefilter::net16`).
#[inline(always)]
fn prefilter_net16(raw: u32) -> u64 {
    let (word, shift) = prefilter::net16_slot(prefilter::net16(raw));
    PREFILTER_V4.get(word).map_or(0, |w| (*w >> shift) & 3)
}

/// Whether the IPv4 trie could hold a prefix covering `raw`: the /16's bits, then, for a /16
/// holding only longer prefixes, the /24's.
#[inline(always)]
fn may_be_in_trie(raw: u32) -> bool {
    match prefilter_net16(raw) {
        prefilter::net16::NONE => false,
        prefilter::net16::PARTIAL => prefilter_bit(prefilter::net24_bit(raw)),
        _ => true,
    }
}

/// The tag of an address. Longest-prefix semantics in two steps: a host address (the longest
/// prefix there is) in the hash, else the trie of shorter prefixes. IPv4 asks the prefilter
/// first: each look-up runs only when its bits say it could hit.
#[inline(always)]
fn lookup_tag(fam: u8, addr: &[u32; 4]) -> u8 {
    if fam == family::V4 {
        let raw = addr[0];
        if prefilter_bit(prefilter::host_bit(raw))
            && let Some(v) = unsafe { HOSTS_V4.get(raw) }
        {
            return v.tag;
        }
        if may_be_in_trie(raw) {
            let key = LpmKey::new(32, raw);
            return LOCAL_V4.get(&key).map(|v| v.tag).unwrap_or(tag::NONE);
        }
    } else {
        if let Some(v) = unsafe { HOSTS_V6.get(addr) } {
            return v.tag;
        }
        if TRIE_V6_SIZE.get(0).is_some_and(|n| *n > 0) {
            let key = LpmKey::new(128, *addr);
            return LOCAL_V6.get(&key).map(|v| v.tag).unwrap_or(tag::NONE);
        }
    }
    tag::NONE
}

#[inline(always)]
fn stat_add(index: u32) {
    if let Some(slot) = STATS.get_ptr_mut(index) {
        unsafe { *slot += 1 };
    }
}

/// Per-CPU counter in a hash map: exact without atomics (tc and tracepoint programs do not
/// nest on one CPU for the same map slot; an insert race across CPUs is impossible per-CPU).
#[inline(always)]
fn count<K>(map: &PerCpuHashMap<K, u64>, key: &K) {
    match map.get_ptr_mut(key) {
        Some(v) => unsafe { *v += 1 },
        None => {
            let _ = map.insert(key, 1, 0);
        }
    }
}

/// Deduplication and budget: true when an event for `flow` (from a `src_tag` source) may
/// leave the kernel now. Each (kind, source tag) class spends its own budget (see
/// `probe_common::budget`): a suspect flood cannot starve a health check's records.
#[inline(always)]
fn may_emit(flow: &FlowKey, src_tag: u8, now: u64, cfg: &ProbeConfig) -> bool {
    if let Some(last) = RECENT.get_ptr_mut(flow)
        && now.wrapping_sub(unsafe { *last }) < cfg.dedup_ns
    {
        stat_add(stat::DEDUP_SUPPRESSED);
        return false;
    }
    let Some(budget) = BUDGET.get_ptr_mut(0) else {
        return false;
    };
    let budget = unsafe { &mut *budget };
    if now.wrapping_sub(budget.window_start_ns) >= 1_000_000_000 {
        budget.window_start_ns = now;
        budget.used = [0; budget::CLASSES];
        budget.wakeups = 0;
    }
    // Opaque to the compiler, so the bounds check it cannot prove redundant stays for the
    // verifier: 5.10's loses the bounds of the class's masked OR and rejects the index.
    let class = core::hint::black_box(budget::class(flow.kind, src_tag));
    let Some(used) = budget.used.get_mut(class) else {
        return false;
    };
    if u64::from(*used) >= cfg.events_per_sec {
        stat_add(stat::BUDGET_SUPPRESSED);
        stat_add(stat::BUDGET_SUPPRESSED_BY_CLASS + class as u32);
        return false;
    }
    *used += 1;
    // Only flows that were actually emitted enter RECENT, so a suppressed flow gets its event
    // as soon as budget is back.
    let _ = RECENT.insert(flow, now, 0);
    true
}

/// Submit flags of a confirming record (a drop: the suspect it pairs with is already in the
/// ring, so waking now delivers both): an immediate wake-up unless one is still being served,
/// at most `wakeups_per_sec` per CPU per budget window (`may_emit` just opened it if due).
#[inline(always)]
fn confirming_wakeup(cfg: &ProbeConfig) -> u64 {
    let Some(wake_pos) = WAKE_POS.get_ptr_mut(0) else {
        return BPF_RB_NO_WAKEUP as u64;
    };
    if EVENTS.query(BPF_RB_CONS_POS as u64) < unsafe { *wake_pos } {
        return BPF_RB_NO_WAKEUP as u64;
    }
    let Some(budget) = BUDGET.get_ptr_mut(0) else {
        return BPF_RB_NO_WAKEUP as u64;
    };
    let budget = unsafe { &mut *budget };
    if u64::from(budget.wakeups) >= cfg.wakeups_per_sec {
        stat_add(stat::WAKEUP_BUDGET_SUPPRESSED);
        return BPF_RB_NO_WAKEUP as u64;
    }
    budget.wakeups += 1;
    unsafe { *wake_pos = EVENTS.query(BPF_RB_PROD_POS as u64) + 1 };
    stat_add(stat::WAKEUPS);
    BPF_RB_FORCE_WAKEUP as u64
}

/// What a record says beyond the packet itself.
struct Meta {
    kind: u8,
    src_tag: u8,
    dst_tag: u8,
    ifindex: u32,
    reason: u32,
    location: u64,
    netns: u32,
    now: u64,
}

/// Writes one record straight into the ring buffer (no stack copy: the verifier's 512-byte
/// stack limit is shared by every frame).
#[inline(always)]
fn emit(cfg: &ProbeConfig, pkt: &Packet, m: Meta) {
    // Waking the reader per record costs an IPI per packet (see PERFORMANCE.md): wake it when
    // a batch has built up, or for a record that can confirm an event, else leave the record
    // to the reader's backstop timer.
    let flags = if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= cfg.wakeup_bytes {
        BPF_RB_FORCE_WAKEUP as u64
    } else if m.kind == kind::DROP {
        confirming_wakeup(cfg)
    } else {
        BPF_RB_NO_WAKEUP as u64
    };
    let Some(mut entry) = EVENTS.reserve::<PacketEvent>(0) else {
        stat_add(stat::RINGBUF_FULL);
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved, exclusively owned record; every field is written.
    unsafe {
        (*ev).ts_ns = m.now;
        (*ev).location = m.location;
        (*ev).saddr = bytes(pkt.saddr);
        (*ev).daddr = bytes(pkt.daddr);
        (*ev).ifindex = m.ifindex;
        (*ev).reason = m.reason;
        (*ev).netns = m.netns;
        (*ev).sport = pkt.sport;
        (*ev).dport = pkt.dport;
        (*ev).kind = m.kind;
        (*ev).src_tag = m.src_tag;
        (*ev).dst_tag = m.dst_tag;
        (*ev).proto = pkt.proto;
        (*ev).family = pkt.family;
        (*ev).tcp_flags = pkt.tcp_flags;
        (*ev)._pad = [0; 2];
    }
    entry.submit(flags);
    stat_add(stat::EMITTED);
}

#[inline(always)]
fn flow_of(pkt: &Packet, kind_: u8) -> FlowKey {
    FlowKey {
        saddr: bytes(pkt.saddr),
        daddr: bytes(pkt.daddr),
        sport: pkt.sport,
        dport: pkt.dport,
        proto: pkt.proto,
        family: pkt.family,
        kind: kind_,
        _pad: 0,
    }
}

#[classifier]
pub fn clb_ingress(ctx: TcContext) -> i32 {
    // The ordinary path: the addresses, the prefilter, out. Ports only for suspects.
    let Some((mut pkt, l4)) = parse_l3(&ctx) else {
        return TC_ACT_UNSPEC;
    };
    let src_tag = lookup_tag(pkt.family, &pkt.saddr);
    if src_tag == tag::NONE {
        return TC_ACT_UNSPEC;
    }
    if l4 != 0 {
        parse_l4(&ctx, l4, &mut pkt);
    }
    on_suspect(&ctx, &pkt, src_tag);
    TC_ACT_UNSPEC
}

#[inline(never)]
fn on_suspect(ctx: &TcContext, pkt: &Packet, src_tag: u8) {
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    count(
        &SUSPECTS,
        &SuspectKey {
            ifindex,
            tag: src_tag,
            proto: pkt.proto,
            _pad: [0; 2],
        },
    );
    let cfg = CONFIG.load();
    let now = unsafe { bpf_ktime_get_ns() };
    if !may_emit(&flow_of(pkt, kind::SUSPECT), src_tag, now, &cfg) {
        return;
    }
    let dst_tag = lookup_tag(pkt.family, &pkt.daddr);
    emit(
        &cfg,
        pkt,
        Meta {
            kind: kind::SUSPECT,
            src_tag,
            dst_tag,
            ifindex,
            reason: 0,
            location: 0,
            netns: 0,
            now,
        },
    );
}

/// A TCP SYN leaving a NIC with a bound VIP as source: a call to the LB IP forwarded to
/// another node without SNAT. Never on an ordinary packet's path (only VIP-source openers get
/// here); deduplicated and budgeted like every event. TCP only: a UDP service on a VIP
/// answers from the VIP, which is no opener of ours.
#[inline(never)]
fn on_vip_egress(ctx: &TcContext, pkt: &Packet) {
    let cfg = CONFIG.load();
    let now = unsafe { bpf_ktime_get_ns() };
    if !may_emit(&flow_of(pkt, kind::VIP_EGRESS), tag::VIP, now, &cfg) {
        return;
    }
    emit(
        &cfg,
        pkt,
        Meta {
            kind: kind::VIP_EGRESS,
            src_tag: tag::VIP,
            dst_tag: lookup_tag(pkt.family, &pkt.daddr),
            ifindex: unsafe { (*ctx.skb.skb).ifindex },
            reason: 0,
            location: 0,
            netns: 0,
            now,
        },
    );
}

/// Whether an opener leaving a NIC is remembered in `EGRESS_FLOWS`: a pod source (not
/// SNATed), or the node's own address calling a non-local destination with a TCP SYN (a
/// host-network client, or pod traffic masqueraded to the node IP: a node-sourced loop comes
/// back with the node's IP as source). Node UDP is left out: it includes overlay encapsulation
/// (VXLAN, Geneve) at packet rate. The caller looked the source up once;
/// node SYNs pay a second look-up (the destination).
#[inline(always)]
fn records_egress(src_tag: u8, pkt: &Packet) -> bool {
    match src_tag {
        tag::POD => true,
        tag::NODE => pkt.proto == IPPROTO_TCP && lookup_tag(pkt.family, &pkt.daddr) == tag::NONE,
        _ => false,
    }
}

#[classifier]
pub fn clb_egress(ctx: TcContext) -> i32 {
    let Some(pkt) = parse(&ctx) else {
        return TC_ACT_UNSPEC;
    };
    // Cheap first check: only connection openers matter (TCP SYN without ACK, UDP).
    let opener = match pkt.proto {
        IPPROTO_TCP => pkt.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN,
        IPPROTO_UDP => true,
        _ => false,
    };
    if !opener {
        return TC_ACT_UNSPEC;
    }
    // One look-up of the source for nearly every opener, a second only for node SYNs.
    let src_tag = lookup_tag(pkt.family, &pkt.saddr);
    if src_tag == tag::VIP && pkt.proto == IPPROTO_TCP {
        on_vip_egress(&ctx, &pkt);
        return TC_ACT_UNSPEC;
    }
    if !records_egress(src_tag, &pkt) {
        return TC_ACT_UNSPEC;
    }
    let key = EgressKey {
        addr: bytes(pkt.saddr),
        port: pkt.sport,
        proto: pkt.proto,
        family: pkt.family,
    };
    let now = unsafe { bpf_ktime_get_ns() };
    // The same opener again (a SYN retransmit, the next UDP datagram): keep the first
    // packet's time, so the record says when the flow started, and only move `last_ns`.
    // The agent matches a hairpin suspect against the first time: a retransmit must not
    // make the egress look later than the suspect it caused.
    if let Some(v) = EGRESS_FLOWS.get_ptr_mut(key) {
        let v = unsafe { &mut *v };
        // SAFETY: `daddr` is the first field of an 8-aligned struct; compare it as words
        // (byte arrays cost one stack slot per byte in BPF).
        let seen: [u32; 4] = unsafe { core::ptr::read(v.daddr.as_ptr().cast()) };
        if seen == pkt.daddr && v.dport == pkt.dport && now.wrapping_sub(v.last_ns) < EGRESS_IDLE_NS
        {
            v.last_ns = now;
            return TC_ACT_UNSPEC;
        }
    }
    let value = EgressValue {
        daddr: bytes(pkt.daddr),
        dport: pkt.dport,
        _pad: [0; 2],
        ifindex: unsafe { (*ctx.skb.skb).ifindex },
        ts_ns: now,
        last_ns: now,
    };
    if EGRESS_FLOWS.insert(key, value, 0).is_ok() {
        stat_add(stat::EGRESS_RECORDED);
        index_egress_source(&key);
    }
    TC_ACT_UNSPEC
}

/// Adds a new `EGRESS_FLOWS` record to its source's ring in `EGRESS_SOURCES`: one more map
/// update per new record (never per packet). Two CPUs recording the same source at once may
/// both write one slot; the index then lacks the older of the two flows (never names a wrong
/// one), which only a layer-7 guess could notice: a layer-4 match looks its flow up by key.
#[inline(always)]
fn index_egress_source(key: &EgressKey) {
    use probe_common::{EGRESS_SOURCE_SLOTS, EgressSourceFlows, EgressSourceKey};
    let source = EgressSourceKey {
        addr: key.addr,
        family: key.family,
        _pad: [0; 3],
    };
    let slot = EgressSourceFlows::slot(key.port, key.proto);
    if let Some(ring) = EGRESS_SOURCES.get_ptr_mut(source) {
        // SAFETY: a valid pointer into the map's value, for this program run.
        let ring = unsafe { &mut *ring };
        let i = ring.next as usize & (EGRESS_SOURCE_SLOTS - 1);
        if let Some(s) = ring.flows.get_mut(i) {
            *s = slot;
        }
        ring.next = ring.next.wrapping_add(1);
        return;
    }
    let mut ring = EgressSourceFlows {
        next: 1,
        flows: [0; EGRESS_SOURCE_SLOTS],
    };
    ring.flows[0] = slot;
    let _ = EGRESS_SOURCES.insert(source, ring, 0);
}

#[inline(always)]
fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    unsafe { bpf_probe_read_kernel(base.add(offset as usize) as *const T).ok() }
}

/// Parses the IP header of a dropped skb through `skb->head + skb->network_header`.
#[inline(always)]
fn parse_skb(skb: *const u8, off: &KernelOffsets) -> Option<Packet> {
    let head: *const u8 = read(skb, off.skb_head)?;
    let nh: u16 = read(skb, off.skb_network_header)?;
    // network_header is ~0 when unset.
    if nh == u16::MAX || head.is_null() {
        return None;
    }
    let ip = unsafe { head.add(nh as usize) };
    let first: u8 = read(ip, 0)?;
    let mut pkt = Packet::default();
    let l4_off: u32 = match first >> 4 {
        4 => {
            pkt.family = family::V4;
            pkt.proto = read(ip, 9)?;
            pkt.saddr[0] = read(ip, 12)?;
            pkt.daddr[0] = read(ip, 16)?;
            let frag = u16::from_be(read::<u16>(ip, 6)?) & 0x1fff;
            if frag != 0 {
                return Some(pkt);
            }
            ((first & 0x0f) as u32) * 4
        }
        6 => {
            pkt.family = family::V6;
            pkt.proto = read(ip, 6)?;
            pkt.saddr = read(ip, 8)?;
            pkt.daddr = read(ip, 24)?;
            40
        }
        _ => return None,
    };
    if pkt.proto == IPPROTO_TCP || pkt.proto == IPPROTO_UDP {
        let ports: [u8; 4] = read(ip, l4_off)?;
        pkt.sport = u16::from_be_bytes([ports[0], ports[1]]);
        pkt.dport = u16::from_be_bytes([ports[2], ports[3]]);
        if pkt.proto == IPPROTO_TCP {
            pkt.tcp_flags = read(ip, l4_off + 13).unwrap_or(0);
        }
    }
    Some(pkt)
}

/// Whether a dropped skb's IP source equals its destination (IPv4, or IPv6 compared as four
/// words): the first filter of another namespace's drops, three or four reads.
#[inline(always)]
fn self_addressed(skb: *const u8, off: &KernelOffsets) -> bool {
    let Some(head) = read::<*const u8>(skb, off.skb_head) else {
        return false;
    };
    let Some(nh) = read::<u16>(skb, off.skb_network_header) else {
        return false;
    };
    if nh == u16::MAX || head.is_null() {
        return false;
    }
    let ip = unsafe { head.add(nh as usize) };
    match read::<u8>(ip, 0).map(|b| b >> 4) {
        Some(4) => matches!(read::<[u32; 2]>(ip, 12), Some([s, d]) if s == d),
        Some(6) => matches!(read::<[u32; 8]>(ip, 8), Some(a) if a[..4] == a[4..]),
        _ => false,
    }
}

/// Common body of the tp_btf and raw tracepoint programs: both get (skb, location, reason).
/// Kernels before 5.17 pass no reason: their variants give 0 (`SKB_NOT_DROPPED_YET` where the
/// enum exists, never a real drop's reason) and userspace classifies by the drop site.
#[inline(always)]
fn on_kfree_skb<C: EbpfContext>(ctx: &C, skb: *const u8, location: u64, reason: u32) {
    let cfg = CONFIG.load();
    if reason == cfg.reason_consumed || skb.is_null() {
        return;
    }
    let off = OFFSETS.load();
    if off.valid == 0 {
        return;
    }
    // Cheapest filter first: every namespace's drops (each pod's) hit this hook, and the
    // namespace costs three reads where parsing and two lookups cost more.
    let mut netns = 0u32;
    if let Some(dev) = read::<*const u8>(skb, off.skb_dev)
        && !dev.is_null()
        && let Some(net) = read::<*const u8>(dev, off.dev_nd_net)
        && !net.is_null()
    {
        netns = read(net, off.net_ns_inum).unwrap_or(0);
    }
    // Another namespace's drop (a pod's) matters only when it is self-addressed: a pod's call
    // to its own Service, DNATed back to itself without the hairpin SNAT, dies in the pod's
    // namespace as a local source (`service_self_loop`). Two address reads decide it before
    // any parsing or look-up; the drop site there is the pod's, so no interface is reported.
    let foreign = cfg.netns_ino != 0 && netns != cfg.netns_ino;
    if foreign && !self_addressed(skb, &off) {
        return;
    }
    let Some(pkt) = parse_skb(skb, &off) else {
        return;
    };
    let src_tag = lookup_tag(pkt.family, &pkt.saddr);
    // A self-addressed local pod packet: the destination is the source, one look-up serves
    // both (and on the node, it is the hairpin that never left the pod's bridge port).
    let self_loop = src_tag == tag::POD && pkt.saddr == pkt.daddr;
    if foreign && !self_loop {
        return;
    }
    let dst_tag = if self_loop {
        src_tag
    } else {
        lookup_tag(pkt.family, &pkt.daddr)
    };
    if src_tag == tag::NONE && dst_tag != tag::VIP {
        return;
    }
    let iif: u32 = if foreign {
        0
    } else {
        read(skb, off.skb_iif).unwrap_or(0)
    };
    // A local-source packet matters only when it came in through a monitored NIC: the node's
    // own outbound packets (iif 0) carry node sources legitimately.
    let src_relevant = self_loop || (src_tag != tag::NONE && unsafe { NICS.get(iif) }.is_some());
    if !src_relevant && dst_tag != tag::VIP {
        return;
    }
    let src_tag = if src_relevant { src_tag } else { tag::NONE };
    stat_add(stat::DROPS_MATCHED);
    // Off unless the agent runs with --ebpf-log (then one global check per matched drop).
    aya_log_ebpf::debug!(
        ctx,
        "matched drop: reason {} src_tag {} dst_tag {} iif {}",
        reason,
        src_tag,
        dst_tag,
        iif
    );
    count(
        &DROPS,
        &DropKey {
            reason,
            src_tag,
            dst_tag,
            _pad: [0; 2],
        },
    );
    let now = unsafe { bpf_ktime_get_ns() };
    if !may_emit(&flow_of(&pkt, kind::DROP), src_tag, now, &cfg) {
        return;
    }
    emit(
        &cfg,
        &pkt,
        Meta {
            kind: kind::DROP,
            src_tag,
            dst_tag,
            ifindex: iif,
            reason,
            location,
            netns,
            now,
        },
    );
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn clb_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    let reason: u32 = ctx.arg(2);
    on_kfree_skb(&ctx, skb, location, reason);
    0
}

#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn clb_kfree_skb_raw(ctx: RawTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    let reason: u32 = ctx.arg(2);
    on_kfree_skb(&ctx, skb, location, reason);
    0
}

// The two-argument tracepoint of kernels before 5.17 (skb, location): the verifier refuses a
// program that reads an argument the tracepoint does not have, so each hook has a variant
// that reads only two. The agent loads the one the running kernel's BTF prototype fits.

#[btf_tracepoint(function = "kfree_skb")]
pub fn clb_kfree_skb_site(ctx: BtfTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    on_kfree_skb(&ctx, skb, location, 0);
    0
}

#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn clb_kfree_skb_site_raw(ctx: RawTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    on_kfree_skb(&ctx, skb, location, 0);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
