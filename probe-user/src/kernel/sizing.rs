//! The kernel maps' capacities, set at load from the agent's flags (`EbpfLoader::
//! map_max_entries`): the object's sizes are only the fallback. The defaults fit a node with
//! 5,000 pods' worth of services and flows; see docs/agent.md, "Map sizing", for the arithmetic.

use aya::EbpfLoader;

/// Capacities of the maps whose size depends on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// `EGRESS_FLOWS` (LRU): pod connections leaving the node without SNAT, kept as evidence.
    pub egress_flows: u32,
    /// `HOSTS_V4`/`HOSTS_V6` (hashes) and `LOCAL_V4`/`LOCAL_V6` (tries), each: the node's
    /// addresses, VIPs bound on the VIP interface, pod routes and CIDRs; and
    /// `DROP_DESTINATIONS` (the addresses of kube-proxy's no-endpoint drops and firewall entries).
    pub addresses: u32,
    /// `RECENT` (LRU): last report time per flow, the kernel's deduplication.
    pub dedup_flows: u32,
    /// `SUSPECTS`/`DROPS` (per-CPU hashes): exact counters by (source tag, NIC) and by
    /// (reason, tags); their key spaces are small.
    pub counter_keys: u32,
    /// `EVENTS` ring buffer, bytes (a power of two, at least a page).
    pub ringbuf_bytes: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            egress_flows: 65_536,
            addresses: 16_384,
            dedup_flows: 16_384,
            counter_keys: 1_024,
            ringbuf_bytes: 256 * 1024,
        }
    }
}

/// Flag ranges (inclusive): below, a busy node overflows; above, memory for nothing.
pub const EGRESS_FLOWS_RANGE: (u32, u32) = (1_024, 4_194_304);
pub const ADDRESSES_RANGE: (u32, u32) = (256, 1_048_576);
pub const DEDUP_FLOWS_RANGE: (u32, u32) = (256, 1_048_576);
pub const COUNTER_KEYS_RANGE: (u32, u32) = (64, 65_536);
pub const RINGBUF_KIB_RANGE: (u32, u32) = (16, 262_144);

impl MapSizes {
    /// Map name -> max_entries, as the loader takes them.
    pub fn entries(&self) -> [(&'static str, u32); 10] {
        [
            ("EGRESS_FLOWS", self.egress_flows),
            ("HOSTS_V4", self.addresses),
            // kube-proxy's drop destinations: one per LB IP or external IP of an ETP Local
            // Service without a local endpoint, or with loadBalancerSourceRanges (hostile
            // round 4: a fixed 4,096 left the highest-sorting out).
            ("DROP_DESTINATIONS", self.addresses),
            ("HOSTS_V6", self.addresses),
            ("LOCAL_V4", self.addresses),
            ("LOCAL_V6", self.addresses),
            ("RECENT", self.dedup_flows),
            ("SUSPECTS", self.counter_keys),
            ("DROPS", self.counter_keys),
            // A ring buffer's max_entries is its size in bytes.
            ("EVENTS", self.ringbuf_bytes),
        ]
    }

    pub fn apply(&self, loader: &mut EbpfLoader<'_>) {
        for (name, n) in self.entries() {
            loader.map_max_entries(name, n);
        }
    }
}

/// Why a size flag was refused (clap prints it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("{0:?} is not a whole number")]
    NotANumber(String),
    #[error("{n} is outside {min}..={max}")]
    OutOfRange { n: u32, min: u32, max: u32 },
    #[error("{0} KiB is not a power of two")]
    NotAPowerOfTwo(u32),
}

/// A count flag within `range`: the clap error names the range.
pub fn parse_count(s: &str, range: (u32, u32)) -> Result<u32, SizeError> {
    let n: u32 = s
        .replace('_', "")
        .parse()
        .map_err(|_| SizeError::NotANumber(s.to_owned()))?;
    if n < range.0 || n > range.1 {
        return Err(SizeError::OutOfRange {
            n,
            min: range.0,
            max: range.1,
        });
    }
    Ok(n)
}

/// `--ringbuf-kib`: a power of two within [`RINGBUF_KIB_RANGE`] (the kernel wants a power of
/// two number of pages); returns bytes.
pub fn parse_ringbuf_kib(s: &str) -> Result<u32, SizeError> {
    let kib = parse_count(s, RINGBUF_KIB_RANGE)?;
    if !kib.is_power_of_two() {
        return Err(SizeError::NotAPowerOfTwo(kib));
    }
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_range_checked() {
        assert_eq!(parse_count("65536", EGRESS_FLOWS_RANGE), Ok(65_536));
        assert_eq!(parse_count("262_144", EGRESS_FLOWS_RANGE), Ok(262_144));
        assert!(parse_count("10", EGRESS_FLOWS_RANGE).is_err());
        assert!(parse_count("0", COUNTER_KEYS_RANGE).is_err());
        assert!(parse_count("-1", ADDRESSES_RANGE).is_err());
        assert!(parse_count("lots", ADDRESSES_RANGE).is_err());
        assert!(parse_count("99999999999", ADDRESSES_RANGE).is_err());
    }

    #[test]
    fn ringbuf_is_a_power_of_two_of_kib() {
        assert_eq!(parse_ringbuf_kib("256"), Ok(256 * 1024));
        assert_eq!(parse_ringbuf_kib("16"), Ok(16 * 1024));
        assert!(
            parse_ringbuf_kib("300")
                .unwrap_err()
                .to_string()
                .contains("power of two")
        );
        assert!(parse_ringbuf_kib("8").is_err());
        assert!(parse_ringbuf_kib("524288").is_err());
    }

    #[test]
    fn defaults_are_the_objects_sizes_and_within_the_ranges() {
        let d = MapSizes::default();
        let within = |n: u32, r: (u32, u32)| n >= r.0 && n <= r.1;
        assert!(within(d.egress_flows, EGRESS_FLOWS_RANGE));
        assert!(within(d.addresses, ADDRESSES_RANGE));
        assert!(within(d.dedup_flows, DEDUP_FLOWS_RANGE));
        assert!(within(d.counter_keys, COUNTER_KEYS_RANGE));
        assert!(within(d.ringbuf_bytes / 1024, RINGBUF_KIB_RANGE));
        assert_eq!(
            parse_ringbuf_kib(&(d.ringbuf_bytes / 1024).to_string()),
            Ok(d.ringbuf_bytes)
        );
        // Every sized map named once.
        let mut names: Vec<_> = d.entries().iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 10);
    }
}
