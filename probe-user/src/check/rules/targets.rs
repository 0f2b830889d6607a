//! What several rules ask of the node's LB targets: which bound addresses an LB can
//! health-check from, the targets of an address, their Services' names and loopback settings.

use std::net::IpAddr;

use probe_contract::facts::AddressOwner;

use crate::check::{Inputs, LbTarget};

/// Where `ip` is local, for evidence and summaries: "bound on kube-ipvs0", or its owner.
pub(super) fn where_local(inp: &Inputs, ip: IpAddr) -> String {
    match inp.owners.get(&ip) {
        None | Some(AddressOwner::VipInterface { .. }) => format!("bound on {}", inp.vip_iface),
        Some(o) => format!("local through {o}"),
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

pub(super) fn targets_of(inp: &Inputs, ip: IpAddr) -> Vec<&LbTarget> {
    inp.lb_targets.iter().filter(|t| t.ip == ip).collect()
}

/// Addresses bound on the VIP interface that an LB can health-check from: every one named as
/// an LB ingress IP, and every other one kube-proxy does not name as a ClusterIP (an external
/// IP, or an LB IP on a node whose sets we could not read). ClusterIPs are never an LB's
/// source, so they are left out: on an IPVS node they are most of kube-ipvs0.
pub(super) fn bound_lb_ips(inp: &Inputs) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = inp
        .bound
        .iter()
        .copied()
        .filter(|ip| !is_link_local(*ip))
        .filter(|ip| !targets_of(inp, *ip).is_empty() || !inp.cluster_ips.contains(ip))
        .collect();
    v.sort();
    v.dedup();
    v
}

pub(super) fn prevent_loopback(targets: &[&LbTarget]) -> Vec<String> {
    let mut v: Vec<String> = targets
        .iter()
        .flat_map(|t| t.prevent_loopback.iter().cloned())
        .collect();
    v.sort();
    v.dedup();
    v
}

pub(super) fn named(targets: &[&LbTarget]) -> String {
    let mut names: Vec<&str> = targets
        .iter()
        .filter_map(|t| t.service.as_deref())
        .collect();
    names.sort();
    names.dedup();
    names.join(", ")
}
