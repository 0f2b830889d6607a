//! Fixes as data (pure): for a confirmed loopback (its kind and facts) and a provider profile,
//! the ready fixes, best fit first. Separate from the prose remedies (`correlate::remedy`):
//! those explain, these are changes a tool can show, apply and undo.
//!
//! One table, [`TABLE`]. Each entry cites the documentation of the setting it changes (the
//! provider's own for provider entries) and decides from the facts whether it fits: an entry
//! whose change is already in place, or that the facts contradict, offers nothing.
//!
//! Provider entries exist only where the provider's documentation names the setting:
//! AWS (AWS Load Balancer Controller: NLB target type, client IP preservation), Alibaba ACK and
//! DigitalOcean (publish the LB as a hostname so kube-proxy does not bind its IP). Tencent TKE's
//! `service.cloud.tencent.com/prevent-loopback` could not be found in Tencent's documentation,
//! and Azure, GCE, Hetzner and OpenStack document no Service-level loopback setting: those
//! profiles get the generic fixes.

pub mod provider;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use probe_contract::{Fix, LoopbackEvent, LoopbackKind, Proto, SnatState, facts::AddressOwner};
use serde_json::{Value, json};

pub use self::provider::{Origin, Profile, Provider};
use crate::kube::index::ServiceFacts;

/// `externalTrafficPolicy` / `ipMode` as read: None when not read (no API access).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Etp {
    Local,
    Cluster,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpMode {
    Vip,
    Proxy,
}

/// Who sent the looping packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A pod (its own address).
    Pod,
    /// The node itself or a host-network pod.
    Node,
    /// The LB (its health checks).
    Lb,
}

/// The facts the table reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub kind: LoopbackKind,
    pub provider: Provider,
    pub proto: Proto,
    pub source: Option<Source>,
    pub snat: SnatState,
    /// `namespace/name`; fixes with a patch need it.
    pub service: Option<String>,
    pub etp: Option<Etp>,
    pub ip_mode: Option<IpMode>,
    /// The Service was read from the API (so `annotations`/`load_balancer_class` are known,
    /// not just empty).
    pub service_read: bool,
    pub load_balancer_class: Option<String>,
    pub annotations: BTreeMap<String, String>,
    /// kube-proxy is what makes the LB IP local (bound on the VIP interface, or owner not
    /// known): false when a NIC address or a `local` route does (keepalived, a cloud guest
    /// agent), which ipMode or a hostname annotation does not undo.
    pub kube_proxy_binds: bool,
}

impl Facts {
    /// The facts of `event`, with `service` when the API named it.
    pub fn of(event: &LoopbackEvent, service: Option<&ServiceFacts>, provider: Provider) -> Facts {
        let source = match event.kind {
            LoopbackKind::HealthcheckBlackhole => Some(Source::Lb),
            LoopbackKind::Hairpin => Some(Source::Pod),
            LoopbackKind::VipAsSource => Some(Source::Node),
            LoopbackKind::VipPortUnserved if event.client_pod.is_some() => Some(Source::Pod),
            LoopbackKind::VipPortUnserved => None,
            LoopbackKind::ServiceSelfLoop => Some(Source::Pod),
        };
        let ip_mode = service.and_then(|s| {
            let mode = match event.vip {
                Some(vip) => s.ip_mode(vip),
                None => None,
            };
            // Unset on an ingress that has an IP means VIP (the default).
            match mode {
                Some("Proxy") => Some(IpMode::Proxy),
                Some(_) => Some(IpMode::Vip),
                None if s.ingress.iter().any(|i| i.ip.is_some()) => Some(IpMode::Vip),
                None => None,
            }
        });
        Facts {
            kind: event.kind,
            provider,
            proto: event.proto,
            source,
            snat: event.snat,
            service: service
                .map(ServiceFacts::key)
                .or_else(|| event.service.as_deref().map(service_key)),
            etp: service.map(|s| {
                if s.is_etp_local() {
                    Etp::Local
                } else {
                    Etp::Cluster
                }
            }),
            ip_mode,
            service_read: service.is_some(),
            load_balancer_class: service.and_then(|s| s.load_balancer_class.clone()),
            annotations: service.map(|s| s.annotations.clone()).unwrap_or_default(),
            kube_proxy_binds: !matches!(
                event.facts.owner,
                Some(AddressOwner::Interface { .. } | AddressOwner::LocalRoute { .. })
            ),
        }
    }
}

