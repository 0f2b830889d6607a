//! The sentences the remedies share: the Service's and the sender's names, what bound the
//! address and how to unbind it, the in-cluster call advice, a policy mismatch.

use std::net::IpAddr;

use probe_contract::{
    LoopbackEvent, Proto,
    facts::{AddressOwner, Announcer, Facts, SourceKind},
    sock,
};

/// The Service's name for a sentence: the API's, else the rules' `namespace/name`, else none.
pub(in crate::correlate) fn service_key(e: &LoopbackEvent) -> Option<String> {
    e.facts
        .service
        .as_ref()
        .map(|s| s.key())
        .or_else(|| e.service.as_deref().map(strip_port))
}

/// `namespace/name` out of `namespace/name:port`.
pub(in crate::correlate) fn strip_port(s: &str) -> String {
    s.split(':').next().unwrap_or(s).to_string()
}

/// The sender, as the subject of a sentence.
pub(in crate::correlate) fn sender(e: &LoopbackEvent) -> String {
    match e.facts.source {
        SourceKind::Pod => match &e.client_pod {
            Some(pod) => format!("pod {pod} ({})", e.src),
            None => format!("pod {}", e.src),
        },
        SourceKind::Node => format!("this node ({})", e.src),
        SourceKind::Vip => "a host-network caller".to_string(),
        SourceKind::Unknown => format!("the client {}", e.src),
    }
}

/// What makes `vip` a local address, after "`vip` is ".
pub(in crate::correlate) fn bound(vip: IpAddr, owner: Option<&AddressOwner>) -> String {
    match owner {
        Some(AddressOwner::VipInterface { iface }) => format!(
            "bound on {iface} here (kube-proxy in IPVS mode binds LoadBalancer ingress IPs so \
             in-cluster calls short-circuit)"
        ),
        Some(AddressOwner::Interface {
            iface,
            announcer: Some(a),
        }) => format!(
            "a VIP on {iface} here, held by {} to announce it (the node answers for it as its \
             own address; kube-proxy did not bind it)",
            a.who()
        ),
        Some(AddressOwner::Interface {
            iface,
            announcer: None,
        }) => {
            format!("an address on {iface} here (keepalived, kube-vip or a manual address)")
        }
        Some(AddressOwner::LocalRoute {
            protocol,
            protocol_name,
            ..
        }) => format!(
            "made local here by a route of table local (protocol {protocol} {protocol_name}, no \
             interface address)"
        ),
        None => format!("a local address here (ip route show table local {vip})"),
    }
}

/// How to stop `vip` being local, addressed to its owner.
pub(in crate::correlate) fn unbind(vip: IpAddr, facts: &Facts) -> String {
    match &facts.owner {
        Some(AddressOwner::VipInterface { iface }) => match facts.ip_mode.as_deref() {
            Some("Proxy") => format!(
                "The API already sets ipMode: Proxy on the LB ingress {vip}, yet it is bound on \
                 {iface}: this kube-proxy ignores ipMode (older than Kubernetes 1.30, or the \
                 LoadBalancerIPMode feature off); upgrade it, or publish the LB as a hostname."
            ),
            mode => format!(
                "Or stop binding the LB ingress IP on {iface} (a controller that sets \
                 status.loadBalancer.ingress[].ipMode: Proxy, Kubernetes >= 1.30, or publishes \
                 the LB as a hostname{}); in-cluster calls to the VIP then really go to the LB, \
                 so check for hairpin loopback afterwards.",
                // Only the API tells the ipMode: without attribution it is not known.
                match (mode, &facts.service) {
                    (Some(mode), _) => format!("; ipMode is {mode}"),
                    (None, Some(_)) => "; ipMode is unset (VIP)".to_string(),
                    (None, None) => String::new(),
                }
            ),
        },
        Some(owner @ (AddressOwner::Interface { .. } | AddressOwner::LocalRoute { .. })) => {
            format!("Or: {}", owner_fix(vip, owner))
        }
        None => format!(
            "Or stop making {vip} a local address of this node (ip route show table local \
             {vip} names the route; its owner must drop it)."
        ),
    }
}

