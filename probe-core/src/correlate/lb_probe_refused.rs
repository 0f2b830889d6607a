//! `lb_probe_refused`: the LB's own health probe to this node was refused or dropped here, so
//! the LB takes the node out and nothing on the node says why (issue #51, shape 4).
//!
//! Cloud LBs probe each node on kube-proxy's healthz port, :10256, for externalTrafficPolicy
//! Cluster Services (Azure's `clusterServiceLoadBalancerHealthProbeMode: Shared`, "a dedicated
//! health probe targeting the backend nodes' kube-proxy health check port 10256",
//! learn.microsoft.com ClusterServiceLoadBalancerHealthProbeMode; cloud-provider-aws PR #622
//! makes it the AWS default) and on the Service's healthCheckNodePort for
//! externalTrafficPolicy Local ones (kubernetes `pkg/proxy/healthcheck/service_health.go`,
//! served by kube-proxy itself). On a node where nothing serves the port (kube-proxy-free
//! without its healthz, kube-proxy down) the kernel answers the probe's SYN with a RST and
//! frees it as `NO_SOCKET`; a firewall on the node drops it (`NETFILTER_DROP`); a probe source
//! the kernel refuses (Azure's IPv6 probes come from the link-local `fe80::1234:5678:9abc`,
//! cilium#25242) dies with its reason.
//!
//! Confirmed from the drop of an outside (untagged) TCP SYN to a node address, arriving through
//! a monitored NIC, on :10256 or a healthCheckNodePort the API names. The kernel side reports
//! these drops only for the ports in `PROBE_PORTS` ([`watched_probe_ports`]), on the drop path.
//! The event names the probe's source and the provider whose documented probe range holds it
//! (else "from outside the node": AWS NLB checks come from the LB's own private VPC addresses,
//! no fixed range), the port and what it is.

use std::net::IpAddr;

use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, Proto, Tag,
    record::{DropReason, Packet, tcp_flags},
    sock,
};

use super::{
    Correlator, DropInfo, Output,
    aggregate::dropped_call,
    drop_reason::{is_netfilter_drop, is_no_socket},
    evidence::drop_line,
    tuple_of,
};
use crate::state::{ServiceTable, SourceRange};

/// kube-proxy's healthz port: `--healthz-bind-address` / `healthzBindAddress`, default
/// `0.0.0.0:10256` (kubernetes `pkg/cluster/ports` `ProxyHealthzPort`).
pub const KUBE_PROXY_HEALTHZ_PORT: u16 = 10256;

/// The ports the drop program watches for refused probes: kube-proxy's healthz and every
/// healthCheckNodePort of the table (the API's; without API access, :10256 alone).
pub fn watched_probe_ports(table: &ServiceTable) -> Vec<u16> {
    let mut ports: Vec<u16> = std::iter::once(KUBE_PROXY_HEALTHZ_PORT)
        .chain(table.health_checks.iter().map(|h| h.port))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// What a probed port is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeTarget {
    /// kube-proxy's healthz (:10256), probed for externalTrafficPolicy Cluster Services.
    KubeProxyHealthz,
    /// A Service's healthCheckNodePort (`namespace/name`).
    HealthCheckNodePort(String),
}

/// The probe target of TCP `port` on a node address, if the LBs probe it.
pub fn probe_target(table: &ServiceTable, port: u16) -> Option<ProbeTarget> {
    if let Some(h) = table.health_checks.iter().find(|h| h.port == port) {
        return Some(ProbeTarget::HealthCheckNodePort(h.service.clone()));
    }
    (port == KUBE_PROXY_HEALTHZ_PORT).then_some(ProbeTarget::KubeProxyHealthz)
}

/// A provider's documented health-probe source range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSource {
    pub provider: &'static str,
    pub range: &'static str,
    /// Where the provider documents it.
    pub source: &'static str,
}

const GCE_DOC: &str = "https://cloud.google.com/load-balancing/docs/health-check-concepts (Probe IP ranges), https://cloud.google.com/load-balancing/docs/firewall-rules";
const AZURE_DOC: &str =
    "https://learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16";

