//! ctnetlink lookups: was a flow SNATed, what happened to it.
//!
//! Messages are encoded and decoded with `netlink-packet-netfilter`'s conntrack types; the
//! request goes through [`crate::netlink`] (a plain blocking `NETLINK_NETFILTER` socket), so
//! every call works in the network namespace of the calling thread (the agent runs inside
//! `ip netns exec`; tests enter a scratch namespace with `setns` on a dedicated thread). From async code wrap the calls in
//! `tokio::task::spawn_blocking` (or use [`lookup_async`] / [`dump_by_source_async`]).
//!
//! - [`lookup`]: one exact `IPCTNL_MSG_CT_GET` by original tuple; `None` when the kernel says
//!   `ENOENT`;
//! - [`dump_by_source`] / [`dump_by_orig_destination`]: an `IPCTNL_MSG_CT_GET` dump of the
//!   family's table that asks the kernel to filter it ([`OrigFilter`], `CTA_FILTER`), filtered
//!   again here for kernels that cannot;
//! - [`parse_messages`]: the pure decoder from raw netlink bytes to [`ConntrackEntry`]s, used by
//!   both and by the tests on captured kernel replies.

use std::net::IpAddr;

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NetlinkBuffer, NetlinkMessage, NetlinkPayload, Nla,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    conntrack::{
        ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple,
        Protocol, Tuple as CtTuple,
    },
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use probe_contract::Proto;
// The pure half (the timeouts' arithmetic, what a self call looks like) is the core's.
pub use probe_core::state::conntrack::{StateTimeouts, is_self_call};

use crate::{
    netlink::{self, NetlinkError},
    state::{ConntrackEntry, Tuple},
};

/// conntrack status bits (uapi `nf_conntrack_common.h`).
pub const IPS_SEEN_REPLY: u32 = 1 << 1;
pub const IPS_ASSURED: u32 = 1 << 2;
pub const IPS_SRC_NAT: u32 = 1 << 4;
pub const IPS_DST_NAT: u32 = 1 << 5;

/// Why a ctnetlink call failed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The socket failed, or the kernel answered with an error (e.g. EPERM without
    /// CAP_NET_ADMIN).
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The reply could not be decoded.
    #[error("{op}: undecodable reply: {source}")]
    Decode {
        op: &'static str,
        #[source]
        source: ReplyError,
    },
    /// The tuple cannot be looked up exactly (conntrack needs ports, or ICMP id/type/code).
    #[error("conntrack lookup of {0:?} flows is not supported")]
    Unsupported(Proto),
    /// The blocking task did not complete.
    #[error("conntrack task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// The conntrack entry whose original tuple is exactly `tuple`, in the calling thread's network
/// namespace (default zone). `Ok(None)` when there is none. Blocking.
pub fn lookup(tuple: &Tuple) -> Result<Option<ConntrackEntry>, ConntrackError> {
    lookup_by(tuple, false)
}

/// The conntrack entry whose *reply* tuple is exactly `tuple` (a connection known by how its
/// answer would come back: after DNAT, the original destination is not in the packet), in the
/// calling thread's network namespace. `Ok(None)` when there is none. Blocking.
pub fn lookup_reply(tuple: &Tuple) -> Result<Option<ConntrackEntry>, ConntrackError> {
    lookup_by(tuple, true)
}

