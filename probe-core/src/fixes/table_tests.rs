//! Issue 35's table: provider x Service shape x kind x facts -> the fixes offered, in order,
//! and the ids that must never appear. Every case of its items 1-9 is a row.

use std::collections::BTreeMap;

use LoopbackKind::{Hairpin, HealthcheckBlackhole, ServiceSelfLoop, VipPortUnserved};
use probe_contract::{Layer, LoopbackKind, Proto, SnatState};
use serde_json::json;

use super::*;
use crate::test_events::assert_some_line_has;

/// A confirmed loop of `kind` on a Service read from the API: TCP port 80, Cluster policy, LB
/// IP published with ipMode VIP, kube-proxy on the node and binding the IP, no annotations.
fn base(provider: Provider, kind: LoopbackKind) -> Facts {
    Facts {
        kind,
        provider,
        proto: Proto::Tcp,
        port: Some(80),
        source: match kind {
            HealthcheckBlackhole | LoopbackKind::LbProbeRefused => Some(Source::Lb),
            VipPortUnserved => None,
            LoopbackKind::VipAsSource => Some(Source::Node),
            Hairpin
            | ServiceSelfLoop
            | LoopbackKind::EtpLocalDrop
            | LoopbackKind::ProxyProtocolShortCircuit
            | LoopbackKind::StaleUdpConntrack
            | LoopbackKind::SourceRangesDrop => Some(Source::Pod),
        },
        snat: SnatState::No,
        layer: (kind == Hairpin).then_some(Layer::L4),
        service: Some("shop/web".into()),
        etp: Some(Etp::Cluster),
        ip_mode: Some(IpMode::Vip),
        lb_ip_published: Some(true),
        kube_proxy: Some(true),
        service_read: true,
        load_balancer_class: None,
        annotations: BTreeMap::new(),
        kube_proxy_binds: true,
        self_loop: None,
        lb_probe: None,
    }
}

fn set(f: &mut Facts, key: &str, value: &str) {
    f.annotations.insert(key.into(), value.into());
}

fn local(f: &mut Facts) {
    f.etp = Some(Etp::Local);
}

fn aws_lbc(f: &mut Facts) {
    f.load_balancer_class = Some("service.k8s.aws/nlb".into());
}

const TG: &str = "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
const AWS_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";

struct Row {
    /// The issue item and what the row shows.
    case: &'static str,
    provider: Provider,
    kind: LoopbackKind,
    /// The Service's shape and the facts seen.
    shape: fn(&mut Facts),
    offered: &'static [&'static str],
    never: &'static [&'static str],
}

