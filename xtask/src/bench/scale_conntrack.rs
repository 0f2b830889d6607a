//! Part 9's conntrack load (`--scale-conntrack N`): the issue's RSS target is "at 30,000
//! Services plus 500,000 conntrack entries", so the bench node namespace's conntrack table is
//! filled before the agent starts and emptied after the RSS is read.
//!
//! Half a million connections cannot be made by real clients in a bench step; the entries are
//! created directly with ctnetlink `IPCTNL_MSG_CT_NEW` (as `conntrack -I` does), hundreds per
//! `send`, each an ESTABLISHED TCP connection from a client to one of the bench's ClusterIPs
//! (port 80) with a one-hour timeout. Message layout: kernel uapi
//! `include/uapi/linux/netfilter/nfnetlink_conntrack.h` (`enum cntl_msg_types`,
//! `enum ctattr_type`, `ctattr_tuple`, `ctattr_ip`, `ctattr_l4proto`, `ctattr_protoinfo_tcp`)
//! and `net/netfilter/nf_conntrack_netlink.c` `ctnetlink_new_conntrack` (a tuple and
//! `CTA_TIMEOUT` are required to create). `IPCTNL_MSG_CT_DELETE` without a tuple flushes the
//! family's table (`ctnetlink_del_conntrack` -> `ctnetlink_flush_conntrack`).
//!
//! `net.netfilter.nf_conntrack_max` (global: only the initial namespace may write it) is
//! raised for the run when it is below what is asked and restored after ([`Fill`]'s drop).

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result, bail};

use super::{net, scale_rules::cluster_ip};

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_ERROR: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_PROTOINFO: u16 = 4;
const CTA_TIMEOUT: u16 = 7;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
/// uapi `enum tcp_conntrack`.
const TCP_CONNTRACK_ESTABLISHED: u8 = 3;
/// Messages per `send` (each ~140 bytes).
const BATCH: usize = 400;
const MAX_SYSCTL: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

/// A filled conntrack table: flushed, and `nf_conntrack_max` restored, on drop.
pub struct Fill {
    restore_max: Option<String>,
    /// Entries in the namespace's table after the fill.
    pub entries: usize,
}

impl Fill {
    /// `count` TCP entries to the first `services` ClusterIPs (at least one), created in the
    /// bench node namespace.
    pub fn new(count: usize, services: usize) -> Result<Fill> {
        let before = std::fs::read_to_string(MAX_SYSCTL)
            .with_context(|| format!("{MAX_SYSCTL} (is nf_conntrack loaded?)"))?;
        let max: usize = before.trim().parse().context(MAX_SYSCTL)?;
        // Room for the entries and for the bench's own traffic.
        let want = count + 65_536;
        let mut fill = Fill {
            restore_max: None,
            entries: 0,
        };
        if max < want {
            std::fs::write(MAX_SYSCTL, want.to_string())
                .with_context(|| format!("raising {MAX_SYSCTL} to {want}"))?;
            fill.restore_max = Some(before.trim().to_string());
        }
        let t = std::time::Instant::now();
        test_support::lab::in_netns(net::NS_NODE, || {
            let sock = Socket::open()?;
            let _ = sock.send_batch(&[flush_message(1)]);
            let mut seq = 2u32;
            let mut start = 0;
            while start < count {
                let end = (start + BATCH).min(count);
                let batch: Vec<Vec<u8>> = (start..end)
                    .map(|i| {
                        seq += 1;
                        new_message(seq, i, services.max(1), i + 1 == end)
                    })
                    .collect();
                sock.send_batch(&batch)
                    .with_context(|| format!("creating conntrack entries {start}..{end}"))?;
                start = end;
            }
            Ok(())
        })?;
        fill.entries = entries_in_node_ns()?;
        eprintln!(
            "bench: scale   {} conntrack entries created in {:.1} s ({} in the table)",
            count,
            t.elapsed().as_secs_f64(),
            fill.entries
        );
        Ok(fill)
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        let _ = test_support::lab::in_netns(net::NS_NODE, || {
            Socket::open()?.send_batch(&[flush_message(1)])
        });
        if let Some(max) = self.restore_max.take() {
            let _ = std::fs::write(MAX_SYSCTL, max);
        }
    }
}

/// `nf_conntrack_count` of the bench node namespace.
pub fn entries_in_node_ns() -> Result<usize> {
    test_support::lab::in_netns(net::NS_NODE, || {
        let count = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")?;
        Ok(count.trim().parse()?)
    })
}

/// The client of entry `i`: 172.16.0.0/12 addresses, 50,000 source ports each.
fn client(i: usize) -> (Ipv4Addr, u16) {
    let host = (i / 50_000) as u32 + 1;
    (
        Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + host),
        10_000 + (i % 50_000) as u16,
    )
}

fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn nested(buf: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let mut payload = Vec::new();
    inner(&mut payload);
    attr(buf, kind | NLA_F_NESTED, &payload);
}

