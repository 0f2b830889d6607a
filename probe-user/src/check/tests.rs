//! The rules of `probe check`, table-driven over node snapshots shaped like the lab's and
//! like kube-proxy's IPVS mode (no kernel).

use probe_contract::check::{CheckReport, Kind, Severity};
use probe_core::service::{LbIngress, ServiceFacts};

use super::{
    Inputs, KernelView, attach_fixes, render, rules, services,
    test_nodes::{
        KUBE_MASQ, POD_MASQ, VIP, assert_holds, ip, ipvs, lab, masquerade, pairs, unbind, web,
    },
};
use crate::state::{ServiceSource, ServiceTable, addrs::Prefix};

/// (kind, severity, subject) of every finding that is not info.
fn verdicts(i: &Inputs) -> Vec<Verdict> {
    CheckReport::new(rules::judge(i))
        .findings
        .into_iter()
        .filter(|f| f.severity != Severity::Info)
        .map(|f| (f.kind, f.severity, f.subject))
        .collect()
}

/// One expected finding: (kind, severity, subject).
type Verdict = (Kind, Severity, String);

fn v(kind: Kind, severity: Severity, subject: &str) -> Verdict {
    (kind, severity, subject.to_string())
}

#[test]
fn each_node_state_yields_its_risks_and_only_those() {
    use Kind::*;
    use Severity::*;
    let cases: Vec<(&str, Inputs, Vec<Verdict>)> = vec![
        (
            "lab default: VIP bound and served on 80, pods not masqueraded",
            lab(),
            vec![
                v(HealthcheckBlackhole, Risk, VIP),
                v(Hairpin, Risk, "pod egress"),
                v(VipPortUnserved, Warn, VIP),
            ],
        ),
        (
            "VIP not bound (healthcheck-ok twin): no VIP finding",
            unbind(lab()),
            vec![v(Hairpin, Risk, "pod egress")],
        ),
        (
            "pods masqueraded (hairpin-snat twin): no hairpin",
            masquerade(unbind(lab())),
            vec![],
        ),
        (
            "VIP bound, nothing serves it: every in-cluster call refused",
            {
                let mut i = masquerade(lab());
                i.services.services.retain(|s| s.vip != ip(VIP));
                i
            },
            vec![
                v(HealthcheckBlackhole, Risk, VIP),
                v(VipPortUnserved, Risk, VIP),
            ],
        ),
        (
            "IPVS, Cluster policy, LB IP not bound: kube-proxy marks pod calls: no risk",
            ipvs(false, false),
            vec![],
        ),
        (
            "IPVS, Local policy, LB IP not bound (reference 002): hairpin on VIP:80",
            ipvs(true, false),
            vec![v(Hairpin, Risk, "203.0.113.10:80/tcp")],
        ),
        (
            "IPVS, Local policy, but the CNI masquerades pod egress: no hairpin",
            masquerade(ipvs(true, false)),
            vec![],
        ),
        (
            "IPVS, LB IP bound: ClusterIP ignored, LB IP at risk, served port known",
            ipvs(false, true),
            vec![
                v(HealthcheckBlackhole, Risk, VIP),
                v(VipPortUnserved, Warn, VIP),
            ],
        ),
        (
            "a 5.10 kernel with kptr_restrict=2: two blind spots, no risk",
            {
                let mut i = masquerade(unbind(lab()));
                i.kernel = KernelView {
                    release: "5.10.0".into(),
                    tcx: false,
                    btf_error: None,
                    drop_reason_arg: false,
                    drop_reasons: 0,
                    kptr_restrict: Some(2),
                    kallsyms_readable: false,
                };
                i
            },
            vec![
                v(KptrRestrict, Warn, "kernel.kptr_restrict"),
                v(KernelVisibility, Warn, "kernel"),
            ],
        ),
        (
            "no pods on the node: no pod egress to judge",
            {
                let mut i = unbind(lab());
                i.pod_prefixes.clear();
                i
            },
            vec![],
        ),
    ];
    for (what, inputs, want) in cases {
        let mut got = verdicts(&inputs);
        let mut want = want;
        got.sort();
        want.sort();
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn the_api_names_services_and_their_settings() {
    let web = |etp_local: bool, ip_mode: Option<&str>, annotations: &[(&str, &str)]| ServiceFacts {
        loopback_annotations: pairs(annotations),
        ..web(etp_local, ip_mode)
    };
    // Bound, 443 declared but not served: a certain vip_port_unserved, named.
    let mut i = masquerade(lab());
    services::merge(&mut i, &[web(false, None, &[])]);
    let r = CheckReport::new(rules::judge(&i));
    let unserved = r
        .findings
        .iter()
        .find(|f| f.kind == Kind::VipPortUnserved)
        .unwrap();
    assert_eq!(unserved.severity, Severity::Risk);
    assert!(unserved.summary.contains("443/tcp"), "{}", unserved.summary);
    let hc = r
        .findings
        .iter()
        .find(|f| f.kind == Kind::HealthcheckBlackhole)
        .unwrap();
    assert!(hc.summary.contains("shop/web"), "{}", hc.summary);

    // ETP Local, ipMode Proxy (kube-proxy neither binds nor short-circuits), no masquerade:
    // a hairpin per port, naming the policy.
    let mut i = unbind(lab());
    services::merge(&mut i, &[web(true, Some("Proxy"), &[])]);
    let got = verdicts(&i);
    assert_eq!(
        got,
        vec![
            v(Kind::Hairpin, Severity::Risk, "203.0.113.10:443/tcp"),
            v(Kind::Hairpin, Severity::Risk, "203.0.113.10:80/tcp"),
        ]
    );
    let f = &CheckReport::new(rules::judge(&i)).findings[0];
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("externalTrafficPolicy: Local")),
        "{f:#?}"
    );
    // ... but no "set Cluster": with ipMode Proxy kube-proxy has no rule for the IP.
    assert!(
        f.remedy
            .iter()
            .all(|r| !r.contains("externalTrafficPolicy: Cluster")),
        "{:#?}",
        f.remedy
    );
    // ... but its fixes leave the policy alone: with ipMode Proxy kube-proxy writes no rule
    // for the LB IP, so Cluster would change nothing (issue 35, item 4). `probe check --json`
    // shows them.
    let mut findings = rules::judge(&i);
    attach_fixes(&mut findings, &[web(true, Some("Proxy"), &[])], Some(true));
    let hairpin = findings.iter().find(|f| f.kind == Kind::Hairpin).unwrap();
    assert!(
        hairpin.fixes.iter().all(|x| x.id != "etp-cluster"),
        "{:#?}",
        hairpin.fixes
    );
    assert_eq!(hairpin.fixes[0].id, "call-by-service-name");
    let json = crate::check::render::json(&CheckReport::new(findings));
    assert!(json.contains(r#""id": "call-by-service-name""#), "{json}");
    // Cluster already: never offered; the health-check risk of a bound VIP gets ipMode Proxy.
    let mut i = masquerade(lab());
    services::merge(&mut i, &[web(false, None, &[])]);
    let mut findings = rules::judge(&i);
    attach_fixes(&mut findings, &[web(false, None, &[])], Some(true));
    assert!(
        findings
            .iter()
            .all(|f| f.fixes.iter().all(|x| x.id != "etp-cluster"))
    );
    let hc = findings
        .iter()
        .find(|f| f.kind == Kind::HealthcheckBlackhole)
        .unwrap();
    assert_eq!(
        hc.fixes.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(),
        ["ip-mode-proxy", "lb-healthcheck-source"]
    );

    // The provider's prevent-loopback annotation turns the risks into warnings.
    let mut i = unbind(lab());
    services::merge(
        &mut i,
        &[web(
            true,
            Some("Proxy"),
            &[("service.cloud.tencent.com/prevent-loopback", "true")],
        )],
    );
    assert!(verdicts(&i).iter().all(|(_, s, _)| *s == Severity::Warn));
    assert_eq!(CheckReport::new(rules::judge(&i)).exit_code(), 0);
}

#[test]
fn pod_egress_masquerade_is_told_from_marked_and_narrow_rules() {
    let pods = [Prefix::parse("198.19.1.0/24").unwrap()];
    for (rule, covers) in [
        (POD_MASQ, true),
        (
            "-A CNI-MASQ ! -d 224.0.0.0/4 -j MASQUERADE --random-fully",
            true,
        ),
        (
            "-A POSTROUTING -s 198.19.0.0/16 ! -d 198.19.0.0/16 -j MASQUERADE",
            true,
        ),
        (KUBE_MASQ, false),
        (
            "-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE",
            false,
        ),
        ("-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE", false),
        ("-A POSTROUTING -d 192.0.2.0/24 -j MASQUERADE", false),
        (
            "-A KUBE-POSTROUTING -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
            false,
        ),
        (
            "nftables ip kube-proxy chain masquerading: masquerade fully-random",
            false,
        ),
    ] {
        assert_eq!(rules::covers_pod_egress(rule, &pods), covers, "{rule}");
    }
}

#[test]
fn the_report_is_sorted_counted_and_rendered() {
    let r = CheckReport::new(rules::judge(&lab()));
    assert_eq!((r.risks, r.warnings, r.exit_code()), (2, 1, 1));
    assert!(
        r.findings
            .windows(2)
            .all(|w| w[0].severity <= w[1].severity)
    );
    for f in &r.findings {
        assert!(!f.summary.contains('\n'), "{f:#?}");
        if f.severity == Severity::Risk {
            assert!(!f.remedy.is_empty() && !f.evidence.is_empty(), "{f:#?}");
        }
    }
    let table = render::table(&r);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), r.findings.len() + 2, "{table}");
    assert!(lines[0].starts_with("SEVERITY  KIND"));
    // Aligned: every row's summary starts in the header's SUMMARY column.
    let col = lines[0].find("SUMMARY").unwrap();
    for (l, f) in lines[1..=r.findings.len()].iter().zip(&r.findings) {
        assert_eq!(l.find(&f.summary), Some(col), "{table}");
    }
    assert!(lines.last().unwrap().starts_with("2 risk(s), 1 warning(s)"));
    let json: serde_json::Value = serde_json::from_str(&render::json(&r)).unwrap();
    assert_eq!(json["schema"], 1);
    assert_eq!(json["risks"], 2);
    let first = &json["findings"][0];
    for key in [
        "kind", "severity", "subject", "summary", "evidence", "remedy",
    ] {
        assert!(first.get(key).is_some(), "{key} missing: {first:#}");
    }
    assert_eq!(first["severity"], "risk");
    let clean = CheckReport::new(rules::judge(&masquerade(unbind(lab()))));
    assert_eq!(clean.exit_code(), 0);
}

