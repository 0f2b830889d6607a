//! `clb_kfree_skb` and its variants (tp_btf, raw tracepoint as fallback; with and without the
//! drop reason): the kernel's drops of suspect packets, of packets to bound VIPs, of
//! self-addressed local pod packets, of local pod packets and the node's own outgoing ones to
//! a watched destination (`DROP_DESTINATIONS`) and of outside TCP packets to a node address
//! on one of the LB's node-probe ports (`PROBE_PORTS`), read from the skb through BTF offsets.

use aya_ebpf::{
    EbpfContext,
    cty::c_void,
    helpers::{
        bpf_ktime_get_ns, bpf_probe_read_kernel, generated::bpf_probe_read_kernel as gen_read,
    },
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use probe_common::{
    DropDestinationKey, DropKey, KernelOffsets, family, kind, probe_ports, stat, tag,
};

use crate::{
    emit::{Meta, count, emit, flow_of, may_emit, stat_add},
    lookup::lookup_tag,
    maps::{CONFIG, DROP_DESTINATIONS, DROPS, NICS, OFFSETS, PROBE_PORTS},
    packet::{IPPROTO_TCP, IPPROTO_UDP, Packet, PacketBytes, bytes},
};

#[inline(always)]
fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address and fails instead of faulting; only a value comes back.
    unsafe { bpf_probe_read_kernel(base.add(offset as usize) as *const T).ok() }
}

/// Parses the IP header of a dropped skb through `skb->head + skb->network_header`.
#[inline(always)]
fn parse_skb(skb: *const u8, off: &KernelOffsets) -> Option<Packet> {
    let head: *const u8 = read(skb, off.skb_head)?;
    let nh: u16 = read(skb, off.skb_network_header)?;
    // network_header is ~0 when unset.
    if nh == u16::MAX || head.is_null() {
        return None;
    }
    // SAFETY: address arithmetic only: the address is read through bpf_probe_read_kernel, never dereferenced here.
    let ip = unsafe { head.add(nh as usize) };
    let first: u8 = read(ip, 0)?;
    let mut pkt = Packet::default();
    let l4_off: u32 = match first >> 4 {
        4 => {
            pkt.family = family::V4;
            pkt.proto = read(ip, 9)?;
            pkt.saddr[0] = read(ip, 12)?;
            pkt.daddr[0] = read(ip, 16)?;
            let frag = u16::from_be(read::<u16>(ip, 6)?) & 0x1fff;
            if frag != 0 {
                return Some(pkt);
            }
            ((first & 0x0f) as u32) * 4
        }
        6 => {
            pkt.family = family::V6;
            pkt.proto = read(ip, 6)?;
            pkt.saddr = read(ip, 8)?;
            pkt.daddr = read(ip, 24)?;
            40
        }
        _ => return None,
    };
    if pkt.proto == IPPROTO_TCP || pkt.proto == IPPROTO_UDP {
        let ports: [u8; 4] = read(ip, l4_off)?;
        pkt.sport = u16::from_be_bytes([ports[0], ports[1]]);
        pkt.dport = u16::from_be_bytes([ports[2], ports[3]]);
        if pkt.proto == IPPROTO_TCP {
            pkt.tcp_flags = read(ip, l4_off + 13).unwrap_or(0);
        }
    }
    Some(pkt)
}

/// A dropped skb's packet as record bytes: from `head + network_header` to the end of the
/// linear data (`head + tail`) and no further than the IP packet's own length, read with
/// `bpf_probe_read_kernel` (a tracepoint cannot use the skb helpers). Read only for a drop
/// that is being recorded.
struct SkbBytes<'a> {
    skb: *const u8,
    off: &'a KernelOffsets,
}

