//! IPVS virtual services of the current network namespace, over generic netlink.
//!
//! The `IPVS` generic-netlink family (what `ipvsadm` itself talks): resolve the family id with
//! `CTRL_CMD_GETFAMILY`, dump `IPVS_CMD_GET_SERVICE` for the virtual services (address family,
//! protocol, address, port, firewall mark, scheduler), then one `IPVS_CMD_GET_DEST` dump per
//! service for its real servers. Everything runs in the network namespace of the calling
//! thread (the agent runs inside `ip netns exec`).
//!
//! On a kernel without IPVS [`read`] answers `Ok(None)` (and says so once in the log): the
//! caller then uses kube-proxy's iptables rules. "Without IPVS" includes `ip_vs` built as a
//! module but not loaded (no `/proc/net/ip_vs`): resolving the family would make the kernel
//! load the module, and a probe must not change the node it watches.
//!
//! The decoders ([`parse_family_id`], [`parse_services`], [`parse_dests`]) are pure, and tested
//! on replies captured from a real kernel (`probe-user/tests/data/ipvs/`, captured in the VM
//! tier by [`tests::real_ipvs_in_a_namespace`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

use super::{ServiceEntry, ServiceSource, ServiceTable};
use crate::event::Proto;

/// Present in every network namespace once `ip_vs` is loaded (or built in).
pub const PROC_IP_VS: &str = "/proc/net/ip_vs";
/// The generic-netlink family name (`IPVS_GENL_NAME`).
pub const FAMILY: &str = "IPVS";
const IPVS_GENL_VERSION: u8 = 1;

// uapi linux/genetlink.h
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

// uapi linux/ip_vs.h
const IPVS_CMD_NEW_SERVICE: u8 = 1;
const IPVS_CMD_GET_SERVICE: u8 = 4;
const IPVS_CMD_NEW_DEST: u8 = 5;
const IPVS_CMD_GET_DEST: u8 = 8;
const IPVS_CMD_ATTR_SERVICE: u16 = 1;
const IPVS_CMD_ATTR_DEST: u16 = 2;
const IPVS_SVC_ATTR_AF: u16 = 1;
const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
const IPVS_SVC_ATTR_ADDR: u16 = 3;
const IPVS_SVC_ATTR_PORT: u16 = 4;
const IPVS_SVC_ATTR_FWMARK: u16 = 5;
const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
const IPVS_DEST_ATTR_ADDR: u16 = 1;
const IPVS_DEST_ATTR_PORT: u16 = 2;
const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;
const IP_VS_CONN_F_FWD_MASK: u32 = 0x7;

// uapi linux/netlink.h
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));

const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

const RECV_TIMEOUT: Duration = Duration::from_secs(5);
const RECV_BUF: usize = 256 * 1024;

/// A virtual service as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsService {
    /// `AF_INET` or `AF_INET6`.
    pub af: u16,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP).
    pub protocol: u16,
    /// None for a firewall-mark service.
    pub addr: Option<IpAddr>,
    pub port: u16,
    /// Non-zero for a firewall-mark service (then `addr` is None and `port` 0).
    pub fwmark: u32,
    pub scheduler: String,
}

/// How IPVS forwards to a real server (`IP_VS_CONN_F_*` & `IP_VS_CONN_F_FWD_MASK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    Masq,
    Local,
    Tunnel,
    Route,
    Bypass,
    Other(u32),
}

impl Forward {
    fn from_flags(f: u32) -> Forward {
        match f & IP_VS_CONN_F_FWD_MASK {
            0 => Forward::Masq,
            1 => Forward::Local,
            2 => Forward::Tunnel,
            3 => Forward::Route,
            4 => Forward::Bypass,
            n => Forward::Other(n),
        }
    }
}

/// A virtual service with its real servers.
pub type ServiceWithDests = (IpvsService, Vec<IpvsDest>);

/// One netlink message of a buffer: (type, sequence, the whole message's bytes).
type RawMessage<'a> = (u16, u32, &'a [u8]);

/// A real server of a virtual service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsDest {
    pub addr: IpAddr,
    pub port: u16,
    pub forward: Forward,
    pub weight: u32,
}

