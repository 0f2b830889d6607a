//! The other providers' own entries. Where we looked and found no Service-level setting:
//! - Azure: an internal LB's backend calling its own frontend fails by design; the
//!   learn.microsoft.com troubleshooting page (load-balancer-troubleshoot-backend-traffic,
//!   "accessing the internal load balancer frontend from the participating backend pool VM")
//!   gives no switch. The `search` corpora (docs, pages) did not return that page; nothing in
//!   kubernetes-sigs/cloud-provider-azure's annotations either.
//! - GCE: the guest agent installs a `local` route (protocol 66) for every forwarding-rule IP
//!   targeting the VM (GoogleCloudPlatform/guest-agent google_guest_agent/addresses.go at
//!   df9d2037: ForwardedIps always, TargetInstanceIps only with `target_instance_ips`, none
//!   with `[NetworkInterfaces] ip_forwarding = false`, which also drops the routes the node
//!   needs to accept the LB's traffic); guest-agent#555 (open) asks for a switch. No node-file
//!   edit is offered as a fix: the ClusterIP for host-network callers is (generic).

use LoopbackKind::{Hairpin, HealthcheckBlackhole, ProxyProtocolShortCircuit, VipPortUnserved};
use probe_contract::{Layer, LoopbackKind};

use super::{Entry, Facts, IpMode, Offer, Provider, annotation_on, annotation_patch};

pub(super) const TENCENT_PREVENT_LOOPBACK_KEY: &str = "service.cloud.tencent.com/prevent-loopback";
pub(super) const ACK_HOSTNAME: &str =
    "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname";
/// Still read by the CCM: `AnnotationRequest.Get` falls back to the `alicloud` prefix
/// (kubernetes/cloud-provider-alibaba-cloud pkg/controller/service/reconcile/annotation/
/// annotations.go, `AnnotationLegacyPrefix`, at eeb0ddc6).
pub(super) const ACK_HOSTNAME_LEGACY: &str =
    "service.beta.kubernetes.io/alicloud-loadbalancer-hostname";
const HCLOUD_DISABLE_PRIVATE_INGRESS_KEY: &str =
    "load-balancer.hetzner.cloud/disable-private-ingress";
const OPENSTACK_HOSTNAME: &str = "loadbalancer.openstack.org/hostname";
const DO_HOSTNAME: &str = "service.beta.kubernetes.io/do-loadbalancer-hostname";
const TKE_LOOPBACK_DOC: &str = "https://www.tencentcloud.com/document/product/457/42976";

/// Tencent TKE's page on CLB loopback (reference 001 is a copy; "Avoiding layer-4 loopback",
/// step 2): the annotation makes TKE's kube-proxy bind the CLB VIP for in-cluster calls (no
/// hairpin) and the service controller move the CLB's health checks to 100.64.0.0/10 (no
/// black hole). Gate: the annotation not on; for a hairpin, a layer-4 loop (an Ingress's
/// layer-7 loop has `tencent-ingress-keepalive`) on a node where kube-proxy runs.
pub(super) static TENCENT_PREVENT_LOOPBACK: Entry = Entry {
    id: "tencent-prevent-loopback",
    provider: Provider::Tencent,
    kinds: &[HealthcheckBlackhole, Hairpin],
    change: "Annotate the Service with service.cloud.tencent.com/prevent-loopback: \"true\": \
             TKE's kube-proxy then binds the CLB VIP for in-cluster calls and the CLB \
             health-checks from 100.64.0.0/10 instead of its VIP",
    preconditions: &[
        "TKE kube-proxy v1.20.6-tke.12, v1.18.4-tke.20, v1.16.3-tke.25, \
                      v1.14.3-tke.24, v1.12.4-tke.30 or later (the kube-proxy DaemonSet's image \
                      in kube-system)",
    ],
    side_effects: &[
        "with the VIP bound, in-cluster calls to a listener of the same CLB that no \
                     Service port serves are refused on the node",
    ],
    source: TKE_LOOPBACK_DOC,
    offer: |f| {
        if annotation_on(f, TENCENT_PREVENT_LOOPBACK_KEY) {
            return None;
        }
        if f.kind == Hairpin && (f.layer == Some(Layer::L7) || f.kube_proxy == Some(false)) {
            return None;
        }
        Some(Offer {
            score: 90,
            patch: Some(annotation_patch(f, TENCENT_PREVENT_LOOPBACK_KEY, "true")),
            preconditions: vec![],
        })
    },
};

