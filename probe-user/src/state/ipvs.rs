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

/// The IPVS table, or None when this kernel (or namespace) has no IPVS.
pub fn read() -> Result<Option<ServiceTable>, IpvsError> {
    let Some(services) = read_services()? else {
        return Ok(None);
    };
    Ok(Some(table_from(&services)))
}

/// Every virtual service with its real servers, or None without IPVS.
pub fn read_services() -> Result<Option<Vec<ServiceWithDests>>, IpvsError> {
    let Some(cap) = capture()? else {
        return Ok(None);
    };
    decode_capture(&cap).map(Some)
}

/// Decodes a [`Capture`] (what [`read_services`] does with live replies).
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

/// Talks to the kernel: the raw replies of one read, or None without IPVS.
pub fn capture() -> Result<Option<Capture>, IpvsError> {
    if !std::path::Path::new(PROC_IP_VS).exists() {
        say_absent(&format!(
            "no {PROC_IP_VS} (the kernel has no IPVS, or ip_vs is not loaded)"
        ));
        return Ok(None);
    }
    let mut conn = Connection::open(NETLINK_GENERIC, "IPVS")?;
    let family_reply = match conn.request("IPVS family lookup", family_request(FAMILY), false) {
        Ok(b) => b,
        Err(e) if e.kernel_errno() == Some(libc::ENOENT) => {
            say_absent("the kernel has no IPVS generic-netlink family");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let Some(family) = parse_family_id(&family_reply)? else {
        say_absent("the kernel named no IPVS family id");
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

/// The virtual services alone (one dump, no per-service destination dumps), or None without
/// IPVS.
pub fn virtual_services() -> Result<Option<Vec<IpvsService>>, IpvsError> {
    let Some((mut conn, family)) = open_family()? else {
        return Ok(None);
    };
    Ok(Some(parse_services(&conn.request(
        "IPVS service dump",
        genl(IpvsMessage::get_services(), family),
        true,
    )?)?))
}

/// A socket and the IPVS family id, or None without IPVS (never loading the module: see the
/// module docs).
fn open_family() -> Result<Option<(Connection, u16)>, IpvsError> {
    if !std::path::Path::new(PROC_IP_VS).exists() {
        return Ok(None);
    }
    let mut conn = Connection::open(NETLINK_GENERIC, "IPVS")?;
    let family_reply = match conn.request("IPVS family lookup", family_request(FAMILY), false) {
        Ok(b) => b,
        Err(e) if e.kernel_errno() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(parse_family_id(&family_reply)?.map(|family| (conn, family)))
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
    let Some((mut conn, family)) = open_family()? else {
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

/// A digest of the virtual services alone ([`virtual_services`]), or None without IPVS: the
/// cheap change test of [`super::changes`]. Statistics are not part of the decoded services,
/// so traffic does not move it.
pub fn services_digest() -> Result<Option<u64>, IpvsError> {
    use std::hash::{Hash, Hasher};
    let Some(services) = virtual_services()? else {
        return Ok(None);
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for s in &services {
        (s.af, s.protocol, s.addr, s.port, s.fwmark, &s.scheduler).hash(&mut h);
    }
    Ok(Some(h.finish()))
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

#[cfg(test)]
#[path = "ipvs_tests.rs"]
mod tests;
