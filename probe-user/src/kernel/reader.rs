//! The ring buffer reader: records -> [`KernelEvent`]s on a bounded channel.
//!
//! The programs submit without waking us (waking per record costs an IPI per packet) except
//! for records that can confirm an event (drops), within a per-CPU wake-up budget, and when a
//! batch has built up. So the reader drains on readiness, which is what bounds detection
//! latency, and on a slower timer as a backstop for what was left without a wake-up.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use probe_common::{PacketEvent, kind};
use probe_contract::record::{DropReason, KernelEvent, KernelRecord};
use tokio::{io::unix::AsyncFd, sync::mpsc};
use tracing::warn;

use super::{DropReasons, codec, kallsyms::Kallsyms};

/// How often the reader drains the ring without a wake-up while it is quiet: the latency bound
/// of records the kernel left without one when nothing else is arriving.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How soon the reader drains again after a drain that found records: under a flood the
/// kernel's wake-up budget runs out, and this bounds the latency of what it left unannounced
/// (a timer in the agent, no interrupt on the packet's CPU). Back to [`POLL_INTERVAL`] after
/// a drain that found nothing.
pub const BUSY_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// ifindex -> name, kept current by the node sync.
pub type IfNames = Arc<RwLock<HashMap<u32, String>>>;

pub fn ifname(names: &IfNames, ifindex: u32) -> String {
    names
        .read()
        .ok()
        .and_then(|m| m.get(&ifindex).cloned())
        .unwrap_or_else(|| format!("if{ifindex}"))
}

/// Decodes raw records with this kernel's reason names and symbols.
pub struct Decoder {
    pub reasons: DropReasons,
    pub kallsyms: Kallsyms,
    pub ifnames: IfNames,
    /// Inode of the agent's network namespace (0: unknown, every drop counts as its own).
    pub netns: u32,
}

impl Decoder {
    /// Turns one record into a domain event; None for a record of unknown kind.
    pub fn decode(&self, raw: &PacketEvent) -> Option<KernelEvent> {
        let packet = codec::packet(raw);
        match raw.kind {
            kind::SUSPECT => Some(KernelEvent::Suspect {
                ts_ns: raw.ts_ns,
                nic: ifname(&self.ifnames, raw.ifindex),
                packet,
            }),
            kind::DROP => Some(KernelEvent::Drop {
                ts_ns: raw.ts_ns,
                iface: (raw.ifindex != 0).then(|| ifname(&self.ifnames, raw.ifindex)),
                foreign_netns: self.netns != 0 && raw.netns != 0 && raw.netns != self.netns,
                packet,
                reason: DropReason {
                    code: raw.reason,
                    name: self.reasons.name(raw.reason),
                },
                location: self.kallsyms.resolve(raw.location),
            }),
            kind::VIP_EGRESS => Some(KernelEvent::VipEgress {
                ts_ns: raw.ts_ns,
                nic: ifname(&self.ifnames, raw.ifindex),
                packet,
            }),
            _ => None,
        }
    }
}

/// Counts events the userspace queue had no room for (the correlator fell behind).
#[derive(Debug, Default)]
pub struct ReaderStats {
    pub read: AtomicU64,
    pub queue_full: AtomicU64,
}

/// Drains the ring buffer into `tx` until `tx` closes. Never blocks on a full queue: the
/// kernel counters stay exact, and the excess is counted in `stats.queue_full`.
pub async fn run(
    ring: RingBuf<MapData>,
    decoder: Decoder,
    tx: mpsc::Sender<KernelRecord>,
    stats: Arc<ReaderStats>,
) -> std::io::Result<()> {
    // SAFETY: the ring buffer's map fd is owned by `ring`, which the AsyncFd owns until it
    // is dropped; aya never swaps the fd under it.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }?;
    let mut next_poll = tokio::time::Instant::now() + POLL_INTERVAL;
    loop {
        let read = tokio::select! {
            guard = fd.readable_mut() => {
                let mut guard = guard?;
                // Readiness is cleared before draining: a wake-up that lands during the drain
                // stays pending, never lost between the last record read and the clear.
                guard.clear_ready();
                drain(guard.get_inner_mut(), &decoder, &tx, &stats)
            }
            () = tokio::time::sleep_until(next_poll) => drain(fd.get_mut(), &decoder, &tx, &stats),
            () = tx.closed() => return Ok(()),
        };
        let now = tokio::time::Instant::now();
        next_poll = if read > 0 {
            now + BUSY_POLL_INTERVAL
        } else if next_poll <= now {
            now + POLL_INTERVAL
        } else {
            next_poll
        };
    }
}

