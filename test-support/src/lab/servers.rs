//! The lab's servers: the TCP and UDP servers each namespace runs, started detached, and
//! waiting until they listen.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{
    HOST_LISTENER_PORT, NODE_PORT, NS_NODE, NS_PEER, NS_POD_B, PEER_TLS_PORT, POD_PORT,
    cmd::{exec, run_detached},
};

/// A server the lab runs: (namespace, port, name it answers with).
pub const SERVERS: &[(&str, u16, &str)] = &[
    (NS_POD_B, POD_PORT, "pod-b web 198.19.1.11:8080"),
    (NS_PEER, NODE_PORT, "peer node 198.18.1.2:30080"),
    (NS_PEER, PEER_TLS_PORT, "outside backend 198.18.1.2:30443"),
    (
        NS_NODE,
        HOST_LISTENER_PORT,
        "node host listener 198.18.0.2:6443",
    ),
];

/// The argument that marks a lab server's command line.
pub(crate) const SERVER_TAG: &str = "clb-lab-server";

// A tiny threaded TCP server: reads one line, answers with its name, closes. With "6" as its
// third argument it listens on IPv6 only (IPV6_V6ONLY), beside an IPv4 one on the same port.
// With "proxy" after that it requires a PROXY protocol header: a v1 line or the v2 signature
// gets the answer, any other first bytes a reset (SO_LINGER 0, then close), as ingress-nginx
// with `use-proxy-protocol` does ("broken header", kubernetes/ingress-nginx#9643).
const SERVER_PY: &str = r#"
import socket, struct, sys, threading
name, port, v6 = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "6"
proxy = sys.argv[5:] == ["proxy"]
V2 = b"\r\n\r\n\x00\r\nQUIT\n"
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if v6:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
s.bind(("::" if v6 else "0.0.0.0", port))
s.listen(128)
def serve(c):
    try:
        c.settimeout(3)
        first = c.recv(256)
        if not proxy or first.startswith(b"PROXY ") or first.startswith(V2):
            c.sendall(("ok from %s\n" % name).encode())
        else:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except Exception:
        pass
    finally:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

pub(super) fn start_server(ns: &str, port: u16, name: &str) -> Result<()> {
    start_tcp_server(ns, port, name, false)
}

/// The lab's TCP server on `port` in `ns`, IPv6-only when `v6`.
pub(super) fn start_tcp_server(ns: &str, port: u16, name: &str, v6: bool) -> Result<()> {
    spawn_tcp_server(ns, port, name, &[if v6 { "6" } else { "4" }])
}

/// The lab's TCP server on `port` in `ns` (IPv4) that answers only a connection opened with a
/// PROXY protocol header, and resets the others.
pub(super) fn start_proxy_protocol_server(ns: &str, port: u16, name: &str) -> Result<()> {
    spawn_tcp_server(ns, port, name, &["4", "proxy"])
}

fn spawn_tcp_server(ns: &str, port: u16, name: &str, options: &[&str]) -> Result<()> {
    // `setsid -f` forks: the server is nobody's child here, lives on after the CLI exits, and is
    // found again by `ip netns pids` on `down`.
    let port = port.to_string();
    let argv = [
        &[
            "ip", "netns", "exec", ns, "setsid", "-f", "python3", "-c", SERVER_PY, SERVER_TAG,
            name, &port,
        ],
        options,
    ]
    .concat();
    run_detached(&argv).with_context(|| format!("starting the server {name} in {ns}"))
}

pub(super) fn start_udp_server(ns: &str, port: u16, name: &str) -> Result<()> {
    let port = port.to_string();
    let argv = [
        "ip",
        "netns",
        "exec",
        ns,
        "setsid",
        "-f",
        "python3",
        "-c",
        super::udp::UDP_SERVER_PY,
        SERVER_TAG,
        name,
        &port,
    ];
    run_detached(&argv).with_context(|| format!("starting the UDP server {name} in {ns}"))
}

pub(super) fn wait_udp_bound(ns: &str, port: u16) -> Result<()> {
    wait_listed(ns, "-Hlun", port, "UDP server on")
}

/// Polls `ss <flags> sport = :port` in `ns` until it lists a socket, for at most
/// [`SERVER_START`] stretched by the machine's patience; `what` names the server in the error.
pub(super) fn wait_listed(ns: &str, flags: &str, port: u16, what: &str) -> Result<()> {
    let wait = crate::patient(SERVER_START);
    let deadline = Instant::now() + wait;
    while exec(ns, &["ss", flags, &format!("sport = :{port}")])?
        .trim()
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!(
                "no {what} port {port} in {ns} {} s after starting it",
                wait.as_secs()
            );
        }
        sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub fn listening(ns: &str, port: u16) -> Result<bool> {
    let out = exec(ns, &["ss", "-Hltn", &format!("sport = :{port}")])?;
    Ok(!out.trim().is_empty())
}

/// How long a started server may take to listen: python3's start-up under the VM tier's
/// emulated CPU on a loaded machine took more than 5 s.
const SERVER_START: Duration = Duration::from_secs(30);

pub(super) fn wait_listening(ns: &str, port: u16) -> Result<()> {
    wait_listed(ns, "-Hltn", port, "server listens on")
}
