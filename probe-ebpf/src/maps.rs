//! What the programs share with the agent: the load-time settings (globals the agent fills in
//! before loading) and every map, with why each exists and how it is sized.

use aya_ebpf::{
    Global,
    macros::map,
    maps::{LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use probe_common::{
    AddrValue, Budget, DropKey, EgressKey, EgressValue, FlowKey, KernelOffsets, ProbeConfig,
    SuspectKey, prefilter, stat,
};

// SAFETY: the loader finds the map by this symbol name; no other symbol has it.
#[unsafe(no_mangle)]
pub(crate) static CONFIG: Global<ProbeConfig> = Global::new(ProbeConfig {
    dedup_ns: 1_000_000_000,
    events_per_sec: 256,
    wakeup_bytes: 64 * 208,
    wakeups_per_sec: 100,
    netns_ino: 0,
    reason_consumed: u32::MAX,
    capture_bytes: probe_common::CAPTURE_MAX as u32,
    _pad: 0,
});

// SAFETY: the loader finds the map by this symbol name; no other symbol has it.
#[unsafe(no_mangle)]
pub(crate) static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    skb_head: 0,
    skb_network_header: 0,
    skb_dev: 0,
    skb_iif: 0,
    dev_nd_net: 0,
    net_ns_inum: 0,
    valid: 0,
    skb_tail: 0,
    skb_sk: 0,
    sk_net: 0,
});

/// The node's own IPv4 host addresses (/32), tagged: one hash lookup answers most packets.
#[map]
pub(crate) static HOSTS_V4: aya_ebpf::maps::HashMap<u32, AddrValue> =
    aya_ebpf::maps::HashMap::with_max_entries(16384, 0);
/// The node's own IPv6 host addresses (/128), tagged.
#[map]
pub(crate) static HOSTS_V6: aya_ebpf::maps::HashMap<[u32; 4], AddrValue> =
    aya_ebpf::maps::HashMap::with_max_entries(16384, 0);
/// The node's own IPv4 prefixes shorter than /32 (pod CIDRs, bridge subnets), tagged.
#[map]
pub(crate) static LOCAL_V4: LpmTrie<u32, AddrValue> = LpmTrie::with_max_entries(16384, 0);
/// The node's own IPv6 prefixes shorter than /128, tagged.
#[map]
pub(crate) static LOCAL_V6: LpmTrie<[u32; 4], AddrValue> = LpmTrie::with_max_entries(16384, 0);
/// The IPv4 prefilter bitmap (see `probe_common::prefilter`): one or two plain loads decide
/// that an ordinary packet's address is not local, before any hash or trie look-up.
#[map]
pub(crate) static PREFILTER_V4: aya_ebpf::maps::Array<u64> =
    aya_ebpf::maps::Array::with_max_entries(prefilter::WORDS, 0);
/// Number of prefixes in LOCAL_V6: the IPv6 trie is not looked up when empty (IPv4 needs no
/// such count: the prefilter's network bits are all clear then).
#[map]
pub(crate) static TRIE_V6_SIZE: aya_ebpf::maps::Array<u32> =
    aya_ebpf::maps::Array::with_max_entries(1, 0);

/// Ifindexes of the monitored NICs (value unused): a drop of a local-source packet counts
/// only when the packet came in through one of them.
#[map]
pub(crate) static NICS: aya_ebpf::maps::HashMap<u32, u32> =
    aya_ebpf::maps::HashMap::with_max_entries(64, 0);

/// Destinations that are not local but whose drops matter (value unused): the LB and
/// external IPs kube-proxy's nftables mode drops for an externalTrafficPolicy Local Service
/// on a node without a local endpoint (`no-endpoint-services`, kubernetes#131765). Read only
/// by the drop program, only for a local pod's drop that both address look-ups missed.
#[map]
pub(crate) static DROP_DESTINATIONS: aya_ebpf::maps::HashMap<
    probe_common::DropDestinationKey,
    u32,
> = aya_ebpf::maps::HashMap::with_max_entries(16_384, 0);

/// The LB's node-probe ports (`probe_common::probe_ports`): kube-proxy's healthz :10256 and the
/// healthCheckNodePorts the agent knows, one bit each. Read only by the drop program, only for
/// the drop of an outside TCP packet to a node address that came in through a NIC: one plain
/// array load on that path alone (`lb_probe_refused`).
#[map]
pub(crate) static PROBE_PORTS: aya_ebpf::maps::Array<u64> =
    aya_ebpf::maps::Array::with_max_entries(probe_common::probe_ports::WORDS, 0);

/// Exact suspect counters by (ifindex, tag, proto).
#[map]
pub(crate) static SUSPECTS: PerCpuHashMap<SuspectKey, u64> =
    PerCpuHashMap::with_max_entries(1024, 0);
/// Exact counters of matched drops by (reason, tags).
#[map]
pub(crate) static DROPS: PerCpuHashMap<DropKey, u64> = PerCpuHashMap::with_max_entries(1024, 0);
/// Pipeline counters, see `probe_common::stat`.
#[map]
pub(crate) static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);
/// Per-CPU event budget window, a count per class (`probe_common::budget`).
#[map]
pub(crate) static BUDGET: PerCpuArray<Budget> = PerCpuArray::with_max_entries(1, 0);

/// Un-SNATed pod egress flows and the node's own TCP openers to non-local addresses:
/// (source addr, sport, proto) -> (dst, dport, time).
#[map]
pub(crate) static EGRESS_FLOWS: LruHashMap<EgressKey, EgressValue> =
    LruHashMap::with_max_entries(65536, 0);
/// Per-source index of `EGRESS_FLOWS`: source address -> its latest recorded flows, so the
/// agent answers a suspect with a keyed look-up instead of walking 65,536 entries. Sized in
/// sources (the node's pods and addresses), not flows; LRU: the source silent longest goes.
#[map]
pub(crate) static EGRESS_SOURCES: LruHashMap<
    probe_common::EgressSourceKey,
    probe_common::EgressSourceFlows,
> = LruHashMap::with_max_entries(8192, 0);
/// Last report time of each flow, for in-kernel deduplication.
#[map]
pub(crate) static RECENT: LruHashMap<FlowKey, u64> = LruHashMap::with_max_entries(16384, 0);

/// Events to userspace (suspects and drops only; never ordinary packets).
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);
/// Ring producer position + 1 at the last immediate wake-up (0: none yet). While the reader's
/// consumer position has not passed it, that wake-up is still being served and another one
/// would only cost an interrupt. Shared by all CPUs: a race costs one wake-up too many or
/// leaves a record to the reader's backstop timer, never a record.
#[map]
pub(crate) static WAKE_POS: aya_ebpf::maps::Array<u64> =
    aya_ebpf::maps::Array::with_max_entries(1, 0);
