//! `proxy_protocol_short_circuit`: an LB that prepends a PROXY protocol header to every
//! connection, whose IP this node short-circuits. A pod (or the node) calling the LB IP never
//! reaches the LB: kube-proxy DNATs the call to an endpoint on the node, the backend reads the
//! first bytes as a PROXY header, finds none and closes or resets the connection ("broken
//! header": kubernetes/ingress-nginx#9643, #3996, hetznercloud/hcloud-cloud-controller-manager
//! #160, kubernetes/cloud-provider-openstack#1287, cert-manager's HTTP-01 self check).

use probe_contract::check::{Finding, Kind, Severity};

use crate::check::{Inputs, LbTarget};

/// Whether kube-proxy's rules keep calls to `t` on this node and hand them to an endpoint: the
/// service table serves the IP:port (iptables `KUBE-SERVICES` / `KUBE-FW-`, nftables
/// `service-ips`, an IPVS virtual service). A bound IP on a port nothing serves refuses the
/// call instead (`vip_port_unserved`). kube-proxy >= 1.30 writes no rule for an ingress with
/// ipMode Proxy (KEP-1860), so an older one that ignores ipMode still short-circuits: the
/// node's rules decide, not the API.
fn short_circuited(inp: &Inputs, t: &LbTarget) -> bool {
    match t.port {
        Some(p) => inp.services.serves(t.ip, p, t.proto).is_some(),
        None => inp.services.services.iter().any(|s| s.vip == t.ip),
    }
}

/// The provider's annotation that publishes the LB as a hostname (kube-proxy then writes no
/// rule for its IP and in-cluster calls go through the LB, which adds the header), by the
/// provider of the PROXY protocol annotation.
fn hostname_annotation(proxy_annotation: &str) -> Option<&'static str> {
    let key = proxy_annotation.split(':').next().unwrap_or_default();
    // hetznercloud/hcloud-cloud-controller-manager internal/annotation/load_balancer.go
    // `LBHostname`; kubernetes/cloud-provider-openstack pkg/openstack/loadbalancer.go
    // (`loadbalancer.openstack.org/hostname`); the DigitalOcean workaround of
    // kubernetes/ingress-nginx#3996 (digitalocean-cloud-controller-manager
    // docs/controllers/services/annotations.md); Alibaba: `probe_core::service::
    // LOOPBACK_ANNOTATIONS`. AWS publishes its LBs as hostnames already.
    if key.starts_with("load-balancer.hetzner.cloud/") {
        Some("load-balancer.hetzner.cloud/hostname")
    } else if key.starts_with("loadbalancer.openstack.org/") {
        Some("loadbalancer.openstack.org/hostname")
    } else if key.starts_with("service.beta.kubernetes.io/do-loadbalancer-") {
        Some("service.beta.kubernetes.io/do-loadbalancer-hostname")
    } else if key.starts_with("service.beta.kubernetes.io/alibaba-cloud-")
        || key.starts_with("service.beta.kubernetes.io/alicloud-")
    {
        Some("service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname")
    } else {
        None
    }
}

/// `proxy_protocol_short_circuit`: one risk per Service port whose LB sends PROXY protocol
/// headers and whose LB IP:port this node short-circuits (see the module doc). Without
/// kube-proxy its replacement decides in eBPF whether it short-circuits (Cilium honours
/// ipMode Proxy from 1.17, cilium#34780): a warning when the ipMode is not Proxy.
pub fn proxy_protocol(inp: &Inputs) -> Vec<Finding> {
    let no_kube_proxy = inp
        .dataplane
        .as_ref()
        .filter(|d| d.mode == probe_contract::check::Mode::None);
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for t in &inp.lb_targets {
        let Some(annotation) = t.proxy_protocol.as_deref() else {
            continue;
        };
        let key = (t.ip, t.port, t.proto);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let subject = t.subject();
        let svc = t.service.as_deref().unwrap_or("the Service");
        let mut evidence = vec![format!(
            "{svc}: {annotation}: the LB prepends a PROXY protocol header, so its backends \
             expect one on every connection"
        )];
        let severity = if let Some(d) = no_kube_proxy {
            if t.ip_mode_proxy {
                continue;
            }
            evidence.push(format!(
                "no kube-proxy ({}): whether its replacement short-circuits {subject} is \
                 decided in eBPF, not read by the probe; the ingress ipMode is not Proxy",
                d.name()
            ));
            Severity::Warn
        } else if short_circuited(inp, t) {
            evidence.push(format!(
                "kube-proxy's rules keep calls to {subject} on this node ({}): they never reach \
                 the LB and arrive without the header",
                inp.services.source.map_or("service table", |s| match s {
                    crate::state::ServiceSource::Ipvs => "an IPVS virtual service",
                    crate::state::ServiceSource::Iptables => "iptables KUBE-SERVICES",
                    crate::state::ServiceSource::Nftables => "nftables service-ips",
                })
            ));
            if t.ip_mode_proxy {
                evidence.push(
                    "the API sets ipMode: Proxy, yet the rules exist: this kube-proxy ignores \
                     ipMode (older than Kubernetes 1.30, or the feature gate is off)"
                        .into(),
                );
            }
            Severity::Risk
        } else {
            continue;
        };
        let mut remedy = vec![format!(
            "Call {svc} from inside the cluster by its cluster DNS name \
             (<name>.<namespace>.svc.cluster.local) or ClusterIP, sending the PROXY protocol \
             header yourself when the backend requires it on every connection (e.g. \
             ingress-nginx use-proxy-protocol)."
        )];
        remedy.push(match hostname_annotation(annotation) {
            Some(host) => format!(
                "Or make in-cluster calls go through the LB: set {host} on {svc} (the LB is \
                 then published as a hostname and kube-proxy writes no rule for its IP; \
                 kubernetes/ingress-nginx#3996), or have the LB controller publish ipMode: \
                 Proxy (Kubernetes >= 1.30; the hcloud and OpenStack controllers do with PROXY \
                 protocol)."
            ),
            None => "Or make in-cluster calls go through the LB: have the LB controller publish \
                     it as a hostname or with ipMode: Proxy (Kubernetes >= 1.30), so kube-proxy \
                     writes no rule for its IP."
                .to_string(),
        });
        out.push(Finding {
            kind: Kind::ProxyProtocolShortCircuit,
            severity,
            subject: subject.clone(),
            summary: format!(
                "in-cluster calls to LB {subject} ({svc}) skip the LB's PROXY protocol header: \
                 the backend resets them"
            ),
            evidence,
            remedy,
            fixes: Vec::new(),
        });
    }
    out
}
