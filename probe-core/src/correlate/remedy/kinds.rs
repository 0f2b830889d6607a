//! The remedy of each kind, from the event's facts ([`build`]); `service_self_loop`'s is in
//! `self_loop.rs`.

use std::net::IpAddr;

use super::{self_loop::service_self_loop, sentences::*};
use probe_contract::{
    Layer, LoopbackEvent, LoopbackKind, Outcome, Proto,
    facts::{AddressOwner, Etp, Facts, SourceKind, VipSourceSide},
    sock,
};

/// The remedy of a confirmed event, from its facts (the correlator's, and after attribution
/// the API's too).
pub fn build(e: &LoopbackEvent) -> Vec<String> {
    match e.kind {
        LoopbackKind::HealthcheckBlackhole => healthcheck(e),
        LoopbackKind::Hairpin => hairpin(e),
        LoopbackKind::VipPortUnserved => unserved(e),
        LoopbackKind::VipAsSource => vip_as_source(e),
        LoopbackKind::ServiceSelfLoop => service_self_loop(e),
        LoopbackKind::EtpLocalDrop => etp_local_drop(e),
        LoopbackKind::ProxyProtocolShortCircuit => proxy_protocol(e),
    }
}

/// kube-proxy's nftables `no-endpoint-services` drop of a call to an ETP Local Service's LB
/// IP (kubernetes#131765). The version range: nftables mode exists since 1.29 (alpha; beta
/// 1.31, GA 1.33, KEP-3866); kubernetes#132456 moved the filter chains after DNAT (1.34) and
/// was cherry-picked to 1.33 only (#133969, merged 2025-09-09; no 1.32/1.31 cherry-pick found).
/// A pod's call is also dropped by a fixed kube-proxy without a local-traffic detector (no
/// "short-circuit pod traffic" rule in the external chain: `proxier.localDetector
/// .IsImplemented()` in `pkg/proxy/nftables/proxier.go`).
fn etp_local_drop(e: &LoopbackEvent) -> Vec<String> {
    let at = sock(e.vip.unwrap_or(e.dst), e.vip_port.unwrap_or(e.dst_port));
    let proto = e.proto.as_str();
    let svc = service_key(e)
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    // Who called, and what happened to the call (`probe check`'s risk has no caller yet).
    let (caller, fate) = match e.facts.source {
        SourceKind::Node => (
            "a host-network caller on this node called".to_string(),
            "dropped the call before it reached",
        ),
        SourceKind::Unknown => (
            "this node's pods (and, before kubernetes#132456, its host-network callers) call"
                .to_string(),
            "drop such calls before they reach",
        ),
        _ => (
            format!("the pod {} called", e.src),
            "dropped the call before it reached",
        ),
    };
    let mut out = vec![format!(
        "Cause: {caller} {at}/{proto}, an LB IP of {svc}, which kube-proxy here handles as \
         externalTrafficPolicy Local without an endpoint on this node: in nftables mode it \
         writes that IP:port into its map no-endpoint-services with verdict drop, and its \
         filter chains {fate} an endpoint on another node \
         (kubernetes#131765). In iptables and IPVS mode kube-proxy sends a pod's such call to \
         the cluster-wide endpoints only when its local-traffic detector matches the pod \
         (kubernetes#112820: a pod outside it is dropped there too). Affected: kube-proxy 1.29 to 1.32 in nftables mode, and 1.33 \
         before the cherry-pick of kubernetes#132456 (#133969); and, for pod calls, any \
         release whose kube-proxy has no local-traffic detector."
    )];
    out.extend(mismatch(e));
    out.push(
        "Upgrade kube-proxy to a release with kubernetes#132456 (1.34, or a 1.33 patch release \
         with #133969), and give it a local-traffic detector (--detect-local-mode ClusterCIDR \
         with --cluster-cidr, or NodeCIDR, BridgeInterface, InterfaceNamePrefix; in \
         nftables mode the BridgeInterface and InterfaceNamePrefix detectors work only from \
         1.33.6, 1.34.2 and 1.35, kubernetes#134024) so that pod calls to the LB IP are \
         short-circuited to the cluster-wide endpoints."
            .to_string(),
    );
    if e.facts.etp() != Some(Etp::Cluster) {
        out.push(format!(
            "Or set externalTrafficPolicy: Cluster on {svc} (kube-proxy then writes no drop for \
             its LB IP; backends no longer see client source IPs)."
        ));
    }
    out.push(format!(
        "Or run an endpoint of {svc} on every node whose pods call {at} (a DaemonSet or a \
         topology spread), or have callers use the Service's cluster DNS name or ClusterIP."
    ));
    out
}

