//! `proxy_protocol_short_circuit`, the agent's side (pure: no I/O, no clock): which conntrack
//! entries prove that an in-cluster call to an LB with PROXY protocol on was short-circuited
//! by kube-proxy and reset by its backend.
//!
//! # How it is seen, and why there
//!
//! The call never crosses a NIC (pod -> node -> pod on the same node, or to a pod of another
//! node through the overlay), and a RST is no drop: neither the NIC programs nor the
//! `kfree_skb` hook see it, and watching every pod's resets in eBPF would add a lookup to
//! every packet of every pod. conntrack already has it: kube-proxy's DNAT of the LB IP is an
//! entry whose original destination is the LB IP:port and whose reply comes from the
//! endpoint (`DST_NAT`); conntrack sets `ASSURED` when the handshake completes, and moves
//! the entry to `CLOSE` on a RST (kept 10 s: `nf_conntrack_tcp_timeout_close`), where a
//! clean close goes through `FIN_WAIT`/`TIME_WAIT` instead. So an `ASSURED` entry in `CLOSE`
//! to a PROXY-protocol LB IP:port, DNATed on this node, is an established short-circuited
//! connection that was reset: on the lab node exactly what a backend that requires the
//! header leaves (`tests/tests/proxy_protocol.rs`), while the same call with the header ends
//! in `TIME_WAIT`. The agent reads it with one kernel-filtered conntrack dump per LB IP:port
//! (`state::conntrack::dump_by_orig_destination`), no change to the per-packet path.
//!
//! What conntrack does not say: which side sent the RST, nor that the client sent data first
//! (`ASSURED` proves the handshake; the bytes need `nf_conntrack_acct`, off by default). The
//! evidence says so; the Service's PROXY protocol annotation is what names the cause.

use std::net::IpAddr;

use probe_contract::{AggregateKey, LoopbackEvent, LoopbackKind, Outcome, Proto, SnatState, sock};

use super::{
    Correlator, Output,
    remedy::{cause::CauseAddresses, sentences::service_key},
};
use crate::{
    service::ServiceFacts,
    state::{ConntrackEntry, Tuple},
};

/// How long a confirmed entry is remembered: longer than conntrack keeps it in `CLOSE`
/// (`nf_conntrack_tcp_timeout_close`, 10 s by default), so one reset counts once.
const DONE_FOR_NS: u64 = 30_000_000_000;
/// The most confirmed entries remembered (the oldest go first).
const DONE_MAX: usize = 4096;

impl Correlator {
    /// The resets of short-circuited calls to `targets` in a conntrack dump ([`confirm`]),
    /// each counted once (its entry stays in the table across dumps), as reports of
    /// `proxy_protocol_short_circuit`. `now_ns`: CLOCK_MONOTONIC.
    pub fn proxy_protocol(
        &mut self,
        entries: &[ConntrackEntry],
        targets: &[ProxyProtocolTarget],
        now_ns: u64,
    ) -> Vec<Output> {
        self.proxy_protocol_done
            .retain(|_, at| at.saturating_add(DONE_FOR_NS) >= now_ns);
        let mut out = Vec::new();
        for r in confirm(entries, targets) {
            let orig = Tuple {
                src: r.client.0,
                dst: r.lb.0,
                sport: r.client.1,
                dport: r.lb.1,
                proto: Proto::Tcp,
            };
            if self.proxy_protocol_done.contains_key(&orig) {
                continue;
            }
            if self.proxy_protocol_done.len() >= DONE_MAX
                && let Some(oldest) = self
                    .proxy_protocol_done
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(t, _)| t.clone())
            {
                self.proxy_protocol_done.remove(&oldest);
            }
            self.proxy_protocol_done.insert(orig, now_ns);
            let key = AggregateKey::ProxyProtocolShortCircuit {
                lb: r.lb.0,
                lb_port: r.lb.1,
                endpoint: r.endpoint.0,
                endpoint_port: r.endpoint.1,
            };
            let event = LoopbackEvent {
                key: key.to_string(),
                vip: Some(r.lb.0),
                vip_port: Some(r.lb.1),
                snat: if r.snat {
                    SnatState::Yes
                } else {
                    SnatState::No
                },
                service: Some(r.service.clone()),
                evidence: r.evidence,
                first_seen_ns: now_ns,
                last_seen_ns: now_ns,
                ..LoopbackEvent::between(
                    LoopbackKind::ProxyProtocolShortCircuit,
                    r.client,
                    r.endpoint,
                    Proto::Tcp,
                    Outcome::Reset,
                )
            };
            out.push(Output::Report(self.record(key, event, now_ns)));
        }
        out
    }
}