/// The providers' documented probe sources. AWS has none: NLB checks come from the LB's own
/// private addresses in the VPC.
pub const PROBE_SOURCES: [ProbeSource; 7] = [
    ProbeSource {
        provider: "Google Cloud",
        range: "35.191.0.0/16",
        source: GCE_DOC,
    },
    ProbeSource {
        provider: "Google Cloud",
        range: "130.211.0.0/22",
        source: GCE_DOC,
    },
    // The legacy health checks of target-pool network LBs.
    ProbeSource {
        provider: "Google Cloud",
        range: "209.85.152.0/22",
        source: GCE_DOC,
    },
    ProbeSource {
        provider: "Google Cloud",
        range: "209.85.204.0/22",
        source: GCE_DOC,
    },
    ProbeSource {
        provider: "Google Cloud",
        range: "2600:2d00:1:b029::/64",
        source: GCE_DOC,
    },
    ProbeSource {
        provider: "Azure",
        range: "168.63.129.16/32",
        source: AZURE_DOC,
    },
    // Azure's IPv6 probes: a link-local source (cilium#25242, cilium#31326).
    ProbeSource {
        provider: "Azure",
        range: "fe80::1234:5678:9abc/128",
        source: "https://github.com/cilium/cilium/issues/25242",
    },
];

/// The documented probe range holding `ip`, if any.
pub fn probe_source_of(ip: IpAddr) -> Option<&'static ProbeSource> {
    PROBE_SOURCES
        .iter()
        .find(|s| SourceRange::parse(s.range).is_some_and(|r| r.contains(ip)))
}

/// Why the probe died, from the drop's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProbeDeath {
    /// Nothing listens: the kernel answered with a RST (`NO_SOCKET`).
    NoListener,
    /// A firewall rule on the node dropped it.
    Firewall,
    /// Another drop (a source the kernel refuses, ...): the reason says which.
    Other,
}

/// From the drop's reason and site, with the classifiers every kind uses (a netfilter drop
/// is named from its `nf_hook_slow` site on kernels without reasons).
fn death_of(reason: &DropReason, location: Option<&str>) -> ProbeDeath {
    if is_no_socket(reason) {
        ProbeDeath::NoListener
    } else if is_netfilter_drop(reason, location) {
        ProbeDeath::Firewall
    } else {
        ProbeDeath::Other
    }
}

/// [`death_of`] a reported event's drop.
fn death_of_event(e: &LoopbackEvent) -> ProbeDeath {
    let reason = DropReason {
        code: 0,
        name: e.drop_reason.clone().unwrap_or_default(),
    };
    death_of(&reason, e.drop_location.as_deref())
}

impl Correlator {
    /// An outside TCP SYN to a probed port of a node address, through a monitored NIC, dropped
    /// here. Only a SYN: a late segment of a closed check connection also meets no socket.
    pub(super) fn is_lb_probe_refused(&self, packet: &Packet, info: &DropInfo) -> bool {
        packet.src_tag.is_none()
            && packet.dst_tag == Some(Tag::Node)
            && packet.proto == Proto::Tcp
            && packet.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN
            && !info.foreign_netns
            && info.iface.as_ref().is_some_and(|i| self.nics.contains(i))
            && probe_target(&self.services, packet.dport).is_some()
            && (is_no_socket(&info.reason)
                || is_netfilter_drop(&info.reason, info.location.as_deref())
                || info.reason.is_reported())
    }

