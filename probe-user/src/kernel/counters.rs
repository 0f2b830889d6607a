//! Exact kernel counters and the egress LRU, read on demand (scrape, live view, correlation).

use std::net::IpAddr;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap};
use probe_common::{
    DropKey, EgressKey, EgressSourceFlows, EgressSourceKey, EgressValue, SuspectKey, budget, kind,
    stat, tag,
};
use probe_contract::{Proto, Tag, record::EgressRecord};

/// The per-CPU counter maps; values are summed over CPUs at read time.
pub struct Counters {
    pub suspects: PerCpuHashMap<MapData, SuspectKey, u64>,
    pub drops: PerCpuHashMap<MapData, DropKey, u64>,
    pub stats: PerCpuArray<MapData, u64>,
}

use probe_contract::CounterSnapshot;

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
        snap.budget_suppressed_by_class = BUDGET_CLASSES
            .iter()
            .map(|&(kind, record, src_tag)| {
                let source = Tag::from_raw(src_tag).map_or("other", Tag::as_str);
                let slot = stat::BUDGET_SUPPRESSED_BY_CLASS + budget::class(kind, src_tag) as u32;
                (record.to_string(), source.to_string(), stat(slot))
            })
            .collect();
        snap.ringbuf_full = stat(stat::RINGBUF_FULL);
        snap.dedup_suppressed = stat(stat::DEDUP_SUPPRESSED);
        snap.emitted = stat(stat::EMITTED);
        snap.egress_recorded = stat(stat::EGRESS_RECORDED);
        snap.drops_matched = stat(stat::DROPS_MATCHED);
        snap.wakeups = stat(stat::WAKEUPS);
        snap.wakeup_budget_suppressed = stat(stat::WAKEUP_BUDGET_SUPPRESSED);
        snap
    }
}

/// The budget classes the kernel emits: (kind, record name as in `--record`, source tag).
/// A drop's source tag is `NONE` when only its destination (a bound VIP) matched.
const BUDGET_CLASSES: [(u8, &str, u8); 8] = [
    (kind::SUSPECT, "suspect", tag::NODE),
    (kind::SUSPECT, "suspect", tag::VIP),
    (kind::SUSPECT, "suspect", tag::POD),
    (kind::DROP, "drop", tag::NODE),
    (kind::DROP, "drop", tag::VIP),
    (kind::DROP, "drop", tag::POD),
    (kind::DROP, "drop", tag::NONE),
    (kind::VIP_EGRESS, "vip_egress", tag::VIP),
];

/// The LRU map of un-SNATed pod egress openers, and its per-source index.
///
/// A pod suspect's egress match is a keyed look-up, never a walk: the kernel keeps, beside
/// `EGRESS_FLOWS` ((source, sport, proto) -> opener), `EGRESS_SOURCES` (source -> the latest
/// [`probe_common::EGRESS_SOURCE_SLOTS`] flow keys it recorded), written in the same place a new record is
/// written (one more update per new flow, none per packet). [`EgressTable::by_source`] reads
/// the index and then each flow: at most 1 + 16 look-ups (plus one per carried key, below)
/// whatever the table holds (measured in `cargo xtask bench`, correlation at scale: the
/// 16-syscall batched walk of a full table it replaces cost milliseconds per suspect). Chosen over keying the flow map by source (a
/// fixed array per source would cap every pod's flows, and the per-flow retransmit refresh
/// would have to scan it) and over a userspace index (the records never leave the kernel).
///
/// The index holds a source's latest 16 records; older flows of a busy pod drop out of it.
/// A layer-4 match is exact anyway: the query carries the suspects' own (source port,
/// protocol) keys and [`EgressTable::by_source_and_keys`] adds the exact `EGRESS_FLOWS`
/// look-up of each (one more look-up per key), so the very flow is found however many the pod
/// opened since (or when two CPUs recording one source at once overwrote its slot). Layer 7
/// has no key to look up and reads the index (see `correlate::hairpin`).
/// [`EgressTable::by_source_walk`] (the former walk) answers exactly what
/// [`EgressTable::by_source`] does when a source has no more than 16 flows in the table
/// (tested on a full real map).
pub struct EgressTable {
    /// An LRU hash in the kernel; aya reads it as a plain hash map.
    pub map: BpfHashMap<MapData, EgressKey, EgressValue>,
    /// `EGRESS_SOURCES`, the per-source index (an LRU hash too).
    pub sources: BpfHashMap<MapData, EgressSourceKey, EgressSourceFlows>,
}