/// `proxy_protocol_short_circuit`: the call never passed the LB that adds the header.
fn proxy_protocol(e: &LoopbackEvent) -> Vec<String> {
    let lb = e
        .vip
        .zip(e.vip_port)
        .map_or_else(|| "the LB IP".to_string(), |(ip, port)| sock(ip, port));
    let svc = service_key(e).unwrap_or_else(|| "the Service".to_string());
    vec![
        format!(
            "Cause: {} called {lb}, whose LB sends a PROXY protocol header to {svc}'s backends; \
             kube-proxy short-circuits that IP on the node, so the call went straight to {} \
             without the header and the backend reset it (\"broken header\", \
             kubernetes/ingress-nginx#9643).",
            e.src,
            sock(e.dst, e.dst_port)
        ),
        format!(
            "Call {svc} from inside the cluster by its cluster DNS name or ClusterIP, sending \
             the PROXY protocol header yourself when the backend requires it on every \
             connection."
        ),
        "Or make in-cluster calls go through the LB: the provider's hostname annotation \
         (Hetzner load-balancer.hetzner.cloud/hostname, OpenStack \
         loadbalancer.openstack.org/hostname, DigitalOcean \
         service.beta.kubernetes.io/do-loadbalancer-hostname: kubernetes/ingress-nginx#3996, \
         Alibaba service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname) or ipMode: \
         Proxy on the ingress (Kubernetes >= 1.30), so kube-proxy writes no rule for the IP."
            .to_string(),
    ]
}

fn healthcheck(e: &LoopbackEvent) -> Vec<String> {
    let vip = e.vip.unwrap_or(e.src);
    let f = &e.facts;
    let checked = match (
        f.service.as_ref().and_then(|s| s.health_check_node_port),
        f.etp(),
    ) {
        (Some(hc), Some(Etp::Local)) if hc == e.dst_port => {
            format!("its healthCheckNodePort {hc} (externalTrafficPolicy: Local)")
        }
        (_, Some(Etp::Cluster)) => format!(
            "NodePort {} (externalTrafficPolicy: Cluster: the LB checks the traffic port)",
            e.dst_port
        ),
        _ => format!("port {}", e.dst_port),
    };
    let mut out = vec![format!(
        "Cause: the LB{} health-checks this node from its own VIP {vip} on {checked}, and {vip} \
         is {}, so the kernel discards every check as a packet with a local (martian) source.",
        service_key(e)
            .map(|k| format!(" of Service {k}"))
            .unwrap_or_default(),
        bound(vip, f.owner.as_ref()),
    )];
    out.extend(mismatch(e));
    out.push(
        "Have the LB send health checks from a source range that is not a VIP (a provider \
         option: a dedicated health-check source range, e.g. turned on together with the \
         provider's prevent-loopback Service annotation)."
            .to_string(),
    );
    out.push(unbind(vip, f));
    out.push(
        "Do not read the LB's health status as fine: when every check fails the LB treats all \
         backends as alive, which hides this until a backend really fails and still gets \
         traffic."
            .to_string(),
    );
    out
}

