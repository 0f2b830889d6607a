//! `--as nftables`, table-driven over IPVS-mode node snapshots (no kernel): what disappears,
//! appears and remains, the fixes to apply first, and the per-Service ipMode advice.

use probe_contract::{
    check::{Kind, Mode},
    facts::AddressOwner,
    readiness::Prediction,
};
use probe_core::service::{LbIngress, ServiceFacts};

use super::{
    Inputs, readiness, services, test_nodes,
    test_nodes::{POD_MASQ, VIP, ip, ipvs, lab, pairs},
};

/// `shop/web` (`test_nodes::web`) with `annotations`.
fn web(etp_local: bool, ip_mode: Option<&str>, annotations: &[(&str, &str)]) -> ServiceFacts {
    ServiceFacts {
        annotations: pairs(annotations),
        ..test_nodes::web(etp_local, ip_mode)
    }
}

fn with_api(mut i: Inputs, svcs: &[ServiceFacts]) -> Inputs {
    services::merge(&mut i, svcs);
    i
}

type Set = Vec<(Kind, String)>;

fn set(p: &[probe_contract::readiness::Change]) -> Set {
    p.iter().map(|c| (c.kind, c.subject.clone())).collect()
}

fn k(kind: Kind, subject: &str) -> (Kind, String) {
    (kind, subject.to_string())
}

fn predict(i: &Inputs, svcs: &[ServiceFacts]) -> Prediction {
    readiness::predict(i, svcs, None, Mode::Nftables)
}

#[test]
fn what_disappears_appears_and_remains() {
    use Kind::*;
    let bound_ipvs = ipvs(false, true);
    let mut route_owned = ipvs(false, true);
    route_owned.owners.insert(
        ip(VIP),
        AddressOwner::LocalRoute {
            iface: Some("eth0".into()),
            protocol: 66,
            protocol_name: "gce-guest-agent".into(),
        },
    );
    let mut self_loop = ipvs(false, true);
    self_loop.self_loop.loop_back = Some(vec![]);
    let mut masq = ipvs(false, true);
    masq.services.masquerade_rules.push(POD_MASQ.into());
    let local = web(true, None, &[]);
    let proxy = web(false, Some("Proxy"), &[]);
    // (case, node, Services, disappear, appear, remain)
    type Case = (&'static str, Inputs, Vec<ServiceFacts>, Set, Set, Set);
    let cases: Vec<Case> = vec![
        (
            "bound LB IP, node alone: the black hole goes, nothing new",
            bound_ipvs.clone(),
            vec![],
            vec![k(HealthcheckBlackhole, VIP)],
            vec![],
            vec![],
        ),
        (
            "bound, 443 declared but unserved, ETP Local: refused today, hairpins tomorrow",
            with_api(bound_ipvs.clone(), std::slice::from_ref(&local)),
            vec![local.clone()],
            vec![k(HealthcheckBlackhole, VIP), k(VipPortUnserved, VIP)],
            vec![k(Hairpin, "203.0.113.10:443/tcp")],
            vec![],
        ),
        (
            "the same with pod egress masqueraded: nothing appears",
            with_api(masq.clone(), std::slice::from_ref(&local)),
            vec![local.clone()],
            vec![k(HealthcheckBlackhole, VIP), k(VipPortUnserved, VIP)],
            vec![],
            vec![],
        ),
        (
            "ipMode Proxy: not bound, not short-circuited in either mode",
            with_api(ipvs(false, false), std::slice::from_ref(&proxy)),
            vec![proxy.clone()],
            vec![],
            vec![],
            vec![
                k(Hairpin, "203.0.113.10:443/tcp"),
                k(Hairpin, "203.0.113.10:80/tcp"),
            ],
        ),
        (
            "an LB IP a cloud guest agent's route makes local stays local",
            route_owned,
            vec![],
            vec![],
            vec![],
            vec![k(HealthcheckBlackhole, VIP)],
        ),
        (
            "a local endpoint without its KUBE-LOOP-BACK entry: IPVS mode's set goes",
            self_loop,
            vec![],
            vec![
                k(HealthcheckBlackhole, VIP),
                k(ServiceSelfLoop, "198.19.1.11:8080/tcp"),
            ],
            vec![],
            vec![],
        ),
    ];
    for (case, node, svcs, gone, new, stays) in cases {
        let p = predict(&node, &svcs);
        let mut got = (set(&p.disappear), set(&p.appear), set(&p.remain));
        got.0.sort();
        got.1.sort();
        got.2.sort();
        let mut want = (gone, new, stays);
        want.0.sort();
        want.1.sort();
        want.2.sort();
        assert_eq!(got, want, "{case}\n{}", readiness::table(&p));
        assert_eq!(p.from, Mode::Ipvs, "{case}");
        assert_eq!(p.risks_after, p.appear.len() + p.remain.len(), "{case}");
        // Every change says why.
        for c in p.disappear.iter().chain(&p.appear).chain(&p.remain) {
            assert!(!c.why.is_empty(), "{case}: {c:?}");
        }
    }
}

#[test]
fn an_appearing_hairpin_names_its_service_reason_and_fixes_to_apply_first() {
    let local = web(true, None, &[]);
    let p = predict(
        &with_api(ipvs(false, true), std::slice::from_ref(&local)),
        &[local],
    );
    let new = &p.appear[0];
    assert_eq!(new.service.as_deref(), Some("shop/web"));
    assert!(new.why.contains("bound on kube-ipvs0"), "{}", new.why);
    assert!(
        new.why.contains("externalTrafficPolicy: Local"),
        "{}",
        new.why
    );
    let ids: Vec<&str> = new.fixes.iter().map(|f| f.id.as_str()).collect();
    assert!(ids.contains(&"etp-cluster"), "{ids:?}");
    assert_eq!(
        p.before_migrating
            .iter()
            .map(|f| f.id.as_str())
            .collect::<Vec<_>>(),
        ids,
        "each fix once"
    );
    let gone = p
        .disappear
        .iter()
        .find(|c| c.kind == Kind::HealthcheckBlackhole)
        .unwrap();
    assert!(
        gone.why.contains("nftables mode binds no LB IP"),
        "{}",
        gone.why
    );
    assert_eq!(p.summary(), "1 new, 2 gone");
    let text = readiness::table(&p);
    assert!(
        text.starts_with("Moving kube-proxy from ipvs to nftables mode"),
        "{text}"
    );
    assert!(text.contains("  + hairpin"), "{text}");
    assert!(text.contains("fixes before migrating: "), "{text}");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["appear"][0]["kind"], "hairpin");
    assert_eq!(json["to"], "nftables");
}