/// Entries per `BPF_MAP_LOOKUP_BATCH` call: a full 65,536-entry table in 16 syscalls (a hash
/// bucket never holds more than this, so the kernel never answers ENOSPC).
const EGRESS_BATCH: usize = 4096;

impl EgressTable {
    /// Every recorded opener of `src` the index still names (read only for pod suspects),
    /// oldest first: one look-up of the index, one per flow in it.
    pub fn by_source(&self, src: IpAddr, nic_name: impl Fn(u32) -> String) -> Vec<EgressRecord> {
        let addr = crate::kernel::codec::addr_bytes(src);
        let family = crate::kernel::codec::family_of(src);
        let source = EgressSourceKey {
            addr,
            family,
            _pad: [0; 3],
        };
        let Ok(ring) = self.sources.get(&source, 0) else {
            return Vec::new();
        };
        let mut slots: Vec<u32> = ring.flows.iter().copied().filter(|s| *s != 0).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut out: Vec<EgressRecord> = slots
            .into_iter()
            .filter_map(|slot| {
                let key = EgressKey {
                    addr,
                    port: (slot >> 8) as u16,
                    proto: slot as u8,
                    family,
                };
                let value = self.map.get(&key, 0).ok()?;
                Some(egress_record(src, &key, &value, &nic_name))
            })
            .collect();
        out.sort_by_key(|r| (r.ts_ns, r.sport));
        out
    }

    /// What an egress query is answered with: [`EgressTable::by_source`] plus the exact
    /// `EGRESS_FLOWS` entry of each `(source port, protocol)` in `keys` that the index did not
    /// name (one look-up each), oldest first. The suspects' own flows are answered whatever
    /// the source's flow count.
    pub fn by_source_and_keys(
        &self,
        src: IpAddr,
        keys: impl IntoIterator<Item = (u16, Proto)>,
        nic_name: impl Fn(u32) -> String,
    ) -> Vec<EgressRecord> {
        let mut out = self.by_source(src, &nic_name);
        let indexed = out.len();
        let mut answered: std::collections::HashSet<(u16, Proto)> =
            out.iter().map(|r| (r.sport, r.proto)).collect();
        for (sport, proto) in keys {
            if answered.insert((sport, proto))
                && let Some(record) = self.by_key(src, sport, proto, &nic_name)
            {
                out.push(record);
            }
        }
        if out.len() > indexed {
            out.sort_by_key(|r| (r.ts_ns, r.sport));
        }
        out
    }

    /// The `EGRESS_FLOWS` entry of one flow key: a single map look-up.
    pub fn by_key(
        &self,
        src: IpAddr,
        sport: u16,
        proto: Proto,
        nic_name: impl Fn(u32) -> String,
    ) -> Option<EgressRecord> {
        let key = EgressKey {
            addr: crate::kernel::codec::addr_bytes(src),
            port: sport,
            proto: proto.to_raw(src.is_ipv6()),
            family: crate::kernel::codec::family_of(src),
        };
        let value = self.map.get(&key, 0).ok()?;
        Some(egress_record(src, &key, &value, &nic_name))
    }

    /// Writes one record the way `clb_egress` writes a new flow: the flow, then its slot in
    /// its source's ring (for tests and benchmarks that fill a table from userspace).
    pub fn record(
        &mut self,
        key: EgressKey,
        value: EgressValue,
    ) -> Result<(), aya::maps::MapError> {
        self.map.insert(key, value, 0)?;
        let source = EgressSourceKey {
            addr: key.addr,
            family: key.family,
            _pad: [0; 3],
        };
        let mut ring = self.sources.get(&source, 0).unwrap_or_default();
        ring.flows[ring.next as usize % ring.flows.len()] =
            EgressSourceFlows::slot(key.port, key.proto);
        ring.next = ring.next.wrapping_add(1);
        self.sources.insert(source, ring, 0)
    }