fn hairpin(e: &LoopbackEvent) -> Vec<String> {
    let f = &e.facts;
    if f.host_listener {
        return host_listener_hairpin(e);
    }
    let vip = e.vip.unwrap_or(e.dst);
    let node_sourced = f.source == SourceKind::Node;
    let mut out = vec![hairpin_cause(e, vip, node_sourced)];
    out.extend(mismatch(e));
    // The NodePort's policy matters for a pod's call only: it decides whether kube-proxy
    // masquerades it. A node-sourced call already carries the node's address, and an LB that
    // targets pods ignores the policy.
    if !node_sourced && !f.lb_targets_pod && f.etp() == Some(Etp::Local) {
        out.extend(etp_local_hairpin(e));
    }
    out.push(call_in_cluster(e, vip, e.vip_port));
    out.push(hairpin_snat(node_sourced, f.masquerade_rules));
    out.push(
        "Or make the LB source-NAT toward backends (layer 7: the LB's SNAT/keepalive option, \
         client IP then in X-Forwarded-For), or enable the provider's prevent-loopback option."
            .to_string(),
    );
    if f.lb_targets_pod {
        out.push(
            "The LB targets pods directly (no NodePort): externalTrafficPolicy does not change \
             its choice of backend; keep callers off the nodes that host the Service's pods \
             (pod anti-affinity)."
                .to_string(),
        );
    }
    out.push(hairpin_symptom(e.layer));
    if !node_sourced
        && e.outcome == Outcome::Dropped
        && e.drop_reason.as_deref() == Some("IP_RPFILTER")
    {
        out.push(
            "Relaxing rp_filter does not fix this: the packet would then reach the backend and \
             the pod would reset the asymmetric reply instead."
                .to_string(),
        );
    }
    out
}

/// How the call came back to this node: from the node itself (a martian source) or from a
/// pod that left unSNATed.
fn hairpin_cause(e: &LoopbackEvent, vip: IpAddr, node_sourced: bool) -> String {
    let at = sock(vip, e.vip_port.unwrap_or(e.dst_port));
    let target = if e.facts.lb_targets_pod {
        format!("the local pod {} directly", sock(e.dst, e.dst_port))
    } else {
        format!("this same node ({})", sock(e.dst, e.dst_port))
    };
    if node_sourced {
        format!(
            "Cause: {} (a host-network client, or pod traffic masqueraded to the node IP) \
             called the LB at {at}; the LB keeps the client address and picked {target} as \
             backend, so the request came back with the node's own address as source and the \
             kernel discards it as a local (martian) source.",
            sender(e)
        )
    } else {
        format!(
            "Cause: {} called the LB at {at} and left the node without SNAT; the LB keeps the \
             client address and picked {target} as backend, so the request looped back and the \
             reply cannot return through the LB.",
            sender(e)
        )
    }
}

/// The `kubectl patch` body that sets externalTrafficPolicy: Cluster, shell-quoted.
const ETP_CLUSTER_PATCH: &str = r#"'{"spec":{"externalTrafficPolicy":"Cluster"}}'"#;

/// A pod's call through a NodePort under externalTrafficPolicy: Local: why it left
/// unmasqueraded, and the two ways out.
fn etp_local_hairpin(e: &LoopbackEvent) -> [String; 3] {
    let svc_name = service_key(e).unwrap_or_else(|| "the Service".into());
    let patch = e
        .facts
        .service
        .as_ref()
        .map(|s| {
            format!(
                ": kubectl -n {} patch service {} -p {ETP_CLUSTER_PATCH}",
                s.namespace, s.name
            )
        })
        .unwrap_or_default();
    [
        format!(
            "NodePort {} ({svc_name}) uses externalTrafficPolicy: Local; its Local rules on this \
             node let pod traffic to the LB leave unmasqueraded, which is why the pod address \
             reached the LB (under Cluster policy the same call is SNATed and the LB avoids the \
             calling node).",
            e.dst_port
        ),
        format!(
            "Set externalTrafficPolicy: Cluster on {svc_name} if the client source IP need not \
             be preserved{patch}."
        ),
        format!(
            "Or keep Local and add pod anti-affinity so callers never run on a node hosting \
             {svc_name}'s backends (with Local the LB only sends to nodes that have backends)."
        ),
    ]
}

