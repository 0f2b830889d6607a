//! A Service as the fixes and remedies read it (pure): [`ServiceFacts`], built from one API
//! Service ([`ServiceFacts::from_service`], the plugin's and `probe check`'s) or, with its ready
//! endpoints and every free string bounded ([`facts`], [`bounded`]), by the agent's address
//! index (`probe-user`'s `kube::index::Index`), which stays with the agent.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
};

use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
use probe_contract::Proto;

mod word;
pub use word::ApiWord;

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

/// The Service annotations that make the LB prepend a PROXY protocol header to every
/// connection it passes to the backends, each with how its controller reads the value. A
/// backend that requires the header resets a connection without one, so an in-cluster call
/// that kube-proxy short-circuits (it never passes the LB) fails ("broken header":
/// kubernetes/ingress-nginx#9643, #3996, hetznercloud/hcloud-cloud-controller-manager#160,
/// kubernetes/cloud-provider-openstack#1287).
pub const PROXY_PROTOCOL_ANNOTATIONS: [(&str, ProxyProtocolValue); 5] = [
    // AWS: only "*" is accepted (PROXY v2 on every target group): kubernetes-sigs/
    // aws-load-balancer-controller pkg/annotations/constants.go `SvcLBSuffixProxyProtocol`,
    // read in pkg/service/model_build_target_group.go (any other value is an error); in-tree
    // kubernetes/cloud-provider-aws pkg/providers/v1/aws.go
    // `ServiceAnnotationLoadBalancerProxyProtocol`: "we only accept the value *" (PROXY v1 on
    // a classic ELB).
    (
        "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol",
        ProxyProtocolValue::Star,
    ),
    // Hetzner: a Go bool (hetznercloud/hcloud-cloud-controller-manager
    // internal/annotation/load_balancer.go `LBSvcProxyProtocol`, `BoolFromService`); the CCM
    // also has a cluster-wide default this Service does not show, but with PROXY protocol on
    // it publishes ipMode Proxy (hcloud/load_balancers.go), which the rule reads.
    (
        "load-balancer.hetzner.cloud/uses-proxyprotocol",
        ProxyProtocolValue::GoBool,
    ),
    // OpenStack: "true" / "v1" (PROXY) or "v2" (PROXYV2): kubernetes/cloud-provider-openstack
    // pkg/openstack/loadbalancer.go `ServiceAnnotationLoadBalancerProxyEnabled`,
    // `getProxyProtocolFromServiceAnnotation` (older releases: a Go bool).
    (
        "loadbalancer.openstack.org/proxy-protocol",
        ProxyProtocolValue::OpenStack,
    ),
    // DigitalOcean: strconv.ParseBool (digitalocean/digitalocean-cloud-controller-manager
    // cloud-controller-manager/do/loadbalancers.go `annDOEnableProxyProtocol`,
    // `getEnableProxyProtocol`).
    (
        "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol",
        ProxyProtocolValue::GoBool,
    ),
    // Alibaba: "on" (kubernetes/cloud-provider-alibaba-cloud, the CLB and NLB listener
    // builders: `reqCtx.Anno.Get(annotation.ProxyProtocol) == string(model.OnFlag)`; the NLB's
    // compares without case). The CCM also reads the legacy `alicloud-` spelling
    // (annotation.go, AnnotationLegacyPrefix).
    (
        "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-proxy-protocol",
        ProxyProtocolValue::On,
    ),
];

/// How a controller reads its PROXY protocol annotation's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyProtocolValue {
    /// Exactly `*`.
    Star,
    /// Go's `strconv.ParseBool` true: `1`, `t`, `T`, `TRUE`, `true`, `True`.
    GoBool,
    /// OpenStack: `true`, `v1`, `v2` (and the Go bool spellings of older releases).
    OpenStack,
    /// `on`, any case.
    On,
}

impl ProxyProtocolValue {
    fn is_on(self, value: &str) -> bool {
        let go_bool = matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True");
        match self {
            ProxyProtocolValue::Star => value == "*",
            ProxyProtocolValue::GoBool => go_bool,
            ProxyProtocolValue::OpenStack => go_bool || matches!(value, "v1" | "v2"),
            ProxyProtocolValue::On => value.eq_ignore_ascii_case("on"),
        }
    }
}

