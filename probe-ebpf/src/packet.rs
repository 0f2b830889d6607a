//! Parsing a packet on a tc hook: Ethernet, the IPv4/IPv6 fixed header, ports and TCP flags.

use aya_ebpf::{cty::c_void, helpers::bpf_skb_load_bytes, programs::TcContext};
use probe_common::family;

/// Where a record's packet bytes come from: the hook's own way of reading its packet.
/// Asked only once a record is being written (an anomaly), never for an ordinary packet.
pub(crate) trait PacketBytes {
    /// Bytes readable from the network header on (at most what the packet holds).
    fn available(&self) -> u32;
    /// Copies `len` bytes (1..=`CAPTURE_MAX`) from the network header to `dst`; false if
    /// they could not be read.
    fn copy_to(&self, dst: *mut u8, len: u32) -> bool;
}

pub(crate) const ETH_HLEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86DD;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_ACK: u8 = 0x10;

/// A parsed packet: addresses as raw network-order words (IPv4 in the first word), ports and
/// flags. Words, not byte arrays: LLVM scalarizes byte arrays into one spilled stack slot per
/// byte, which blows the verifier's 512-byte stack.
#[derive(Default)]
pub(crate) struct Packet {
    pub(crate) family: u8,
    pub(crate) proto: u8,
    pub(crate) tcp_flags: u8,
    pub(crate) saddr: [u32; 4],
    pub(crate) daddr: [u32; 4],
    pub(crate) sport: u16,
    pub(crate) dport: u16,
}

/// Our 16-byte address layout as words, for the records shared with userspace.
#[inline(always)]
pub(crate) fn bytes(words: [u32; 4]) -> [u8; 16] {
    // SAFETY: same size, any bit pattern is valid.
    unsafe { core::mem::transmute(words) }
}

#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
}

/// Reads a `T` at `offset`: direct packet access when the bytes are in the skb's linear part
/// (nearly always), else `bpf_skb_load_bytes`. A sender or driver can hand over an skb whose
/// linear part holds only the Ethernet header (trafgen's PF_PACKET ring does; so can NICs
/// that split headers): without the fallback such packets would pass unclassified.
#[inline(always)]
pub(crate) fn field<T: Copy>(ctx: &TcContext, offset: usize) -> Option<T> {
    match ptr_at::<T>(ctx, offset) {
        // SAFETY: ptr_at checked that a T at `offset` lies within the packet's data.
        Some(p) => Some(unsafe { *p }),
        None => ctx.load::<T>(offset).ok(),
    }
}

/// Reads ports and TCP flags at `l4`. Missing L4 (fragments, short packets) leaves them
/// zero: the addresses alone still classify the packet. One read per header: fewer bounds
/// checks, and no 1-byte reads (LLVM folds their `p + 1 > end` into `p >= end`, which the
/// verifier does not accept for a variable offset).
#[inline(always)]
pub(crate) fn parse_l4(ctx: &TcContext, l4: usize, pkt: &mut Packet) {
    match pkt.proto {
        IPPROTO_TCP => {
            if let Some(h) = field::<[u8; 14]>(ctx, l4) {
                pkt.sport = u16::from_be_bytes([h[0], h[1]]);
                pkt.dport = u16::from_be_bytes([h[2], h[3]]);
                pkt.tcp_flags = h[13];
            }
        }
        IPPROTO_UDP => {
            if let Some(h) = field::<[u8; 4]>(ctx, l4) {
                pkt.sport = u16::from_be_bytes([h[0], h[1]]);
                pkt.dport = u16::from_be_bytes([h[2], h[3]]);
            }
        }
        _ => {}
    }
}

/// Parses Ethernet + IPv4/IPv6 (fixed header), in one read; returns the packet (no ports
/// yet) and the L4 header's offset (0: none to read, a non-first fragment).
#[inline(always)]
pub(crate) fn parse_l3(ctx: &TcContext) -> Option<(Packet, usize)> {
    let ethertype = u16::from_be(field::<u16>(ctx, 12)?);
    let mut pkt = Packet::default();
    let mut l4 = 0;
    match ethertype {
        ETH_P_IP => {
            // Words as they lie in memory (network order); bytes by position.
            let h = field::<[u32; 5]>(ctx, ETH_HLEN)?;
            let (w0, w1, w2) = (h[0].to_le_bytes(), h[1].to_le_bytes(), h[2].to_le_bytes());
            let ihl = ((w0[0] & 0x0f) as usize) * 4;
            pkt.family = family::V4;
            pkt.proto = w2[1];
            pkt.saddr[0] = h[3];
            pkt.daddr[0] = h[4];
            // Non-first fragments carry no L4 header.
            let frag = u16::from_be_bytes([w1[2], w1[3]]) & 0x1fff;
            if frag == 0 && ihl >= 20 {
                l4 = ETH_HLEN + ihl;
            }
        }
        ETH_P_IPV6 => {
            let h = field::<[u32; 10]>(ctx, ETH_HLEN)?;
            pkt.family = family::V6;
            pkt.proto = h[1].to_le_bytes()[2];
            pkt.saddr = [h[2], h[3], h[4], h[5]];
            pkt.daddr = [h[6], h[7], h[8], h[9]];
            // Extension headers are not walked: such packets classify by address only.
            l4 = ETH_HLEN + 40;
        }
        _ => return None,
    }
    Some((pkt, l4))
}

/// A tc hook's packet as record bytes: from the network header (after Ethernet) to the end
/// of the skb, read with `bpf_skb_load_bytes` (linear or not).
pub(crate) struct TcBytes<'a>(pub(crate) &'a TcContext);

impl PacketBytes for TcBytes<'_> {
    #[inline(always)]
    fn available(&self) -> u32 {
        self.0.len().saturating_sub(ETH_HLEN as u32)
    }

    #[inline(always)]
    fn copy_to(&self, dst: *mut u8, len: u32) -> bool {
        // SAFETY: the caller bounds `len` to the record's buffer at `dst`.
        unsafe {
            bpf_skb_load_bytes(
                self.0.skb.skb as *const c_void,
                ETH_HLEN as u32,
                dst as *mut c_void,
                len,
            ) == 0
        }
    }
}

/// [`parse_l3`] and the ports and TCP flags.
#[inline(always)]
pub(crate) fn parse(ctx: &TcContext) -> Option<Packet> {
    let (mut pkt, l4) = parse_l3(ctx)?;
    if l4 != 0 {
        parse_l4(ctx, l4, &mut pkt);
    }
    Some(pkt)
}