/// The CLB-side switch alone. From shared/PROVIDERS.md (Tencent CLB docs 214/53639 and
/// 214/54823: new CLBs health-check from 100.64.0.0/10 by default since 2023-02-24, older ones
/// switch in the console or by API `HealthCheck.SourceIpType=1`); the `search` corpora held
/// neither page, so the precondition says it was not verified here. Gate: a confirmed black
/// hole (the CLB still checks from its VIP).
pub(super) static TENCENT_HEALTHCHECK_SOURCE: Entry = Entry {
    id: "tencent-clb-healthcheck-source",
    provider: Provider::Tencent,
    kinds: &[HealthcheckBlackhole],
    change: "Switch the CLB's health-check source to 100.64.0.0/10 (CLB console, health check \
             source IP; API HealthCheck.SourceIpType=1): CLBs created since 2023-02-24 use it \
             by default, older ones still check from the VIP",
    preconditions: &["the switch as Tencent CLB documents it (console or \
                      HealthCheck.SourceIpType=1; not re-verified by clb-probe)"],
    side_effects: &["security groups must allow 100.64.0.0/10 to the NodePorts"],
    source: TKE_LOOPBACK_DOC,
    offer: |_| Some(Offer::advice(80)),
};

/// Same page, "Avoiding layer-7 loopback": the CLB's layer-7 SNAT/keepalive capability (by
/// ticket), then `ingress.cloud.tencent.com/tke-service-config-auto: "true"` on the Ingress and
/// `spec.loadBalancer.l7Listeners[].keepaliveEnable: 1` for every listener of the generated
/// TkeServiceConfig `<ingress>-auto-ingress-config`. Not a Service patch. Gate: a layer-7
/// hairpin (the CLB opened its own connection).
pub(super) static TENCENT_INGRESS_KEEPALIVE: Entry = Entry {
    id: "tencent-ingress-keepalive",
    provider: Provider::Tencent,
    kinds: &[Hairpin],
    change: "For the TKE CLB Ingress in front of this Service: have the CLB's layer-7 \
             SNAT/keepalive capability enabled (ticket), annotate the Ingress with \
             ingress.cloud.tencent.com/tke-service-config-auto: \"true\", then set \
             spec.loadBalancer.l7Listeners[].keepaliveEnable: 1 for every listener in the \
             generated TkeServiceConfig <ingress>-auto-ingress-config: the CLB then connects \
             from its own address",
    preconditions: &[
        "the CLB's security group allows it by default, or the nodes' security \
                      group allows the CLB",
    ],
    side_effects: &["backends see the client only in X-Forwarded-For"],
    source: TKE_LOOPBACK_DOC,
    offer: |f| (f.layer == Some(Layer::L7)).then(|| Offer::advice(88)),
};

/// Publishing a hostname makes the CCM write only `ingress: [{hostname}]`
/// (clbv1/service_controller.go, at eeb0ddc6), so kube-proxy stops binding the CLB IP:
/// reference 003's unserved-port shape. It is no loop guard: pod calls then go through the
/// CLB, and TCP/UDP listeners can hairpin (reference 003). ACK's CLB health-checks from
/// 100.64.0.0/10, so it is not offered for a health-check black hole. Gate: kube-proxy binds
/// the IP, ipMode not Proxy, neither spelling of the annotation set.
pub(super) static ACK_LB_HOSTNAME: Entry = Entry {
    id: "ack-lb-hostname",
    provider: Provider::Alicloud,
    // Also the documented way around a PROXY protocol listener called in-cluster by its IP
    // (the same page, "Configure Proxy Protocol": such calls "may be intercepted internally",
    // see "Setting a Hostname").
    kinds: &[VipPortUnserved, ProxyProtocolShortCircuit],
    change: "Annotate the Service with service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname: \
             <a DNS name for the CLB>: the CCM then publishes the hostname, kube-proxy stops \
             binding the CLB IP, and in-cluster calls to it go through the CLB",
    preconditions: &[
        "cloud-controller-manager v2.3.0 or later",
        "a DNS name you own that resolves to the CLB IP (fill it in: there is no patch to \
         apply as is)",
    ],
    side_effects: &[
        "in-cluster calls to the CLB address leave the node: TCP/UDP listeners can \
                     then hairpin (the LB sends a pod's call back to its own node)",
    ],
    source: "https://www.alibabacloud.com/help/en/ack/ack-managed-and-ack-dedicated/user-guide/add-annotations-to-the-yaml-file-of-a-service-to-configure-clb-instances",
    offer: |f| hostname_offer(f, &[ACK_HOSTNAME, ACK_HOSTNAME_LEGACY]),
};