/// The annotation (`key: value`) that turns PROXY protocol on for this Service's LB, if one
/// does. The legacy Alibaba spelling is read like the CCM reads it.
pub fn proxy_protocol(annotations: &BTreeMap<String, String>) -> Option<String> {
    annotations.iter().find_map(|(k, v)| {
        let key = k
            .strip_prefix("service.beta.kubernetes.io/alicloud-")
            .map_or(k.clone(), |rest| {
                format!("service.beta.kubernetes.io/alibaba-cloud-{rest}")
            });
        PROXY_PROTOCOL_ANNOTATIONS
            .iter()
            .find(|(name, how)| *name == key && how.is_on(v.trim()))
            .map(|_| format!("{k}: {v}"))
    })
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Option<String>,
    /// `TCP`, `UDP`, `SCTP`.
    pub protocol: ApiWord,
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
    pub ip_mode: Option<ApiWord>,
}

/// Source ranges kept per Service (a tenant's list is bounded where it enters; past it the
/// rule may miss a range that would cover a pod range, and says nothing wrong, only less).
pub const MAX_SOURCE_RANGES: usize = 64;

/// A Service and the settings its remedies depend on. Its lists are boxed slices, not Vecs:
/// the agent's store holds one per Service for the Service's life (no spare room, and 8 bytes
/// less each; decisions.md "One store").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFacts {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid` (an Event's `regarding` names the object by it).
    pub uid: Option<String>,
    /// `ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalName`.
    pub service_type: ApiWord,
    pub cluster_ips: Box<[IpAddr]>,
    pub external_ips: Box<[IpAddr]>,
    pub ingress: Box<[LbIngress]>,
    pub ports: Box<[ServicePort]>,
    /// `Cluster` or `Local` (None when unset: Cluster).
    pub external_traffic_policy: Option<ApiWord>,
    pub health_check_node_port: Option<u16>,
    /// The [`LOOPBACK_ANNOTATIONS`] that are set, with their values (bounded in the agent's
    /// index, like `annotations`).
    pub loopback_annotations: BTreeMap<String, String>,
    /// Ready endpoint addresses from the Service's EndpointSlices.
    pub endpoints: Box<[IpAddr]>,
    /// `spec.loadBalancerClass` (which controller runs the LB), when set.
    pub load_balancer_class: Option<String>,
    /// `spec.loadBalancerSourceRanges` as written (CIDRs), at most [`MAX_SOURCE_RANGES`]:
    /// kube-proxy drops an in-cluster call to the LB IP whose source is outside them
    /// (`probe check`'s `source_ranges`).
    #[doc(alias = "loadBalancerSourceRanges")]
    pub load_balancer_source_ranges: Box<[String]>,
    /// The LB controllers' annotations ([`crate::fixes::provider::ANNOTATION_PREFIXES`]):
    /// the provider fixes read them and never offer one already set. No other annotation is
    /// kept (a tenant's own, kubectl's last-applied copy): nothing reads them, and each would
    /// be held for the life of the Service. In the agent's index every value is bounded
    /// ([`bounded`]).
    pub annotations: BTreeMap<String, String>,
    /// `metadata.resourceVersion`: `kubectl clb-probe fix --apply` refuses a fix computed
    /// from another version. None in the agent's index ([`bounded`]): nothing there reads it.
    pub resource_version: Option<String>,
}

impl ServiceFacts {
    /// A Service of `service_type` with nothing else known: no addresses, ports, policies,
    /// endpoints or annotations. The base the readers and tests complete with `..`, so each
    /// says only what it knows.
    pub fn named(namespace: &str, name: &str, service_type: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: None,
            service_type: service_type.into(),
            cluster_ips: Box::default(),
            external_ips: Box::default(),
            ingress: Box::default(),
            ports: Box::default(),
            external_traffic_policy: None,
            health_check_node_port: None,
            loopback_annotations: BTreeMap::new(),
            endpoints: Box::default(),
            load_balancer_class: None,
            load_balancer_source_ranges: Box::default(),
            annotations: BTreeMap::new(),
            resource_version: None,
        }
    }

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

impl ServiceFacts {
    /// The facts of one API Service, without endpoints (`probe check` lists Services once and
    /// needs no EndpointSlices); None without a namespace or name.
    pub fn from_service(service: &Service) -> Option<ServiceFacts> {
        facts(service, &mut HashMap::new())
    }
}

