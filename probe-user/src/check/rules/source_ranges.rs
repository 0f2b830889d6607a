//! `source_ranges_drop` (the risk of the event kind it predicts): a LoadBalancer Service with
//! `spec.loadBalancerSourceRanges` that leave out this node's pod range. kube-proxy filters calls to the LB IP by source before any
//! short-circuit, so a pod's call from outside the ranges is dropped on the node: in iptables
//! mode since 1.25 (kubernetes PR #110289: the `KUBE-FW-*` chain returns, and the filter
//! table's `KUBE-PROXY-FIREWALL` drops), in nftables mode since 1.30 (PR #122614:
//! `firewall-check` in prerouting, `firewall-ips`, `ip saddr != { ranges } drop`), IPVS mode
//! since 1.25 (PR #110628: ipsets `KUBE-LOAD-BALANCER-FW` / `-SOURCE-CIDR`, the filter
//! table's `KUBE-SOURCE-RANGES-FIREWALL` drops).
//! kubernetes#109575 is still open; upstream's advice is to list the pod CIDR. An ingress with
//! `ipMode: Proxy`, or an LB published as a hostname, gets no firewall rule: nothing is
//! dropped on the node (those in-cluster calls go to the LB, whose own firewall decides).

use probe_contract::{
    check::{Finding, Kind, Severity},
    sock,
};
use probe_core::state::{FirewallEntry, SourceRange};

use crate::{
    check::{Inputs, LbTarget},
    state::{ServiceSource, addrs::Prefix},
};

/// Whether `range` holds every address of `pods`.
fn covers(range: &Prefix, pods: &Prefix) -> bool {
    range.len <= pods.len && range.contains(pods.addr)
}

/// The node's pod ranges no source range covers (ranges that do not parse are skipped: the
/// API refuses them, so only a hand-made object holds one).
fn uncovered<'a>(t: &LbTarget, pods: &'a [Prefix]) -> Vec<&'a Prefix> {
    let ranges: Vec<Prefix> = t
        .source_ranges
        .iter()
        .filter_map(|r| Prefix::parse(r.trim()).ok())
        .collect();
    pods.iter()
        .filter(|p| p.addr.is_ipv4() == t.ip.is_ipv4())
        .filter(|p| !ranges.iter().any(|r| covers(r, p)))
        .collect()
}

/// One risk per LB IP:port whose Service's source ranges leave out a pod range of this node.
pub fn source_ranges(inp: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    for t in &inp.lb_targets {
        if t.source_ranges.is_empty() || t.ip_mode_proxy {
            continue;
        }
        let missed = uncovered(t, &inp.pod_prefixes);
        if missed.is_empty() {
            continue;
        }
        let svc = t.service.as_deref().unwrap_or("the Service");
        let missed_text = missed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let ranges = t.source_ranges.join(", ");
        out.push(Finding {
            kind: Kind::SourceRangesDrop,
            severity: Severity::Risk,
            subject: t.subject(),
            summary: format!(
                "{svc}'s loadBalancerSourceRanges leave out this node's pods ({missed_text}): kube-proxy drops their calls to {}",
                t.subject()
            ),
            evidence: vec![
                format!("{svc}: spec.loadBalancerSourceRanges: {ranges}"),
                format!("pod ranges of this node outside them: {missed_text}"),
                "kube-proxy drops a call to the LB IP from a source outside the ranges before \
                 any short-circuit: iptables mode since 1.25 (kubernetes PR #110289, \
                 KUBE-PROXY-FIREWALL in the filter table), nftables mode since 1.30 (PR \
                 #122614, firewall-check); kubernetes#109575"
                    .into(),
            ],
            remedy: vec![
                format!(
                    "call {svc} by its DNS name or ClusterIP from inside the cluster (no firewall \
                     check applies to those)"
                ),
                format!(
                    "or add the pod CIDR ({missed_text}) and the nodes' addresses to \
                     loadBalancerSourceRanges: the cloud's firewall for the LB then also admits \
                     those ranges (private addresses: no Internet source is let in)"
                ),
            ],
            fixes: Vec::new(),
        });
    }
    out.extend(from_rules(inp, &out));
    out
}

