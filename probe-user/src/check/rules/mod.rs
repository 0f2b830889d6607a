//! The rules of `probe check`, pure: [`Inputs`] in, [`Finding`]s out. One function per kind,
//! each in its own file; the helpers two rules share are here.

use std::net::IpAddr;

use super::{Finding, Inputs, LbTarget};

mod hairpin;
mod healthcheck_blackhole;
mod kernel_visibility;
mod kptr_restrict;
mod kube_api;
mod nic_source_validation;
mod vip_port_unserved;

pub use hairpin::covers_pod_egress;
use hairpin::hairpin;
use healthcheck_blackhole::healthcheck_blackhole;
use kernel_visibility::kernel_visibility;
use kptr_restrict::kptr_restrict;
use kube_api::kube_api;
use nic_source_validation::nic_source_validation;
use vip_port_unserved::vip_port_unserved;

/// Every finding for these inputs.
pub fn judge(inp: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(healthcheck_blackhole(inp));
    out.extend(vip_port_unserved(inp));
    out.extend(hairpin(inp));
    out.extend(nic_source_validation(inp));
    out.extend(kptr_restrict(inp));
    out.extend(kernel_visibility(inp));
    out.extend(kube_api(inp));
    out
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn targets_of(inp: &Inputs, ip: IpAddr) -> Vec<&LbTarget> {
    inp.lb_targets.iter().filter(|t| t.ip == ip).collect()
}

/// Addresses bound on the VIP interface that an LB can health-check from: every one named as
/// an LB ingress IP, and every other one kube-proxy does not name as a ClusterIP (an external
/// IP, or an LB IP on a node whose sets we could not read). ClusterIPs are never an LB's
/// source, so they are left out: on an IPVS node they are most of kube-ipvs0.
fn bound_lb_ips(inp: &Inputs) -> Vec<IpAddr> {
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

fn prevent_loopback(targets: &[&LbTarget]) -> Vec<String> {
    let mut v: Vec<String> = targets
        .iter()
        .flat_map(|t| t.prevent_loopback.iter().cloned())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn named(targets: &[&LbTarget]) -> String {
    let mut names: Vec<&str> = targets
        .iter()
        .filter_map(|t| t.service.as_deref())
        .collect();
    names.sort();
    names.dedup();
    names.join(", ")
}
