//! Correlation at scale, measured (run by `cargo xtask bench`; needs root for the BPF maps).
//!
//! A full 65,536-entry egress table in real kernel maps (`EGRESS_FLOWS` and its per-source
//! index, created here as LRU hashes with the agent's sizes), then:
//! - per-suspect egress match time: the keyed look-up the agent answers with
//!   ([`EgressTable::by_source_and_keys`]: the source's index plus the exact look-up of the
//!   suspect's own flow key, here its oldest flow, beyond the index: both are paid, whether
//!   the LRU kept that flow or not) against
//!   the walk of the whole table it replaced ([`EgressTable::by_source_walk`]);
//! - a hairpin storm: a sender thread plays the kernel (records each pod's new egress flow in
//!   the map, then sends its hairpin `Suspect` and the `Drop` of the same 5-tuple into a
//!   4,096-event queue, the agent's reader queue size; a full queue loses the event, as the
//!   reader does) at a fixed rate over `--pods` pod addresses; the correlation thread runs
//!   the agent's loop: the correlator, egress queries answered from the map, conntrack
//!   answered "no entry" at once (the netlink round trip is not part of this figure).
//!
//! The loop stops 3 s after the storm at the latest. Prints one JSON object. Options: `--secs S` `--rate R` `--pods P` `--walk` (the storm
//! answers egress queries with the walk: the "before" figure) `--samples N`.
#![allow(
    clippy::print_stdout,
    reason = "a benchmark's measurement goes to stdout, where the bench reads it"
)]

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use clb_probe::{
    correlate::{Answer, Correlator, CorrelatorConfig, Output, Query},
    kernel::{codec::addr_bytes, counters::EgressTable},
};
use probe_common::{EgressKey, EgressValue, family};
use probe_contract::{
    LoopbackKind, Proto, Tag,
    record::{DropReason, KernelEvent, Packet, tcp_flags},
};

const TABLE: u32 = 65_536;
const SOURCES: u32 = 8192;
const QUEUE: usize = 4096;
const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const LB: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 80);
/// Every pod's first flow in the filled table (the index holds its latest 16 only; a full
/// LRU may already have evicted some).
const OLDEST_PORT: u16 = 10_000;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 244, 0, 0)) + 1 + n,
    ))
}

fn key(src: IpAddr, port: u16) -> EgressKey {
    EgressKey {
        addr: addr_bytes(src),
        port,
        proto: 6,
        family: family::V4,
    }
}

fn value(ts_ns: u64) -> EgressValue {
    EgressValue {
        daddr: addr_bytes(IpAddr::V4(LB)),
        dport: 80,
        ifindex: 1,
        ts_ns,
        last_ns: ts_ns,
        ..Default::default()
    }
}