/// What removes a local address that kube-proxy did not make local (an address on a NIC, a
/// `local` route): kube-proxy's settings, the Service's ipMode or its annotations do not touch
/// it. The GCE guest agent's routes (protocol 66) get the agent's own switch.
pub(in crate::correlate) fn owner_fix(vip: IpAddr, owner: &AddressOwner) -> String {
    match owner {
        AddressOwner::VipInterface { iface } => format!(
            "{vip} is bound on {iface} by kube-proxy in IPVS mode: stop the binding as its \
             ipMode / hostname options allow."
        ),
        AddressOwner::LocalRoute { protocol: 66, .. } => format!(
            "{vip} is made local by the cloud's guest agent (`local {vip}` in table local, proto \
             66), not by kube-proxy: changing kube-proxy, ipMode or the Service does not remove \
             it. On GCE the google-guest-agent installs it for every forwarding rule that \
             targets this instance, and the node needs it to accept the LB's own traffic: leave \
             it. Have host-network callers use the Service's ClusterIP (or SNAT their calls to \
             the LB to the node address) instead of {vip}; the agent has no switch for these \
             routes yet (GoogleCloudPlatform/guest-agent#555)."
        ),
        AddressOwner::LocalRoute {
            protocol,
            protocol_name,
            iface,
        } => format!(
            "{vip} is made local by a `local` route of table local (proto {protocol} = \
             {protocol_name}{}), not by kube-proxy: changing kube-proxy or the Service does not \
             remove it. Remove it where it is configured (by hand: `ip route del local {vip} \
             table local`) if nothing on the node must accept traffic for {vip} itself.",
            iface
                .as_deref()
                .map(|i| format!(", dev {i}"))
                .unwrap_or_default()
        ),
        AddressOwner::Interface {
            iface,
            announcer: Some(a),
        } => announcer_fix(vip, iface, a),
        AddressOwner::Interface {
            iface,
            announcer: None,
        } => format!(
            "{vip} is an address on {iface}, not kube-proxy's binding: if keepalived or kube-vip \
             hold it as a VIP, remove it from {iface} on this node or keep that VIP off the nodes \
             this LB targets (or the LB's checks and calls off that VIP); kube-proxy settings and \
             the Service's ipMode do not change it."
        ),
    }
}

/// What removes the loop of a VIP an announcer holds on this node: the announcer's placement
/// of the VIP, or checks and calls that do not use it; kube-proxy's settings, ipMode and the
/// Service's annotations do not touch an address kube-proxy did not add.
fn announcer_fix(vip: IpAddr, iface: &str, a: &Announcer) -> String {
    let who = a.who();
    let placement = match a.name.as_str() {
        // kube-vip adds the VIP on its `vip_interface` (BGP mode: `lo`) on the node that leads
        // for it (kube-vip/kube-vip pkg/vip/address.go, pkg/kubevip/config_envvar.go).
        Announcer::KUBE_VIP => format!(
            "kube-vip adds {vip} to {iface} (its vip_interface; lo in BGP mode) on the node that \
             leads for it: keep kube-vip (its DaemonSet's nodeSelector, or svc_enable off for \
             this Service) on nodes that are not this LB's targets"
        ),
        // keepalived's MASTER adds each virtual_ipaddress (acassen/keepalived
        // keepalived/vrrp/vrrp_ipaddress.c).
        Announcer::KEEPALIVED => format!(
            "keepalived's MASTER adds {vip} (a virtual_ipaddress) to {iface}: run that VRRP \
             instance on nodes that are not this LB's targets"
        ),
        _ => format!(
            "remove {vip} from {iface} where it is configured, or keep whatever announces it on \
             nodes that are not this LB's targets"
        ),
    };
    format!(
        "{vip} is held on {iface} by {who}, not bound by kube-proxy: kube-proxy's settings, the \
         Service's ipMode and its annotations do not remove it. Have whatever checks {vip}'s \
         backends check from a source that is not {vip} (the checker's own address), and have \
         this node's callers use the Service's ClusterIP instead of {vip}; or {placement}."
    )
}