impl SkbBytes<'_> {
    #[inline(always)]
    fn network_header(&self) -> Option<(*const u8, u32)> {
        let head: *const u8 = read(self.skb, self.off.skb_head)?;
        let nh: u16 = read(self.skb, self.off.skb_network_header)?;
        if nh == u16::MAX || head.is_null() || self.off.skb_tail == 0 {
            return None;
        }
        let tail: u32 = read(self.skb, self.off.skb_tail)?;
        let linear = tail.checked_sub(u32::from(nh))?;
        // SAFETY: address arithmetic only: the address is read through bpf_probe_read_kernel, never dereferenced here.
        let ip = unsafe { head.add(nh as usize) };
        // The IP packet's length: the linear data may hold link-layer padding after it.
        let ip_len = match read::<u8>(ip, 0)? >> 4 {
            4 => u32::from(u16::from_be(read::<u16>(ip, 2)?)),
            6 => 40 + u32::from(u16::from_be(read::<u16>(ip, 4)?)),
            _ => return None,
        };
        Some((ip, linear.min(ip_len)))
    }
}

impl PacketBytes for SkbBytes<'_> {
    #[inline(always)]
    fn available(&self) -> u32 {
        self.network_header().map_or(0, |(_, n)| n)
    }

    #[inline(always)]
    fn copy_to(&self, dst: *mut u8, len: u32) -> bool {
        let Some((ip, _)) = self.network_header() else {
            return false;
        };
        // SAFETY: the caller bounds `len` to the record's buffer at `dst`.
        unsafe { gen_read(dst as *mut c_void, len, ip as *const c_void) == 0 }
    }
}

/// Whether a dropped skb's IP source equals its destination (IPv4, or IPv6 compared as four
/// words): the first filter of another namespace's drops, three or four reads.
#[inline(always)]
fn self_addressed(skb: *const u8, off: &KernelOffsets) -> bool {
    let Some(head) = read::<*const u8>(skb, off.skb_head) else {
        return false;
    };
    let Some(nh) = read::<u16>(skb, off.skb_network_header) else {
        return false;
    };
    if nh == u16::MAX || head.is_null() {
        return false;
    }
    // SAFETY: address arithmetic only: the address is read through bpf_probe_read_kernel, never dereferenced here.
    let ip = unsafe { head.add(nh as usize) };
    match read::<u8>(ip, 0).map(|b| b >> 4) {
        Some(4) => matches!(read::<[u32; 2]>(ip, 12), Some([s, d]) if s == d),
        Some(6) => matches!(read::<[u32; 8]>(ip, 8), Some(a) if a[..4] == a[4..]),
        _ => false,
    }
}

/// Whether a dropped packet's destination is one of `DROP_DESTINATIONS`.
///
/// Why a map of its own and not a tag in the address tries: the tries answer "is this address
/// local" for the TC programs on every packet; an LB IP tagged there would turn the LB's own
/// packets into suspects on NIC ingress and stop the node's SYNs to it from being recorded on
/// egress (they record only non-local destinations). This hash is read only here, on a drop
/// (never per packet), and only for a local pod's packet that did not come in through a NIC
/// (or the node's own outgoing packet) and whose destination both look-ups missed or found a
/// bound VIP: a third look-up on that path alone.
#[inline(always)]
fn watched_destination(pkt: &Packet) -> bool {
    let key = DropDestinationKey {
        addr: bytes(pkt.daddr),
        family: pkt.family,
        _pad: [0; 3],
    };
    // SAFETY: a map look-up whose value is only read during this run (userspace may replace it: a stale read is a stale answer, not a fault).
    unsafe { DROP_DESTINATIONS.get(key) }.is_some()
}

/// Whether a dropped packet is an outside TCP packet to a node address on one of the LB's
/// node-probe ports (`PROBE_PORTS`: kube-proxy's healthz :10256, the healthCheckNodePorts):
/// the LB's health check refused (`NO_SOCKET`: nothing listens) or dropped (a firewall) on
/// this node, `lb_probe_refused`. Three compares, then one array load, on a drop only.
#[inline(always)]
fn is_probe_to_node(pkt: &Packet, src_tag: u8, dst_tag: u8) -> bool {
    if src_tag != tag::NONE || dst_tag != tag::NODE || pkt.proto != IPPROTO_TCP {
        return false;
    }
    let (word, bit) = probe_ports::slot(pkt.dport);
    PROBE_PORTS.get(word).is_some_and(|w| w & bit != 0)
}

