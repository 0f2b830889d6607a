//! The remedy table: kind x externalTrafficPolicy (rules, API: Local, Cluster, unknown) x
//! names (API attribution or none) x sender (pod, node, VIP). Each remedy list is checked
//! against the facts it was built from: no sentence contradicts the facts or another sentence,
//! none repeats, the in-cluster call advice comes once, and the subject is the sender.

use std::net::IpAddr;

use probe_contract::{
    Layer, LoopbackEvent, LoopbackKind, Proto, SnatState,
    facts::{
        AddressOwner, Etp, Facts, ProxyMode, SelfLoopMissing, ServiceFact, SourceKind,
        VipSourceSide,
    },
};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn event(kind: LoopbackKind, source: SourceKind) -> LoopbackEvent {
    let (src, dst, dst_port, vip_port) = match kind {
        LoopbackKind::HealthcheckBlackhole => ("203.0.113.10", "198.18.0.2", 30080, None),
        LoopbackKind::VipAsSource => ("203.0.113.10", "198.19.1.11", 8080, None),
        LoopbackKind::VipPortUnserved => ("198.19.1.10", "203.0.113.10", 443, Some(443)),
        LoopbackKind::Hairpin => ("198.19.1.10", "198.18.0.2", 30080, Some(80)),
        LoopbackKind::ServiceSelfLoop => ("198.19.1.11", "198.19.1.11", 8080, Some(80)),
        LoopbackKind::EtpLocalDrop => ("198.19.1.10", "203.0.113.10", 8445, Some(8445)),
        LoopbackKind::ProxyProtocolShortCircuit => ("198.19.1.10", "198.19.1.11", 9443, Some(9443)),
        LoopbackKind::StaleUdpConntrack => ("198.19.1.10", "198.19.1.20", 8125, Some(8125)),
        LoopbackKind::SourceRangesDrop => ("198.19.1.10", "203.0.113.10", 80, Some(80)),
        LoopbackKind::LbProbeRefused => ("35.191.0.10", "198.18.0.2", 10256, None),
    };
    let src = match (kind, source) {
        (LoopbackKind::Hairpin | LoopbackKind::VipPortUnserved, SourceKind::Node) => "198.18.0.2",
        _ => src,
    };
    LoopbackEvent {
        vip: Some(ip("203.0.113.10")),
        vip_port,
        dst: ip(dst),
        snat: SnatState::No,
        layer: (kind == LoopbackKind::Hairpin).then_some(Layer::L4),
        facts: Facts {
            source,
            owner: Some(AddressOwner::VipInterface {
                iface: "kube-ipvs0".into(),
            }),
            masquerade_rules: 1,
            side: (kind == LoopbackKind::VipAsSource).then_some(VipSourceSide::Receiving),
            self_loop: (kind == LoopbackKind::ServiceSelfLoop).then_some(
                SelfLoopMissing::HairpinSnat {
                    loop_back_entry: Some(false),
                },
            ),
            proxy_mode: Some(ProxyMode::Ipvs),
            ..Facts::default()
        },
        ..placeholder(kind, ip(src), dst_port)
    }
}

pub(super) fn named(e: &mut LoopbackEvent, etp_api: Option<Etp>) {
    e.client_pod = (e.facts.source == SourceKind::Pod).then(|| "shop/client-1".to_string());
    e.service = Some("shop/web".into());
    e.facts.etp_api = etp_api;
    e.facts.ip_mode = Some("VIP".into());
    e.facts.service = Some(ServiceFact {
        namespace: "shop".into(),
        name: "web".into(),
        uid: Some("u-1".into()),
        port: Some(80),
        port_name: Some("http".into()),
        ports: vec!["80/TCP".into()],
        health_check_node_port: (etp_api == Some(Etp::Local)).then_some(32000),
        annotations: vec![],
    });
}

/// Statements of a policy (not conditions or advice): "has/uses externalTrafficPolicy: X",
/// "(externalTrafficPolicy: X)" or "apply externalTrafficPolicy: X".
fn asserts_policy(line: &str, etp: Etp) -> bool {
    let p = format!("externalTrafficPolicy: {}", etp.as_str());
    [
        format!("has {p}"),
        format!("uses {p}"),
        format!("({p}"),
        format!("apply {p}"),
    ]
    .iter()
    .any(|s| line.contains(s.as_str()))
}