/// Whether SNAT to the node IP avoids the loop: not for a call that already is the node's.
fn hairpin_snat(node_sourced: bool, masquerade_rules: usize) -> String {
    if node_sourced {
        "SNAT to the node IP does not avoid this one: the source already is the node. The \
         LB's guard against sending a request back to its source node avoids it where the \
         LB has it; this LB did not apply it (a listener or LB type without that guard)."
            .to_string()
    } else {
        format!(
            "Masquerade (SNAT) pod traffic to the LB to the node IP ({masquerade_rules} \
             masquerade rule(s) found on this node): the LB then sees the node as the source \
             and will not send the request back to it."
        )
    }
}

/// What the caller sees, by the LB's layer.
fn hairpin_symptom(layer: Option<Layer>) -> String {
    match layer {
        Some(Layer::L7) => "Symptom to expect (layer 7): the LB gives up on this node after \
                            about 4 s and retries another one, so requests are slow rather than \
                            failed; on a one-node cluster they fail."
            .to_string(),
        _ => "Symptom to expect (layer 4): the LB does not retry another node, so connections \
              hang or break intermittently; on a one-node cluster they always fail."
            .to_string(),
    }
}

fn unserved(e: &LoopbackEvent) -> Vec<String> {
    let vip = e.vip.unwrap_or(e.dst);
    let port = e.vip_port.unwrap_or(e.dst_port);
    if e.facts.kube_proxy_lags {
        return not_programmed(e, vip, port);
    }
    let from = match e.facts.source {
        SourceKind::Pod | SourceKind::Node => sender(e),
        _ => "this node or its pods".to_string(),
    };
    let mut out = unserved_options(
        vip,
        port,
        e.proto,
        service_key(e).as_deref(),
        &e.facts,
        &from,
    );
    if let Some(s) = &e.facts.service
        && !s.ports.is_empty()
    {
        // The named form of "add it to the Service's ports": which ones it has.
        out[1] = format!(
            "Service {} serves {} only on {vip}: call {} on one of those ports, or, if port \
             {port} belongs to the cluster, add it to the Service's ports.",
            s.key(),
            s.ports.join(", "),
            s.dns_name()
        );
    }
    out
}

/// The API's Service serves the port and this node's kube-proxy has not programmed it (metric
/// names: kubernetes/kubernetes pkg/proxy/metrics/metrics.go): the
/// Service is right, kube-proxy is what to look at (changing the Service or the LB would
/// move nothing).
fn not_programmed(e: &LoopbackEvent, vip: IpAddr, port: u16) -> Vec<String> {
    let svc = service_key(e)
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    vec![
        format!(
            "Cause: {svc} serves {}/{} in the API, but kube-proxy on this node has not \
             programmed it: calls to it from this node and its pods are refused while the LB \
             still reaches other nodes. kube-proxy lags the API or its last sync failed.",
            sock(vip, port),
            e.proto.as_str()
        ),
        "Look at kube-proxy on this node: its log (sync errors), its metrics \
         `kubeproxy_sync_proxy_rules_last_timestamp_seconds` (stale) and \
         `kubeproxy_sync_proxy_rules_iptables_restore_failures_total` / \
         `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`, and its /healthz."
            .to_string(),
        "If it is stuck, restart the kube-proxy pod on this node; it re-programs every Service \
         at start. Do not change the Service or the LB: they are right."
            .to_string(),
    ]
}