#[test]
fn ip_mode_advice_follows_the_binding_the_provider_and_the_snat() {
    let route = {
        let mut i = ipvs(false, true);
        i.owners.insert(ip(VIP), AddressOwner::interface("eth0"));
        i
    };
    let nlb_ip = web(
        false,
        None,
        &[(
            "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type",
            "ip",
        )],
    );
    // (case, node, Service, verdict, would_hairpin, provider)
    let cases: Vec<(&str, Inputs, ServiceFacts, &str, bool, &str)> = vec![
        (
            "bound by kube-proxy: Proxy unbinds now, the move does too",
            ipvs(false, true),
            web(false, None, &[]),
            "avoids_now",
            true,
            "generic",
        ),
        (
            "pods masqueraded: Proxy would not loop",
            test_nodes::masquerade(ipvs(false, true)),
            web(false, None, &[]),
            "avoids_now",
            false,
            "generic",
        ),
        (
            "AWS NLB with IP targets: calls come back from the NLB",
            ipvs(false, true),
            nlb_ip,
            "avoids_now",
            false,
            "aws",
        ),
        (
            "Proxy already",
            ipvs(false, false),
            web(false, Some("Proxy"), &[]),
            "already",
            true,
            "generic",
        ),
        (
            "made local by a NIC address: ipMode does not help",
            route,
            web(false, None, &[]),
            "does_not_help",
            true,
            "generic",
        ),
        (
            "not bound here",
            ipvs(false, false),
            web(false, None, &[]),
            "not_needed",
            true,
            "generic",
        ),
    ];
    for (case, node, svc, verdict, hairpin, provider) in cases {
        let node = with_api(node, std::slice::from_ref(&svc));
        let p = predict(&node, &[svc]);
        assert_eq!(p.ip_mode.len(), 1, "{case}");
        let a = &p.ip_mode[0];
        assert_eq!(
            (a.verdict.as_str(), a.would_hairpin, a.provider.as_str()),
            (verdict, hairpin, provider),
            "{case}: {a:#?}"
        );
        assert_eq!(a.service.as_deref(), Some("shop/web"));
        // The costs are the fixes table's, never made up here.
        assert!(
            a.costs.iter().any(|c| c.contains("really go to the LB")),
            "{case}: {:?}",
            a.costs
        );
        assert_eq!(!a.fixes.is_empty(), hairpin, "{case}: {:?}", a.fixes);
    }
    // An unknown ipMode (KEP-6272's proposed Router) is shown as written, not as VIP.
    let svc = web(false, Some("Router"), &[]);
    let node = with_api(ipvs(false, true), std::slice::from_ref(&svc));
    assert_eq!(predict(&node, &[svc]).ip_mode[0].ip_mode, "Router");
}