/// Whether [`facts`] reads the annotation `key`: a [`LOOPBACK_ANNOTATIONS`] one or an LB
/// controller's. The agent's reflectors keep no other (`probe-user`'s `kube::watcher`).
pub fn is_read_annotation(key: &str) -> bool {
    LOOPBACK_ANNOTATIONS.contains(&key) || is_provider_annotation(key)
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
pub fn bounded(mut service: ServiceFacts) -> ServiceFacts {
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
    let word = |w: &mut ApiWord| *w = text(w, API_FIELD_MAX).into();
    for port in &mut service.ports {
        port.name.as_mut().map(field);
        word(&mut port.protocol);
    }
    for ingress in &mut service.ingress {
        ingress.hostname.as_mut().map(field);
        ingress.ip_mode.as_mut().map(word);
    }
    service.uid.as_mut().map(field);
    service.load_balancer_class.as_mut().map(field);
    service.external_traffic_policy.as_mut().map(word);
    word(&mut service.service_type);
    // Only the plugin's `fix --apply` reads it (`ServiceFacts::from_service`, not bounded);
    // the agent's store would hold it per Service for nothing.
    service.resource_version = None;
    service
}

/// The provider annotations the agent's index keeps of one Service (see [`bounded`]).
pub const ANNOTATIONS_MAX: usize = 64;

/// The longest name the API server accepts (a DNS-1123 subdomain), the bound of the other
/// strings of an API object the index keeps.
pub const API_FIELD_MAX: usize = 253;

/// A namespace or object name as the API server accepts it (a DNS-1123 subdomain: at most
/// 253 bytes of lowercase letters, digits, `-` and `.`). Anything else came from a faulty API
/// or a proxy and names nothing: its object is left out of the index (never printed).
pub fn is_api_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= API_FIELD_MAX
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The Service's `status.loadBalancer.ingress` entries (none before a provider wrote them).
pub fn lb_ingress(service: &Service) -> impl Iterator<Item = &LoadBalancerIngress> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
}

/// The facts of one API Service with its ready `endpoints` (taken out of the map); None without
/// a namespace or name.
pub fn facts(
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
    let ingress = lb_ingress(service)
        .map(|i| LbIngress {
            ip: i.ip.as_deref().and_then(|ip| ip.parse().ok()),
            hostname: i.hostname.clone(),
            ip_mode: i.ip_mode.as_deref().map(ApiWord::from),
        })
        .collect();
    let ports = spec
        .ports
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some(ServicePort {
                name: p.name,
                protocol: p.protocol.map_or_else(|| "TCP".into(), ApiWord::from),
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
            .unwrap_or_default()
            .into(),
        uid: service.metadata.uid.clone(),
        namespace,
        name,
        service_type: spec.type_.map_or_else(|| "ClusterIP".into(), ApiWord::from),
        cluster_ips: cluster_ips.into(),
        external_ips: ips(spec.external_ips).into(),
        ingress,
        ports,
        external_traffic_policy: spec.external_traffic_policy.map(ApiWord::from),
        health_check_node_port: spec
            .health_check_node_port
            .and_then(|n| u16::try_from(n).ok()),
        loopback_annotations,
        load_balancer_class: spec.load_balancer_class,
        load_balancer_source_ranges: spec
            .load_balancer_source_ranges
            .into_iter()
            .flatten()
            .take(MAX_SOURCE_RANGES)
            .map(|r| crate::untrusted::text(&r, 64))
            .collect(),
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
mod proxy_protocol_tests {
    use std::collections::BTreeMap;

    use super::proxy_protocol;

    fn on(k: &str, v: &str) -> Option<String> {
        proxy_protocol(&BTreeMap::from([(k.to_string(), v.to_string())]))
    }

    /// Each controller's own spelling turns it on; what the controller rejects or reads as
    /// off does not.
    #[test]
    fn each_controller_s_value_turns_proxy_protocol_on_and_no_other() {
        let aws = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
        let hcloud = "load-balancer.hetzner.cloud/uses-proxyprotocol";
        let occm = "loadbalancer.openstack.org/proxy-protocol";
        let doks = "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol";
        let ack = "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-proxy-protocol";
        let legacy_ack = "service.beta.kubernetes.io/alicloud-loadbalancer-proxy-protocol";
        for (k, v) in [
            (aws, "*"),
            (hcloud, "true"),
            (hcloud, "1"),
            (occm, "v2"),
            (occm, "True"),
            (doks, "true"),
            (ack, "on"),
            (ack, "ON"),
            (legacy_ack, "on"),
        ] {
            assert_eq!(on(k, v), Some(format!("{k}: {v}")), "{k}={v}");
        }
        for (k, v) in [
            (aws, "true"),
            (hcloud, "false"),
            (hcloud, "yes"),
            (occm, "v3"),
            (doks, "on"),
            (ack, "true"),
            ("service.beta.kubernetes.io/aws-load-balancer-type", "nlb"),
        ] {
            assert_eq!(on(k, v), None, "{k}={v}");
        }
    }
}
