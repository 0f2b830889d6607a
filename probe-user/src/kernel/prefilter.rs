//! The IPv4 prefilter bitmap the programs check before their hash and trie look-ups (see
//! `probe_common::prefilter`): computed here from the full address set, pure, so the kernel
//! side's "a clear bit means not local" is unit-tested without a kernel.

use std::net::{IpAddr, Ipv4Addr};

use probe_common::prefilter::{WORDS, host_bit, net16, net16_slot, net24_bit};

use crate::state::addrs::Prefix;

/// The bitmap's words for `prefixes` (IPv6 ones are ignored: IPv6 goes straight to its hash
/// and trie).
///
/// A /32 sets its host bit. A prefix of /16 or shorter marks every /16 it spans as covered
/// (2^(16-len) of them). A prefix from /17 to /31 marks its /16 as partial and sets the bits
/// of the /24s it spans (one for /24 and longer, 2^(24-len) otherwise).
pub fn words<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> Vec<u64> {
    let mut w = vec![0u64; WORDS as usize];
    for p in prefixes {
        let IpAddr::V4(a) = p.addr else {
            continue;
        };
        let len = u32::from(p.len.min(32));
        if len == 32 {
            set_bit(&mut w, host_bit(raw(a)));
            continue;
        }
        let network = u32::from(a) & !(u32::MAX >> len);
        if len <= 16 {
            let first = network >> 16;
            for net in first..first + (1 << (16 - len)) {
                set_net16(&mut w, net, probe_common::prefilter::net16::COVERED);
            }
        } else {
            set_net16(
                &mut w,
                network >> 16,
                probe_common::prefilter::net16::PARTIAL,
            );
            let span = if len >= 24 { 1 } else { 1u32 << (24 - len) };
            for i in 0..span {
                set_bit(&mut w, net24_bit(raw(Ipv4Addr::from(network + (i << 8)))));
            }
        }
    }
    w
}

/// The address as the programs load it from the packet.
fn raw(a: Ipv4Addr) -> u32 {
    u32::from_le_bytes(a.octets())
}

fn set_bit(w: &mut [u64], bit: u32) {
    w[(bit >> 6) as usize] |= 1 << (bit & 63);
}

fn set_net16(w: &mut [u64], net: u32, state: u64) {
    let (word, shift) = net16_slot(net);
    w[word as usize] |= state << shift;
}

/// What the programs ask for `addr`: (look up the host hash, look up the trie). The same
/// computation as `lookup_tag`/`may_be_in_trie` in probe-ebpf, for tests.
pub fn lookups(words: &[u64], addr: Ipv4Addr) -> (bool, bool) {
    let raw = raw(addr);
    let bit = |i: u32| words[(i >> 6) as usize] >> (i & 63) & 1 == 1;
    let (word, shift) = net16_slot(net16(raw));
    let trie = match words[word as usize] >> shift & 3 {
        0 => false,
        1 => bit(net24_bit(raw)),
        _ => true,
    };
    (bit(host_bit(raw)), trie)
}