    pub(super) fn confirm_lb_probe_refused(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        out: &mut Vec<Output>,
    ) {
        let Some(target) = probe_target(&self.services, packet.dport) else {
            return;
        };
        let t = tuple_of(packet);
        let at = sock(packet.dst, packet.dport);
        let what = match &target {
            ProbeTarget::KubeProxyHealthz => {
                "kube-proxy's healthz port (the LBs' probe for externalTrafficPolicy Cluster)"
                    .to_string()
            }
            ProbeTarget::HealthCheckNodePort(s) => format!(
                "the healthCheckNodePort of {s} (externalTrafficPolicy Local; kube-proxy serves it)"
            ),
        };
        let from = probe_source_of(packet.src).map_or_else(
            || "from outside the node (no provider's documented probe range holds it)".to_string(),
            |s| {
                format!(
                    "{}'s documented probe range {} ({})",
                    s.provider, s.range, s.source
                )
            },
        );
        let death_kind = death_of(&info.reason, info.location.as_deref());
        let death = match death_kind {
            ProbeDeath::NoListener => "nothing listens there: the kernel answered with a RST",
            ProbeDeath::Firewall => "a firewall rule on this node dropped it",
            ProbeDeath::Other => "the kernel dropped it",
        };
        let evidence = vec![
            drop_line(&info, &t),
            format!("{at}/tcp is {what}"),
            format!("the probe's source {} is in {from}", packet.src),
            format!("{death}; the LB marks this node down for it"),
        ];
        let key = AggregateKey::LbProbeRefused {
            node: packet.dst,
            port: packet.dport,
        };
        let outcome = if death_kind == ProbeDeath::NoListener {
            Outcome::Refused
        } else {
            Outcome::Dropped
        };
        let service = match target {
            ProbeTarget::HealthCheckNodePort(s) => Some(s),
            ProbeTarget::KubeProxyHealthz => None,
        };
        let mut event = dropped_call(&key, packet, &info, outcome, evidence, service);
        // The probe's address is the loop's (its proof: the same source answered later).
        event.vip = None;
        event.vip_port = None;
        self.stats.drops_confirming += 1;
        self.stats.confirmed.lb_probe_refused += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

/// The provider's name and range, or "outside the node", for the event's source.
fn source_text(e: &LoopbackEvent) -> String {
    probe_source_of(e.src).map_or_else(
        || format!("{} (outside the node)", e.src),
        |s| format!("{} ({}'s probe range {})", e.src, s.provider, s.range),
    )
}

/// The LB's probe to :10256 or a healthCheckNodePort was refused or dropped on this node.
pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let at = sock(e.dst, e.dst_port);
    let healthz = e.dst_port == KUBE_PROXY_HEALTHZ_PORT;
    // The API's Service when attribution found one, else the one the rule named.
    let service = e
        .facts
        .service
        .as_ref()
        .map(|s| s.key())
        .or_else(|| e.service.clone());
    let what = match (healthz, service) {
        (true, None) => "kube-proxy's healthz port, which the LBs probe for externalTrafficPolicy \
                         Cluster Services (Azure's Shared probe mode; cloud-provider-aws PR #622)"
            .to_string(),
        (true, Some(s)) => format!(
            "kube-proxy's healthz port, which the LB of Service {s} probes (externalTrafficPolicy \
             Cluster; Azure's Shared probe mode; cloud-provider-aws PR #622)"
        ),
        (false, s) => format!(
            "the healthCheckNodePort of Service {}, which kube-proxy serves for \
             externalTrafficPolicy Local (kubernetes pkg/proxy/healthcheck/service_health.go)",
            s.as_deref().unwrap_or("?")
        ),
    };
    let src = source_text(e);
    let reason = e.drop_reason.as_deref().unwrap_or("");
    let named = if reason.is_empty() {
        String::new()
    } else {
        format!(" ({reason})")
    };
    let mut lines = vec![format!(
        "Cause: the LB's health probe from {src} to {at}/tcp, {what}, died on this node{named}: \
         the LB takes this node out of its backends and nothing else on the node says why."
    )];
    match death_of_event(e) {
        ProbeDeath::NoListener if healthz => lines.extend([
            "Nothing listens on :10256. Run kube-proxy on this node with its healthz server on \
             (--healthz-bind-address / KubeProxyConfiguration healthzBindAddress, default \
             0.0.0.0:10256; an empty value turns it off)."
                .to_string(),
            "With a kube-proxy replacement, turn on its kube-proxy-compatible healthz: Cilium's \
             Helm value kubeProxyReplacementHealthzBindAddr=0.0.0.0:10256 (off by default; \
             docs.cilium.io, kube-proxy free, \"kube-proxy Replacement Health Check server\")."
                .to_string(),
            "Or have the LB probe each Service's NodePort instead (Azure: \
             clusterServiceLoadBalancerHealthProbeMode: ServiceNodePort)."
                .to_string(),
        ]),
        ProbeDeath::NoListener => lines.extend([
            format!(
                "Nothing listens on {at}: kube-proxy is not running on this node, or not \
                 serving this Service's healthCheckNodePort."
            ),
            "With a kube-proxy replacement, make it serve healthCheckNodePorts (Cilium does with \
             kubeProxyReplacement; check its logs for the port)."
                .to_string(),
        ]),
        ProbeDeath::Firewall => lines.push(format!(
            "A firewall rule on this node (nftables or iptables input) drops the probe: allow \
             TCP {} from {} (the provider's documented probe ranges) before it.",
            e.dst_port,
            probe_source_of(e.src).map_or("the LB's probe source", |s| s.range)
        )),
        ProbeDeath::Other => lines.push(format!(
            "The kernel refused the probe{named}. Azure's IPv6 probes come from \
             fe80::1234:5678:9abc (cilium#25242): the datapath must accept that link-local \
             source on the NIC."
        )),
    }
    lines
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let at = sock(event.dst, event.dst_port);
    let how = match death_of_event(event) {
        ProbeDeath::NoListener => "refused (nothing listens)",
        ProbeDeath::Firewall => "dropped by a firewall rule",
        ProbeDeath::Other => "dropped",
    };
    format!(
        "The LB's health probe from {} to {at}/tcp was {how}: the LB takes this node out.",
        source_text(event)
    )
}