/// Raw kernel replies of one read (for fixtures): the family resolution, the service dump,
/// and one destination dump per address service (in the order of the service dump).
#[derive(Clone, Debug, Default)]
pub struct Capture {
    pub family: Vec<u8>,
    pub services: Vec<u8>,
    pub dests: Vec<Vec<u8>>,
}

static SAID_ABSENT: AtomicBool = AtomicBool::new(false);

fn say_absent(why: &str) {
    if !SAID_ABSENT.swap(true, Ordering::Relaxed) {
        tracing::info!("IPVS: {why}; the service table comes from kube-proxy's iptables rules");
    }
}

/// The IPVS table, or None when this kernel (or namespace) has no IPVS.
pub fn read() -> io::Result<Option<ServiceTable>> {
    let Some(services) = read_services()? else {
        return Ok(None);
    };
    Ok(Some(table_from(&services)))
}

/// Every virtual service with its real servers, or None without IPVS.
pub fn read_services() -> io::Result<Option<Vec<ServiceWithDests>>> {
    let Some(cap) = capture()? else {
        return Ok(None);
    };
    decode_capture(&cap).map(Some).map_err(io::Error::other)
}

/// Decodes a [`Capture`] (what [`read_services`] does with live replies).
pub fn decode_capture(cap: &Capture) -> Result<Vec<ServiceWithDests>, String> {
    let services = parse_services(&cap.services)?;
    let mut out = Vec::with_capacity(services.len());
    let mut dests = cap.dests.iter();
    for svc in services {
        let d = if svc.addr.is_some() || svc.fwmark != 0 {
            match dests.next() {
                Some(bytes) => parse_dests(bytes)?,
                None => return Err("fewer destination dumps than services".into()),
            }
        } else {
            Vec::new()
        };
        out.push((svc, d));
    }
    Ok(out)
}

