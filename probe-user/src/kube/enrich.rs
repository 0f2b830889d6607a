//! Attribution of a confirmed event (pure: a function of the event, an index snapshot and the
//! node's name). Runs after the correlator, on the copy that goes to the sinks, so the
//! correlator's aggregates stay free of names; every report of an aggregate is attributed
//! anew, so a name the API learns late lands on the aggregate's next update.
//!
//! Adds `client_pod`, `node`, `service` (only when the service table did not name it), the
//! API's facts (`facts.service` with its uid, `facts.etp_api`, `facts.ip_mode`), one evidence
//! line with the names and the Service's settings, and rebuilds the remedy from the merged
//! facts ([`crate::correlate::remedy`]: one builder, so API advice never repeats or
//! contradicts the rules' advice); [`attach_fixes`] then sets the event's ready fixes.

use std::net::IpAddr;

use probe_contract::{
    LbAddress, LoopbackEvent, ServiceLookup,
    facts::{AddressOwner, Announcer, Etp, ServiceFact, SourceKind},
};
use probe_core::{fixes, service::ServiceFacts};

use super::index::Index;
use crate::correlate::remedy;

/// Names `event` from `index`; `node` is this node's Kubernetes name.
pub fn enrich(event: &mut LoopbackEvent, index: &Index, node: Option<&str>) {
    if event.node.is_none() {
        event.node = node.map(str::to_owned);
    }
    // A host listener's owner: the host-network pod that declares its port on this node.
    if let Some(l) = event.listener.as_mut()
        && l.pod.is_none()
        && let Some(pod) = index.host_network_pod(l.port, l.proto, event.node.as_deref())
    {
        l.pod = Some(pod.key());
        event.evidence.push(format!(
            "Kubernetes API: port {}/{} of this node is declared by host-network pod {}",
            l.port,
            l.proto.as_str(),
            pod.key()
        ));
    }
    let announcer_named = name_announcer(event, index);
    // The sender is named by its address when it is a pod's own (never a node's or a VIP).
    let client = match event.facts.source {
        SourceKind::Pod | SourceKind::Unknown => index.pod_by_ip(event.src),
        SourceKind::Node | SourceKind::Vip => None,
    };
    let service = find_service(event, index);
    if client.is_none() && service.is_none() {
        if announcer_named {
            event.remedy = remedy::build(event);
        }
        return;
    }
    let mut facts = Vec::new();
    if let Some(pod) = client {
        event.client_pod = Some(pod.key());
        facts.push(format!("{} is pod {}", event.src, pod.key()));
    }
    if let Some(service) = service {
        if event.service.is_none() {
            event.service = Some(service_label(service, event));
        }
        let vip = lb_address(event);
        facts.push(format!(
            "{} belongs to Service {} ({})",
            frontend(event),
            service.key(),
            settings(service, vip)
        ));
        event.facts.etp_api = Some(Etp::from_api(service.external_traffic_policy.as_deref()));
        event.facts.ip_mode = vip.and_then(|vip| service.ip_mode(vip)).map(str::to_owned);
        event.facts.service = Some(service_fact(service, event));
    }
    event
        .evidence
        .push(format!("Kubernetes API: {}", facts.join("; ")));
    event.remedy = remedy::build(event);
}

/// Names the announcer of a VIP held on this node's NIC or `lo` by its pod on this node: the
/// address's marks say what it looks like, the pod says who runs here. A pod of another
/// announcer than the marks name is not taken for it (the marks are the kernel's word).
fn name_announcer(event: &mut LoopbackEvent, index: &Index) -> bool {
    let Some(node) = event.node.clone() else {
        return false;
    };
    let Some(AddressOwner::Interface {
        iface,
        announcer: Some(a),
    }) = event.facts.owner.as_mut()
    else {
        return false;
    };
    let Some((pod, name)) = index.announcer_pod(&node) else {
        return false;
    };
    if a.pod.is_some() || (a.name != Announcer::UNKNOWN && a.name != name) {
        return false;
    }
    a.name = name.to_string();
    a.pod = Some(pod.key());
    event.evidence.push(format!(
        "Kubernetes API: host-network pod {} runs {name} on this node: it holds the VIP on {iface}",
        pod.key()
    ));
    true
}

/// The LB address whose ingress entry (ipMode) applies: the health check's source, else the
/// event's VIP.
fn lb_address(event: &LoopbackEvent) -> Option<IpAddr> {
    match event.kind.spec().lb_address {
        LbAddress::VipElseSource => Some(event.vip.unwrap_or(event.src)),
        LbAddress::Vip => event.vip,
    }
}

