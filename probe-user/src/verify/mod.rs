//! Verify on demand and the canary (#40), the pure part: which LB IP:ports of a Service a node
//! tests, and what a test came to from what the correlator confirmed during it plus the
//! connections' own results (no I/O, no clock). `agent::verify` connects, waits and writes
//! the answer; `kubectl clb-probe verify` reads it.
//!
//! What a node can test by connecting to an LB IP:port itself (a TCP connection from the
//! node, whose source is a node address): the loops a node-sourced call trips at once:
//! `vip_port_unserved` (the VIP bound here, nothing serving the port), a node-sourced
//! `hairpin` (an LB without the source-node guard sends the call back here), `vip_as_source`
//! (the call leaves with the bound VIP as source), `etp_local_drop` (kube-proxy's nftables
//! drop element) and `proxy_protocol_short_circuit` (kube-proxy short-circuits the call to a
//! PROXY-protocol backend, which resets it). What it cannot: `healthcheck_blackhole` is the
//! LB's own checks (only its next checks show it: the test waits for them for its whole window
//! and says not testable when none was confirmed dropped), `service_self_loop` needs a call
//! from a pod that is its own endpoint, and UDP has no connection whose failure tells a loop
//! from silence.

use std::{net::IpAddr, time::Duration};

use clb_probe_client::service::ServiceFacts;
use probe_contract::{
    LoopbackEvent, LoopbackKind, Proto, sock,
    verify::{MAX_TARGETS, VerifyOutcome, VerifyResult},
};

/// Connections per target and request ("a few"): enough for a loop the LB hits on one of
/// two or three picks (a two-node LB pool picks this node about half the time).
pub const ATTEMPTS: usize = 3;
/// One connection's timeout: a looping SYN is dropped (no answer at all), an answered one
/// comes back within a round trip to the LB.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long after the last connection the test still takes confirmations: the correlator
/// holds a confirmation until the API cache names it (at most 2 s, `kube::hold`).
pub const GRACE: Duration = Duration::from_millis(2500);

/// The kinds a connection from the node can trip (module doc).
pub const NODE_TESTABLE: [LoopbackKind; 5] = [
    LoopbackKind::Hairpin,
    LoopbackKind::VipPortUnserved,
    LoopbackKind::VipAsSource,
    LoopbackKind::EtpLocalDrop,
    LoopbackKind::ProxyProtocolShortCircuit,
];

/// Every kind, as a request may name them (`spec.kinds`).
pub const ALL_KINDS: [LoopbackKind; 7] = [
    LoopbackKind::Hairpin,
    LoopbackKind::VipPortUnserved,
    LoopbackKind::VipAsSource,
    LoopbackKind::EtpLocalDrop,
    LoopbackKind::ProxyProtocolShortCircuit,
    LoopbackKind::HealthcheckBlackhole,
    LoopbackKind::ServiceSelfLoop,
];

/// The kinds a request asks for: its `kinds` read (an unknown name is an error), or, when
/// empty, the node-testable kinds and the health checks (`service_self_loop` only when
/// named: it is never testable from the node, and listing it on every target says nothing).
pub fn kinds(requested: &[String]) -> Result<Vec<LoopbackKind>, String> {
    if requested.is_empty() {
        let mut all = NODE_TESTABLE.to_vec();
        all.push(LoopbackKind::HealthcheckBlackhole);
        return Ok(all);
    }
    requested
        .iter()
        .map(|k| {
            ALL_KINDS
                .iter()
                .copied()
                .find(|known| known.as_str() == k)
                .ok_or_else(|| {
                    format!(
                        "unknown kind {k:?} (known: {})",
                        ALL_KINDS.map(LoopbackKind::as_str).join(", ")
                    )
                })
        })
        .collect()
}

/// One LB IP:port of the Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub ip: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

impl Target {
    /// `ip:port/proto`, as a result names it.
    pub fn text(&self) -> String {
        format!("{}/{}", sock(self.ip, self.port), self.proto.as_str())
    }