/// The fake API server's `default/web` fixture (shaped as the real API returns it).
const SERVICE_WEB: &str =
    include_str!("../../../test-support/src/kubeapi/fixtures/service-web.json");

#[test]
fn api_services_become_facts() {
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_str(SERVICE_WEB).unwrap();
    let facts = ServiceFacts::from_service(&svc).unwrap();
    assert_eq!(facts.key(), "default/web");
    assert_eq!(*facts.cluster_ips, [ip("198.18.100.10")]);
    assert_eq!(
        *facts.ingress,
        [LbIngress {
            ip: Some(ip(VIP)),
            hostname: None,
            ip_mode: Some("VIP".into())
        }]
    );
    assert_eq!(
        (
            facts.ports.len(),
            facts.ports[0].port,
            facts.ports[0].node_port
        ),
        (1, 80, Some(30080))
    );
    assert!(!facts.is_etp_local());
    // ETP Local with a health-check NodePort, ipMode Proxy, TKE's prevent-loopback.
    let mut v: serde_json::Value = serde_json::from_str(SERVICE_WEB).unwrap();
    v["spec"]["externalTrafficPolicy"] = "Local".into();
    v["spec"]["healthCheckNodePort"] = 32000.into();
    v["status"]["loadBalancer"]["ingress"][0]["ipMode"] = "Proxy".into();
    v["metadata"]["annotations"]["service.cloud.tencent.com/prevent-loopback"] = "true".into();
    let facts = ServiceFacts::from_service(&serde_json::from_value(v).unwrap()).unwrap();
    assert!(facts.is_etp_local());
    assert_eq!(facts.health_check_node_port, Some(32000));
    let (targets, _) = services::targets(&[facts]);
    assert_eq!(targets.len(), 1);
    let t = &targets[0];
    assert!(t.ip_mode_proxy && !t.kube_proxy_masquerades);
    assert_eq!(
        t.prevent_loopback,
        ["service.cloud.tencent.com/prevent-loopback"]
    );
}

