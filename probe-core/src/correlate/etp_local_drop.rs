//! `etp_local_drop`: kube-proxy dropped a call from this node (a local pod's) to an external
//! or LB IP of an externalTrafficPolicy Local Service that has no endpoint on this node.
//!
//! nftables mode: kube-proxy writes such an IP:port into its verdict map
//! `no-endpoint-services` with verdict `drop` ("DROP anything that didn't get short-circuited
//! by the EXT chain", kubernetes/kubernetes `pkg/proxy/nftables/proxier.go`,
//! `syncProxyRules`), and its filter chains (`service-endpoints-check`, jumped from
//! `filter-forward`, `filter-input` and `filter-output`) apply it to every new connection
//! whose destination was not DNATed first. A pod's call is DNATed first only when kube-proxy's
//! `external-` chain short-circuits it ("short-circuit pod traffic", written only with a
//! local-traffic detector); the node's own call was checked before DNAT until
//! kubernetes#132456 moved the filter chains after it (kubernetes#131765; 1.33 got it as
//! #133969).
//!
//! iptables mode: the same drop is a rule of the filter chain `KUBE-EXTERNAL-SERVICES`
//! (`-m comment --comment "<svc> has no local endpoints" -d <ip> -p tcp --dport <port> -j
//! DROP`, jumped from `INPUT` and `FORWARD` for new connections; `pkg/proxy/iptables/
//! proxier.go`, `syncProxyRules`). A pod's call escapes it only when the Service's `KUBE-EXT-*`
//! chain sends it to `KUBE-SVC-*` first: the rule "pod traffic for <svc> external
//! destinations", written only with a local-traffic detector and matching only the pods the
//! detector matches (`-s <cluster CIDR>`, `-i <prefix>+`, `-i <bridge>`). A pod outside it (a
//! second IP pool, kubernetes#112820) is dropped; the evidence names the detector it missed
//! ([`PodShortCircuit`], read from the nat rules). IPVS mode sends such a call to the
//! cluster-wide endpoints (kubernetes#93456): nothing to confirm there.
//!
//! Confirmed from a drop (`NETFILTER_DROP`, or `NOT_SPECIFIED` at a netfilter site on kernels
//! without the reason: [`is_netfilter_drop`]) of a local pod's (or the node's) TCP/UDP packet
//! to a non-local address, whose (address, protocol, port) is such a drop in the service table
//! read from the live ruleset ([`NoEndpointDrop`]). Without it nothing is confirmed: a
//! netfilter drop of a pod's call to some outside address is anyone's (a NetworkPolicy, a
//! firewall). The kernel side reports these drops only for the drops' addresses
//! (`DROP_DESTINATIONS`, kept by the agent from each service table).

use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, Tag,
    facts::{Etp, Facts, ProxyMode, SourceKind},
    record::Packet,
    sock,
};

use super::{
    Correlator, DropInfo, Output,
    aggregate::dropped_call,
    drop_reason::is_local_call_netfilter_drop,
    evidence::{drop_line, service_name},
    remedy::{
        cause::CauseAddresses,
        sentences::{mismatch, service_key},
    },
    tuple_of,
};
use crate::state::{NoEndpointDrop, PodShortCircuit, ServiceSource};

impl Correlator {
    /// The no-endpoint drop of kube-proxy's rules (a `no-endpoint-services` `drop` element, a
    /// `KUBE-EXTERNAL-SERVICES` `DROP` rule) that a local pod's (or the node's) call met when
    /// netfilter dropped it; None for any other drop.
    pub(super) fn etp_local_drop_element(
        &self,
        packet: &Packet,
        info: &DropInfo,
    ) -> Option<NoEndpointDrop> {
        let local_call = is_local_call_netfilter_drop(packet, info) && packet.dst_tag.is_none();
        local_call
            .then(|| {
                self.services
                    .no_endpoint_drop(packet.dst, packet.dport, packet.proto)
                    .cloned()
            })
            .flatten()
    }