/// The API's view of the Service, for the remedy and the Event.
fn service_fact(service: &ServiceFacts, event: &LoopbackEvent) -> ServiceFact {
    let port = port_of(service, event);
    ServiceFact {
        namespace: service.namespace.clone(),
        name: service.name.clone(),
        uid: service.uid.clone(),
        port: port.map(|p| p.port),
        port_name: port.and_then(|p| p.name.clone()).filter(|n| !n.is_empty()),
        ports: service
            .ports
            .iter()
            .map(|p| format!("{}/{}", p.port, p.protocol))
            .collect(),
        health_check_node_port: service.health_check_node_port,
        annotations: service
            .loopback_annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// The address the event names the Service by.
fn frontend(event: &LoopbackEvent) -> String {
    match (event.vip, event.vip_port) {
        (Some(vip), Some(port)) => sock(vip, port),
        (Some(vip), None) => vip.to_string(),
        _ => sock(event.dst, event.dst_port),
    }
}

/// `ip:port`, with brackets for IPv6.
fn sock(ip: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// The event's Service: its kind's ways to find it (`KindSpec::attribution`), in turn.
fn find_service<'a>(event: &LoopbackEvent, index: &'a Index) -> Option<&'a ServiceFacts> {
    event
        .kind
        .spec()
        .attribution
        .iter()
        .find_map(|lookup| look_up(*lookup, event, index))
}

fn look_up<'a>(
    lookup: ServiceLookup,
    event: &LoopbackEvent,
    index: &'a Index,
) -> Option<&'a ServiceFacts> {
    let proto = event.proto;
    match lookup {
        ServiceLookup::Frontend => event
            .vip
            .zip(event.vip_port)
            .and_then(|(vip, port)| index.service_by_frontend(vip, port, proto)),
        ServiceLookup::NodePortOfDestination => index.service_by_node_port(event.dst_port, proto),
        ServiceLookup::NodePortOfVipPort => event
            .vip_port
            .and_then(|port| index.service_by_node_port(port, proto)),
        ServiceLookup::OnlyOwnerOfSource => only(index.services_by_lb_ip(event.src)),
        ServiceLookup::OnlyOwnerOfVip => {
            event.vip.and_then(|vip| only(index.services_by_lb_ip(vip)))
        }
        ServiceLookup::NamedOwnerOfVip => {
            let owners = event
                .vip
                .map(|vip| index.services_by_lb_ip(vip))
                .unwrap_or_default();
            let named = event
                .service
                .as_deref()
                .map(|s| s.split(':').next().unwrap_or(s));
            owners
                .iter()
                .find(|s| named == Some(s.key().as_str()))
                .copied()
                .or_else(|| only(owners))
        }
    }
}

fn only(list: Vec<&ServiceFacts>) -> Option<&ServiceFacts> {
    (list.len() == 1).then(|| list[0])
}

/// The Service port the event went through: by the VIP's port, else by the NodePort.
fn port_of<'a>(
    service: &'a ServiceFacts,
    event: &LoopbackEvent,
) -> Option<&'a probe_core::service::ServicePort> {
    event
        .vip_port
        .and_then(|p| service.port(p, event.proto))
        .or_else(|| service.port_by_node_port(event.dst_port, event.proto))
}

/// `namespace/name:port-name` as kube-proxy's rule comments spell it (the service table's
/// format), or `namespace/name` when the port is unnamed or unknown.
fn service_label(service: &ServiceFacts, event: &LoopbackEvent) -> String {
    match port_of(service, event)
        .and_then(|p| p.name.as_deref())
        .filter(|n| !n.is_empty())
    {
        Some(name) => format!("{}:{name}", service.key()),
        None => service.key(),
    }
}

/// The Service's settings as the API has them, for the evidence line.
fn settings(service: &ServiceFacts, vip: Option<IpAddr>) -> String {
    let mut out = format!(
        "externalTrafficPolicy: {}",
        Etp::from_api(service.external_traffic_policy.as_deref()).as_str()
    );
    if let Some(hc) = service.health_check_node_port {
        out.push_str(&format!(", healthCheckNodePort: {hc}"));
    }
    if let Some(mode) = vip.and_then(|vip| service.ip_mode(vip)) {
        out.push_str(&format!(", LB ingress ipMode: {mode}"));
    }
    for (key, value) in &service.loopback_annotations {
        out.push_str(&format!(", annotation {key}: {value:?}"));
    }
    out
}

