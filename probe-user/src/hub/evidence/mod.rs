//! The evidence of each confirmed loop: its first packets with their first bytes (what the
//! kernel copied into the records, `--capture-bytes`), kept per loop and served as pcapng
//! and JSON on the HTTP port (`GET /evidence`, `crate::sink::metrics::endpoint`). It lives in
//! the hub because two sides share it: the correlation loop fills it, the HTTP surface reads
//! it through its [`super::View`].
//!
//! Pure data, no clock and no I/O: the correlation loop hands every record that carries
//! packet bytes to [`EvidenceStore::packet`] (kept a short while in `recent`) and every
//! published confirmation to [`EvidenceStore::confirmed`], which moves the recent packets of
//! that loop's flow into the loop's ring. Which packets are the loop's: the correlator pairs
//! kernel events by their tuples, so the same tuples select them here ([`belongs`]): the
//! packet's source is the looping packet's source (a drop after DNAT keeps it), or the
//! packet answers it; recorded no earlier than [`MATCH_WINDOW_NS`] before the confirmation's
//! latest occurrence. The correlator itself is left as it is: it carries no bytes.
//!
//! Bounds: [`RECENT_MAX`] recent packets; [`MAX_LOOPS`] loops of at most
//! [`PACKETS_PER_LOOP`] packets, each at most `probe_common::CAPTURE_MAX` (128) bytes: about
//! 512 KiB of packet bytes at most, plus the packets' names and each loop's latest event.

pub mod pcapng;

use std::collections::{HashMap, VecDeque};

use probe_contract::{
    LoopbackEvent,
    evidence::{
        EvidenceBundle, EvidenceIndex, Hook, LoopSummary, MAX_LOOPS, PACKETS_PER_LOOP,
        PacketSummary,
    },
    record::{KernelEvent, KernelRecord},
};

/// Recent packets waiting for a confirmation (the correlator confirms within seconds).
pub const RECENT_MAX: usize = 1024;
/// How long before a confirmation's latest occurrence its packets may have been recorded:
/// the correlator's longest wait between the first event of a loop and its confirmation
/// (hairpin's settle time and query answers) stays well under it.
pub const MATCH_WINDOW_NS: u64 = 10_000_000_000;

/// `--evidence`: what `GET /evidence` serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EvidenceMode {
    /// No evidence kept or served (the kernel may still copy bytes: `--capture-bytes 0` stops
    /// that).
    Off,
    /// The packets' headers: IP and TCP/UDP headers as captured, every payload byte zeroed
    /// (addresses and ports are what a loop is about; payload may hold application data).
    #[default]
    Headers,
    /// The captured bytes as they are, payload included.
    Full,
}

impl EvidenceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceMode::Off => "off",
            EvidenceMode::Headers => "headers",
            EvidenceMode::Full => "full",
        }
    }
}

/// One kept packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPacket {
    pub summary: PacketSummary,
    /// From the IP header on.
    pub bytes: Vec<u8>,
}

/// One loop's evidence.
#[derive(Clone, Debug)]
pub struct LoopEvidence {
    pub id: String,
    /// Order of first confirmation (eviction: the lowest goes).
    seq: u64,
    /// The latest confirmation.
    pub event: LoopbackEvent,
    pub packets: Vec<StoredPacket>,
}

/// See the [module documentation](self).
#[derive(Debug)]
pub struct EvidenceStore {
    mode: EvidenceMode,
    recent: VecDeque<StoredPacket>,
    loops: HashMap<String, LoopEvidence>,
    next_seq: u64,
}

impl EvidenceStore {
    pub fn new(mode: EvidenceMode) -> Self {
        Self {
            mode,
            recent: VecDeque::new(),
            loops: HashMap::new(),
            next_seq: 0,
        }
    }

    pub fn mode(&self) -> EvidenceMode {
        self.mode
    }

    /// A record from the kernel: kept among the recent packets when it carries bytes.
    pub fn packet(&mut self, record: &KernelRecord) {
        if self.mode == EvidenceMode::Off || record.packet_bytes.is_empty() {
            return;
        }
        if self.recent.len() >= RECENT_MAX {
            self.recent.pop_front();
        }
        let mut bytes = record.packet_bytes.clone();
        if self.mode == EvidenceMode::Headers {
            zero_payload(&mut bytes);
        }
        self.recent.push_back(StoredPacket {
            summary: summary(&record.event, bytes.len()),
            bytes,
        });
    }