/// An LB ingress IP:port whose LB sends PROXY protocol headers to the backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyProtocolTarget {
    pub ip: IpAddr,
    pub port: u16,
    /// `namespace/name`.
    pub service: String,
    /// The annotation (`key: value`) that turns PROXY protocol on.
    pub annotation: String,
    /// The ingress says `ipMode: Proxy` (kube-proxy >= 1.30 writes no rule for it).
    pub ip_mode_proxy: bool,
}

/// The TCP LB IP:ports of these Services whose LB sends PROXY protocol headers
/// (`crate::service::proxy_protocol`).
pub fn targets<'a>(
    services: impl IntoIterator<Item = &'a ServiceFacts>,
) -> Vec<ProxyProtocolTarget> {
    let mut out = Vec::new();
    for s in services {
        let Some(annotation) = crate::service::proxy_protocol(&s.annotations) else {
            continue;
        };
        for ing in &s.ingress {
            let Some(ip) = ing.ip else { continue };
            for p in s
                .ports
                .iter()
                .filter(|p| p.protocol.eq_ignore_ascii_case("TCP"))
            {
                out.push(ProxyProtocolTarget {
                    ip,
                    port: p.port,
                    service: s.key(),
                    annotation: annotation.clone(),
                    ip_mode_proxy: ing.ip_mode.as_deref() == Some("Proxy"),
                });
            }
        }
    }
    out
}

/// How often the conntrack table is read for PROXY-protocol resets (less than the 10 s an
/// entry stays in `CLOSE`); verify's test waits one of these more than its usual grace.
pub const DUMP_EVERY: std::time::Duration = std::time::Duration::from_secs(3);

/// LB IPs dumped at most per round (every [`DUMP_EVERY`]).
pub const MAX_DUMPED_IPS: usize = 256;

/// What one round of PROXY-protocol dumps reads: one kernel-filtered dump per LB IP (TCP, any
/// port; at most [`MAX_DUMPED_IPS`]) and the IP:ports whose entries count. Hostile round 4: one
/// tenant Service with 5,000 ports cost 5,000 dumps every 3 s, each walking the whole table
/// (99% of a core); now one. Pure.
pub fn dump_plan(
    targets: &[ProxyProtocolTarget],
) -> (Vec<IpAddr>, std::collections::HashSet<(IpAddr, u16)>) {
    let wanted: std::collections::HashSet<(IpAddr, u16)> =
        targets.iter().map(|t| (t.ip, t.port)).collect();
    let mut ips: Vec<IpAddr> = wanted.iter().map(|(ip, _)| *ip).collect();
    ips.sort_unstable();
    ips.dedup();
    ips.truncate(MAX_DUMPED_IPS);
    (ips, wanted)
}

/// One confirmed occurrence: a short-circuited call to a PROXY-protocol LB, reset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyProtocolReset {
    /// The caller (the entry's original source).
    pub client: (IpAddr, u16),
    /// The LB IP:port it called.
    pub lb: (IpAddr, u16),
    /// The endpoint kube-proxy sent it to (the reply's source).
    pub endpoint: (IpAddr, u16),
    /// The call was also source-NATed (kube-proxy masquerades external-destination traffic
    /// of a Cluster-policy Service).
    pub snat: bool,
    pub service: String,
    pub annotation: String,
    /// What proves it, one line each.
    pub evidence: Vec<String>,
}