/// Sets `event.fixes` from its facts (the client crate's pure table, [`fixes`]): the Service
/// the enrichment named (read from `index`, when the API is on), the profile from `flag`, else from that Service's own settings. The agent
/// reads no Node, so a node's providerID does not count here (`kubectl clb-probe fix` reads
/// them).
pub fn attach_fixes(event: &mut LoopbackEvent, index: &Index, flag: Option<fixes::Provider>) {
    let key = event.service.as_deref().map(fixes::service_key);
    let service = key
        .as_deref()
        .and_then(|key| index.services().find(|s| s.key() == key));
    let profile = fixes::Profile::resolve(flag, [], service.and_then(fixes::service_provider));
    // A host-listener hairpin goes through no Service rule: the Service patches do not apply.
    event.fixes = if event.facts.host_listener {
        Vec::new()
    } else {
        fixes::fixes(&fixes::Facts::of(event, service, profile.provider))
    };
}

#[cfg(test)]
mod tests {
    use probe_contract::{
        LoopbackKind, Outcome, Proto, SnatState,
        facts::{AddressOwner, Facts},
    };

    use super::*;
    use crate::kube::index::tests::{pod, web_service};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn event(
        kind: LoopbackKind,
        src: &str,
        dst: &str,
        dst_port: u16,
        vip_port: Option<u16>,
    ) -> LoopbackEvent {
        LoopbackEvent {
            key: "k".into(),
            vip: Some(ip("203.0.113.10")),
            vip_port,
            snat: SnatState::No,
            count: 1,
            evidence: vec!["kernel fact".into()],
            remedy: vec!["Cause: something".into(), "generic remedy".into()],
            facts: Facts {
                source: match kind {
                    LoopbackKind::Hairpin | LoopbackKind::VipPortUnserved => SourceKind::Pod,
                    _ => SourceKind::Vip,
                },
                owner: Some(AddressOwner::VipInterface {
                    iface: "kube-ipvs0".into(),
                }),
                ..Facts::default()
            },
            ..LoopbackEvent::between(
                kind,
                (ip(src), 40000),
                (ip(dst), dst_port),
                Proto::Tcp,
                Outcome::Dropped,
            )
        }
    }

    /// shop/client-1's hairpin through the node to shop/web's NodePort.
    fn hairpin_to_web() -> LoopbackEvent {
        event(
            LoopbackKind::Hairpin,
            "10.0.0.9",
            "198.18.0.2",
            30080,
            Some(80),
        )
    }

    /// shop/client-1's call to port 443 of shop/web's LB IP, which serves 80 only.
    fn unserved_443() -> LoopbackEvent {
        event(
            LoopbackKind::VipPortUnserved,
            "10.0.0.9",
            "203.0.113.10",
            443,
            Some(443),
        )
    }

    fn index(etp: &str) -> Index {
        Index::build(
            &[pod("shop", "client-1", &["10.0.0.9"])],
            &[web_service(etp)],
            &[],
        )
    }

    /// The fixes read the Service the enrichment named: Local offers "set Cluster" first,
    /// Cluster never does; no API (an empty index) leaves the policy unknown and says so.
    #[test]
    fn fixes_follow_the_named_service_s_settings() {
        let attach = |etp: &str, index: &Index| {
            let mut e = hairpin_to_web();
            enrich(&mut e, &self::index(etp), None);
            // kube-proxy's rules were read (the fact etp-cluster is gated on).
            e.facts.proxy_mode = Some(probe_contract::facts::ProxyMode::Iptables);
            attach_fixes(&mut e, index, None);
            e.fixes
        };
        let local = attach("Local", &index("Local"));
        assert_eq!(local[0].id, "etp-cluster");
        assert_eq!(local[0].service.as_deref(), Some("shop/web"));
        assert!(local[0].preconditions.is_empty(), "{:?}", local[0]);
        let cluster = attach("Cluster", &index("Cluster"));
        assert!(
            !cluster.iter().any(|f| f.id == "etp-cluster"),
            "{cluster:?}"
        );
        assert_eq!(cluster[0].id, "call-by-service-name");
        let unread = attach("Local", &Index::default());
        let etp = unread.iter().find(|f| f.id == "etp-cluster").unwrap();
        assert!(etp.preconditions[0].contains("not read"), "{etp:?}");
        assert_eq!(
            unread[0].id, "call-by-service-name",
            "an unread policy ranks lower"
        );
    }