    /// Every recorded opener of `src` by walking the whole table (the look-up before the
    /// index; kept to check [`EgressTable::by_source`] and to measure what it saves). The
    /// table is read in batches of [`EGRESS_BATCH`] entries per syscall
    /// (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+); kernels without them walk entry by entry.
    pub fn by_source_walk(
        &self,
        src: IpAddr,
        nic_name: impl Fn(u32) -> String,
    ) -> Vec<EgressRecord> {
        let want = crate::kernel::codec::addr_bytes(src);
        let mut out = Vec::new();
        let result = self.for_each_batch(|k, v| {
            if k.addr == want {
                out.push(egress_record(src, k, v, &nic_name));
            }
        });
        if result.is_err() {
            out = self
                .map
                .iter()
                .flatten()
                .filter(|(k, _)| k.addr == want)
                .map(|(k, v)| egress_record(src, &k, &v, &nic_name))
                .collect();
        }
        out.sort_by_key(|r| (r.ts_ns, r.sport));
        out
    }

    /// Calls `f` on every entry, [`EGRESS_BATCH`] entries per syscall; the number of
    /// syscalls made. An error before the first entry (no batch support): the caller walks.
    pub fn for_each_batch(
        &self,
        mut f: impl FnMut(&EgressKey, &EgressValue),
    ) -> std::io::Result<usize> {
        use std::os::fd::{AsFd as _, AsRawFd as _};

        use aya::maps::IterableMap as _;

        /// `struct bpf_attr`'s `batch` member (include/uapi/linux/bpf.h).
        #[repr(C)]
        #[derive(Default)]
        struct BatchAttr {
            in_batch: u64,
            out_batch: u64,
            keys: u64,
            values: u64,
            count: u32,
            map_fd: u32,
            elem_flags: u64,
            flags: u64,
        }
        const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

        let fd = self.map.map().fd().as_fd().as_raw_fd();
        let mut keys = vec![EgressKey::default(); EGRESS_BATCH];
        let mut values = vec![EgressValue::default(); EGRESS_BATCH];
        // The hash map's batch token is a bucket index (u32); room for more, to be safe.
        let mut token_in = [0u64; 2];
        let mut token_out = [0u64; 2];
        let mut calls = 0;
        let mut first = true;
        loop {
            let mut attr = BatchAttr {
                in_batch: if first { 0 } else { token_in.as_ptr() as u64 },
                out_batch: token_out.as_mut_ptr() as u64,
                keys: keys.as_mut_ptr() as u64,
                values: values.as_mut_ptr() as u64,
                count: EGRESS_BATCH as u32,
                map_fd: fd as u32,
                ..Default::default()
            };
            // SAFETY: `attr` points at buffers of `count` keys and values of the map's sizes
            // (aya checked them when the map was opened) and at two batch tokens.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_MAP_LOOKUP_BATCH,
                    &mut attr as *mut BatchAttr,
                    size_of::<BatchAttr>() as u32,
                )
            };
            calls += 1;
            let error = (rc < 0).then(std::io::Error::last_os_error);
            let n = (attr.count as usize).min(EGRESS_BATCH);
            if error
                .as_ref()
                .is_some_and(|e| e.raw_os_error() != Some(libc::ENOENT))
            {
                return Err(error.unwrap_or_else(std::io::Error::last_os_error));
            }
            for i in 0..n {
                f(&keys[i], &values[i]);
            }
            // ENOENT: the last batch (possibly with entries) was returned.
            if error.is_some() {
                return Ok(calls);
            }
            token_in = token_out;
            first = false;
        }
    }
}

