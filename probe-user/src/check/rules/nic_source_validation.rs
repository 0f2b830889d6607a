//! The sysctls that decide whether a looping packet is dropped or answered, per NIC.

use probe_contract::check::{Finding, Kind, Severity};

use crate::check::Inputs;

/// The sysctls that decide whether a looping packet is dropped or answered, per NIC.
pub fn nic_source_validation(inp: &Inputs) -> Vec<Finding> {
    inp.nics
        .iter()
        .map(|n| {
            let rp = match n.rp_filter {
                0 => "off",
                1 => "strict",
                _ => "loose",
            };
            let hairpin = if n.rp_filter == 1 {
                "a looped pod packet is dropped (IP_RPFILTER)"
            } else {
                "a looped pod packet is answered directly, bypassing the LB (the pod resets it)"
            };
            let local = if n.accept_local {
                "a packet from a local address is accepted (its answer stays on the node)"
            } else {
                "a packet from a local address is dropped (martian source)"
            };
            Finding {
                kind: Kind::NicSourceValidation,
                severity: Severity::Info,
                subject: n.name.clone(),
                summary: format!(
                    "rp_filter={} ({rp}) accept_local={} route_localnet={} log_martians={}",
                    n.rp_filter,
                    u8::from(n.accept_local),
                    u8::from(n.route_localnet),
                    u8::from(n.log_martians)
                ),
                evidence: vec![
                    local.into(),
                    hairpin.into(),
                    if n.route_localnet {
                        "route_localnet=1: 127/8 sources and destinations are routed on this NIC"
                            .into()
                    } else {
                        "route_localnet=0: 127/8 on this NIC is dropped".into()
                    },
                ],
                remedy: Vec::new(),
                fixes: Vec::new(),
            }
        })
        .collect()
}
