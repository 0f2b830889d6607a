//! `proxy_protocol_short_circuit` over the lab node's snapshots (no kernel): a risk exactly
//! where an LB with PROXY protocol on has its IP:port served by this node's kube-proxy rules.

use probe_contract::check::{CheckReport, Finding, Kind, Severity};

use super::{
    Inputs, rules, services,
    test_nodes::{VIP, assert_holds, lab, pairs, unbind, web},
};
use crate::state::ServiceSource;

const HCLOUD_PP: (&str, &str) = ("load-balancer.hetzner.cloud/uses-proxyprotocol", "true");

fn with_service(mut i: Inputs, ip_mode: Option<&str>, annotations: &[(&str, &str)]) -> Inputs {
    let svc = probe_core::service::ServiceFacts {
        annotations: pairs(annotations),
        ..web(false, ip_mode)
    };
    services::merge(&mut i, &[svc]);
    i
}

fn findings(i: &Inputs) -> Vec<Finding> {
    CheckReport::new(rules::judge(i))
        .findings
        .into_iter()
        .filter(|f| f.kind == Kind::ProxyProtocolShortCircuit)
        .collect()
}

/// One expected finding: (severity, subject).
type Verdict = (Severity, String);

/// (severity, subject), sorted.
fn verdicts(i: &Inputs) -> Vec<Verdict> {
    let mut v: Vec<_> = findings(i)
        .into_iter()
        .map(|f| (f.severity, f.subject))
        .collect();
    v.sort();
    v
}

#[test]
fn a_proxy_protocol_lb_short_circuited_by_the_node_is_a_risk_per_port_and_only_then() {
    let port80 = format!("{VIP}:80/tcp");
    let cases: Vec<(&str, Inputs, Vec<Verdict>)> = vec![
        (
            "iptables: 80 served (443 only declared: refused, not this kind)",
            with_service(lab(), None, &[HCLOUD_PP]),
            vec![(Severity::Risk, port80.clone())],
        ),
        (
            "twin: the same node and Service without PROXY protocol",
            with_service(lab(), None, &[]),
            vec![],
        ),
        (
            "twin: PROXY protocol switched off by value",
            with_service(
                lab(),
                None,
                &[("load-balancer.hetzner.cloud/uses-proxyprotocol", "false")],
            ),
            vec![],
        ),
        (
            "ipMode Proxy: kube-proxy writes no rule, calls go through the LB",
            with_service(unbind(lab()), Some("Proxy"), &[HCLOUD_PP]),
            vec![],
        ),
        (
            "ipMode Proxy but the rules exist (an older kube-proxy): still a risk",
            with_service(lab(), Some("Proxy"), &[HCLOUD_PP]),
            vec![(Severity::Risk, port80.clone())],
        ),
        (
            "nftables mode: nothing bound, the LB IP in service-ips",
            {
                let mut i = lab();
                i.bound.clear();
                i.services.source = Some(ServiceSource::Nftables);
                with_service(
                    i,
                    None,
                    &[("loadbalancer.openstack.org/proxy-protocol", "v2")],
                )
            },
            vec![(Severity::Risk, port80.clone())],
        ),
    ];
    for (what, inputs, want) in cases {
        assert_eq!(verdicts(&inputs), want, "{what}");
    }
}

#[test]
fn the_finding_names_the_annotation_the_short_circuit_and_the_provider_s_hostname() {
    let f = findings(&with_service(lab(), Some("Proxy"), &[HCLOUD_PP]))
        .pop()
        .unwrap();
    assert!(f.summary.contains("shop/web"), "{}", f.summary);
    assert_holds(
        &f.evidence,
        &[
            "load-balancer.hetzner.cloud/uses-proxyprotocol: true",
            "iptables KUBE-SERVICES",
            "ignores ipMode",
        ],
    );
    assert_holds(
        &f.remedy,
        &["svc.cluster.local", "load-balancer.hetzner.cloud/hostname"],
    );
}

#[test]
fn without_kube_proxy_it_is_a_warning_unless_the_ingress_is_proxy() {
    use super::dataplane::{Traces, detect};
    let none = detect(&Traces {
        links: vec!["cilium_host".into(), "eth0".into()],
        ..Default::default()
    });
    let mut i = unbind(lab());
    i.services.services.clear();
    i.dataplane = Some(none);
    let warn = with_service(i.clone(), None, &[HCLOUD_PP]);
    assert_eq!(
        verdicts(&warn),
        vec![
            (Severity::Warn, format!("{VIP}:443/tcp")),
            (Severity::Warn, format!("{VIP}:80/tcp")),
        ]
    );
    assert!(verdicts(&with_service(i, Some("Proxy"), &[HCLOUD_PP])).is_empty());
}