/// Sets `event.fixes` from its facts: the Service the enrichment named (read from `index`, when
/// the API is on), the profile from `flag`, else from that Service's own settings. The agent
/// reads no Node, so a node's providerID does not count here (`kubectl clb-probe fix` reads
/// them).
pub fn attach(
    event: &mut LoopbackEvent,
    index: &crate::kube::index::Index,
    flag: Option<Provider>,
) {
    let key = event.service.as_deref().map(service_key);
    let service = key
        .as_deref()
        .and_then(|key| index.services().find(|s| s.key() == key));
    let profile = Profile::resolve(flag, [], service.and_then(service_provider));
    // A host-listener hairpin goes through no Service rule: the Service patches do not apply.
    event.fixes = if event.facts.host_listener {
        Vec::new()
    } else {
        fixes(&Facts::of(event, service, profile.provider))
    };
}

/// The provider a Service's own settings name.
pub fn service_provider(service: &ServiceFacts) -> Option<Provider> {
    let hostnames: Vec<&str> = service
        .ingress
        .iter()
        .filter_map(|i| i.hostname.as_deref())
        .collect();
    Provider::from_service(
        service.load_balancer_class.as_deref(),
        &service.annotations,
        &hostnames,
    )
}

impl Facts {
    /// The facts of a `probe check` risk of `kind` on LB IP `vip` of `service`: a hairpin risk
    /// is a pod's un-SNATed call, a health-check one the LB's own checks.
    pub fn of_risk(
        kind: LoopbackKind,
        vip: std::net::IpAddr,
        service: &ServiceFacts,
        provider: Provider,
    ) -> Facts {
        let source = match kind {
            LoopbackKind::Hairpin => Some(Source::Pod),
            LoopbackKind::HealthcheckBlackhole => Some(Source::Lb),
            LoopbackKind::VipAsSource => Some(Source::Node),
            LoopbackKind::VipPortUnserved => None,
            LoopbackKind::ServiceSelfLoop => Some(Source::Pod),
        };
        Facts {
            kind,
            provider,
            proto: Proto::Tcp,
            source,
            snat: SnatState::No,
            service: Some(service.key()),
            etp: Some(if service.is_etp_local() {
                Etp::Local
            } else {
                Etp::Cluster
            }),
            ip_mode: Some(match service.ip_mode(vip) {
                Some("Proxy") => IpMode::Proxy,
                _ => IpMode::Vip,
            }),
            service_read: true,
            load_balancer_class: service.load_balancer_class.clone(),
            annotations: service.annotations.clone(),
            kube_proxy_binds: true,
        }
    }
}

/// `namespace/name` of a service label (`namespace/name:port-name`).
fn service_key(label: &str) -> String {
    label.split(':').next().unwrap_or(label).to_string()
}

/// What an entry offers for some facts.
struct Offer {
    /// Fit, higher first (ties keep table order).
    score: u8,
    patch: Option<(Value, Value)>,
    preconditions: Vec<String>,
}

/// One row of the table.
pub struct Entry {
    pub id: &'static str,
    pub provider: Provider,
    pub kinds: &'static [LoopbackKind],
    pub change: &'static str,
    pub preconditions: &'static [&'static str],
    pub side_effects: &'static [&'static str],
    pub source: &'static str,
    offer: fn(&Facts) -> Option<Offer>,
}

use LoopbackKind::{Hairpin, HealthcheckBlackhole, VipAsSource, VipPortUnserved};

