//! The IPVS generic-netlink message format (the commands and attributes of uapi
//! `linux/ip_vs.h`, which no kept crate has): encoding requests and decoding replies.
//! Pure: no socket here; [`super`] talks to the kernel. The decoded data ([`IpvsService`],
//! [`IpvsDest`]) and [`IpvsError`] live here too, so this file imports nothing of its reader.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer,
    NetlinkMessage, NetlinkPayload, Nla, NlaBuffer, NlasIterator, Parseable, ParseableParametrized,
    emit_u16, emit_u16_be, emit_u32, parse_string, parse_u16, parse_u16_be, parse_u32,
};
use netlink_packet_generic::{
    GenlFamily, GenlHeader, GenlMessage,
    ctrl::{GenlCtrl, GenlCtrlCmd, nlas::GenlCtrlAttrs},
};

use crate::netlink::{self, FramingError, NetlinkError};

/// The generic-netlink family name (`IPVS_GENL_NAME`).
pub const FAMILY: &str = "IPVS";
pub(super) const IPVS_GENL_VERSION: u8 = 1;

// uapi linux/ip_vs.h
pub(super) const IPVS_CMD_NEW_SERVICE: u8 = 1;
pub(super) const IPVS_CMD_GET_SERVICE: u8 = 4;
pub(super) const IPVS_CMD_NEW_DEST: u8 = 5;
pub(super) const IPVS_CMD_GET_DEST: u8 = 8;
pub(super) const IPVS_CMD_ATTR_SERVICE: u16 = 1;
pub(super) const IPVS_CMD_ATTR_DEST: u16 = 2;
pub(super) const IPVS_SVC_ATTR_AF: u16 = 1;
pub(super) const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
pub(super) const IPVS_SVC_ATTR_ADDR: u16 = 3;
pub(super) const IPVS_SVC_ATTR_PORT: u16 = 4;
pub(super) const IPVS_SVC_ATTR_FWMARK: u16 = 5;
pub(super) const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
pub(super) const IPVS_DEST_ATTR_ADDR: u16 = 1;
pub(super) const IPVS_DEST_ATTR_PORT: u16 = 2;
pub(super) const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
pub(super) const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
pub(super) const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;
pub(super) const IP_VS_CONN_F_FWD_MASK: u32 = 0x7;

pub(super) const AF_INET: u16 = libc::AF_INET as u16;
pub(super) const AF_INET6: u16 = libc::AF_INET6 as u16;

/// Why reading IPVS failed.
#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    /// The socket failed, or the kernel refused a request.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// A captured reply carries the kernel's refusal (what [`NetlinkError::Kernel`] is live).
    #[error("IPVS {what}: the kernel refused: {source}")]
    Kernel {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("IPVS {what}: {source}")]
    Framing {
        what: &'static str,
        #[source]
        source: FramingError,
    },
    #[error("IPVS {what}: undecodable message: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: DecodeError,
    },
    #[error("IPVS: fewer destination dumps ({dumps}) than services that have destinations")]
    MissingDests { dumps: usize },
}

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

/// A real server of a virtual service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsDest {
    pub addr: IpAddr,
    pub port: u16,
    pub forward: Forward,
    pub weight: u32,
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

// ----- messages ---------------------------------------------------------------------------------

/// An IPVS generic-netlink message: a command and its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsMessage {
    pub cmd: u8,
    pub attrs: Vec<IpvsAttr>,
}

impl IpvsMessage {
    pub(super) fn get_services() -> IpvsMessage {
        IpvsMessage {
            cmd: IPVS_CMD_GET_SERVICE,
            attrs: Vec::new(),
        }
    }

    /// What identifies a service in a `GET_DEST` request: AF + protocol + address + port, or
    /// AF + firewall mark.
    pub(super) fn get_dests(svc: &IpvsService) -> IpvsMessage {
        IpvsMessage {
            cmd: IPVS_CMD_GET_DEST,
            attrs: vec![IpvsAttr::Service(service_key(svc))],
        }
    }

    /// One virtual service by its key (a request, not a dump): the kernel answers with that
    /// service alone, or `ESRCH` when there is none (`ip_vs_genl_get_cmd` in
    /// net/netfilter/ipvs/ip_vs_ctl.c). The per-question read of issue #52: one service's
    /// message instead of a dump of 10,000.
    pub(super) fn get_service(svc: &IpvsService) -> IpvsMessage {
        IpvsMessage {
            cmd: IPVS_CMD_GET_SERVICE,
            attrs: vec![IpvsAttr::Service(service_key(svc))],
        }
    }
}

