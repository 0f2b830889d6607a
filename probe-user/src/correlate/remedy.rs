//! Remedies, one option a line, specific to the confirmed cause. Written from the vendor
//! notes in `shared/reference/` (summarized, not quoted).

use std::net::IpAddr;

use super::report::{Layer, Outcome, sock};
use crate::event::{Listener, LocalOwner, Proto};

/// Whether kube-proxy made the address local (bound on kube-ipvs0; unknown owners are taken
/// as kube-ipvs0, the case the remedies were first written for).
fn kube_proxy_owned(owner: Option<&LocalOwner>) -> bool {
    matches!(owner, None | Some(LocalOwner::VipInterface { .. }))
}

/// How `vip` is local here, as a phrase after "{vip} is".
fn how_local(owner: Option<&LocalOwner>) -> String {
    match owner {
        None | Some(LocalOwner::VipInterface { .. }) => "bound on kube-ipvs0 here".to_string(),
        Some(LocalOwner::Interface { iface }) => format!(
            "an address on {iface} here (a VIP that keepalived or kube-vip holds, or an address \
             of the node)"
        ),
        Some(o @ LocalOwner::LocalRoute { .. }) => format!("local here through {o}"),
    }
}

/// What removes a local address that kube-proxy did not make local: kube-proxy's settings,
/// the Service's ipMode or its annotations do not touch it. None for kube-ipvs0.
pub(crate) fn owner_fix(vip: IpAddr, owner: Option<&LocalOwner>) -> Option<String> {
    match owner? {
        LocalOwner::VipInterface { .. } => None,
        LocalOwner::LocalRoute { protocol: 66, .. } => Some(format!(
            "{vip} is made local by the cloud's guest agent (a route with protocol 66, no \
             address), not by kube-proxy: changing kube-proxy, ipMode or the Service does not \
             remove it. On GCE the google-guest-agent adds such routes for forwarding-rule IPs \
             targeting this instance: set `target_instance_ips = false` under [IpForwarding] (or \
             `ip_forwarding = false` under [NetworkInterfaces]) in \
             /etc/default/instance_configs.cfg and restart the agent, if nothing on the node \
             needs to accept traffic for {vip} itself."
        )),
        LocalOwner::LocalRoute {
            protocol,
            protocol_name,
            iface,
        } => Some(format!(
            "{vip} is made local by a `local` route of table local (proto {protocol} = \
             {protocol_name}{}), not by kube-proxy: changing kube-proxy or the Service does not \
             remove it. Remove it where it is configured (by hand: `ip route del local {vip} \
             table local`) if nothing on the node must accept traffic for {vip} itself.",
            iface
                .as_deref()
                .map(|i| format!(", dev {i}"))
                .unwrap_or_default()
        )),
        LocalOwner::Interface { iface } => Some(format!(
            "{vip} is an address on {iface}, not kube-proxy's binding: if keepalived or kube-vip \
             hold it as a VIP, keep that VIP off the nodes this LB targets (or the LB's checks \
             and calls off that VIP); kube-proxy settings and the Service's ipMode do not change \
             it."
        )),
    }
}

/// LB health checks from the VIP, dropped because the VIP is a local address.
pub(crate) fn healthcheck_blackhole(
    vip: IpAddr,
    node_port: u16,
    owner: Option<&LocalOwner>,
) -> Vec<String> {
    let why = if kube_proxy_owned(owner) {
        " (kube-proxy in IPVS mode binds LoadBalancer ingress IPs so in-cluster calls \
         short-circuit)"
    } else {
        ""
    };
    let mut out = vec![
        format!(
            "Cause: the LB health-checks this node from its own VIP {vip}, and {vip} is {}{why}, \
             so the kernel discards every check to NodePort {node_port} as a packet with a local \
             (martian) source.",
            how_local(owner)
        ),
        "Have the LB send health checks from a source range that is not a VIP (a provider \
         option: a dedicated health-check source range, e.g. turned on together with the \
         provider's prevent-loopback Service annotation)."
            .to_string(),
    ];
    out.push(owner_fix(vip, owner).unwrap_or_else(|| {
        "Or stop binding the LB ingress IP on kube-ipvs0 (a kube-proxy build or Service \
         annotation that publishes the LB as a hostname / skips the local binding, or \
         status.loadBalancer.ingress[].ipMode: Proxy on Kubernetes versions that support it); \
         in-cluster calls to the VIP then really go to the LB, so check for hairpin loopback \
         afterwards."
            .to_string()
    }));
    out.extend([
        "Do not read the LB's health status as fine: when every check fails the LB treats all \
         backends as alive, which hides this until a backend really fails and still gets \
         traffic."
            .to_string(),
    ]);
    out
}

