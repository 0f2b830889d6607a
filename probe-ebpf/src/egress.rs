//! `clb_egress` (tc/tcx, NIC egress): connection openers that leave the node un-SNATed (a pod
//! source) or from the node to a non-local address are remembered, so a hairpin coming back
//! can be tied to the VIP it called; a SYN with a bound VIP as source is an event.

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC, helpers::bpf_ktime_get_ns, macros::classifier, programs::TcContext,
};
use probe_common::{EGRESS_IDLE_NS, EgressKey, EgressValue, kind, stat, tag};

use crate::{
    emit::{Meta, emit, flow_of, may_emit, stat_add},
    lookup::lookup_tag,
    maps::{CONFIG, EGRESS_FLOWS, EGRESS_SOURCES},
    packet::{IPPROTO_TCP, IPPROTO_UDP, Packet, TCP_ACK, TCP_SYN, TcBytes, bytes, parse},
};

/// A TCP SYN leaving a NIC with a bound VIP as source: a call to the LB IP forwarded to
/// another node without SNAT. Never on an ordinary packet's path (only VIP-source openers get
/// here); deduplicated and budgeted like every event. TCP only: a UDP service on a VIP
/// answers from the VIP, which is no opener of ours.
#[inline(never)]
fn on_vip_egress(ctx: &TcContext, pkt: &Packet) {
    let cfg = CONFIG.load();
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if !may_emit(&flow_of(pkt, kind::VIP_EGRESS), tag::VIP, now, &cfg) {
        return;
    }
    emit(
        &cfg,
        pkt,
        Meta {
            kind: kind::VIP_EGRESS,
            src_tag: tag::VIP,
            dst_tag: lookup_tag(pkt.family, &pkt.daddr),
            // SAFETY: the program's own skb, valid for the whole run.
            ifindex: unsafe { (*ctx.skb.skb).ifindex },
            reason: 0,
            location: 0,
            netns: 0,
            now,
        },
        &TcBytes(ctx),
    );
}

/// Whether an opener leaving a NIC is remembered in `EGRESS_FLOWS`: a pod source (not
/// SNATed), or the node's own address calling a non-local destination with a TCP SYN (a
/// host-network client, or pod traffic masqueraded to the node IP: a node-sourced loop comes
/// back with the node's IP as source). Node UDP is left out: it includes overlay encapsulation
/// (VXLAN, Geneve) at packet rate. The caller looked the source up once;
/// node SYNs pay a second look-up (the destination).
#[inline(always)]
fn records_egress(src_tag: u8, pkt: &Packet) -> bool {
    match src_tag {
        tag::POD => true,
        tag::NODE => pkt.proto == IPPROTO_TCP && lookup_tag(pkt.family, &pkt.daddr) == tag::NONE,
        _ => false,
    }
}

#[classifier]
pub fn clb_egress(ctx: TcContext) -> i32 {
    let Some(pkt) = parse(&ctx) else {
        return TC_ACT_UNSPEC;
    };
    // Cheap first check: only connection openers matter (TCP SYN without ACK, UDP).
    let opener = match pkt.proto {
        IPPROTO_TCP => pkt.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN,
        IPPROTO_UDP => true,
        _ => false,
    };
    if !opener {
        return TC_ACT_UNSPEC;
    }
    // One look-up of the source for nearly every opener, a second only for node SYNs.
    let src_tag = lookup_tag(pkt.family, &pkt.saddr);
    if src_tag == tag::VIP && pkt.proto == IPPROTO_TCP {
        on_vip_egress(&ctx, &pkt);
        return TC_ACT_UNSPEC;
    }
    if !records_egress(src_tag, &pkt) {
        return TC_ACT_UNSPEC;
    }
    let key = EgressKey {
        addr: bytes(pkt.saddr),
        port: pkt.sport,
        proto: pkt.proto,
        family: pkt.family,
    };
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // The same opener again (a SYN retransmit, the next UDP datagram): keep the first
    // packet's time, so the record says when the flow started, and only move `last_ns`.
    // The agent matches a hairpin suspect against the first time: a retransmit must not
    // make the egress look later than the suspect it caused.
    if let Some(v) = EGRESS_FLOWS.get_ptr_mut(key) {
        // SAFETY: a valid pointer into the map's value, for this program run.
        let v = unsafe { &mut *v };
        // SAFETY: `daddr` is the first field of an 8-aligned struct; compare it as words
        // (byte arrays cost one stack slot per byte in BPF).
        let seen: [u32; 4] = unsafe { core::ptr::read(v.daddr.as_ptr().cast()) };
        if seen == pkt.daddr && v.dport == pkt.dport && now.wrapping_sub(v.last_ns) < EGRESS_IDLE_NS
        {
            v.last_ns = now;
            return TC_ACT_UNSPEC;
        }
    }
    let value = EgressValue {
        daddr: bytes(pkt.daddr),
        dport: pkt.dport,
        _pad: [0; 2],
        // SAFETY: the program's own skb, valid for the whole run.
        ifindex: unsafe { (*ctx.skb.skb).ifindex },
        ts_ns: now,
        last_ns: now,
    };
    if EGRESS_FLOWS.insert(key, value, 0).is_ok() {
        stat_add(stat::EGRESS_RECORDED);
        index_egress_source(&key);
    }
    TC_ACT_UNSPEC
}

/// Adds a new `EGRESS_FLOWS` record to its source's ring in `EGRESS_SOURCES`: one more map
/// update per new record (never per packet). Two CPUs recording the same source at once may
/// both write one slot; the index then lacks the older of the two flows (never names a wrong
/// one), which only a layer-7 guess could notice: a layer-4 match looks its flow up by key.
#[inline(always)]
fn index_egress_source(key: &EgressKey) {
    use probe_common::{EGRESS_SOURCE_SLOTS, EgressSourceFlows, EgressSourceKey};
    let source = EgressSourceKey {
        addr: key.addr,
        family: key.family,
        _pad: [0; 3],
    };
    let slot = EgressSourceFlows::slot(key.port, key.proto);
    if let Some(ring) = EGRESS_SOURCES.get_ptr_mut(source) {
        // SAFETY: a valid pointer into the map's value, for this program run.
        let ring = unsafe { &mut *ring };
        let i = ring.next as usize & (EGRESS_SOURCE_SLOTS - 1);
        if let Some(s) = ring.flows.get_mut(i) {
            *s = slot;
        }
        ring.next = ring.next.wrapping_add(1);
        return;
    }
    let mut ring = EgressSourceFlows {
        next: 1,
        flows: [0; EGRESS_SOURCE_SLOTS],
    };
    ring.flows[0] = slot;
    let _ = EGRESS_SOURCES.insert(source, ring, 0);
}
