//! The rules of `probe check`, pure: [`Inputs`] in, [`Finding`]s out. One function per kind,
//! each in its own file; what several rules ask of the LB targets is in `targets.rs`.

use probe_contract::check::Finding;

use super::Inputs;

mod dataplane;
mod etp_local_detector;
mod etp_local_drop;
mod hairpin;
mod healthcheck_blackhole;
mod kernel_visibility;
mod kptr_restrict;
mod kube_api;
mod lb_probe;
mod mode_leftover;
mod nic_source_validation;
mod proxy_protocol;
mod service_self_loop;
mod source_ranges;
mod targets;
mod vip_port_unserved;

use dataplane::dataplane;
use etp_local_drop::etp_local_drop;
pub use hairpin::covers_pod_egress;
use hairpin::hairpin;
use healthcheck_blackhole::healthcheck_blackhole;
use kernel_visibility::kernel_visibility;
use kptr_restrict::kptr_restrict;
use kube_api::kube_api;
use lb_probe::lb_probe;
use mode_leftover::mode_leftover;
use nic_source_validation::nic_source_validation;
use proxy_protocol::proxy_protocol;
use service_self_loop::service_self_loop;
use source_ranges::source_ranges;
use vip_port_unserved::vip_port_unserved;

/// The rules, in the order their findings are listed.
const RULES: [fn(&Inputs) -> Vec<Finding>; 14] = [
    healthcheck_blackhole,
    vip_port_unserved,
    hairpin,
    service_self_loop,
    etp_local_drop,
    proxy_protocol,
    source_ranges,
    lb_probe,
    nic_source_validation,
    kptr_restrict,
    kernel_visibility,
    kube_api,
    dataplane,
    mode_leftover,
];

/// Every finding for these inputs.
pub fn judge(inp: &Inputs) -> Vec<Finding> {
    RULES.iter().flat_map(|rule| rule(inp)).collect()
}