/// The interface a dropped skb came in on (`skb_iif`); 0 for another namespace's drop, whose
/// interface numbers name nothing on the node.
#[inline(always)]
fn input_ifindex(skb: *const u8, off: &KernelOffsets, foreign: bool) -> u32 {
    if foreign {
        return 0;
    }
    read(skb, off.skb_iif).unwrap_or(0)
}

/// The inode of a dropped skb's network namespace: its device's, or, before it has one, its
/// socket's (0 when it has neither). This host's own packet dropped at the output hook has no
/// device yet (`ip_output` sets `skb->dev`, after `NF_INET_LOCAL_OUT`), so only its socket
/// says whose it is: the node's host-network caller, or a pod's process in the pod's
/// namespace. Three reads through the device; through the socket, one more.
#[inline(always)]
fn skb_netns(skb: *const u8, off: &KernelOffsets) -> u32 {
    let net = match read::<*const u8>(skb, off.skb_dev) {
        Some(dev) if !dev.is_null() => read::<*const u8>(dev, off.dev_nd_net),
        _ => socket_net(skb, off),
    };
    match net {
        Some(net) if !net.is_null() => read(net, off.net_ns_inum).unwrap_or(0),
        _ => 0,
    }
}

/// `skb->sk->__sk_common.skc_net.net`, when the skb has a socket.
#[inline(always)]
fn socket_net(skb: *const u8, off: &KernelOffsets) -> Option<*const u8> {
    let sk = read::<*const u8>(skb, off.skb_sk)?;
    if sk.is_null() {
        return None;
    }
    read(sk, off.sk_net)
}

/// The source tag a drop is reported with (`tag::NONE` when only its destination matters), or
/// `None` when the drop is none of the probe's: a local source that did not come in through a
/// monitored NIC, a call that is neither a local caller's to a watched destination nor the
/// LB's probe, and not to a VIP.
#[inline(always)]
fn reported_source(
    pkt: &Packet,
    src_tag: u8,
    dst_tag: u8,
    iif: u32,
    self_loop: bool,
    outside_probe: bool,
) -> Option<u8> {
    // A local-source packet (and the LB's probe) matters only when it came in through a
    // monitored NIC: the node's own outbound packets (iif 0) carry node sources legitimately.
    // SAFETY: a map look-up whose value is only read during this run (userspace may replace it: a stale read is a stale answer, not a fault).
    let from_nic = (src_tag != tag::NONE || outside_probe) && unsafe { NICS.get(iif) }.is_some();
    let src_relevant = self_loop || (src_tag != tag::NONE && from_nic);
    let probe_refused = outside_probe && from_nic;
    // A local pod's call dropped on its way to a watched destination (kube-proxy's nftables
    // `no-endpoint-services` drop, its source-range firewalls): reported with the pod as
    // source, whatever the interface. IPVS mode binds the LB IP on kube-ipvs0 (a VIP here),
    // and its source-range firewall drops the call in INPUT. The node's own call (a
    // host-network caller: a node source that came in on no interface) dies the same way at
    // the output hook, before DNAT, in kube-proxy's nftables mode before kubernetes#132456
    // (`filter-output` at priority -110; moved after DNAT in 1.34, #133969 in 1.33.6).
    let local_caller = src_tag == tag::POD || (src_tag == tag::NODE && iif == 0);
    let call_to_watched = !src_relevant
        && local_caller
        && (dst_tag == tag::NONE || dst_tag == tag::VIP)
        && watched_destination(pkt);
    if !src_relevant && !call_to_watched && !probe_refused && dst_tag != tag::VIP {
        return None;
    }
    Some(if src_relevant || call_to_watched {
        src_tag
    } else {
        tag::NONE
    })
}