    pub(super) fn confirm_etp_local_drop(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        element: NoEndpointDrop,
        out: &mut Vec<Output>,
    ) {
        let t = tuple_of(packet);
        let to = sock(packet.dst, packet.dport);
        let proto = packet.proto.as_str();
        let mut evidence = vec![drop_line(&info, &t), self.drop_rule_line(packet, &element)];
        evidence.extend(self.host_caller_line(packet, &info));
        evidence.extend(self.detector_line(packet));
        // Where kube-proxy's rules list the Service's frontends.
        let frontends = if self.services.source == Some(ServiceSource::Iptables) {
            "KUBE-SERVICES"
        } else {
            "service-ips"
        };
        evidence.push(
            match self.services.serves(packet.dst, packet.dport, packet.proto) {
                Some(s) if !s.backends.is_empty() => format!(
                    "service table: {to}/{proto} has endpoints, none of them on this node: {}",
                    s.backends.join(", ")
                ),
                Some(_) => format!(
                    "service table: {to}/{proto} is in {frontends} (its endpoints are not named \
                     in the rules read)"
                ),
                None => format!("service table: {to}/{proto} is not in {frontends}"),
            },
        );
        let key = AggregateKey::EtpLocalDrop {
            addr: packet.dst,
            port: packet.dport,
            proto: packet.proto,
        };
        let event = dropped_call(
            &key,
            packet,
            &info,
            Outcome::Dropped,
            evidence,
            element.service.as_deref().map(service_name),
        );
        let event = LoopbackEvent {
            facts: Facts {
                // Only an externalTrafficPolicy Local Service's external IPs get a `drop`
                // element (a Service without endpoints gets `goto reject-chain`).
                etp_rules: Some(Etp::Local),
                proxy_mode: self.services.source.map(super::remedy::proxy_mode),
                ..event.facts.clone()
            },
            ..event
        };
        self.stats.drops_confirming += 1;
        self.stats.confirmed.etp_local_drop += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }
}

impl Correlator {
    /// The rule that dropped the call, as the service table read it: nftables' map element,
    /// or iptables' `KUBE-EXTERNAL-SERVICES` rule.
    fn drop_rule_line(&self, packet: &Packet, element: &NoEndpointDrop) -> String {
        let to = sock(packet.dst, packet.dport);
        let proto = packet.proto.as_str();
        if self.services.source == Some(ServiceSource::Iptables) {
            let (cmd, host) = if packet.dst.is_ipv4() {
                ("iptables", 32)
            } else {
                ("ip6tables", 128)
            };
            return format!(
                "kube-proxy's iptables rules ({cmd}, table filter): chain {EXTERNAL_SERVICES} \
                 has -d {}/{host} -p {proto} --dport {}{} -j DROP, which kube-proxy writes for \
                 an externalTrafficPolicy Local Service with no endpoint on this node; INPUT \
                 and FORWARD jump to it for every new connection, so it drops each call to \
                 {to}/{proto} that kube-proxy's nat rules did not DNAT before",
                packet.dst,
                packet.dport,
                element
                    .service
                    .as_deref()
                    .map(|c| format!(" -m comment --comment \"{c} has no local endpoints\""))
                    .unwrap_or_default(),
            );
        }
        format!(
            "kube-proxy's nftables rules (table {family} kube-proxy): map \
             no-endpoint-services has the element {} . {proto} . {}{} : drop, which \
             kube-proxy writes for an externalTrafficPolicy Local Service with no endpoint \
             on this node; its filter chains drop every new connection to {to}/{proto} \
             that was not DNATed before them",
            packet.dst,
            packet.dport,
            element
                .service
                .as_deref()
                .map(|c| format!(" comment \"{c}\""))
                .unwrap_or_default(),
            family = if packet.dst.is_ipv4() { "ip" } else { "ip6" },
        )
    }

