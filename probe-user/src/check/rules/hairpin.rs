//! Failure 2's precondition: pod egress to an LB IP leaves the node without SNAT.
//!
//! How it is read from kube-proxy's rules: a call to an LB IP stays on the node when the
//! service table serves that IP:port or the IP is bound (short-circuit: no hairpin, but see
//! the other rules); otherwise it leaves, SNATed when a masquerade rule covers pod egress
//! ([`covers_pod_egress`]) or kube-proxy marks it (IPVS mode: the IP:port is in
//! `KUBE-LOAD-BALANCER` but not in `KUBE-LOAD-BALANCER-LOCAL`, whose rule RETURNs before
//! `KUBE-MARK-MASQ`: externalTrafficPolicy Local, reference 002). Each known LB target that
//! leaves unSNATed is a risk; with none known, unmasqueraded pod egress is one risk for any LB
//! that keeps client addresses.

use probe_contract::check::{Finding, Kind, Severity};

use super::targets::prevent_loopback;
use crate::{
    check::{Inputs, LbTarget},
    state::addrs::Prefix,
};

/// A MASQUERADE rule that applies to pods' egress off the node: not kube-proxy's marked
/// masquerade (`KUBE-POSTROUTING` / `--mark` / nftables `masquerading`, which covers only the
/// traffic kube-proxy marked), no set match, no positive destination, and a source (if any)
/// that covers a pod prefix of this node. Read from the rule text the state readers keep.
pub fn covers_pod_egress(rule: &str, pods: &[Prefix]) -> bool {
    if rule.contains("kube-proxy chain masquerading") {
        return false;
    }
    let words: Vec<&str> = rule.split_whitespace().collect();
    if words.get(1) == Some(&"KUBE-POSTROUTING")
        || words
            .iter()
            .any(|w| matches!(*w, "--mark" | "--match-set" | "mark"))
    {
        return false;
    }
    let negated = |i: usize| i > 0 && words[i - 1] == "!";
    let mut src_ok = true;
    for (i, w) in words.iter().enumerate() {
        let value = words.get(i + 1).and_then(|v| Prefix::parse(v).ok());
        match *w {
            "-d" | "--destination" if !negated(i) => return false,
            "-s" | "--source" => {
                let Some(p) = value else { continue };
                let covers = |pod: &Prefix| {
                    if p.len <= pod.len {
                        p.contains(pod.addr)
                    } else {
                        pod.contains(p.addr)
                    }
                };
                src_ok = if negated(i) {
                    pods.iter()
                        .any(|pod| !(p.len <= pod.len && p.contains(pod.addr)))
                } else {
                    pods.iter().any(covers)
                };
            }
            _ => {}
        }
    }
    src_ok
}

/// Failure 2's precondition: pod egress to an LB IP leaves the node without SNAT.
///
/// How it is read from kube-proxy's rules: a call to an LB IP stays on the node when the
/// service table serves that IP:port or the IP is bound (short-circuit: no hairpin, but see
/// the other rules); otherwise it leaves, SNATed when a masquerade rule covers pod egress
/// ([`covers_pod_egress`]) or kube-proxy marks it (IPVS mode: the IP:port is in
/// `KUBE-LOAD-BALANCER` but not in `KUBE-LOAD-BALANCER-LOCAL`, whose rule RETURNs before
/// `KUBE-MARK-MASQ`: externalTrafficPolicy Local, reference 002). Each known LB target that
/// leaves unSNATed is a risk; with none known, unmasqueraded pod egress is one risk for any LB
/// that keeps client addresses.
pub fn hairpin(inp: &Inputs) -> Vec<Finding> {
    if inp.pod_prefixes.is_empty() {
        return Vec::new();
    }
    let pod_masq: Vec<&String> = inp
        .services
        .masquerade_rules
        .iter()
        .filter(|r| covers_pod_egress(r, &inp.pod_prefixes))
        .collect();
    let pods = pod_list(&inp.pod_prefixes);
    let no_masq = match inp.services.masquerade_rules.len() {
        0 => format!("no masquerade rule covers pod egress from {pods} (none found)"),
        n => format!(
            "no masquerade rule covers pod egress from {pods} ({n} masquerade rule(s), all for \
             marked or other traffic)"
        ),
    };
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for t in &inp.lb_targets {
        let key = (t.ip, t.port, t.proto);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let short_circuit = inp.bound.contains(&t.ip)
            || match t.port {
                Some(p) => inp.services.serves(t.ip, p, t.proto).is_some(),
                None => inp.services.services.iter().any(|s| s.vip == t.ip),
            };
        if short_circuit && !t.ip_mode_proxy {
            continue;
        }
        if !pod_masq.is_empty() || t.kube_proxy_masquerades {
            continue;
        }
        out.push(target_finding(t, &no_masq));
    }
    if out.is_empty() && pod_masq.is_empty() && seen.is_empty() {
        out.push(pod_egress_finding(inp, &pods, no_masq));
    }
    // Without kube-proxy, its replacement may serve LB IPs to pods and masquerade in eBPF,
    // neither of which the probe reads: possible, not established.
    if let Some(d) = inp
        .dataplane
        .as_ref()
        .filter(|d| d.mode == probe_contract::check::Mode::None)
    {
        for f in &mut out {
            if f.severity == Severity::Risk {
                f.severity = Severity::Warn;
                f.evidence.push(format!(
                    "no kube-proxy ({}): whether its replacement serves or masquerades pod \
                     calls to LB IPs is decided in eBPF, not read by the probe",
                    d.name()
                ));
            }
        }
    }
    out
}

