//! AWS: the NLB keeps the client IP on instance targets, so a pod's call that the NLB sends
//! back to its own node loops ("the connection succeeds only if the request is routed to a
//! different instance": ELB troubleshooting, loopback-timeout). The fixes make the NLB connect
//! from its own address. Three controllers read a Service's annotations differently:
//! - the AWS Load Balancer Controller (`loadBalancerClass: service.k8s.aws/nlb`, or
//!   `aws-load-balancer-type: external | nlb-ip`: pkg/service/service_utils.go
//!   `checkAWSLoadBalancerTypeAnnotation`, kubernetes-sigs/aws-load-balancer-controller at
//!   225f4456);
//! - the in-tree cloud-provider-aws NLB (`aws-load-balancer-type: nlb`);
//! - EKS Auto Mode (`loadBalancerClass: eks.amazonaws.com/nlb`,
//!   https://docs.aws.amazon.com/eks/latest/userguide/auto-configure-nlb.html, which lists
//!   `aws-load-balancer-nlb-target-type`; `target-group-attributes` was not in what we could
//!   read of its table, so only the target type is offered there).
//!
//! UDP (and TCP_UDP, QUIC) target groups always keep the client IP
//! (pkg/service/model_build_target_group.go, comment citing the ELB docs): nothing here fits
//! a UDP loop.

use std::collections::BTreeMap;

use probe_contract::{LoopbackKind, Proto};

use super::{Entry, Facts, Offer, Provider, annotation_patch};

const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
const TARGET_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type";
pub(super) const TG_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
const PRESERVE: &str = "preserve_client_ip.enabled";
const LBC_DOC: &str = "https://kubernetes-sigs.github.io/aws-load-balancer-controller/latest/guide/service/annotations/#target-group-attributes";

/// Who reconciles the Service's NLB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Controller {
    /// AWS Load Balancer Controller.
    Lbc,
    /// cloud-provider-aws's own NLB.
    InTree,
    /// EKS Auto Mode.
    AutoMode,
    /// The Service was not read: the preconditions say so.
    Unread,
}

fn controller(f: &Facts) -> Option<Controller> {
    if !f.service_read {
        return Some(Controller::Unread);
    }
    match f.load_balancer_class.as_deref() {
        Some("service.k8s.aws/nlb") => return Some(Controller::Lbc),
        Some("eks.amazonaws.com/nlb") => return Some(Controller::AutoMode),
        Some(_) => return None,
        None => {}
    }
    match f.annotations.get(TYPE).map(String::as_str) {
        Some("external" | "nlb-ip") => Some(Controller::Lbc),
        Some("nlb") => Some(Controller::InTree),
        // The in-tree Classic ELB proxies TCP: it does not keep the pod's address.
        _ => None,
    }
}

/// `k=v,k=v` as the controllers parse it.
fn attributes(value: &str) -> BTreeMap<String, String> {
    value
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The port's own attributes annotation (`...target-group-attributes.<port>`, LB controller
/// v2.14.0+): its non-empty values override the global ones
/// (`buildPortSpecificTargetGroupAttributes`).
fn port_key(f: &Facts) -> Option<String> {
    f.port.map(|p| format!("{TG_ATTRIBUTES}.{p}"))
}

/// `preserve_client_ip.enabled` as set for the loop's port: the port's annotation, else the
/// global one; None when neither sets it.
fn preserve_set(f: &Facts) -> Option<bool> {
    let of = |key: &str| {
        f.annotations
            .get(key)
            .and_then(|v| attributes(v).get(PRESERVE).cloned())
            .filter(|v| !v.is_empty())
            .map(|v| v.eq_ignore_ascii_case("true"))
    };
    port_key(f)
        .and_then(|k| of(&k))
        .or_else(|| of(TG_ATTRIBUTES))
}

fn ip_targets(f: &Facts) -> bool {
    f.annotations.get(TARGET_TYPE).map(String::as_str) == Some("ip")
        || f.annotations.get(TYPE).map(String::as_str) == Some("nlb-ip")
}

/// Sets `preserve_client_ip.enabled=false` in `key`'s attribute list, keeping the others.
fn preserve_off_patch(f: &Facts, key: &str) -> (serde_json::Value, serde_json::Value) {
    let mut attrs: Vec<String> = f
        .annotations
        .get(key)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty() && !a.starts_with("preserve_client_ip.enabled="))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    attrs.push(format!("{PRESERVE}=false"));
    annotation_patch(f, key, &attrs.join(","))
}

const PROXY_PROTOCOL_NOTE: &str = "backends then see the NLB's address; PROXY protocol v2 \
     keeps the client IP, but then every in-cluster caller that skips the NLB (by ClusterIP or \
     service name, the usual first fix) must send the PROXY header too";

