//! Cheap signals that the service table may have changed, so the full read (`iptables-save`,
//! `nft -j`, the IPVS dump) runs on change instead of on a timer.
//!
//! - nf_tables: every commit (iptables-nft, `iptables-restore` on the nft backend, `nft -f`,
//!   kube-proxy's nftables mode) ends with an `NFT_MSG_NEWGEN` message on the
//!   `NFNLGRP_NFTABLES` multicast group of `NETLINK_NETFILTER`. [`NftWatch`] subscribes and
//!   reports each commit. A full restore also publishes one message per rule: when they
//!   overflow the socket buffer the kernel says `ENOBUFS`, and that counts as a commit (the
//!   generation message may be among the lost ones). The generation is per network namespace
//!   and counts commits to any table, so a commit here is "maybe changed": the reader's hash of
//!   its dump says whether kube-proxy's rules really did.
//! - iptables-legacy has no notification: [`legacy_fingerprint`] is the entry count and blob
//!   size of each loaded legacy table (`IPT_SO_GET_INFO`, one `getsockopt` each; no module is
//!   loaded, only tables named in `/proc/net/ip*_tables_names` are asked). A rewrite that keeps
//!   both the same (an endpoint's address swapped for one of the same width) is not seen: the
//!   `--services-every` safety net catches it.
//! - IPVS's generic-netlink family has no multicast group: [`super::ipvs::services_digest`]
//!   dumps the virtual services alone (no per-service destination dumps, one round trip) and
//!   hashes them. Destination-only changes (endpoint churn) wait for the safety net: verdicts
//!   use which VIP:ports are served, the backends are evidence text.
//! - ipsets (IPVS mode's `externalTrafficPolicy: Local` NodePorts) have no notification either;
//!   they are re-read with every full read.

use std::io;

use crate::netlink;

/// `NFNLGRP_NFTABLES` (include/uapi/linux/netfilter/nfnetlink.h).
pub const NFNLGRP_NFTABLES: u32 = 7;
/// `NETLINK_NETFILTER`.
const NETLINK_NETFILTER: isize = 12;
/// `NFNL_SUBSYS_NFTABLES`.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFT_MSG_NEWGEN`: the message closing every nf_tables commit.
const NFT_MSG_NEWGEN: u16 = 15;
/// The netlink message type of a new generation.
pub const NEWGEN_TYPE: u16 = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN;

/// Whether a buffer of multicast messages holds a commit's generation message. Pure; a
/// malformed buffer counts as a commit (re-reading is the safe side).
pub fn has_new_generation(buf: &[u8]) -> bool {
    match netlink::split(buf) {
        Ok(messages) => messages
            .iter()
            .any(|m| m.len() >= 6 && u16::from_ne_bytes([m[4], m[5]]) == NEWGEN_TYPE),
        Err(_) => true,
    }
}

/// A subscription to nf_tables' commits in the calling thread's network namespace.
pub struct NftWatch {
    socket: netlink_sys::Socket,
    buf: Vec<u8>,
}

impl NftWatch {
    pub fn open() -> io::Result<NftWatch> {
        let mut socket = netlink_sys::Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.add_membership(NFNLGRP_NFTABLES)?;
        Ok(NftWatch {
            socket,
            buf: vec![0; 256 * 1024],
        })
    }

    /// Blocks until the next commit (or until messages were lost, which may hide one).
    pub fn wait_commit(&mut self) -> io::Result<()> {
        loop {
            match self.socket.recv(&mut &mut self.buf[..], 0) {
                Ok(n) if has_new_generation(&self.buf[..n]) => return Ok(()),
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO` (the same number at `SOL_IP` and `SOL_IPV6`).
const SO_GET_INFO: libc::c_int = 64;

/// `struct ipt_getinfo` (= `ip6t_getinfo`).
#[repr(C)]
struct GetInfo {
    name: [u8; 32],
    valid_hooks: u32,
    hook_entry: [u32; 5],
    underflow: [u32; 5],
    num_entries: u32,
    size: u32,
}

/// The entry count and blob size of each loaded legacy table, hashed; None when no legacy
/// table is loaded (then there is nothing of legacy to watch).
pub fn legacy_fingerprint() -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut any = false;
    for (names, family, level) in [
        (
            "/proc/thread-self/net/ip_tables_names",
            libc::AF_INET,
            libc::SOL_IP,
        ),
        (
            "/proc/thread-self/net/ip6_tables_names",
            libc::AF_INET6,
            libc::SOL_IPV6,
        ),
    ] {
        let Ok(text) = std::fs::read_to_string(names) else {
            continue;
        };
        for table in text.lines().map(str::trim).filter(|t| !t.is_empty()) {
            any = true;
            table.hash(&mut h);
            get_info(family, level, table).hash(&mut h);
        }
    }
    any.then(|| h.finish())
}

/// (entries, size, hook entry points) of one legacy table; None when it cannot be asked.
fn get_info(family: libc::c_int, level: libc::c_int, table: &str) -> Option<(u32, u32, [u32; 5])> {
    if table.len() >= 32 {
        return None;
    }
    // SAFETY: plain socket/getsockopt/close on a descriptor we own; `info` is a repr(C) struct
    // of the kernel's layout and its size is passed.
    unsafe {
        let fd = libc::socket(
            family,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        );
        if fd < 0 {
            return None;
        }
        let mut info: GetInfo = std::mem::zeroed();
        info.name[..table.len()].copy_from_slice(table.as_bytes());
        let mut len = std::mem::size_of::<GetInfo>() as libc::socklen_t;
        let rc = libc::getsockopt(fd, level, SO_GET_INFO, (&raw mut info).cast(), &mut len);
        libc::close(fd);
        (rc == 0).then_some((info.num_entries, info.size, info.hook_entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(ty: u16) -> Vec<u8> {
        let mut m = vec![0u8; 20];
        m[..4].copy_from_slice(&20u32.to_ne_bytes());
        m[4..6].copy_from_slice(&ty.to_ne_bytes());
        m
    }

    #[test]
    fn a_commit_is_its_generation_message() {
        // NFT_MSG_NEWRULE (6) alone is part of a commit still being published.
        let rule = message((NFNL_SUBSYS_NFTABLES << 8) | 6);
        assert!(!has_new_generation(&rule));
        let mut batch = rule.clone();
        batch.extend(message(NEWGEN_TYPE));
        assert!(has_new_generation(&batch));
        // Another subsystem's message with the same low byte is not one.
        assert!(!has_new_generation(&message((1 << 8) | NFT_MSG_NEWGEN)));
        // Garbage is treated as a change (a re-read is the safe side).
        assert!(has_new_generation(&[
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17
        ]));
    }
}