    /// Whether a confirmation regards this IP:port (the LB address called, or the packet's
    /// destination when the event has no VIP).
    pub fn is_of(&self, e: &LoopbackEvent) -> bool {
        if e.proto != self.proto {
            return false;
        }
        let by_vip = e.vip == Some(self.ip) && e.vip_port == Some(self.port);
        let by_dst = e.dst == self.ip && e.dst_port == self.port;
        by_vip || by_dst
    }
}

/// What a node tests for a Service: its LB ingress IPs x its ports, TCP first, at most
/// [`MAX_TARGETS`]; and the results it can already give (UDP ports, hostname-only ingress,
/// targets over the limit: not testable).
pub fn targets(svc: &ServiceFacts) -> (Vec<Target>, Vec<VerifyResult>) {
    let mut tests = Vec::new();
    let mut untestable = Vec::new();
    let ips: Vec<IpAddr> = svc.ingress.iter().filter_map(|i| i.ip).collect();
    if ips.is_empty() {
        let why = if svc.ingress.iter().any(|i| i.hostname.is_some()) {
            "the Service's LB ingress has a hostname and no IP: the agent connects only to LB IPs the API lists (it resolves no name)"
        } else {
            "the Service has no LB ingress IP (not type LoadBalancer, or the LB is not provisioned yet)"
        };
        untestable.push(not_testable("*", svc.key(), why));
        return (tests, untestable);
    }
    for ip in &ips {
        for p in &svc.ports {
            let proto = match p.protocol.to_ascii_uppercase().as_str() {
                "TCP" | "" => Proto::Tcp,
                "UDP" => Proto::Udp,
                _ => Proto::Other(132),
            };
            let target = Target {
                ip: *ip,
                port: p.port,
                proto,
            };
            if proto != Proto::Tcp {
                untestable.push(not_testable(
                    "*",
                    format!("{}/{}", sock(*ip, p.port), p.protocol.to_ascii_lowercase()),
                    "not TCP: the agent tests with TCP connections only (a UDP datagram that gets no answer tells a loop from silence apart only with the server's cooperation)",
                ));
            } else if tests.len() >= MAX_TARGETS {
                untestable.push(not_testable(
                    "*",
                    target.text(),
                    &format!("over the limit of {MAX_TARGETS} targets a request tests"),
                ));
            } else {
                tests.push(target);
            }
        }
    }
    (tests, untestable)
}

fn not_testable(kind: &str, target: impl Into<String>, reason: &str) -> VerifyResult {
    VerifyResult {
        kind: kind.to_owned(),
        target: target.into(),
        outcome: VerifyOutcome::NotTestable,
        evidence: Vec::new(),
        tried: String::new(),
        reason: reason.to_owned(),
    }
}

/// One connection's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Connected (the handshake completed) in this many milliseconds.
    Connected(u64),
    /// RST (or ICMP unreachable): connection refused.
    Refused,
    /// No answer within [`CONNECT_TIMEOUT`].
    TimedOut,
    /// Any other error (no route, ...), as the OS said it.
    Failed(String),
}

/// "3 TCP connections from the node: 2 connected (≤ 12 ms), 1 timed out after 1.5 s".
pub fn tried(attempts: &[Attempt]) -> String {
    let connected: Vec<u64> = attempts
        .iter()
        .filter_map(|a| match a {
            Attempt::Connected(ms) => Some(*ms),
            _ => None,
        })
        .collect();
    let refused = attempts.iter().filter(|a| **a == Attempt::Refused).count();
    let timed_out = attempts.iter().filter(|a| **a == Attempt::TimedOut).count();
    let mut parts = Vec::new();
    if let Some(max) = connected.iter().max() {
        parts.push(format!("{} connected (<= {max} ms)", connected.len()));
    }
    if refused > 0 {
        parts.push(format!("{refused} refused"));
    }
    if timed_out > 0 {
        parts.push(format!(
            "{timed_out} timed out after {:.1} s",
            CONNECT_TIMEOUT.as_secs_f32()
        ));
    }
    let mut failed: Vec<&str> = attempts
        .iter()
        .filter_map(|a| match a {
            Attempt::Failed(e) => Some(e.as_str()),
            _ => None,
        })
        .collect();
    failed.dedup();
    for e in failed {
        parts.push(format!("failed: {e}"));
    }
    format!(
        "{} TCP connection{} from the node: {}",
        attempts.len(),
        if attempts.len() == 1 { "" } else { "s" },
        parts.join(", ")
    )
}