/// The node report (#27) carries `probe check`'s risks only, each with its Service and first
/// fix, and the kube-proxy mode the rules were read from.
#[test]
fn the_node_report_takes_the_risks_with_their_service_and_first_fix() {
    let web = web(true, None);
    let state = crate::sink::node_report::status::check_state(&lab(), std::slice::from_ref(&web));
    assert_eq!(state.mode, "iptables");
    assert!(!state.risks.is_empty(), "the lab's bound VIP is a risk");
    for r in &state.risks {
        assert_eq!(r.service.as_deref(), Some("shop/web"), "{r:?}");
        assert!(r.first_fix.is_some(), "{r:?}");
    }
    let full = CheckReport::new(rules::judge(&lab()));
    assert!(
        full.findings.iter().any(|f| f.severity != Severity::Risk),
        "the lab has non-risk findings, and the report leaves them out"
    );
    // Without the API: the same risks, unnamed, the mode still known.
    let bare = crate::sink::node_report::status::check_state(&lab(), &[]);
    assert_eq!(bare.mode, "iptables");
    assert_eq!(bare.risks.len(), full.risks);
}

/// `service_self_loop`: IPVS mode judges the KUBE-LOOP-BACK entries of local endpoints; the
/// bridge ports without hairpin mode under br_netfilter in every mode.
#[test]
fn service_self_loop_risks_follow_the_mode() {
    use crate::state::BridgePort;
    let self_loops = |i: &Inputs| -> Vec<String> {
        rules::judge(i)
            .into_iter()
            .filter(|f| f.kind == Kind::ServiceSelfLoop)
            .map(|f| {
                assert_eq!(f.severity, Severity::Risk);
                format!("{}: {}", f.subject, f.summary)
            })
            .collect()
    };
    let mut i = ipvs(false, false);
    i.self_loop.loop_back = Some(vec!["198.19.1.11,tcp:8080,198.19.1.11".into()]);
    assert!(self_loops(&i).is_empty(), "{:?}", self_loops(&i));
    // kube-proxy 1.31 (kubernetes#134884): the entry is gone.
    i.self_loop.loop_back = Some(vec![]);
    let found = self_loops(&i);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("198.19.1.11:8080/tcp: pod 198.19.1.11 cannot reach itself")
            && found[0].contains("KUBE-LOOP-BACK lacks 198.19.1.11,tcp:8080,198.19.1.11"),
        "{found:?}"
    );
    // A bridge without hairpin mode is a risk in IPVS mode too (the reply dies at the port).
    let port = |hairpin_mode| BridgePort {
        bridge: "cbr0".into(),
        port: "veth1".into(),
        hairpin_mode,
    };
    let mut i = ipvs(false, false);
    i.self_loop = super::SelfLoopNode {
        loop_back: Some(vec!["198.19.1.11,tcp:8080,198.19.1.11".into()]),
        bridge_ports: vec![port(false)],
        br_netfilter: Some(true),
    };
    assert_eq!(self_loops(&i).len(), 1, "{:?}", self_loops(&i));
    // iptables mode: the same bridge is a risk with br_netfilter on, not with hairpin mode.
    let mut i = lab();
    i.self_loop.bridge_ports = vec![port(false)];
    i.self_loop.br_netfilter = Some(true);
    let found = self_loops(&i);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("cbr0: 1 port(s) of cbr0 without hairpin mode"),
        "{found:?}"
    );
    i.self_loop.br_netfilter = Some(false);
    assert!(self_loops(&i).is_empty());
    i.self_loop.br_netfilter = Some(true);
    i.self_loop.bridge_ports = vec![port(true)];
    assert!(self_loops(&i).is_empty());
}

