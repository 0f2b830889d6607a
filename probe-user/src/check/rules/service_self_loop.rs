//! `service_self_loop`'s risk: a pod of this node that calls its own Service cannot reach
//! itself. Its remedies are the confirmed event's (`remedy::build` over the same facts).

use std::net::IpAddr;

use probe_contract::{
    check::{Finding, Kind, Severity},
    facts::SelfLoopMissing,
};

use crate::{
    check::Inputs,
    correlate::remedy,
    state::{ServiceSource, ipset::loop_back_set},
};

/// `service_self_loop`: a local endpoint that cannot reach itself through its Service. IPVS
/// mode: an endpoint on a pod of this node without its `KUBE-LOOP-BACK` entry (kube-proxy 1.31
/// can drop them, kubernetes#134884). Every mode with br_netfilter on: bridge
/// ports without hairpin mode (the DNAT runs in the bridge, which will not send a frame back
/// out its port; in IPVS mode the reply is un-NATed in the bridge and dies the same way).
pub fn service_self_loop(inp: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    if inp.services.source == Some(ServiceSource::Ipvs) {
        out.extend(missing_loop_back_entries(inp));
    }
    let Some(source) = inp.services.source else {
        return out;
    };
    if inp.self_loop.br_netfilter != Some(true) {
        return out;
    }
    out.extend(ports_without_hairpin_mode(inp, source));
    out
}

/// IPVS mode: the endpoints on pods of this node whose `KUBE-LOOP-BACK` entry is missing.
fn missing_loop_back_entries(inp: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    let sl = &inp.self_loop;
    let mut seen = Vec::new();
    for s in &inp.services.services {
        for b in &s.backends {
            let Ok(ep) = b.parse::<std::net::SocketAddr>() else {
                continue;
            };
            let (ip, port) = (ep.ip(), ep.port());
            if !inp.pod_prefixes.iter().any(|p| p.contains(ip)) || seen.contains(&(ip, port)) {
                continue;
            }
            seen.push((ip, port));
            let entry = format!("{ip},{}:{port},{ip}", s.proto.as_str());
            let set = loop_back_set(ip.is_ipv6());
            let lacks = match &sl.loop_back {
                Some(members) if members.contains(&entry) => continue,
                Some(_) => format!("ipset {set} lacks {entry}"),
                // Unread (no `ipset` here) is no proof of a missing entry.
                None => continue,
            };
            out.push(Finding {
                kind: Kind::ServiceSelfLoop,
                severity: Severity::Risk,
                subject: format!("{ep}/{}", s.proto.as_str()),
                summary: format!(
                    "pod {ip} cannot reach itself through {}: {lacks}",
                    remedy::sock_of(s.vip, s.port)
                ),
                evidence: vec![
                    format!(
                        "IPVS: {ep} is a real server of {}/{}{}, and {ip} is a pod of this \
                         node",
                        remedy::sock_of(s.vip, s.port),
                        s.proto.as_str(),
                        s.service
                            .as_deref()
                            .map(|n| format!(" ({n})"))
                            .unwrap_or_default()
                    ),
                    format!(
                        "{lacks}: KUBE-POSTROUTING masquerades an endpoint's call to itself \
                         only through it"
                    ),
                ],
                // No Service setting fixes it (the fixes table has no entry for the kind).
                fixes: Vec::new(),
                // The confirmed event's remedy without its "Cause:" line.
                remedy: remedy::service_self_loop_risk(
                    ip,
                    port,
                    s.service.as_deref(),
                    SelfLoopMissing::HairpinSnat {
                        loop_back_entry: Some(false),
                    },
                    ServiceSource::Ipvs,
                ),
            });
        }
    }
    out
}

/// br_netfilter on: the bridge ports without hairpin mode, one finding per bridge.
fn ports_without_hairpin_mode(inp: &Inputs, source: ServiceSource) -> Vec<Finding> {
    let mut out = Vec::new();
    let sl = &inp.self_loop;
    let mut bridges: Vec<&str> = sl.bridge_ports.iter().map(|p| p.bridge.as_str()).collect();
    bridges.dedup();
    for br in bridges {
        let off: Vec<&str> = sl
            .bridge_ports
            .iter()
            .filter(|p| p.bridge == br && !p.hairpin_mode)
            .map(|p| p.port.as_str())
            .collect();
        if off.is_empty() {
            continue;
        }
        out.push(Finding {
            kind: Kind::ServiceSelfLoop,
            severity: Severity::Risk,
            subject: br.to_string(),
            summary: format!(
                "{} port(s) of {br} without hairpin mode: their pods cannot reach themselves \
                 through a Service",
                off.len()
            ),
            evidence: vec![
                format!(
                    "ports of {br} with hairpin_mode 0: {}",
                    off.iter().take(5).copied().collect::<Vec<_>>().join(", ")
                ),
                "br_netfilter: net.bridge.bridge-nf-call-iptables = 1: kube-proxy's DNAT runs \
                 while the frame is bridged, so a call DNATed back to its own pod must leave by \
                 the port it came in on"
                    .into(),
            ],
            fixes: Vec::new(),
            remedy: remedy::service_self_loop_risk(
                IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                0,
                None,
                SelfLoopMissing::HairpinMode {
                    bridge: br.to_string(),
                    port: if off.len() == 1 {
                        off[0].to_string()
                    } else {
                        "<port>".to_string()
                    },
                    br_netfilter: Some(true),
                },
                source,
            ),
        });
    }
    out
}