/// The attributes that name one service in a request: AF + protocol + address + port, or AF
/// + firewall mark (`ip_vs_genl_parse_service`'s key).
fn service_key(svc: &IpvsService) -> Vec<ServiceAttr> {
    let mut key = vec![ServiceAttr::Af(svc.af)];
    match svc.addr {
        Some(addr) => {
            let mut raw = vec![0u8; 16];
            match addr {
                IpAddr::V4(a) => raw[..4].copy_from_slice(&a.octets()),
                IpAddr::V6(a) => raw.copy_from_slice(&a.octets()),
            }
            key.push(ServiceAttr::Protocol(svc.protocol));
            key.push(ServiceAttr::Addr(raw));
            key.push(ServiceAttr::Port(svc.port));
        }
        None => key.push(ServiceAttr::Fwmark(svc.fwmark)),
    }
    key
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        FAMILY
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        IPVS_GENL_VERSION
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(IpvsMessage {
            cmd: header.cmd,
            attrs: parse_nlas(buf, |nla| IpvsAttr::parse(nla))?,
        })
    }
}

fn parse_nlas<T>(
    buf: &[u8],
    parse: impl Fn(&NlaBuffer<&[u8]>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    NlasIterator::new(buf)
        .map(|nla| nla.and_then(|nla| parse(&nla)))
        .collect()
}

/// `IPVS_CMD_ATTR_*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpvsAttr {
    Service(Vec<ServiceAttr>),
    Dest(Vec<DestAttr>),
    Other(DefaultNla),
}

/// `IPVS_SVC_ATTR_*` (the ones the probe reads or sends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceAttr {
    Af(u16),
    Protocol(u16),
    /// `union nf_inet_addr`: 16 bytes, read as [`ServiceAttr::Af`] says.
    Addr(Vec<u8>),
    /// Host order here; network order on the wire.
    Port(u16),
    Fwmark(u32),
    SchedName(String),
    Other(DefaultNla),
}

/// `IPVS_DEST_ATTR_*` (the ones the probe reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DestAttr {
    Addr(Vec<u8>),
    /// Host order here; network order on the wire.
    Port(u16),
    FwdMethod(u32),
    Weight(u32),
    AddrFamily(u16),
    Other(DefaultNla),
}

impl Nla for IpvsAttr {
    fn value_len(&self) -> usize {
        match self {
            IpvsAttr::Service(a) => a.as_slice().buffer_len(),
            IpvsAttr::Dest(a) => a.as_slice().buffer_len(),
            IpvsAttr::Other(o) => o.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            IpvsAttr::Service(_) => IPVS_CMD_ATTR_SERVICE,
            IpvsAttr::Dest(_) => IPVS_CMD_ATTR_DEST,
            IpvsAttr::Other(o) => o.kind(),
        }
    }