const AWS_TARGET_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type";
const AWS_TG_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
const AWS_LBC_DOC: &str = "https://kubernetes-sigs.github.io/aws-load-balancer-controller/latest/guide/service/annotations/";
const ACK_HOSTNAME: &str = "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname";
const DO_HOSTNAME: &str = "service.beta.kubernetes.io/do-loadbalancer-hostname";

/// The fixes, generic first, then per provider.
pub static TABLE: &[Entry] = &[
    Entry {
        id: "call-by-service-name",
        provider: Provider::Generic,
        kinds: &[Hairpin, VipPortUnserved, VipAsSource],
        change: "Call the Service by its cluster DNS name or ClusterIP instead of the LB address \
                 (a change of the caller's configuration; nothing to patch)",
        preconditions: &[
            "the caller is inside the cluster and does not need the LB's own \
                          features (TLS termination, WAF, PROXY protocol)",
        ],
        side_effects: &[
            "with internalTrafficPolicy: Local, calls from nodes without a local \
                         endpoint are dropped",
        ],
        source: "https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/",
        offer: |f| {
            (f.source != Some(Source::Lb)).then(|| Offer {
                score: 60,
                patch: None,
                preconditions: vec![],
            })
        },
    },
    Entry {
        id: "etp-cluster",
        provider: Provider::Generic,
        kinds: &[Hairpin, VipAsSource],
        change: "Set externalTrafficPolicy: Cluster: traffic to the LB is SNATed to the node and \
                 may be served by any node, so it no longer leaves with a pod or VIP source",
        preconditions: &[],
        side_effects: &[
            "backends no longer see the external client's source IP",
            "an extra hop: a node without a backend forwards to another node",
            "the healthCheckNodePort is released; the LB then health-checks every node",
        ],
        source: "https://kubernetes.io/docs/tasks/access-application-cluster/create-external-load-balancer/#preserving-the-client-source-ip",
        offer: |f| {
            let score = match f.etp {
                Some(Etp::Cluster) => return None,
                Some(Etp::Local) => 80,
                None => 30,
            };
            Some(Offer {
                score,
                patch: Some((
                    json!({"spec": {"externalTrafficPolicy": "Cluster"}}),
                    json!({"spec": {"externalTrafficPolicy": "Local"}}),
                )),
                preconditions: if f.etp.is_none() {
                    vec![
                        "the Service uses externalTrafficPolicy: Local (not read: no API access)"
                            .into(),
                    ]
                } else {
                    vec![]
                },
            })
        },
    },
    Entry {
        id: "ip-mode-proxy",
        provider: Provider::Generic,
        kinds: &[HealthcheckBlackhole, VipPortUnserved],
        change: "Have the LB controller publish status.loadBalancer.ingress[].ipMode: Proxy, so \
                 kube-proxy stops binding the LB IP on the nodes (a controller setting: status \
                 is not patched by hand)",
        preconditions: &[
            "Kubernetes 1.30 or later (LoadBalancerIPMode; 1.29 behind its feature gate)",
            "an LB controller that sets ipMode",
        ],
        side_effects: &[
            "in-cluster calls to the LB IP then really go to the LB: watch for \
                         hairpin loopback afterwards",
        ],
        source: "https://kubernetes.io/docs/concepts/services-networking/service/#load-balancer-ip-mode",
        offer: |f| {
            (f.kube_proxy_binds && f.ip_mode != Some(IpMode::Proxy)).then(|| Offer {
                score: 50,
                patch: None,
                preconditions: vec![],
            })
        },
    },
    Entry {
        id: "snat-pod-egress-to-lb",
        provider: Provider::Generic,
        kinds: &[Hairpin],
        change: "Masquerade pod traffic to the LB address to the node IP (node setting: e.g. \
                 ip-masq-agent with the LB range left out of nonMasqueradeCIDRs, or the CNI's \
                 SNAT option)",
        preconditions: &["the CNI or ip-masq-agent decides pod egress SNAT on this cluster"],
        side_effects: &["the LB and the backends see the node, not the pod, as the client"],
        source: "https://kubernetes.io/docs/tasks/administer-cluster/ip-masq-agent/",
        offer: |f| {
            (f.source == Some(Source::Pod) && f.snat != SnatState::Yes).then(|| Offer {
                score: 55,
                patch: None,
                preconditions: vec![],
            })
        },
    },
    Entry {
        id: "lb-healthcheck-source",
        provider: Provider::Generic,
        kinds: &[HealthcheckBlackhole],
        change: "Have the LB send its health checks from a range that is not an LB IP bound on \
                 the nodes (an LB setting)",
        preconditions: &["the LB lets you choose the health-check source"],
        side_effects: &[],
        source: "https://github.com/kubernetes/enhancements/tree/master/keps/sig-network/1860-kube-proxy-IP-node-binding",
        offer: |_| {
            Some(Offer {
                score: 45,
                patch: None,
                preconditions: vec![],
            })
        },
    },
    Entry {
        id: "aws-nlb-target-type-ip",
        provider: Provider::Aws,
        kinds: &[Hairpin],
        change: "Register pods, not instances, as the NLB's targets (nlb-target-type: ip): for \
                 TCP the NLB then does not preserve the client IP, so the pod's call comes back \
                 from the NLB's address",
        preconditions: &[
            "the Service is reconciled by the AWS Load Balancer Controller",
            "pods have VPC addresses (Amazon VPC CNI)",
        ],
        side_effects: &[
            "backends see the NLB's address for TCP (use proxy protocol v2 to keep \
                         the client IP)",
            "the target group is recreated: a short interruption",
        ],
        source: AWS_LBC_DOC,
        offer: |f| {
            if !aws_lbc(f) || f.annotations.get(AWS_TARGET_TYPE).map(String::as_str) == Some("ip") {
                return None;
            }
            // UDP keeps the client IP on IP targets too: this does not help there.
            (f.proto != Proto::Udp).then(|| Offer {
                score: 85,
                patch: Some(annotation_patch(f, AWS_TARGET_TYPE, "ip")),
                preconditions: vec![],
            })
        },
    },
    Entry {
        id: "aws-preserve-client-ip-off",
        provider: Provider::Aws,
        kinds: &[Hairpin],
        change: "Turn off client IP preservation on the NLB's target group \
                 (preserve_client_ip.enabled=false): the pod's call reaches the backend from \
                 the NLB's address and its reply goes back through the NLB",
        preconditions: &[
            "the Service is reconciled by the AWS Load Balancer Controller",
            "TCP or TLS listeners (UDP always preserves the client IP)",
        ],
        side_effects: &[
            "backends see the NLB's address (use proxy protocol v2 to keep the \
                         client IP)",
        ],
        source: "https://docs.aws.amazon.com/elasticloadbalancing/latest/network/edit-target-group-attributes.html#client-ip-preservation",
        offer: |f| {
            if !aws_lbc(f) || f.proto == Proto::Udp {
                return None;
            }
            let old = f.annotations.get(AWS_TG_ATTRIBUTES);
            let mut attrs: Vec<String> = old
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if attrs
                .iter()
                .any(|a| a == "preserve_client_ip.enabled=false")
            {
                return None;
            }
            attrs.retain(|a| !a.starts_with("preserve_client_ip.enabled="));
            attrs.push("preserve_client_ip.enabled=false".into());
            Some(Offer {
                score: 82,
                patch: Some(annotation_patch(f, AWS_TG_ATTRIBUTES, &attrs.join(","))),
                preconditions: vec![],
            })
        },
    },
    Entry {
        id: "ack-lb-hostname",
        provider: Provider::Alicloud,
        kinds: &[HealthcheckBlackhole, VipPortUnserved],
        change: "Annotate the Service with service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname: \
                 <a DNS name for the CLB>: the CCM then publishes the hostname, kube-proxy stops \
                 binding the CLB IP, and in-cluster calls to it go through the CLB",
        preconditions: &[
            "CCM v2.3.0 or later",
            "a DNS name you own that resolves to the CLB IP \
                          (fill it in: there is no patch to apply as is)",
        ],
        side_effects: &["in-cluster calls to the CLB address leave the node: with \
                         externalTrafficPolicy: Local they can hairpin"],
        source: "https://www.alibabacloud.com/help/en/ack/ack-managed-and-ack-dedicated/user-guide/add-annotations-to-the-yaml-file-of-a-service-to-configure-clb-instances",
        offer: |f| hostname_offer(f, ACK_HOSTNAME),
    },
    Entry {
        id: "do-lb-hostname",
        provider: Provider::DigitalOcean,
        kinds: &[HealthcheckBlackhole, VipPortUnserved],
        change: "Annotate the Service with service.beta.kubernetes.io/do-loadbalancer-hostname: \
                 <a DNS name for the LB>: the CCM then publishes the hostname instead of the IP \
                 and kube-proxy stops binding it on the nodes",
        preconditions: &[
            "a DNS name you own with an A record for the LB IP (fill it in: there \
                          is no patch to apply as is)",
        ],
        side_effects: &["in-cluster calls to the LB address leave the node: with \
                         externalTrafficPolicy: Local they can hairpin"],
        source: "https://docs.digitalocean.com/products/kubernetes/how-to/configure-load-balancers/#accessing-by-hostname",
        offer: |f| hostname_offer(f, DO_HOSTNAME),
    },
];