/// Without kube-proxy the check says so (a warning with the limits), and the table and JSON
/// name the dataplane; with kube-proxy there is no such finding.
#[test]
fn a_node_without_kube_proxy_is_a_warning_never_silence() {
    use super::dataplane::{Traces, detect};
    let none = detect(&Traces {
        links: vec!["cilium_host".into(), "eth0".into()],
        ..Default::default()
    });
    let mut inputs = Inputs {
        services: ServiceTable {
            source: Some(ServiceSource::Iptables),
            ..Default::default()
        },
        dataplane: Some(none.clone()),
        ..Default::default()
    };
    let findings = rules::judge(&inputs);
    let dp: Vec<_> = findings
        .iter()
        .filter(|f| f.kind == Kind::Dataplane)
        .collect();
    assert_eq!(dp.len(), 1, "{findings:#?}");
    assert_eq!(dp[0].severity, Severity::Warn);
    assert_eq!(dp[0].subject, "none (cilium)");
    assert!(
        dp[0]
            .summary
            .contains("still possible: healthcheck_blackhole")
    );
    assert!(
        dp[0]
            .remedy
            .iter()
            .any(|r| r.starts_with("cannot confirm: nodeport_attribution"))
    );
    let report = CheckReport::new(findings).with_dataplane(Some(none));
    assert!(render::table(&report).contains("\ndataplane: none (cilium)\n"));
    let json: serde_json::Value = serde_json::from_str(&render::json(&report)).unwrap();
    assert_eq!(json["dataplane"]["mode"], "none");
    inputs.dataplane = Some(detect(&Traces {
        source: Some(ServiceSource::Iptables),
        table_has_services: true,
        ..Default::default()
    }));
    assert!(
        rules::judge(&inputs)
            .iter()
            .all(|f| f.kind != Kind::Dataplane)
    );
    // Pod egress without SNAT: a risk under kube-proxy, a warning without it (the
    // replacement's eBPF masquerade and LB handling are not read).
    let hairpin = |i: &Inputs| -> Vec<Severity> {
        rules::judge(i)
            .into_iter()
            .filter(|f| f.kind == Kind::Hairpin)
            .map(|f| f.severity)
            .collect()
    };
    let mut node = unbind(lab());
    assert_eq!(hairpin(&node), [Severity::Risk]);
    node.dataplane = Some(detect(&Traces {
        links: vec!["cilium_host".into()],
        ..Default::default()
    }));
    assert_eq!(hairpin(&node), [Severity::Warn]);
}