    fn is_nested(&self) -> bool {
        !matches!(self, IpvsAttr::Other(_))
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            IpvsAttr::Service(a) => a.as_slice().emit(buffer),
            IpvsAttr::Dest(a) => a.as_slice().emit(buffer),
            IpvsAttr::Other(o) => o.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for IpvsAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            IPVS_CMD_ATTR_SERVICE => IpvsAttr::Service(
                parse_nlas(value, |nla| ServiceAttr::parse(nla))
                    .context("IPVS_CMD_ATTR_SERVICE")?,
            ),
            IPVS_CMD_ATTR_DEST => IpvsAttr::Dest(
                parse_nlas(value, |nla| DestAttr::parse(nla)).context("IPVS_CMD_ATTR_DEST")?,
            ),
            _ => IpvsAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

impl Nla for ServiceAttr {
    fn value_len(&self) -> usize {
        match self {
            ServiceAttr::Af(_) | ServiceAttr::Protocol(_) | ServiceAttr::Port(_) => 2,
            ServiceAttr::Fwmark(_) => 4,
            ServiceAttr::Addr(a) => a.len(),
            ServiceAttr::SchedName(n) => n.len() + 1,
            ServiceAttr::Other(o) => o.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            ServiceAttr::Af(_) => IPVS_SVC_ATTR_AF,
            ServiceAttr::Protocol(_) => IPVS_SVC_ATTR_PROTOCOL,
            ServiceAttr::Addr(_) => IPVS_SVC_ATTR_ADDR,
            ServiceAttr::Port(_) => IPVS_SVC_ATTR_PORT,
            ServiceAttr::Fwmark(_) => IPVS_SVC_ATTR_FWMARK,
            ServiceAttr::SchedName(_) => IPVS_SVC_ATTR_SCHED_NAME,
            ServiceAttr::Other(o) => o.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        // The buffer is exactly value_len() long: the emits cannot fail.
        match self {
            ServiceAttr::Af(v) | ServiceAttr::Protocol(v) => {
                let _ = emit_u16(buffer, *v);
            }
            ServiceAttr::Port(v) => {
                let _ = emit_u16_be(buffer, *v);
            }
            ServiceAttr::Fwmark(v) => {
                let _ = emit_u32(buffer, *v);
            }
            ServiceAttr::Addr(a) => buffer.copy_from_slice(a),
            ServiceAttr::SchedName(n) => {
                buffer[..n.len()].copy_from_slice(n.as_bytes());
                buffer[n.len()] = 0;
            }
            ServiceAttr::Other(o) => o.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for ServiceAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_SVC_ATTR_AF => ServiceAttr::Af(parse_u16(v).context("IPVS_SVC_ATTR_AF")?),
            IPVS_SVC_ATTR_PROTOCOL => {
                ServiceAttr::Protocol(parse_u16(v).context("IPVS_SVC_ATTR_PROTOCOL")?)
            }
            IPVS_SVC_ATTR_ADDR => ServiceAttr::Addr(v.to_vec()),
            IPVS_SVC_ATTR_PORT => ServiceAttr::Port(parse_u16_be(v).context("IPVS_SVC_ATTR_PORT")?),
            IPVS_SVC_ATTR_FWMARK => {
                ServiceAttr::Fwmark(parse_u32(v).context("IPVS_SVC_ATTR_FWMARK")?)
            }
            IPVS_SVC_ATTR_SCHED_NAME => {
                ServiceAttr::SchedName(parse_string(v).context("IPVS_SVC_ATTR_SCHED_NAME")?)
            }
            _ => ServiceAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

impl Nla for DestAttr {
    fn value_len(&self) -> usize {
        match self {
            DestAttr::Port(_) | DestAttr::AddrFamily(_) => 2,
            DestAttr::FwdMethod(_) | DestAttr::Weight(_) => 4,
            DestAttr::Addr(a) => a.len(),
            DestAttr::Other(o) => o.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            DestAttr::Addr(_) => IPVS_DEST_ATTR_ADDR,
            DestAttr::Port(_) => IPVS_DEST_ATTR_PORT,
            DestAttr::FwdMethod(_) => IPVS_DEST_ATTR_FWD_METHOD,
            DestAttr::Weight(_) => IPVS_DEST_ATTR_WEIGHT,
            DestAttr::AddrFamily(_) => IPVS_DEST_ATTR_ADDR_FAMILY,
            DestAttr::Other(o) => o.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        // The buffer is exactly value_len() long: the emits cannot fail.
        match self {
            DestAttr::Addr(a) => buffer.copy_from_slice(a),
            DestAttr::Port(v) => {
                let _ = emit_u16_be(buffer, *v);
            }
            DestAttr::AddrFamily(v) => {
                let _ = emit_u16(buffer, *v);
            }
            DestAttr::FwdMethod(v) | DestAttr::Weight(v) => {
                let _ = emit_u32(buffer, *v);
            }
            DestAttr::Other(o) => o.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for DestAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_DEST_ATTR_ADDR => DestAttr::Addr(v.to_vec()),
            IPVS_DEST_ATTR_PORT => DestAttr::Port(parse_u16_be(v).context("IPVS_DEST_ATTR_PORT")?),
            IPVS_DEST_ATTR_FWD_METHOD => {
                DestAttr::FwdMethod(parse_u32(v).context("IPVS_DEST_ATTR_FWD_METHOD")?)
            }
            IPVS_DEST_ATTR_WEIGHT => {
                DestAttr::Weight(parse_u32(v).context("IPVS_DEST_ATTR_WEIGHT")?)
            }
            IPVS_DEST_ATTR_ADDR_FAMILY => {
                DestAttr::AddrFamily(parse_u16(v).context("IPVS_DEST_ATTR_ADDR_FAMILY")?)
            }
            _ => DestAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

// ----- decoding ---------------------------------------------------------------------------------

/// The generic-netlink messages of a reply, decoded as `F`, up to `NLMSG_DONE`; a kernel
/// error in the stream fails the decode.
fn genl_messages<F>(bytes: &[u8], what: &'static str) -> Result<Vec<GenlMessage<F>>, IpvsError>
where
    F: ParseableParametrized<[u8], GenlHeader> + std::fmt::Debug,
{
    let mut out = Vec::new();
    for msg in netlink::split(bytes).map_err(|source| IpvsError::Framing { what, source })? {
        match NetlinkBuffer::new(msg).message_type() {
            NLMSG_DONE => break,
            NLMSG_ERROR => {
                if let Some(source) = netlink::kernel_error(msg) {
                    return Err(IpvsError::Kernel { what, source });
                }
            }
            _ => {
                // netlink-packet-generic 0.5 indexes some nested attributes unchecked (a
                // one-byte flip in a CTRL reply made it panic under fuzzing): a reply it
                // cannot decode is a decode error here, not a crashed agent.
                let decoded =
                    std::panic::catch_unwind(|| NetlinkMessage::<GenlMessage<F>>::deserialize(msg))
                        .unwrap_or_else(|_| {
                            Err(DecodeError::from("malformed attribute (decoder panicked)"))
                        })
                        .map_err(|source| IpvsError::Decode { what, source })?;
                if let NetlinkPayload::InnerMessage(m) = decoded.payload {
                    out.push(m);
                }
            }
        }
    }
    Ok(out)
}

/// The family id in a `CTRL_CMD_GETFAMILY` reply (None when the reply names none).
pub fn parse_family_id(bytes: &[u8]) -> Result<Option<u16>, IpvsError> {
    Ok(genl_messages::<GenlCtrl>(bytes, "family lookup")?
        .into_iter()
        .filter(|m| m.payload.cmd == GenlCtrlCmd::NewFamily)
        .flat_map(|m| m.payload.nlas)
        .find_map(|a| match a {
            GenlCtrlAttrs::FamilyId(id) => Some(id),
            _ => None,
        }))
}

/// The payloads of command `cmd` in a dump.
fn ipvs_messages(bytes: &[u8], cmd: u8, what: &'static str) -> Result<Vec<IpvsAttr>, IpvsError> {
    Ok(genl_messages::<IpvsMessage>(bytes, what)?
        .into_iter()
        .filter(|m| m.payload.cmd == cmd)
        .flat_map(|m| m.payload.attrs)
        .collect())
}

/// The services of an `IPVS_CMD_GET_SERVICE` dump. A service without an address family is
/// skipped.
pub fn parse_services(bytes: &[u8]) -> Result<Vec<IpvsService>, IpvsError> {
    let mut out = Vec::new();
    for attr in ipvs_messages(bytes, IPVS_CMD_NEW_SERVICE, "service dump")? {
        let IpvsAttr::Service(attrs) = attr else {
            continue;
        };
        let (mut af, mut protocol, mut raw_addr, mut port, mut fwmark, mut scheduler) =
            (None, 0, None, 0, 0, String::new());
        for a in attrs {
            match a {
                ServiceAttr::Af(v) => af = Some(v),
                ServiceAttr::Protocol(v) => protocol = v,
                ServiceAttr::Addr(v) => raw_addr = Some(v),
                ServiceAttr::Port(v) => port = v,
                ServiceAttr::Fwmark(v) => fwmark = v,
                ServiceAttr::SchedName(v) => scheduler = v,
                ServiceAttr::Other(_) => {}
            }
        }
        let Some(af) = af else {
            continue;
        };
        let addr = if fwmark == 0 {
            raw_addr.and_then(|b| inet_addr(af, &b))
        } else {
            None
        };
        out.push(IpvsService {
            af,
            protocol,
            addr,
            port,
            fwmark,
            scheduler,
        });
    }
    Ok(out)
}

/// The real servers of an `IPVS_CMD_GET_DEST` dump. The address family is the destination's
/// own (`IPVS_DEST_ATTR_ADDR_FAMILY`, kernels since 4.x) or else taken from the address.
pub fn parse_dests(bytes: &[u8]) -> Result<Vec<IpvsDest>, IpvsError> {
    let mut out = Vec::new();
    for attr in ipvs_messages(bytes, IPVS_CMD_NEW_DEST, "destination dump")? {
        let IpvsAttr::Dest(attrs) = attr else {
            continue;
        };
        let (mut raw_addr, mut af, mut port, mut forward, mut weight) = (None, None, 0, 0, 0);
        for a in attrs {
            match a {
                DestAttr::Addr(v) => raw_addr = Some(v),
                DestAttr::AddrFamily(v) => af = Some(v),
                DestAttr::Port(v) => port = v,
                DestAttr::FwdMethod(v) => forward = v,
                DestAttr::Weight(v) => weight = v,
                DestAttr::Other(_) => {}
            }
        }
        let Some(raw) = raw_addr else {
            continue;
        };
        let af = af.unwrap_or(if raw.get(4..).is_none_or(|b| b.iter().all(|b| *b == 0)) {
            AF_INET
        } else {
            AF_INET6
        });
        let Some(addr) = inet_addr(af, &raw) else {
            continue;
        };
        out.push(IpvsDest {
            addr,
            port,
            forward: Forward::from_flags(forward),
            weight,
        });
    }
    Ok(out)
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