/// The evidence of a confirmation as a result carries it: its key, outcome and drop reason,
/// then its evidence lines.
pub fn evidence_of(e: &LoopbackEvent) -> Vec<String> {
    let mut lines = vec![format!(
        "{} ({}{})",
        e.key,
        e.outcome.as_str(),
        e.drop_reason
            .as_deref()
            .map(|r| format!(", drop reason {r}"))
            .unwrap_or_default()
    )];
    lines.extend(e.evidence.iter().cloned());
    lines
}

/// The results of the node-testable `kinds` at `target`, from the connections made and the
/// confirmations published during the test (any target: this picks its own).
pub fn decide(
    target: &Target,
    kinds: &[LoopbackKind],
    attempts: &[Attempt],
    confirmations: &[LoopbackEvent],
) -> Vec<VerifyResult> {
    kinds
        .iter()
        .filter(|k| !matches!(k, LoopbackKind::HealthcheckBlackhole))
        .map(|kind| {
            let confirmed = confirmations
                .iter()
                .rev()
                .find(|e| e.kind == *kind && target.is_of(e));
            let base = VerifyResult {
                kind: kind.as_str().to_owned(),
                target: target.text(),
                outcome: VerifyOutcome::Clean,
                evidence: Vec::new(),
                tried: String::new(),
                reason: String::new(),
            };
            match confirmed {
                Some(e) => VerifyResult {
                    outcome: VerifyOutcome::Confirmed,
                    evidence: evidence_of(e),
                    ..base
                },
                None if !NODE_TESTABLE.contains(kind) => VerifyResult {
                    outcome: VerifyOutcome::NotTestable,
                    reason: "needs a call from a pod that is its own Service's endpoint; the agent tests from the node only".into(),
                    ..base
                },
                None if attempts.is_empty() => VerifyResult {
                    outcome: VerifyOutcome::NotTestable,
                    reason: "no connection was made".into(),
                    ..base
                },
                None => VerifyResult {
                    outcome: VerifyOutcome::Clean,
                    tried: tried(attempts),
                    ..base
                },
            }
        })
        .collect()
}

/// The health-check result for one LB IP: confirmed when a `healthcheck_blackhole` from it was
/// confirmed during the test's window, else not testable (only the LB's own checks show it).
pub fn decide_healthcheck(
    ip: IpAddr,
    waited: Duration,
    confirmations: &[LoopbackEvent],
) -> VerifyResult {
    let base = VerifyResult {
        kind: LoopbackKind::HealthcheckBlackhole.as_str().to_owned(),
        target: ip.to_string(),
        outcome: VerifyOutcome::NotTestable,
        evidence: Vec::new(),
        tried: String::new(),
        reason: String::new(),
    };
    match confirmations
        .iter()
        .rev()
        .find(|e| e.kind == LoopbackKind::HealthcheckBlackhole && e.vip == Some(ip))
    {
        Some(e) => VerifyResult {
            outcome: VerifyOutcome::Confirmed,
            evidence: evidence_of(e),
            ..base
        },
        None => VerifyResult {
            reason: format!(
                "only the LB's own health checks show it: none from {ip} was confirmed dropped in the {:.0} s this test waited (checks answered, or none sent, look the same from here)",
                waited.as_secs_f32()
            ),
            ..base
        },
    }
}

/// Whether this node answers a request: it is named, or none is named and the agent has a
/// loop or a risk for the Service.
pub fn is_for(nodes: &[String], node: &str, has_loop_or_risk: bool) -> bool {
    if nodes.is_empty() {
        has_loop_or_risk
    } else {
        nodes.iter().any(|n| n == node)
    }
}

/// The overall outcome of a set of results, worst first: confirmed, clean, not testable.
pub fn worst(results: &[VerifyResult]) -> Option<VerifyOutcome> {
    let rank = |o: VerifyOutcome| match o {
        VerifyOutcome::Confirmed => 0,
        VerifyOutcome::Clean => 1,
        VerifyOutcome::NotTestable => 2,
    };
    results.iter().map(|r| r.outcome).min_by_key(|o| rank(*o))
}

#[cfg(test)]
mod tests;