fn lookup_by(tuple: &Tuple, reply: bool) -> Result<Option<ConntrackEntry>, ConntrackError> {
    let proto = match tuple.proto {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
        // SCTP, DCCP, UDP-Lite carry ports like TCP/UDP.
        Proto::Other(n @ (33 | 132 | 136)) => Protocol::from(n),
        other => return Err(ConntrackError::Unsupported(other)),
    };
    if tuple.src.is_ipv4() != tuple.dst.is_ipv4() {
        return Err(ConntrackError::Unsupported(tuple.proto));
    }
    let parts = vec![
        CtTuple::Ip(vec![
            IPTuple::SourceAddress(tuple.src),
            IPTuple::DestinationAddress(tuple.dst),
        ]),
        CtTuple::Proto(vec![
            ProtoTuple::Protocol(proto),
            ProtoTuple::SourcePort(tuple.sport),
            ProtoTuple::DestinationPort(tuple.dport),
        ]),
    ];
    let attrs = vec![if reply {
        ConntrackAttribute::CtaTupleReply(parts)
    } else {
        ConntrackAttribute::CtaTupleOrig(parts)
    }];
    let op = "conntrack get";
    match request(
        op,
        family_of(tuple.src),
        ConntrackMessage::Get(attrs),
        false,
    ) {
        Ok(raw) => Ok(parse_all(op, &raw)?.into_iter().next()),
        Err(ConntrackError::Netlink(e)) if e.kernel_errno() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The calling thread's network namespace's conntrack timeouts (the sysctls
/// `net.netfilter.nf_conntrack_*timeout*`); a missing one keeps the kernel's default.
/// Blocking (procfs).
pub fn read_state_timeouts() -> StateTimeouts {
    let mut t = StateTimeouts::kernel_defaults();
    let dir = std::path::Path::new("/proc/sys/net/netfilter");
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    for (state, value) in t.tcp.iter_mut() {
        let name = format!("nf_conntrack_tcp_timeout_{}", state.to_ascii_lowercase());
        if let Some(v) = read(&name) {
            *value = v;
        }
    }
    if let Some(v) = read("nf_conntrack_udp_timeout_stream") {
        t.udp = v;
    }
    t
}

/// Every conntrack entry of `src`'s family whose original source is `src`, in the calling
/// thread's network namespace. A filtered dump ([`dump_filtered`]). Blocking.
pub fn dump_by_source(src: IpAddr) -> Result<Vec<ConntrackEntry>, ConntrackError> {
    dump_filtered(&OrigFilter {
        src: Some(src),
        ..OrigFilter::default()
    })
}

/// Every TCP conntrack entry whose original destination is `dst`:`dport` (an LB IP:port, as
/// the client called it, before kube-proxy's DNAT), in the calling thread's network
/// namespace. A filtered dump ([`dump_filtered`]). Blocking.
pub fn dump_by_orig_destination(
    dst: IpAddr,
    dport: u16,
) -> Result<Vec<ConntrackEntry>, ConntrackError> {
    dump_filtered(&OrigFilter {
        dst: Some(dst),
        proto: Some(Proto::Tcp),
        dport: Some(dport),
        ..OrigFilter::default()
    })
}

/// Which original tuples a filtered dump keeps: every field that is `Some` must match (AND,
/// as the kernel does); `None` matches anything. One family: `src` and `dst`, when both are
/// given, must be of the same family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrigFilter {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub proto: Option<Proto>,
    /// Ports: only with `proto` TCP or UDP (the kernel reads ports only under a protocol
    /// number).
    pub sport: Option<u16>,
    pub dport: Option<u16>,
}

impl OrigFilter {
    /// Whether the entry's original tuple matches: the userspace half of the filter.
    pub fn matches(&self, e: &ConntrackEntry) -> bool {
        self.src.is_none_or(|a| e.orig.src == a)
            && self.dst.is_none_or(|a| e.orig.dst == a)
            && self.proto.is_none_or(|p| e.orig.proto == p)
            && self.sport.is_none_or(|p| e.orig.sport == p)
            && self.dport.is_none_or(|p| e.orig.dport == p)
    }

    /// The family to dump: the address's; IPv4 without one.
    fn family(&self) -> NetfilterProtoFamily {
        self.src
            .or(self.dst)
            .map_or(NetfilterProtoFamily::IPv4, family_of)
    }
}

// ctnetlink's dump filter (uapi `include/uapi/linux/netfilter/nfnetlink_conntrack.h`:
// `CTA_FILTER` in `enum ctattr_type`, `enum ctattr_filter`, the `CTA_FILTER_FLAG_*` bits),
// added by "netfilter: ctnetlink: add kernel side filtering for dump" (Romain Bellan,
// torvalds/linux cb8aa9a3affb, Linux 5.8).
const CTA_FILTER: u16 = 25;
/// uapi `enum cntl_msg_types`.
const IPCTNL_MSG_CT_GET: u8 = 1;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_FLAG_CTA_IP_SRC: u32 = 1 << 0;
const CTA_FILTER_FLAG_CTA_IP_DST: u32 = 1 << 1;
const CTA_FILTER_FLAG_CTA_PROTO_NUM: u32 = 1 << 3;
const CTA_FILTER_FLAG_CTA_PROTO_SRC_PORT: u32 = 1 << 4;
const CTA_FILTER_FLAG_CTA_PROTO_DST_PORT: u32 = 1 << 5;

/// The entries of `filter`'s family that match it, filtered by the kernel where it can, and
/// always again here. Blocking.
///
/// The request is an `IPCTNL_MSG_CT_GET` dump carrying `CTA_TUPLE_ORIG` with the wanted fields
/// and `CTA_FILTER { CTA_FILTER_ORIG_FLAGS: which of them to compare }` (kernel
/// `net/netfilter/nf_conntrack_netlink.c`: `ctnetlink_start` -> `ctnetlink_alloc_filter` parses
/// them, `ctnetlink_filter_match_tuple` skips the entries that differ, so only matching ones
/// are copied to the socket). The nfgenmsg family is `AF_INET` or `AF_INET6`: the kernel
/// parses the partial tuple's addresses by that family, and `AF_UNSPEC` has none.
///
/// Why the userspace filter stays on every kernel:
/// - kernels before 5.8 do not know `CTA_FILTER` (above their `CTA_MAX`, ignored) and return
///   the whole family;
/// - the kernel's IPv6 address comparison is `!ipv6_addr_cmp(filter, ct)`, true when the
///   addresses are *equal*, so asking it to filter on an IPv6 address would drop exactly the
///   wanted entries (so merged in 5.8, and still so in 6.18.44 here: asked for `2001:db8::10`,
///   it returned only the entry to `2001:db8::20`); IPv6
///   filters send only the protocol and port to the kernel and compare addresses here.
///
/// What it saves, measured once (not a test) in a scratch namespace holding 50,000 UDP
/// entries, debug build, 6.18.44 on a 2-core VM: a full IPv4 dump is 8.2 MB of netlink and
/// 165-250 ms with decoding; a filtered one (50 matching entries) 8.2 KB and 14-21 ms, what
/// is left being the kernel's walk of the table. At 500,000 entries every 3 s that is ~27 MB/s
/// of copies and decoding avoided per node.
///
/// netlink-packet-netfilter 0.4.0 has no variant for `CTA_FILTER`: the request is raw
/// `DefaultNla`s ([`filter_attributes`] says why not `ConntrackAttribute::Other`); a nested
/// attribute holding one u32 needs no `Nla` impl of our own.
pub fn dump_filtered(filter: &OrigFilter) -> Result<Vec<ConntrackEntry>, ConntrackError> {
    let raw = dump_filtered_raw(filter)?;
    let mut entries = parse_all("conntrack filtered dump", &raw)?;
    entries.retain(|e| filter.matches(e));
    Ok(entries)
}

/// The raw reply bytes of [`dump_filtered`]'s request, before the userspace filter (what the
/// kernel sent). For tests and measurements.
#[doc(hidden)]
pub fn dump_filtered_raw(filter: &OrigFilter) -> Result<Vec<u8>, ConntrackError> {
    request(
        "conntrack filtered dump",
        filter.family(),
        ConntrackMessage::Other {
            message_type: IPCTNL_MSG_CT_GET,
            attributes: filter_attributes(filter),
        },
        true,
    )
}

/// The request's attributes for `filter`: `CTA_TUPLE_ORIG` with the fields the kernel is asked
/// to compare, and `CTA_FILTER`. Empty when nothing is left for the kernel (a plain dump of the
/// family). Pure.
///
/// Raw `DefaultNla`s, sent as `ConntrackMessage::Other` of type `IPCTNL_MSG_CT_GET`:
/// `ConntrackAttribute::Other` would carry `CTA_FILTER` but drops its `NLA_F_NESTED` bit when
/// emitted (its `is_nested` is true only for the crate's own nested variants), and the kernel
/// parses `CTA_FILTER` with `nla_parse_nested`, which refuses an attribute without it (EINVAL).
pub fn filter_attributes(filter: &OrigFilter) -> Vec<DefaultNla> {
    let mut flags = 0u32;
    let mut ips = Vec::new();
    // See `dump_filtered`: IPv6 addresses are compared here only.
    if let Some(a) = filter.src.filter(IpAddr::is_ipv4) {
        ips.push(IPTuple::SourceAddress(a));
        flags |= CTA_FILTER_FLAG_CTA_IP_SRC;
    }
    if let Some(a) = filter.dst.filter(IpAddr::is_ipv4) {
        ips.push(IPTuple::DestinationAddress(a));
        flags |= CTA_FILTER_FLAG_CTA_IP_DST;
    }
    let mut protos = Vec::new();
    if let Some(p) = filter.proto {
        let v6 = filter.family() == NetfilterProtoFamily::IPv6;
        protos.push(ProtoTuple::Protocol(Protocol::from(p.to_raw(v6))));
        flags |= CTA_FILTER_FLAG_CTA_PROTO_NUM;
        if matches!(p, Proto::Tcp | Proto::Udp) {
            if let Some(port) = filter.sport {
                protos.push(ProtoTuple::SourcePort(port));
                flags |= CTA_FILTER_FLAG_CTA_PROTO_SRC_PORT;
            }
            if let Some(port) = filter.dport {
                protos.push(ProtoTuple::DestinationPort(port));
                flags |= CTA_FILTER_FLAG_CTA_PROTO_DST_PORT;
            }
        }
    }
    if flags == 0 {
        return Vec::new();
    }
    let mut tuple = Vec::new();
    if !ips.is_empty() {
        tuple.push(CtTuple::Ip(ips));
    }
    if !protos.is_empty() {
        tuple.push(CtTuple::Proto(protos));
    }
    let orig = ConntrackAttribute::CtaTupleOrig(tuple);
    let mut orig_bytes = vec![0u8; orig.buffer_len()];
    orig.emit(&mut orig_bytes);
    let mut orig_flags = vec![0u8; 8];
    // NLA_U32 in the kernel's policy: host byte order.
    DefaultNla::new(CTA_FILTER_ORIG_FLAGS, flags.to_ne_bytes().to_vec()).emit(&mut orig_flags);
    vec![
        DefaultNla::new(orig.kind() | NLA_F_NESTED, orig_bytes[4..].to_vec()),
        DefaultNla::new(CTA_FILTER | NLA_F_NESTED, orig_flags),
    ]
}

/// Every conntrack entry of one family (`v6 = false`: IPv4) in the calling thread's network
/// namespace. Blocking.
pub fn dump_family(v6: bool) -> Result<Vec<ConntrackEntry>, ConntrackError> {
    dump(if v6 {
        NetfilterProtoFamily::IPv6
    } else {
        NetfilterProtoFamily::IPv4
    })
}

/// [`lookup`] on tokio's blocking pool. The pool's threads share the process's network
/// namespace, so this is only right when the whole process runs in the target namespace.
pub async fn lookup_async(tuple: Tuple) -> Result<Option<ConntrackEntry>, ConntrackError> {
    tokio::task::spawn_blocking(move || lookup(&tuple)).await?
}

/// [`dump_by_source`] on tokio's blocking pool (same namespace caveat as [`lookup_async`]).
pub async fn dump_by_source_async(src: IpAddr) -> Result<Vec<ConntrackEntry>, ConntrackError> {
    tokio::task::spawn_blocking(move || dump_by_source(src)).await?
}

fn dump(family: NetfilterProtoFamily) -> Result<Vec<ConntrackEntry>, ConntrackError> {
    let raw = dump_raw(family)?;
    parse_all("conntrack dump", &raw)
}

/// The raw reply bytes of a full dump of one family (all datagrams, concatenated: a sequence of
/// netlink messages ending with `NLMSG_DONE`). For capturing test fixtures.
#[doc(hidden)]
pub fn dump_raw(family: NetfilterProtoFamily) -> Result<Vec<u8>, ConntrackError> {
    request(
        "conntrack dump",
        family,
        ConntrackMessage::Get(vec![]),
        true,
    )
}

fn family_of(ip: IpAddr) -> NetfilterProtoFamily {
    if ip.is_ipv4() {
        NetfilterProtoFamily::IPv4
    } else {
        NetfilterProtoFamily::IPv6
    }
}

fn parse_all(op: &'static str, raw: &[u8]) -> Result<Vec<ConntrackEntry>, ConntrackError> {
    parse_messages(raw).map_err(|source| ConntrackError::Decode { op, source })
}

/// Sends one ctnetlink request and collects the raw reply messages until the request is
/// complete (`NLMSG_DONE` for a dump, the ACK for a plain request).
fn request(
    op: &'static str,
    family: NetfilterProtoFamily,
    msg: ConntrackMessage,
    dump: bool,
) -> Result<Vec<u8>, ConntrackError> {
    let packet = NetlinkMessage::from(NetfilterMessage::new(
        NetfilterHeader::new(family, 0, 0),
        msg,
    ));
    Ok(netlink::request_kept(NETLINK_NETFILTER, op, packet, dump)?)
}

/// Why a ctnetlink reply could not be read at all: every message that failed, in order.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ReplyError(pub Vec<MessageError>);

/// One message of a reply that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("truncated message at offset {offset}")]
    Truncated { offset: usize },
    #[error("message at offset {offset}: {source}")]
    Undecodable {
        offset: usize,
        #[source]
        source: netlink_packet_core::DecodeError,
    },
}

/// `NFNL_SUBSYS_CTNETLINK`: the high byte of a conntrack message's type.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;

/// Decodes a sequence of netlink messages (ctnetlink replies, as received) into conntrack
/// entries. Messages that are not conntrack entries (`NLMSG_DONE`, ACKs, other subsystems) are
/// skipped; an entry message the decoder cannot read is skipped too, and reported in the error
/// only when nothing at all could be read. Truncated input ends the walk.
pub fn parse_messages(bytes: &[u8]) -> Result<Vec<ConntrackEntry>, ReplyError> {
    let mut entries = Vec::new();
    let mut errors = Vec::new();
    let mut offset = 0;
    while offset + 16 <= bytes.len() {
        let len = NetlinkBuffer::new(&bytes[offset..]).length() as usize;
        if len < 16 || offset + len > bytes.len() {
            errors.push(MessageError::Truncated { offset });
            break;
        }
        // Only ctnetlink's (and the control messages) are handed to the crate's decoder: its
        // nf_tables decoder panics on a malformed message (found by fuzz_tests with the
        // nf_tables captures), and a conntrack reply holds none anyway.
        let subsystem = NetlinkBuffer::new(&bytes[offset..]).message_type() >> 8;
        if subsystem != NFNL_SUBSYS_CTNETLINK && subsystem != 0 {
            offset += (len + 3) & !3;
            continue;
        }
        match NetlinkMessage::<NetfilterMessage>::deserialize(&bytes[offset..offset + len]) {
            Ok(msg) => {
                if let NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner: NetfilterMessageInner::Conntrack(ct),
                    ..
                }) = msg.payload
                {
                    let attrs = match &ct {
                        ConntrackMessage::New(a)
                        | ConntrackMessage::Get(a)
                        | ConntrackMessage::Delete(a) => Some(a),
                        _ => None,
                    };
                    if let Some(entry) = attrs.and_then(|a| entry_from_attributes(a)) {
                        entries.push(entry);
                    }
                }
            }
            Err(source) => errors.push(MessageError::Undecodable { offset, source }),
        }
        offset += (len + 3) & !3;
    }
    if entries.is_empty() && !errors.is_empty() {
        return Err(ReplyError(errors));
    }
    for e in &errors {
        tracing::debug!("ctnetlink: skipped {e}");
    }
    Ok(entries)
}

