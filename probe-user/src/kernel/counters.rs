//! Exact kernel counters and the egress LRU, read on demand (scrape, live view, correlation).

use std::net::IpAddr;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap};
use probe_common::{DropKey, EgressKey, EgressValue, SuspectKey, stat};

use crate::event::{EgressRecord, Proto, Tag};

/// The per-CPU counter maps; values are summed over CPUs at read time.
pub struct Counters {
    pub suspects: PerCpuHashMap<MapData, SuspectKey, u64>,
    pub drops: PerCpuHashMap<MapData, DropKey, u64>,
    pub stats: PerCpuArray<MapData, u64>,
}

/// One summed read of every counter.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CounterSnapshot {
    /// (ifindex, tag, protocol) -> packets.
    pub suspects: Vec<(u32, Tag, Proto, u64)>,
    /// (reason code, source tag, destination tag) -> drops.
    pub drops: Vec<(u32, Option<Tag>, Option<Tag>, u64)>,
    pub budget_suppressed: u64,
    pub ringbuf_full: u64,
    pub dedup_suppressed: u64,
    pub emitted: u64,
    pub egress_recorded: u64,
    pub drops_matched: u64,
}

impl CounterSnapshot {
    /// Suspect packets of one tag, all interfaces and protocols.
    pub fn suspects_of(&self, tag: Tag) -> u64 {
        self.suspects
            .iter()
            .filter(|(_, t, _, _)| *t == tag)
            .map(|(.., n)| n)
            .sum()
    }
}

impl Counters {
    pub fn snapshot(&self) -> CounterSnapshot {
        let mut snap = CounterSnapshot::default();
        for item in self.suspects.iter().flatten() {
            let (key, values) = item;
            let Some(tag) = Tag::from_raw(key.tag) else {
                continue;
            };
            let total = values.iter().sum();
            snap.suspects
                .push((key.ifindex, tag, Proto::from_raw(key.proto), total));
        }
        snap.suspects
            .sort_by_key(|(i, t, p, _)| (*i, *t, p.as_str()));
        for item in self.drops.iter().flatten() {
            let (key, values) = item;
            snap.drops.push((
                key.reason,
                Tag::from_raw(key.src_tag),
                Tag::from_raw(key.dst_tag),
                values.iter().sum(),
            ));
        }
        snap.drops.sort();
        let stat = |index: u32| -> u64 {
            self.stats
                .get(&index, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        snap.budget_suppressed = stat(stat::BUDGET_SUPPRESSED);
        snap.ringbuf_full = stat(stat::RINGBUF_FULL);
        snap.dedup_suppressed = stat(stat::DEDUP_SUPPRESSED);
        snap.emitted = stat(stat::EMITTED);
        snap.egress_recorded = stat(stat::EGRESS_RECORDED);
        snap.drops_matched = stat(stat::DROPS_MATCHED);
        snap
    }
}

/// The LRU map of un-SNATed pod egress openers.
pub struct EgressTable {
    /// An LRU hash in the kernel; aya reads it as a plain hash map.
    pub map: BpfHashMap<MapData, EgressKey, EgressValue>,
}

impl EgressTable {
    /// Every recorded opener of `src` (bounded by the map size; read only for pod suspects).
    pub fn by_source(&self, src: IpAddr, nic_name: impl Fn(u32) -> String) -> Vec<EgressRecord> {
        let want = crate::kernel::reader::addr_bytes(src);
        self.map
            .iter()
            .flatten()
            .filter(|(k, _)| k.addr == want)
            .map(|(k, v)| EgressRecord {
                src,
                sport: k.port,
                dst: crate::kernel::reader::addr_from(k.family, v.daddr),
                dport: v.dport,
                proto: Proto::from_raw(k.proto),
                ts_ns: v.ts_ns,
                last_ns: (v.last_ns > v.ts_ns).then_some(v.last_ns),
                nic: nic_name(v.ifindex),
            })
            .collect()
    }
}
