//! Remedies, one option a line, specific to the confirmed cause. Written from the vendor
//! notes in `shared/reference/` (summarized, not quoted).

use std::net::IpAddr;

use super::report::{Layer, Outcome, sock};
use crate::{event::Proto, state::ServiceSource};

/// LB health checks from the VIP, dropped because the VIP is a local address.
pub(crate) fn healthcheck_blackhole(vip: IpAddr, node_port: u16) -> Vec<String> {
    vec![
        format!(
            "Cause: the LB health-checks this node from its own VIP {vip}, and {vip} is bound on \
             kube-ipvs0 here (kube-proxy in IPVS mode binds LoadBalancer ingress IPs so in-cluster \
             calls short-circuit), so the kernel discards every check to NodePort {node_port} as a \
             packet with a local (martian) source."
        ),
        "Have the LB send health checks from a source range that is not a VIP (a provider \
         option: a dedicated health-check source range, e.g. turned on together with the \
         provider's prevent-loopback Service annotation)."
            .to_string(),
        "Or stop binding the LB ingress IP on kube-ipvs0 (a kube-proxy build or Service \
         annotation that publishes the LB as a hostname / skips the local binding, or \
         status.loadBalancer.ingress[].ipMode: Proxy on Kubernetes versions that support it); \
         in-cluster calls to the VIP then really go to the LB, so check for hairpin loopback \
         afterwards."
            .to_string(),
        "Do not read the LB's health status as fine: when every check fails the LB treats all \
         backends as alive, which hides this until a backend really fails and still gets \
         traffic."
            .to_string(),
    ]
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
) -> Vec<String> {
    let owner = owner.map_or_else(|| "a Service".to_string(), str::to_string);
    let refusal = match proto {
        _ if filtered => {
            "rejects it: kube-proxy's KUBE-IPVS-FILTER answers with ICMP port unreachable \
             (connection refused)"
        }
        Proto::Udp => "answers with ICMP port unreachable",
        _ => "answers with a TCP RST (connection refused)",
    };
    vec![
        format!(
            "Cause: {vip} is bound on kube-ipvs0 because {owner} uses it on other ports, so calls from this node \
             or its pods to {} never leave the node and never reach the LB listener; nothing \
             here serves port {port}/{}, so the kernel {refusal}.",
            sock(vip, port),
            proto.as_str()
        ),
        format!("If port {port} belongs to the cluster, add it to the Service's ports."),
        "If the listener belongs to something outside the cluster, give it its own LB or \
         address, separate from the one the Service uses."
            .to_string(),
        "Or keep kube-proxy from binding the LB address locally (provider annotation that \
         publishes a hostname instead of the IP, or ipMode: Proxy), which sends in-cluster \
         calls to the real LB and can then hairpin; or have in-cluster callers use another \
         address for that listener."
            .to_string(),
    ]
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
    vec![
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
    ]
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

/// A pod's call to its own Service came back to it unSNATed: the remedy names the piece the
/// drop site and the node's state say is missing (`self_loop::missing_piece`).
pub(crate) fn service_self_loop(
    pod: IpAddr,
    port: u16,
    service: Option<&str>,
    missing: &super::self_loop::Missing,
    source: Option<ServiceSource>,
) -> Vec<String> {
    use super::self_loop::Missing;
    let svc = service.unwrap_or("its Service");
    let how = match missing {
        Missing::HairpinMode { .. } => {
            "kube-proxy's DNAT ran while the frame was bridged (br_netfilter), and the bridge \
             dropped it rather than send it back out the port it came in on"
        }
        _ => {
            "the hairpin SNAT that lets a pod reach itself through a Service did not happen, so \
             the call came back with the pod's own address as source and the pod dropped it"
        }
    };
    let mut out = vec![format!(
        "Cause: pod {pod} called {svc} and the endpoint chosen was the pod itself ({}); {how}. \
         Calls that pick another endpoint work, so it looks intermittent.",
        sock(pod, port)
    )];
    match missing {
        Missing::HairpinSnat {
            loop_back_entry: Some(false),
        } => out.push(format!(
            "Missing here: the KUBE-LOOP-BACK ipset entry {pod},tcp/udp:{port},{pod} (kube-proxy \
             IPVS mode masquerades an endpoint's call to itself through it). kube-proxy 1.31 \
             can drop these entries (kubernetes#134884): upgrade kube-proxy to a release with \
             the fix, or restart it to rewrite its ipsets."
        )),
        Missing::HairpinSnat {
            loop_back_entry: Some(true),
        } => out.push(
            "Missing here: the masquerade itself; KUBE-LOOP-BACK holds the entry but the \
             packet was not masqueraded: check that KUBE-POSTROUTING still has kube-proxy's \
             `--match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE` rule (something else may \
             have flushed the nat table)."
                .to_string(),
        ),
        Missing::HairpinSnat {
            loop_back_entry: None,
        } => out.push(format!(
            "Missing here: kube-proxy's masquerade mark for an endpoint calling itself ({}), or \
             the masquerade it feeds: restart kube-proxy to rewrite its rules, and check that no \
             other agent removes them.",
            self_masq_rule(pod, source)
        )),
        Missing::HairpinMode { bridge, port, .. } => out.push(format!(
            "Missing here: hairpin mode on {bridge} port {port}. Run the kubelet with \
             --hairpin-mode=hairpin-veth (or promiscuous-bridge) and give it write access to \
             /sys, or set `hairpinMode: true` in the bridge CNI's config; now: \
             `echo 1 > /sys/class/net/{bridge}/brif/{port}/hairpin_mode`."
        )),
        Missing::Undetermined => out.push(
            "Which piece is missing was not determined: check the kubelet's hairpin mode on the \
             pod's bridge port, kube-proxy's masquerade for endpoints calling themselves \
             (KUBE-LOOP-BACK in IPVS mode), and br_netfilter."
                .to_string(),
        ),
    }
    out.push(
        "Or avoid the self-call: let the pod call itself on localhost, not through its Service."
            .to_string(),
    );
    out
}

/// `ip:port`, with brackets for IPv6 (for `probe check`).
pub(crate) fn sock_of(ip: IpAddr, port: u16) -> String {
    sock(ip, port)
}

/// kube-proxy's rule that marks an endpoint's call to itself for masquerade, in the mode the
/// service table came from (both spellings when unknown).
pub(crate) fn self_masq_rule(pod: IpAddr, source: Option<ServiceSource>) -> String {
    let iptables = format!("iptables mode: KUBE-SEP-* `-s {pod}/32 -j KUBE-MARK-MASQ`");
    let nftables =
        format!("nftables mode: `ip saddr {pod} jump mark-for-masquerade` in the endpoint chain");
    match source {
        Some(ServiceSource::Iptables) => iptables,
        Some(ServiceSource::Nftables) => nftables,
        // The set was not readable (no `ipset` here): name the entry to look for.
        Some(ServiceSource::Ipvs) => {
            format!("IPVS mode: the ipset KUBE-LOOP-BACK entry {pod},<proto>:<port>,{pod}")
        }
        None => format!("{iptables}; {nftables}"),
    }
}
