//! IPVS virtual services of the current network namespace, over generic netlink.
//!
//! The `IPVS` generic-netlink family (what `ipvsadm` itself talks): resolve the family id with
//! the controller's `CTRL_CMD_GETFAMILY`, dump `IPVS_CMD_GET_SERVICE` for the virtual services
//! (address family, protocol, address, port, firewall mark, scheduler), then one
//! `IPVS_CMD_GET_DEST` dump per service for its real servers. Framing and the controller are
//! `netlink-packet-generic`'s; the IPVS commands and attributes ([`IpvsMessage`]) are ours (no
//! kept crate has them); requests go through [`crate::netlink`]. Everything runs in the network
//! namespace of the calling thread (the agent runs inside `ip netns exec`).
//!
//! On a kernel without IPVS [`read`] answers `Ok(None)` (and says so once in the log): the
//! caller then uses kube-proxy's iptables rules. "Without IPVS" includes `ip_vs` built as a
//! module but not loaded (no `/proc/net/ip_vs`): resolving the family would make the kernel
//! load the module, and a probe must not change the node it watches.
//!
//! The decoders ([`parse_family_id`], [`parse_services`], [`parse_dests`]) are pure, and tested
//! on replies captured from a real kernel (`probe-user/tests/data/ipvs/`, captured in the VM
//! tier by `real_ipvs_in_a_namespace` in `ipvs_tests.rs`).

use std::{
    net::IpAddr,
    sync::atomic::{AtomicBool, Ordering},
};

use netlink_packet_core::{Emitable, NetlinkMessage};
use netlink_packet_generic::{
    GenlFamily, GenlMessage,
    ctrl::{GenlCtrl, GenlCtrlCmd, nlas::GenlCtrlAttrs},
};
use netlink_sys::protocols::NETLINK_GENERIC;
use probe_contract::Proto;

use super::{ServiceEntry, ServiceSource, ServiceTable};
use crate::netlink::Connection;

mod wire;

pub use self::wire::{
    DestAttr, FAMILY, Forward, IpvsAttr, IpvsDest, IpvsError, IpvsMessage, IpvsService,
    ServiceAttr, parse_dests, parse_family_id, parse_services,
};

/// Present in every network namespace once `ip_vs` is loaded (or built in).
pub const PROC_IP_VS: &str = "/proc/net/ip_vs";

/// A virtual service with its real servers.
pub type ServiceWithDests = (IpvsService, Vec<IpvsDest>);

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

/// The IPVS table, or None when this kernel (or namespace) has no IPVS. Each reply message is
/// decoded as it arrives and each service's real servers go straight into its entry: a read
/// that held every raw reply ([`capture`]) and their decoded copy beside the table peaked at
/// 103 MiB with 30,000 virtual services (issue #52, BENCHMARKS 9o). The same decoders and
/// [`push_entry`] as [`table_from`]; the VM tier's `real_ipvs_in_a_namespace` holds the two
/// equal on a real kernel.
pub fn read() -> Result<Option<ServiceTable>, IpvsError> {
    let Some((mut conn, family)) = open_family(true)? else {
        return Ok(None);
    };
    let mut services = Vec::new();
    for_each_decoded(
        &mut conn,
        "IPVS service dump",
        genl(IpvsMessage::get_services(), family),
        parse_services,
        |svc| services.push(svc),
    )?;
    let mut table = ServiceTable {
        source: Some(ServiceSource::Ipvs),
        ..Default::default()
    };
    table.services.reserve_exact(services.len());
    let mut dests = Vec::new();
    for svc in &services {
        dests.clear();
        if has_dests(svc) {
            for_each_decoded(
                &mut conn,
                "IPVS destination dump",
                genl(IpvsMessage::get_dests(svc), family),
                parse_dests,
                |d| dests.push(d),
            )?;
        }
        push_entry(&mut table, svc, &dests);
    }
    Ok(Some(table))
}

/// Sends `msg` as a dump and hands what `parse` decodes of each reply message to `each`, as the
/// messages arrive (nothing of the reply is held); the first decode error fails the read.
fn for_each_decoded<F, T>(
    conn: &mut Connection,
    op: &'static str,
    msg: NetlinkMessage<GenlMessage<F>>,
    parse: fn(&[u8]) -> Result<Vec<T>, IpvsError>,
    mut each: impl FnMut(T),
) -> Result<(), IpvsError>
where
    F: GenlFamily + Emitable + std::fmt::Debug,
    GenlMessage<F>: netlink_packet_core::NetlinkSerializable,
{
    let mut failed = None;
    conn.request_each(op, msg, true, &mut |bytes| {
        if failed.is_some() {
            return;
        }
        match parse(bytes) {
            Ok(decoded) => decoded.into_iter().for_each(&mut each),
            Err(e) => failed = Some(e),
        }
    })?;
    failed.map_or(Ok(()), Err)
}