    #[test]
    fn hairpin_gets_pod_service_node_and_a_remedy_rebuilt_from_the_api_facts() {
        let mut e = hairpin_to_web();
        enrich(&mut e, &index("Local"), Some("node-1"));
        assert_eq!(e.client_pod.as_deref(), Some("shop/client-1"));
        assert_eq!(e.service.as_deref(), Some("shop/web:http"));
        assert_eq!(e.node.as_deref(), Some("node-1"));
        let svc = e.facts.service.as_ref().expect("the API's Service");
        assert_eq!(
            (svc.key(), svc.port, svc.port_name.as_deref()),
            ("shop/web".into(), Some(80), Some("http"))
        );
        assert_eq!(svc.uid.as_deref(), Some("uid-web"));
        assert_eq!(
            (e.facts.etp_api, e.facts.ip_mode.as_deref()),
            (Some(Etp::Local), Some("VIP"))
        );
        // Rebuilt from the facts: the correlator's placeholder lines are gone.
        assert!(
            e.remedy[0].starts_with("Cause: pod shop/client-1 (10.0.0.9) called the LB"),
            "{:#?}",
            e.remedy
        );
        assert!(!e.remedy.iter().any(|r| r == "generic remedy"));
        let dns: Vec<&String> = e.remedy.iter().filter(|r| r.contains("DNS")).collect();
        assert_eq!(dns.len(), 1, "{:#?}", e.remedy);
        assert!(
            dns[0].starts_with("In pod shop/client-1: call web.shop.svc.cluster.local:80 (Service shop/web) instead of the LB address 203.0.113.10:80"),
            "{}",
            dns[0]
        );
        assert!(
            e.remedy
                .iter()
                .any(|r| r.contains("kubectl -n shop patch service web"))
        );
        assert_eq!(
            e.evidence.last().unwrap(),
            "Kubernetes API: 10.0.0.9 is pod shop/client-1; 203.0.113.10:80 belongs to Service \
             shop/web (externalTrafficPolicy: Local, healthCheckNodePort: 32000, LB ingress \
             ipMode: VIP, annotation service.cloud.tencent.com/prevent-loopback: \"true\")"
        );
    }

