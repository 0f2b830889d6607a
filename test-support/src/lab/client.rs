//! The lab's TCP client: connects from inside a namespace (a thread that `setns`es into it).

use std::{
    fs::File,
    io::{ErrorKind, Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use socket2::{Domain, Protocol, Socket, Type};

use super::Outcome;

/// One connection attempt and what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub outcome: Outcome,
    /// The server's answer line when `outcome` is `Ok` (names the server that answered).
    pub answer: Option<String>,
    /// The client's local address (to find the flow in tcpdump / conntrack).
    pub local: Option<SocketAddrV4>,
    pub elapsed: Duration,
}

/// Runs `f` on a thread that has entered network namespace `ns` (`/run/netns/<ns>`), and
/// returns what it returned. Sockets made there stay in that namespace wherever they are used.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let path = format!("/run/netns/{ns}");
    let netns = File::open(&path).with_context(|| format!("opening {path} (is the lab up?)"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a valid fd; CLONE_NEWNET only affects this (scoped) thread.
            let rc = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns({path}): {}", std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .map_err(|_| anyhow!("thread in netns {ns} panicked"))?
    })
}

/// Connects from network namespace `ns` (optionally bound to `src`) to `dst`, sends one line and
/// reads the answer. `timeout` bounds the connect and, separately, the answer.
pub fn connect_in(
    ns: &str,
    src: Option<Ipv4Addr>,
    dst: SocketAddrV4,
    timeout: Duration,
) -> Result<Attempt> {
    in_netns(ns, || connect_here(src, dst, timeout))
}

/// One HTTP/1.0 GET of `path` from `addr` (`ip:port`) inside network namespace `ns`:
/// (status, body), or None when nothing answered in time.
pub fn http_get_in(ns: &str, addr: &str, path: &str) -> Option<(u16, String)> {
    http_get_bytes_in(ns, addr, path)
        .map(|(status, body)| (status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`http_get_in`] with the body as bytes (a pcapng file).
pub fn http_get_bytes_in(ns: &str, addr: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    http_get_with_in(ns, addr, path, &[])
}

/// [`http_get_bytes_in`] sending `headers` too (`GET /evidence`'s token).
pub fn http_get_with_in(
    ns: &str,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, Vec<u8>)> {
    in_netns(ns, || {
        let mut s = TcpStream::connect(addr)?;
        let (status, _, body) = http_get_over(&mut s, addr, path, headers.iter().copied())?;
        Ok((status, body))
    })
    .ok()
}

/// One HTTP/1.0 GET of `path` over the connected `s` (to `host`), with `headers`, read to its
/// end (5 s at most between reads): (status, head, body).
pub(crate) fn http_get_over(
    s: &mut TcpStream,
    host: impl std::fmt::Display,
    path: &str,
    headers: impl IntoIterator<Item = (impl std::fmt::Display, impl std::fmt::Display)>,
) -> std::io::Result<(u16, String, Vec<u8>)> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    s.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status"))?;
    Ok((status, head, raw[split + 4..].to_vec()))
}

fn classify(e: &std::io::Error) -> Option<Outcome> {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => return Some(Outcome::Refused),
        Some(libc::ECONNRESET) | Some(libc::EPIPE) => return Some(Outcome::Reset),
        Some(libc::ETIMEDOUT) => return Some(Outcome::Timeout),
        _ => {}
    }
    matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock).then_some(Outcome::Timeout)
}

/// Connects in the calling thread's namespace.
pub fn connect_here(
    src: Option<Ipv4Addr>,
    dst: SocketAddrV4,
    timeout: Duration,
) -> Result<Attempt> {
    connect_any(src.map(IpAddr::V4), SocketAddr::V4(dst), timeout)
}

/// [`connect_here`] for either family (the dual-stack lab). `Attempt::local` is set for IPv4
/// only.
pub fn connect_any(src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> Result<Attempt> {
    let start = Instant::now();
    let domain = if dst.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP)).context("socket")?;
    if let Some(src) = src {
        sock.bind(&SocketAddr::new(src, 0).into())
            .with_context(|| format!("bind {src}"))?;
    }
    let done = |outcome, answer, sock: &Socket| Attempt {
        outcome,
        answer,
        local: sock.local_addr().ok().and_then(|a| a.as_socket_ipv4()),
        elapsed: start.elapsed(),
    };
    if let Err(e) = sock.connect_timeout(&dst.into(), timeout) {
        return match classify(&e) {
            Some(o) => Ok(done(o, None, &sock)),
            None => Err(anyhow!("connect {dst}: {e}")),
        };
    }
    let mut stream: std::net::TcpStream = sock.try_clone().context("dup socket")?.into();
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    if let Err(e) = stream.write_all(b"hello from clb-lab\n") {
        return match classify(&e) {
            Some(o) => Ok(done(o, None, &sock)),
            None => Err(anyhow!("send to {dst}: {e}")),
        };
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') {
                    break;
                }
            }
            Err(e) => {
                return match classify(&e) {
                    Some(o) => Ok(done(o, None, &sock)),
                    None => Err(anyhow!("read from {dst}: {e}")),
                };
            }
        }
    }
    if buf.is_empty() {
        // Closed without a word: not a served connection.
        return Ok(done(Outcome::Reset, None, &sock));
    }
    let answer = String::from_utf8_lossy(&buf).trim().to_string();
    Ok(done(Outcome::Ok, Some(answer), &sock))
}