fn rows() -> Vec<Row> {
    use Provider::*;
    vec![
        Row {
            case: "1: Tencent black hole: the documented annotation, then the CLB switch",
            provider: Tencent,
            kind: HealthcheckBlackhole,
            shape: |_| {},
            offered: &[
                "tencent-prevent-loopback",
                "tencent-clb-healthcheck-source",
                "ip-mode-proxy",
            ],
            never: &["lb-healthcheck-source"],
        },
        Row {
            case: "1: Tencent layer-4 hairpin under Local: the annotation first",
            provider: Tencent,
            kind: Hairpin,
            shape: local,
            offered: &[
                "tencent-prevent-loopback",
                "etp-cluster",
                "call-by-service-name",
                "snat-pod-egress-to-lb",
            ],
            never: &["tencent-ingress-keepalive"],
        },
        Row {
            case: "1: Tencent layer-7 (Ingress) hairpin: the Ingress keepalive fix",
            provider: Tencent,
            kind: Hairpin,
            shape: |f| f.layer = Some(Layer::L7),
            offered: &[
                "tencent-ingress-keepalive",
                "call-by-service-name",
                "snat-pod-egress-to-lb",
            ],
            never: &["tencent-prevent-loopback", "etp-cluster"],
        },
        Row {
            case: "1: Tencent with prevent-loopback on already: not offered again",
            provider: Tencent,
            kind: HealthcheckBlackhole,
            shape: |f| set(f, "service.cloud.tencent.com/prevent-loopback", "true"),
            offered: &["tencent-clb-healthcheck-source", "ip-mode-proxy"],
            never: &["tencent-prevent-loopback"],
        },
        Row {
            case: "2: ACK unserved port: the hostname annotation answers it",
            provider: Provider::from_provider_id("cn-hangzhou.i-bp1abcdef123456")
                .unwrap_or(Generic),
            kind: VipPortUnserved,
            shape: |f| f.source = Some(Source::Pod),
            offered: &["ack-lb-hostname", "call-by-service-name", "ip-mode-proxy"],
            never: &[],
        },
        Row {
            case: "2: ACK black hole: ACK checks from 100.64/10, the hostname is no answer",
            provider: Alicloud,
            kind: HealthcheckBlackhole,
            shape: |_| {},
            offered: &["ip-mode-proxy", "lb-healthcheck-source"],
            never: &["ack-lb-hostname"],
        },
        Row {
            case: "2: ACK legacy alicloud hostname key set: read, not offered again",
            provider: Alicloud,
            kind: VipPortUnserved,
            shape: |f| {
                f.source = Some(Source::Pod);
                set(
                    f,
                    "service.beta.kubernetes.io/alicloud-loadbalancer-hostname",
                    "lb.example.com",
                );
            },
            offered: &["call-by-service-name", "ip-mode-proxy"],
            never: &["ack-lb-hostname"],
        },
        Row {
            case: "2: ACK hostname published, Local: no guard, the hairpin still gets fixes",
            provider: Alicloud,
            kind: Hairpin,
            shape: |f| {
                local(f);
                set(
                    f,
                    "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname",
                    "lb.example.com",
                );
                f.lb_ip_published = Some(false);
                f.ip_mode = None;
            },
            offered: &["call-by-service-name", "snat-pod-egress-to-lb"],
            never: &["etp-cluster", "ack-lb-hostname"],
        },
        Row {
            case: "3: GCE host-network caller, LB IP made local by the guest agent's route",
            provider: Gce,
            kind: VipPortUnserved,
            shape: |f| {
                f.source = Some(Source::Node);
                f.kube_proxy_binds = false;
            },
            offered: &["call-by-service-name"],
            never: &["ip-mode-proxy", "snat-pod-egress-to-lb"],
        },
        Row {
            case: "3/5: GCE pod hairpin: no SNAT advice (the guest agent's route keeps it local)",
            provider: Gce,
            kind: Hairpin,
            shape: local,
            offered: &["etp-cluster", "call-by-service-name"],
            never: &["snat-pod-egress-to-lb"],
        },
        Row {
            case: "4: reference 002's shape: Local, kube-proxy programs the LB IP",
            provider: Generic,
            kind: Hairpin,
            shape: local,
            offered: &[
                "etp-cluster",
                "call-by-service-name",
                "snat-pod-egress-to-lb",
            ],
            never: &[],
        },
        Row {
            case: "4: ipMode Proxy: kube-proxy writes no rule, the policy changes nothing",
            provider: Generic,
            kind: Hairpin,
            shape: |f| {
                local(f);
                f.ip_mode = Some(IpMode::Proxy);
            },
            offered: &["call-by-service-name", "snat-pod-egress-to-lb"],
            never: &["etp-cluster"],
        },
        Row {
            case: "4: hostname-only LB: no rule for the IP",
            provider: Generic,
            kind: Hairpin,
            shape: |f| {
                local(f);
                f.lb_ip_published = Some(false);
                f.ip_mode = None;
            },
            offered: &["call-by-service-name", "snat-pod-egress-to-lb"],
            never: &["etp-cluster"],
        },
        Row {
            case: "4: no kube-proxy (e.g. a CNI replacing it)",
            provider: Generic,
            kind: Hairpin,
            shape: |f| {
                local(f);
                f.kube_proxy = Some(false);
            },
            offered: &["call-by-service-name", "snat-pod-egress-to-lb"],
            never: &["etp-cluster"],
        },
        Row {
            case: "4: kube-proxy not known: etp-cluster ranked below, with its precondition",
            provider: Generic,
            kind: Hairpin,
            shape: |f| {
                local(f);
                f.kube_proxy = None;
            },
            offered: &[
                "call-by-service-name",
                "etp-cluster",
                "snat-pod-egress-to-lb",
            ],
            never: &[],
        },
        Row {
            case: "5/6: AWS LB controller, instance targets, client IP kept: no SNAT advice",
            provider: Aws,
            kind: Hairpin,
            shape: |f| {
                local(f);
                aws_lbc(f);
            },
            offered: &[
                "aws-nlb-target-type-ip",
                "aws-preserve-client-ip-off",
                "etp-cluster",
                "call-by-service-name",
            ],
            never: &["snat-pod-egress-to-lb"],
        },
        Row {
            case: "5: Azure internal LB: SNAT turns the pod loop into a node loop",
            provider: Azure,
            kind: Hairpin,
            shape: local,
            offered: &["etp-cluster", "call-by-service-name"],
            never: &["snat-pod-egress-to-lb"],
        },
        Row {
            case: "6: explicit preserve_client_ip.enabled=true: IP targets would keep it too",
            provider: Aws,
            kind: Hairpin,
            shape: |f| {
                aws_lbc(f);
                set(f, TG, "preserve_client_ip.enabled=true");
            },
            offered: &["aws-preserve-client-ip-off", "call-by-service-name"],
            never: &["aws-nlb-target-type-ip"],
        },
        Row {
            case: "6: per-port attributes (v2.14+) set preserve for port 80",
            provider: Aws,
            kind: Hairpin,
            shape: |f| {
                aws_lbc(f);
                set(f, &format!("{TG}.80"), "preserve_client_ip.enabled=true");
            },
            offered: &["aws-preserve-client-ip-off", "call-by-service-name"],
            never: &["aws-nlb-target-type-ip"],
        },
        Row {
            case: "6: aws-load-balancer-type nlb-ip: IP targets already",
            provider: Aws,
            kind: Hairpin,
            shape: |f| set(f, AWS_TYPE, "nlb-ip"),
            offered: &["call-by-service-name"],
            never: &[
                "aws-nlb-target-type-ip",
                "aws-preserve-client-ip-off",
                "snat-pod-egress-to-lb",
            ],
        },
        Row {
            case: "6: in-tree cloud-provider-aws NLB (v1.34+ reads the attribute)",
            provider: Aws,
            kind: Hairpin,
            shape: |f| set(f, AWS_TYPE, "nlb"),
            offered: &["aws-in-tree-preserve-client-ip-off", "call-by-service-name"],
            never: &["aws-nlb-target-type-ip", "aws-preserve-client-ip-off"],
        },
        Row {
            case: "6: EKS Auto Mode class: the target type only",
            provider: Provider::from_service(Some("eks.amazonaws.com/nlb"), &BTreeMap::new(), &[])
                .unwrap_or(Generic),
            kind: Hairpin,
            shape: |f| f.load_balancer_class = Some("eks.amazonaws.com/nlb".into()),
            offered: &["aws-nlb-target-type-ip", "call-by-service-name"],
            never: &[
                "aws-preserve-client-ip-off",
                "aws-in-tree-preserve-client-ip-off",
            ],
        },
        Row {
            case: "6/9: UDP keeps the client IP on every target type: no AWS client-IP fix",
            provider: Aws,
            kind: Hairpin,
            shape: |f| {
                local(f);
                aws_lbc(f);
                f.proto = Proto::Udp;
            },
            offered: &["etp-cluster", "call-by-service-name"],
            never: &[
                "aws-nlb-target-type-ip",
                "aws-preserve-client-ip-off",
                "snat-pod-egress-to-lb",
            ],
        },
        Row {
            case: "7: Hetzner IPVS black hole: disable-private-ingress",
            provider: Hcloud,
            kind: HealthcheckBlackhole,
            shape: |_| {},
            offered: &[
                "hcloud-disable-private-ingress",
                "ip-mode-proxy",
                "lb-healthcheck-source",
            ],
            never: &[],
        },
        Row {
            case: "7: Hetzner with disable-private-ingress on already",
            provider: Hcloud,
            kind: HealthcheckBlackhole,
            shape: |f| {
                set(
                    f,
                    "load-balancer.hetzner.cloud/disable-private-ingress",
                    "true",
                )
            },
            offered: &["ip-mode-proxy", "lb-healthcheck-source"],
            never: &["hcloud-disable-private-ingress"],
        },
        Row {
            case: "7: OpenStack black hole: the hostname annotation",
            provider: OpenStack,
            kind: HealthcheckBlackhole,
            shape: |_| {},
            offered: &[
                "openstack-lb-hostname",
                "ip-mode-proxy",
                "lb-healthcheck-source",
            ],
            never: &[],
        },
        Row {
            case: "8: an unknown ipMode (Router) is not taken for VIP",
            provider: Generic,
            kind: HealthcheckBlackhole,
            shape: |f| f.ip_mode = Some(IpMode::Other("Router".into())),
            offered: &["lb-healthcheck-source"],
            never: &["ip-mode-proxy"],
        },
        Row {
            case: "9: service_self_loop gets its fix",
            provider: Generic,
            kind: ServiceSelfLoop,
            shape: |_| {},
            offered: &["restore-pod-hairpin"],
            never: &["etp-cluster", "call-by-service-name"],
        },
    ]
}

