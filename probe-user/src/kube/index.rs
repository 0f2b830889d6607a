//! The address -> name index (pure): built from the reflectors' Pods, Services and
//! EndpointSlices, read by the enrichment of confirmed events and by `probe check`.
//!
//! Look-ups: a pod by any of its IPs; a Service by a frontend (ClusterIP, external IP or LB
//! ingress IP, plus port and protocol), by a NodePort or healthCheckNodePort, or by an LB
//! ingress IP alone. Services carry the facts remedies need.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};

use probe_contract::Proto;

/// Annotations that change how a provider's LB loops back (shown in remedies when set).
pub const LOOPBACK_ANNOTATIONS: [&str; 5] = [
    // Tencent TKE: health checks from 100.64/10 and the VIP bound for in-cluster calls.
    "service.cloud.tencent.com/prevent-loopback",
    // Alibaba ACK: publish the LB as a hostname, so kube-proxy does not bind its IP (the
    // legacy `alicloud` spelling is still read by the CCM).
    "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname",
    "service.beta.kubernetes.io/alicloud-loadbalancer-hostname",
    // Hetzner: keep the private LB IP out of the status (IPVS health checks).
    "load-balancer.hetzner.cloud/disable-private-ingress",
    // OpenStack: publish the LB as a hostname.
    "loadbalancer.openstack.org/hostname",
];

/// The [`LOOPBACK_ANNOTATIONS`] that guard against the loop itself (risks downgraded when
/// on): only Tencent's, which keeps in-cluster calls on the node and moves the CLB's health
/// checks off its VIP. A hostname annotation is no guard: it removes kube-proxy's
/// short-circuit, so calls to the LB leave the node and can hairpin (reference 003).
pub const LOOP_GUARD_ANNOTATIONS: [&str; 1] = ["service.cloud.tencent.com/prevent-loopback"];

