//! `probe check`'s remedies: the risks it finds on a node told with the same sentences as the
//! confirmed event they predict, built from a [`placeholder`] event through [`super::build`].

use std::net::IpAddr;

use probe_contract::{
    LoopbackEvent, LoopbackKind, Outcome, Proto,
    facts::{AddressOwner, Facts, ProxyMode, SourceKind},
    sock,
};

use super::{build, sentences::unserved_options};
use crate::state::ServiceSource;

/// `probe check`'s health-check risk: a VIP local through `owner` (kube-ipvs0 when not known)
/// that the LB health-checks `node_port` from.
pub fn healthcheck_blackhole(
    vip: IpAddr,
    node_port: u16,
    owner: Option<&AddressOwner>,
) -> Vec<String> {
    let e = LoopbackEvent {
        vip: Some(vip),
        facts: Facts {
            source: SourceKind::Vip,
            owner: Some(owner.cloned().unwrap_or_else(kube_ipvs0)),
            ..Facts::default()
        },
        ..placeholder(LoopbackKind::HealthcheckBlackhole, vip, node_port)
    };
    build(&e)
}

/// `probe check`'s unserved-port risk: a VIP local through `local_owner` (kube-ipvs0 when not
/// known), `port` unserved.
pub fn vip_port_unserved(
    vip: IpAddr,
    port: u16,
    proto: Proto,
    owner: Option<&str>,
    filtered: bool,
    local_owner: Option<&AddressOwner>,
) -> Vec<String> {
    let facts = Facts {
        owner: Some(local_owner.cloned().unwrap_or_else(kube_ipvs0)),
        access_filtered: filtered,
        ..Facts::default()
    };
    unserved_options(vip, port, proto, owner, &facts, "this node or its pods")
}

/// `probe check`'s `etp_local_drop` risk: `addr:port/proto` is a `drop` element of kube-proxy's
/// nftables `no-endpoint-services`, of `service` (`namespace/name`), whose policy the API
/// says `etp_api` (None: not read).
pub fn etp_local_drop_risk(
    addr: IpAddr,
    port: u16,
    proto: Proto,
    service: Option<&str>,
    etp_api: Option<probe_contract::facts::Etp>,
) -> Vec<String> {
    let e = LoopbackEvent {
        vip: Some(addr),
        vip_port: Some(port),
        proto,
        service: service.map(str::to_owned),
        facts: Facts {
            source: SourceKind::Unknown,
            etp_rules: Some(probe_contract::facts::Etp::Local),
            etp_api,
            proxy_mode: Some(ProxyMode::Nftables),
            ..Facts::default()
        },
        ..placeholder(LoopbackKind::EtpLocalDrop, addr, port)
    };
    build(&e)
}

/// An event with only its kind and the addresses a remedy names (`probe check`'s risks and
/// tests build remedies through it).
pub fn placeholder(kind: LoopbackKind, src: IpAddr, dst_port: u16) -> LoopbackEvent {
    LoopbackEvent {
        count: 1,
        ..LoopbackEvent::between(
            kind,
            (src, 0),
            (IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), dst_port),
            Proto::Tcp,
            Outcome::Dropped,
        )
    }
}

fn kube_ipvs0() -> AddressOwner {
    AddressOwner::VipInterface {
        iface: "kube-ipvs0".to_string(),
    }
}

/// `probe check`'s self-loop risk: the remedy of the confirmed event for pod `pod`:`port`
/// (`service` when the rules name it) missing `missing`, without its "Cause:" line.
pub fn service_self_loop_risk(
    pod: IpAddr,
    port: u16,
    service: Option<&str>,
    missing: probe_contract::facts::SelfLoopMissing,
    source: ServiceSource,
) -> Vec<String> {
    let mut e = placeholder(LoopbackKind::ServiceSelfLoop, pod, port);
    e.dst = pod;
    e.service = service.map(str::to_string);
    e.facts.source = SourceKind::Pod;
    e.facts.self_loop = Some(missing);
    e.facts.proxy_mode = Some(proxy_mode(source));
    build(&e).into_iter().skip(1).collect()
}

/// The contract's name of the mode a service table came from.
pub fn proxy_mode(source: ServiceSource) -> ProxyMode {
    match source {
        ServiceSource::Ipvs => ProxyMode::Ipvs,
        ServiceSource::Iptables => ProxyMode::Iptables,
        ServiceSource::Nftables => ProxyMode::Nftables,
    }
}

/// `ip:port`, with brackets for IPv6 (for `probe check`).
pub fn sock_of(ip: IpAddr, port: u16) -> String {
    sock(ip, port)
}