/// The entries that prove a reset short-circuited call to one of `targets` (see the module
/// doc): TCP, original destination a target's IP:port, `DST_NAT` to another address,
/// `ASSURED`, state `CLOSE`. Anything else (a clean close, a refused or unanswered connect,
/// a call that really went to the LB: no DNAT on this node) is not one.
pub fn confirm(
    entries: &[ConntrackEntry],
    targets: &[ProxyProtocolTarget],
) -> Vec<ProxyProtocolReset> {
    entries
        .iter()
        .filter(|e| e.orig.proto == Proto::Tcp && e.dnat && e.assured)
        .filter(|e| e.tcp_state.as_deref() == Some("CLOSE"))
        .filter(|e| (e.reply.src, e.reply.sport) != (e.orig.dst, e.orig.dport))
        .filter_map(|e| {
            let t = targets
                .iter()
                .find(|t| (t.ip, t.port) == (e.orig.dst, e.orig.dport))?;
            let lb = sock(t.ip, t.port);
            let endpoint = sock(e.reply.src, e.reply.sport);
            let mut evidence = vec![
                format!(
                    "{}: {}: the LB sends a PROXY protocol header",
                    t.service, t.annotation
                ),
                format!(
                    "conntrack: {} -> {lb} DNATed on this node to {endpoint}: the call never \
                     reached the LB, so it carried no header",
                    sock(e.orig.src, e.orig.sport)
                ),
                "conntrack: ASSURED, then CLOSE: the handshake completed and the connection \
                 was reset (a clean close ends in TIME_WAIT); which side sent the RST and the \
                 bytes before it are not in conntrack"
                    .to_string(),
            ];
            if t.ip_mode_proxy {
                evidence.push(
                    "the API sets ipMode: Proxy, yet this node DNATs the LB IP: its kube-proxy \
                     ignores ipMode (older than Kubernetes 1.30)"
                        .into(),
                );
            }
            Some(ProxyProtocolReset {
                client: (e.orig.src, e.orig.sport),
                lb: (t.ip, t.port),
                endpoint: (e.reply.src, e.reply.sport),
                snat: e.snat,
                service: t.service.clone(),
                annotation: t.annotation.clone(),
                evidence,
            })
        })
        .collect()
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

/// `proxy_protocol_short_circuit`: the call never passed the LB that adds the header.
pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let lb = e
        .vip
        .zip(e.vip_port)
        .map_or_else(|| "the LB IP".to_string(), |(ip, port)| sock(ip, port));
    let svc = service_key(e).unwrap_or_else(|| "the Service".to_string());
    vec![
        format!(
            "Cause: {} called {lb}, whose LB sends a PROXY protocol header to {svc}'s backends; \
             kube-proxy short-circuits that IP on the node, so the call went straight to {} \
             without the header and the backend reset it (\"broken header\", \
             kubernetes/ingress-nginx#9643).",
            e.src,
            sock(e.dst, e.dst_port)
        ),
        format!(
            "Call {svc} from inside the cluster by its cluster DNS name or ClusterIP, sending \
             the PROXY protocol header yourself when the backend requires it on every \
             connection."
        ),
        "Or make in-cluster calls go through the LB: the provider's hostname annotation \
         (Hetzner load-balancer.hetzner.cloud/hostname, OpenStack \
         loadbalancer.openstack.org/hostname, DigitalOcean \
         service.beta.kubernetes.io/do-loadbalancer-hostname: kubernetes/ingress-nginx#3996, \
         Alibaba service.beta.kubernetes.io/alibaba-cloud-loadbalancer-hostname) or ipMode: \
         Proxy on the ingress (Kubernetes >= 1.30), so kube-proxy writes no rule for the IP."
            .to_string(),
    ]
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, dst } = CauseAddresses::of(event);
    format!(
        "{} called {vip}/{proto}, whose load balancer adds a PROXY protocol header; kube-proxy short-circuited it to {dst} on this node, so it arrived without the header and was reset.",
        event.src
    )
}
