//! Every reader's input fuzzed (proptest): real captures (netlink replies, iptables-save text,
//! recorded kernel-event streams) mutated byte by byte, truncated and spliced, plus arbitrary
//! input. The parsers must answer (a value or an error), never panic. `cargo test` runs the
//! default number of cases; `cargo xtask chaos` runs many more (`PROPTEST_CASES`) and reports
//! the time in RELIABILITY.md.

use proptest::prelude::*;

use crate::{
    correlate::replay,
    state::{addrs::Prefix, conntrack, iptables, ipvs, nft_netlink},
};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

fn seeds(dir: &str, ext: &str) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(format!("{DATA}/{dir}"))
        .unwrap_or_else(|e| panic!("{DATA}/{dir}: {e}"))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {ext} seeds in {dir}");
    out
}

fn stream_seeds() -> Vec<Vec<u8>> {
    // The recorded streams are the pure core's test data (its correlator replays them).
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../probe-core/tests/data/streams"
    );
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(root)
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|d| std::fs::read(d.path().join("events.jsonl")).ok())
        .collect();
    out.sort();
    out
}

/// A seed changed the way broken input is: bytes overwritten, a cut, a spliced-in run.
#[derive(Debug, Clone)]
struct Mutation {
    seed: usize,
    flips: Vec<(usize, u8)>,
    cut: Option<usize>,
    splice: Option<(usize, Vec<u8>)>,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (
        any::<usize>(),
        prop::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        prop::option::of(any::<usize>()),
        prop::option::of((any::<usize>(), prop::collection::vec(any::<u8>(), 0..64))),
    )
        .prop_map(|(seed, flips, cut, splice)| Mutation {
            seed,
            flips,
            cut,
            splice,
        })
}

fn apply(seeds: &[Vec<u8>], m: &Mutation) -> Vec<u8> {
    let mut b = seeds[m.seed % seeds.len()].clone();
    if b.is_empty() {
        return b;
    }
    for (at, byte) in &m.flips {
        let i = at % b.len();
        b[i] = *byte;
    }
    if let Some((at, run)) = &m.splice {
        let i = at % (b.len() + 1);
        b.splice(i..i, run.iter().copied());
    }
    if let Some(cut) = m.cut {
        b.truncate(cut % (b.len() + 1));
    }
    b
}

fn netlink_parsers(bytes: &[u8]) {
    let _ = ipvs::parse_family_id(bytes);
    let _ = ipvs::parse_services(bytes);
    let _ = ipvs::parse_dests(bytes);
    let _ = conntrack::parse_messages(bytes);
    if let Ok(rules) = nft_netlink::decode_rules(bytes) {
        // What the iptables reader makes of any decoded rule: never a panic either.
        let _ = iptables::rules_from_netlink(&rules);
    }
    let _ = nft_netlink::decode_set_elems(bytes);
}

proptest! {
    #[test]
    fn fuzz_netlink_replies_from_real_captures(m in mutation()) {
        let mut all = seeds("ipvs", ".bin");
        all.extend(seeds("conntrack", ".bin"));
        all.extend(seeds("nft_netlink", ".bin"));
        netlink_parsers(&apply(&all, &m));
    }

    #[test]
    fn fuzz_netlink_replies_arbitrary(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        netlink_parsers(&bytes);
    }

    #[test]
    fn fuzz_iptables_save_text(m in mutation(), extra in ".{0,200}") {
        let mut all = seeds("iptables", ".txt");
        all.extend(seeds("iptables", ".rules"));
        let text = String::from_utf8_lossy(&apply(&all, &m)).into_owned() + &extra;
        let _ = iptables::parse_iptables_save(&text);
    }

    #[test]
    fn fuzz_recorded_streams(m in mutation()) {
        let text = String::from_utf8_lossy(&apply(&stream_seeds(), &m)).into_owned();
        if let Ok(events) = replay::parse_events(&text) {
            // Whatever parses must also replay through the correlator without a panic.
            let stream = replay::Stream { events, ..Default::default() };
            let _ = replay::replay(&stream);
        }
    }

    #[test]
    fn fuzz_prefixes(s in ".{0,48}", addr in any::<[u8; 16]>(), len in 0u8..=128) {
        let _ = Prefix::parse(&s);
        let v6 = std::net::Ipv6Addr::from(addr);
        let text = format!("{v6}/{len}");
        let p = Prefix::parse(&text).expect("a valid IPv6 prefix parses");
        prop_assert_eq!(p.len, len);
        let _ = crate::agent::checks::pod_cidr_error(&p);
    }
}