pub(super) fn unserved_options(
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

fn vip_as_source(e: &LoopbackEvent) -> Vec<String> {
    let f = &e.facts;
    let vip = e.vip.unwrap_or(e.src);
    let to = sock(e.dst, e.dst_port);
    let svc = service_key(e)
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    // Why IPVS forwarded the call without SNAT, as far as the facts say.
    let why = match f.etp() {
        Some(Etp::Local) => format!(
            "{svc} has externalTrafficPolicy: Local and the calling node has no local endpoint, \
             so IPVS forwarded the call without SNAT"
        ),
        Some(Etp::Cluster) => format!(
            "{svc} has externalTrafficPolicy: Cluster, under which kube-proxy masquerades a \
             forwarded call, yet IPVS forwarded this one without SNAT (the calling node's \
             masquerade rules did not match it)"
        ),
        None => "IPVS forwarded the call without SNAT (kube-proxy does so under \
                 externalTrafficPolicy: Local when the calling node has no local endpoint)"
            .to_string(),
    };
    let cause = match f.side.unwrap_or(VipSourceSide::Receiving) {
        VipSourceSide::Receiving => format!(
            "Cause: a host-network caller on another node called the LB IP {vip}; {vip} is a \
             local address there, so the kernel picked {vip} itself as the source; {why} to {to} here; \
             this node has {vip} as a local address too ({}) and drops every packet from it as \
             a local (martian) source. The caller times out.",
            owner_short(f.owner.as_ref())
        ),
        VipSourceSide::Sending => format!(
            "Cause: a host-network caller on this node called the LB IP {vip}, a local address \
             here ({}), so the kernel picked {vip} itself as the source; {why} to {to} on \
             another node; that node has {vip} as a local address too and drops it as a local \
             (martian) source. The caller times out.",
            owner_short(f.owner.as_ref())
        ),
    };
    let mut out = vec![cause];
    // The story above is kube-proxy's; a VIP that something else made local here is that
    // owner's to remove.
    if let Some(owner @ (AddressOwner::Interface { .. } | AddressOwner::LocalRoute { .. })) =
        &f.owner
    {
        out.push(owner_fix(vip, owner));
    }
    out.extend(mismatch(e));
    out.push(call_in_cluster(e, vip, e.vip_port));
    out.push(
        "Or set internalTrafficPolicy / move such callers to nodes with a local endpoint, so \
         in-cluster calls are not forwarded to another node."
            .to_string(),
    );
    if f.etp() != Some(Etp::Cluster) {
        out.push(format!(
            "Or set externalTrafficPolicy: Cluster on {svc}: IPVS then masquerades the \
             forwarded call to the node IP (the client source IP is no longer preserved)."
        ));
    } else {
        out.push(
            "Check kube-proxy's masquerade rules on the calling node (KUBE-MARK-MASQ for the \
             LB IP, KUBE-POSTROUTING): under Cluster policy they SNAT this call."
                .to_string(),
        );
    }
    out
}

/// A hairpin to a host-network listener (a node address on a port that is no NodePort): no
/// Service rule is involved, so externalTrafficPolicy and NodePort fixes do not apply.
fn host_listener_hairpin(e: &LoopbackEvent) -> Vec<String> {
    let node_sourced = e.facts.source == SourceKind::Node;
    let what = e.listener.as_ref().map_or_else(
        || "a host-network listener".to_string(),
        |l| match (&l.pod, &l.process) {
            (Some(pod), _) => format!("host-network pod {pod}"),
            (None, Some(p)) => format!("host process {p}"),
            (None, None) => "a host-network listener".to_string(),
        },
    );
    let at = sock(e.dst, e.dst_port);
    let lb = sock(e.vip.unwrap_or(e.dst), e.vip_port.unwrap_or(e.dst_port));
    let cause = if node_sourced {
        format!(
            "Cause: {} called the LB at {lb}; the LB keeps the client address and sent the \
             connection to {what} on this same node ({at}, no NodePort: an instance target on \
             the node's own address), so it came back with the node's own address as source and \
             the kernel discards it as a local (martian) source.",
            sender(e)
        )
    } else {
        format!(
            "Cause: {} called the LB at {lb} and left the node without SNAT; the LB keeps the \
             client address and sent the connection to {what} on this same node ({at}, no \
             NodePort: an instance target on the node's own address), so the reply goes \
             straight to the pod, never back through the LB.",
            sender(e)
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