    /// A published confirmation: its loop's ring takes the recent packets that belong to it
    /// (up to [`PACKETS_PER_LOOP`], first come first kept) and its latest event.
    pub fn confirmed(&mut self, event: &LoopbackEvent) {
        if self.mode == EvidenceMode::Off {
            return;
        }
        let id = loop_id(&event.key);
        if !self.loops.contains_key(&id)
            && self.loops.len() >= MAX_LOOPS
            && let Some(oldest) = self
                .loops
                .values()
                .min_by_key(|l| l.seq)
                .map(|l| l.id.clone())
        {
            self.loops.remove(&oldest);
        }
        let seq = self.next_seq;
        let entry = self
            .loops
            .entry(id.clone())
            .or_insert_with(|| LoopEvidence {
                id,
                seq,
                event: event.clone(),
                packets: Vec::new(),
            });
        if entry.seq == seq {
            self.next_seq += 1;
        }
        entry.event = event.clone();
        for p in &self.recent {
            if entry.packets.len() >= PACKETS_PER_LOOP {
                break;
            }
            if belongs(event, &p.summary)
                && !entry
                    .packets
                    .iter()
                    .any(|k| k.summary.ts_ns == p.summary.ts_ns && k.summary.hook == p.summary.hook)
            {
                entry.packets.push(p.clone());
            }
        }
        entry.packets.sort_by_key(|p| p.summary.ts_ns);
    }

    /// `GET /evidence`: the loops, latest confirmed first.
    pub fn index(&self, node: Option<&str>) -> EvidenceIndex {
        let mut loops: Vec<&LoopEvidence> = self.loops.values().collect();
        loops.sort_by_key(|l| std::cmp::Reverse(l.event.last_seen_ns));
        EvidenceIndex {
            node: node.map(str::to_string),
            mode: self.mode.as_str().to_string(),
            loops: loops
                .into_iter()
                .map(|l| LoopSummary {
                    id: l.id.clone(),
                    key: l.event.key.clone(),
                    kind: l.event.kind,
                    service: l.event.service.clone(),
                    count: l.event.count,
                    packets: l.packets.len(),
                })
                .collect(),
        }
    }

    pub fn get(&self, id: &str) -> Option<&LoopEvidence> {
        self.loops.get(id)
    }

