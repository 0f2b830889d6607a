//! `clb_ingress` (tc/tcx, NIC ingress): a packet whose source is one of the node's own
//! addresses is a suspect, counted exactly and evented once per flow.

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC, helpers::bpf_ktime_get_ns, macros::classifier, programs::TcContext,
};
use probe_common::{SuspectKey, kind, tag};

use crate::{
    emit::{Meta, count, emit, flow_of, may_emit},
    lookup::lookup_tag,
    maps::{CONFIG, SUSPECTS},
    packet::{Packet, TcBytes, parse_l3, parse_l4},
};

#[classifier]
pub fn clb_ingress(ctx: TcContext) -> i32 {
    // The ordinary path: the addresses, the prefilter, out. Ports only for suspects.
    let Some((mut pkt, l4)) = parse_l3(&ctx) else {
        return TC_ACT_UNSPEC;
    };
    let src_tag = lookup_tag(pkt.family, &pkt.saddr);
    if src_tag == tag::NONE {
        return TC_ACT_UNSPEC;
    }
    if l4 != 0 {
        parse_l4(&ctx, l4, &mut pkt);
    }
    on_suspect(&ctx, &pkt, src_tag);
    TC_ACT_UNSPEC
}

#[inline(never)]
fn on_suspect(ctx: &TcContext, pkt: &Packet, src_tag: u8) {
    // SAFETY: the program's own skb, valid for the whole run.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    count(
        &SUSPECTS,
        &SuspectKey {
            ifindex,
            tag: src_tag,
            proto: pkt.proto,
            _pad: [0; 2],
        },
    );
    let cfg = CONFIG.load();
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if !may_emit(&flow_of(pkt, kind::SUSPECT), src_tag, now, &cfg) {
        return;
    }
    let dst_tag = lookup_tag(pkt.family, &pkt.daddr);
    emit(
        &cfg,
        pkt,
        Meta {
            kind: kind::SUSPECT,
            src_tag,
            dst_tag,
            ifindex,
            reason: 0,
            location: 0,
            netns: 0,
            now,
        },
        &TcBytes(ctx),
    );
}
