//! The lab's UDP client and server: one datagram out, one answer back (a DNS-like exchange).

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{Attempt, Outcome, client::in_netns};

/// A UDP server the lab runs: (namespace, port, name it answers with).
pub const UDP_SERVERS: &[(&str, u16, &str)] = &[(
    super::NS_POD_B,
    super::POD_UDP_PORT,
    "pod-b dns 198.19.1.11:5353",
)];

/// Answers every datagram with `ok from <name>`.
pub(crate) const UDP_SERVER_PY: &str = r#"
import socket, sys
name, port = sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", port))
while True:
    data, peer = s.recvfrom(512)
    s.sendto(("ok from %s\n" % name).encode(), peer)
"#;

/// One exchange from inside `ns` (bound to `src` if given): a connected UDP socket sends one
/// datagram to `dst` and waits `timeout` for the answer. A connected socket accepts answers
/// from `dst` only, as a real client's resolver does: an answer from any other address (the
/// hairpin's reply straight from the node) is no answer. ICMP port unreachable is `Refused`.
pub fn udp_exchange_in(
    ns: &str,
    src: Option<Ipv4Addr>,
    dst: SocketAddrV4,
    timeout: Duration,
) -> Result<Attempt> {
    in_netns(ns, || {
        let start = Instant::now();
        let sock = UdpSocket::bind(SocketAddrV4::new(src.unwrap_or(Ipv4Addr::UNSPECIFIED), 0))
            .context("bind UDP")?;
        sock.connect(dst)
            .with_context(|| format!("connect UDP {dst}"))?;
        sock.set_read_timeout(Some(timeout))?;
        let local = sock.local_addr().ok().and_then(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(v4),
            _ => None,
        });
        let done = |outcome, answer| Attempt {
            outcome,
            answer,
            local,
            elapsed: start.elapsed(),
        };
        sock.send(b"hello from clb-lab\n")
            .with_context(|| format!("send to {dst}"))?;
        let mut buf = [0u8; 512];
        Ok(match sock.recv(&mut buf) {
            Ok(n) => done(
                Outcome::Ok,
                Some(String::from_utf8_lossy(&buf[..n]).trim().to_string()),
            ),
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => done(Outcome::Refused, None),
            Err(_) => done(Outcome::Timeout, None),
        })
    })
}
