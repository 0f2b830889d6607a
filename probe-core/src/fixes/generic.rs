//! The generic entries: Kubernetes settings and caller changes that fit every provider whose
//! facts allow them.

use LoopbackKind::{
    EtpLocalDrop, Hairpin, HealthcheckBlackhole, LbProbeRefused, ServiceSelfLoop, VipAsSource,
    VipPortUnserved,
};
use probe_contract::{LoopbackKind, SnatState, facts::SelfLoopMissing};
use serde_json::json;

use super::{Entry, Etp, Facts, IpMode, Offer, Provider, Source};

/// Calling the Service by name never leaves the node for the LB, whatever the cloud. Gate: the
/// looping caller is in the cluster (not the LB's own checks). For a host-network caller
/// whose LB IP a cloud's guest agent made local (GCE), the ClusterIP is the advice too: the
/// guest agent's route stays (`correlate::remedy` names it).
pub(super) static CALL_BY_SERVICE_NAME: Entry = Entry {
    id: "call-by-service-name",
    provider: Provider::Generic,
    kinds: &[Hairpin, VipPortUnserved, VipAsSource, EtpLocalDrop],
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
    offer: |f| (f.source != Some(Source::Lb)).then(|| Offer::advice(60)),
};

/// Reference 002's shape: kube-proxy writes rules for the LB IP and, under `Local`, does not
/// mark pod traffic to it for masquerade, so it leaves un-SNATed; under `Cluster` it does.
/// For `etp_local_drop` too: under `Cluster` kube-proxy's nftables mode writes no
/// `no-endpoint-services` drop for the LB IP (`hasExternalEndpoints` is `hasEndpoints`,
/// kubernetes/kubernetes `pkg/proxy/nftables/proxier.go`).
/// Gate: the policy is Local and kube-proxy programs the LB IP
/// ([`super::Facts::kube_proxy_programs_lb_ip`]); with ipMode Proxy, a hostname-only LB or no
/// kube-proxy there is no rule for the policy to change (`check/services.rs` says the same).
pub(super) static ETP_CLUSTER: Entry = Entry {
    id: "etp-cluster",
    provider: Provider::Generic,
    kinds: &[Hairpin, VipAsSource, EtpLocalDrop],
    change: "Set externalTrafficPolicy: Cluster: kube-proxy then marks pod traffic to the LB IP \
             for masquerade, so it no longer leaves with a pod or VIP source",
    preconditions: &[],
    side_effects: &[
        "backends no longer see the external client's source IP",
        "an extra hop: a node without a backend forwards to another node",
        "the healthCheckNodePort is released; the LB then health-checks every node",
    ],
    source: "https://kubernetes.io/docs/tasks/access-application-cluster/create-external-load-balancer/#preserving-the-client-source-ip",
    offer: |f| {
        if f.etp == Some(Etp::Cluster) || f.source == Some(Source::Lb) {
            return None;
        }
        let programs = f.kube_proxy_programs_lb_ip();
        if programs == Some(false) {
            return None;
        }
        let mut preconditions = Vec::new();
        if f.etp.is_none() {
            preconditions.push(
                "the Service uses externalTrafficPolicy: Local (not read: no API access)".into(),
            );
        }
        if programs.is_none() {
            preconditions.push(
                "kube-proxy runs on the nodes and programs the LB IP (published as an IP with \
                 ipMode VIP or unset): not all of it was read"
                    .into(),
            );
        }
        Some(Offer {
            score: match (f.etp, programs) {
                (Some(Etp::Local), Some(true)) => 80,
                (Some(Etp::Local), None) => 50,
                _ => 30,
            },
            patch: Some((
                json!({"spec": {"externalTrafficPolicy": "Cluster"}}),
                json!({"spec": {"externalTrafficPolicy": "Local"}}),
            )),
            preconditions,
        })
    },
};

