//! Attribution of a confirmed event (pure: a function of the event, an index snapshot and the
//! node's name). Runs after the correlator, on the copy that goes to the sinks, so the
//! correlator's aggregates stay free of names.
//!
//! Adds `client_pod`, `node`, `service` (only when the service table did not name it), one
//! evidence line with the names, and remedies that use the Service's name and settings, placed
//! right after the `Cause:` line.

use std::net::IpAddr;

use super::index::{Index, ServiceFacts};
use crate::correlate::{LoopbackEvent, LoopbackKind};

/// Names `event` from `index`; `node` is this node's Kubernetes name.
pub fn enrich(event: &mut LoopbackEvent, index: &Index, node: Option<&str>) {
    if event.node.is_none() {
        event.node = node.map(str::to_owned);
    }
    let client = match event.kind {
        // The looping packet's source is the pod that called the LB / the VIP.
        LoopbackKind::Hairpin | LoopbackKind::VipPortUnserved => index.pod_by_ip(event.src),
        // The pod that called its own Service (and was its endpoint).
        LoopbackKind::ServiceSelfLoop => index.pod_by_ip(event.src),
        LoopbackKind::HealthcheckBlackhole | LoopbackKind::VipAsSource => None,
    };
    let service = find_service(event, index);
    if client.is_none() && service.is_none() {
        return;
    }
    let mut facts = Vec::new();
    if let Some(pod) = client {
        event.client_pod = Some(pod.key());
        facts.push(format!("{} is pod {}", event.src, pod.key()));
    }
    let mut remedies = Vec::new();
    if let Some(service) = service {
        if event.service.is_none() {
            event.service = Some(service_label(service, event));
        }
        facts.push(format!(
            "{} belongs to Service {}",
            frontend(event),
            service.key()
        ));
        remedies = named_remedies(event, service, client.map(|p| p.key()).as_deref());
    }
    event
        .evidence
        .push(format!("Kubernetes API: {}", facts.join("; ")));
    let at = usize::from(
        event
            .remedy
            .first()
            .is_some_and(|r| r.starts_with("Cause:")),
    );
    event.remedy.splice(at..at, remedies);
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

fn find_service<'a>(event: &LoopbackEvent, index: &'a Index) -> Option<&'a ServiceFacts> {
    let proto = event.proto;
    let by_vip = event
        .vip
        .zip(event.vip_port)
        .and_then(|(vip, port)| index.service_by_frontend(vip, port, proto));
    match event.kind {
        LoopbackKind::Hairpin => {
            by_vip.or_else(|| index.service_by_node_port(event.dst_port, proto))
        }
        // The check's destination is the NodePort (or healthCheckNodePort) on this node.
        LoopbackKind::HealthcheckBlackhole => index
            .service_by_node_port(event.dst_port, proto)
            .or_else(|| only(index.services_by_lb_ip(event.src))),
        // No Service serves the port: name the one that owns the VIP (none when several do).
        LoopbackKind::VipPortUnserved => {
            by_vip.or_else(|| event.vip.and_then(|vip| only(index.services_by_lb_ip(vip))))
        }
        LoopbackKind::VipAsSource => by_vip
            .or_else(|| index.service_by_node_port(event.dst_port, proto))
            .or_else(|| event.vip.and_then(|vip| only(index.services_by_lb_ip(vip)))),
        // The address the pod called: a ClusterIP or LB IP, or a node address's NodePort.
        LoopbackKind::ServiceSelfLoop => by_vip.or_else(|| {
            event
                .vip_port
                .and_then(|port| index.service_by_node_port(port, proto))
        }),
    }
}

fn only(list: Vec<&ServiceFacts>) -> Option<&ServiceFacts> {
    (list.len() == 1).then(|| list[0])
}