/// LB controller / Auto Mode: IP targets do not keep a TCP client's address unless
/// `preserve_client_ip.enabled=true` says so (`buildPreserveClientIPFlag`: an explicit
/// attribute wins over the target type's default). Gate: TCP, instance targets now, and no
/// explicit `preserve_client_ip.enabled=true` for the port.
pub(super) static NLB_TARGET_TYPE_IP: Entry = Entry {
    id: "aws-nlb-target-type-ip",
    provider: Provider::Aws,
    kinds: &[LoopbackKind::Hairpin],
    change: "Register pods, not instances, as the NLB's targets (nlb-target-type: ip): for \
             TCP the NLB then does not keep the client IP, so the pod's call comes back from \
             the NLB's address",
    preconditions: &[
        "the Service is reconciled by the AWS Load Balancer Controller or EKS Auto Mode",
        "pods have VPC addresses (Amazon VPC CNI)",
    ],
    side_effects: &[
        PROXY_PROTOCOL_NOTE,
        "the target group is recreated: a short interruption",
    ],
    source: LBC_DOC,
    offer: |f| {
        let c = controller(f)?;
        if c == Controller::InTree || f.proto == Proto::Udp || ip_targets(f) {
            return None;
        }
        (preserve_set(f) != Some(true)).then(|| Offer {
            score: 85,
            patch: Some(annotation_patch(f, TARGET_TYPE, "ip")),
            preconditions: vec![],
        })
    },
};

/// LB controller: `preserve_client_ip.enabled=false` in the target group attributes; the
/// port's own annotation is patched when it sets the attribute (it would override the global
/// one). Gate: TCP, and the client IP kept for the port (explicitly, or by instance targets).
pub(super) static PRESERVE_CLIENT_IP_OFF: Entry = Entry {
    id: "aws-preserve-client-ip-off",
    provider: Provider::Aws,
    kinds: &[LoopbackKind::Hairpin],
    change: "Turn off client IP preservation on the NLB's target group \
             (preserve_client_ip.enabled=false): the pod's call reaches the backend from the \
             NLB's address and its reply goes back through the NLB",
    preconditions: &[
        "the Service is reconciled by the AWS Load Balancer Controller (per-port \
         target-group-attributes.<port>: v2.14.0 or later)",
        "TCP or TLS listeners (UDP always keeps the client IP)",
    ],
    side_effects: &[PROXY_PROTOCOL_NOTE],
    source: LBC_DOC,
    offer: |f| {
        let c = controller(f)?;
        if !matches!(c, Controller::Lbc | Controller::Unread) || f.proto == Proto::Udp {
            return None;
        }
        let kept = preserve_set(f).unwrap_or(!ip_targets(f));
        if !kept {
            return None;
        }
        let port_sets = port_key(f).filter(|k| {
            f.annotations
                .get(k)
                .is_some_and(|v| attributes(v).get(PRESERVE).is_some_and(|v| !v.is_empty()))
        });
        let key = port_sets.unwrap_or_else(|| TG_ATTRIBUTES.to_string());
        Some(Offer {
            score: 82,
            patch: Some(preserve_off_patch(f, &key)),
            preconditions: vec![],
        })
    },
};

/// In-tree cloud-provider-aws NLB (`aws-load-balancer-type: nlb`, instance targets only):
/// `target-group-attributes: preserve_client_ip.enabled=false` is read since v1.34.0 (PR
/// #1214, issue #1160; docs/service_controller.md "working with hairpin connection on
/// internal NLB", kubernetes/cloud-provider-aws at 63ec440c). Gate: TCP, the in-tree NLB, and
/// the attribute not already false.
pub(super) static IN_TREE_PRESERVE_CLIENT_IP_OFF: Entry = Entry {
    id: "aws-in-tree-preserve-client-ip-off",
    provider: Provider::Aws,
    kinds: &[LoopbackKind::Hairpin],
    change: "Turn off client IP preservation on the in-tree NLB's target group \
             (target-group-attributes: preserve_client_ip.enabled=false): the pod's call then \
             reaches its node from the NLB's address",
    preconditions: &[
        "cloud-provider-aws v1.34.0 or later (earlier versions ignore the \
                      annotation)",
    ],
    side_effects: &[PROXY_PROTOCOL_NOTE],
    source: "https://github.com/kubernetes/cloud-provider-aws/blob/master/docs/service_controller.md",
    offer: |f| {
        if controller(f)? != Controller::InTree || f.proto == Proto::Udp {
            return None;
        }
        let set = f
            .annotations
            .get(TG_ATTRIBUTES)
            .and_then(|v| attributes(v).get(PRESERVE).cloned());
        (set.as_deref() != Some("false")).then(|| Offer {
            score: 85,
            patch: Some(preserve_off_patch(f, TG_ATTRIBUTES)),
            preconditions: vec![],
        })
    },
};
