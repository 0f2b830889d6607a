//! Which socket serves a port on this node: sock_diag (`NETLINK_SOCK_DIAG`, messages from the
//! `netlink-packet-sock-diag` crate) in the network namespace the agent watches (the calling
//! thread's), and the process that holds it (/proc/PID/fd). A host-listener hairpin names its
//! listener from this.
//!
//! A v4 destination may be served by a v4 socket or by a dual-stack v6 socket bound to `::`,
//! so both families are dumped for it; a socket bound to the exact address wins over a
//! wildcard one (the kernel's own preference).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, TCP_LISTEN},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use probe_contract::{Listener, Proto};

use crate::{netlink, netlink::NetlinkError};

/// One socket of a dump, reduced to what names a listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiagSocket {
    pub addr: IpAddr,
    pub port: u16,
    /// The peer port (0 for a listening TCP or unconnected UDP socket).
    pub peer_port: u16,
    pub state: u8,
    pub uid: u32,
    pub inode: u32,
}

/// The listener of `addr:port/proto` in the calling thread's network namespace (`Ok(None)`:
/// nothing listens there), with its process when /proc shows it. Blocking.
pub fn listener(addr: IpAddr, port: u16, proto: Proto) -> Result<Option<Listener>, NetlinkError> {
    let protocol = match proto {
        Proto::Tcp => IPPROTO_TCP,
        Proto::Udp => IPPROTO_UDP,
        _ => return Ok(None),
    };
    let mut sockets = Vec::new();
    let families: &[u8] = if addr.is_ipv4() {
        &[AF_INET, AF_INET6]
    } else {
        &[AF_INET6]
    };
    for family in families {
        sockets.extend(dump(*family, protocol)?);
    }
    let Some(s) = pick(&sockets, addr, port, proto) else {
        return Ok(None);
    };
    let owner = find_owner(Path::new("/proc"), s.inode);
    Ok(Some(Listener {
        addr: s.addr,
        port: s.port,
        proto,
        uid: s.uid,
        inode: s.inode,
        process: owner.as_ref().map(|(_, comm)| comm.clone()),
        pid: owner.map(|(pid, _)| pid),
        pod: None,
    }))
}

/// Every listening TCP socket of the calling thread's network namespace, both families.
/// Blocking.
pub fn tcp_listeners() -> Result<Vec<DiagSocket>, NetlinkError> {
    let mut sockets = dump(AF_INET, IPPROTO_TCP)?;
    sockets.extend(dump(AF_INET6, IPPROTO_TCP)?);
    Ok(sockets)
}

fn dump(family: u8, protocol: u8) -> Result<Vec<DiagSocket>, NetlinkError> {
    let socket_id = if family == AF_INET {
        SocketId::new_v4()
    } else {
        SocketId::new_v6()
    };
    let states = if protocol == IPPROTO_TCP {
        StateFlags::LISTEN
    } else {
        StateFlags::all()
    };
    let msg = NetlinkMessage::new(
        NetlinkHeader::default(),
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol,
            extensions: ExtensionFlags::empty(),
            states,
            socket_id,
        })
        .into(),
    );
    let op = "sock_diag dump";
    let reply = netlink::request_kept(netlink_sys::protocols::NETLINK_SOCK_DIAG, op, msg, true)?;
    let mut out = Vec::new();
    for bytes in netlink::split(&reply).map_err(|source| NetlinkError::Framing { op, source })? {
        let Ok(m) = NetlinkMessage::<SockDiagMessage>::deserialize(bytes) else {
            continue;
        };
        if let NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) = m.payload {
            out.push(DiagSocket {
                addr: r.header.socket_id.source_address,
                port: r.header.socket_id.source_port,
                peer_port: r.header.socket_id.destination_port,
                state: r.header.state,
                uid: r.header.uid,
                inode: r.header.inode,
            });
        }
    }
    Ok(out)
}

/// The socket that takes a new connection (TCP: listening) or datagram (UDP: unconnected) to
/// `addr:port` (pure): bound to exactly `addr` first, else a wildcard of its family, else a
/// dual-stack `::` socket for a v4 address.
pub fn pick(sockets: &[DiagSocket], addr: IpAddr, port: u16, proto: Proto) -> Option<DiagSocket> {
    let serving = |s: &&DiagSocket| {
        s.port == port
            && match proto {
                Proto::Tcp => s.state == TCP_LISTEN,
                _ => s.peer_port == 0,
            }
    };
    let mapped = match addr {
        IpAddr::V4(a) => Some(IpAddr::V6(a.to_ipv6_mapped())),
        IpAddr::V6(_) => None,
    };
    let rank = |s: &DiagSocket| -> Option<u8> {
        if s.addr == addr || Some(s.addr) == mapped {
            Some(0)
        } else if s.addr == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && addr.is_ipv4() {
            Some(1)
        } else if s.addr == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
            Some(2)
        } else {
            None
        }
    };
    sockets
        .iter()
        .filter(serving)
        .filter_map(|s| Some((rank(s)?, s)))
        .min_by_key(|(r, _)| *r)
        .map(|(_, s)| s.clone())
}