/// Issue 35 item 9: a black-holed LB IP shared by two Services loops for both, so its fixes
/// name both; a port's risk names only the Service serving that port.
#[test]
fn a_shared_lb_ip_s_fixes_regard_every_service_on_it() {
    let api = ServiceFacts {
        name: "api".into(),
        ports: vec![probe_core::service::ServicePort {
            name: None,
            protocol: "TCP".into(),
            port: 8443,
            node_port: Some(30843),
        }]
        .into(),
        annotations: pairs(&[("load-balancer.hetzner.cloud/location", "hel1")]),
        ..web(false, None)
    };
    let web = ServiceFacts {
        annotations: pairs(&[("load-balancer.hetzner.cloud/location", "hel1")]),
        ..web(true, None)
    };
    let finding = |kind: Kind, subject: &str| super::Finding {
        kind,
        severity: Severity::Risk,
        subject: subject.into(),
        summary: String::new(),
        evidence: vec![],
        remedy: vec![],
        fixes: vec![],
    };
    let mut findings = vec![
        finding(Kind::HealthcheckBlackhole, VIP),
        finding(Kind::Hairpin, &format!("{VIP}:8443/tcp")),
    ];
    attach_fixes(&mut findings, &[web, api], Some(true));
    let patched = |f: &super::Finding| -> Vec<String> {
        f.fixes
            .iter()
            .filter(|x| x.id == "hcloud-disable-private-ingress")
            .filter_map(|x| x.service.clone())
            .collect()
    };
    assert_eq!(patched(&findings[0]), ["shop/web", "shop/api"]);
    // Advice without a patch is listed once.
    assert_eq!(
        findings[0]
            .fixes
            .iter()
            .filter(|x| x.id == "ip-mode-proxy")
            .count(),
        1
    );
    // Port 8443 is shop/api's (Cluster policy): no etp-cluster for shop/web's Local.
    assert!(
        findings[1].fixes.iter().all(|x| x.id != "etp-cluster"),
        "{:#?}",
        findings[1].fixes
    );
    assert!(!findings[1].fixes.is_empty());
}