/// Advice to set the policy to `etp`.
fn advises_policy(line: &str, etp: Etp) -> bool {
    line.contains(&format!("et externalTrafficPolicy: {}", etp.as_str()))
}

/// The kinds whose loop runs through a local VIP (its owner has to change something).
fn owner_matters(kind: LoopbackKind) -> bool {
    matches!(
        kind,
        LoopbackKind::HealthcheckBlackhole
            | LoopbackKind::VipPortUnserved
            | LoopbackKind::VipAsSource
    )
}

fn check(e: &LoopbackEvent, what: &str) {
    let r = build(e);
    let f = &e.facts;
    let all = r.join("\n");
    assert!(r[0].starts_with("Cause: "), "{what}: {r:#?}");
    // None repeats, none has a run of spaces.
    for (i, line) in r.iter().enumerate() {
        assert!(!line.contains("  "), "{what}: a run of spaces in {line:?}");
        assert!(!r[..i].contains(line), "{what}: repeated {line:?}");
    }
    let dns = r
        .iter()
        .filter(|l| l.contains("cluster DNS name") || l.contains(".svc.cluster.local"))
        .count();
    assert!(
        dns <= 1,
        "{what}: the in-cluster call advice {dns} times: {r:#?}"
    );
    // The policy: never asserted against the facts, never advised when already in place.
    let mismatch = f.etp_mismatch().is_some();
    match f.etp() {
        Some(etp) => {
            let other = if etp == Etp::Local {
                Etp::Cluster
            } else {
                Etp::Local
            };
            for line in r
                .iter()
                .filter(|l| !l.starts_with("This node's kube-proxy rules"))
            {
                assert!(
                    !asserts_policy(line, other),
                    "{what}: says {} against the facts' {}: {line}",
                    other.as_str(),
                    etp.as_str()
                );
                assert!(
                    !advises_policy(line, etp),
                    "{what}: advises the policy in place: {line}"
                );
            }
        }
        None => {
            for etp in [Etp::Local, Etp::Cluster] {
                assert!(
                    !r.iter()
                        .any(|l| asserts_policy(l, etp) && !l.contains("kube-proxy does so under")),
                    "{what}: asserts {} with no policy known: {r:#?}",
                    etp.as_str()
                );
            }
        }
    }
    // Said where the policy matters (an unserved port has no policy to disagree on, a
    // PROXY-protocol short-circuit happens under either policy, and a stale UDP entry and a
    // refused LB probe under either too).
    let policy_matters = !matches!(
        e.kind,
        LoopbackKind::VipPortUnserved
            | LoopbackKind::ServiceSelfLoop
            | LoopbackKind::ProxyProtocolShortCircuit
            | LoopbackKind::StaleUdpConntrack
            | LoopbackKind::SourceRangesDrop
            | LoopbackKind::LbProbeRefused
    );
    assert_eq!(
        r.iter()
            .filter(|l| l.starts_with("This node's kube-proxy rules apply"))
            .count(),
        usize::from(mismatch && policy_matters),
        "{what}: the rules/API disagreement said once when there is one: {r:#?}"
    );
    // The subject.
    let cause = &r[0];
    match e.kind {
        LoopbackKind::HealthcheckBlackhole => {
            assert!(cause.contains("the LB"), "{what}: {cause}");
        }
        LoopbackKind::VipAsSource => {
            assert!(cause.contains("host-network"), "{what}: {cause}");
        }
        LoopbackKind::ServiceSelfLoop => {
            assert!(cause.contains("pod 198.19.1.11"), "{what}: {cause}");
        }
        LoopbackKind::EtpLocalDrop => {
            let caller = match f.source {
                SourceKind::Node => "host-network caller on this node",
                _ => "the pod 198.19.1.10",
            };
            assert!(cause.contains(caller), "{what}: {cause}");
            assert!(cause.contains("no-endpoint-services"), "{what}: {cause}");
            assert!(
                all.contains("kubernetes#132456"),
                "{what}: the fixed release"
            );
        }
        LoopbackKind::ProxyProtocolShortCircuit => {
            assert!(cause.contains("PROXY protocol"), "{what}: {cause}");
        }
        LoopbackKind::StaleUdpConntrack => {
            assert!(cause.contains("conntrack entry"), "{what}: {cause}");
            assert!(all.contains("conntrack -D"), "{what}: the delete line");
        }
        LoopbackKind::SourceRangesDrop => {
            assert!(
                cause.contains("loadBalancerSourceRanges"),
                "{what}: {cause}"
            );
            assert!(
                all.contains("kubernetes#109575"),
                "{what}: the upstream issue"
            );
        }
        LoopbackKind::LbProbeRefused => {
            assert!(cause.contains("the LB's health probe"), "{what}: {cause}");
            assert!(cause.contains("35.191.0.0/16"), "{what}: {cause}");
        }
        LoopbackKind::Hairpin | LoopbackKind::VipPortUnserved => match f.source {
            SourceKind::Pod => {
                assert!(cause.contains("pod "), "{what}: {cause}");
                if let Some(pod) = &e.client_pod {
                    assert!(all.contains(pod.as_str()), "{what}: {pod} not named");
                }
                assert!(!cause.contains("this node ("), "{what}: {cause}");
            }
            SourceKind::Node => {
                assert!(cause.contains("this node (198.18.0.2)"), "{what}: {cause}");
                assert!(!all.contains("pod 198.18.0.2"), "{what}: {all}");
                assert!(!all.contains("Masquerade (SNAT) pod traffic"), "{what}");
                assert!(!all.contains("In pod "), "{what}");
            }
            _ => {}
        },
    }
    // The owner: advice to kube-proxy (kube-ipvs0, ipMode) only for kube-proxy's binding; an
    // owner that is not kube-proxy is addressed by its own fix.
    match &f.owner {
        Some(AddressOwner::VipInterface { .. }) => {}
        Some(AddressOwner::LocalRoute { protocol: 66, .. }) if owner_matters(e.kind) => {
            assert!(!all.contains("kube-ipvs0"), "{what}: {all}");
            assert!(!all.contains("a controller that sets"), "{what}: {all}");
            assert!(all.contains("guest-agent#555"), "{what}: {all}");
            assert!(
                !all.contains("instance_configs"),
                "{what}: no node-file edit: {all}"
            );
        }
        Some(AddressOwner::Interface { iface, announcer }) if owner_matters(e.kind) => {
            assert!(!all.contains("kube-ipvs0"), "{what}: {all}");
            assert!(!all.contains("a controller that sets"), "{what}: {all}");
            assert!(all.contains(&format!("on {iface}")), "{what}: {all}");
            // An announcer's VIP is the announcer's to move, and the checks' to leave.
            if let Some(a) = announcer {
                assert!(all.contains(&format!("by {}", a.name)), "{what}: {all}");
                assert!(all.contains("from a source that is not"), "{what}: {all}");
            }
        }
        _ => assert!(!all.contains("a controller that sets"), "{what}: {all}"),
    }
    // A host listener: no Service rule, so no policy or NodePort advice.
    if f.host_listener {
        assert!(
            all.contains("externalTrafficPolicy does not apply"),
            "{what}: {all}"
        );
        assert!(!all.contains("et externalTrafficPolicy"), "{what}: {all}");
        assert!(!all.contains("NodePort 30080"), "{what}: {all}");
    }
    // Names: the API's Service is the one named; without names, no invented name.
    match &f.service {
        Some(s) => assert!(all.contains(&s.key()), "{what}: {all}"),
        None if e.service.is_none() => assert!(!all.contains("shop/"), "{what}: {all}"),
        None => {}
    }
}