/// The node's pod ranges a firewall entry's ranges leave out (in its family).
fn uncovered_by_entry<'a>(e: &FirewallEntry, pods: &'a [Prefix]) -> Vec<&'a Prefix> {
    pods.iter()
        .filter(|p| p.addr.is_ipv4() == e.addr.is_ipv4())
        .filter(|p| {
            let Some(span) = SourceRange::parse(&p.to_string()) else {
                return true;
            };
            !e.allowed
                .iter()
                .any(|r| r.contains(span.first) && r.contains(span.last))
        })
        .collect()
}

/// Without the API's Services (or for an LB IP they do not list): kube-proxy's firewall as
/// its rules hold it (`ServiceTable::firewall`: nftables' `firewall-ips`, iptables'
/// `KUBE-PROXY-FIREWALL` and `KUBE-FW-*`, IPVS mode's `KUBE-LOAD-BALANCER-FW` ipsets), one risk per entry whose ranges leave out a pod
/// range of this node, unless `reported` already names its subject.
fn from_rules(inp: &Inputs, reported: &[Finding]) -> Vec<Finding> {
    let mut out = Vec::new();
    for e in &inp.services.firewall {
        let subject = format!("{}/{}", sock(e.addr, e.port), e.proto.as_str());
        if e.allowed.is_empty() || reported.iter().any(|f| f.subject == subject) {
            continue;
        }
        let missed = uncovered_by_entry(e, &inp.pod_prefixes);
        if missed.is_empty() {
            continue;
        }
        let missed_text = missed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let svc = e
            .service
            .as_deref()
            .map(|s| s.split(':').next().unwrap_or(s).to_string());
        let svc_text = svc.as_deref().unwrap_or("the Service");
        let rules = match (inp.services.source, e.chain.as_deref()) {
            (Some(ServiceSource::Iptables), chain) => format!(
                "kube-proxy's iptables rules: filter chain KUBE-PROXY-FIREWALL drops {subject}; \
                 nat chain {} passes only {{ {} }} (kubernetes PR #110289)",
                chain.unwrap_or("KUBE-FW-*"),
                e.allowed_text()
            ),
            (Some(ServiceSource::Ipvs), _) => format!(
                "kube-proxy's IPVS-mode ipsets: {} has {subject}, and filter chain \
                 KUBE-SOURCE-RANGES-FIREWALL drops a source {} does not list for it \
                 (passes only {{ {} }}; kubernetes PR #110628)",
                crate::state::ipvs_firewall::fw_set(e.addr.is_ipv6()),
                crate::state::ipvs_firewall::source_cidr_set(e.addr.is_ipv6()),
                e.allowed_text()
            ),
            _ => format!(
                "kube-proxy's nftables rules: map firewall-ips has {subject}, whose chain drops \
                 a source outside {{ {} }} (kubernetes PR #122614)",
                e.allowed_text()
            ),
        };
        out.push(Finding {
            kind: Kind::SourceRangesDrop,
            severity: Severity::Risk,
            subject: subject.clone(),
            summary: format!(
                "{svc_text}'s loadBalancerSourceRanges leave out this node's pods \
                 ({missed_text}): kube-proxy drops their calls to {subject}"
            ),
            evidence: vec![
                rules,
                format!("pod ranges of this node outside them: {missed_text}"),
                "kubernetes#109575 (open): kube-proxy applies the ranges to in-cluster callers \
                 too"
                .into(),
            ],
            remedy: vec![
                format!(
                    "call {svc_text} by its DNS name or ClusterIP from inside the cluster (no \
                     firewall check applies to those)"
                ),
                format!(
                    "or add the pod CIDR ({missed_text}) and the nodes' addresses to \
                     loadBalancerSourceRanges: the cloud's firewall for the LB then also \
                     admits those ranges (private addresses: no Internet source is let in)"
                ),
            ],
            fixes: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(ranges: &[&str], ip_mode_proxy: bool) -> LbTarget {
        LbTarget {
            ip: "203.0.113.10".parse().unwrap(),
            port: Some(443),
            proto: probe_contract::Proto::Tcp,
            service: Some("shop/web".into()),
            etp_local: Some(false),
            ip_mode_proxy,
            health_check_node_port: None,
            prevent_loopback: Vec::new(),
            kube_proxy_masquerades: true,
            proxy_protocol: None,
            source_ranges: ranges.iter().map(|r| r.to_string()).collect(),
            source: "service shop/web".into(),
        }
    }

    fn inputs(t: LbTarget) -> Inputs {
        Inputs {
            lb_targets: vec![t],
            pod_prefixes: vec![Prefix::parse("10.244.1.0/24").unwrap()],
            ..Default::default()
        }
    }

    #[test]
    fn ranges_without_the_pod_range_are_a_risk_naming_both() {
        let f = source_ranges(&inputs(target(&["192.0.2.0/24", "198.51.100.7/32"], false)));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::SourceRangesDrop);
        assert_eq!(
            f[0].kind.predicted(),
            Some(probe_contract::LoopbackKind::SourceRangesDrop),
            "the risk names the event kind it predicts"
        );
        assert_eq!(f[0].severity, Severity::Risk);
        assert_eq!(f[0].subject, "203.0.113.10:443/tcp");
        assert!(f[0].summary.contains("10.244.1.0/24"), "{}", f[0].summary);
        assert!(f[0].evidence[0].contains("192.0.2.0/24, 198.51.100.7/32"));
        assert!(f[0].evidence[2].contains("#110289") && f[0].evidence[2].contains("#122614"));
    }

    #[test]
    fn a_range_holding_the_pods_no_ranges_and_ip_mode_proxy_are_silent() {
        assert!(source_ranges(&inputs(target(&["10.244.0.0/16"], false))).is_empty());
        assert!(source_ranges(&inputs(target(&["10.244.1.0/24"], false))).is_empty());
        assert!(source_ranges(&inputs(target(&[], false))).is_empty());
        assert!(source_ranges(&inputs(target(&["192.0.2.0/24"], true))).is_empty());
        // A narrower range than the pod range does not hold it.
        assert_eq!(
            source_ranges(&inputs(target(&["10.244.1.0/25"], false))).len(),
            1
        );
    }

    /// No API: kube-proxy's firewall from the rules (iptables mode here) names the risk; a
    /// range holding the pods, or the API's finding for the same subject, names none more.
    #[test]
    fn the_rules_firewall_is_a_risk_without_the_api() {
        let entry = |allowed: &[&str]| FirewallEntry {
            addr: "203.0.113.10".parse().unwrap(),
            proto: probe_contract::Proto::Tcp,
            port: 443,
            service: Some("shop/web:https".into()),
            chain: Some("KUBE-FW-ABC".into()),
            allowed: allowed
                .iter()
                .map(|r| SourceRange::parse(r).unwrap())
                .collect(),
        };
        let mut inp = Inputs {
            pod_prefixes: vec![Prefix::parse("10.244.1.0/24").unwrap()],
            ..Default::default()
        };
        inp.services.source = Some(ServiceSource::Iptables);
        inp.services.firewall.push(entry(&["192.0.2.0/24"]));
        let f = source_ranges(&inp);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::SourceRangesDrop);
        assert_eq!(f[0].subject, "203.0.113.10:443/tcp");
        assert!(f[0].summary.starts_with("shop/web's"), "{}", f[0].summary);
        assert!(
            f[0].evidence[0].contains("nat chain KUBE-FW-ABC passes only { 192.0.2.0/24 }"),
            "{:?}",
            f[0].evidence
        );
        // IPVS mode's entry (from its ipsets) names the sets.
        inp.services.source = Some(ServiceSource::Ipvs);
        let ev = &source_ranges(&inp)[0].evidence[0];
        assert!(
            ev.contains("KUBE-LOAD-BALANCER-FW has 203.0.113.10:443/tcp")
                && ev.contains("passes only { 192.0.2.0/24 }"),
            "{ev}"
        );
        inp.services.source = Some(ServiceSource::Iptables);
        inp.services.firewall[0] = entry(&["192.0.2.0/24", "10.244.0.0/16"]);
        assert!(source_ranges(&inp).is_empty());
        // The API's target for the same IP:port names it once.
        inp.services.firewall[0] = entry(&["192.0.2.0/24"]);
        inp.lb_targets.push(target(&["192.0.2.0/24"], false));
        assert_eq!(source_ranges(&inp).len(), 1);
    }
}