/// The AWS Load Balancer Controller runs this Service (its class or its `type` annotation), or
/// the Service was not read (then the precondition says so).
fn aws_lbc(f: &Facts) -> bool {
    !f.service_read
        || f.load_balancer_class.as_deref() == Some("service.k8s.aws/nlb")
        || matches!(
            f.annotations
                .get("service.beta.kubernetes.io/aws-load-balancer-type")
                .map(String::as_str),
            Some("external" | "nlb-ip")
        )
}

/// Sets one annotation; the undo restores its old value (or removes it: null in a merge patch).
fn annotation_patch(f: &Facts, key: &str, value: &str) -> (Value, Value) {
    let old = f
        .annotations
        .get(key)
        .map_or(Value::Null, |v| Value::String(v.clone()));
    (
        json!({"metadata": {"annotations": {key: value}}}),
        json!({"metadata": {"annotations": {key: old}}}),
    )
}

fn hostname_offer(f: &Facts, key: &str) -> Option<Offer> {
    // Set already, or the LB is not bound (Proxy), or bound by something other than
    // kube-proxy: nothing to do.
    if !f.kube_proxy_binds || f.annotations.contains_key(key) || f.ip_mode == Some(IpMode::Proxy) {
        return None;
    }
    Some(Offer {
        score: 85,
        patch: None,
        preconditions: vec![],
    })
}