#[test]
fn issue_35_table() {
    let mut failures = Vec::new();
    for row in rows() {
        let mut f = base(row.provider, row.kind);
        (row.shape)(&mut f);
        let got: Vec<String> = fixes(&f).into_iter().map(|x| x.id).collect();
        if got != row.offered {
            failures.push(format!(
                "{}: offered {got:?}, want {:?}",
                row.case, row.offered
            ));
        }
        for id in row.never {
            if got.iter().any(|g| g == id) {
                failures.push(format!("{}: {id} must not appear ({got:?})", row.case));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Item 6: the per-port annotation is the one patched when it sets the attribute; the side
/// effect names the PROXY protocol clash.
#[test]
fn the_aws_per_port_attribute_is_patched_where_it_is_set() {
    let mut f = base(Provider::Aws, Hairpin);
    aws_lbc(&mut f);
    let port_key = format!("{TG}.80");
    set(
        &mut f,
        &port_key,
        "preserve_client_ip.enabled=true,stickiness.enabled=true",
    );
    let fix = fixes(&f)
        .into_iter()
        .find(|x| x.id == "aws-preserve-client-ip-off")
        .unwrap();
    let patch = &fix.patch.as_ref().unwrap()["metadata"]["annotations"];
    assert_eq!(
        patch[port_key.as_str()],
        "stickiness.enabled=true,preserve_client_ip.enabled=false"
    );
    assert!(patch.get(TG).is_none(), "{patch}");
    assert_some_line_has(&fix.side_effects, "must send the PROXY header too");
}

/// Items 2 and 8: what the facts read shows as written.
#[test]
fn unknown_ip_modes_stay_as_written_and_hostnames_are_no_guard() {
    assert_eq!(IpMode::from_api("Router"), IpMode::Other("Router".into()));
    assert_eq!(IpMode::from_api("Router").as_str(), "Router");
    assert_eq!(IpMode::from_api("VIP"), IpMode::Vip);
    let ann: BTreeMap<String, String> = [
        (
            "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname".to_string(),
            "lb.example.com".to_string(),
        ),
        (
            "service.cloud.tencent.com/prevent-loopback".to_string(),
            "true".to_string(),
        ),
    ]
    .into();
    assert_eq!(
        crate::service::loop_guards(&ann),
        ["service.cloud.tencent.com/prevent-loopback"]
    );
    let entry = TABLE.iter().find(|e| e.id == "ip-mode-proxy").unwrap();
    assert!(entry.preconditions.iter().any(|p| p.contains("hcloud")));
}

/// Item 9: a risk's facts take the Service's protocol, so a UDP Service gets no TCP-only fix.
#[test]
fn a_udp_service_s_risk_is_udp() {
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "dns", "annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-type": "external"}},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "ports": [{"protocol": "UDP", "port": 53, "nodePort": 30053}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.53"}]}},
    }))
    .unwrap();
    let svc = ServiceFacts::from_service(&svc).unwrap();
    let f = Facts::of_risk(
        Hairpin,
        "203.0.113.53".parse().unwrap(),
        &svc,
        Provider::Aws,
    );
    assert_eq!(f.proto, Proto::Udp);
    let ids: Vec<String> = fixes(&f).into_iter().map(|x| x.id).collect();
    assert!(!ids.iter().any(|id| id.starts_with("aws-")), "{ids:?}");
}
