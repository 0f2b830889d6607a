//! Whose address is this: the node's own sets (host addresses, local prefixes), behind the
//! IPv4 prefilter. The one look-up every ordinary packet pays.

use aya_ebpf::maps::lpm_trie::Key as LpmKey;
use probe_common::{family, prefilter, tag};

use crate::maps::{HOSTS_V4, HOSTS_V6, LOCAL_V4, LOCAL_V6, PREFILTER_V4, TRIE_V6_SIZE};

/// Whether bit `i` of the IPv4 prefilter is set.
#[inline(always)]
pub(crate) fn prefilter_bit(i: u32) -> bool {
    PREFILTER_V4
        .get(i >> 6)
        .is_some_and(|w| (*w >> (i & 63)) & 1 == 1)
}

/// The two prefilter bits of the /16 network holding `raw` (see `prefilter::net16`).
#[inline(always)]
pub(crate) fn prefilter_net16(raw: u32) -> u64 {
    let (word, shift) = prefilter::net16_slot(prefilter::net16(raw));
    PREFILTER_V4.get(word).map_or(0, |w| (*w >> shift) & 3)
}

/// Whether the IPv4 trie could hold a prefix covering `raw`: the /16's bits, then, for a /16
/// holding only longer prefixes, the /24's.
#[inline(always)]
pub(crate) fn may_be_in_trie(raw: u32) -> bool {
    match prefilter_net16(raw) {
        prefilter::net16::NONE => false,
        prefilter::net16::PARTIAL => prefilter_bit(prefilter::net24_bit(raw)),
        _ => true,
    }
}

/// The tag of an address. Longest-prefix semantics in two steps: a host address (the longest
/// prefix there is) in the hash, else the trie of shorter prefixes. IPv4 asks the prefilter
/// first: each look-up runs only when its bits say it could hit.
#[inline(always)]
pub(crate) fn lookup_tag(fam: u8, addr: &[u32; 4]) -> u8 {
    if fam == family::V4 {
        let raw = addr[0];
        if prefilter_bit(prefilter::host_bit(raw))
            // SAFETY: a map look-up whose value is only read during this run (userspace may replace it: a stale read is a stale answer, not a fault).
            && let Some(v) = unsafe { HOSTS_V4.get(raw) }
        {
            return v.tag;
        }
        if may_be_in_trie(raw) {
            let key = LpmKey::new(32, raw);
            return LOCAL_V4.get(&key).map(|v| v.tag).unwrap_or(tag::NONE);
        }
    } else {
        // SAFETY: a map look-up whose value is only read during this run (userspace may replace it: a stale read is a stale answer, not a fault).
        if let Some(v) = unsafe { HOSTS_V6.get(addr) } {
            return v.tag;
        }
        if TRIE_V6_SIZE.get(0).is_some_and(|n| *n > 0) {
            let key = LpmKey::new(128, *addr);
            return LOCAL_V6.get(&key).map(|v| v.tag).unwrap_or(tag::NONE);
        }
    }
    tag::NONE
}
