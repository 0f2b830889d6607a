//! Every text of the remedy table (`remedy_tests.rs`'s cases: kind x sender x owner x policy x
//! names, and the host-listener hairpins), remedies and causes, as one digest: a restructure
//! that changes no text keeps it. Recorded at 7818a15, before issue #50 moved each kind's texts
//! beside its rule, and checked there (the same test, run on that commit, gives the same
//! digest). A deliberate change of a text updates the digest in the same commit and says why:
//! - issue #51 (etp_local_drop in iptables mode, h5): only `etp_local_drop`'s texts changed
//!   (per mode; the nftables fix's 1.33.0-1.33.5 range made explicit), checked by dumping every
//!   case's texts before and after.
//! - issue #51 shape 4 (p2): the new kind `lb_probe_refused` adds its texts after the nine
//!   kinds' ([`RECORDED_NINE`], the digest before it, still checked); no earlier text changed.

use probe_contract::LoopbackKind;

use super::{build, cause, tests::each_case};

/// (cases, FNV-1a 64 of every remedy line and cause, in the loops' order), over the kinds
/// recorded at 7818a15 (the first [`RECORDED_KINDS`] of `LoopbackKind::ALL`).
const RECORDED: (usize, u64) = (1548, 7_769_936_233_094_412_841);

/// The kinds [`RECORDED`] covers; the kinds added since (`stale_udp_conntrack` and
/// `source_ranges_drop`, issue #51) follow in [`RECORDED_ALL`], so the earlier kinds' digest
/// stays checked as it was.
const RECORDED_KINDS: usize = 7;

/// The same over the first [`RECORDED_NINE_KINDS`] kinds, as recorded before
/// `lb_probe_refused` (issue #51, shape 4) was added: still checked, unchanged.
const RECORDED_NINE: (usize, u64) = (1980, 17_844_437_333_801_397_743);
const RECORDED_NINE_KINDS: usize = 9;

/// The same over every kind: `lb_probe_refused`'s texts added after the nine above.
const RECORDED_ALL: (usize, u64) = (2196, 6_583_367_085_863_806_691);

fn fnv1a(hash: &mut u64, text: &str) {
    for b in text.bytes().chain(std::iter::once(b'\n')) {
        *hash ^= u64::from(b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

#[test]
fn the_remedy_tables_texts_are_the_recorded_ones() {
    // (cases, hash) so far.
    let mut digest = (0_usize, 0xcbf2_9ce4_8422_2325_u64);
    let mut recorded_kinds = None;
    let mut recorded_nine = None;
    each_case(|e, _| {
        // The digests as they stood when the first kind after each recorded set began.
        if recorded_kinds.is_none() && e.kind == LoopbackKind::ALL[RECORDED_KINDS] {
            recorded_kinds = Some(digest);
        }
        if recorded_nine.is_none() && e.kind == LoopbackKind::ALL[RECORDED_NINE_KINDS] {
            recorded_nine = Some(digest);
        }
        for line in build(e) {
            fnv1a(&mut digest.1, &line);
        }
        fnv1a(&mut digest.1, &cause(e));
        digest.0 += 1;
    });
    assert_eq!(
        recorded_kinds,
        Some(RECORDED),
        "the remedy table's texts changed"
    );
    assert_eq!(
        recorded_nine,
        Some(RECORDED_NINE),
        "the nine kinds' remedy texts before lb_probe_refused changed"
    );
    assert_eq!(
        digest, RECORDED_ALL,
        "the later kinds' remedy texts changed"
    );
}
