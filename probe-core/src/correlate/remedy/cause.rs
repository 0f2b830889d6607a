//! The loop's cause in one sentence, per kind: the first words of its Kubernetes Event's note
//! (the agent's `sink::kube_event_doc`), beside the remedies it leads to.

use probe_contract::{LoopbackEvent, LoopbackKind, facts::SourceKind, sock};

/// The cause of `event`, in one sentence (before attribution's names: addresses only).
pub fn cause(event: &LoopbackEvent) -> String {
    let vip = event
        .vip
        .map(|v| match event.vip_port {
            Some(p) => sock(v, p),
            None => v.to_string(),
        })
        .unwrap_or_else(|| "the LB VIP".to_string());
    let proto = event.proto.as_str();
    let dst = sock(event.dst, event.dst_port);
    match event.kind {
        LoopbackKind::HealthcheckBlackhole => format!(
            "The load balancer's health checks from {vip} to {dst}/{proto} are dropped: the VIP is bound on this node, so the kernel drops them as a local source."
        ),
        LoopbackKind::Hairpin => hairpin_cause(event, &vip, proto, &dst),
        LoopbackKind::VipPortUnserved => format!(
            "{vip}/{proto} is bound on this node but nothing serves that port: calls from {} are refused locally instead of reaching the load balancer.",
            event.src
        ),
        LoopbackKind::VipAsSource => format!(
            "A packet with the LB VIP {} as its source left this node for {dst}/{proto} without SNAT: a host-network call to the LB IP, forwarded to another node.",
            event.src
        ),
        LoopbackKind::EtpLocalDrop => format!(
            "kube-proxy dropped a call from {} to {vip}/{proto}: an externalTrafficPolicy Local Service without an endpoint on this node, in nftables mode.",
            event.src
        ),
        LoopbackKind::ProxyProtocolShortCircuit => format!(
            "{} called {vip}/{proto}, whose load balancer adds a PROXY protocol header; kube-proxy short-circuited it to {dst} on this node, so it arrived without the header and was reset.",
            event.src
        ),
        LoopbackKind::ServiceSelfLoop => format!(
            "Pod {} called its own Service at {vip}/{proto} and was picked as the endpoint; without the hairpin SNAT the call came back with its own address as source and was dropped.",
            event.src
        ),
    }
}

/// A hairpin's cause: who called (a pod, or the node itself: a host-network caller) and what
/// the LB sent the call back to (a host listener by its process or pod, else the node).
fn hairpin_cause(event: &LoopbackEvent, vip: &str, proto: &str, dst: &str) -> String {
    let from_node = event.facts.source == SourceKind::Node;
    let caller = if from_node {
        format!("This node ({})", event.src)
    } else {
        format!("Pod {}", event.src)
    };
    let target = match &event.listener {
        Some(l) => match (&l.pod, &l.process) {
            (Some(pod), _) => format!("host-network pod {pod} on this node ({dst})"),
            (None, Some(process)) => format!("host process {process} on this node ({dst})"),
            (None, None) => format!("a host-network listener on this node ({dst})"),
        },
        None => format!("this node ({dst})"),
    };
    if from_node {
        format!(
            "{caller} called the load balancer at {vip}/{proto}; the LB sent it back to {target} with the node's own address as source, so the kernel drops it as a local source."
        )
    } else {
        format!(
            "{caller} called the load balancer at {vip}/{proto} without SNAT; the LB sent it back to {target} and the reply cannot reach the pod."
        )
    }
}