/// KEP-1860: with ipMode Proxy kube-proxy neither binds nor programs the LB IP. Only the LB
/// controller writes it; writers found: hcloud-cloud-controller-manager v1.21.0+ (only with
/// PROXY protocol, hcloud/load_balancers.go, PR #783) and cloud-provider-openstack (only with
/// PROXY protocol, pkg/openstack/loadbalancer.go `createLoadBalancerStatus`); none in the AWS,
/// Azure, Alibaba or DigitalOcean controllers. Cilium's kube-proxy replacement honours it
/// from 1.17 (cilium#34780), not in 1.18.0 (cilium#40913, fixed in 1.18.1 by #40915).
/// Gate: kube-proxy is what makes the LB IP local, and its ipMode is VIP (an unknown value
/// is left alone: it is shown as written, not taken for VIP).
pub(super) static IP_MODE_PROXY: Entry = Entry {
    id: "ip-mode-proxy",
    provider: Provider::Generic,
    kinds: &[HealthcheckBlackhole, VipPortUnserved],
    change: "Have the LB controller publish status.loadBalancer.ingress[].ipMode: Proxy, so \
             kube-proxy stops binding the LB IP on the nodes (a controller setting: status is \
             not patched by hand; hcloud and OpenStack controllers set it only with PROXY \
             protocol on)",
    preconditions: &[
        "Kubernetes 1.30 or later (LoadBalancerIPMode; 1.29 behind its feature gate)",
        "an LB controller that sets ipMode (found: hcloud-cloud-controller-manager v1.21.0+ \
         and cloud-provider-openstack, both only with PROXY protocol; not AWS, Azure, \
         Alibaba, DigitalOcean)",
        "with Cilium's kube-proxy replacement: 1.17 or later, not 1.18.0",
    ],
    side_effects: &[
        "in-cluster calls to the LB IP then really go to the LB: watch for \
                     hairpin loopback afterwards",
    ],
    source: "https://kubernetes.io/docs/concepts/services-networking/service/#load-balancer-ip-mode",
    offer: |f| {
        let vip_mode = matches!(f.ip_mode, Some(IpMode::Vip) | None);
        (f.kube_proxy_binds && vip_mode && f.lb_ip_published != Some(false))
            .then(|| Offer::advice(50))
    },
};

/// The LB's own guard (it skips a backend whose IP is the request's source) is what makes SNAT
/// to the node avoid the loop. Tencent CLB documents it (reference 001, "Does CLB have any
/// mechanism to avoid loopback?"). AWS NLB instance targets with the client IP kept do not
/// ("the connection succeeds only if the request is routed to a different instance", ELB
/// troubleshooting, loopback-timeout); an Azure internal LB's backend cannot reach its own
/// frontend at all; GCE's guest agent delivers a backend's call to the LB IP to itself (local
/// route, internal passthrough NLB docs): there SNAT turns the pod's loop into the node's.
/// Gate: a pod's un-SNATed call, and a provider not known to lack the guard.
pub(super) static SNAT_POD_EGRESS_TO_LB: Entry = Entry {
    id: "snat-pod-egress-to-lb",
    provider: Provider::Generic,
    kinds: &[Hairpin],
    change: "Masquerade pod traffic to the LB address to the node IP (node setting: e.g. \
             ip-masq-agent with the LB range left out of nonMasqueradeCIDRs, or the CNI's SNAT \
             option): the LB then skips this node as the backend",
    preconditions: &["the CNI or ip-masq-agent decides pod egress SNAT on this cluster"],
    side_effects: &["the LB and the backends see the node, not the pod, as the client"],
    source: "https://kubernetes.io/docs/tasks/administer-cluster/ip-masq-agent/",
    offer: |f| {
        if f.source != Some(Source::Pod) || f.snat == SnatState::Yes {
            return None;
        }
        match f.provider {
            Provider::Aws | Provider::Azure | Provider::Gce => None,
            Provider::Tencent => Some(Offer::advice(55)),
            _ => Some(Offer {
                score: 40,
                patch: None,
                preconditions: vec![
                    "the LB does not send a request to the backend whose IP is its source \
                     (documented by Tencent CLB; not so for AWS NLB instance targets, Azure \
                     internal LBs or GCE): otherwise the pod's loop becomes the node's"
                        .into(),
                ],
            }),
        }
    },
};

/// Reference 001 ("layer-4 loopback"): the cure is a health-check source that is not the VIP.
/// Gate: a confirmed health-check black hole on a provider without its own entry for it
/// (Tencent has `tencent-clb-healthcheck-source`).
pub(super) static LB_HEALTHCHECK_SOURCE: Entry = Entry {
    id: "lb-healthcheck-source",
    provider: Provider::Generic,
    kinds: &[HealthcheckBlackhole],
    change: "Have the LB send its health checks from a range that is not an LB IP bound on \
             the nodes (an LB setting)",
    preconditions: &["the LB lets you choose the health-check source"],
    side_effects: &[],
    source: "https://github.com/kubernetes/enhancements/tree/master/keps/sig-network/1860-kube-proxy-IP-node-binding",
    offer: |f| (f.provider != Provider::Tencent).then(|| Offer::advice(45)),
};

