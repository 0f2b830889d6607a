//! What both the prediction and the ipMode advice read off the node and its findings.

use std::net::IpAddr;

use probe_contract::facts::AddressOwner;

use crate::check::Inputs;

/// kube-proxy made `ip` local: bound on the VIP interface (or owner unknown, as on IPVS nodes).
pub(super) fn kube_proxy_binds(inp: &Inputs, ip: IpAddr) -> bool {
    matches!(
        inp.owners.get(&ip),
        None | Some(AddressOwner::VipInterface { .. })
    )
}

/// `ip`, `ip:port/proto` or `[v6]:port/proto` -> (ip, port, proto).
pub(super) fn parse_subject(subject: &str) -> Option<(IpAddr, Option<(u16, String)>)> {
    if let Ok(ip) = subject.parse() {
        return Some((ip, None));
    }
    let (addr, proto) = subject.rsplit_once('/')?;
    let sa: std::net::SocketAddr = addr.parse().ok()?;
    Some((sa.ip(), Some((sa.port(), proto.to_string()))))
}