/// Who makes the local address local: kube-proxy (kube-ipvs0), keepalived / kube-vip (a NIC
/// address), the GCE guest agent (a protocol 66 route), an operator's static route, unknown.
pub(super) fn owners() -> [Option<AddressOwner>; 6] {
    [
        Some(AddressOwner::VipInterface {
            iface: "kube-ipvs0".into(),
        }),
        Some(AddressOwner::interface("eth0")),
        Some(AddressOwner::Interface {
            iface: "lo".into(),
            announcer: Some(probe_contract::facts::Announcer {
                name: "kube-vip".into(),
                why: "a deprecated /32 on lo".into(),
                pod: None,
            }),
        }),
        Some(AddressOwner::local_route(Some("eth0".into()), 66)),
        Some(AddressOwner::local_route(None, 4)),
        None,
    ]
}

/// Every case of the remedy table, in the order the golden digest takes them: per kind and
/// sender, each owner x the rules' policy x names (and with names, the API's policy); then for
/// the hairpin, a host-network listener with and without its pod named, per owner. `visit` gets
/// each event and a line that says which case it is.
pub(super) fn each_case(mut visit: impl FnMut(&LoopbackEvent, &str)) {
    let policies = [None, Some(Etp::Local), Some(Etp::Cluster)];
    for kind in LoopbackKind::ALL {
        for source in [SourceKind::Pod, SourceKind::Node, SourceKind::Vip] {
            for owner in owners() {
                for rules in policies {
                    for names in [false, true] {
                        let apis: &[Option<Etp>] = if names { &policies } else { &[None] };
                        for api in apis {
                            let mut e = event(kind, source);
                            e.facts.etp_rules = rules;
                            e.facts.owner = owner.clone();
                            if names {
                                named(&mut e, *api);
                            }
                            let what = format!(
                                "{} from {} owner={owner:?} rules={rules:?} api={api:?} \
                                 names={names}",
                                kind.as_str(),
                                source.as_str()
                            );
                            visit(&e, &what);
                        }
                    }
                }
            }
            // A hairpin to a host-network listener: no NodePort, no Service, no policy.
            if kind == LoopbackKind::Hairpin {
                for owner in owners() {
                    for listener in [None, Some(apiserver())] {
                        let mut e = event(kind, source);
                        e.dst_port = 6443;
                        e.facts.owner = owner.clone();
                        e.facts.host_listener = true;
                        e.listener = listener;
                        let what = format!(
                            "host-listener hairpin from {} owner={owner:?} listener={}",
                            source.as_str(),
                            e.listener.is_some()
                        );
                        visit(&e, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn every_kind_policy_name_sender_and_owner_gives_a_consistent_remedy() {
    let mut cases = 0;
    each_case(|e, what| {
        check(e, what);
        if e.facts.host_listener && e.listener.is_some() {
            assert!(
                build(e)[0].contains("host-network pod kube-system/kube-apiserver"),
                "{what}"
            );
        }
        cases += 1;
    });
    assert_eq!(cases, LoopbackKind::ALL.len() * 3 * 6 * 3 * 4 + 3 * 6 * 2);
}

pub(super) fn apiserver() -> probe_contract::Listener {
    probe_contract::Listener {
        addr: ip("0.0.0.0"),
        port: 6443,
        proto: Proto::Tcp,
        uid: 0,
        inode: 777,
        process: Some("kube-apiserver".into()),
        pid: Some(4242),
        pod: Some("kube-system/kube-apiserver-node-a".into()),
    }
}

/// The demo's case: IPVS forwarded a VIP-sourced call without SNAT while the API says
/// Cluster; the remedy must not say Local, nor advise Cluster.
#[test]
fn vip_as_source_with_a_cluster_service_does_not_claim_local() {
    let mut e = event(LoopbackKind::VipAsSource, SourceKind::Vip);
    named(&mut e, Some(Etp::Cluster));
    let r = build(&e);
    let all = r.join("\n");
    assert!(!all.contains("externalTrafficPolicy: Local and"), "{all}");
    assert!(
        all.contains("Service shop/web has externalTrafficPolicy: Cluster"),
        "{all}"
    );
    assert!(
        !all.contains("Or set externalTrafficPolicy: Cluster"),
        "{all}"
    );
    e.facts.etp_api = Some(Etp::Local);
    let all = build(&e).join("\n");
    assert!(all.contains("has externalTrafficPolicy: Local"), "{all}");
    assert!(all.contains("Or set externalTrafficPolicy: Cluster on Service shop/web"));
}

/// The hairpin's in-cluster advice: once, named when the API names the Service and pod.
#[test]
fn hairpin_says_the_dns_advice_once_and_names_the_pod_and_service() {
    let mut e = event(LoopbackKind::Hairpin, SourceKind::Pod);
    named(&mut e, Some(Etp::Local));
    e.facts.etp_rules = Some(Etp::Local);
    let r = build(&e);
    let dns: Vec<&String> = r
        .iter()
        .filter(|l| l.contains("svc.cluster.local"))
        .collect();
    assert_eq!(dns.len(), 1, "{r:#?}");
    assert!(
        dns[0].starts_with(
            "In pod shop/client-1: call web.shop.svc.cluster.local:80 (Service shop/web) instead \
             of the LB address 203.0.113.10:80"
        ),
        "{}",
        dns[0]
    );
    assert!(
        r.iter()
            .any(|l| l.contains("kubectl -n shop patch service web"))
    );
}

/// The owner of the address decides who the "stop binding" advice goes to.
#[test]
fn the_unbind_advice_addresses_the_owner() {
    let mut e = event(LoopbackKind::HealthcheckBlackhole, SourceKind::Vip);
    let kube = build(&e).join("\n");
    assert!(kube.contains("bound on kube-ipvs0"), "{kube}");
    assert!(kube.contains("ipMode: Proxy"), "{kube}");
    e.facts.owner = Some(AddressOwner::LocalRoute {
        iface: None,
        protocol: 66,
        protocol_name: "66".into(),
    });
    let route = build(&e).join("\n");
    assert!(route.contains("not by kube-proxy"), "{route}");
    assert!(route.contains("ClusterIP"), "{route}");
    assert!(!route.contains("instance_configs"), "{route}");
    e.facts.owner = Some(AddressOwner::local_route(Some("lo".into()), 4));
    let manual = build(&e).join("\n");
    assert!(
        manual.contains("ip route del local 203.0.113.10 table local"),
        "{manual}"
    );
    assert!(!manual.contains("kube-ipvs0"), "{manual}");
    assert!(!route.contains("kube-ipvs0"), "{route}");
    e.facts.owner = None;
    let unknown = build(&e).join("\n");
    assert!(!unknown.contains("kube-ipvs0"), "{unknown}");
    assert!(unknown.contains("ip route show table local 203.0.113.10"));
    // ipMode: Proxy already set and still bound: not advised again.
    e.facts.owner = Some(AddressOwner::VipInterface {
        iface: "kube-ipvs0".into(),
    });
    e.facts.ip_mode = Some("Proxy".into());
    let proxy = build(&e).join("\n");
    assert!(proxy.contains("already sets ipMode: Proxy"), "{proxy}");
    assert!(!proxy.contains("a controller that sets"), "{proxy}");
}

/// `service_self_loop`: each missing piece gets its own fix, in the node's kube-proxy mode,
/// and nothing about LB settings, externalTrafficPolicy or the VIP's owner.
#[test]
fn a_self_loop_remedy_names_the_missing_piece_only() {
    let rows: [(SelfLoopMissing, Option<ProxyMode>, &str); 6] = [
        (
            SelfLoopMissing::HairpinSnat {
                loop_back_entry: Some(false),
            },
            Some(ProxyMode::Ipvs),
            "the KUBE-LOOP-BACK ipset entry 198.19.1.11,tcp/udp:8080,198.19.1.11",
        ),
        (
            SelfLoopMissing::HairpinSnat {
                loop_back_entry: Some(true),
            },
            Some(ProxyMode::Ipvs),
            "--match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
        ),
        (
            SelfLoopMissing::HairpinSnat {
                loop_back_entry: None,
            },
            Some(ProxyMode::Iptables),
            "KUBE-SEP-* `-s 198.19.1.11/32 -j KUBE-MARK-MASQ`",
        ),
        (
            SelfLoopMissing::HairpinSnat {
                loop_back_entry: None,
            },
            Some(ProxyMode::Nftables),
            "`ip saddr 198.19.1.11 jump mark-for-masquerade`",
        ),
        (
            SelfLoopMissing::HairpinMode {
                bridge: "cbr0".into(),
                port: "vpod-b".into(),
                br_netfilter: Some(true),
            },
            None,
            "--hairpin-mode=hairpin-veth",
        ),
        (SelfLoopMissing::Undetermined, None, "was not determined"),
    ];
    for (missing, mode, line) in rows {
        let mut e = event(LoopbackKind::ServiceSelfLoop, SourceKind::Pod);
        e.facts.self_loop = Some(missing.clone());
        e.facts.proxy_mode = mode;
        named(&mut e, Some(Etp::Local));
        let r = build(&e);
        let all = r.join("\n");
        assert!(all.contains(line), "{missing:?}: {all}");
        for no in [
            "externalTrafficPolicy",
            "ipMode",
            "kube-ipvs0",
            "health check",
            "Masquerade (SNAT) pod traffic to the LB",
        ] {
            assert!(!all.contains(no), "{missing:?}: {no:?} in {all}");
        }
        assert!(all.contains("Service shop/web"), "{missing:?}: {all}");
        assert!(all.contains("localhost"), "{missing:?}: {all}");
    }
}

/// Every kind has its texts' row, in the contract's order (issue #50: one row per kind).
#[test]
fn every_kind_has_its_texts_in_the_contracts_order() {
    let texts: Vec<LoopbackKind> = crate::correlate::KIND_TEXTS
        .iter()
        .map(|t| t.kind)
        .collect();
    assert_eq!(texts, LoopbackKind::ALL.to_vec());
}