/// Whether the kernel would look `addr` up at all (either look-up), for tests.
pub fn may_be_local(words: &[u64], addr: Ipv4Addr) -> bool {
    let (host, trie) = lookups(words, addr);
    host || trie
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn p(s: &str) -> Prefix {
        let (a, len) = s.split_once('/').unwrap();
        Prefix {
            addr: a.parse().unwrap(),
            len: len.parse().unwrap(),
        }
    }

    fn contains(p: &Prefix, a: Ipv4Addr) -> bool {
        let IpAddr::V4(n) = p.addr else { return false };
        let mask = if p.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(p.len))
        };
        u32::from(n) & mask == u32::from(a) & mask
    }

    /// The longest prefix holding `a`, by walking them all.
    fn naive_lpm(set: &[(Prefix, u8)], a: Ipv4Addr) -> Option<u8> {
        set.iter()
            .filter(|(p, _)| contains(p, a))
            .max_by_key(|(p, _)| p.len)
            .map(|(_, t)| *t)
    }

    /// What the programs answer: the hash (exact /32s) when the host bit says so, else the
    /// trie (longest of the shorter prefixes) when the network bits say so.
    fn filtered_lookup(set: &[(Prefix, u8)], w: &[u64], a: Ipv4Addr) -> Option<u8> {
        let (host, trie) = lookups(w, a);
        if host && let Some((_, t)) = set.iter().find(|(p, _)| p.len == 32 && contains(p, a)) {
            return Some(*t);
        }
        if trie {
            let shorter: Vec<(Prefix, u8)> =
                set.iter().filter(|(p, _)| p.len < 32).cloned().collect();
            return naive_lpm(&shorter, a);
        }
        None
    }

    fn prefix_strategy() -> impl Strategy<Value = (Prefix, u8)> {
        // Lengths a node has (and the awkward ones around the /16 and /24 boundaries); bases
        // drawn from a few /8s so prefixes overlap and addresses land near them.
        let len = prop::sample::select(vec![0u8, 8, 12, 15, 16, 17, 23, 24, 25, 30, 31, 32]);
        (
            len,
            prop::sample::select(vec![10u8, 172, 192]),
            any::<[u8; 3]>(),
            1u8..4,
        )
            .prop_map(|(len, a, [b, c, d], tag)| {
                (
                    Prefix {
                        addr: IpAddr::V4(Ipv4Addr::new(a, b % 4 + 240, c % 8, d)),
                        len,
                    },
                    tag,
                )
            })
    }

    proptest! {
        /// The prefilter never changes an answer: every address gets the naive LPM's tag.
        #[test]
        fn filtered_lookup_equals_naive_lpm(
            set in prop::collection::vec(prefix_strategy(), 0..12),
            addrs in prop::collection::vec((prop::sample::select(vec![10u8, 172, 192, 11]), any::<[u8; 3]>()), 64),
        ) {
            // One tag per prefix, like the address maps (a key holds one value).
            let mut set = set;
            set.sort_by_key(|(p, _)| (p.addr, p.len));
            set.dedup_by_key(|(p, _)| (p.addr, p.len));
            let w = words(set.iter().map(|(p, _)| p));
            let mut tried: Vec<Ipv4Addr> = addrs
                .iter()
                .map(|(a, [b, c, d])| Ipv4Addr::new(*a, b % 4 + 240, c % 8, *d))
                .collect();
            // Each prefix's own first and last address.
            for (p, _) in &set {
                let IpAddr::V4(n) = p.addr else { continue };
                let host = if p.len >= 32 { 0 } else { u32::MAX >> p.len };
                tried.push(Ipv4Addr::from(u32::from(n) & !host));
                tried.push(Ipv4Addr::from(u32::from(n) | host));
            }
            for a in tried {
                prop_assert_eq!(filtered_lookup(&set, &w, a), naive_lpm(&set, a), "{}", a);
            }
        }
    }

    #[test]
    fn every_local_address_passes_the_prefilter() {
        let set = [
            p("10.200.0.2/32"),
            p("203.0.113.10/32"),
            p("10.244.1.0/24"),
            p("172.16.0.0/12"),
            p("192.168.4.0/23"),
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
            "192.168.4.1",
            "192.168.5.254",
        ] {
            assert!(may_be_local(&w, a.parse().unwrap()), "{a}");
        }
        // Hosts one bit each; a /12 marks 16 /16s covered; the /24 and the /23 mark their
        // /16 partial (one bit each) and their /24s (one and two bits).
        let ones: u32 = w.iter().map(|x| x.count_ones()).sum();
        assert_eq!(ones, 2 + 16 + (1 + 1) + (1 + 2));
    }

    #[test]
    fn other_nodes_pods_in_the_pod_cidrs_16_skip_the_trie() {
        let set = [p("10.244.1.0/24"), p("10.200.0.2/32")];
        let w = words(&set);
        assert!(lookups(&w, Ipv4Addr::new(10, 244, 1, 7)).1);
        // Every other /24 of 10.244/16: the /24 bits are hashed, so a collision could let one
        // through (to the trie, which says no); these 255 do not.
        let passed = (0..=255u8)
            .filter(|c| *c != 1)
            .filter(|c| lookups(&w, Ipv4Addr::new(10, 244, *c, 9)).1)
            .count();
        assert_eq!(passed, 0);
        // The node's subnet neighbours: no prefix in 10.200/16, so no trie.
        assert!(!lookups(&w, Ipv4Addr::new(10, 200, 0, 1)).1);
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
