//! One blocking netlink request/dump helper for every reader and the clsact fallback:
//! ctnetlink (`state::conntrack`), generic netlink (`state::ipvs`) and rtnetlink TC messages
//! (`kernel::tc`). Messages are built and parsed with the `netlink-packet-*` crates; this
//! module only sends one request and collects its reply, however many datagrams it spans.
//!
//! The socket is a plain blocking one, so every call works in the network namespace of the
//! calling thread (the agent runs inside `ip netns exec`; tests `setns` a dedicated thread).
//! Replies come back as the raw bytes of their messages, concatenated as received: the decoders
//! are pure functions of those bytes, and test fixtures are captured replies.

use std::{io, os::fd::AsRawFd, time::Duration};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkMessage,
    NetlinkSerializable,
};
use netlink_sys::{Socket, SocketAddr};

/// How long one receive may wait for the kernel before the request fails.
const RECV_TIMEOUT: Duration = Duration::from_secs(5);
/// Large enough for any single datagram the kernel sends in a dump.
const RECV_BUF: usize = 256 * 1024;
const HEADER_LEN: usize = 16;

/// Why a netlink request failed. `op` names the request (e.g. "conntrack dump").
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// Opening, sending on or receiving from the socket failed.
    #[error("netlink {op}: {call}: {source}")]
    Socket {
        op: &'static str,
        call: &'static str,
        #[source]
        source: io::Error,
    },
    /// The kernel answered with an error (`NLMSG_ERROR`, or an error in `NLMSG_DONE`).
    #[error("netlink {op}: the kernel refused: {source}")]
    Kernel {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The reply is not a sequence of whole netlink messages.
    #[error("netlink {op}: malformed reply: {source}")]
    Framing {
        op: &'static str,
        #[source]
        source: FramingError,
    },
}

impl NetlinkError {
    /// The errno of a kernel refusal (`ENOENT`, `EPERM`, ...), if that is what this is.
    pub fn kernel_errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// A buffer that does not split into whole netlink messages.
#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    #[error("bad netlink message length {len} at offset {offset}")]
    BadLength { len: usize, offset: usize },
    #[error("{trailing} trailing bytes at offset {offset}: a truncated message")]
    Truncated { trailing: usize, offset: usize },
    #[error("the socket closed before the reply was complete")]
    Closed,
}

/// A blocking netlink socket of one protocol, for one request after another.
pub struct Connection {
    socket: Socket,
    seq: u32,
}