/// The loop guards of `annotations` that are switched on.
pub fn loop_guards(annotations: &BTreeMap<String, String>) -> Vec<String> {
    annotations
        .iter()
        .filter(|(k, v)| {
            LOOP_GUARD_ANNOTATIONS.contains(&k.as_str()) && v.trim().eq_ignore_ascii_case("true")
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// A pod, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
}

impl PodRef {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Option<String>,
    /// `TCP`, `UDP`, `SCTP`.
    pub protocol: String,
    pub port: u16,
    pub node_port: Option<u16>,
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbIngress {
    pub ip: Option<IpAddr>,
    pub hostname: Option<String>,
    /// `VIP` (kube-proxy binds the IP on the node) or `Proxy` (it does not); None = unset
    /// (VIP behaviour).
    pub ip_mode: Option<String>,
}

/// A Service and the settings its remedies depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFacts {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid` (an Event's `regarding` names the object by it).
    pub uid: Option<String>,
    /// `ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalName`.
    pub service_type: String,
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    pub ingress: Vec<LbIngress>,
    pub ports: Vec<ServicePort>,
    /// `Cluster` or `Local` (None when unset: Cluster).
    pub external_traffic_policy: Option<String>,
    pub health_check_node_port: Option<u16>,
    /// The [`LOOPBACK_ANNOTATIONS`] that are set, with their values (bounded in the agent's
    /// [`Index`], like `annotations`).
    pub loopback_annotations: BTreeMap<String, String>,
    /// Ready endpoint addresses from the Service's EndpointSlices.
    pub endpoints: Vec<IpAddr>,
    /// `spec.loadBalancerClass` (which controller runs the LB), when set.
    pub load_balancer_class: Option<String>,
    /// The LB controllers' annotations ([`crate::fixes::provider::ANNOTATION_PREFIXES`]):
    /// the provider fixes read them and never offer one already set. No other annotation is
    /// kept (a tenant's own, kubectl's last-applied copy): nothing reads them, and each would
    /// be held for the life of the Service. In the agent's [`Index`] every value is bounded
    /// ([`bounded`]).
    pub annotations: BTreeMap<String, String>,
    /// `metadata.resourceVersion`: `kubectl clb-probe fix --apply` refuses a fix computed
    /// from another version.
    pub resource_version: Option<String>,
}

impl ServiceFacts {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The cluster DNS name (assumes the default `cluster.local` domain).
    pub fn dns_name(&self) -> String {
        format!("{}.{}.svc.cluster.local", self.name, self.namespace)
    }

    pub fn is_etp_local(&self) -> bool {
        self.external_traffic_policy.as_deref() == Some("Local")
    }

    /// The port serving `port`/`proto` on any frontend, or whose NodePort is `port`.
    pub fn port(&self, port: u16, proto: Proto) -> Option<&ServicePort> {
        self.ports
            .iter()
            .find(|p| p.port == port && same_proto(&p.protocol, proto))
    }

    pub fn port_by_node_port(&self, node_port: u16, proto: Proto) -> Option<&ServicePort> {
        self.ports
            .iter()
            .find(|p| p.node_port == Some(node_port) && same_proto(&p.protocol, proto))
    }

    /// The ipMode of the ingress entry with `ip`.
    pub fn ip_mode(&self, ip: IpAddr) -> Option<&str> {
        self.ingress
            .iter()
            .find(|i| i.ip == Some(ip))
            .and_then(|i| i.ip_mode.as_deref())
    }
}

fn same_proto(protocol: &str, proto: Proto) -> bool {
    protocol.eq_ignore_ascii_case(proto.as_str())
}

fn proto_key(protocol: &str) -> String {
    protocol.to_ascii_uppercase()
}

/// The snapshot the enrichment reads. Cheap to share (`Arc`); rebuilt on every change.
#[derive(Clone, Debug, Default)]
pub struct Index {
    /// Built after every watched resource completed its first list (the watcher sets it):
    /// before that, a missing name may only be not listed yet.
    pub synced: bool,
    pods: HashMap<IpAddr, PodRef>,
    services: Vec<Arc<ServiceFacts>>,
    /// (frontend IP, port, protocol) -> service.
    frontends: HashMap<(IpAddr, u16, String), usize>,
    /// (NodePort or healthCheckNodePort, protocol) -> service; health checks use TCP.
    node_ports: HashMap<(u16, String), usize>,
    /// LB ingress / external IP -> services (one IP can front several Services, by port).
    lb_ips: HashMap<IpAddr, Vec<usize>>,
    /// (port, protocol) -> the host-network pod that declares it: a container port, or the
    /// numeric port of a probe (kubeadm's static API server declares no ports, only probes).
    host_ports: HashMap<(u16, String), PodRef>,
}

impl Index {
    /// Builds the index. Pods without an IP and host-network pods (their IP is the node's)
    /// are left out: an address names a pod only when it is the pod's own.
    pub fn build<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Index {
        let mut index = Index::default();
        for pod in pods {
            let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name)
            else {
                continue;
            };
            if !is_api_name(namespace) || !is_api_name(name) {
                continue;
            }
            let spec = pod.spec.as_ref();
            if spec.and_then(|s| s.host_network).unwrap_or(false) {
                let pod_ref = PodRef {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    node: spec.and_then(|s| s.node_name.clone()),
                };
                for key in spec.into_iter().flat_map(host_ports) {
                    index
                        .host_ports
                        .entry(key)
                        .or_insert_with(|| pod_ref.clone());
                }
                continue;
            }
            let Some(status) = &pod.status else { continue };
            let ips = status
                .pod_ips
                .iter()
                .flatten()
                .map(|p| p.ip.as_str())
                .chain(status.pod_ip.as_deref());
            let pod_ref = PodRef {
                namespace: namespace.clone(),
                name: name.clone(),
                node: spec.and_then(|s| s.node_name.clone()),
            };
            for ip in ips.filter_map(|ip| ip.parse().ok()) {
                index.pods.insert(ip, pod_ref.clone());
            }
        }
        let mut endpoints: HashMap<(String, String), Vec<IpAddr>> = HashMap::new();
        for slice in slices {
            let (Some(namespace), Some(service)) = (
                &slice.metadata.namespace,
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name")),
            ) else {
                continue;
            };
            let ready = slice
                .endpoints
                .iter()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .flat_map(|e| e.addresses.iter())
                .filter_map(|a| a.parse::<IpAddr>().ok());
            endpoints
                .entry((namespace.clone(), service.clone()))
                .or_default()
                .extend(ready);
        }
        let mut list: Vec<ServiceFacts> = services
            .into_iter()
            .filter_map(|s| facts(s, &mut endpoints))
            .filter(|s| is_api_name(&s.namespace) && is_api_name(&s.name))
            .map(bounded)
            .collect();
        list.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        for (i, service) in list.iter().enumerate() {
            let lb_ips: Vec<IpAddr> = service
                .ingress
                .iter()
                .filter_map(|i| i.ip)
                .chain(service.external_ips.iter().copied())
                .collect();
            for ip in &lb_ips {
                let at = index.lb_ips.entry(*ip).or_default();
                if !at.contains(&i) {
                    at.push(i);
                }
            }
            for port in &service.ports {
                let proto = proto_key(&port.protocol);
                for ip in service.cluster_ips.iter().chain(&lb_ips) {
                    index
                        .frontends
                        .entry((*ip, port.port, proto.clone()))
                        .or_insert(i);
                }
                if let Some(node_port) = port.node_port {
                    index.node_ports.entry((node_port, proto)).or_insert(i);
                }
            }
            if let Some(hc) = service.health_check_node_port {
                index.node_ports.entry((hc, "TCP".into())).or_insert(i);
            }
        }
        index.services = list.into_iter().map(Arc::new).collect();
        index
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn services(&self) -> impl Iterator<Item = &ServiceFacts> {
        self.services.iter().map(|s| &**s)
    }

    /// The pod whose own address is `ip`.
    pub fn pod_by_ip(&self, ip: IpAddr) -> Option<&PodRef> {
        self.pods.get(&ip)
    }

    /// The host-network pod on node `node` (any node when unknown) that declares
    /// `port`/`proto`: the owner of a host listener.
    pub fn host_network_pod(&self, port: u16, proto: Proto, node: Option<&str>) -> Option<&PodRef> {
        self.host_ports
            .get(&(port, proto_key(proto.as_str())))
            .filter(|p| node.is_none() || p.node.is_none() || p.node.as_deref() == node)
    }

    /// The Service serving `ip:port/proto` (a ClusterIP, external IP or LB ingress IP).
    pub fn service_by_frontend(
        &self,
        ip: IpAddr,
        port: u16,
        proto: Proto,
    ) -> Option<&ServiceFacts> {
        let i = self.frontends.get(&(ip, port, proto_key(proto.as_str())))?;
        Some(&self.services[*i])
    }

    /// The Service with NodePort (or healthCheckNodePort) `port`.
    pub fn service_by_node_port(&self, port: u16, proto: Proto) -> Option<&ServiceFacts> {
        let i = self.node_ports.get(&(port, proto_key(proto.as_str())))?;
        Some(&self.services[*i])
    }

    /// The Services with LB ingress or external IP `ip` (any port), sorted by name.
    pub fn services_by_lb_ip(&self, ip: IpAddr) -> Vec<&ServiceFacts> {
        self.lb_ips
            .get(&ip)
            .map(|at| at.iter().map(|i| &*self.services[*i]).collect())
            .unwrap_or_default()
    }
}

/// The (port, protocol) keys a host-network pod's spec declares: container ports (on the host
/// network the container port is the host port) and the numeric ports of its TCP and HTTP
/// probes.
fn host_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<(u16, String)> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let mut out = Vec::new();
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            let port = p.host_port.unwrap_or(p.container_port);
            if let Ok(port) = u16::try_from(port) {
                out.push((port, proto_key(p.protocol.as_deref().unwrap_or("TCP"))));
            }
        }
        for probe in [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]
            .into_iter()
            .flatten()
        {
            let ports = [
                probe.http_get.as_ref().map(|h| &h.port),
                probe.tcp_socket.as_ref().map(|t| &t.port),
            ];
            for port in ports.into_iter().flatten() {
                if let IntOrString::Int(n) = port
                    && let Ok(n) = u16::try_from(*n)
                {
                    out.push((n, "TCP".to_string()));
                }
            }
        }
    }
    out
}