/// Inputs that select the hairpin remedy.
pub(crate) struct HairpinCause<'a> {
    pub pod: IpAddr,
    pub vip: IpAddr,
    pub vip_port: u16,
    pub node: IpAddr,
    pub node_port: u16,
    pub layer: Layer,
    pub outcome: Outcome,
    pub drop_reason: Option<&'a str>,
    /// The NodePort has `externalTrafficPolicy: Local` rules.
    pub local_only: bool,
    pub service: Option<&'a str>,
    pub masquerade_rules: usize,
}

/// A pod's un-SNATed call to the LB VIP that the LB sent back to the same node.
pub(crate) fn hairpin(c: &HairpinCause<'_>) -> Vec<String> {
    let svc = c.service.unwrap_or("the Service");
    let mut out = vec![format!(
        "Cause: pod {} called the LB at {} and left the node without SNAT; the LB keeps the \
         client address and picked this same node ({}) as backend, so the request looped back \
         and the reply cannot return through the LB.",
        c.pod,
        sock(c.vip, c.vip_port),
        sock(c.node, c.node_port)
    )];
    if c.local_only {
        out.push(format!(
            "NodePort {} ({svc}) uses externalTrafficPolicy: Local; its Local rules on this node \
             let pod traffic to the LB leave unmasqueraded, which is why the pod address reached \
             the LB (the same call from a cluster using Cluster policy is SNATed and the LB avoids \
             the calling node).",
            c.node_port
        ));
        out.push(format!(
            "Set externalTrafficPolicy: Cluster on {svc} if the client source IP need not be \
             preserved."
        ));
        out.push(format!(
            "Or keep Local and add pod anti-affinity so callers never run on a node hosting \
             {svc}'s backends (with Local the LB only sends to nodes that have backends)."
        ));
    }
    out.push(format!(
        "Call {svc} by its cluster DNS name (<name>.<namespace>.svc.cluster.local) or ClusterIP \
         instead of the LB VIP {}; if callers are tied to a domain name, rewrite that name in \
         cluster DNS (CoreDNS rewrite) to the Service or to an in-cluster ingress controller.",
        c.vip
    ));
    out.push(format!(
        "Masquerade (SNAT) pod traffic to the LB to the node IP ({} masquerade rule(s) found \
         on this node): the LB then sees the node as the source and will not send the request back \
         to it.",
        c.masquerade_rules
    ));
    out.push(
        "Or make the LB source-NAT toward backends (layer 7: the LB's SNAT/keepalive option, \
         client IP then in X-Forwarded-For), or enable the provider's prevent-loopback option."
            .to_string(),
    );
    out.push(match c.layer {
        Layer::L7 => "Symptom to expect (layer 7): the LB gives up on this node after about 4 s \
                      and retries another one, so requests are slow rather than failed; on a \
                      one-node cluster they fail."
            .to_string(),
        Layer::L4 => "Symptom to expect (layer 4): the LB does not retry another node, so \
                      connections hang or break intermittently; on a one-node cluster they \
                      always fail."
            .to_string(),
    });
    if c.outcome == Outcome::Dropped && c.drop_reason == Some("IP_RPFILTER") {
        out.push(
            "Relaxing rp_filter does not fix this: the packet would then reach the backend and \
             the pod would reset the asymmetric reply instead."
                .to_string(),
        );
    }
    out
}