/// The node's pod prefixes for a sentence: a node has a /32 route per pod, so a few are
/// named and the rest counted.
fn pod_list(prefixes: &[Prefix]) -> String {
    let mut pods = prefixes
        .iter()
        .take(3)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if prefixes.len() > 3 {
        pods.push_str(&format!(" and {} more", prefixes.len() - 3));
    }
    pods
}

/// A known LB target whose pod calls leave the node unSNATed.
fn target_finding(t: &LbTarget, no_masq: &str) -> Finding {
    let subject = t.subject();
    let mut evidence = vec![
        format!(
            "nothing on this node serves {subject}{}: pod calls to it leave for the LB",
            if t.ip_mode_proxy {
                " (ipMode: Proxy)"
            } else {
                ""
            }
        ),
        no_masq.to_string(),
    ];
    if t.etp_local == Some(true) {
        evidence.push(format!(
            "externalTrafficPolicy: Local (per {}): kube-proxy does not mark pod traffic to \
             it for masquerade",
            t.source
        ));
    }
    let guard = prevent_loopback(&[t]);
    let severity = if guard.is_empty() {
        Severity::Risk
    } else {
        evidence.push(format!(
            "provider prevent-loopback annotation set ({})",
            guard.join(", ")
        ));
        Severity::Warn
    };
    let svc = t.service.as_deref().unwrap_or("the Service");
    Finding {
        kind: Kind::Hairpin,
        severity,
        subject: subject.clone(),
        summary: format!(
            "pod calls to LB {subject} ({svc}) leave without SNAT: the LB can send them back to \
             this node"
        ),
        evidence,
        // With ipMode Proxy kube-proxy writes no rule for the LB IP: the policy changes
        // nothing there.
        remedy: hairpin_remedy(svc, t.etp_local == Some(true) && !t.ip_mode_proxy),
        fixes: Vec::new(),
    }
}

/// No LB target known: unmasqueraded pod egress is one risk for any LB that keeps client
/// addresses.
fn pod_egress_finding(inp: &Inputs, pods: &str, no_masq: String) -> Finding {
    let mut evidence = vec![
        no_masq,
        "masquerade is read from the iptables nat table and kube-proxy's nftables table: a \
         CNI that masquerades in eBPF (e.g. Cilium) or in its own nftables table is not seen"
            .to_string(),
    ];
    for n in inp.services.nodeports.iter().filter(|n| n.local_only) {
        evidence.push(format!(
            "NodePort {}/{}{} has externalTrafficPolicy: Local rules",
            n.port,
            n.proto.as_str(),
            n.service
                .as_deref()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default()
        ));
    }
    let local = inp.services.nodeports.iter().any(|n| n.local_only);
    Finding {
        kind: Kind::Hairpin,
        severity: Severity::Risk,
        subject: "pod egress".into(),
        summary: format!(
            "pods ({pods}) reach LB IPs this node does not serve without SNAT: an LB that keeps \
             client addresses can send them back to this node"
        ),
        evidence,
        remedy: hairpin_remedy("the Service", local),
        fixes: Vec::new(),
    }
}

fn hairpin_remedy(svc: &str, etp_local: bool) -> Vec<String> {
    let mut out = Vec::new();
    if etp_local {
        out.push(format!(
            "Set externalTrafficPolicy: Cluster on {svc} if the client source IP need not be \
             preserved (kube-proxy then masquerades pod calls to the LB IP)."
        ));
    }
    out.push(format!(
        "Call {svc} by its cluster DNS name (<name>.<namespace>.svc.cluster.local) or ClusterIP \
         from inside the cluster, not the LB address."
    ));
    out.push(
        "Masquerade (SNAT) pod traffic to the LB to the node IP (the CNI's masquerade or \
         ip-masq-agent, without exempting the LB's addresses): the LB then avoids the calling \
         node."
            .into(),
    );
    out.push(
        "Or make the LB source-NAT toward backends, or enable the provider's prevent-loopback \
         option."
            .into(),
    );
    out
}