/// An LB IP an announcer holds on the NIC (kube-vip, ARP mode) is a health-check black hole
/// named for kube-vip, with kube-vip's remedy; a held VIP that no Service names (a
/// control-plane VIP) is only a warning; the same IP on kube-ipvs0 stays kube-proxy's.
#[test]
fn an_lb_ip_held_by_an_announcer_is_named_for_it() {
    use probe_contract::facts::{AddressOwner, Announcer};
    const CP_VIP: &str = "198.18.0.100";
    let kube_vip = AddressOwner::Interface {
        iface: "eth0".into(),
        announcer: Some(Announcer {
            name: Announcer::KUBE_VIP.into(),
            why: "/32 on eth0 with preferred_lft 0 (deprecated), as kube-vip adds its VIPs".into(),
            pod: None,
        }),
    };
    let mut held = lab();
    held.bound.push(ip(CP_VIP));
    held.owners.insert(ip(VIP), kube_vip.clone());
    held.owners.insert(ip(CP_VIP), kube_vip);
    let findings = rules::judge(&held);
    let blackhole = |ip: &str| {
        findings
            .iter()
            .find(|f| f.kind == Kind::HealthcheckBlackhole && f.subject == ip)
            .unwrap_or_else(|| panic!("{ip}: {findings:#?}"))
    };
    let lb = blackhole(VIP);
    assert_eq!(lb.severity, Severity::Risk);
    assert!(lb.summary.contains("held by kube-vip"), "{}", lb.summary);
    assert!(
        lb.evidence.iter().any(|l| l.contains("preferred_lft 0")),
        "{:#?}",
        lb.evidence
    );
    let remedy = lb.remedy.join("\n");
    assert!(remedy.contains("not bound by kube-proxy"), "{remedy}");
    assert!(remedy.contains("from a source that is not"), "{remedy}");
    assert!(!remedy.contains("kube-ipvs0"), "{remedy}");
    let cp = blackhole(CP_VIP);
    assert_eq!(cp.severity, Severity::Warn, "{cp:#?}");
    // The twin: kube-proxy's binding is named as kube-proxy's.
    let bound = rules::judge(&lab());
    let f = bound
        .iter()
        .find(|f| f.kind == Kind::HealthcheckBlackhole)
        .unwrap();
    assert!(f.summary.contains("bound on kube-ipvs0"), "{}", f.summary);
    assert!(!f.summary.contains("kube-vip"), "{}", f.summary);
}