impl ServiceFacts {
    /// The facts of one API Service, without endpoints (`probe check` lists Services once and
    /// needs no EndpointSlices); None without a namespace or name.
    pub fn from_service(service: &Service) -> Option<ServiceFacts> {
        facts(service, &mut HashMap::new())
    }
}

/// An LB controller's annotation (the only ones the fixes and remedies read).
fn is_provider_annotation(key: &str) -> bool {
    crate::fixes::provider::ANNOTATION_PREFIXES
        .iter()
        .any(|(prefix, _)| key.starts_with(prefix))
}

/// `service` with every annotation value escaped and cut to
/// [`crate::untrusted::ANNOTATION_VALUE_MAX`] bytes: the agent's index, whose values are
/// copied into every event of the Service's LB IP (the evidence's settings, the facts, the
/// fixes' undo) and on into the report and the Event. A tenant writes what it likes there
/// (up to the API's 256 KiB); the real settings are short. [`ServiceFacts::from_service`]
/// (the plugin, one Service per command) keeps them whole: its fixes patch the Service with
/// them (an AWS attribute list is rewritten whole).
///
/// The Service's other free strings (port names, LB hostnames, ipMode, class, uid) are
/// validated by a real API server; from a faulty one or a proxy they are escaped and bounded
/// to [`API_FIELD_MAX`] bytes like the rest.
fn bounded(mut service: ServiceFacts) -> ServiceFacts {
    use crate::untrusted::{ANNOTATION_VALUE_MAX, text};
    let bound = |map: &mut BTreeMap<String, String>| {
        for value in map.values_mut() {
            *value = text(value, ANNOTATION_VALUE_MAX);
        }
    };
    bound(&mut service.annotations);
    bound(&mut service.loopback_annotations);
    // The fixes copy the map for each event they are computed for: a tenant's hundreds of
    // provider-prefixed keys are cut to the first ANNOTATIONS_MAX (a real Service sets a
    // few dozen at most), the loopback annotations always kept.
    if service.annotations.len() > ANNOTATIONS_MAX {
        let keep: Vec<String> = service
            .annotations
            .keys()
            .filter(|k| LOOPBACK_ANNOTATIONS.contains(&k.as_str()))
            .chain(service.annotations.keys().take(ANNOTATIONS_MAX))
            .cloned()
            .collect();
        service.annotations.retain(|k, _| keep.contains(k));
    }
    let field = |s: &mut String| *s = text(s, API_FIELD_MAX);
    for port in &mut service.ports {
        port.name.as_mut().map(field);
        field(&mut port.protocol);
    }
    for ingress in &mut service.ingress {
        ingress.hostname.as_mut().map(field);
        ingress.ip_mode.as_mut().map(field);
    }
    service.uid.as_mut().map(field);
    service.load_balancer_class.as_mut().map(field);
    service.external_traffic_policy.as_mut().map(field);
    field(&mut service.service_type);
    service
}