/// Decodes a [`Capture`] whole (fixtures; [`read`] decodes live replies as they arrive).
pub fn decode_capture(cap: &Capture) -> Result<Vec<ServiceWithDests>, IpvsError> {
    let services = parse_services(&cap.services)?;
    let mut out = Vec::with_capacity(services.len());
    let mut dests = cap.dests.iter();
    for svc in services {
        let d = if has_dests(&svc) {
            match dests.next() {
                Some(bytes) => parse_dests(bytes)?,
                None => {
                    return Err(IpvsError::MissingDests {
                        dumps: cap.dests.len(),
                    });
                }
            }
        } else {
            Vec::new()
        };
        out.push((svc, d));
    }
    Ok(out)
}

/// An address service or a firewall-mark service (anything else cannot be asked for).
fn has_dests(svc: &IpvsService) -> bool {
    svc.addr.is_some() || svc.fwmark != 0
}

/// A generic-netlink request of family `family_id` (`NetlinkMessage::finalize` writes it as
/// the message type).
fn genl<F: GenlFamily + Emitable + std::fmt::Debug>(
    payload: F,
    family_id: u16,
) -> NetlinkMessage<GenlMessage<F>> {
    let mut message = GenlMessage::from_payload(payload);
    message.set_resolved_family_id(family_id);
    NetlinkMessage::from(message)
}

/// The controller's `CTRL_CMD_GETFAMILY` request for `name`.
fn family_request(name: &str) -> NetlinkMessage<GenlMessage<GenlCtrl>> {
    genl(
        GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(name.to_string())],
        },
        0,
    )
}

/// Talks to the kernel: the raw replies of one read, or None without IPVS. Held whole, for
/// fixtures and tests; the agent's reads decode as the replies arrive ([`read`]).
pub fn capture() -> Result<Option<Capture>, IpvsError> {
    let Some((mut conn, family_reply, family)) = open_family_reply(true)? else {
        return Ok(None);
    };
    let mut cap = Capture {
        family: family_reply,
        services: conn.request(
            "IPVS service dump",
            genl(IpvsMessage::get_services(), family),
            true,
        )?,
        dests: Vec::new(),
    };
    for svc in parse_services(&cap.services)?
        .iter()
        .filter(|s| has_dests(s))
    {
        cap.dests.push(conn.request(
            "IPVS destination dump",
            genl(IpvsMessage::get_dests(svc), family),
            true,
        )?);
    }
    Ok(Some(cap))
}

/// Each virtual service alone (one dump, no per-service destination dumps) handed to `each` as
/// its message arrives, or None without IPVS: the dump of 30,000 is never held (a question
/// about a port IPVS lacks reads it, issue #52).
pub fn for_each_virtual_service(
    mut each: impl FnMut(IpvsService),
) -> Result<Option<()>, IpvsError> {
    let Some((mut conn, family)) = open_family(false)? else {
        return Ok(None);
    };
    for_each_decoded(
        &mut conn,
        "IPVS service dump",
        genl(IpvsMessage::get_services(), family),
        parse_services,
        &mut each,
    )?;
    Ok(Some(()))
}

/// A socket and the IPVS family id, or None without IPVS (never loading the module: see the
/// module docs); with `say` (the table's reads), why not is logged once.
fn open_family(say: bool) -> Result<Option<(Connection, u16)>, IpvsError> {
    Ok(open_family_reply(say)?.map(|(conn, _, family)| (conn, family)))
}

/// A socket, the controller's raw reply and the IPVS family id, or None without IPVS; with
/// `say`, why not is logged once ([`say_absent`]).
fn open_family_reply(say: bool) -> Result<Option<(Connection, Vec<u8>, u16)>, IpvsError> {
    let absent = |why: &str| {
        if say {
            say_absent(why);
        }
        Ok(None)
    };
    if !std::path::Path::new(PROC_IP_VS).exists() {
        return absent(&format!(
            "no {PROC_IP_VS} (the kernel has no IPVS, or ip_vs is not loaded)"
        ));
    }
    let mut conn = Connection::open(NETLINK_GENERIC, "IPVS")?;
    let family_reply = match conn.request("IPVS family lookup", family_request(FAMILY), false) {
        Ok(b) => b,
        Err(e) if e.kernel_errno() == Some(libc::ENOENT) => {
            return absent("the kernel has no IPVS generic-netlink family");
        }
        Err(e) => return Err(e.into()),
    };
    match parse_family_id(&family_reply)? {
        Some(family) => Ok(Some((conn, family_reply, family))),
        None => absent("the kernel named no IPVS family id"),
    }
}