/// kube-proxy's nftables `no-endpoint-services` drop of an ETP Local LB IP (issue 39, item
/// 1): a risk naming the element and the fixed release; without the element, none.
#[test]
fn an_etp_local_lb_ip_in_no_endpoint_services_is_a_risk_and_its_twin_is_not() {
    let nft = |dropped: bool| {
        let mut i = masquerade(unbind(lab()));
        i.services.source = Some(ServiceSource::Nftables);
        i.services.services.push(crate::state::ServiceEntry {
            vip: ip(VIP),
            port: 8445,
            proto: probe_contract::Proto::Tcp,
            service: Some("default/web-local:http".into()),
            backends: vec!["198.19.2.10:30080".into()],
        });
        if dropped {
            i.services
                .no_endpoint_drops
                .push(crate::state::NoEndpointDrop {
                    addr: ip(VIP),
                    proto: probe_contract::Proto::Tcp,
                    port: 8445,
                    service: Some("default/web-local:http".into()),
                });
        }
        i
    };
    let risk = v(Kind::EtpLocalDrop, Severity::Risk, "203.0.113.10:8445/tcp");
    assert!(
        verdicts(&nft(true)).contains(&risk),
        "{:#?}",
        verdicts(&nft(true))
    );
    assert!(
        verdicts(&nft(false))
            .iter()
            .all(|(k, _, _)| *k != Kind::EtpLocalDrop),
        "{:#?}",
        verdicts(&nft(false))
    );
    let findings = rules::judge(&nft(true));
    let f = findings
        .iter()
        .find(|f| f.kind == Kind::EtpLocalDrop)
        .unwrap();
    assert!(f.summary.contains("default/web-local"), "{}", f.summary);
    assert_holds(
        &f.evidence,
        &[
            "map no-endpoint-services has the element 203.0.113.10 . tcp . 8445 comment \
             \"default/web-local:http\" : drop",
            "198.19.2.10:30080",
        ],
    );
    let remedy = f.remedy.join("\n");
    assert!(remedy.starts_with("Cause: this node's pods"), "{remedy}");
    assert_holds(
        &f.remedy,
        &["kubernetes#132456", "set externalTrafficPolicy: Cluster"],
    );
}

/// With the Services and EndpointSlices listed, the API's table (what kube-proxy should
/// program) is compared with the dataplane's: all there is said; a Service the rules lack is
/// named by its frontend.
#[test]
fn the_api_table_beside_the_dataplane_names_what_it_lacks() {
    use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
    use serde_json::json;
    let service = |name: &str, cluster_ip: &str, lb: bool| -> Service {
        let mut s = json!({
            "metadata": {"namespace": "default", "name": name},
            "spec": {"type": "ClusterIP", "clusterIP": cluster_ip,
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        });
        if lb {
            s["spec"]["type"] = json!("LoadBalancer");
            s["spec"]["ports"][0]["nodePort"] = json!(30080);
            s["status"] = json!({"loadBalancer": {"ingress": [{"ip": VIP}]}});
        }
        serde_json::from_value(s).unwrap()
    };
    let slice = |name: &str, addr: &str| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": format!("{name}-1"),
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [addr]}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .unwrap()
    };
    let kube_api = |i: &Inputs| {
        rules::judge(i)
            .into_iter()
            .find(|f| f.kind == Kind::KubeApi)
            .unwrap()
    };
    let mut i = lab();
    let web = [service("web", "198.18.100.10", true)];
    let web_slices = [slice("web", "198.19.1.11")];
    services::merge(
        &mut i,
        &web.iter()
            .filter_map(ServiceFacts::from_service)
            .collect::<Vec<_>>(),
    );
    i.api_table = services::api_table(&i, &web, &web_slices);
    let f = kube_api(&i);
    assert_eq!(f.severity, Severity::Info);
    assert!(
        f.summary.contains("the dataplane has all 3 frontend(s)"),
        "{}",
        f.summary
    );

    let both = [web[0].clone(), service("api", "198.18.100.20", false)];
    let slices = [web_slices[0].clone(), slice("api", "198.19.1.12")];
    i.api_table = services::api_table(&i, &both, &slices);
    let f = kube_api(&i);
    assert_eq!(f.severity, Severity::Info, "evidence, not a verdict");
    assert!(f.summary.contains("lacks 1 of the 4"), "{}", f.summary);
    assert_eq!(
        f.evidence,
        ["missing from the dataplane: default/api:http at 198.18.100.20:80/tcp"]
    );

    // EndpointSlices not listed: said, nothing compared.
    i.api_table = None;
    i.api_table_error = Some("listing EndpointSlices: 403".into());
    let f = kube_api(&i);
    assert_eq!(f.severity, Severity::Info);
    assert_eq!(
        f.evidence,
        ["not compared with the dataplane: listing EndpointSlices: 403"]
    );
}