/// The process holding socket `inode`: (pid, command name), from `proc`'s fd links. Stops at
/// the first holder (a forked server shares its socket: any holder names it). The name is
/// escaped and bounded ([`probe_core::untrusted::text`]).
pub fn find_owner(proc: &Path, inode: u32) -> Option<(u32, String)> {
    let want = format!("socket:[{inode}]");
    for entry in std::fs::read_dir(proc).ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()));
        if holds {
            // Any user names its process (prctl, or the executable's file name): escaped and
            // bounded here, so every output that names the listener carries the safe form.
            let comm = std::fs::read(entry.path().join("comm"))
                .map(|c| {
                    let name = String::from_utf8_lossy(&c);
                    probe_core::untrusted::text(
                        name.trim(),
                        probe_core::untrusted::PROCESS_NAME_MAX,
                    )
                })
                .unwrap_or_else(|_| "?".into());
            return Some((pid, comm));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(addr: &str, port: u16, state: u8, inode: u32) -> DiagSocket {
        DiagSocket {
            addr: addr.parse().unwrap(),
            port,
            peer_port: 0,
            state,
            uid: 0,
            inode,
        }
    }

    #[test]
    fn the_exact_address_wins_then_the_wildcards() {
        let node: IpAddr = "198.18.0.2".parse().unwrap();
        let all = [
            s("::", 6443, TCP_LISTEN, 3),
            s("0.0.0.0", 6443, TCP_LISTEN, 2),
            s("198.18.0.2", 6443, TCP_LISTEN, 1),
            s("198.18.0.2", 6444, TCP_LISTEN, 9),
            // An established connection from the same port is no listener.
            s("198.18.0.2", 6443, 1, 8),
        ];
        let inode = |v: &[DiagSocket]| pick(v, node, 6443, Proto::Tcp).map(|s| s.inode);
        assert_eq!(inode(&all), Some(1));
        assert_eq!(inode(&all[..2]), Some(2));
        assert_eq!(
            inode(&all[..1]),
            Some(3),
            "a dual-stack :: socket serves v4"
        );
        assert_eq!(inode(&all[3..]), None);
        // Bound to another address: not this one's listener.
        assert_eq!(inode(&[s("198.18.0.9", 6443, TCP_LISTEN, 4)]), None);
        // A v4-mapped bind is the same address.
        assert_eq!(
            inode(&[s("::ffff:198.18.0.2", 6443, TCP_LISTEN, 5)]),
            Some(5)
        );
    }

    #[test]
    fn udp_takes_an_unconnected_socket() {
        let node: IpAddr = "198.18.0.2".parse().unwrap();
        let mut connected = s("0.0.0.0", 53, 1, 1);
        connected.peer_port = 4000;
        let unconnected = s("0.0.0.0", 53, 7, 2);
        let got = pick(&[connected, unconnected], node, 53, Proto::Udp);
        assert_eq!(got.map(|s| s.inode), Some(2));
    }

    #[test]
    fn the_owner_is_found_by_its_fd_link() {
        let dir = std::env::temp_dir().join(format!("clb-sockets-{}", std::process::id()));
        let fd = dir.join("4242/fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::write(dir.join("4242/comm"), "kube-apiserver\n").unwrap();
        std::os::unix::fs::symlink("socket:[777]", fd.join("3")).unwrap();
        std::fs::create_dir_all(dir.join("self")).unwrap();
        assert_eq!(
            find_owner(&dir, 777),
            Some((4242, "kube-apiserver".to_string()))
        );
        assert_eq!(find_owner(&dir, 778), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// E8: a user names its listener to clear the screen (and adds bytes no UTF-8 has): the
    /// name comes out escaped, never raw.
    #[test]
    fn a_hostile_command_name_comes_out_escaped() {
        let dir = std::env::temp_dir().join(format!("clb-sockets-hostile-{}", std::process::id()));
        let fd = dir.join("4343/fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::write(dir.join("4343/comm"), b"\x1b[2J ALL CLEAR\x07\n").unwrap();
        std::os::unix::fs::symlink("socket:[779]", fd.join("3")).unwrap();
        assert_eq!(
            find_owner(&dir, 779),
            Some((4343, "\\x1b[2J ALL CLEAR\\x07".to_string()))
        );
        std::fs::write(dir.join("4343/comm"), b"a\xff\x9b\n").unwrap();
        let (_, name) = find_owner(&dir, 779).unwrap();
        assert!(!name.chars().any(|c| c.is_control()), "{name:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