    /// The node's own call (a host-network caller): a node source that came in on no
    /// interface. None for any other caller.
    fn host_caller_line(&self, packet: &Packet, info: &DropInfo) -> Option<String> {
        if packet.src_tag != Some(Tag::Node) || info.iface.is_some() {
            return None;
        }
        let src = packet.src;
        let caller = format!(
            "the caller is this node: {src} is a node address and the packet came in on no \
             interface, so a host-network process (or host-network pod) on this node sent it"
        );
        if self.services.source == Some(ServiceSource::Iptables) {
            return Some(format!("{caller}; it was dropped on its way out"));
        }
        // kube-proxy's nftables `filter-output` ran before DNAT until kubernetes#132456 (1.34;
        // 1.33.6 by #133969), so the node's call met no-endpoint-services undiverted.
        Some(format!(
            "{caller}; it was dropped on its way out, at the output hook, where kube-proxy's \
             filter-output checks no-endpoint-services before its nat-output DNAT (kube-proxy \
             before kubernetes#132456: 1.29 to 1.33.5)"
        ))
    }

    /// iptables mode, a pod's call, the nat rules read (not the API's table): whether
    /// kube-proxy's local-traffic detector was there to short-circuit the call, and whom it
    /// matches. None where the rules read do not say.
    fn detector_line(&self, packet: &Packet) -> Option<String> {
        let t = &self.services;
        if t.source != Some(ServiceSource::Iptables)
            || t.from_api
            || packet.src_tag != Some(Tag::Pod)
        {
            return None;
        }
        let to = sock(packet.dst, packet.dport);
        let proto = packet.proto.as_str();
        let Some(short) = t.pod_short_circuit(packet.dst, packet.dport, packet.proto) else {
            return Some(format!(
                "{NO_DETECTOR} (kube-proxy's nat rules for {to}/{proto} have no \"pod traffic \
                 for ... external destinations\" rule): no pod's call to it is short-circuited \
                 to the cluster-wide endpoints"
            ));
        };
        Some(detector_miss_line(short, packet.src))
    }
}

/// The evidence line of a detector that did not short-circuit the pod `src`.
fn detector_miss_line(short: &PodShortCircuit, src: std::net::IpAddr) -> String {
    let how = match short.matches_source(src) {
        Some(false) => format!("the pod {src} is outside it"),
        Some(true) => format!(
            "it matches the pod {src} by address, yet the call was not short-circuited (a \
             connection tracked before the rule?)"
        ),
        None => format!("it did not match the pod {src}'s interface"),
    };
    format!(
        "{DETECTOR} `{}` (chain {} sends only the pods it matches to the cluster-wide \
         endpoints: rule \"pod traffic for ... external destinations\"): {how}",
        short.detector, short.chain
    )
}

/// `KUBE-EXTERNAL-SERVICES`, as the iptables reader names it.
const EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// The evidence line's head that names the local-traffic detector the pod missed; the remedy
/// reads the detector back from it (between backquotes).
const DETECTOR: &str = "kube-proxy's local-traffic detector";
/// The evidence line's head that says kube-proxy has no local-traffic detector.
const NO_DETECTOR: &str = "kube-proxy has no local-traffic detector";

/// What the evidence says of kube-proxy's local-traffic detector.
enum Detector {
    /// It is there and missed the pod: its match (`-s 10.244.0.0/16`, `-i veth+`).
    Missed(String),
    /// kube-proxy has none.
    Absent,
    /// Not read (nftables mode, the API's table, a host-network caller).
    Unknown,
}