#[test]
fn as_takes_nftables_only_and_not_on_a_node_already_there() {
    assert_eq!(
        readiness::validate(Mode::Nftables, Some(Mode::Ipvs)),
        Ok(Mode::Nftables)
    );
    assert_eq!(
        readiness::validate(Mode::Nftables, Some(Mode::Iptables)),
        Ok(Mode::Nftables)
    );
    for (target, current, needle) in [
        (Mode::Iptables, None, "only `--as nftables`"),
        (Mode::Ipvs, Some(Mode::Iptables), "only `--as nftables`"),
        (Mode::None, None, "only `--as nftables`"),
        (
            Mode::Nftables,
            Some(Mode::Nftables),
            "already runs kube-proxy in nftables",
        ),
        (Mode::Nftables, Some(Mode::None), "runs no kube-proxy"),
    ] {
        let e = readiness::validate(target, current)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{target:?} {current:?}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

/// The predicted node is what nftables mode leaves: nothing kube-proxy bound, no IPVS sets.
#[test]
fn the_predicted_node_keeps_only_what_kube_proxy_does_not_own() {
    let mut node = ipvs(false, true);
    node.self_loop.loop_back = Some(vec!["x".into()]);
    node.services.access_filter = vec!["-A KUBE-IPVS-FILTER -j REJECT".into()];
    let extra = ip("192.0.2.7");
    node.bound.push(extra);
    node.owners.insert(
        extra,
        AddressOwner::LocalRoute {
            iface: None,
            protocol: 66,
            protocol_name: "gce".into(),
        },
    );
    let p = readiness::as_nftables(&node);
    assert_eq!(p.bound, vec![extra]);
    assert_eq!(p.self_loop.loop_back, None);
    assert!(p.services.access_filter.is_empty());
    assert_eq!(p.dataplane.unwrap().mode, Mode::Nftables);
    assert_eq!(p.services.services, node.services.services);
    let _ = lab();
}

/// `ipMode: Proxy` and hostname-only LBs are listed as short-circuited in neither mode.
#[test]
fn proxy_and_hostname_lbs_are_named_as_never_short_circuited() {
    let mut hostname = web(false, None, &[]);
    hostname.name = "api".into();
    hostname.ingress = vec![LbIngress {
        ip: None,
        hostname: Some("lb-1.example.net".into()),
        ip_mode: None,
    }]
    .into();
    let proxy = web(false, Some("Proxy"), &[]);
    let svcs = [proxy, hostname, web(false, None, &[])];
    let p = predict(&with_api(ipvs(false, false), &svcs), &svcs);
    let got: Vec<(&str, &str)> = p
        .not_short_circuited
        .iter()
        .map(|e| (e.service.as_str(), e.address.as_str()))
        .collect();
    assert_eq!(got, [("shop/web", VIP), ("shop/api", "lb-1.example.net")]);
    assert!(p.not_short_circuited[1].why.contains("hostname only"));
    assert!(readiness::table(&p).contains("short-circuited in neither mode: 2"));
    // Without Services from the API: none named (the node alone does not know them).
    assert!(
        predict(&ipvs(false, false), &[])
            .not_short_circuited
            .is_empty()
    );
}