/// A VIP bound on kube-ipvs0 called on a port nothing on the node serves.
pub(crate) fn vip_port_unserved(
    vip: IpAddr,
    port: u16,
    proto: Proto,
    owner: Option<&str>,
    filtered: bool,
    local_owner: Option<&LocalOwner>,
) -> Vec<String> {
    let owner = owner.map_or_else(|| "a Service".to_string(), str::to_string);
    let bound = if kube_proxy_owned(local_owner) {
        format!("bound on kube-ipvs0 because {owner} uses it on other ports")
    } else {
        how_local(local_owner)
    };
    let refusal = match proto {
        _ if filtered => {
            "rejects it: kube-proxy's KUBE-IPVS-FILTER answers with ICMP port unreachable \
             (connection refused)"
        }
        Proto::Udp => "answers with ICMP port unreachable",
        _ => "answers with a TCP RST (connection refused)",
    };
    let mut out = vec![
        format!(
            "Cause: {vip} is {bound}, so calls from this node or its pods to {} never leave the \
             node and never reach the LB listener; nothing here serves port {port}/{}, so the \
             kernel {refusal}.",
            sock(vip, port),
            proto.as_str()
        ),
        format!("If port {port} belongs to the cluster, add it to the Service's ports."),
        "If the listener belongs to something outside the cluster, give it its own LB or \
         address, separate from the one the Service uses."
            .to_string(),
    ];
    out.push(owner_fix(vip, local_owner).unwrap_or_else(|| {
        "Or keep kube-proxy from binding the LB address locally (provider annotation that \
         publishes a hostname instead of the IP, or ipMode: Proxy), which sends in-cluster \
         calls to the real LB and can then hairpin; or have in-cluster callers use another \
         address for that listener."
            .to_string()
    }));
    out
}

/// Which node saw a `vip_as_source` packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VipSourceSide {
    /// This node received it (and dropped it as a local source).
    Receiving,
    /// This node sent it (a SYN left a NIC with a bound VIP as source).
    Sending,
}

/// A packet sourced from a LB VIP, forwarded between nodes that both bind the VIP.
pub(crate) fn vip_as_source(
    vip: IpAddr,
    dst: IpAddr,
    dst_port: u16,
    side: VipSourceSide,
    owner: Option<&LocalOwner>,
) -> Vec<String> {
    let to = sock(dst, dst_port);
    let cause = match side {
        VipSourceSide::Receiving => format!(
            "Cause: another node called the LB IP {vip} from its host network; {vip} is bound on \
             that node's kube-ipvs0, so the kernel picked {vip} itself as the source; the Service \
             has externalTrafficPolicy: Local and that node has no local endpoint, so IPVS \
             forwarded the call to {to} here without SNAT; this node binds {vip} too and drops \
             every packet from it as a local (martian) source. The caller times out."
        ),
        VipSourceSide::Sending => format!(
            "Cause: a host-network caller on this node called the LB IP {vip}, which is bound on \
             kube-ipvs0 here, so the kernel picked {vip} itself as the source; the Service has \
             externalTrafficPolicy: Local and this node has no local endpoint, so IPVS \
             forwarded the call to {to} on another node without SNAT; that node binds {vip} \
             too and drops it as a local (martian) source. The caller times out."
        ),
    };
    let mut out = vec![
        cause,
        "Call the Service by its cluster DNS name or ClusterIP from inside the cluster, not the \
         LB IP (internal access to the LB IP is what picks the VIP as source)."
            .to_string(),
        "Or set internalTrafficPolicy / move such callers to nodes with a local endpoint, so \
         in-cluster calls are not forwarded to another node."
            .to_string(),
        "Or set externalTrafficPolicy: Cluster on the Service: IPVS then masquerades the \
         forwarded call to the node IP (the client source IP is no longer preserved)."
            .to_string(),
    ];
    // The story above is kube-proxy's; a VIP that something else made local here is that
    // owner's to remove.
    if let Some(fix) = owner_fix(vip, owner) {
        out.insert(1, fix);
    }
    out
}
/// A node-sourced loop: the node's own address called the LB, which kept it as source and
/// sent the request back to this node.
pub(crate) fn node_sourced_hairpin(node: IpAddr, vip: IpAddr, vip_port: u16) -> Vec<String> {
    vec![
        format!(
            "Cause: this node ({node}), a host-network client or pod traffic masqueraded to the \
             node IP, called the LB at {}; the LB keeps the client address and picked this same \
             node as backend, so the request came back with the node's own address as source \
             and the kernel discards it as a local (martian) source.",
            sock(vip, vip_port)
        ),
        "SNAT to the node IP does not avoid this one: the source already is the node. The LB's \
         guard against sending a request back to its source node avoids it where the LB has \
         it; this LB did not apply it (a listener or LB type without that guard)."
            .to_string(),
        format!(
            "Call the Service by its cluster DNS name or ClusterIP instead of the LB VIP {vip} \
             from host-network workloads and from this node."
        ),
        "Or make the LB source-NAT toward backends (layer 7: the LB's SNAT/keepalive option), \
         or enable the provider's prevent-loopback option."
            .to_string(),
    ]
}