fn detector_in(e: &LoopbackEvent) -> Detector {
    for line in &e.evidence {
        if line.starts_with(NO_DETECTOR) {
            return Detector::Absent;
        }
        if let Some(rest) = line.strip_prefix(DETECTOR)
            && let Some(m) = rest
                .trim_start()
                .strip_prefix('`')
                .and_then(|r| r.split('`').next())
        {
            return Detector::Missed(m.to_string());
        }
    }
    Detector::Unknown
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

/// kube-proxy's drop of a call to an ETP Local Service's LB IP: nftables mode's
/// `no-endpoint-services` (kubernetes#131765) or iptables mode's `KUBE-EXTERNAL-SERVICES`
/// (kubernetes#112820), each with the fixes of its mode.
pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let svc = service_key(e)
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    let mut out = if e.facts.proxy_mode == Some(ProxyMode::Iptables) {
        iptables_remedy(e, &svc)
    } else {
        nftables_remedy(e, &svc)
    };
    let at = sock(e.vip.unwrap_or(e.dst), e.vip_port.unwrap_or(e.dst_port));
    if e.facts.etp() != Some(Etp::Cluster) {
        out.push(format!(
            "Or set externalTrafficPolicy: Cluster on {svc} (kube-proxy then writes no drop for \
             its LB IP; backends no longer see client source IPs)."
        ));
    }
    out.push(format!(
        "Or run an endpoint of {svc} on every node whose pods call {at} (a DaemonSet or a \
         topology spread), or have callers use the Service's cluster DNS name or ClusterIP."
    ));
    out
}

/// Who called, and what happened to the call (`probe check`'s risk has no caller yet).
fn caller_and_fate(e: &LoopbackEvent) -> (String, &'static str) {
    match e.facts.source {
        SourceKind::Node => (
            "a host-network caller on this node called".to_string(),
            "dropped the call before it reached",
        ),
        SourceKind::Unknown => (
            "this node's pods (and, before kubernetes#132456, its host-network callers) call"
                .to_string(),
            "drop such calls before they reach",
        ),
        _ => (
            format!("the pod {} called", e.src),
            "dropped the call before it reached",
        ),
    }
}

/// The version range: nftables mode exists since 1.29 (alpha; beta 1.31, GA 1.33, KEP-3866);
/// kubernetes#132456 moved the filter chains after DNAT (1.34) and was cherry-picked to 1.33
/// only (#133969, in 1.33.6; no 1.32/1.31 cherry-pick found). A pod's call is also dropped by
/// a fixed kube-proxy without a local-traffic detector (no "short-circuit pod traffic" rule in
/// the external chain: `proxier.localDetector.IsImplemented()` in
/// `pkg/proxy/nftables/proxier.go`).
fn nftables_remedy(e: &LoopbackEvent, svc: &str) -> Vec<String> {
    let at = sock(e.vip.unwrap_or(e.dst), e.vip_port.unwrap_or(e.dst_port));
    let proto = e.proto.as_str();
    let (caller, fate) = caller_and_fate(e);
    let mut out = vec![format!(
        "Cause: {caller} {at}/{proto}, an LB IP of {svc}, which kube-proxy here handles as \
         externalTrafficPolicy Local without an endpoint on this node: in nftables mode it \
         writes that IP:port into its map no-endpoint-services with verdict drop, and its \
         filter chains {fate} an endpoint on another node (kubernetes#131765). In iptables \
         mode kube-proxy drops a pod's such call too unless its local-traffic detector \
         matches the pod (kubernetes#112820). Affected: kube-proxy 1.29 to 1.32 in nftables \
         mode, and 1.33.0 to 1.33.5 (before the cherry-pick of kubernetes#132456, #133969, \
         in 1.33.6); and, for pod calls, any release whose kube-proxy has no local-traffic \
         detector or one that does not match the pod."
    )];
    out.extend(mismatch(e));
    out.push(format!(
        "Upgrade kube-proxy to a release with kubernetes#132456 (1.34, or 1.33.6 with \
         #133969), and give it a local-traffic detector that matches every pod on the node \
         ({DETECTOR_MODES}) so that pod calls to the LB IP are short-circuited to the \
         cluster-wide endpoints."
    ));
    out
}

/// The local-traffic detectors kube-proxy offers (`--detect-local-mode`), with the versions
/// whose nftables mode has the interface ones working (kubernetes#134024).
const DETECTOR_MODES: &str = "--detect-local-mode ClusterCIDR with --cluster-cidr covering \
     every pod range, or NodeCIDR, BridgeInterface (--pod-bridge-interface), \
     InterfaceNamePrefix (--pod-interface-name-prefix); in nftables mode the BridgeInterface and \
     InterfaceNamePrefix detectors work only from 1.33.6, 1.34.2 and 1.35, kubernetes#134024";