/// The provider annotations the agent's index keeps of one Service (see [`bounded`]).
const ANNOTATIONS_MAX: usize = 64;

/// The longest name the API server accepts (a DNS-1123 subdomain), the bound of the other
/// strings of an API object the index keeps.
const API_FIELD_MAX: usize = 253;

/// A namespace or object name as the API server accepts it (a DNS-1123 subdomain: at most
/// 253 bytes of lowercase letters, digits, `-` and `.`). Anything else came from a faulty API
/// or a proxy and names nothing: its object is left out of the index (never printed).
fn is_api_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= API_FIELD_MAX
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn facts(
    service: &Service,
    endpoints: &mut HashMap<(String, String), Vec<IpAddr>>,
) -> Option<ServiceFacts> {
    let namespace = service.metadata.namespace.clone()?;
    let name = service.metadata.name.clone()?;
    let spec = service.spec.clone().unwrap_or_default();
    let ips = |list: Option<Vec<String>>| -> Vec<IpAddr> {
        list.into_iter()
            .flatten()
            .filter_map(|ip| ip.parse().ok())
            .collect()
    };
    let mut cluster_ips = ips(spec.cluster_ips);
    if let Some(ip) = spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok())
        && !cluster_ips.contains(&ip)
    {
        cluster_ips.push(ip);
    }
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .map(|i| LbIngress {
            ip: i.ip.as_deref().and_then(|ip| ip.parse().ok()),
            hostname: i.hostname.clone(),
            ip_mode: i.ip_mode.clone(),
        })
        .collect();
    let ports = spec
        .ports
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some(ServicePort {
                name: p.name,
                protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
                port: u16::try_from(p.port).ok()?,
                node_port: p.node_port.and_then(|n| u16::try_from(n).ok()),
            })
        })
        .collect();
    let loopback_annotations = service
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| LOOPBACK_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(ServiceFacts {
        endpoints: endpoints
            .remove(&(namespace.clone(), name.clone()))
            .unwrap_or_default(),
        uid: service.metadata.uid.clone(),
        namespace,
        name,
        service_type: spec.type_.unwrap_or_else(|| "ClusterIP".into()),
        cluster_ips,
        external_ips: ips(spec.external_ips),
        ingress,
        ports,
        external_traffic_policy: spec.external_traffic_policy,
        health_check_node_port: spec
            .health_check_node_port
            .and_then(|n| u16::try_from(n).ok()),
        loopback_annotations,
        load_balancer_class: spec.load_balancer_class,
        annotations: service
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| is_provider_annotation(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        resource_version: service.metadata.resource_version.clone(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    pub(crate) fn pod(ns: &str, name: &str, ips: &[&str]) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"nodeName": "node-1", "containers": []},
            "status": {"podIP": ips[0], "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    pub(crate) fn web_service(etp: &str) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "web", "uid": "uid-web",
                "annotations": {"service.cloud.tencent.com/prevent-loopback": "true", "other": "x"}},
            "spec": {
                "type": "LoadBalancer",
                "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}],
                "externalTrafficPolicy": etp,
                "healthCheckNodePort": if etp == "Local" { json!(32000) } else { json!(null) },
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10", "ipMode": "VIP"}]}},
        }))
        .unwrap()
    }

    fn slice() -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.5"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.6"], "conditions": {"ready": false}},
            ],
        }))
        .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn pods_by_every_ip_and_services_by_frontend_node_port_and_lb_ip() {
        let pods = [pod("shop", "client-1", &["10.0.0.9", "fd00::9"])];
        let services = [web_service("Local")];
        let index = Index::build(&pods, &services, &[slice()]);
        assert_eq!(
            index.pod_by_ip(ip("10.0.0.9")).unwrap().key(),
            "shop/client-1"
        );
        assert_eq!(index.pod_by_ip(ip("fd00::9")).unwrap().name, "client-1");
        assert!(index.pod_by_ip(ip("10.0.0.10")).is_none());

        let web = index
            .service_by_frontend(ip("203.0.113.10"), 80, Proto::Tcp)
            .unwrap();
        assert_eq!(web.key(), "shop/web");
        assert_eq!(web.dns_name(), "web.shop.svc.cluster.local");
        assert!(web.is_etp_local());
        assert_eq!(web.health_check_node_port, Some(32000));
        assert_eq!(web.ip_mode(ip("203.0.113.10")), Some("VIP"));
        assert_eq!(
            web.loopback_annotations.keys().collect::<Vec<_>>(),
            ["service.cloud.tencent.com/prevent-loopback"]
        );
        assert_eq!(web.endpoints, [ip("10.0.0.5")]);
        assert!(
            index
                .service_by_frontend(ip("10.96.0.10"), 80, Proto::Tcp)
                .is_some()
        );
        assert!(
            index
                .service_by_frontend(ip("203.0.113.10"), 80, Proto::Udp)
                .is_none()
        );
        assert!(
            index
                .service_by_frontend(ip("203.0.113.10"), 443, Proto::Tcp)
                .is_none()
        );
        assert_eq!(
            index.service_by_node_port(30080, Proto::Tcp).unwrap().name,
            "web"
        );
        assert_eq!(
            index.service_by_node_port(32000, Proto::Tcp).unwrap().name,
            "web"
        );
        assert!(index.service_by_node_port(30080, Proto::Udp).is_none());
        assert_eq!(index.services_by_lb_ip(ip("203.0.113.10")).len(), 1);
        assert!(index.services_by_lb_ip(ip("203.0.113.11")).is_empty());
    }

    /// E2: a tenant's 250 KB values: the agent's index keeps only the LB controllers'
    /// annotations, each value escaped and cut to the cap with a marker; the plugin's reading
    /// of one Service keeps the value whole (its fixes patch with it).
    #[test]
    fn a_tenant_s_annotations_are_kept_only_when_read_and_bounded() {
        let mut service = web_service("Cluster");
        let annotations = service.metadata.annotations.as_mut().unwrap();
        annotations.insert(
            "service.cloud.tencent.com/prevent-loopback".into(),
            "x".repeat(250_000),
        );
        annotations.insert("tenant.example.com/blob".into(), "y".repeat(250_000));
        annotations.insert(
            "service.beta.kubernetes.io/aws-load-balancer-name".into(),
            "\x1b[2Jlb\u{202e}".into(),
        );
        let index = Index::build(&[], std::slice::from_ref(&service), &[]);
        let web = index.services().next().unwrap();
        assert_eq!(
            web.annotations.keys().collect::<Vec<_>>(),
            [
                "service.beta.kubernetes.io/aws-load-balancer-name",
                "service.cloud.tencent.com/prevent-loopback"
            ],
            "only the LB controllers' annotations"
        );
        for map in [&web.annotations, &web.loopback_annotations] {
            let guard = &map["service.cloud.tencent.com/prevent-loopback"];
            assert!(
                guard.len() <= crate::untrusted::ANNOTATION_VALUE_MAX,
                "{}",
                guard.len()
            );
            assert!(guard.ends_with("…[cut from 250000 bytes]"), "{guard}");
        }
        assert_eq!(
            web.annotations["service.beta.kubernetes.io/aws-load-balancer-name"],
            "\\x1b[2Jlb\\u{202e}"
        );
        let whole = ServiceFacts::from_service(&service).unwrap();
        assert_eq!(
            whole.annotations["service.cloud.tencent.com/prevent-loopback"].len(),
            250_000
        );
        assert!(!whole.annotations.contains_key("tenant.example.com/blob"));

        // Hundreds of provider-prefixed keys: the first 64 kept, the loop guard too.
        let annotations = service.metadata.annotations.as_mut().unwrap();
        for i in 0..500 {
            annotations.insert(
                format!("service.beta.kubernetes.io/aws-load-balancer-x{i:03}"),
                "v".into(),
            );
        }
        let index = Index::build(&[], &[service], &[]);
        let web = index.services().next().unwrap();
        assert_eq!(web.annotations.len(), ANNOTATIONS_MAX + 1);
        assert!(
            web.annotations
                .contains_key("service.cloud.tencent.com/prevent-loopback")
        );
    }

    /// A faulty API (or a proxy) sends names no API server accepts and free strings with
    /// terminal controls: such a pod or Service names nothing, the strings are escaped.
    #[test]
    fn names_the_api_would_refuse_name_nothing_and_free_strings_are_escaped() {
        let bad_pod = pod("shop", "\x1b[2Jclient", &["10.0.0.8"]);
        let mut long = web_service("Cluster");
        long.metadata.name = Some("w".repeat(300));
        let mut odd = web_service("Cluster");
        odd.metadata.namespace = Some("other".into());
        odd.status = Some(
            serde_json::from_value(json!({"loadBalancer": {"ingress": [
                {"ip": "203.0.113.20", "hostname": "lb\u{9b}2J.example", "ipMode": "VIP"}
            ]}}))
            .unwrap(),
        );
        let index = Index::build(&[bad_pod], &[long, odd], &[]);
        assert!(index.pod_by_ip(ip("10.0.0.8")).is_none());
        let names: Vec<String> = index.services().map(ServiceFacts::key).collect();
        assert_eq!(names, ["other/web"]);
        let other = index.services().next().unwrap();
        assert_eq!(
            other.ingress[0].hostname.as_deref(),
            Some("lb\\u{9b}2J.example")
        );
    }

    #[test]
    fn host_network_pods_and_pods_without_ip_name_nothing() {
        let mut host: Pod = pod("kube-system", "kube-proxy-x", &["198.18.0.2"]);
        host.spec.as_mut().unwrap().host_network = Some(true);
        let mut pending = pod("shop", "pending", &["10.0.0.1"]);
        pending.status = None;
        let index = Index::build(&[host, pending], &[], &[]);
        assert_eq!(index.pod_count(), 0);
    }
}