/// What one keyed look-up found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// This kernel (or namespace) has no IPVS.
    NoIpvs,
    /// No virtual service has that address, port and protocol.
    Absent,
    Found(IpvsService),
}

/// The virtual service `addr:port/proto`, asked for alone (`IPVS_CMD_GET_SERVICE` with its key,
/// not a dump): the per-question read of issue #52, whose cost does not grow with the table.
pub fn virtual_service(addr: IpAddr, port: u16, proto: Proto) -> Result<Lookup, IpvsError> {
    let Some((mut conn, family)) = open_family(false)? else {
        return Ok(Lookup::NoIpvs);
    };
    let key = IpvsService {
        af: if addr.is_ipv6() {
            wire::AF_INET6
        } else {
            wire::AF_INET
        },
        protocol: u16::from(proto.to_raw(addr.is_ipv6())),
        addr: Some(addr),
        port,
        fwmark: 0,
        scheduler: String::new(),
    };
    match conn.request(
        "IPVS service lookup",
        genl(IpvsMessage::get_service(&key), family),
        false,
    ) {
        Ok(reply) => Ok(parse_services(&reply)?
            .into_iter()
            .next()
            .map_or(Lookup::Absent, Lookup::Found)),
        // ESRCH: no such service (ip_vs_genl_get_cmd); ENOENT on kernels that answer so.
        Err(e) if matches!(e.kernel_errno(), Some(libc::ESRCH | libc::ENOENT)) => {
            Ok(Lookup::Absent)
        }
        Err(e) => Err(e.into()),
    }
}

/// A digest of the virtual services alone ([`for_each_virtual_service`]), or None without IPVS: the
/// cheap change test of [`super::changes`]. Statistics are not part of the decoded services,
/// so traffic does not move it.
/// Each service is hashed as its message arrives: the dump of 30,000 is never held.
pub fn services_digest() -> Result<Option<u64>, IpvsError> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    Ok(for_each_virtual_service(|s| hash_service(&s, &mut h))?
        .map(|()| std::hash::Hasher::finish(&h)))
}

/// [`services_digest`] of services already read (tests: the streamed digest is this one).
pub fn digest_of(services: &[IpvsService]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for s in services {
        hash_service(s, &mut h);
    }
    std::hash::Hasher::finish(&h)
}

fn hash_service(s: &IpvsService, h: &mut impl std::hash::Hasher) {
    use std::hash::Hash;
    (s.af, s.protocol, s.addr, s.port, s.fwmark, &s.scheduler).hash(h);
}

/// The digest of no virtual service at all (what [`services_digest`] says of an empty table).
pub fn empty_digest() -> u64 {
    std::hash::Hasher::finish(&std::collections::hash_map::DefaultHasher::new())
}

/// The service table the correlator uses: address services with their real servers as
/// `ip:port`; firewall-mark services have no address and are left out.
pub fn table_from(services: &[ServiceWithDests]) -> ServiceTable {
    let mut table = ServiceTable {
        source: Some(ServiceSource::Ipvs),
        ..Default::default()
    };
    for (svc, dests) in services {
        push_entry(&mut table, svc, dests);
    }
    table
}

/// Adds `svc` with its real servers to `table` (a firewall-mark service has no address: left
/// out).
fn push_entry(table: &mut ServiceTable, svc: &IpvsService, dests: &[IpvsDest]) {
    let Some(vip) = svc.addr else {
        tracing::debug!(fwmark = svc.fwmark, "IPVS: firewall-mark service skipped");
        return;
    };
    table.services.push(ServiceEntry {
        vip,
        port: svc.port,
        proto: Proto::from_raw(svc.protocol as u8),
        service: None,
        backends: dests
            .iter()
            .map(|d| socket_string(d.addr, d.port))
            .collect(),
    });
}

fn socket_string(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

#[cfg(test)]
#[path = "ipvs_tests.rs"]
mod tests;