fn drain(
    ring: &mut RingBuf<MapData>,
    decoder: &Decoder,
    tx: &mpsc::Sender<KernelRecord>,
    stats: &ReaderStats,
) -> usize {
    let mut read = 0;
    while let Some(item) = ring.next() {
        let Some((raw, packet_bytes)) = codec::split_record(&item) else {
            warn!(len = item.len(), "short ring buffer record");
            continue;
        };
        drop(item);
        read += 1;
        stats.read.fetch_add(1, Ordering::Relaxed);
        if let Some(event) = decoder.decode(&raw)
            && tx
                .try_send(KernelRecord {
                    event,
                    packet_bytes,
                })
                .is_err()
        {
            stats.queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use probe_common::family;
    use probe_contract::Tag;

    use super::*;

    fn decoder() -> Decoder {
        let mut names = HashMap::new();
        names.insert(2, "eth0".to_string());
        Decoder {
            reasons: DropReasons::from_pairs([(89, "IP_LOCAL_SOURCE".to_string())]),
            kallsyms: Kallsyms::parse("ffffffff81a00000 t ip_rcv_finish_core.constprop.0\n"),
            ifnames: Arc::new(RwLock::new(names)),
            netns: 4026531840,
        }
    }

    /// A record of `kind` and address `family`, the rest zero.
    fn record(kind: u8, family: u8) -> PacketEvent {
        PacketEvent {
            kind,
            family,
            ..Default::default()
        }
    }

    #[test]
    fn decodes_a_drop_record() {
        let mut raw = PacketEvent {
            kind: kind::DROP,
            family: family::V4,
            proto: 6,
            reason: 89,
            ifindex: 2,
            location: 0xffffffff81a001ab,
            sport: 40000,
            dport: 30080,
            src_tag: probe_common::tag::VIP,
            tcp_flags: 0x02,
            ..Default::default()
        };
        raw.saddr[..4].copy_from_slice(&[203, 0, 113, 10]);
        raw.daddr[..4].copy_from_slice(&[198, 18, 0, 2]);
        let KernelEvent::Drop {
            iface,
            packet,
            reason,
            location,
            ..
        } = decoder().decode(&raw).unwrap()
        else {
            panic!("not a drop");
        };
        assert_eq!(iface.as_deref(), Some("eth0"));
        assert_eq!(packet.src, "203.0.113.10".parse::<IpAddr>().unwrap());
        assert_eq!(packet.dst, "198.18.0.2".parse::<IpAddr>().unwrap());
        assert_eq!((packet.sport, packet.dport), (40000, 30080));
        assert_eq!(packet.src_tag, Some(Tag::Vip));
        assert_eq!(packet.dst_tag, None);
        assert_eq!(reason.name, "IP_LOCAL_SOURCE");
        assert_eq!(
            location.as_deref(),
            Some("ip_rcv_finish_core.constprop.0+0x1ab")
        );
    }

    #[test]
    fn a_drop_in_another_namespace_is_foreign_and_names_no_interface() {
        let raw = PacketEvent {
            netns: 4026532999,
            ..record(kind::DROP, family::V4)
        };
        let ev = decoder().decode(&raw).unwrap();
        assert!(matches!(
            ev,
            KernelEvent::Drop {
                foreign_netns: true,
                iface: None,
                ..
            }
        ));
        let own = PacketEvent {
            netns: 4026531840,
            ifindex: 2,
            ..raw
        };
        assert!(matches!(
            decoder().decode(&own).unwrap(),
            KernelEvent::Drop {
                foreign_netns: false,
                ..
            }
        ));
    }

    #[test]
    fn unknown_kind_and_ifindex_are_handled() {
        let raw = PacketEvent {
            kind: 99,
            ..Default::default()
        };
        assert!(decoder().decode(&raw).is_none());
        let raw = PacketEvent {
            ifindex: 7,
            ..record(kind::SUSPECT, family::V6)
        };
        let ev = decoder().decode(&raw).unwrap();
        assert!(matches!(ev, KernelEvent::Suspect { ref nic, .. } if nic == "if7"));
        assert!(ev.packet().src.is_ipv6());
    }
}