/// hcloud-cloud-controller-manager docs/guides/load-balancer/private-networks.md (at
/// 6485324f): with IPVS "cluster nodes won't ever pass load balancer's health probes" unless
/// `disable-private-ingress: "true"` keeps the private IP out of the status. Since v1.21.0
/// (PR #715) private IPs are published by default, so a CCM upgrade can create the black hole.
/// Gate: kube-proxy binds the IP, ipMode not Proxy, the annotation not on.
pub(super) static HCLOUD_DISABLE_PRIVATE_INGRESS: Entry = Entry {
    id: "hcloud-disable-private-ingress",
    provider: Provider::Hcloud,
    kinds: &[HealthcheckBlackhole, VipPortUnserved],
    change: "Annotate the Service with load-balancer.hetzner.cloud/disable-private-ingress: \
             \"true\": the CCM stops publishing the LB's private IP, so kube-proxy (IPVS) no \
             longer binds it on the nodes",
    preconditions: &[
        "the LB is attached to a private network (CCM with network support; \
                      v1.21.0 and later publish its private IP unless this is set)",
    ],
    side_effects: &[
        "the private IP leaves the Service's status (external-dns and the like see only the \
         public addresses)",
        "in-cluster calls to the private IP then go through the LB",
    ],
    source: "https://github.com/hetznercloud/hcloud-cloud-controller-manager/blob/main/docs/guides/load-balancer/private-networks.md",
    offer: |f| {
        if !f.kube_proxy_binds
            || f.ip_mode == Some(IpMode::Proxy)
            || annotation_on(f, HCLOUD_DISABLE_PRIVATE_INGRESS_KEY)
        {
            return None;
        }
        Some(Offer {
            score: 85,
            patch: Some(annotation_patch(
                f,
                HCLOUD_DISABLE_PRIVATE_INGRESS_KEY,
                "true",
            )),
            preconditions: vec![],
        })
    },
};

/// cloud-provider-openstack docs/openstack-cloud-controller-manager/
/// expose-applications-using-loadbalancer-type-service.md and pkg/openstack/loadbalancer.go
/// `createLoadBalancerStatus` (at c453fb7c): with the annotation the status holds only the
/// hostname, so kube-proxy binds nothing. Gate: kube-proxy binds the IP, ipMode not Proxy, the
/// annotation not set.
pub(super) static OPENSTACK_LB_HOSTNAME: Entry = Entry {
    id: "openstack-lb-hostname",
    provider: Provider::OpenStack,
    // With PROXY protocol, in-cluster calls by the IP fail without it
    // (kubernetes/cloud-provider-openstack#1287; the same doc's PROXY protocol section).
    kinds: &[
        HealthcheckBlackhole,
        VipPortUnserved,
        ProxyProtocolShortCircuit,
    ],
    change: "Annotate the Service with loadbalancer.openstack.org/hostname: <a DNS name for \
             the LB>: OCCM then publishes only the hostname and kube-proxy stops binding the \
             LB IP",
    preconditions: &[
        "a DNS name you own that resolves to the LB's address (fill it in: there \
                      is no patch to apply as is)",
    ],
    side_effects: &[
        "the LB's address is then only in the loadbalancer.openstack.org/load-balancer-address \
         annotation",
        "in-cluster calls to the LB address leave the node and can hairpin",
    ],
    source: "https://github.com/kubernetes/cloud-provider-openstack/blob/master/docs/openstack-cloud-controller-manager/expose-applications-using-loadbalancer-type-service.md",
    offer: |f| hostname_offer(f, &[OPENSTACK_HOSTNAME]),
};

/// DigitalOcean's CCM publishes the hostname instead of the IP with this annotation (its
/// "accessing by hostname" guide). Gate: as the other hostname entries.
pub(super) static DO_LB_HOSTNAME: Entry = Entry {
    id: "do-lb-hostname",
    provider: Provider::DigitalOcean,
    // The guide's own case: PROXY protocol breaks in-cluster calls by the IP
    // (kubernetes/ingress-nginx#3996).
    kinds: &[
        HealthcheckBlackhole,
        VipPortUnserved,
        ProxyProtocolShortCircuit,
    ],
    change: "Annotate the Service with service.beta.kubernetes.io/do-loadbalancer-hostname: \
             <a DNS name for the LB>: the CCM then publishes the hostname instead of the IP \
             and kube-proxy stops binding it on the nodes",
    preconditions: &[
        "a DNS name you own with an A record for the LB IP (fill it in: there is \
                      no patch to apply as is)",
    ],
    side_effects: &["in-cluster calls to the LB address leave the node: with \
                     externalTrafficPolicy: Local they can hairpin"],
    source: "https://docs.digitalocean.com/products/kubernetes/how-to/configure-load-balancers/#accessing-by-hostname",
    offer: |f| hostname_offer(f, &[DO_HOSTNAME]),
};

fn hostname_offer(f: &Facts, keys: &[&str]) -> Option<Offer> {
    // Set already, or the LB is not bound (Proxy), or bound by something other than
    // kube-proxy: nothing to do.
    if !f.kube_proxy_binds
        || keys.iter().any(|k| f.annotations.contains_key(*k))
        || f.ip_mode == Some(IpMode::Proxy)
    {
        return None;
    }
    Some(Offer::advice(85))
}