/// Talks to the kernel: the raw replies of one read, or None without IPVS.
pub fn capture() -> io::Result<Option<Capture>> {
    if !std::path::Path::new(PROC_IP_VS).exists() {
        say_absent(&format!(
            "no {PROC_IP_VS} (the kernel has no IPVS, or ip_vs is not loaded)"
        ));
        return Ok(None);
    }
    let sock = open()?;
    let mut cap = Capture::default();
    let mut name = FAMILY.as_bytes().to_vec();
    name.push(0);
    let req = message(
        GENL_ID_CTRL,
        NLM_F_REQUEST | NLM_F_ACK,
        1,
        CTRL_CMD_GETFAMILY,
        1,
        &attr(CTRL_ATTR_FAMILY_NAME, &name),
    );
    cap.family = match transact(&sock, &req, 1, false) {
        Ok(b) => b,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            say_absent("the kernel has no IPVS generic-netlink family");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let Some(family) = parse_family_id(&cap.family).map_err(io::Error::other)? else {
        say_absent("the kernel named no IPVS family id");
        return Ok(None);
    };
    let req = message(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        2,
        IPVS_CMD_GET_SERVICE,
        IPVS_GENL_VERSION,
        &[],
    );
    cap.services = transact(&sock, &req, 2, true)?;
    let services = parse_services(&cap.services).map_err(io::Error::other)?;
    for (i, svc) in services.iter().enumerate() {
        if svc.addr.is_none() && svc.fwmark == 0 {
            continue;
        }
        let seq = 3 + i as u32;
        let req = message(
            family,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            IPVS_CMD_GET_DEST,
            IPVS_GENL_VERSION,
            &attr_nested(IPVS_CMD_ATTR_SERVICE, &service_key(svc)),
        );
        cap.dests.push(transact(&sock, &req, seq, true)?);
    }
    Ok(Some(cap))
}

/// The service table the correlator uses: address services with their real servers as
/// `ip:port`; firewall-mark services have no address and are left out.
pub fn table_from(services: &[ServiceWithDests]) -> ServiceTable {
    let mut table = ServiceTable {
        source: Some(ServiceSource::Ipvs),
        ..Default::default()
    };
    for (svc, dests) in services {
        let Some(vip) = svc.addr else {
            tracing::debug!(fwmark = svc.fwmark, "IPVS: firewall-mark service skipped");
            continue;
        };
        let proto = Proto::from_raw(svc.protocol as u8);
        table.services.push(ServiceEntry {
            vip,
            port: svc.port,
            proto,
            service: None,
            backends: dests
                .iter()
                .map(|d| socket_string(d.addr, d.port))
                .collect(),
        });
    }
    table
}

fn socket_string(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

// ----- encoding ---------------------------------------------------------------------------------

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut v = Vec::with_capacity(align4(len));
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(align4(len), 0);
    v
}

fn attr_nested(kind: u16, inner: &[u8]) -> Vec<u8> {
    attr(kind | NLA_F_NESTED, inner)
}

/// nlmsghdr + genlmsghdr + attributes.
fn message(family: u16, flags: u16, seq: u32, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    let len = 16 + 4 + attrs.len();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&(len as u32).to_ne_bytes());
    v.extend_from_slice(&family.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.extend_from_slice(&[cmd, version, 0, 0]);
    v.extend_from_slice(attrs);
    v
}

/// What identifies a service in a `GET_DEST` request: AF + protocol + address + port, or
/// AF + firewall mark.
fn service_key(svc: &IpvsService) -> Vec<u8> {
    let mut v = attr(IPVS_SVC_ATTR_AF, &svc.af.to_ne_bytes());
    match svc.addr {
        Some(addr) => {
            let mut raw = [0u8; 16];
            match addr {
                IpAddr::V4(a) => raw[..4].copy_from_slice(&a.octets()),
                IpAddr::V6(a) => raw.copy_from_slice(&a.octets()),
            }
            v.extend(attr(IPVS_SVC_ATTR_PROTOCOL, &svc.protocol.to_ne_bytes()));
            v.extend(attr(IPVS_SVC_ATTR_ADDR, &raw));
            v.extend(attr(IPVS_SVC_ATTR_PORT, &svc.port.to_be_bytes()));
        }
        None => v.extend(attr(IPVS_SVC_ATTR_FWMARK, &svc.fwmark.to_ne_bytes())),
    }
    v
}

// ----- socket -----------------------------------------------------------------------------------

fn open() -> io::Result<Socket> {
    let mut sock = Socket::new(NETLINK_GENERIC)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let tv = libc::timeval {
        tv_sec: RECV_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: a valid socket fd and a correctly sized timeval.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// Sends `req` and returns the raw reply messages of sequence `seq` up to and including
/// `NLMSG_DONE` (a dump) or the ACK (a plain request); a kernel error becomes an io::Error.
fn transact(sock: &Socket, req: &[u8], seq: u32, dump: bool) -> io::Result<Vec<u8>> {
    sock.send(req, 0)?;
    let mut out = Vec::new();
    let mut rx = vec![0u8; RECV_BUF];
    loop {
        let n = sock.recv(&mut &mut rx[..], 0)?;
        if n == 0 {
            return Err(io::Error::other("netlink socket closed mid-reply"));
        }
        for (kind, msg_seq, bytes) in messages(&rx[..n]).map_err(io::Error::other)? {
            if msg_seq != seq {
                continue;
            }
            out.extend_from_slice(bytes);
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let code = error_code(bytes);
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    if !dump {
                        return Ok(out);
                    }
                }
                _ => {}
            }
        }
    }
}

// ----- decoding ---------------------------------------------------------------------------------

/// Splits a buffer into netlink messages: (type, sequence, bytes of the whole message).
fn messages(buf: &[u8]) -> Result<Vec<RawMessage<'_>>, String> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
        if len < 16 || off + len > buf.len() {
            return Err(format!("bad netlink message length {len} at offset {off}"));
        }
        let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        let seq = u32::from_ne_bytes(buf[off + 8..off + 12].try_into().unwrap());
        out.push((kind, seq, &buf[off..off + len]));
        off += align4(len);
    }
    if off < buf.len() {
        return Err(format!(
            "{} trailing bytes at offset {off}: a truncated message",
            buf.len() - off
        ));
    }
    Ok(out)
}

/// `struct nlmsgerr`'s error (0 is an ACK).
fn error_code(msg: &[u8]) -> i32 {
    msg.get(16..20)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0)
}

