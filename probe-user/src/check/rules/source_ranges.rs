//! `source_ranges_drop` (the risk of the event kind it predicts): a LoadBalancer Service with
//! `spec.loadBalancerSourceRanges` that leave out this node's pod range. kube-proxy filters calls to the LB IP by source before any
//! short-circuit, so a pod's call from outside the ranges is dropped on the node: in iptables
//! mode since 1.25 (kubernetes PR #110289: the `KUBE-FW-*` chain returns, and the filter
//! table's `KUBE-PROXY-FIREWALL` drops), in nftables mode since 1.30 (PR #122614:
//! `firewall-check` in prerouting, `firewall-ips`, `ip saddr != { ranges } drop`).
//! kubernetes#109575 is still open; upstream's advice is to list the pod CIDR. An ingress with
//! `ipMode: Proxy`, or an LB published as a hostname, gets no firewall rule: nothing is
//! dropped on the node (those in-cluster calls go to the LB, whose own firewall decides).

use probe_contract::check::{Finding, Kind, Severity};

use crate::{
    check::{Inputs, LbTarget},
    state::addrs::Prefix,
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
}