/// The LB targets pods directly (VPC-CNI style): NodePort-level fixes do not apply.
pub(crate) fn lb_to_pod_hint() -> String {
    "The LB targets pods directly (no NodePort): externalTrafficPolicy does not change its \
     choice of backend; keep callers off the nodes that host the Service's pods (pod \
     anti-affinity), or call the Service in-cluster."
        .to_string()
}

/// A hairpin to a host-network listener (a node address on a port that is no NodePort): no
/// Service rule is involved, so externalTrafficPolicy and NodePort fixes do not apply.
pub(crate) fn host_listener_hairpin(
    src: IpAddr,
    node_sourced: bool,
    vip: IpAddr,
    vip_port: u16,
    node: IpAddr,
    port: u16,
    listener: Option<&Listener>,
) -> Vec<String> {
    let what = listener.map_or_else(
        || "a host-network listener".to_string(),
        |l| match (&l.pod, &l.process) {
            (Some(pod), _) => format!("host-network pod {pod}"),
            (None, Some(p)) => format!("host process {p}"),
            (None, None) => "a host-network listener".to_string(),
        },
    );
    let at = sock(node, port);
    let lb = sock(vip, vip_port);
    let cause = if node_sourced {
        format!(
            "Cause: this node ({src}) called the LB at {lb}; the LB keeps the client address and \
             sent the connection to {what} on this same node ({at}, no NodePort: an instance \
             target on the node's own address), so it came back with the node's own address as \
             source and the kernel discards it as a local (martian) source."
        )
    } else {
        format!(
            "Cause: pod {src} called the LB at {lb} and left the node without SNAT; the LB keeps \
             the client address and sent the connection to {what} on this same node ({at}, no \
             NodePort: an instance target on the node's own address), so the reply goes \
             straight to the pod, never back through the LB."
        )
    };
    vec![
        cause,
        format!(
            "Reach {what} without the LB from this node and its pods: its in-cluster Service \
             (for the API server: kubernetes.default.svc), or {at} directly from host-network \
             callers."
        ),
        "Or turn off client IP preservation for this LB listener's instance targets (AWS NLB: \
         target group attribute preserve_client_ip.enabled=false), or enable the provider's \
         prevent-loopback / hairpin option: the LB then answers the loop itself."
            .to_string(),
        if node_sourced {
            "SNAT to the node IP does not avoid this one: the source already is the node."
                .to_string()
        } else {
            "Masquerading pod egress to the node IP avoids it only where the LB never sends a \
             request back to its source node; otherwise the loop becomes node-sourced."
                .to_string()
        },
        "externalTrafficPolicy does not apply: no Service rule serves this port.".to_string(),
    ]
}
