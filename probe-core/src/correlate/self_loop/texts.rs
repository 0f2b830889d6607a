//! The `service_self_loop` remedy: the piece the drop site and the node's state say is
//! missing, in the rules of the node's kube-proxy mode.

use std::net::IpAddr;

use probe_contract::{LoopbackEvent, facts::ProxyMode, sock};

use crate::{
    correlate::remedy::{cause::CauseAddresses, sentences::service_key},
    state::ServiceSource,
};

/// A pod's call to its own Service came back to it unSNATed: the remedy names the piece the
/// drop site and the node's state say is missing (`facts.self_loop`, from
/// `self_loop::missing_piece`), in the rules of the node's kube-proxy mode.
pub(in crate::correlate) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    use probe_contract::facts::SelfLoopMissing as Missing;
    let (pod, port) = (e.src, e.dst_port);
    let missing = e.facts.self_loop.clone().unwrap_or(Missing::Undetermined);
    let missing = &missing;
    let source = e.facts.proxy_mode.map(service_source);
    let key = service_key(e);
    let svc = key
        .as_deref()
        .map_or_else(|| "its Service".to_string(), |k| format!("Service {k}"));
    let how = match missing {
        Missing::HairpinMode { .. } => {
            "the connection's NAT ran while the frame was bridged (br_netfilter: kube-proxy's \
             DNAT of the call, or in IPVS mode the un-NAT of the answer to a masqueraded call), \
             and the bridge dropped it rather than send it back out the port it came in on"
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
    if let Some(k) = &key {
        out.push(format!(
            "{} is an endpoint of Service {k} and called it: every call that picks itself as \
             the endpoint fails until the hairpin is fixed; the others work, so it looks \
             intermittent.",
            e.client_pod
                .as_deref()
                .map_or_else(|| format!("Pod {pod}"), |c| format!("Pod {c}"))
        ));
    }
    out.push(
        "Or avoid the self-call: let the pod call itself on localhost, not through its Service."
            .to_string(),
    );
    out
}

fn service_source(mode: ProxyMode) -> ServiceSource {
    match mode {
        ProxyMode::Ipvs => ServiceSource::Ipvs,
        ProxyMode::Iptables => ServiceSource::Iptables,
        ProxyMode::Nftables => ServiceSource::Nftables,
    }
}

/// kube-proxy's rule that marks an endpoint's call to itself for masquerade, in the mode the
/// service table came from (both spellings when unknown).
pub fn self_masq_rule(pod: IpAddr, source: Option<ServiceSource>) -> String {
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

/// `service_self_loop`'s cause.
pub(in crate::correlate) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, .. } = CauseAddresses::of(event);
    format!(
        "Pod {} called its own Service at {vip}/{proto} and was picked as the endpoint; without the hairpin SNAT the call came back with its own address as source and was dropped.",
        event.src
    )
}