    /// `GET /evidence/{id}`: the loop's JSON bundle; `check`: the node's latest risks, of
    /// which those naming the loop's Service are kept.
    pub fn bundle(
        &self,
        id: &str,
        node: Option<&str>,
        check: &[probe_contract::report::RiskStatus],
    ) -> Option<EvidenceBundle> {
        let l = self.loops.get(id)?;
        let (conntrack, rules) = cited(&l.event.evidence);
        // The event may name the Service with its port (`namespace/name:port`); a risk names
        // it without.
        let check = match l
            .event
            .service
            .as_deref()
            .map(|s| s.split(':').next().unwrap_or(s))
        {
            Some(svc) => check
                .iter()
                .filter(|r| {
                    r.services.iter().any(|s| s == svc) || r.service.as_deref() == Some(svc)
                })
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        Some(EvidenceBundle {
            id: l.id.clone(),
            node: node.map(str::to_string),
            capture: format!("/evidence/{}/capture.pcapng", l.id),
            event: l.event.clone(),
            packets: l.packets.iter().map(|p| p.summary.clone()).collect(),
            conntrack,
            rules,
            check,
        })
    }
}

/// A loop's id in URLs: 16 hex digits of FNV-1a over its key (stable across restarts, no
/// slashes or brackets to escape).
pub fn loop_id(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Whether a recorded packet is part of the loop `event` confirms (see the module
/// documentation): same protocol, recorded within the window, and from the looping packet's
/// source (before or after DNAT) or answering it.
pub fn belongs(event: &LoopbackEvent, p: &PacketSummary) -> bool {
    if p.proto != event.proto
        || p.ts_ns.saturating_add(MATCH_WINDOW_NS) < event.last_seen_ns
        || p.ts_ns > event.last_seen_ns.saturating_add(MATCH_WINDOW_NS)
    {
        return false;
    }
    let from_source = p.src == event.src && p.sport == event.src_port;
    let answering = p.dst == event.src && p.dport == event.src_port;
    from_source || answering
}

/// The evidence lines that cite conntrack entries, and those that cite rules.
fn cited(evidence: &[String]) -> (Vec<String>, Vec<String>) {
    let conntrack: Vec<String> = evidence
        .iter()
        .filter(|l| l.starts_with("conntrack"))
        .cloned()
        .collect();
    let rules = evidence
        .iter()
        .filter(|l| !l.starts_with("conntrack"))
        .filter(|l| {
            ["rule", "KUBE-", "nftables", "ipset", "IPVS", "chain"]
                .iter()
                .any(|w| l.contains(w))
        })
        .cloned()
        .collect();
    (conntrack, rules)
}

fn summary(event: &KernelEvent, captured: usize) -> PacketSummary {
    let (hook, iface, drop_reason) = match event {
        KernelEvent::Suspect { nic, .. } => (Hook::TcIngress, Some(nic.clone()), None),
        KernelEvent::VipEgress { nic, .. } => (Hook::TcEgress, Some(nic.clone()), None),
        KernelEvent::Drop { iface, reason, .. } => {
            (Hook::KfreeSkb, iface.clone(), Some(reason.name.clone()))
        }
    };
    let p = event.packet();
    PacketSummary {
        ts_ns: event.ts_ns(),
        hook,
        iface,
        drop_reason,
        src: p.src,
        sport: p.sport,
        dst: p.dst,
        dport: p.dport,
        proto: p.proto,
        captured,
    }
}

/// Zeroes every byte after the IP and transport headers: TCP (its data offset), UDP (8),
/// SCTP (its 12-byte common header: the chunks are data), ICMP and ICMPv6 (8; an error
/// message keeps the header of the packet it quotes, 28 bytes more, since that packet is what
/// it is about; an echo's data is data). IPv6 extension headers are walked (hop-by-hop,
/// routing, destination options, fragment). A fragment that is not the first carries no
/// transport header: everything after the IP headers is zeroed, as it is for any other
/// protocol and any header the capture cannot place (hostile round 4: non-first fragments,
/// extension headers, echo and SCTP kept payload bytes).
pub fn zero_payload(bytes: &mut [u8]) {
    let end = headers_end(bytes).unwrap_or(0);
    if let Some(payload) = bytes.get_mut(end.min(bytes.len())..) {
        payload.fill(0);
    }
}

/// Where the headers [`zero_payload`] keeps end (None: nothing is a known header).
fn headers_end(bytes: &[u8]) -> Option<usize> {
    let first = *bytes.first()?;
    let (mut at, mut proto, v6) = match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0f) * 4;
            // Fragment offset (13 bits of bytes 6-7): not the first fragment, no L4 header.
            let offset = u16::from_be_bytes([*bytes.get(6)?, *bytes.get(7)?]) & 0x1fff;
            if offset != 0 {
                return Some(ihl);
            }
            (ihl, *bytes.get(9)?, false)
        }
        6 => (40, *bytes.get(6)?, true),
        _ => return None,
    };
    if v6 {
        // Extension headers, bounded: each at least 8 bytes.
        for _ in 0..8 {
            match proto {
                0 | 43 | 60 => {
                    let next = *bytes.get(at)?;
                    let len = (usize::from(*bytes.get(at + 1)?) + 1) * 8;
                    proto = next;
                    at += len;
                }
                44 => {
                    let next = *bytes.get(at)?;
                    let offset =
                        u16::from_be_bytes([*bytes.get(at + 2)?, *bytes.get(at + 3)?]) >> 3;
                    at += 8;
                    if offset != 0 {
                        return Some(at);
                    }
                    proto = next;
                }
                _ => break,
            }
        }
    }
    let end = match proto {
        6 => at + usize::from(bytes.get(at + 12).map_or(5, |b| b >> 4)) * 4,
        17 => at + 8,
        132 => at + 12,
        1 | 58 => {
            let kind = bytes.get(at).copied();
            let error = if proto == 1 {
                matches!(kind, Some(3 | 4 | 5 | 11 | 12))
            } else {
                matches!(kind, Some(1..=4))
            };
            at + 8 + if error { 28 } else { 0 }
        }
        _ => at,
    };
    Some(end)
}

#[cfg(test)]
mod tests;
