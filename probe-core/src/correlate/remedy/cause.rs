//! The loop's cause in one sentence, per kind: the first words of its Kubernetes Event's note
//! (the agent's `sink::kube_event_doc`), beside the remedies it leads to.

use probe_contract::{LoopbackEvent, facts::SourceKind, sock};

/// The cause of `event`, in one sentence (before attribution's names: addresses only): its
/// kind's own (`super::super::KIND_TEXTS`).
pub fn cause(event: &LoopbackEvent) -> String {
    (super::super::kind_texts(event.kind).cause)(event)
}

/// The addresses a cause sentence names: the VIP (with its port when known), the protocol,
/// the destination.
pub(in crate::correlate) struct CauseAddresses {
    pub vip: String,
    pub proto: &'static str,
    pub dst: String,
}

impl CauseAddresses {
    pub(in crate::correlate) fn of(event: &LoopbackEvent) -> CauseAddresses {
        let vip = event
            .vip
            .map(|v| match event.vip_port {
                Some(p) => sock(v, p),
                None => v.to_string(),
            })
            .unwrap_or_else(|| "the LB VIP".to_string());
        CauseAddresses {
            vip,
            proto: event.proto.as_str(),
            dst: sock(event.dst, event.dst_port),
        }
    }
}

/// `service_self_loop`'s cause.
pub(in crate::correlate) fn service_self_loop(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, .. } = CauseAddresses::of(event);
    format!(
        "Pod {} called its own Service at {vip}/{proto} and was picked as the endpoint; without the hairpin SNAT the call came back with its own address as source and was dropped.",
        event.src
    )
}

/// A hairpin's cause: who called (a pod, or the node itself: a host-network caller) and what
/// the LB sent the call back to (a host listener by its process or pod, else the node).
pub(in crate::correlate) fn hairpin(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, dst } = CauseAddresses::of(event);
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
