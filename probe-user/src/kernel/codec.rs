//! The record <-> domain codec, in one place: the programs' addresses (16 bytes and a
//! `probe_common::family`, IPv4 in the first four) to and from [`IpAddr`], and a ring-buffer
//! record's packet as a domain [`Packet`]. The reader, the egress table and their tests use
//! only these, so the two directions cannot drift apart.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use probe_common::{CAPTURE_MAX, CapturedPacketEvent, PacketEvent, family};
use probe_contract::{Proto, Tag, record::Packet};

/// The address a record carries as `bytes` in family `fam`.
pub fn addr_from(fam: u8, bytes: [u8; 16]) -> IpAddr {
    if fam == family::V4 {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(bytes))
    }
}

/// The record family of an address (`probe_common::family`).
pub fn family_of(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        family::V4
    } else {
        family::V6
    }
}

/// An address as a record carries it (see [`addr_from`]).
pub fn addr_bytes(addr: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match addr {
        IpAddr::V4(a) => out[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => out = a.octets(),
    }
    out
}

/// The packet a ring-buffer record is about.
pub fn packet(raw: &PacketEvent) -> Packet {
    Packet {
        src: addr_from(raw.family, raw.saddr),
        dst: addr_from(raw.family, raw.daddr),
        sport: raw.sport,
        dport: raw.dport,
        proto: Proto::from_raw(raw.proto),
        tcp_flags: raw.tcp_flags,
        src_tag: Tag::from_raw(raw.src_tag),
        dst_tag: Tag::from_raw(raw.dst_tag),
    }
}

/// A ring-buffer record's bytes as the event and its packet's first bytes: a bare
/// [`PacketEvent`] (no capture: empty bytes) or a [`CapturedPacketEvent`] (its `cap_len`
/// bytes, never more than [`CAPTURE_MAX`]). None for a record shorter than a `PacketEvent`.
pub fn split_record(item: &[u8]) -> Option<(PacketEvent, Vec<u8>)> {
    if item.len() >= size_of::<CapturedPacketEvent>() {
        // SAFETY: length checked; the record is a CapturedPacketEvent written by our program
        // (Pod: every bit pattern is valid).
        let rec: CapturedPacketEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        let len = usize::from(rec.cap_len).min(CAPTURE_MAX);
        return Some((rec.event, rec.data[..len].to_vec()));
    }
    if item.len() >= size_of::<PacketEvent>() {
        // SAFETY: length checked, as above.
        let raw: PacketEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        return Some((raw, Vec::new()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_bytes<T>(rec: &T) -> Vec<u8> {
        // SAFETY: reading a plain repr(C) value as bytes.
        unsafe { std::slice::from_raw_parts((rec as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    #[test]
    fn a_captured_record_yields_its_event_and_exactly_its_bytes() {
        let event = PacketEvent {
            kind: probe_common::kind::DROP,
            family: family::V4,
            sport: 40000,
            ..Default::default()
        };
        let mut data = [0xeeu8; CAPTURE_MAX];
        data[..4].copy_from_slice(&[0x45, 0, 0, 60]);
        let rec = CapturedPacketEvent {
            event,
            cap_len: 4,
            _pad: [0; 6],
            data,
        };
        let (got, bytes) = split_record(&record_bytes(&rec)).unwrap();
        assert_eq!(got, event);
        // The stale rest of the buffer is not passed on.
        assert_eq!(bytes, [0x45, 0, 0, 60]);
        // A cap_len past the buffer (a corrupt record) is clamped, never read beyond it.
        let (_, bytes) = split_record(&record_bytes(&CapturedPacketEvent {
            cap_len: 4000,
            ..rec
        }))
        .unwrap();
        assert_eq!(bytes.len(), CAPTURE_MAX);
    }

    #[test]
    fn a_bare_record_has_no_bytes_and_a_short_one_is_refused() {
        let event = PacketEvent {
            kind: probe_common::kind::SUSPECT,
            ..Default::default()
        };
        let raw = record_bytes(&event);
        assert_eq!(split_record(&raw), Some((event, Vec::new())));
        assert_eq!(split_record(&raw[..40]), None);
    }

    #[test]
    fn address_bytes_round_trip() {
        for a in ["198.18.0.2", "2001:db8::1"] {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(addr_from(family_of(ip), addr_bytes(ip)), ip);
        }
    }

    #[test]
    fn ipv4_sits_in_the_first_four_bytes() {
        let ip: IpAddr = "198.18.0.2".parse().unwrap();
        assert_eq!(addr_bytes(ip)[..4], [198, 18, 0, 2]);
        assert_eq!(addr_bytes(ip)[4..], [0; 12]);
        assert_eq!(family_of(ip), family::V4);
    }
}