/// The one "call the Service in-cluster" advice, for `subject` (`In pod x: c` / `C`).
pub(in crate::correlate) fn call_in_cluster(
    e: &LoopbackEvent,
    vip: IpAddr,
    vip_port: Option<u16>,
) -> String {
    let lb = match vip_port {
        Some(p) => sock(vip, p),
        None => vip.to_string(),
    };
    let caller = match (e.facts.source, &e.client_pod) {
        (SourceKind::Pod, Some(pod)) => format!("In pod {pod}: c"),
        (SourceKind::Node, _) => "From this node and its host-network workloads, c".to_string(),
        (SourceKind::Vip, _) => "From host-network callers, c".to_string(),
        _ => "C".to_string(),
    };
    let target = match &e.facts.service {
        Some(s) => {
            let port = s.port.map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}{port} (Service {})", s.dns_name(), s.key())
        }
        None => match service_key(e) {
            Some(key) => format!("Service {key} by its cluster DNS name or ClusterIP"),
            None => "the Service by its cluster DNS name \
                     (<name>.<namespace>.svc.cluster.local) or ClusterIP"
                .to_string(),
        },
    };
    format!(
        "{caller}all {target} instead of the LB address {lb}: the call then stays in the \
         cluster and cannot loop through the LB; if callers are tied to a domain name, rewrite \
         that name in cluster DNS (CoreDNS rewrite) to the Service or to an in-cluster ingress \
         controller."
    )
}

/// One sentence when the node's rules and the API disagree on the policy.
pub(in crate::correlate) fn mismatch(e: &LoopbackEvent) -> Option<String> {
    let (rules, api) = e.facts.etp_mismatch()?;
    Some(format!(
        "This node's kube-proxy rules apply externalTrafficPolicy: {} while the API says {} \
         for {}: kube-proxy here has not caught up with the Service (check its sync and \
         logs); the remedies follow what the rules do.",
        rules.as_str(),
        api.as_str(),
        service_key(e).unwrap_or_else(|| "the Service".into())
    ))
}

/// The owner in a parenthesis.
pub(in crate::correlate) fn owner_short(owner: Option<&AddressOwner>) -> String {
    match owner {
        Some(AddressOwner::VipInterface { iface }) => format!("bound on {iface}"),
        Some(AddressOwner::Interface {
            iface,
            announcer: Some(a),
        }) => format!("held on {iface} by {}", a.who()),
        Some(AddressOwner::Interface {
            iface,
            announcer: None,
        }) => format!("an address on {iface}"),
        Some(AddressOwner::LocalRoute {
            protocol,
            protocol_name,
            ..
        }) => format!("a local route, protocol {protocol} {protocol_name}"),
        None => "a local address".to_string(),
    }
}

pub(in crate::correlate) fn unserved_options(
    vip: IpAddr,
    port: u16,
    proto: Proto,
    owner: Option<&str>,
    facts: &Facts,
    from: &str,
) -> Vec<String> {
    let user = owner.map_or_else(|| "a Service".to_string(), |o| format!("Service {o}"));
    let refusal = match proto {
        _ if facts.access_filtered => {
            "rejects it: kube-proxy's KUBE-IPVS-FILTER answers with ICMP port unreachable \
             (connection refused)"
        }
        Proto::Udp => "answers with ICMP port unreachable",
        _ => "answers with a TCP RST (connection refused)",
    };
    let mut out = vec![
        format!(
            "Cause: {vip} is {} and {user} uses it on other ports, so calls from {from} to {} \
             never leave the node and never reach the LB listener; nothing here serves port \
             {port}/{}, so the kernel {refusal}.",
            bound(vip, facts.owner.as_ref()),
            sock(vip, port),
            proto.as_str()
        ),
        format!("If port {port} belongs to the cluster, add it to the Service's ports."),
        "If the listener belongs to something outside the cluster, give it its own LB or \
         address, separate from the one the Service uses."
            .to_string(),
    ];
    out.push(unbind(vip, facts));
    out
}