/// One `EGRESS_FLOWS` entry as the correlator reads it.
fn egress_record(
    src: IpAddr,
    k: &EgressKey,
    v: &EgressValue,
    nic_name: &impl Fn(u32) -> String,
) -> EgressRecord {
    EgressRecord {
        src,
        sport: k.port,
        dst: crate::kernel::codec::addr_from(k.family, v.daddr),
        dport: v.dport,
        proto: Proto::from_raw(k.proto),
        ts_ns: v.ts_ns,
        last_ns: (v.last_ns > v.ts_ns).then_some(v.last_ns),
        nic: nic_name(v.ifindex),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    /// Whether the test can create BPF maps (root); it says it skips otherwise.
    fn can_create_maps() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() == 0 };
        if !root {
            eprintln!("skipped: needs root (creates BPF maps)");
        }
        root
    }

    fn source_key(addr: IpAddr) -> EgressSourceKey {
        EgressSourceKey {
            addr: crate::kernel::codec::addr_bytes(addr),
            family: crate::kernel::codec::family_of(addr),
            _pad: [0; 3],
        }
    }

    /// Records a flow the way `clb_egress` does: the flow, then its slot in the source's ring.
    fn record(table: &mut EgressTable, src: IpAddr, port: u16, proto: u8, ts_ns: u64) {
        let source = source_key(src);
        let key = EgressKey {
            addr: source.addr,
            port,
            proto,
            family: source.family,
        };
        let dst = match src {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(203, 0, 113, port as u8)),
            IpAddr::V6(_) => "2001:db8::443".parse().expect("an address"),
        };
        let value = EgressValue {
            daddr: crate::kernel::codec::addr_bytes(dst),
            dport: 443,
            ifindex: 1,
            ts_ns,
            last_ns: ts_ns + u64::from(port % 3),
            ..Default::default()
        };
        table.record(key, value).expect("recording a flow");
    }

    fn real_table(flows: u32, sources: u32) -> EgressTable {
        EgressTable {
            map: BpfHashMap::create(flows, 0).expect("creating a BPF hash map"),
            sources: BpfHashMap::create(sources, 0).expect("creating a BPF hash map"),
        }
    }

    /// A source with more flows than its ring of 16 holds (see [`with_a_busy_source`]), and
    /// another.
    const BUSY: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 9));
    const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 10));

    /// Real maps for 1,024 flows holding [`BUSY`]'s 40 flows: TCP ports 50,000 to 50,039,
    /// recorded at 1 to 40 ns. None where the test cannot create maps.
    fn with_a_busy_source() -> Option<EgressTable> {
        if !can_create_maps() {
            return None;
        }
        let mut table = real_table(1024, 64);
        for port in 0..40u16 {
            record(&mut table, BUSY, 50_000 + port, 6, u64::from(port) + 1);
        }
        Some(table)
    }

    /// A full 65,536-entry table in real kernel maps (4,095 IPv4 pods and one IPv6 pod, 16
    /// flows each, TCP and UDP, some rings wrapped): the keyed look-up answers
    /// exactly what the walk of the whole table answers, for every sampled source.
    #[test]
    fn keyed_egress_lookup_answers_what_the_walk_answers() {
        if !can_create_maps() {
            return;
        }
        let mut table = real_table(65_536, 8192);
        let pod = |n: u32| IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + n));
        let v6: IpAddr = "fd00:10:244::7".parse().expect("an address");
        let sources: Vec<IpAddr> = (1..4096).map(pod).chain([v6]).collect();
        let mut ts = 0;
        for (n, src) in sources.iter().enumerate() {
            // Some sources recorded a flow before (its port opened again since, to a new
            // destination): their ring has wrapped once.
            if n % 7 == 0 {
                ts += 1;
                record(&mut table, *src, 40_015, 6, ts);
            }
            for port in 0..16u16 {
                ts += 1;
                let proto = if port % 4 == 0 { 17 } else { 6 };
                record(&mut table, *src, 40_000 + port, proto, ts);
            }
        }
        let mut seen = 0;
        table
            .for_each_batch(|_, _| seen += 1)
            .expect("batch look-up");
        assert_eq!(seen, 65_536, "the table is full");
        let nic = |i: u32| format!("nic{i}");
        for src in sources.iter().step_by(97).chain([&v6]) {
            let keyed = table.by_source(*src, nic);
            assert_eq!(keyed.len(), 16, "{src}");
            assert_eq!(keyed, table.by_source_walk(*src, nic), "{src}");
        }
        let absent = IpAddr::V4(Ipv4Addr::new(10, 245, 0, 1));
        assert!(table.by_source(absent, nic).is_empty());
        assert!(table.by_source_walk(absent, nic).is_empty());
    }

    /// The index's bound: a source with more flows than the ring holds is answered by the
    /// index with its latest 16 (each exactly as the walk reads it), never with another
    /// source's flows; a flow recorded twice (its port reused) is answered once, as it is now.
    #[test]
    fn keyed_egress_lookup_answers_a_busy_source_with_its_latest_flows() {
        let Some(mut table) = with_a_busy_source() else {
            return;
        };
        record(&mut table, OTHER, 50_001, 6, 100);
        record(&mut table, OTHER, 50_001, 6, 101);
        let walk = table.by_source_walk(BUSY, |_| String::new());
        let keyed = table.by_source(BUSY, |_| String::new());
        assert_eq!(walk.len(), 40);
        assert_eq!(keyed, walk[24..]);
        let quiet_flows = table.by_source(OTHER, |_| String::new());
        assert_eq!(quiet_flows, table.by_source_walk(OTHER, |_| String::new()));
        assert_eq!(quiet_flows.len(), 1);
        assert_eq!(quiet_flows[0].ts_ns, 101);
    }

    /// Past the index: a source with 40 flows in real kernel maps. Its 1st (oldest) flow is
    /// not named by the index, and is answered by its exact key beside the index's 16; a key
    /// the index already names is answered once; a key the source never opened, or the same
    /// port of another protocol, adds nothing.
    #[test]
    fn a_carried_flow_key_is_answered_beyond_the_index() {
        let Some(mut table) = with_a_busy_source() else {
            return;
        };
        record(&mut table, OTHER, 50_000, 6, 100);
        let nic = |_: u32| String::new();
        let walk = table.by_source_walk(BUSY, nic);
        let first = walk[0].clone();
        assert_eq!((first.sport, first.ts_ns), (50_000, 1));
        let index = table.by_source(BUSY, nic);
        assert!(
            !index.contains(&first),
            "the index alone names the 1st flow"
        );
        let exact = table.by_source_and_keys(BUSY, [(50_000, Proto::Tcp)], nic);
        let mut want = vec![first.clone()];
        want.extend(index.iter().cloned());
        assert_eq!(exact, want);
        // Already in the index, never opened, another protocol: the index's answer alone.
        let keys = [
            (50_039, Proto::Tcp),
            (50_039, Proto::Tcp),
            (60_000, Proto::Tcp),
            (50_000, Proto::Udp),
        ];
        assert_eq!(table.by_source_and_keys(BUSY, keys, nic), index);
        assert_eq!(
            table.by_key(BUSY, 50_000, Proto::Tcp, nic),
            Some(first.clone())
        );
        assert_eq!(
            table
                .by_key(OTHER, 50_000, Proto::Tcp, nic)
                .map(|r| r.ts_ns),
            Some(100)
        );
        assert!(
            table
                .by_key(
                    IpAddr::V4(Ipv4Addr::new(10, 244, 1, 11)),
                    50_000,
                    Proto::Tcp,
                    nic
                )
                .is_none()
        );
    }

    /// A full 65,536-entry table (256 pods x 256 ports) in a real kernel hash map: a pod's
    /// openers are answered exactly, in 17 syscalls or fewer (the per-entry walk took 131,072).
    #[test]
    fn full_egress_table_is_read_in_batches() {
        if !can_create_maps() {
            return;
        }
        let mut map = BpfHashMap::<MapData, EgressKey, EgressValue>::create(65_536, 0)
            .expect("creating a BPF hash map");
        let pod = |n: u8| IpAddr::V4(Ipv4Addr::new(10, 244, 1, n));
        for n in 0..=255u8 {
            for port in 0..256u16 {
                let key = EgressKey {
                    addr: crate::kernel::codec::addr_bytes(pod(n)),
                    port: 30_000 + port,
                    proto: 6,
                    family: probe_common::family::V4,
                };
                let value = EgressValue {
                    daddr: crate::kernel::codec::addr_bytes(IpAddr::V4(Ipv4Addr::new(
                        203, 0, 113, n,
                    ))),
                    dport: 443,
                    ts_ns: u64::from(port),
                    last_ns: u64::from(port),
                    ..Default::default()
                };
                map.insert(key, value, 0).expect("inserting");
            }
        }
        let table = EgressTable {
            map,
            sources: BpfHashMap::create(16, 0).expect("creating a BPF hash map"),
        };
        let mut seen = 0;
        let calls = table
            .for_each_batch(|_, _| seen += 1)
            .expect("batch look-up");
        assert_eq!(seen, 65_536);
        assert!(calls <= 17, "{calls} syscalls for a full table");
        let records = table.by_source_walk(pod(77), |_| "nic0".into());
        assert_eq!(records.len(), 256);
        let mut ports: Vec<u16> = records.iter().map(|r| r.sport).collect();
        ports.sort_unstable();
        assert_eq!(ports, (30_000..30_256).collect::<Vec<_>>());
        assert!(records.iter().all(|r| r.src == pod(77)
            && r.dst == IpAddr::V4(Ipv4Addr::new(203, 0, 113, 77))
            && r.dport == 443
            && r.ts_ns == u64::from(r.sport - 30_000)));
        assert!(
            table
                .by_source_walk(IpAddr::V4(Ipv4Addr::new(10, 244, 2, 1)), |_| String::new())
                .is_empty()
        );
    }
}