/// Attributes of a buffer: (type without flags, payload). Stops at a malformed one.
fn attrs(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= buf.len() {
        let len = u16::from_ne_bytes([buf[off], buf[off + 1]]) as usize;
        let kind = u16::from_ne_bytes([buf[off + 2], buf[off + 3]]) & NLA_TYPE_MASK;
        if len < 4 || off + len > buf.len() {
            break;
        }
        out.push((kind, &buf[off + 4..off + len]));
        off += align4(len);
    }
    out
}

fn u16_ne(b: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(..2)?.try_into().ok()?))
}

fn u32_ne(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?))
}

fn port_be(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?))
}

/// `union nf_inet_addr` (16 bytes) read as `af`.
fn inet_addr(af: u16, b: &[u8]) -> Option<IpAddr> {
    match af {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(b.get(..4)?).ok()?,
        ))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(b.get(..16)?).ok()?,
        ))),
        _ => None,
    }
}

/// The generic-netlink payload (after nlmsghdr and genlmsghdr) of each data message with
/// command `cmd`; a kernel error in the stream is returned as its errno.
fn payloads(bytes: &[u8], cmd: u8) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    for (kind, _, msg) in messages(bytes)? {
        match kind {
            NLMSG_DONE => break,
            NLMSG_ERROR => {
                let code = error_code(msg);
                if code != 0 {
                    return Err(format!(
                        "kernel error: {}",
                        io::Error::from_raw_os_error(-code)
                    ));
                }
            }
            _ if msg.len() >= 20 && msg[16] == cmd => out.push(&msg[20..]),
            _ => {}
        }
    }
    Ok(out)
}

/// The family id in a `CTRL_CMD_GETFAMILY` reply (None when the reply names none).
pub fn parse_family_id(bytes: &[u8]) -> Result<Option<u16>, String> {
    // The controller answers with CTRL_CMD_NEWFAMILY (1).
    for p in payloads(bytes, 1)? {
        if let Some((_, id)) = attrs(p)
            .into_iter()
            .find(|(k, _)| *k == CTRL_ATTR_FAMILY_ID)
        {
            return Ok(u16_ne(id));
        }
    }
    Ok(None)
}