    /// E2: a tenant's 250 KB annotation on its LB Service was copied into every event of its
    /// LB IP twice (the settings in the evidence, the facts): 504 KB a JSON line. The index
    /// bounds it; the event stays small and shows the value cut.
    #[test]
    fn a_tenant_s_huge_annotation_is_not_copied_into_the_event() {
        let mut service = web_service("Cluster");
        service.metadata.annotations.as_mut().unwrap().insert(
            "service.cloud.tencent.com/prevent-loopback".into(),
            "x".repeat(250_000),
        );
        let index = Index::build(&[pod("shop", "client-1", &["10.0.0.9"])], &[service], &[]);
        let mut e = unserved_443();
        enrich(&mut e, &index, Some("node-1"));
        attach_fixes(&mut e, &index, None);
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.len() < 8 * 1024, "{} bytes", line.len());
        assert!(
            e.evidence
                .last()
                .unwrap()
                .contains("prevent-loopback: \"xxx"),
            "{:#?}",
            e.evidence
        );
        assert!(line.contains("…[cut from 250000 bytes]"), "{line}");
    }

    #[test]
    fn healthcheck_names_the_checked_port_by_policy() {
        let mut local = event(
            LoopbackKind::HealthcheckBlackhole,
            "203.0.113.10",
            "198.18.0.2",
            32000,
            None,
        );
        enrich(&mut local, &index("Local"), None);
        assert_eq!(local.client_pod, None);
        assert_eq!(local.service.as_deref(), Some("shop/web"));
        assert!(
            local.remedy[0].contains(
                "The LB of Service shop/web health-checks"
                    .replace("The LB", "the LB")
                    .as_str()
            ) && local.remedy[0]
                .contains("on its healthCheckNodePort 32000 (externalTrafficPolicy: Local)"),
            "{}",
            local.remedy[0]
        );
        assert!(
            local.remedy.iter().any(|r| r.contains("ipMode is VIP")),
            "{:#?}",
            local.remedy
        );

        let mut cluster = event(
            LoopbackKind::HealthcheckBlackhole,
            "203.0.113.10",
            "198.18.0.2",
            30080,
            None,
        );
        enrich(&mut cluster, &index("Cluster"), None);
        assert_eq!(cluster.service.as_deref(), Some("shop/web:http"));
        assert!(
            cluster.remedy[0].contains("on NodePort 30080 (externalTrafficPolicy: Cluster"),
            "{}",
            cluster.remedy[0]
        );

        // A VIP that a guest agent's route makes local: ipMode does not undo that binding.
        let mut routed = event(
            LoopbackKind::HealthcheckBlackhole,
            "203.0.113.10",
            "198.18.0.2",
            30080,
            None,
        );
        routed.facts.owner = Some(AddressOwner::local_route(Some("eth0".into()), 66));
        enrich(&mut routed, &index("Cluster"), None);
        assert!(
            !routed.remedy.iter().any(|r| r.contains("ipMode: Proxy")),
            "{:#?}",
            routed.remedy
        );
        assert!(
            routed.remedy.iter().any(|r| r.contains("guest-agent#555")),
            "{:#?}",
            routed.remedy
        );
    }

    #[test]
    fn unserved_port_names_the_ports_the_service_serves() {
        let mut e = unserved_443();
        enrich(&mut e, &index("Cluster"), None);
        assert_eq!(e.service.as_deref(), Some("shop/web"));
        assert!(
            e.remedy[1].starts_with("Service shop/web serves 80/TCP only on 203.0.113.10"),
            "{}",
            e.remedy[1]
        );
    }

    #[test]
    fn an_lb_ip_shared_by_several_services_names_none_without_a_port() {
        let mut other = web_service("Cluster");
        other.metadata.name = Some("dns".into());
        let ports = other.spec.as_mut().unwrap().ports.as_mut().unwrap();
        ports[0].port = 53;
        ports[0].node_port = Some(30053);
        let index = Index::build(&[], &[web_service("Cluster"), other], &[]);
        let mut e = event(
            LoopbackKind::VipAsSource,
            "203.0.113.10",
            "10.0.0.7",
            8080,
            None,
        );
        enrich(&mut e, &index, None);
        assert_eq!(e.service, None);
        let mut by_node_port = event(
            LoopbackKind::VipAsSource,
            "203.0.113.10",
            "198.18.1.2",
            30053,
            None,
        );
        enrich(&mut by_node_port, &index, None);
        assert_eq!(by_node_port.service.as_deref(), Some("shop/dns:http"));
    }

    #[test]
    fn no_names_without_a_match_and_the_service_table_name_is_kept() {
        let mut e = event(
            LoopbackKind::Hairpin,
            "10.9.9.9",
            "198.18.0.2",
            31000,
            Some(8080),
        );
        let before = e.clone();
        enrich(&mut e, &index("Cluster"), None);
        assert_eq!(e, before);
        enrich(&mut e, &Index::default(), Some("n"));
        assert_eq!((e.node.as_deref(), e.remedy.len()), (Some("n"), 2));

        let mut named = hairpin_to_web();
        named.service = Some("shop/web:http-from-rules".into());
        enrich(&mut named, &index("Cluster"), None);
        assert_eq!(named.service.as_deref(), Some("shop/web:http-from-rules"));
    }

    /// kube-vip's DaemonSet pod as `kube-vip manifest daemonset` writes it
    /// (kube-vip/kube-vip pkg/kubevip/config_generator.go: labels, hostNetwork, NET_ADMIN).
    pub(crate) fn kube_vip_pod(node: &str) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": "kube-system", "name": format!("kube-vip-ds-{node}"),
                "labels": {"app.kubernetes.io/name": "kube-vip-ds",
                           "app.kubernetes.io/version": "v0.8.9"},
            },
            "spec": {"nodeName": node, "hostNetwork": true, "containers": [{
                "name": "kube-vip", "image": "ghcr.io/kube-vip/kube-vip:v0.8.9",
                "args": ["manager"],
                "env": [{"name": "vip_arp", "value": "true"},
                        {"name": "vip_interface", "value": "eth0"},
                        {"name": "svc_enable", "value": "true"}],
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"],
                                                     "drop": ["ALL"]}},
            }]},
            "status": {"podIP": "198.18.0.2"},
        }))
        .unwrap()
    }

    /// The node's kube-vip pod names the announcer of a VIP held on the NIC with no mark, and
    /// the remedy then names that pod; another node's pod, or a pod of another announcer than
    /// the address's marks say, is not taken for it.
    #[test]
    fn the_announcer_of_a_held_vip_is_named_by_its_pod_on_this_node() {
        let held = |name: &str| AddressOwner::Interface {
            iface: "eth0".into(),
            announcer: Some(Announcer {
                name: name.into(),
                why: "/32 on eth0".into(),
                pod: None,
            }),
        };
        let idx = Index::build([&kube_vip_pod("node-1")], &[], &[]);
        let blackhole = |owner: AddressOwner| {
            let mut e = event(
                LoopbackKind::HealthcheckBlackhole,
                "203.0.113.10",
                "198.18.0.2",
                30080,
                None,
            );
            e.facts.owner = Some(owner);
            e
        };
        let mut e = blackhole(held(Announcer::UNKNOWN));
        enrich(&mut e, &idx, Some("node-1"));
        let a = e.facts.owner.as_ref().and_then(AddressOwner::announcer);
        assert_eq!(a.map(|a| a.name.as_str()), Some("kube-vip"));
        assert_eq!(
            a.and_then(|a| a.pod.as_deref()),
            Some("kube-system/kube-vip-ds-node-1")
        );
        assert!(
            e.remedy
                .iter()
                .any(|l| l.contains("by kube-vip (pod kube-system/kube-vip-ds-node-1)")),
            "{:#?}",
            e.remedy
        );
        assert!(
            !e.remedy.iter().any(|l| l.contains("kube-ipvs0")),
            "{:#?}",
            e.remedy
        );
        assert!(
            e.evidence
                .iter()
                .any(|l| l.contains("pod kube-system/kube-vip-ds-node-1 runs kube-vip")),
            "{:#?}",
            e.evidence
        );
        for (owner, node) in [
            (held(Announcer::UNKNOWN), "node-2"),
            (held(Announcer::KEEPALIVED), "node-1"),
        ] {
            let mut e = blackhole(owner.clone());
            enrich(&mut e, &idx, Some(node));
            assert_eq!(e.facts.owner, Some(owner), "{node}");
        }
    }

    /// A host-listener hairpin names the host-network pod that declares the port on this node
    /// (kubeadm's API server declares only probe ports); a pod on another node is not it.
    #[test]
    fn a_host_listener_is_named_by_its_host_network_pod() {
        let apiserver: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "kube-system", "name": "kube-apiserver-node-1"},
                "spec": {"nodeName": "node-1", "hostNetwork": true, "containers": [{
                    "name": "kube-apiserver",
                    "livenessProbe": {"httpGet": {"port": 6443, "path": "/livez"}},
                }]},
                "status": {"podIP": "198.18.0.2"},
            }))
            .unwrap();
        let mut ingress: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "ingress", "name": "controller-x"},
                "spec": {"nodeName": "node-2", "hostNetwork": true, "containers": [{
                    "name": "controller", "ports": [{"containerPort": 443}],
                }]},
            }))
            .unwrap();
        let idx = Index::build([&apiserver, &ingress], &[], &[]);
        let listener = |port| probe_contract::Listener {
            addr: ip("0.0.0.0"),
            port,
            proto: Proto::Tcp,
            uid: 0,
            inode: 1,
            process: None,
            pid: None,
            pod: None,
        };
        // A hairpin to `port` whose listener sock_diag found, enriched on node-1.
        let enriched = |port, idx: &Index| {
            let mut e = event(
                LoopbackKind::Hairpin,
                "10.0.0.9",
                "198.18.0.2",
                port,
                Some(port),
            );
            e.listener = Some(listener(port));
            enrich(&mut e, idx, Some("node-1"));
            e
        };
        let e = enriched(6443, &idx);
        assert_eq!(
            e.listener.as_ref().and_then(|l| l.pod.as_deref()),
            Some("kube-system/kube-apiserver-node-1")
        );
        assert!(
            e.evidence
                .iter()
                .any(|l| l
                    .contains("declared by host-network pod kube-system/kube-apiserver-node-1")),
            "{:#?}",
            e.evidence
        );
        // The host-network pod is no client pod: its IP is the node's.
        assert_eq!(e.client_pod, None);
        // Port 443 is declared on node-2 only.
        let other = enriched(443, &idx);
        assert_eq!(other.listener.and_then(|l| l.pod), None);
        ingress.spec.as_mut().unwrap().node_name = Some("node-1".into());
        let idx = Index::build([&ingress], &[], &[]);
        let same = enriched(443, &idx);
        assert_eq!(
            same.listener.and_then(|l| l.pod).as_deref(),
            Some("ingress/controller-x")
        );
    }
}
