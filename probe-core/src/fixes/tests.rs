use std::collections::{BTreeMap, HashSet};

use probe_contract::{Layer, LoopbackKind, Proto, SnatState};
use serde_json::{Value, json};

use super::*;
use crate::test_events::assert_some_line_has;

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The Service as the facts describe it (what a patch is applied to).
fn model(f: &Facts) -> Value {
    let mut spec = json!({"type": "LoadBalancer"});
    // Unread: as the fixes' preconditions assume (etp-cluster's: Local).
    spec["externalTrafficPolicy"] = json!(match f.etp {
        Some(Etp::Cluster) => "Cluster",
        Some(Etp::Local) | None => "Local",
    });
    json!({"metadata": {"annotations": f.annotations}, "spec": spec})
}

fn all_facts() -> Vec<Facts> {
    let mut out = Vec::new();
    let aws_lbc: BTreeMap<String, String> = [(
        "service.beta.kubernetes.io/aws-load-balancer-type".to_string(),
        "external".to_string(),
    )]
    .into();
    let aws_in_tree: BTreeMap<String, String> = [(
        "service.beta.kubernetes.io/aws-load-balancer-type".to_string(),
        "nlb".to_string(),
    )]
    .into();
    for provider in Provider::ALL {
        for kind in LoopbackKind::ALL {
            for etp in [Some(Etp::Local), Some(Etp::Cluster), None] {
                for ip_mode in [
                    Some(IpMode::Vip),
                    Some(IpMode::Proxy),
                    Some(IpMode::Other("Router".into())),
                    None,
                ] {
                    for source in [
                        Some(Source::Pod),
                        Some(Source::Node),
                        Some(Source::Lb),
                        None,
                    ] {
                        for proto in [Proto::Tcp, Proto::Udp] {
                            for (read, layer) in [
                                (true, Some(Layer::L4)),
                                (true, Some(Layer::L7)),
                                (false, None),
                            ] {
                                for in_tree in [false, true] {
                                    let annotations = match (read, provider, in_tree) {
                                        (true, Provider::Aws, false) => aws_lbc.clone(),
                                        (true, Provider::Aws, true) => aws_in_tree.clone(),
                                        _ => BTreeMap::new(),
                                    };
                                    out.push(Facts {
                                        kind,
                                        provider,
                                        proto,
                                        port: Some(80),
                                        source,
                                        snat: if source == Some(Source::Node) {
                                            SnatState::Yes
                                        } else {
                                            SnatState::No
                                        },
                                        layer,
                                        service: Some("shop/web".into()),
                                        etp: if read { etp } else { None },
                                        ip_mode: if read { ip_mode.clone() } else { None },
                                        lb_ip_published: read.then_some(true),
                                        kube_proxy: read.then_some(true),
                                        service_read: read,
                                        load_balancer_class: None,
                                        annotations,
                                        kube_proxy_binds: true,
                                        self_loop: None,
                                        // The probe a healthz setting answers.
                                        lb_probe: (kind == LoopbackKind::LbProbeRefused).then_some(
                                            LbProbe {
                                                healthz: true,
                                                refused: true,
                                            },
                                        ),
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Every provider x kind x facts: ids unique, sources cited, nothing for another provider,
/// nothing already in place, nothing the facts contradict, undo restores the Service.
#[test]
fn no_fix_contradicts_the_facts_or_is_already_in_place() {
    let mut seen_ids = HashSet::new();
    for f in all_facts() {
        let fixes = fixes(&f);
        let ids: HashSet<&str> = fixes.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids.len(), fixes.len(), "duplicate ids for {f:?}");
        for fix in &fixes {
            seen_ids.insert(fix.id.clone());
            let ctx = format!("{} for {f:?}", fix.id);
            assert!(fix.source.starts_with("https://"), "{ctx}");
            assert!(
                fix.provider == "generic" || fix.provider == f.provider.as_str(),
                "{ctx}: another provider's fix"
            );
            if let Some(patch) = &fix.patch {
                let before = model(&f);
                let mut after = before.clone();
                merge(&mut after, patch);
                assert_ne!(before, after, "{ctx}: already in place");
                merge(&mut after, fix.undo.as_ref().expect("a patch has an undo"));
                assert_eq!(
                    before, after,
                    "{ctx}: the undo does not restore the Service"
                );
                assert_eq!(fix.service.as_deref(), Some("shop/web"), "{ctx}");
            }
            match fix.id.as_str() {
                "etp-cluster" => assert_ne!(f.etp, Some(Etp::Cluster), "{ctx}"),
                "ip-mode-proxy"
                | "ack-lb-hostname"
                | "do-lb-hostname"
                | "openstack-lb-hostname"
                | "hcloud-disable-private-ingress" => {
                    assert_ne!(f.ip_mode, Some(IpMode::Proxy), "{ctx}")
                }
                "snat-pod-egress-to-lb" => assert_eq!(f.source, Some(Source::Pod), "{ctx}"),
                "kube-proxy-healthz-bind" => assert_ne!(f.kube_proxy, Some(false), "{ctx}"),
                "cilium-kpr-healthz-bind" if f.lb_probe.is_some() => {
                    assert_ne!(f.kube_proxy, Some(true), "{ctx}")
                }
                "call-by-service-name" => assert_ne!(f.source, Some(Source::Lb), "{ctx}"),
                "aws-nlb-target-type-ip"
                | "aws-preserve-client-ip-off"
                | "aws-in-tree-preserve-client-ip-off" => {
                    assert_ne!(f.proto, Proto::Udp, "{ctx}")
                }
                _ => {}
            }
            if !f.service_read && fix.provider != "generic" {
                assert!(
                    fix.preconditions.iter().any(|p| p.contains("not read")),
                    "{ctx}: an unread Service must say so"
                );
            }
        }
    }
    // Every entry is reachable.
    let table: HashSet<String> = TABLE.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(seen_ids, table);
    assert_eq!(table.len(), TABLE.len(), "duplicate ids in the table");
}

fn hairpin(provider: Provider, etp: Option<Etp>) -> Facts {
    Facts {
        kind: LoopbackKind::Hairpin,
        provider,
        proto: Proto::Tcp,
        port: Some(80),
        source: Some(Source::Pod),
        snat: SnatState::No,
        layer: Some(Layer::L4),
        service: Some("shop/web".into()),
        etp,
        ip_mode: Some(IpMode::Vip),
        lb_ip_published: Some(true),
        kube_proxy: Some(true),
        service_read: true,
        load_balancer_class: (provider == Provider::Aws).then(|| "service.k8s.aws/nlb".into()),
        annotations: BTreeMap::new(),
        kube_proxy_binds: true,
        self_loop: None,
        lb_probe: None,
    }
}

fn ids(f: &Facts) -> Vec<String> {
    fixes(f).into_iter().map(|f| f.id).collect()
}

#[test]
fn fixes_rank_by_fit_and_the_provider_s_own_come_first() {
    assert_eq!(
        ids(&hairpin(Provider::Generic, Some(Etp::Local))),
        [
            "etp-cluster",
            "call-by-service-name",
            "snat-pod-egress-to-lb"
        ]
    );
    // Cluster already: no "set Cluster".
    assert_eq!(
        ids(&hairpin(Provider::Generic, Some(Etp::Cluster))),
        ["call-by-service-name", "snat-pod-egress-to-lb"]
    );
    assert_eq!(
        ids(&hairpin(Provider::Aws, Some(Etp::Local)))[..3],
        [
            "aws-nlb-target-type-ip",
            "aws-preserve-client-ip-off",
            "etp-cluster"
        ]
    );
    // Tencent: its documented annotation first.
    assert_eq!(
        ids(&hairpin(Provider::Tencent, Some(Etp::Local)))[0],
        "tencent-prevent-loopback"
    );
    let mut hc = hairpin(Provider::DigitalOcean, None);
    hc.kind = LoopbackKind::HealthcheckBlackhole;
    hc.source = Some(Source::Lb);
    assert_eq!(
        ids(&hc),
        ["do-lb-hostname", "ip-mode-proxy", "lb-healthcheck-source"]
    );
}

#[test]
fn an_aws_patch_keeps_the_other_target_group_attributes_and_undoes_to_them() {
    let mut f = hairpin(Provider::Aws, Some(Etp::Local));
    f.annotations.insert(
        aws::TG_ATTRIBUTES.into(),
        "deregistration_delay.timeout_seconds=30,preserve_client_ip.enabled=true".into(),
    );
    let fix = fixes(&f)
        .into_iter()
        .find(|x| x.id == "aws-preserve-client-ip-off")
        .unwrap();
    assert_eq!(
        fix.patch.unwrap()["metadata"]["annotations"][aws::TG_ATTRIBUTES],
        "deregistration_delay.timeout_seconds=30,preserve_client_ip.enabled=false"
    );
    assert_eq!(
        fix.undo.unwrap()["metadata"]["annotations"][aws::TG_ATTRIBUTES],
        "deregistration_delay.timeout_seconds=30,preserve_client_ip.enabled=true"
    );
    // Not the AWS Load Balancer Controller (in-tree): its annotations mean nothing there.
    f.load_balancer_class = None;
    assert!(!ids(&f).iter().any(|id| id.starts_with("aws-")));
}

#[test]
fn without_a_service_name_only_advice_is_offered() {
    let mut f = hairpin(Provider::Generic, Some(Etp::Local));
    f.service = None;
    assert!(fixes(&f).iter().all(|x| x.patch.is_none()));
    assert!(!ids(&f).contains(&"etp-cluster".to_string()));
}

/// A VIP that a NIC address or a `local` route makes local (keepalived, a cloud guest agent):
/// ipMode and hostname annotations do not unbind it, so they are not offered.
#[test]
fn a_vip_not_bound_by_kube_proxy_gets_no_ip_mode_or_hostname_fix() {
    for provider in [
        Provider::Generic,
        Provider::Alicloud,
        Provider::DigitalOcean,
        Provider::OpenStack,
        Provider::Hcloud,
    ] {
        let mut f = hairpin(provider, Some(Etp::Cluster));
        f.kind = LoopbackKind::VipPortUnserved;
        f.source = None;
        let bound = ids(&f);
        assert!(bound.contains(&"ip-mode-proxy".to_string()), "{bound:?}");
        assert_eq!(
            bound
                .iter()
                .any(|id| id.contains("hostname") || id.contains("private-ingress")),
            provider != Provider::Generic,
            "{bound:?}"
        );
        f.kube_proxy_binds = false;
        let other = ids(&f);
        assert!(!other.contains(&"ip-mode-proxy".to_string()), "{other:?}");
        assert!(
            !other
                .iter()
                .any(|id| id.contains("hostname") || id.contains("private-ingress")),
            "{other:?}"
        );
    }
}

/// `service_self_loop`: no Service setting or LB annotation restores a pod's hairpin, so the
/// only fix is the node's hairpin itself, naming the missing piece when the facts know it.
#[test]
fn a_self_loop_gets_the_hairpin_fix_and_nothing_else() {
    for provider in Provider::ALL {
        for etp in [None, Some(Etp::Local), Some(Etp::Cluster)] {
            let mut f = hairpin(provider, etp);
            f.kind = LoopbackKind::ServiceSelfLoop;
            assert_eq!(ids(&f), ["restore-pod-hairpin"], "{provider:?} {etp:?}");
        }
    }
    let mut f = hairpin(Provider::Generic, None);
    f.kind = LoopbackKind::ServiceSelfLoop;
    f.self_loop = Some(probe_contract::facts::SelfLoopMissing::HairpinMode {
        bridge: "cni0".into(),
        port: "veth1".into(),
        br_netfilter: Some(true),
    });
    let fix = &fixes(&f)[0];
    assert!(
        fix.preconditions
            .iter()
            .any(|p| p.contains("cni0 port veth1")),
        "{fix:#?}"
    );
}

/// A short-circuited PROXY-protocol call gets its provider's hostname annotation (the
/// documented way in-cluster calls go through the LB) where the table has one, and no
/// generic fix (none of them adds the header).
#[test]
fn a_proxy_protocol_short_circuit_gets_the_provider_s_hostname_fix_only() {
    for (provider, want) in [
        (Provider::DigitalOcean, vec!["do-lb-hostname"]),
        (Provider::OpenStack, vec!["openstack-lb-hostname"]),
        (Provider::Alicloud, vec!["ack-lb-hostname"]),
        (Provider::Generic, vec![]),
        (Provider::Aws, vec![]),
    ] {
        let mut f = hairpin(provider, Some(Etp::Cluster));
        f.kind = LoopbackKind::ProxyProtocolShortCircuit;
        f.layer = None;
        assert_eq!(ids(&f), want, "{provider:?}");
        // Already published as a hostname (ipMode Proxy): nothing to offer.
        f.ip_mode = Some(IpMode::Proxy);
        assert!(ids(&f).is_empty(), "{provider:?}");
    }
}

/// E2: an annotation value the agent's index cut is never written back by a patch (nor
/// restored by an undo): the fix is still offered, as advice, and says why.
#[test]
fn a_cut_annotation_value_gives_no_patch() {
    let mut f = hairpin(Provider::Aws, Some(Etp::Local));
    let long = format!(
        "deregistration_delay.timeout_seconds=30,{}",
        "stickiness.enabled=true,".repeat(40)
    );
    f.annotations.insert(
        aws::TG_ATTRIBUTES.into(),
        crate::untrusted::text(&long, crate::untrusted::ANNOTATION_VALUE_MAX),
    );
    let fix = fixes(&f)
        .into_iter()
        .find(|x| x.id == "aws-preserve-client-ip-off")
        .unwrap();
    assert_eq!((fix.patch, fix.undo, fix.service), (None, None, None));
    assert_some_line_has(
        &fix.preconditions,
        "computes the patch from the whole Service",
    );
}
