//! Every text of the remedy table (`remedy_tests.rs`'s cases: kind x sender x owner x policy x
//! names, and the host-listener hairpins), remedies and causes, as one digest: a restructure
//! that changes no text keeps it. Recorded at 7818a15, before issue #50 moved each kind's texts
//! beside its rule, and checked there (the same test, run on that commit, gives the same
//! digest). A deliberate change of a text updates the digest in the same commit and says why.

use probe_contract::{
    LoopbackKind,
    facts::{Etp, SourceKind},
};

use super::{
    build, cause,
    tests::{apiserver, event, named, owners},
};

/// (cases, FNV-1a 64 of every remedy line and cause, in the loops' order).
const RECORDED: (usize, u64) = (1548, 17_611_456_782_656_444_629);
/// The kinds there were at the recording, `LoopbackKind::ALL`'s first: a kind added since
/// (at the end of `ALL`) is held by its own tests, and leaves the recorded digest as it was.
const RECORDED_KINDS: usize = 7;

fn fnv1a(hash: &mut u64, text: &str) {
    for b in text.bytes().chain(std::iter::once(b'\n')) {
        *hash ^= u64::from(b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

#[test]
fn the_remedy_tables_texts_are_the_recorded_ones() {
    let policies = [None, Some(Etp::Local), Some(Etp::Cluster)];
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut cases = 0;
    let mut take = |e: &probe_contract::LoopbackEvent| {
        for line in build(e) {
            fnv1a(&mut hash, &line);
        }
        fnv1a(&mut hash, &cause(e));
        cases += 1;
    };
    for kind in LoopbackKind::ALL.into_iter().take(RECORDED_KINDS) {
        for source in [SourceKind::Pod, SourceKind::Node, SourceKind::Vip] {
            for owner in owners() {
                for rules in policies {
                    for names in [false, true] {
                        let apis: &[Option<Etp>] = if names { &policies } else { &[None] };
                        for api in apis {
                            let mut e = event(kind, source);
                            e.facts.etp_rules = rules;
                            e.facts.owner = owner.clone();
                            if names {
                                named(&mut e, *api);
                            }
                            take(&e);
                        }
                    }
                }
            }
            if kind == LoopbackKind::Hairpin {
                for owner in owners() {
                    for listener in [None, Some(apiserver())] {
                        let mut e = event(kind, source);
                        e.dst_port = 6443;
                        e.facts.owner = owner.clone();
                        e.facts.host_listener = true;
                        e.listener = listener;
                        take(&e);
                    }
                }
            }
        }
    }
    assert_eq!((cases, hash), RECORDED, "the remedy table's texts changed");
}
