//! The record <-> domain codec, in one place: the programs' addresses (16 bytes and a
//! `probe_common::family`, IPv4 in the first four) to and from [`IpAddr`], and a ring-buffer
//! record's packet as a domain [`Packet`]. The reader, the egress table and their tests use
//! only these, so the two directions cannot drift apart.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use probe_common::{PacketEvent, family};

use probe_contract::record::Packet;

use probe_contract::{Proto, Tag};

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

#[cfg(test)]
mod tests {
    use super::*;

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
