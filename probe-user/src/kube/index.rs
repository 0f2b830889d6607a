//! The address -> name index (pure): built from the reflectors' Pods, Services and
//! EndpointSlices, read by the enrichment of confirmed events and by `probe check`.
//!
//! Look-ups: a pod by any of its IPs; a Service by a frontend (ClusterIP, external IP or LB
//! ingress IP, plus port and protocol), by a NodePort or healthCheckNodePort, or by an LB
//! ingress IP alone. Services carry the facts remedies need.

use std::{collections::HashMap, net::IpAddr, sync::Arc};

use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use probe_contract::Proto;
use probe_core::service::{ServiceFacts, bounded, facts, is_api_name};

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

/// A protocol name as a look-up key: upper-cased, in place (the API's names are `TCP`, `UDP`
/// and `SCTP`; a longer one is cut at 8 bytes). Not a String: the index holds one per
/// frontend, 60,000 at 30,000 Services, each an allocation of its own as a String.
type ProtoKey = [u8; 8];

fn proto_key(protocol: &str) -> ProtoKey {
    let mut key = [0u8; 8];
    for (k, b) in key.iter_mut().zip(protocol.bytes()) {
        *k = b.to_ascii_uppercase();
    }
    key
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
    frontends: HashMap<(IpAddr, u16, ProtoKey), usize>,
    /// (NodePort or healthCheckNodePort, protocol) -> service; health checks use TCP.
    node_ports: HashMap<(u16, ProtoKey), usize>,
    /// LB ingress / external IP -> services (one IP can front several Services, by port).
    lb_ips: HashMap<IpAddr, Vec<usize>>,
    /// (port, protocol) -> the host-network pod that declares it: a container port, or the
    /// numeric port of a probe (kubeadm's static API server declares no ports, only probes).
    host_ports: HashMap<(u16, ProtoKey), PodRef>,
    /// Host-network pods that hold VIPs as node addresses, with the announcer's name.
    announcers: Vec<(PodRef, &'static str)>,
}

impl Index {
    /// Builds the index. Pods without an IP and host-network pods (their IP is the node's)
    /// are left out: an address names a pod only when it is the pod's own.
    pub fn build<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Index {
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
        // In address order, whatever order the slices came in (the store keeps them so: `service_table`'s `facts`).
        for ips in endpoints.values_mut() {
            ips.sort_unstable();
            ips.dedup();
        }
        let mut list: Vec<ServiceFacts> = services
            .into_iter()
            .filter_map(|s| facts(s, &mut endpoints))
            .filter(|s| is_api_name(&s.namespace) && is_api_name(&s.name))
            .map(bounded)
            .collect();
        list.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Index::from_facts(pods, list.into_iter().map(Arc::new))
    }

    /// The index of `pods` and of Services' facts already made (the store, `service_table::ApiServiceTable`, keeps them per
    /// watch event), in (namespace, name) order: the facts are shared, not copied.
    pub fn from_facts<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        services: impl IntoIterator<Item = Arc<ServiceFacts>>,
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
                if let Some(name) = spec.and_then(announcer_of) {
                    index.announcers.push((pod_ref, name));
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
        let list: Vec<Arc<ServiceFacts>> = services.into_iter().collect();
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
                    index.frontends.entry((*ip, port.port, proto)).or_insert(i);
                }
                if let Some(node_port) = port.node_port {
                    index.node_ports.entry((node_port, proto)).or_insert(i);
                }
            }
            if let Some(hc) = service.health_check_node_port {
                index.node_ports.entry((hc, proto_key("TCP"))).or_insert(i);
            }
        }
        index.services = list;
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

    /// The host-network pod on node `node` that holds VIPs as addresses (kube-vip, keepalived),
    /// with the announcer's name; the first by name when several run there.
    pub fn announcer_pod(&self, node: &str) -> Option<(&PodRef, &'static str)> {
        self.announcers
            .iter()
            .filter(|(p, _)| p.node.as_deref() == Some(node))
            .min_by_key(|(p, _)| p.key())
            .map(|(p, n)| (p, *n))
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

/// The announcer a host-network pod runs, by its containers' images: kube-vip publishes
/// `ghcr.io/kube-vip/kube-vip` (earlier `plndr/kube-vip`; kube-vip/kube-vip README and
/// `kube-vip manifest daemonset|pod`, which set hostNetwork: true and NET_ADMIN), keepalived
/// runs from images named after it (osixia/keepalived, kube-keepalived-vip, ...; no one
/// official image). MetalLB's `speaker` is left out: it holds no address on the node
/// (metallb/metallb `speaker/`, `internal/layer2/`: ARP/NDP answered from userspace).
fn announcer_of(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<&'static str> {
    let images = || spec.containers.iter().filter_map(|c| c.image.as_deref());
    if images().any(|i| i.contains("kube-vip/kube-vip") || i.contains("plndr/kube-vip")) {
        return Some(probe_contract::facts::Announcer::KUBE_VIP);
    }
    images()
        .any(|i| i.contains("keepalived"))
        .then_some(probe_contract::facts::Announcer::KEEPALIVED)
}

/// The (port, protocol) keys a host-network pod's spec declares: container ports (on the host
/// network the container port is the host port) and the numeric ports of its TCP and HTTP
/// probes.
fn host_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<(u16, ProtoKey)> {
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
                    out.push((n, proto_key("TCP")));
                }
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use probe_core::service::ANNOTATIONS_MAX;
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
        assert_eq!(*web.endpoints, [ip("10.0.0.5")]);
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
                guard.len() <= probe_core::untrusted::ANNOTATION_VALUE_MAX,
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