impl Connection {
    /// Opens a socket of `protocol` (`netlink_sys::protocols::NETLINK_*`) in the calling
    /// thread's network namespace.
    pub fn open(protocol: isize, op: &'static str) -> Result<Connection, NetlinkError> {
        let err = |call| move |source| NetlinkError::Socket { op, call, source };
        let mut socket = Socket::new(protocol).map_err(err("socket"))?;
        socket.bind_auto().map_err(err("bind"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(err("connect"))?;
        set_recv_timeout(&socket, RECV_TIMEOUT).map_err(err("setsockopt"))?;
        Ok(Connection { socket, seq: 0 })
    }

    /// Sends `msg` as a request and returns its reply: every message up to `NLMSG_DONE`
    /// (with `dump`) or up to the ACK (without: the request asks for one), the last included.
    /// A kernel error anywhere in the reply fails the request.
    pub fn request<T>(
        &mut self,
        op: &'static str,
        msg: NetlinkMessage<T>,
        dump: bool,
    ) -> Result<Vec<u8>, NetlinkError>
    where
        T: NetlinkSerializable,
    {
        let mut out = Vec::new();
        self.request_each(op, msg, dump, &mut |bytes| out.extend_from_slice(bytes))?;
        Ok(out)
    }

    /// [`Connection::request`] handing each reply message to `on_message` as it arrives
    /// instead of collecting them: a dump of 60,000 rules is decoded datagram by datagram,
    /// never held whole.
    pub fn request_each<T>(
        &mut self,
        op: &'static str,
        mut msg: NetlinkMessage<T>,
        dump: bool,
        on_message: &mut dyn FnMut(&[u8]),
    ) -> Result<(), NetlinkError>
    where
        T: NetlinkSerializable,
    {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        msg.header.flags |= NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
        msg.header.sequence_number = seq;
        msg.finalize();
        let mut tx = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut tx);
        let sock_err = |call| move |source| NetlinkError::Socket { op, call, source };
        self.socket.send(&tx, 0).map_err(sock_err("send"))?;

        // Received into spare capacity: never zeroed first (a zeroed 256 KiB per request was
        // a fifth of the agent's CPU under kube-proxy's re-syncs, a chain dump per request).
        let mut rx: Vec<u8> = Vec::with_capacity(RECV_BUF);
        loop {
            rx.clear();
            let n = self.socket.recv(&mut rx, 0).map_err(sock_err("recv"))?;
            let n = n.min(rx.len());
            if n == 0 {
                return Err(NetlinkError::Framing {
                    op,
                    source: FramingError::Closed,
                });
            }
            let datagram =
                split(&rx[..n]).map_err(|source| NetlinkError::Framing { op, source })?;
            for bytes in datagram {
                let header = NetlinkBuffer::new(bytes);
                if header.sequence_number() != seq {
                    continue;
                }
                on_message(bytes);
                match header.message_type() {
                    NLMSG_DONE | NLMSG_ERROR => {
                        if let Some(source) = kernel_error(bytes) {
                            return Err(NetlinkError::Kernel { op, source });
                        }
                        // An ACK inside a dump (some families send one first) is not its end.
                        if header.message_type() == NLMSG_DONE || !dump {
                            return Ok(());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Sends one request on a fresh socket of `protocol`: see [`Connection::request`] (and
/// [`request_kept`] for look-ups that must not wait for the socket's close).
pub fn request(
    protocol: isize,
    op: &'static str,
    msg: NetlinkMessage<impl NetlinkSerializable>,
    dump: bool,
) -> Result<Vec<u8>, NetlinkError> {
    Connection::open(protocol, op)?.request(op, msg, dump)
}

thread_local! {
    /// This thread's kept sockets: (protocol, network namespace inode, connection).
    static KEPT: std::cell::RefCell<Vec<(isize, u64, Connection)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The calling thread's network namespace (the inode of `/proc/thread-self/ns/net`).
fn thread_netns() -> Option<u64> {
    let link = std::fs::read_link("/proc/thread-self/ns/net").ok()?;
    link.to_str()?
        .strip_prefix("net:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// [`request`] on a socket this thread keeps open, one per protocol and network namespace
/// (opened on first use). For look-ups on the detection path: **closing** a netlink socket
/// takes the kernel's netlink table for writing (`netlink_remove` -> `netlink_table_grab`),
/// which waits while broadcasts are being delivered, and an nf_tables commit at 10,000
/// Services broadcasts ~140,000 notifications back to back: a fresh socket per conntrack
/// look-up waited 1-2 s at each kube-proxy re-sync (measured: `chaos --scale-only`, and
/// `conntrack -G` in a loop beside an `iptables-restore`), a kept one none. A socket that
/// failed (not a kernel refusal) is dropped and the request tried once more on a new one;
/// replies to an abandoned request are skipped by sequence number.
pub fn request_kept(
    protocol: isize,
    op: &'static str,
    msg: NetlinkMessage<impl NetlinkSerializable + Clone>,
    dump: bool,
) -> Result<Vec<u8>, NetlinkError> {
    let Some(ns) = thread_netns() else {
        return request(protocol, op, msg, dump);
    };
    let (mut conn, fresh) = match take_kept(protocol, ns) {
        Some(c) => (c, false),
        None => (Connection::open(protocol, op)?, true),
    };
    let result = match conn.request(op, msg.clone(), dump) {
        Err(NetlinkError::Socket { .. } | NetlinkError::Framing { .. }) if !fresh => {
            conn = Connection::open(protocol, op)?;
            conn.request(op, msg, dump)
        }
        other => other,
    };
    keep_unless_failed(protocol, ns, conn, result)
}

/// Runs `f` on this thread's kept socket of `protocol` in the calling thread's network
/// namespace (see [`request_kept`] for why sockets are kept), opened on first use. A socket
/// that failed (not a kernel refusal) is closed, not kept; `f` is not run again: a caller
/// that streams a dump ([`Connection::request_each`]) restarts it whole.
pub fn with_kept<R>(
    protocol: isize,
    op: &'static str,
    f: impl FnOnce(&mut Connection) -> Result<R, NetlinkError>,
) -> Result<R, NetlinkError> {
    let Some(ns) = thread_netns() else {
        return f(&mut Connection::open(protocol, op)?);
    };
    let mut conn = match take_kept(protocol, ns) {
        Some(c) => c,
        None => Connection::open(protocol, op)?,
    };
    let result = f(&mut conn);
    keep_unless_failed(protocol, ns, conn, result)
}

/// This thread's kept socket of `protocol` in namespace `ns`, taken out while it is used.
fn take_kept(protocol: isize, ns: u64) -> Option<Connection> {
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        let at = k.iter().position(|(p, n, _)| *p == protocol && *n == ns)?;
        Some(k.swap_remove(at).2)
    })
}

/// Puts `conn` back unless `result` says the socket failed (a kernel refusal leaves it sound).
fn keep_unless_failed<R>(
    protocol: isize,
    ns: u64,
    conn: Connection,
    result: Result<R, NetlinkError>,
) -> Result<R, NetlinkError> {
    if matches!(result, Ok(_) | Err(NetlinkError::Kernel { .. })) {
        KEPT.with(|k| k.borrow_mut().push((protocol, ns, conn)));
    }
    result
}

/// Splits a buffer into whole netlink messages (each with its header); the last may lack its
/// alignment padding.
pub fn split(buf: &[u8]) -> Result<Vec<&[u8]>, FramingError> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset + HEADER_LEN <= buf.len() {
        let len = NetlinkBuffer::new(&buf[offset..]).length() as usize;
        if len < HEADER_LEN || offset + len > buf.len() {
            return Err(FramingError::BadLength { len, offset });
        }
        out.push(&buf[offset..offset + len]);
        offset += (len + 3) & !3;
    }
    if offset < buf.len() {
        return Err(FramingError::Truncated {
            trailing: buf.len() - offset,
            offset,
        });
    }
    Ok(out)
}

/// The error an `NLMSG_ERROR` or `NLMSG_DONE` message carries (None for an ACK or a clean end).
pub fn kernel_error(message: &[u8]) -> Option<io::Error> {
    let code = message
        .get(HEADER_LEN..HEADER_LEN + 4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0);
    (code < 0).then(|| io::Error::from_raw_os_error(-code))
}

fn set_recv_timeout(socket: &Socket, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid socket fd and a correctly sized timeval.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = HEADER_LEN + payload.len();
        let mut v = Vec::new();
        v.extend_from_slice(&(len as u32).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    #[test]
    fn splits_whole_messages_and_refuses_cut_ones() {
        let mut buf = message(0x20, 1, &[1, 2, 3, 4, 5]);
        buf.extend(message(NLMSG_DONE, 1, &0i32.to_ne_bytes()));
        let parts = split(&buf).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[0].len(),
            21,
            "length from the header, padding left out"
        );
        assert!(split(&[]).unwrap().is_empty());
        assert!(matches!(
            split(&buf[..buf.len() - 2]),
            Err(FramingError::BadLength { .. })
        ));
        assert!(matches!(
            split(&buf[..30]),
            Err(FramingError::Truncated { trailing: 6, .. })
        ));
        assert!(matches!(
            split(&[0xff; 40]),
            Err(FramingError::BadLength { .. })
        ));
    }

    #[test]
    fn kernel_errors_in_error_and_done_messages() {
        let ack = message(NLMSG_ERROR, 1, &0i32.to_ne_bytes());
        assert!(kernel_error(&ack).is_none());
        let enoent = message(NLMSG_ERROR, 1, &(-libc::ENOENT).to_ne_bytes());
        assert_eq!(
            kernel_error(&enoent).and_then(|e| e.raw_os_error()),
            Some(libc::ENOENT)
        );
        let interrupted = message(NLMSG_DONE, 1, &(-libc::EINTR).to_ne_bytes());
        assert_eq!(
            kernel_error(&interrupted).and_then(|e| e.raw_os_error()),
            Some(libc::EINTR)
        );
        // Linux allows an NLMSG_DONE without a payload.
        assert!(kernel_error(&message(NLMSG_DONE, 1, &[])).is_none());
    }

    /// The fd of this thread's kept socket of `protocol`, if there is one.
    fn kept_fd(protocol: isize) -> Option<i32> {
        KEPT.with(|k| {
            k.borrow()
                .iter()
                .find(|(p, _, _)| *p == protocol)
                .map(|(_, _, c)| c.socket.as_raw_fd())
        })
    }

    #[test]
    fn a_kept_socket_serves_every_request_and_survives_a_refusal() {
        use netlink_packet_route::{RouteNetlinkMessage, link::LinkMessage};
        use netlink_sys::protocols::NETLINK_ROUTE;
        // A thread of its own: its kept sockets are its own, closed when it ends.
        std::thread::spawn(|| {
            let links =
                || NetlinkMessage::from(RouteNetlinkMessage::GetLink(LinkMessage::default()));
            assert_eq!(kept_fd(NETLINK_ROUTE), None);
            let first = request_kept(NETLINK_ROUTE, "test links", links(), true).unwrap();
            assert!(!first.is_empty(), "at least lo");
            let fd = kept_fd(NETLINK_ROUTE).expect("kept after the first request");
            request_kept(NETLINK_ROUTE, "test links", links(), true).unwrap();
            // A link that does not exist: the kernel refuses, the socket stays.
            let mut missing = LinkMessage::default();
            missing.header.index = u32::MAX;
            let refused = request_kept(
                NETLINK_ROUTE,
                "test missing link",
                NetlinkMessage::from(RouteNetlinkMessage::GetLink(missing)),
                false,
            )
            .unwrap_err();
            assert!(refused.kernel_errno().is_some(), "{refused}");
            assert_eq!(kept_fd(NETLINK_ROUTE), Some(fd), "one socket throughout");
            KEPT.with(|k| assert_eq!(k.borrow().len(), 1));
        })
        .join()
        .unwrap();
    }
}