/// The services of an `IPVS_CMD_GET_SERVICE` dump. A service message the decoder cannot read
/// (no address family) is skipped.
pub fn parse_services(bytes: &[u8]) -> Result<Vec<IpvsService>, String> {
    let mut out = Vec::new();
    for p in payloads(bytes, IPVS_CMD_NEW_SERVICE)? {
        for (kind, nested) in attrs(p) {
            if kind != IPVS_CMD_ATTR_SERVICE {
                continue;
            }
            let a = attrs(nested);
            let get = |k: u16| a.iter().find(|(t, _)| *t == k).map(|(_, v)| *v);
            let Some(af) = get(IPVS_SVC_ATTR_AF).and_then(u16_ne) else {
                continue;
            };
            let fwmark = get(IPVS_SVC_ATTR_FWMARK).and_then(u32_ne).unwrap_or(0);
            let addr = if fwmark == 0 {
                get(IPVS_SVC_ATTR_ADDR).and_then(|b| inet_addr(af, b))
            } else {
                None
            };
            out.push(IpvsService {
                af,
                protocol: get(IPVS_SVC_ATTR_PROTOCOL).and_then(u16_ne).unwrap_or(0),
                addr,
                port: get(IPVS_SVC_ATTR_PORT).and_then(port_be).unwrap_or(0),
                fwmark,
                scheduler: get(IPVS_SVC_ATTR_SCHED_NAME)
                    .map(|b| {
                        String::from_utf8_lossy(b)
                            .trim_end_matches('\0')
                            .to_string()
                    })
                    .unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// The real servers of an `IPVS_CMD_GET_DEST` dump. The address family is the destination's
/// own (`IPVS_DEST_ATTR_ADDR_FAMILY`, kernels since 4.x) or else taken from the address length.
pub fn parse_dests(bytes: &[u8]) -> Result<Vec<IpvsDest>, String> {
    let mut out = Vec::new();
    for p in payloads(bytes, IPVS_CMD_NEW_DEST)? {
        for (kind, nested) in attrs(p) {
            if kind != IPVS_CMD_ATTR_DEST {
                continue;
            }
            let a = attrs(nested);
            let get = |k: u16| a.iter().find(|(t, _)| *t == k).map(|(_, v)| *v);
            let Some(raw) = get(IPVS_DEST_ATTR_ADDR) else {
                continue;
            };
            let af = get(IPVS_DEST_ATTR_ADDR_FAMILY).and_then(u16_ne).unwrap_or(
                if raw.get(4..).unwrap_or_default().iter().all(|b| *b == 0) {
                    AF_INET
                } else {
                    AF_INET6
                },
            );
            let Some(addr) = inet_addr(af, raw) else {
                continue;
            };
            out.push(IpvsDest {
                addr,
                port: get(IPVS_DEST_ATTR_PORT).and_then(port_be).unwrap_or(0),
                forward: Forward::from_flags(
                    get(IPVS_DEST_ATTR_FWD_METHOD).and_then(u32_ne).unwrap_or(0),
                ),
                weight: get(IPVS_DEST_ATTR_WEIGHT).and_then(u32_ne).unwrap_or(0),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn data_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ipvs")
    }

    fn fixture(name: &str) -> Vec<u8> {
        let p = data_dir().join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn capture_fixture() -> Capture {
        let mut dests = Vec::new();
        for i in 0.. {
            let p = data_dir().join(format!("dests-{i}.bin"));
            if !p.exists() {
                break;
            }
            dests.push(std::fs::read(p).unwrap());
        }
        Capture {
            family: fixture("family.bin"),
            services: fixture("services.bin"),
            dests,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// What the VM test below builds, and what the fixtures hold.
    fn expected_services() -> Vec<(&'static str, u16, u16, &'static str, Vec<&'static str>)> {
        // (address, port, protocol, scheduler, real servers)
        vec![
            ("198.18.0.2", 30080, 6, "rr", vec!["198.19.1.11:8080"]),
            ("198.18.100.10", 80, 6, "rr", vec!["198.19.1.11:8080"]),
            (
                "203.0.113.10",
                80,
                6,
                "rr",
                vec!["198.19.1.11:8080", "198.19.1.12:8080"],
            ),
            ("198.18.100.53", 53, 17, "rr", vec!["198.19.1.11:53"]),
            ("2001:db8::10", 443, 6, "wrr", vec!["[2001:db8::11]:8443"]),
        ]
    }

    fn check(decoded: &[ServiceWithDests]) {
        let addr_services: Vec<_> = decoded.iter().filter(|(s, _)| s.addr.is_some()).collect();
        let mut got: Vec<(String, u16, u16, String, Vec<String>)> = addr_services
            .iter()
            .map(|(s, d)| {
                let mut backends: Vec<String> =
                    d.iter().map(|d| socket_string(d.addr, d.port)).collect();
                backends.sort();
                (
                    s.addr.unwrap().to_string(),
                    s.port,
                    s.protocol,
                    s.scheduler.clone(),
                    backends,
                )
            })
            .collect();
        got.sort();
        let mut want: Vec<(String, u16, u16, String, Vec<String>)> = expected_services()
            .into_iter()
            .map(|(a, p, pr, s, b)| {
                (
                    a.to_string(),
                    p,
                    pr,
                    s.to_string(),
                    b.into_iter().map(String::from).collect(),
                )
            })
            .collect();
        want.sort();
        assert_eq!(got, want);
        let fwm: Vec<_> = decoded.iter().filter(|(s, _)| s.addr.is_none()).collect();
        assert_eq!(fwm.len(), 1, "one firewall-mark service");
        assert_eq!(fwm[0].0.fwmark, 7);
        assert_eq!(fwm[0].0.port, 0);
        assert_eq!(
            fwm[0].1.iter().map(|d| d.addr).collect::<Vec<_>>(),
            vec![ip("198.19.1.11")]
        );
        for (s, d) in decoded {
            for dest in d {
                let want = if s.fwmark != 0 {
                    Forward::Route
                } else {
                    Forward::Masq
                };
                assert_eq!(dest.forward, want, "{s:?} {dest:?}");
                assert!(dest.weight >= 1);
            }
        }
    }

    #[test]
    fn parses_captured_replies() {
        let cap = capture_fixture();
        let id = parse_family_id(&cap.family).unwrap().expect("family id");
        assert!(id >= 0x10, "a dynamic generic-netlink id: {id}");
        let decoded = decode_capture(&cap).unwrap();
        check(&decoded);
        let t = table_from(&decoded);
        assert_eq!(t.source, Some(ServiceSource::Ipvs));
        assert_eq!(t.services.len(), 5, "firewall-mark service left out");
        let web = t.serves(ip("203.0.113.10"), 80, Proto::Tcp).unwrap();
        assert_eq!(web.backends.len(), 2);
        assert!(t.serves(ip("203.0.113.10"), 443, Proto::Tcp).is_none());
        assert!(t.serves(ip("198.18.100.53"), 53, Proto::Udp).is_some());
        assert!(t.serves(ip("198.18.100.53"), 53, Proto::Tcp).is_none());
        assert_eq!(
            t.serves(ip("2001:db8::10"), 443, Proto::Tcp)
                .unwrap()
                .backends,
            vec!["[2001:db8::11]:8443"]
        );
    }

    #[test]
    fn captured_empty_table_and_missing_family() {
        // A namespace with IPVS but no services: one NLMSG_DONE.
        assert!(
            parse_services(&fixture("services-empty.bin"))
                .unwrap()
                .is_empty()
        );
        // The controller's answer for a family that does not exist: ENOENT.
        let err = parse_family_id(&fixture("family-enoent.bin")).unwrap_err();
        assert!(err.contains("No such file"), "{err}");
    }

    #[test]
    fn truncated_and_garbage_input() {
        let cap = capture_fixture();
        let cut = &cap.services[..cap.services.len() - 7];
        assert!(parse_services(cut).is_err());
        assert!(parse_services(&[0xff; 40]).is_err());
        assert!(parse_services(&[]).unwrap().is_empty());
        assert!(parse_dests(&[1, 2, 3]).is_err());
    }

    #[test]
    fn request_encoding() {
        let svc = IpvsService {
            af: AF_INET,
            protocol: 6,
            addr: Some(ip("203.0.113.10")),
            port: 80,
            fwmark: 0,
            scheduler: "rr".into(),
        };
        let key = service_key(&svc);
        let a = attrs(&key);
        assert_eq!(
            a.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec![
                IPVS_SVC_ATTR_AF,
                IPVS_SVC_ATTR_PROTOCOL,
                IPVS_SVC_ATTR_ADDR,
                IPVS_SVC_ATTR_PORT
            ]
        );
        assert_eq!(a[2].1[..4], [203, 0, 113, 10]);
        assert_eq!(a[3].1, [0, 80]);
        let m = message(
            0x20,
            NLM_F_REQUEST | NLM_F_DUMP,
            7,
            IPVS_CMD_GET_DEST,
            1,
            &key,
        );
        assert_eq!(
            u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(m[16], IPVS_CMD_GET_DEST);
    }

    fn vm_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        std::env::var_os("CLB_VM").is_some() && unsafe { libc::geteuid() } == 0
    }

    fn sh(args: &[&str]) {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Against the real kernel (the VM tier, where IPVS exists): a scratch namespace with the
    /// services of [`expected_services`] plus a firewall-mark service, read over generic
    /// netlink from inside it. With `CLB_IPVS_CAPTURE=<dir>` the raw replies are written there
    /// (how `tests/data/ipvs/` was made). Skips (with a line) outside the VM.
    #[test]
    fn real_ipvs_in_a_namespace() {
        if !vm_root() {
            eprintln!("skipping real_ipvs_in_a_namespace: needs the VM tier (CLB_VM) and root");
            return;
        }
        let _ = Command::new("modprobe")
            .args(["ip_vs", "ip_vs_rr", "ip_vs_wrr"])
            .status();
        let ns = format!("clbipvs{}", std::process::id());
        sh(&["ip", "netns", "add", &ns]);
        struct Del(String);
        impl Drop for Del {
            fn drop(&mut self) {
                let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
            }
        }
        let _del = Del(ns.clone());
        // Real servers must be unicast addresses by the namespace's table local
        // (ip_vs_new_dest: inet_addr_type), which exists once an address does.
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["link", "add", "clb0", "type", "dummy"],
            vec!["link", "set", "clb0", "up"],
            vec!["addr", "add", "198.19.0.1/16", "dev", "clb0"],
            vec![
                "-6",
                "addr",
                "add",
                "2001:db8::1/64",
                "dev",
                "clb0",
                "nodad",
            ],
        ] {
            let mut v = vec!["ip", "-n", ns.as_str()];
            v.extend(args);
            sh(&v);
        }
        let x = |args: &[&str]| {
            let mut v = vec!["ip", "netns", "exec", ns.as_str(), "ipvsadm"];
            v.extend_from_slice(args);
            sh(&v);
        };
        x(&["-A", "-t", "198.18.0.2:30080", "-s", "rr"]);
        x(&[
            "-a",
            "-t",
            "198.18.0.2:30080",
            "-r",
            "198.19.1.11:8080",
            "-m",
        ]);
        x(&["-A", "-t", "198.18.100.10:80", "-s", "rr"]);
        x(&[
            "-a",
            "-t",
            "198.18.100.10:80",
            "-r",
            "198.19.1.11:8080",
            "-m",
        ]);
        x(&["-A", "-t", "203.0.113.10:80", "-s", "rr"]);
        x(&[
            "-a",
            "-t",
            "203.0.113.10:80",
            "-r",
            "198.19.1.11:8080",
            "-m",
        ]);
        x(&[
            "-a",
            "-t",
            "203.0.113.10:80",
            "-r",
            "198.19.1.12:8080",
            "-m",
            "-w",
            "3",
        ]);
        x(&["-A", "-u", "198.18.100.53:53", "-s", "rr"]);
        x(&["-a", "-u", "198.18.100.53:53", "-r", "198.19.1.11:53", "-m"]);
        x(&["-A", "-t", "[2001:db8::10]:443", "-s", "wrr"]);
        x(&[
            "-a",
            "-t",
            "[2001:db8::10]:443",
            "-r",
            "[2001:db8::11]:8443",
            "-m",
        ]);
        x(&["-A", "-f", "7", "-s", "rr"]);
        x(&["-a", "-f", "7", "-r", "198.19.1.11", "-g"]);
        let listing = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["netns", "exec", &ns, "ipvsadm", "-Ln"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned();
        eprintln!("ipvsadm -Ln:\n{listing}");

        let path = format!("/run/netns/{ns}");
        let (cap, table, empty, enoent) = std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::File::open(&path).unwrap();
                // SAFETY: setns on a valid fd; affects only this scoped thread.
                assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
                let cap = capture().unwrap().expect("IPVS present");
                let table = read().unwrap().expect("IPVS present");
                // An unknown family: the controller's ENOENT, raw.
                let sock = open().unwrap();
                let req = message(
                    GENL_ID_CTRL,
                    NLM_F_REQUEST | NLM_F_ACK,
                    9,
                    CTRL_CMD_GETFAMILY,
                    1,
                    &attr(CTRL_ATTR_FAMILY_NAME, b"CLB_NO_SUCH\0"),
                );
                sock.send(&req, 0).unwrap();
                let mut rx = vec![0u8; 4096];
                let n = sock.recv(&mut &mut rx[..], 0).unwrap();
                let enoent = rx[..n].to_vec();
                // Empty table: flush, then dump again.
                sh(&["ipvsadm", "-C"]);
                let empty = capture().unwrap().expect("IPVS present");
                (cap, table, empty, enoent)
            })
            .join()
            .unwrap()
        });
        let decoded = decode_capture(&cap).unwrap();
        check(&decoded);
        assert_eq!(table.services.len(), 5);
        assert!(empty.dests.is_empty());
        assert!(parse_services(&empty.services).unwrap().is_empty());
        assert!(parse_family_id(&enoent).is_err());
        if let Some(dir) = std::env::var_os("CLB_IPVS_CAPTURE") {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("family.bin"), &cap.family).unwrap();
            std::fs::write(dir.join("services.bin"), &cap.services).unwrap();
            for (i, d) in cap.dests.iter().enumerate() {
                std::fs::write(dir.join(format!("dests-{i}.bin")), d).unwrap();
            }
            std::fs::write(dir.join("services-empty.bin"), &empty.services).unwrap();
            std::fs::write(dir.join("family-enoent.bin"), &enoent).unwrap();
            std::fs::write(dir.join("ipvsadm-Ln.txt"), &listing).unwrap();
            eprintln!("captured into {}", dir.display());
        }
    }
}