/// iptables mode: `KUBE-EXTERNAL-SERVICES` drops what the external chain did not
/// short-circuit, and it short-circuits only the pods the local-traffic detector matches
/// (`pkg/proxy/iptables/proxier.go`; kubernetes#112820 for a second pod IP pool).
fn iptables_remedy(e: &LoopbackEvent, svc: &str) -> Vec<String> {
    let at = sock(e.vip.unwrap_or(e.dst), e.vip_port.unwrap_or(e.dst_port));
    let proto = e.proto.as_str();
    let (caller, fate) = caller_and_fate(e);
    let detector = detector_in(e);
    let why = match &detector {
        Detector::Missed(d) => format!(
            " Its detector here is `{d}`, and it does not match the pod {} (a pod IP pool \
             outside --cluster-cidr, kubernetes#112820, or a pod on another interface).",
            e.src
        ),
        Detector::Absent => " kube-proxy here has no local-traffic detector (its nat rules have \
             no \"pod traffic for ... external destinations\" rule), so no pod's call is \
             short-circuited."
            .to_string(),
        Detector::Unknown => String::new(),
    };
    let mut out = vec![format!(
        "Cause: {caller} {at}/{proto}, an LB IP of {svc}, which kube-proxy here handles as \
         externalTrafficPolicy Local without an endpoint on this node: in iptables mode its \
         filter chain KUBE-EXTERNAL-SERVICES has a DROP rule for that IP:port (\"has no local \
         endpoints\") and {fate} an endpoint on another node, unless kube-proxy's nat rules \
         short-circuit it to the cluster-wide endpoints first, which they do only for pods \
         its local-traffic detector matches.{why}"
    )];
    out.extend(mismatch(e));
    out.push(match &detector {
        Detector::Missed(d) if d.starts_with("-s ") => format!(
            "Make kube-proxy's detector match every pod on the node: --cluster-cidr must cover \
             {} (one CIDR per family: a range that holds every pod pool), or switch to \
             --detect-local-mode InterfaceNamePrefix (--pod-interface-name-prefix) or \
             BridgeInterface (--pod-bridge-interface), which match a pod by its interface, not \
             its address (if the node later moves to nftables mode: those two work there only \
             from 1.33.6, 1.34.2 and 1.35, kubernetes#134024).",
            e.src
        ),
        Detector::Missed(_) => format!(
            "Make kube-proxy's detector match every pod on the node: \
             --pod-interface-name-prefix or --pod-bridge-interface must name the interface of \
             the pod {}{}, or use --detect-local-mode ClusterCIDR with a --cluster-cidr that \
             covers every pod range.",
            e.src,
            e.nic
                .as_deref()
                .map(|n| format!(" (the drop was seen on {n})"))
                .unwrap_or_default()
        ),
        _ => format!(
            "Give kube-proxy a local-traffic detector that matches every pod on the node \
             ({DETECTOR_MODES}) so that pod calls to the LB IP are short-circuited to the \
             cluster-wide endpoints."
        ),
    });
    out
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, .. } = CauseAddresses::of(event);
    let head = format!(
        "kube-proxy dropped a call from {} to {vip}/{proto}: an externalTrafficPolicy Local Service without an endpoint on this node",
        event.src
    );
    if event.facts.proxy_mode != Some(ProxyMode::Iptables) {
        return format!("{head}, in nftables mode.");
    }
    match detector_in(event) {
        Detector::Missed(d) => {
            format!("{head}, in iptables mode; its local-traffic detector ({d}) missed the pod.")
        }
        Detector::Absent => {
            format!("{head}, in iptables mode, whose kube-proxy has no local-traffic detector.")
        }
        Detector::Unknown => format!("{head}, in iptables mode."),
    }
}