/// `namespace/name:port-name` as kube-proxy's rule comments spell it (the service table's
/// format), or `namespace/name` when the port is unnamed or unknown.
fn service_label(service: &ServiceFacts, event: &LoopbackEvent) -> String {
    let port = event
        .vip_port
        .and_then(|p| service.port(p, event.proto))
        .or_else(|| service.port_by_node_port(event.dst_port, event.proto));
    match port
        .and_then(|p| p.name.as_deref())
        .filter(|n| !n.is_empty())
    {
        Some(name) => format!("{}:{name}", service.key()),
        None => service.key(),
    }
}

fn settings(service: &ServiceFacts, vip: Option<IpAddr>) -> String {
    let mut out = format!(
        "Service {} has externalTrafficPolicy: {}",
        service.key(),
        service
            .external_traffic_policy
            .as_deref()
            .unwrap_or("Cluster")
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

fn named_remedies(
    event: &LoopbackEvent,
    service: &ServiceFacts,
    client: Option<&str>,
) -> Vec<String> {
    let port_text = |port: u16| {
        service
            .port(port, event.proto)
            .map(|p| format!(":{}", p.port))
            .unwrap_or_default()
    };
    match event.kind {
        LoopbackKind::Hairpin => {
            let vip = event.vip.map(|v| v.to_string()).unwrap_or_default();
            let port = event.vip_port.map(port_text).unwrap_or_default();
            let caller = client
                .map(|c| format!("In pod {c}: c"))
                .unwrap_or_else(|| "C".into());
            let mut out = vec![format!(
                "{caller}all {}{port} (Service {}) instead of the LB address {vip}{port}: the \
                 call then stays in the cluster and cannot loop through the LB.",
                service.dns_name(),
                service.key()
            )];
            out.push(format!("{}.", settings(service, event.vip)));
            if service.is_etp_local() {
                out.push(format!(
                    "{} keeps client addresses (externalTrafficPolicy: Local), which lets pod \
                     traffic to its LB leave this node unmasqueraded; if the source IP need not \
                     be preserved: kubectl -n {} patch service {} -p \
                     '{{\"spec\":{{\"externalTrafficPolicy\":\"Cluster\"}}}}'.",
                    service.key(),
                    service.namespace,
                    service.name
                ));
            }
            out
        }
        LoopbackKind::HealthcheckBlackhole => {
            let checked = if service.is_etp_local() {
                match service.health_check_node_port {
                    Some(hc) => {
                        format!("its healthCheckNodePort {hc} (externalTrafficPolicy: Local)")
                    }
                    None => "its NodePort (externalTrafficPolicy: Local)".into(),
                }
            } else {
                format!(
                    "its NodePort {} (externalTrafficPolicy: Cluster: the LB checks the traffic port)",
                    event.dst_port
                )
            };
            let mut out = vec![format!(
                "The LB of Service {} health-checks {checked}; {}.",
                service.key(),
                settings(service, Some(event.src))
            )];
            if service.ip_mode(event.src).is_none_or(|m| m == "VIP") {
                out.push(format!(
                    "Service {}'s LB ingress {} has ipMode {}: kube-proxy binds it on this node; \
                     a cloud controller that sets ipMode: Proxy (Kubernetes >= 1.30) or publishes \
                     the LB as a hostname stops the binding.",
                    service.key(),
                    event.src,
                    service.ip_mode(event.src).unwrap_or("unset (VIP)")
                ));
            }
            out
        }
        LoopbackKind::VipPortUnserved => {
            let served: Vec<String> = service
                .ports
                .iter()
                .map(|p| format!("{}/{}", p.port, p.protocol))
                .collect();
            vec![format!(
                "{} is an LB address of Service {}, which serves {} only: call {} on one of \
                 those ports, or reach whatever else listens on port {} through an address \
                 that is not bound on this node.",
                event.vip.unwrap_or(event.dst),
                service.key(),
                served.join(", "),
                service.dns_name(),
                event.vip_port.unwrap_or(event.dst_port)
            )]
        }
        LoopbackKind::VipAsSource => vec![format!("{}.", settings(service, event.vip))],
        LoopbackKind::ServiceSelfLoop => vec![format!(
            "{} is an endpoint of Service {} and called it: every call that picks itself as              the endpoint fails until the hairpin is fixed; the others work, so it looks              intermittent.",
            client.unwrap_or("The pod"),
            service.key()
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::{Outcome, SnatState},
        event::Proto,
        kube::index::tests::{pod, web_service},
    };

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
            kind,
            key: "k".into(),
            src: ip(src),
            src_port: 40000,
            dst: ip(dst),
            dst_port,
            vip: Some(ip("203.0.113.10")),
            vip_port,
            proto: Proto::Tcp,
            drop_reason: None,
            drop_location: None,
            snat: SnatState::No,
            outcome: Outcome::Dropped,
            count: 1,
            evidence: vec!["kernel fact".into()],
            remedy: vec!["Cause: something".into(), "generic remedy".into()],
            first_seen_ns: 0,
            last_seen_ns: 0,
            nic: None,
            service: None,
            layer: None,
            client_pod: None,
            node: None,
        }
    }

    fn index(etp: &str) -> Index {
        Index::build(
            &[pod("shop", "client-1", &["10.0.0.9"])],
            &[web_service(etp)],
            &[],
        )
    }

    #[test]
    fn hairpin_gets_pod_service_node_and_named_remedies_after_the_cause() {
        let mut e = event(
            LoopbackKind::Hairpin,
            "10.0.0.9",
            "198.18.0.2",
            30080,
            Some(80),
        );
        enrich(&mut e, &index("Local"), Some("node-1"));
        assert_eq!(e.client_pod.as_deref(), Some("shop/client-1"));
        assert_eq!(e.service.as_deref(), Some("shop/web:http"));
        assert_eq!(e.node.as_deref(), Some("node-1"));
        assert_eq!(e.remedy[0], "Cause: something");
        assert!(
            e.remedy[1].starts_with("In pod shop/client-1: call web.shop.svc.cluster.local:80 (Service shop/web) instead of the LB address 203.0.113.10:80"),
            "{}",
            e.remedy[1]
        );
        assert!(
            e.remedy[2].contains(
                "externalTrafficPolicy: Local, healthCheckNodePort: 32000, LB ingress ipMode: VIP"
            ),
            "{}",
            e.remedy[2]
        );
        assert!(e.remedy[2].contains("service.cloud.tencent.com/prevent-loopback"));
        assert!(e.remedy.iter().any(|r| r.contains("patch service web")));
        assert_eq!(e.remedy.last().unwrap(), "generic remedy");
        assert_eq!(
            e.evidence.last().unwrap(),
            "Kubernetes API: 10.0.0.9 is pod shop/client-1; 203.0.113.10:80 belongs to Service shop/web"
        );
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
            local.remedy[1].contains(
                "health-checks its healthCheckNodePort 32000 (externalTrafficPolicy: Local)"
            ),
            "{}",
            local.remedy[1]
        );
        assert!(
            local.remedy[2].contains("has ipMode VIP"),
            "{}",
            local.remedy[2]
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
            cluster.remedy[1].contains("its NodePort 30080 (externalTrafficPolicy: Cluster"),
            "{}",
            cluster.remedy[1]
        );
    }

    #[test]
    fn unserved_port_names_the_ports_the_service_serves() {
        let mut e = event(
            LoopbackKind::VipPortUnserved,
            "10.0.0.9",
            "203.0.113.10",
            443,
            Some(443),
        );
        enrich(&mut e, &index("Cluster"), None);
        assert_eq!(e.service.as_deref(), Some("shop/web"));
        assert!(
            e.remedy[1].contains("Service shop/web, which serves 80/TCP only"),
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

        let mut named = event(
            LoopbackKind::Hairpin,
            "10.0.0.9",
            "198.18.0.2",
            30080,
            Some(80),
        );
        named.service = Some("shop/web:http-from-rules".into());
        enrich(&mut named, &index("Cluster"), None);
        assert_eq!(named.service.as_deref(), Some("shop/web:http-from-rules"));
    }
}
