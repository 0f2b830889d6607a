//! An LB with PROXY protocol on, short-circuited by kube-proxy (issue 39, item 2): a backend in
//! pod B that requires a PROXY protocol header (v1 or v2) and resets the connection (SO_LINGER
//! 0) when the first bytes are not one, as ingress-nginx with `use-proxy-protocol` does
//! ("broken header", kubernetes/ingress-nginx#9643); kube-proxy's iptables-mode rules for its
//! LB IP:port `default/ingress:https`, so pod A's call to the LB IP is DNATed to pod B on the
//! node and never passes the LB that would add the header.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    Attempt, KubeProxyMode, NS_NODE, NS_POD_B, Outcome, POD_B_IP, VIP,
    cmd::restore_rules,
    in_netns, kube_proxy,
    servers::{self, wait_listening},
};

/// The LB IP's port of `default/ingress:https`, and pod B's backend port behind it.
pub const PROXY_PROTOCOL_PORT: u16 = 9443;
/// kube-proxy's chains for `default/ingress:https` (its hashes: base32(sha256(
/// "default/ingress:https" + "tcp"))[:16], the endpoint chain with "198.19.1.11:9443" appended).
pub const PROXY_SVC_CHAIN: &str = "KUBE-SVC-VFINODUTLEJVTX55";
pub const PROXY_EXT_CHAIN: &str = "KUBE-EXT-VFINODUTLEJVTX55";
pub const PROXY_SEP_CHAIN: &str = "KUBE-SEP-JRP73NBZIZCMUVWG";

/// kube-proxy's iptables-mode rules for `default/ingress:https` (LB ingress VIP:9443 ->
/// pod B:9443), as it writes them for an LB IP (the `loadbalancer IP` rule of KUBE-SERVICES,
/// the EXT/SVC/SEP chains; kubernetes/kubernetes pkg/proxy/iptables/proxier.go).
fn rules() -> String {
    format!(
        r#"*nat
:{svc} - [0:0]
:{ext} - [0:0]
:{sep} - [0:0]
-A KUBE-SERVICES -d {VIP}/32 -p tcp -m comment --comment "default/ingress:https loadbalancer IP" -m tcp --dport {PROXY_PROTOCOL_PORT} -j {ext}
-A {ext} -m comment --comment "masquerade traffic for default/ingress:https external destinations" -j KUBE-MARK-MASQ
-A {ext} -j {svc}
-A {svc} -m comment --comment "default/ingress:https -> {POD_B_IP}:{PROXY_PROTOCOL_PORT}" -j {sep}
-A {sep} -s {POD_B_IP}/32 -m comment --comment "default/ingress:https" -j KUBE-MARK-MASQ
-A {sep} -p tcp -m comment --comment "default/ingress:https" -m tcp -j DNAT --to-destination {POD_B_IP}:{PROXY_PROTOCOL_PORT}
COMMIT
"#,
        svc = PROXY_SVC_CHAIN,
        ext = PROXY_EXT_CHAIN,
        sep = PROXY_SEP_CHAIN,
    )
}

/// Starts the PROXY-protocol backend in pod B and writes kube-proxy's rules for its LB
/// IP:port on the node. iptables mode only (the lab's default, any kernel): the other modes
/// short-circuit the LB IP the same way, with other rules. Removed with the lab.
pub fn serve_behind_lb() -> Result<()> {
    if kube_proxy::node_mode()? != KubeProxyMode::Iptables {
        bail!("the PROXY protocol backend's rules are written for kube-proxy's iptables mode");
    }
    servers::start_proxy_protocol_server(
        NS_POD_B,
        PROXY_PROTOCOL_PORT,
        "pod-b proxy-protocol backend",
    )
    .context("starting the PROXY protocol backend in pod B")?;
    wait_listening(NS_POD_B, PROXY_PROTOCOL_PORT)?;
    restore_rules(NS_NODE, "iptables-restore", &rules())
        .context("kube-proxy's rules for default/ingress:https")?;
    Ok(())
}

/// A PROXY protocol v1 header for a TCP4 connection from `src` to `dst`, as an LB sends it.
pub fn v1_header(src: SocketAddrV4, dst: SocketAddrV4) -> String {
    format!(
        "PROXY TCP4 {} {} {} {}\r\n",
        src.ip(),
        dst.ip(),
        src.port(),
        dst.port()
    )
}

/// From `ns`: connects to the LB IP's PROXY protocol port, sends a request (after a PROXY v1
/// header when `with_header`: what the LB would add, or a caller that sends it itself) and
/// reads the answer. `Reset` when the backend reset or closed without a word.
pub fn call_in(ns: &str, with_header: bool, timeout: Duration) -> Result<Attempt> {
    let dst = SocketAddrV4::new(VIP, PROXY_PROTOCOL_PORT);
    in_netns(ns, || {
        let start = std::time::Instant::now();
        let done = |outcome, answer: Option<String>, local: Option<SocketAddrV4>| Attempt {
            outcome,
            answer,
            local,
            elapsed: start.elapsed(),
        };
        let mut stream = match TcpStream::connect_timeout(&SocketAddr::V4(dst), timeout) {
            Ok(s) => s,
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                return Ok(done(Outcome::Refused, None, None));
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Ok(done(Outcome::Timeout, None, None));
            }
            Err(e) => return Err(e).with_context(|| format!("connect {dst}")),
        };
        let local = match stream.local_addr()? {
            SocketAddr::V4(a) => Some(a),
            SocketAddr::V6(_) => None,
        };
        stream.set_read_timeout(Some(timeout))?;
        let mut request = String::new();
        if with_header {
            let src = local.unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            request.push_str(&v1_header(src, dst));
        }
        request.push_str("GET / HTTP/1.0\r\n\r\n");
        if stream.write_all(request.as_bytes()).is_err() {
            return Ok(done(Outcome::Reset, None, local));
        }
        let mut buf = Vec::new();
        match stream.read_to_end(&mut buf) {
            Ok(_) if !buf.is_empty() => {
                let answer = String::from_utf8_lossy(&buf).trim().to_string();
                Ok(done(Outcome::Ok, Some(answer), local))
            }
            Ok(_) => Ok(done(Outcome::Reset, None, local)),
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => {
                Ok(done(Outcome::Reset, None, local))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                Ok(done(Outcome::Timeout, None, local))
            }
            Err(e) => Err(e).with_context(|| format!("read from {dst}")),
        }
    })
}