/// One conntrack entry from the attributes of a ctnetlink message; None without both tuples.
pub fn entry_from_attributes(attrs: &[ConntrackAttribute]) -> Option<ConntrackEntry> {
    let mut orig = None;
    let mut reply = None;
    let mut status = 0u32;
    let mut tcp_state = None;
    let mut timeout_s = None;
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTimeout(t) => timeout_s = Some(*t),
            ConntrackAttribute::CtaTupleOrig(t) => orig = tuple_from(t),
            ConntrackAttribute::CtaTupleReply(t) => reply = tuple_from(t),
            ConntrackAttribute::CtaStatus(s) => status = s.bits(),
            ConntrackAttribute::CtaProtoInfo(infos) => {
                for info in infos {
                    if let ProtoInfo::TCP(tcp) = info {
                        for t in tcp {
                            if let ProtoInfoTCP::State(s) = t {
                                tcp_state = Some(tcp_state_name(*s));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Some(ConntrackEntry {
        orig: orig?,
        reply: reply?,
        snat: status & IPS_SRC_NAT != 0,
        dnat: status & IPS_DST_NAT != 0,
        seen_reply: status & IPS_SEEN_REPLY != 0,
        assured: status & IPS_ASSURED != 0,
        tcp_state,
        timeout_s,
    })
}

fn tuple_from(parts: &[CtTuple]) -> Option<Tuple> {
    let (mut src, mut dst, mut proto) = (None, None, None);
    let (mut sport, mut dport) = (0u16, 0u16);
    for p in parts {
        match p {
            CtTuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            CtTuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(n) => proto = Some(Proto::from_raw(u8::from(*n))),
                        ProtoTuple::SourcePort(v) => sport = *v,
                        ProtoTuple::DestinationPort(v) => dport = *v,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple {
        src: src?,
        dst: dst?,
        sport,
        dport,
        proto: proto?,
    })
}

/// conntrack's name for a TCP state (kernel `enum tcp_conntrack`).
pub fn tcp_state_name(state: u8) -> String {
    const NAMES: [&str; 10] = [
        "NONE",
        "SYN_SENT",
        "SYN_RECV",
        "ESTABLISHED",
        "FIN_WAIT",
        "CLOSE_WAIT",
        "LAST_ACK",
        "TIME_WAIT",
        "CLOSE",
        "SYN_SENT2",
    ];
    NAMES
        .get(state as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("UNKNOWN({state})"))
}

#[cfg(test)]
#[path = "conntrack_tests.rs"]
mod tests;