fn now_ns() -> u64 {
    probe_contract::clock::monotonic_ns()
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A second handle on the same two kernel maps (the sender's, as the kernel has its own).
fn reopen(table: &EgressTable) -> EgressTable {
    use std::os::fd::AsFd as _;

    use aya::maps::IterableMap as _;
    fn dup<K: aya::Pod, V: aya::Pod>(m: &BpfHashMap<MapData, K, V>) -> BpfHashMap<MapData, K, V> {
        let fd = m.map().fd().as_fd().try_clone_to_owned().expect("dup");
        BpfHashMap::try_from(Map::HashMap(MapData::from_fd(fd).expect("map"))).expect("hash map")
    }
    EgressTable {
        map: dup(&table.map),
        sources: dup(&table.sources),
    }
}

/// An LRU hash map like the kernel's (aya creates standalone maps as plain hashes, which
/// refuse new keys once full: the storm's new flows must evict the oldest, as in the agent).
fn lru_hash<K: aya::Pod, V: aya::Pod>(max_entries: u32) -> BpfHashMap<MapData, K, V> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
    // `struct bpf_attr`'s map-create head (map_type, key_size, value_size, max_entries,
    // map_flags), the rest zero.
    let mut attr = [0u32; 32];
    attr[..5].copy_from_slice(&[
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<K>() as u32,
        size_of::<V>() as u32,
        max_entries,
        0,
    ]);
    // SAFETY: a zeroed bpf_attr of sufficient size with the create fields set.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_mut_ptr(),
            size_of_val(&attr) as u32,
        )
    };
    assert!(
        fd >= 0,
        "creating an LRU hash map (root?): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor owned from here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    BpfHashMap::try_from(Map::LruHashMap(MapData::from_fd(fd).expect("map")))
        .expect("an LRU hash map")
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

fn main() {
    let secs: f64 = arg("--secs", 5.0);
    let rate: f64 = arg("--rate", 10_000.0);
    let pods: u32 = arg("--pods", 1000);
    let samples: usize = arg("--samples", 200);
    let walk = std::env::args().any(|a| a == "--walk");

    let mut table = EgressTable {
        map: lru_hash(TABLE),
        sources: lru_hash(SOURCES),
    };
    // Fill: every pod's flows round-robin until the table is full (65 or 66 per pod).
    let t0 = now_ns();
    for i in 0..TABLE {
        let src = pod(i % pods);
        table
            .record(key(src, OLDEST_PORT + (i / pods) as u16), value(t0))
            .expect("filling the table");
    }
    let nic = |_: u32| "eth0".to_string();

    // Per-suspect match time, before (walk) and after (keyed).
    let time = |keyed: bool, n: usize| -> Vec<f64> {
        (0..n)
            .map(|i| {
                let src = pod((i as u32 * 7) % pods);
                let start = Instant::now();
                let records = if keyed {
                    table.by_source_and_keys(src, [(OLDEST_PORT, Proto::Tcp)], nic)
                } else {
                    table.by_source_walk(src, nic)
                };
                assert!(!records.is_empty());
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect()
    };
    let mut walk_us = time(false, samples.min(200));
    let mut keyed_us = time(true, samples * 50);

    // The storm.
    let (tx, rx) = mpsc::sync_channel::<KernelEvent>(QUEUE);
    let depth = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let mut sender_table = reopen(&table);
    let sender = {
        let (depth, lost) = (depth.clone(), lost.clone());
        std::thread::spawn(move || {
            let total = (secs * rate) as u64;
            let start = Instant::now();
            let mut sent = 0;
            for i in 0..total {
                let due = Duration::from_secs_f64(i as f64 / rate);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                let src = pod(i as u32 % pods);
                let sport = 20_000 + (i / u64::from(pods) % 40_000) as u16;
                let ts = now_ns();
                let _ = sender_table.record(key(src, sport), value(ts));
                let packet = Packet {
                    src,
                    dst: IpAddr::V4(NODE),
                    sport,
                    dport: 30_080,
                    proto: Proto::Tcp,
                    tcp_flags: tcp_flags::SYN,
                    src_tag: Some(Tag::Pod),
                    dst_tag: Some(Tag::Node),
                };
                let events = [
                    KernelEvent::Suspect {
                        ts_ns: ts,
                        nic: "eth0".into(),
                        packet: packet.clone(),
                    },
                    KernelEvent::Drop {
                        ts_ns: ts + 1000,
                        iface: Some("eth0".into()),
                        packet,
                        reason: DropReason {
                            code: 2,
                            name: "NETFILTER_DROP".into(),
                        },
                        location: None,
                        foreign_netns: false,
                    },
                ];
                for ev in events {
                    depth.fetch_add(1, Ordering::Relaxed);
                    if tx.try_send(ev).is_err() {
                        depth.fetch_sub(1, Ordering::Relaxed);
                        lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
                sent += 1;
            }
            (sent, start.elapsed())
        })
    };
    let mut correlator = Correlator::new(CorrelatorConfig::default());
    let (mut reports, mut hairpins, mut max_depth, mut events) = (0u64, 0u64, 0usize, 0u64);
    let cpu0 = thread_cpu_ns();
    let wall = Instant::now();
    let mut last_tick = Instant::now();
    // The loop stops 3 s after the storm at the latest (the walk never catches up); what is
    // still queued then is counted as not processed.
    let stop_at = Duration::from_secs_f64(secs + 3.0);
    while let Ok(ev) = rx.recv_timeout(stop_at.saturating_sub(wall.elapsed())) {
        max_depth = max_depth.max(depth.fetch_sub(1, Ordering::Relaxed));
        events += 1;
        let mut pending = correlator.ingest(ev);
        if last_tick.elapsed() > Duration::from_millis(250) {
            pending.extend(correlator.tick(now_ns()));
            last_tick = Instant::now();
        }
        while let Some(out) = pending.pop() {
            match out {
                Output::Report(r) => {
                    reports += 1;
                    hairpins += u64::from(r.event.kind == LoopbackKind::Hairpin);
                }
                Output::Query(Query::Egress { id, src, keys }) => {
                    let records = if walk {
                        table.by_source_walk(src, nic)
                    } else {
                        let keys = keys.iter().map(|k| (k.sport, k.proto));
                        table.by_source_and_keys(src, keys, nic)
                    };
                    pending.extend(correlator.answer(Answer::Egress { id, records }));
                }
                Output::Query(Query::Conntrack { id, .. }) => {
                    pending.extend(correlator.answer(Answer::Conntrack { id, entry: None }));
                }
                Output::Query(Query::Listener { id, .. }) => {
                    let listener = Ok(None);
                    pending.extend(correlator.answer(Answer::Listener { id, listener }));
                }
                // The storm sends no self-addressed drops.
                Output::Query(Query::SelfLoop { id, .. }) => {
                    pending.extend(correlator.answer(Answer::SelfLoop {
                        id,
                        conntrack: Ok(None),
                        facts: Default::default(),
                    }));
                }
                // The storm's table is read from rules, not the API: never asked.
                Output::Query(Query::Programmed { id, .. }) => {
                    pending.extend(correlator.answer(Answer::Programmed {
                        id,
                        read: Err("not in the storm".into()),
                    }));
                }
            }
        }
    }
    let loop_wall = wall.elapsed().as_secs_f64();
    let loop_cpu = (thread_cpu_ns() - cpu0) as f64 / 1e9;
    let unprocessed = rx.try_iter().count();
    let (sent, send_wall) = sender.join().expect("sender");
    let stats = correlator.stats();
    println!(
        "{}",
        serde_json::json!({
            "mode": if walk { "walk" } else { "keyed" },
            "pods": pods,
            "table_entries": TABLE,
            "rate": rate,
            "secs": secs,
            "suspects_sent": sent,
            "send_secs": send_wall.as_secs_f64(),
            "events_processed": events,
            "events_unprocessed_at_stop": unprocessed,
            "events_lost_queue_full": lost.load(Ordering::Relaxed),
            "reports": reports,
            "hairpin_confirmations": hairpins,
            "hairpin_no_egress": stats.hairpin_no_egress,
            "confirmations_per_s": hairpins as f64 / loop_wall,
            "loop_cpu_percent": 100.0 * loop_cpu / loop_wall,
            "max_queue_depth": max_depth,
            "walk_us_median": percentile(&mut walk_us, 0.5),
            "walk_us_p99": percentile(&mut walk_us, 0.99),
            "keyed_us_median": percentile(&mut keyed_us, 0.5),
            "keyed_us_p99": percentile(&mut keyed_us, 0.99),
        })
    );
}
