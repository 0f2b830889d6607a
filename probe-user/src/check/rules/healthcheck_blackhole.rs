//! Failure 1: an LB ingress IP bound locally; the LB's health checks from it are discarded.

use std::net::IpAddr;

use probe_contract::check::{Finding, Kind, Severity};

use super::targets::{bound_lb_ips, named, prevent_loopback, targets_of, where_local};
use crate::{
    check::{Inputs, NicSysctls},
    correlate::remedy,
};

/// How a NIC treats a packet whose source is a local address (`fib_validate_source`).
fn local_source_verdict(nic: &NicSysctls, src: IpAddr) -> String {
    if nic.accept_local {
        format!(
            "{}: accept_local=1: a packet from {src} is accepted, and the answer goes to {src}, a \
             local address: it never leaves the node (the LB still sees no reply)",
            nic.name
        )
    } else {
        format!(
            "{}: accept_local=0: a packet from {src} is dropped as a martian (local) source \
             (IP_LOCAL_SOURCE; NOT_SPECIFIED at the route-input site before 6.x)",
            nic.name
        )
    }
}

/// Failure 1: an LB ingress IP bound locally; the LB's health checks from it are discarded.
pub fn healthcheck_blackhole(inp: &Inputs) -> Vec<Finding> {
    bound_lb_ips(inp)
        .into_iter()
        .map(|ip| {
            let targets = targets_of(inp, ip);
            let mut evidence = vec![format!(
                "{ip} is {} (a local address of this node)",
                where_local(inp, ip)
            )];
            let announcer = inp.owners.get(&ip).and_then(|o| o.announcer());
            if let Some(a) = announcer {
                evidence.push(format!("held by {}: {}", a.who(), a.why));
            }
            // An announcer's VIP that neither the API nor kube-proxy's rules name as a Service's
            // address may be a control-plane VIP (kube-vip `cp_enable`, keepalived in front of
            // the API servers) that no LB checks: a warning until something names it.
            let unnamed_announced = announcer.is_some()
                && targets.is_empty()
                && !inp.services.services.iter().any(|s| s.vip == ip);
            if unnamed_announced {
                evidence.push(
                    "named as a Service's address neither by the API nor by kube-proxy's rules: \
                     a control-plane VIP no LB checks is no risk"
                        .into(),
                );
            } else if targets.is_empty() {
                evidence.push(
                    "not named as a ClusterIP by kube-proxy's sets: taken for an LB ingress or \
                     external IP"
                        .into(),
                );
            } else {
                let mut sources: Vec<&str> = targets.iter().map(|t| t.source.as_str()).collect();
                sources.sort();
                sources.dedup();
                evidence.push(format!("LB ingress IP per {}", sources.join(", ")));
            }
            if targets.iter().any(|t| t.ip_mode_proxy) {
                evidence.push(
                    "ipMode: Proxy, yet bound: something other than kube-proxy binds it".into(),
                );
            }
            if let Some(port) = targets.iter().find_map(|t| t.health_check_node_port) {
                evidence.push(format!("the Service's healthCheckNodePort is {port}"));
            }
            evidence.extend(inp.nics.iter().map(|n| local_source_verdict(n, ip)));
            let guard = prevent_loopback(&targets);
            let severity = if guard.is_empty() && !unnamed_announced {
                Severity::Risk
            } else if unnamed_announced {
                Severity::Warn
            } else {
                evidence.push(format!(
                    "provider prevent-loopback annotation set ({}): the LB is expected to \
                     health-check from another source",
                    guard.join(", ")
                ));
                Severity::Warn
            };
            let node_port = targets
                .iter()
                .find_map(|t| t.health_check_node_port)
                .or_else(|| inp.services.nodeports.first().map(|n| n.port))
                .unwrap_or(0);
            let svc = named(&targets);
            Finding {
                kind: Kind::HealthcheckBlackhole,
                severity,
                subject: ip.to_string(),
                summary: format!(
                    "LB IP {ip}{} is {}: health checks from it never get an answer",
                    if svc.is_empty() {
                        String::new()
                    } else {
                        format!(" ({svc})")
                    },
                    where_local(inp, ip)
                ),
                evidence,
                // The remedies of the confirmed event, without its "Cause:" line (the finding
                // is a prediction, its cause is the evidence).
                remedy: remedy::healthcheck_blackhole(ip, node_port, inp.owners.get(&ip))
                    .into_iter()
                    .skip(1)
                    .collect(),
                fixes: Vec::new(),
            }
        })
        .collect()
}