/// Common body of the tp_btf and raw tracepoint programs: both get (skb, location, reason).
/// Kernels before 5.17 pass no reason: their variants give 0 (`SKB_NOT_DROPPED_YET` where the
/// enum exists, never a real drop's reason) and userspace classifies by the drop site.
#[inline(always)]
fn on_kfree_skb<C: EbpfContext>(ctx: &C, skb: *const u8, location: u64, reason: u32) {
    let cfg = CONFIG.load();
    if reason == cfg.reason_consumed || skb.is_null() {
        return;
    }
    let off = OFFSETS.load();
    if off.valid == 0 {
        return;
    }
    // Cheapest filter first: every namespace's drops (each pod's) hit this hook, and the
    // namespace costs three or four reads where parsing and two lookups cost more.
    let netns = skb_netns(skb, &off);
    // Another namespace's drop (a pod's) matters only when it is self-addressed: a pod's call
    // to its own Service, DNATed back to itself without the hairpin SNAT, dies in the pod's
    // namespace as a local source (`service_self_loop`). Two address reads decide it before
    // any parsing or look-up; the drop site there is the pod's, so no interface is reported.
    let foreign = cfg.netns_ino != 0 && netns != cfg.netns_ino;
    if foreign && !self_addressed(skb, &off) {
        return;
    }
    let Some(pkt) = parse_skb(skb, &off) else {
        return;
    };
    let src_tag = lookup_tag(pkt.family, &pkt.saddr);
    // A self-addressed local pod packet: the destination is the source, one look-up serves
    // both (and on the node, it is the hairpin that never left the pod's bridge port).
    let self_loop = src_tag == tag::POD && pkt.saddr == pkt.daddr;
    if foreign && !self_loop {
        return;
    }
    let dst_tag = if self_loop {
        src_tag
    } else {
        lookup_tag(pkt.family, &pkt.daddr)
    };
    let outside_probe = !foreign && is_probe_to_node(&pkt, src_tag, dst_tag);
    if src_tag == tag::NONE && dst_tag != tag::VIP && !outside_probe {
        return;
    }
    let iif = input_ifindex(skb, &off, foreign);
    let Some(src_tag) = reported_source(&pkt, src_tag, dst_tag, iif, self_loop, outside_probe)
    else {
        return;
    };
    stat_add(stat::DROPS_MATCHED);
    // Off unless the agent runs with --ebpf-log (then one global check per matched drop).
    aya_log_ebpf::debug!(
        ctx,
        "matched drop: reason {} src_tag {} dst_tag {} iif {}",
        reason,
        src_tag,
        dst_tag,
        iif
    );
    count(
        &DROPS,
        &DropKey {
            reason,
            src_tag,
            dst_tag,
            _pad: [0; 2],
        },
    );
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if !may_emit(&flow_of(&pkt, kind::DROP), src_tag, now, &cfg) {
        return;
    }
    emit(
        &cfg,
        &pkt,
        Meta {
            kind: kind::DROP,
            src_tag,
            dst_tag,
            ifindex: iif,
            reason,
            location,
            netns,
            now,
        },
        &SkbBytes { skb, off: &off },
    );
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn clb_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    let reason: u32 = ctx.arg(2);
    on_kfree_skb(&ctx, skb, location, reason);
    0
}

#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn clb_kfree_skb_raw(ctx: RawTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    let reason: u32 = ctx.arg(2);
    on_kfree_skb(&ctx, skb, location, reason);
    0
}

// The two-argument tracepoint of kernels before 5.17 (skb, location): the verifier refuses a
// program that reads an argument the tracepoint does not have, so each hook has a variant
// that reads only two. The agent loads the one the running kernel's BTF prototype fits.

#[btf_tracepoint(function = "kfree_skb")]
pub fn clb_kfree_skb_site(ctx: BtfTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    on_kfree_skb(&ctx, skb, location, 0);
    0
}

#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn clb_kfree_skb_site_raw(ctx: RawTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    on_kfree_skb(&ctx, skb, location, 0);
    0
}
