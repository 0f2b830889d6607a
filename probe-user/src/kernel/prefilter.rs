//! The IPv4 prefilter bitmap the programs check before their hash and trie look-ups (see
//! `probe_common::prefilter`): computed here from the full address set, pure, so the kernel
//! side's "a clear bit means not local" is unit-tested without a kernel.

use std::net::IpAddr;

use probe_common::prefilter::{NET_BITS, WORDS, host_bit, net_bit};

// Network bits and host bits split the map in two halves.
const _: () = assert!(NET_BITS * 2 == WORDS * 64);

use crate::state::addrs::Prefix;

/// The bitmap's words for `prefixes` (IPv6 ones are ignored: IPv6 goes straight to its hash
/// and trie).
pub fn words<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> Vec<u64> {
    let mut w = vec![0u64; WORDS as usize];
    let mut set = |bit: u32| w[(bit >> 6) as usize] |= 1 << (bit & 63);
    for p in prefixes {
        let IpAddr::V4(a) = p.addr else {
            continue;
        };
        if p.len >= 32 {
            set(host_bit(u32::from_le_bytes(a.octets())));
            continue;
        }
        // Every /16 the prefix overlaps: one when it is /16 or longer, 2^(16-len) otherwise.
        let first = u16::from_be_bytes([a.octets()[0], a.octets()[1]]);
        let span: u32 = if p.len >= 16 { 1 } else { 1 << (16 - p.len) };
        let first = u32::from(first) & !(span - 1);
        for net in first..first + span {
            let [hi, lo] = (net as u16).to_be_bytes();
            set(net_bit(u32::from_le_bytes([hi, lo, 0, 0])));
        }
    }
    w
}

/// Whether the kernel would look `addr` up (its host or network bit is set): what the
/// programs compute, for tests.
pub fn may_be_local(words: &[u64], addr: std::net::Ipv4Addr) -> bool {
    let raw = u32::from_le_bytes(addr.octets());
    let bit = |i: u32| words[(i >> 6) as usize] >> (i & 63) & 1 == 1;
    bit(host_bit(raw)) || bit(net_bit(raw))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn p(s: &str) -> Prefix {
        let (a, len) = s.split_once('/').unwrap();
        Prefix {
            addr: a.parse().unwrap(),
            len: len.parse().unwrap(),
        }
    }

    #[test]
    fn every_local_address_passes_the_prefilter() {
        let set = [
            p("10.200.0.2/32"),
            p("203.0.113.10/32"),
            p("10.244.1.0/24"),
            p("172.16.0.0/12"),
            p("fd00::1/128"),
        ];
        let w = words(&set);
        for a in [
            "10.200.0.2",
            "203.0.113.10",
            "10.244.1.0",
            "10.244.1.255",
            "172.16.0.1",
            "172.31.255.254",
        ] {
            assert!(may_be_local(&w, a.parse().unwrap()), "{a}");
        }
        // A /12 marks 16 /16s, a /24 and hosts one bit each.
        let ones: u32 = w.iter().map(|x| x.count_ones()).sum();
        assert_eq!(ones, 16 + 1 + 2);
    }

    #[test]
    fn ordinary_addresses_are_almost_all_filtered_out() {
        let set: Vec<Prefix> = (0..200u8)
            .map(|i| p(&format!("10.96.0.{i}/32")))
            .chain([p("10.244.1.0/24"), p("10.200.0.2/32")])
            .collect();
        let w = words(&set);
        // The node's neighbours on its own subnet, and the internet.
        let tried: Vec<Ipv4Addr> = (0..=255u8)
            .flat_map(|c| (1..=254u8).map(move |d| Ipv4Addr::new(10, 200, c, d)))
            .filter(|a| *a != Ipv4Addr::new(10, 200, 0, 2))
            .collect();
        let passed = tried.iter().filter(|a| may_be_local(&w, **a)).count();
        // 202 host bits of 65536: about 0.3% of non-local addresses take the hash look-up.
        assert!(
            passed * 100 < tried.len(),
            "{passed} of {} passed",
            tried.len()
        );
        assert!(!may_be_local(&w, Ipv4Addr::new(10, 201, 0, 1)));
    }

    #[test]
    fn empty_set_filters_everything() {
        let w = words(&[]);
        assert!(w.iter().all(|x| *x == 0));
        assert!(!may_be_local(&w, Ipv4Addr::new(1, 2, 3, 4)));
    }
}
