//! The Service side of `probe check`: what the Kubernetes API says about LoadBalancer
//! Services, as the attribution index's [`ServiceFacts`] (one conversion from the API's
//! objects for the agent and the check); their conversion to [`LbTarget`]s is pure.

use std::net::IpAddr;

use probe_contract::Proto;
use probe_core::service::ServiceFacts;

use super::LbTarget;

/// A Service port's protocol as the probe follows it (SCTP: not followed).
fn proto(protocol: &str) -> Option<Proto> {
    match protocol.to_ascii_uppercase().as_str() {
        "TCP" => Some(Proto::Tcp),
        "UDP" => Some(Proto::Udp),
        _ => None,
    }
}

/// The LB targets (one per ingress IP and port) and ClusterIPs of these Services.
pub fn targets(services: &[ServiceFacts]) -> (Vec<LbTarget>, Vec<IpAddr>) {
    let mut targets = Vec::new();
    let mut cluster_ips = Vec::new();
    for s in services {
        cluster_ips.extend(s.cluster_ips.iter().copied());
        // The provider annotations that keep the LB from looping back, when switched on.
        let guard = probe_core::service::loop_guards(&s.loopback_annotations);
        let etp_local = s.is_etp_local();
        let proxy_protocol = probe_core::service::proxy_protocol(&s.annotations);
        for ing in &s.ingress {
            let Some(ip) = ing.ip else { continue };
            for p in &s.ports {
                let Some(proto) = proto(&p.protocol) else {
                    continue;
                };
                targets.push(LbTarget {
                    ip,
                    port: Some(p.port),
                    proto,
                    service: Some(s.key()),
                    etp_local: Some(etp_local),
                    ip_mode_proxy: ing.ip_mode.as_deref() == Some("Proxy"),
                    health_check_node_port: s.health_check_node_port,
                    prevent_loopback: guard.clone(),
                    // kube-proxy (iptables / IPVS) marks pod traffic to a Cluster-policy LB IP
                    // it handles; with ipMode Proxy it writes no rule for the IP at all.
                    kube_proxy_masquerades: !etp_local && ing.ip_mode.as_deref() != Some("Proxy"),
                    proxy_protocol: proxy_protocol.clone(),
                    source_ranges: s.load_balancer_source_ranges.to_vec(),
                    source: format!("service {}", s.key()),
                });
            }
        }
    }
    cluster_ips.sort();
    cluster_ips.dedup();
    (targets, cluster_ips)
}

/// Adds the API's view to the node's: API targets replace the ipset ones for the same
/// IP:port (they carry names and settings); ClusterIPs are merged.
pub fn merge(inputs: &mut super::Inputs, services: &[ServiceFacts]) {
    let (api, cluster_ips) = targets(services);
    inputs.lb_targets.retain(|t| {
        !api.iter()
            .any(|a| (a.ip, a.port, a.proto) == (t.ip, t.port, t.proto))
    });
    inputs.lb_targets.extend(api);
    inputs.cluster_ips.extend(cluster_ips);
    inputs.cluster_ips.sort();
    inputs.cluster_ips.dedup();
    let mut lb_ips: Vec<IpAddr> = services
        .iter()
        .flat_map(|s| s.ingress.iter().filter_map(|i| i.ip))
        .collect();
    lb_ips.sort();
    lb_ips.dedup();
    inputs.api = super::ApiState::Read {
        services: services.len(),
        lb_ips: lb_ips.len(),
    };
}

/// The API's service table for this node (`kube::service_table`), in the mode the dataplane's
/// table came from; None when the dataplane's table has no source (nothing to compare with).
/// The node is `NODE_NAME` (the DaemonSet sets it) or the host name (the kubelet's default
/// node name). IPVS mode's NodePort virtual services (one per node IP kube-proxy picks with
/// `--nodeport-addresses`) are left out: no node IPs are given.
pub fn api_table(
    inputs: &super::Inputs,
    services: &[k8s_openapi::api::core::v1::Service],
    slices: &[k8s_openapi::api::discovery::v1::EndpointSlice],
) -> Option<crate::kube::service_table::ApiServiceTable> {
    use crate::kube::service_table::{ApiServiceTable, NodeView, PrunedService, PrunedSlice};
    let mode = inputs.services.source?;
    let node_name = std::env::var("NODE_NAME").ok().or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_ascii_lowercase())
    });
    let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or("")
        )
    };
    let mut table = ApiServiceTable::new(NodeView {
        mode,
        node_name,
        node_ips: Vec::new(),
    });
    table.replace(
        services
            .iter()
            .filter_map(|s| Some((key(&s.metadata), PrunedService::from_api(s)?))),
        slices
            .iter()
            .filter_map(|s| Some((key(&s.metadata), PrunedSlice::from_api(s)?))),
    );
    Some(table)
}

/// What the API's table says kube-proxy should program and the dataplane's table lacks: the
/// frontends (`ns/name:port at ip:port/proto`) and, but in IPVS mode, the NodePorts
/// (`ns/name:port NodePort port/proto`); with the count of what was compared.
pub fn missing_from_dataplane(inputs: &super::Inputs) -> Option<(usize, Vec<String>)> {
    use crate::state::ServiceSource;
    let api = inputs.api_table.as_ref()?.expected();
    let have = &inputs.services;
    let name = |s: &Option<String>| s.clone().unwrap_or_default();
    let mut missing: Vec<String> = api
        .services
        .iter()
        .filter(|e| have.serves(e.vip, e.port, e.proto).is_none())
        .map(|e| {
            let at = std::net::SocketAddr::new(e.vip, e.port);
            format!("{} at {at}/{}", name(&e.service), e.proto.as_str())
        })
        .collect();
    let mut compared = api.services.len();
    if api.source != Some(ServiceSource::Ipvs) {
        compared += api.nodeports.len();
        missing.extend(
            api.nodeports
                .iter()
                .filter(|n| have.nodeport(n.port, n.proto).is_none())
                .map(|n| {
                    format!(
                        "{} NodePort {}/{}",
                        name(&n.service),
                        n.port,
                        n.proto.as_str()
                    )
                }),
        );
    }
    Some((compared, missing))
}
