//! Failure 3: an LB ingress IP bound locally answers in-cluster calls only on the ports a
//! service serves. A risk when a port the Service declares (API, kube-proxy's sets) or every
//! port is unserved; a warning otherwise (the LB's other listeners are not visible here).

use std::net::IpAddr;

use probe_contract::{
    Proto,
    check::{Finding, Kind, Severity},
};

use super::targets::{bound_lb_ips, named, targets_of};
use crate::{
    check::{Inputs, LbTarget},
    correlate::remedy,
};

fn port_list(ports: &[(u16, Proto)]) -> String {
    ports
        .iter()
        .map(|(p, proto)| format!("{p}/{}", proto.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Failure 3: an LB ingress IP bound locally answers in-cluster calls only on the ports a
/// service serves. A risk when a port the Service declares (API, kube-proxy's sets) or every
/// port is unserved; a warning otherwise (the LB's other listeners are not visible here).
pub fn vip_port_unserved(inp: &Inputs) -> Vec<Finding> {
    bound_lb_ips(inp)
        .into_iter()
        .map(|ip| bound_ip_finding(inp, ip))
        .collect()
}

/// The finding of one LB IP bound on this node.
fn bound_ip_finding(inp: &Inputs, ip: IpAddr) -> Finding {
    let targets = targets_of(inp, ip);
    let served = served_ports(inp, ip);
    let mut unserved: Vec<(u16, Proto)> = targets
        .iter()
        .filter_map(|t| Some((t.port?, t.proto)))
        .filter(|pp| !served.contains(pp))
        .collect();
    unserved.sort_by_key(|(p, proto)| (*p, proto.as_str()));
    unserved.dedup();
    let source = inp.services.source.map_or("service table", |s| match s {
        crate::state::ServiceSource::Ipvs => "IPVS",
        crate::state::ServiceSource::Iptables => "iptables",
        crate::state::ServiceSource::Nftables => "nftables",
    });
    let mut evidence = vec![if served.is_empty() {
        format!("{source}: no service for {ip} on any port")
    } else {
        format!("{source}: {ip} served on {} only", port_list(&served))
    }];
    let filtered = !inp.services.access_filter.is_empty();
    if filtered {
        evidence.push(
            "KUBE-IPVS-FILTER present: calls to other ports are REJECTed \
             (NETFILTER_DROP, connection refused)"
                .into(),
        );
    }
    let Verdict {
        severity,
        summary,
        port,
        proto,
    } = verdict(ip, &targets, &served, &unserved, &mut evidence);
    let svc = named(&targets);
    let owner = (!svc.is_empty()).then_some(svc.as_str());
    let mut remedy =
        remedy::vip_port_unserved(ip, port, proto, owner, filtered, inp.owners.get(&ip));
    remedy.remove(0);
    if port == 0 {
        // No single port to name: keep the general options.
        remedy.remove(0);
    }
    // Without kube-proxy the ports served (in eBPF, by its replacement) are unknown:
    // a refusal can still happen, but is not proven from an empty table.
    let (severity, summary) = match inp.dataplane.as_ref() {
        Some(d) if d.mode == probe_contract::check::Mode::None => {
            evidence.push(format!(
                "no kube-proxy ({}): the ports its replacement serves are not in any \
                 rule the probe reads",
                d.name()
            ));
            (
                Severity::Warn,
                format!(
                    "LB IP {ip} is bound locally: in-cluster calls to a port {} does \
                     not serve are refused (which ports it serves: not readable)",
                    d.replacement.map_or("the dataplane", |r| r.as_str())
                ),
            )
        }
        _ => (severity, summary),
    };
    Finding {
        kind: Kind::VipPortUnserved,
        severity,
        subject: ip.to_string(),
        summary,
        evidence,
        remedy,
        fixes: Vec::new(),
    }
}

/// The ports the service table serves on `ip`, sorted.
fn served_ports(inp: &Inputs, ip: IpAddr) -> Vec<(u16, Proto)> {
    let mut served: Vec<(u16, Proto)> = inp
        .services
        .services
        .iter()
        .filter(|s| s.vip == ip)
        .map(|s| (s.port, s.proto))
        .collect();
    served.sort_by_key(|(p, proto)| (*p, proto.as_str()));
    served.dedup();
    served
}

/// How sure the refusal is, and the port the remedy names (0: none).
struct Verdict {
    severity: Severity,
    summary: String,
    port: u16,
    proto: Proto,
}

/// A risk when a declared port (or every port) is unserved; a warning otherwise.
fn verdict(
    ip: IpAddr,
    targets: &[&LbTarget],
    served: &[(u16, Proto)],
    unserved: &[(u16, Proto)],
    evidence: &mut Vec<String>,
) -> Verdict {
    if let Some((p, proto)) = unserved.first() {
        evidence.push(format!(
            "declared but unserved: {} (per {})",
            port_list(unserved),
            targets
                .iter()
                .map(|t| t.source.as_str())
                .next()
                .unwrap_or("kube-proxy")
        ));
        Verdict {
            severity: Severity::Risk,
            summary: format!(
                "LB IP {ip} is bound locally but {} is not served: in-cluster calls are refused",
                port_list(unserved)
            ),
            port: *p,
            proto: *proto,
        }
    } else if served.is_empty() {
        Verdict {
            severity: Severity::Risk,
            summary: format!(
                "LB IP {ip} is bound locally and no port of it is served: every in-cluster call is refused"
            ),
            port: 0,
            proto: Proto::Tcp,
        }
    } else {
        Verdict {
            severity: Severity::Warn,
            summary: format!(
                "LB IP {ip} is bound locally: in-cluster calls to ports other than {} are refused",
                port_list(served)
            ),
            port: 0,
            proto: Proto::Tcp,
        }
    }
}
