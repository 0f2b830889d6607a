//! clb-probe's kernel half.
//!
//! - `clb_ingress` (tc/tcx, NIC ingress): a packet whose *source* is one of the node's own
//!   addresses (node, bound VIP, local pod) is a suspect: counted exactly, evented once per flow.
//! - `clb_egress` (tc/tcx, NIC egress): TCP SYNs and UDP packets that leave the node with a pod
//!   source (so after POSTROUTING, i.e. not SNATed), and TCP SYNs with a node source to a
//!   non-local address, are remembered in an LRU map, so a hairpin coming back can be tied to
//!   the VIP the pod (or the node) called.
//! - `clb_kfree_skb` (tp_btf, raw tracepoint as fallback): kernel drops of suspect packets, of
//!   packets addressed to bound VIPs, and of self-addressed local pod packets (in any
//!   namespace: a pod's call to its own Service dies in the pod), with the kernel's reason and
//!   drop site.
//!
//! Hot path rule: an ordinary packet costs a header parse and one LPM lookup, and is returned
//! unchanged. Programs never change a verdict (they return TC_ACT_UNSPEC / TCX_NEXT).
//!
//! One file per role: `maps` (settings and maps), `packet` (parsing), `lookup` (whose address),
//! `emit` (counters, dedup, budget, ring records), and one per program family: `ingress`,
//! `egress`, `drops`.
#![no_std]
#![no_main]

mod drops;
mod egress;
mod emit;
mod ingress;
mod lookup;
mod maps;
mod packet;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY: the kernel reads the license from this section; nothing else is placed there.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