fn tuple(buf: &mut Vec<u8>, kind: u16, src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16)) {
    nested(buf, kind, |t| {
        nested(t, CTA_TUPLE_IP, |ip| {
            attr(ip, CTA_IP_V4_SRC, &src.0.octets());
            attr(ip, CTA_IP_V4_DST, &dst.0.octets());
        });
        nested(t, CTA_TUPLE_PROTO, |p| {
            attr(p, CTA_PROTO_NUM, &[libc::IPPROTO_TCP as u8]);
            attr(p, CTA_PROTO_SRC_PORT, &src.1.to_be_bytes());
            attr(p, CTA_PROTO_DST_PORT, &dst.1.to_be_bytes());
        });
    });
}

/// nlmsghdr + nfgenmsg (AF_INET, version 0, res_id 0) + `attrs`.
fn message(kind: u16, flags: u16, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(20 + attrs.len());
    m.extend_from_slice(&((20 + attrs.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
    m.extend_from_slice(attrs);
    m
}

/// `IPCTNL_MSG_CT_NEW` of entry `i` (an ack asked for when `ack`: the last of a batch).
fn new_message(seq: u32, i: usize, services: usize, ack: bool) -> Vec<u8> {
    let client = client(i);
    let ip: Ipv4Addr = cluster_ip(i % services)
        .parse()
        .expect("the bench's ClusterIPs");
    let service = (ip, 80);
    let mut attrs = Vec::with_capacity(128);
    tuple(&mut attrs, CTA_TUPLE_ORIG, client, service);
    tuple(&mut attrs, CTA_TUPLE_REPLY, service, client);
    attr(&mut attrs, CTA_TIMEOUT, &3600u32.to_be_bytes());
    nested(&mut attrs, CTA_PROTOINFO, |p| {
        nested(p, CTA_PROTOINFO_TCP, |t| {
            attr(t, CTA_PROTOINFO_TCP_STATE, &[TCP_CONNTRACK_ESTABLISHED]);
        });
    });
    let mut flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL;
    if ack {
        flags |= NLM_F_ACK;
    }
    message(IPCTNL_MSG_CT_NEW, flags, seq, &attrs)
}

/// `IPCTNL_MSG_CT_DELETE` without a tuple: every IPv4 entry of the namespace.
fn flush_message(seq: u32) -> Vec<u8> {
    message(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq, &[])
}

struct Socket(i32);

impl Socket {
    fn open() -> Result<Socket> {
        // SAFETY: plain socket(2); the fd is owned by the returned value.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, NETLINK_NETFILTER) };
        if fd < 0 {
            bail!("netlink socket: {}", std::io::Error::last_os_error());
        }
        Ok(Socket(fd))
    }

    /// Sends `messages` in one `send` and reads the answers up to the ack of the last one
    /// (which asks for it): an error on any of them fails the batch.
    fn send_batch(&self, messages: &[Vec<u8>]) -> Result<()> {
        let buf = messages.concat();
        // SAFETY: `buf` is valid for its length; the kernel fills in the destination.
        let sent = unsafe { libc::send(self.0, buf.as_ptr().cast(), buf.len(), 0) };
        if sent < 0 || sent as usize != buf.len() {
            bail!("netlink send: {}", std::io::Error::last_os_error());
        }
        let last_seq = messages
            .last()
            .map(|m| u32::from_ne_bytes(m[8..12].try_into().expect("4 bytes")))
            .unwrap_or_default();
        let mut reply = vec![0u8; 65_536];
        loop {
            // SAFETY: `reply` is valid for its length.
            let got = unsafe { libc::recv(self.0, reply.as_mut_ptr().cast(), reply.len(), 0) };
            if got < 0 {
                bail!("netlink recv: {}", std::io::Error::last_os_error());
            }
            let mut at = 0;
            let got = got as usize;
            while at + 16 <= got {
                let len = u32::from_ne_bytes(reply[at..at + 4].try_into().expect("4")) as usize;
                let kind = u16::from_ne_bytes(reply[at + 4..at + 6].try_into().expect("2"));
                let seq = u32::from_ne_bytes(reply[at + 8..at + 12].try_into().expect("4"));
                if kind == NLMSG_ERROR && at + 20 <= got {
                    let errno = i32::from_ne_bytes(reply[at + 16..at + 20].try_into().expect("4"));
                    if errno != 0 {
                        bail!(
                            "ctnetlink refused message {seq}: {}",
                            std::io::Error::from_raw_os_error(-errno)
                        );
                    }
                    if seq == last_seq {
                        return Ok(());
                    }
                }
                if len < 16 {
                    break;
                }
                at += len.next_multiple_of(4);
            }
        }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the fd is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_entry_is_one_well_formed_ctnetlink_message() {
        let m = new_message(7, 3, 10, true);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x100);
        let flags = u16::from_ne_bytes(m[6..8].try_into().unwrap());
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK);
        assert_eq!(m.len() % 4, 0);
        // The ClusterIP of Service 3 is in the original tuple's destination.
        assert!(m.windows(4).any(|w| w == [10, 96, 0, 4]));
        // Distinct clients for distinct entries.
        assert_ne!(client(0), client(50_000));
        assert_ne!(client(1), client(2));
    }
}
