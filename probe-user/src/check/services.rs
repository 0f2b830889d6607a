//! The Service side of `probe check`: what the Kubernetes API says about LoadBalancer
//! Services, as plain data the rules judge. Filled from the API's Service objects (kube-attr's
//! Service index, when API access exists); the conversion to [`LbTarget`]s is pure.

use std::{collections::BTreeMap, net::IpAddr};

use super::LbTarget;
use crate::event::Proto;

/// Provider annotations that keep an LB from looping back to the node (TKE's prevent-loopback;
/// Alibaba's hostname annotation publishes a hostname, so kube-proxy binds no IP).
pub const PREVENT_LOOPBACK_ANNOTATIONS: &[&str] = &[
    "service.cloud.tencent.com/prevent-loopback",
    "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname",
];

/// One Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub port: u16,
    pub proto: Proto,
    pub node_port: Option<u16>,
}

/// One LoadBalancer ingress of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbIngress {
    pub ip: IpAddr,
    /// `status.loadBalancer.ingress[].ipMode` (`VIP` or `Proxy`), when set.
    pub ip_mode: Option<String>,
}

/// What the rules need of one Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceFacts {
    /// `namespace/name`.
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub ingress: Vec<LbIngress>,
    pub ports: Vec<ServicePort>,
    /// `spec.externalTrafficPolicy: Local`.
    pub etp_local: bool,
    pub health_check_node_port: Option<u16>,
    pub annotations: BTreeMap<String, String>,
}

/// The LB targets (one per ingress IP and port) and ClusterIPs of these Services.
pub fn targets(services: &[ServiceFacts]) -> (Vec<LbTarget>, Vec<IpAddr>) {
    let mut targets = Vec::new();
    let mut cluster_ips = Vec::new();
    for s in services {
        cluster_ips.extend(s.cluster_ips.iter().copied());
        let guard: Vec<String> = PREVENT_LOOPBACK_ANNOTATIONS
            .iter()
            .filter(|a| {
                s.annotations
                    .get(**a)
                    .is_some_and(|v| !v.is_empty() && v != "false")
            })
            .map(|a| a.to_string())
            .collect();
        for ing in &s.ingress {
            for p in &s.ports {
                targets.push(LbTarget {
                    ip: ing.ip,
                    port: Some(p.port),
                    proto: p.proto,
                    service: Some(s.name.clone()),
                    etp_local: Some(s.etp_local),
                    ip_mode_proxy: ing.ip_mode.as_deref() == Some("Proxy"),
                    health_check_node_port: s.health_check_node_port,
                    prevent_loopback: guard.clone(),
                    // kube-proxy (iptables / IPVS) marks pod traffic to a Cluster-policy LB IP
                    // it handles; with ipMode Proxy it writes no rule for the IP at all.
                    kube_proxy_masquerades: !s.etp_local && ing.ip_mode.as_deref() != Some("Proxy"),
                    source: format!("service {}", s.name),
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
        .flat_map(|s| s.ingress.iter().map(|i| i.ip))
        .collect();
    lb_ips.sort();
    lb_ips.dedup();
    inputs.api = super::ApiState::Read {
        services: services.len(),
        lb_ips: lb_ips.len(),
    };
}

/// The facts of one API Service (pure). Services without LB ingress IPs still give their
/// ClusterIPs (which tell a bound ClusterIP from an LB IP on kube-ipvs0).
pub fn from_api(svc: &k8s_openapi::api::core::v1::Service) -> ServiceFacts {
    let meta = &svc.metadata;
    let name = format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("")
    );
    let spec = svc.spec.clone().unwrap_or_default();
    let ip = |s: &String| s.parse::<IpAddr>().ok();
    let mut cluster_ips: Vec<IpAddr> = spec.cluster_ips.iter().flatten().filter_map(ip).collect();
    cluster_ips.extend(spec.cluster_ip.iter().filter_map(ip));
    cluster_ips.sort();
    cluster_ips.dedup();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| {
            Some(LbIngress {
                ip: i.ip.as_ref().and_then(ip)?,
                ip_mode: i.ip_mode.clone(),
            })
        })
        .collect();
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(ServicePort {
                port: u16::try_from(p.port).ok()?,
                proto: match p.protocol.as_deref() {
                    None | Some("TCP") => Proto::Tcp,
                    Some("UDP") => Proto::Udp,
                    // SCTP: not a protocol the probe follows.
                    Some(_) => return None,
                },
                node_port: p.node_port.and_then(|n| u16::try_from(n).ok()),
            })
        })
        .collect();
    ServiceFacts {
        name,
        cluster_ips,
        ingress,
        ports,
        etp_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        health_check_node_port: spec
            .health_check_node_port
            .and_then(|n| u16::try_from(n).ok()),
        annotations: meta.annotations.clone().unwrap_or_default(),
    }
}