/// `service_self_loop`: a pod reaching itself through its own Service needs the hairpin:
/// the bridge port's hairpin mode (the CNI bridge plugin's `hairpinMode`; kubelet's
/// `--hairpin-mode` no longer sets it with CRI runtimes: kube-router 0f3714b9 traces its
/// removal) and kube-proxy's hairpin SNAT (IPVS mode's `KUBE-LOOP-BACK` set, missing in
/// kube-proxy 1.31.0: kubernetes#134884). No Service or LB setting restores it. Gate: the
/// kind; the missing piece, when the facts name it, leads the preconditions.
pub(super) static RESTORE_POD_HAIRPIN: Entry = Entry {
    id: "restore-pod-hairpin",
    provider: Provider::Generic,
    kinds: &[ServiceSelfLoop],
    change: "Restore the hairpin for pods that call their own Service: hairpin mode on the \
             pod's bridge port (the CNI's setting, e.g. the bridge plugin's hairpinMode: true) \
             and kube-proxy's hairpin SNAT (a kube-proxy whose IPVS mode fills KUBE-LOOP-BACK; \
             1.31.0 does not)",
    preconditions: &[],
    side_effects: &["the pod then sees its own calls come from the node or bridge address"],
    source: "https://kubernetes.io/docs/tasks/debug/debug-application/debug-service/#a-pod-fails-to-reach-itself-via-the-service-ip",
    offer: |f| {
        let missing = match &f.self_loop {
            Some(SelfLoopMissing::HairpinMode { bridge, port, .. }) => Some(format!(
                "missing here: hairpin mode on {bridge} port {port} (it is 0)"
            )),
            Some(SelfLoopMissing::HairpinSnat {
                loop_back_entry: Some(false),
            }) => Some("missing here: the pod's KUBE-LOOP-BACK entry (IPVS mode)".into()),
            Some(SelfLoopMissing::HairpinSnat { .. }) => {
                Some("missing here: the hairpin SNAT (the pod saw its own address)".into())
            }
            _ => None,
        };
        Some(Offer {
            score: 70,
            patch: None,
            preconditions: missing.into_iter().collect(),
        })
    },
};

/// kube-proxy's nftables mode dropped the call with its own `no-endpoint-services` element
/// (`etp_local_drop`). kubernetes#132456 ("nftables short-circuit local traffic to external
/// addresses", fixing kubernetes#131765) runs the filter chains after DNAT, so calls that
/// kube-proxy short-circuits to the cluster-wide endpoints are no longer dropped; 1.33 got it
/// through the cherry-pick kubernetes#133969 (merged 2025-09-09). No 1.32 or 1.31 cherry-pick
/// was found (issues searched for "cherry pick of #132456"). A pod's call is short-circuited
/// only when kube-proxy has a local-traffic detector (`proxier.localDetector.IsImplemented()`
/// in `pkg/proxy/nftables/proxier.go`), hence the second half of the change.
pub(super) static KUBE_PROXY_NFTABLES_FIX: Entry = Entry {
    id: "kube-proxy-nftables-fix",
    provider: Provider::Generic,
    kinds: &[EtpLocalDrop],
    change: "Upgrade kube-proxy to a release with kubernetes#132456 (1.34, or a 1.33 patch \
             release with its cherry-pick #133969; 1.29-1.32 have no fix), and give it a \
             local-traffic detector (--detect-local-mode ClusterCIDR with --cluster-cidr, \
             NodeCIDR, BridgeInterface or InterfaceNamePrefix) so that pod calls to the LB IP \
             are sent to the cluster-wide endpoints instead of being dropped",
    preconditions: &["kube-proxy runs in nftables mode (the rule that dropped the call is its)"],
    side_effects: &[
        "kube-proxy restarts on every node (its rules are rewritten; connections keep their \
         conntrack entries)",
    ],
    source: "https://github.com/kubernetes/kubernetes/issues/131765",
    offer: |_| Some(Offer::advice(85)),
};

/// An endpoint on every node that calls the LB IP: kube-proxy writes the `drop` element only
/// for nodes without a local endpoint (`!hasExternalEndpoints`).
pub(super) static LOCAL_ENDPOINT_EVERY_NODE: Entry = Entry {
    id: "local-endpoint-every-node",
    provider: Provider::Generic,
    kinds: &[EtpLocalDrop],
    change: "Run an endpoint of the Service on every node whose pods call its LB IP (a \
             DaemonSet, or a topology spread over those nodes): kube-proxy then has a local \
             endpoint there and writes no drop for the LB IP",
    preconditions: &[],
    side_effects: &[
        "more replicas; calls from those nodes stay on the node (the Local policy's own \
         behaviour)",
    ],
    source: "https://kubernetes.io/docs/reference/networking/virtual-ips/#external-traffic-policy",
    offer: |_| Some(Offer::advice(40)),
};

