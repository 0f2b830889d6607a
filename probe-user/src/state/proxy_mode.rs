//! What kube-proxy says it runs: `GET /proxyMode` on its metrics port (`iptables`, `ipvs` or
//! `nftables`; kube-proxy's `--metrics-bind-address`, default `127.0.0.1:10249`). The one
//! source that tells a live mode from another mode's leftovers (`probe check`'s
//! `mode_leftover`): the rules themselves cannot, IPVS mode writes iptables rules too.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// kube-proxy's default metrics address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:10249";

/// How long kube-proxy gets to answer (it answers from memory; a closed port refuses at once).
const TIMEOUT: Duration = Duration::from_millis(300);

/// The mode kube-proxy at `addr` reports; None when nothing answers there or the answer is
/// not one of the modes.
pub fn ask(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).ok()?;
    stream.set_read_timeout(Some(TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(TIMEOUT)).ok()?;
    stream
        .write_all(b"GET /proxyMode HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    // A mode is a word: anything longer is not kube-proxy's answer.
    let mut buf = Vec::with_capacity(512);
    stream.take(4096).read_to_end(&mut buf).ok()?;
    parse(&String::from_utf8_lossy(&buf))
}

/// The mode from a raw HTTP response (pure).
pub fn parse(response: &str) -> Option<String> {
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.lines().next()?;
    if status.split_whitespace().nth(1) != Some("200") {
        return None;
    }
    let mode = body.trim();
    matches!(mode, "iptables" | "ipvs" | "nftables").then(|| mode.to_string())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_a_200_naming_a_mode_is_an_answer() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nnftables";
        assert_eq!(parse(ok).as_deref(), Some("nftables"));
        assert_eq!(parse("HTTP/1.1 404 Not Found\r\n\r\nnftables"), None);
        assert_eq!(parse("HTTP/1.1 200 OK\r\n\r\n<html>metrics</html>"), None);
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn nothing_listening_is_no_answer() {
        // A port nothing listens on, on the loopback: refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        assert_eq!(super::ask(addr), None);
    }
}