/// The fixes for `facts`, best fit first. Patch fixes need the Service's name.
pub fn fixes(facts: &Facts) -> Vec<Fix> {
    let mut offered: Vec<(u8, usize, Fix)> = TABLE
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            e.kinds.contains(&facts.kind)
                && (e.provider == Provider::Generic || e.provider == facts.provider)
        })
        .filter_map(|(i, e)| {
            let offer = (e.offer)(facts)?;
            if offer.patch.is_some() && facts.service.is_none() {
                return None;
            }
            let (patch, undo) = offer.patch.unzip();
            let mut preconditions: Vec<String> =
                e.preconditions.iter().map(|p| p.to_string()).collect();
            preconditions.extend(offer.preconditions);
            if e.provider == Provider::Aws && !facts.service_read {
                preconditions
                    .push("the Service's annotations were not read (no API access)".into());
            }
            Some((
                offer.score,
                i,
                Fix {
                    id: e.id.to_string(),
                    provider: e.provider.as_str().to_string(),
                    change: e.change.to_string(),
                    service: patch.as_ref().and(facts.service.clone()),
                    patch,
                    undo,
                    preconditions,
                    side_effects: e.side_effects.iter().map(|s| s.to_string()).collect(),
                    source: e.source.to_string(),
                },
            ))
        })
        .collect();
    offered.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    offered.into_iter().map(|(_, _, fix)| fix).collect()
}