/// Whether a healthz setting may answer `f`'s LB probe: Some(true) when the event's probe was
/// refused at :10256 (nothing listened), Some(false) when the facts are not an event's (the
/// plugin's re-check of an agent's fix, `probe check`'s risk: the probe is not known), None
/// for a drop or a healthCheckNodePort (no healthz setting answers those).
fn healthz_setting_fits(f: &Facts) -> Option<bool> {
    match f.lb_probe {
        Some(p) if p.healthz && p.refused => Some(true),
        Some(_) => None,
        None => Some(false),
    }
}

/// The precondition of a healthz setting offered without the event's probe.
const REFUSED_AT_HEALTHZ: &str =
    "the LB's probe to :10256 is refused on the node (nothing listens there)";

/// `lb_probe_refused` on :10256 with nothing listening: kube-proxy's healthz server is off (an
/// empty `healthzBindAddress`), bound where the probe does not arrive (e.g. 127.0.0.1), or
/// kube-proxy is not running. The setting and its default, `0.0.0.0:10256`: KubeProxyConfiguration
/// v1alpha1 `healthzBindAddress` and the `--healthz-bind-address` flag
/// (kubernetes `pkg/cluster/ports` `ProxyHealthzPort`). Gate: a probe refused at :10256 (or
/// not known, said as a precondition) and no fact that kube-proxy is absent; first when the
/// event's node has kube-proxy's rules.
pub(super) static KUBE_PROXY_HEALTHZ_BIND: Entry = Entry {
    id: "kube-proxy-healthz-bind",
    provider: Provider::Generic,
    kinds: &[LbProbeRefused],
    change: "Serve kube-proxy's healthz on every node at :10256, where the LB probes it: \
             KubeProxyConfiguration healthzBindAddress: 0.0.0.0:10256 (flag \
             --healthz-bind-address; that is the default, an empty value turns it off, \
             127.0.0.1:10256 hides it from the LB)",
    preconditions: &["kube-proxy runs on the node (a kube-proxy replacement has its own setting)"],
    side_effects: &[
        "kube-proxy restarts on every node to take it (its rules are rewritten; connections \
         keep their conntrack entries)",
    ],
    source: "https://kubernetes.io/docs/reference/config-api/kube-proxy-config.v1alpha1/#kubeproxy-config-k8s-io-v1alpha1-KubeProxyConfiguration",
    offer: |f| {
        let known = healthz_setting_fits(f)?;
        if f.kube_proxy == Some(false) {
            return None;
        }
        Some(Offer {
            score: if known && f.kube_proxy == Some(true) {
                80
            } else {
                50
            },
            patch: None,
            preconditions: (!known)
                .then(|| REFUSED_AT_HEALTHZ.to_string())
                .into_iter()
                .collect(),
        })
    },
};

/// `lb_probe_refused` on :10256 with nothing listening, on a node without kube-proxy: Cilium's
/// kube-proxy replacement serves a kube-proxy-compatible healthz only when
/// `kubeProxyReplacementHealthzBindAddr` is set (empty by default: off), per the Cilium
/// documentation's "kube-proxy Replacement Health Check server" (kubeproxy-free page). Gate:
/// a probe refused at :10256 (or not known, said as a precondition); not when the event's
/// node has kube-proxy's rules (kube-proxy runs there: this is not its setting). Without the
/// event (the plugin, `probe check`) `kube_proxy` is assumed, not read: no gate on it then.
pub(super) static CILIUM_KPR_HEALTHZ_BIND: Entry = Entry {
    id: "cilium-kpr-healthz-bind",
    provider: Provider::Generic,
    kinds: &[LbProbeRefused],
    change: "With Cilium's kube-proxy replacement, turn on its kube-proxy-compatible healthz \
             server: Helm value kubeProxyReplacementHealthzBindAddr: 0.0.0.0:10256 (off by \
             default)",
    preconditions: &["Cilium replaces kube-proxy on the node (kubeProxyReplacement: true)"],
    side_effects: &["the Cilium agents restart to take it"],
    source: "https://docs.cilium.io/en/stable/network/kubernetes/kubeproxy-free/#kube-proxy-replacement-health-check-server",
    offer: |f| {
        let known = healthz_setting_fits(f)?;
        if known && f.kube_proxy == Some(true) {
            return None;
        }
        Some(Offer {
            score: match (f.kube_proxy, known) {
                (Some(false), _) => 80,
                (_, true) => 45,
                _ => 40,
            },
            patch: None,
            preconditions: (!known)
                .then(|| REFUSED_AT_HEALTHZ.to_string())
                .into_iter()
                .collect(),
        })
    },
};
