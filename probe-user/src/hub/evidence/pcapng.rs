//! One loop's packets as pcapng: a Section Header, an Interface Description per (hook,
//! interface) pair (nanosecond timestamps), and an Enhanced Packet Block per packet whose
//! comment names the hook, the interface, the drop reason, the loop's id and kind. Written
//! with `pcap-file` (its blocks; its writer keeps the interface list).
//!
//! Link type: Ethernet, with a header made up here (both MACs zero, the EtherType of the IP
//! version) before the captured IP packet. Not LINKTYPE_RAW: libpcap's pcapng reader (so
//! tcpdump) compares each further interface's LINKTYPE_RAW (101) with the DLT it mapped the
//! first one to (DLT_RAW, 12) and refuses the file ("an interface has a type 101 different
//! from the type of the first interface", seen with this host's tcpdump); Ethernet's LINKTYPE
//! and DLT are the same number. The capture itself starts at the IP header: the kernel copies
//! from the network header on.

use std::{borrow::Cow, collections::BTreeMap, time::Duration};

use pcap_file::{
    DataLink,
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
        },
    },
};
use probe_common::CAPTURE_MAX;
use probe_contract::evidence::Hook;

use super::{LoopEvidence, StoredPacket};

/// The loop's packets as a pcapng file. `unix_offset_ns`: the wall clock minus the monotonic
/// clock now, so the packets' kernel times show as wall-clock times.
pub fn write(l: &LoopEvidence, unix_offset_ns: i128) -> Result<Vec<u8>, pcap_file::PcapError> {
    let mut w = PcapNgWriter::new(Vec::with_capacity(256 + l.packets.len() * 320))?;
    let mut interfaces: BTreeMap<(Hook, Option<&str>), u32> = BTreeMap::new();
    for p in &l.packets {
        let key = (p.summary.hook, p.summary.iface.as_deref());
        if interfaces.contains_key(&key) {
            continue;
        }
        let name = format!(
            "{}:{}",
            p.summary.hook.as_str(),
            p.summary.iface.as_deref().unwrap_or("-")
        );
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: (ETH_HLEN + CAPTURE_MAX) as u32,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Owned(name)),
                // pcap-file writes Enhanced Packet timestamps in nanoseconds.
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        })?;
        let id = interfaces.len() as u32;
        interfaces.insert(key, id);
    }
    for p in &l.packets {
        let interface_id = interfaces[&(p.summary.hook, p.summary.iface.as_deref())];
        let ts = i128::from(p.summary.ts_ns) + unix_offset_ns;
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id,
            timestamp: Duration::from_nanos(u64::try_from(ts).unwrap_or(0)),
            original_len: ETH_HLEN as u32 + original_len(&p.bytes),
            data: Cow::Owned(with_ethernet(&p.bytes)),
            options: vec![EnhancedPacketOption::Comment(Cow::Owned(comment(l, p)))],
        })?;
    }
    Ok(w.into_inner())
}

/// Ethernet header length.
pub const ETH_HLEN: usize = 14;

/// `ip` behind a made-up Ethernet header: zero MACs, the EtherType of its IP version.
pub fn with_ethernet(ip: &[u8]) -> Vec<u8> {
    let ethertype: [u8; 2] = match ip.first().map(|b| b >> 4) {
        Some(6) => [0x86, 0xdd],
        _ => [0x08, 0x00],
    };
    let mut frame = Vec::with_capacity(ETH_HLEN + ip.len());
    frame.extend_from_slice(&[0; 12]);
    frame.extend_from_slice(&ethertype);
    frame.extend_from_slice(ip);
    frame
}

/// The packet's comment: what a reader of the capture needs beside the bytes.
pub fn comment(l: &LoopEvidence, p: &StoredPacket) -> String {
    let mut c = format!(
        "clb-probe loop {} kind {}; hook {}; iface {}",
        l.id,
        l.event.kind.as_str(),
        p.summary.hook.as_str(),
        p.summary.iface.as_deref().unwrap_or("-")
    );
    if let Some(reason) = &p.summary.drop_reason {
        c.push_str("; drop reason ");
        c.push_str(reason);
    }
    if let Some(svc) = &l.event.service {
        c.push_str("; service ");
        c.push_str(svc);
    }
    c.push_str("; key ");
    c.push_str(&l.event.key);
    c
}

/// The packet's length on the wire from its IP header (the capture holds its first bytes
/// only); the captured length when the header is not there.
fn original_len(bytes: &[u8]) -> u32 {
    let header = match bytes.first().map(|b| b >> 4) {
        Some(4) if bytes.len() >= 4 => u32::from(u16::from_be_bytes([bytes[2], bytes[3]])),
        Some(6) if bytes.len() >= 6 => 40 + u32::from(u16::from_be_bytes([bytes[4], bytes[5]])),
        _ => 0,
    };
    header.max(bytes.len() as u32)
}
