//! `hairpin`'s remedy, from the event's facts, and its cause sentence.

use std::net::IpAddr;

use probe_contract::{
    Layer, LoopbackEvent, Outcome,
    facts::{Etp, SourceKind},
    sock,
};

use crate::correlate::remedy::{cause::CauseAddresses, sentences::*};

/// `hairpin`'s remedy.
pub(in crate::correlate) fn remedy(e: &LoopbackEvent) -> Vec<String> {
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

/// A hairpin's cause: who called (a pod, or the node itself: a host-network caller) and what
/// the LB sent the call back to (a host listener by its process or pod, else the node).
pub(in crate::correlate) fn cause(event: &LoopbackEvent) -> String {
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
