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
//!
//! From where (issue #49): the node's own call is what most LBs never send back to it (they
//! skip the backend equal to the source), so a node-sourced test says nothing of a pod's
//! loop. Each loop this node confirmed for the Service ([`loops_of`]) is tested from its own
//! client: a pod's from inside the pod's network namespace (`state::netns`), to the LB
//! IP:port it looped through ([`plan`]); the node's from the node. Each result names its
//! `source`, and the results of loops this node had are marked `looped`.
//!
//! What is a verdict: `confirmed` needs the correlator's confirmation of that kind, target
//! and client during the test; `clean` needs every connection answered (connected, or
//! refused by the far end) with nothing confirmed; a test whose connections timed out or
//! failed is `not_proven` (an LB that drops every call reads like a fixed loop); a client the
//! agent cannot test from is `not_testable` with why. Never `clean` from silence.

use std::{net::IpAddr, time::Duration};

use probe_contract::{
    LoopbackEvent, LoopbackKind, Proto,
    facts::SourceKind,
    sock,
    verify::{
        FROM_NODE, MAX_CLIENTS, MAX_KINDS, MAX_TARGETS, RequestedKind, VerifyOutcome, VerifyResult,
    },
};

use crate::service::ServiceFacts;

/// Connections per target and request ("a few"): enough for a loop the LB hits on one of
/// two or three picks (a two-node LB pool picks this node about half the time).
pub const ATTEMPTS: usize = 3;
/// One connection's timeout: a looping SYN is dropped (no answer at all), an answered one
/// comes back within a round trip to the LB.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long after the last connection the test still takes confirmations: the correlator
/// holds a confirmation until the API cache names it (at most 2 s, `kube::hold`).
pub const GRACE: Duration = Duration::from_millis(2500);
/// The same when a PROXY-protocol short circuit is tested: its proof is a conntrack dump the
/// correlation loop makes every [`crate::correlate::proxy_protocol::DUMP_EVERY`], so the test
/// waits one interval (and a second) more than the hold, or the reset it caused is read after
/// it ended.
pub const PROXY_PROTOCOL_GRACE: Duration = Duration::from_millis(
    crate::correlate::proxy_protocol::DUMP_EVERY.as_millis() as u64
        + GRACE.as_millis() as u64
        + 1000,
);
/// What a test connection sends once connected, when the Service has PROXY protocol on: a
/// backend that requires the header resets a connection whose first bytes are not one (what
/// the loop is); closed without a byte, it has nothing to reset. Any other server answers
/// or closes, and either is an answer.
pub const PROBE_BYTES: &[u8] = b"HEAD / HTTP/1.0\r\nUser-Agent: clb-probe-verify\r\n\r\n";

/// The kinds a connection from the node can trip (module doc; their rows of the contract's
/// `KINDS`).
pub fn node_testable() -> Vec<LoopbackKind> {
    LoopbackKind::ALL
        .into_iter()
        .filter(|k| k.spec().node_testable)
        .collect()
}

/// Every kind, as a request may name them (`spec.kinds`).
pub const ALL_KINDS: [LoopbackKind; LoopbackKind::ALL.len()] = LoopbackKind::ALL;

/// The kinds a call from a pod can trip: those a node-sourced call trips but the VIP as
/// source (a node's own socket's), and a pod's call to its own Service.
pub fn pod_testable(kind: LoopbackKind) -> bool {
    kind.spec().pod_testable
}

/// The kinds a request asks for: its `kinds` read (an unknown name is an error; a repeat
/// counts once; more than [`MAX_KINDS`] names is an error before any is read), or, when
/// empty, the node-testable kinds and the health checks (`service_self_loop` only when
/// named: never testable from the node; a pod that had it is tested for it, [`plan`]).
pub fn kinds(requested: &[RequestedKind]) -> Result<Vec<LoopbackKind>, KindsError> {
    if requested.is_empty() {
        let mut all = node_testable();
        all.push(LoopbackKind::HealthcheckBlackhole);
        return Ok(all);
    }
    if requested.len() > MAX_KINDS {
        return Err(KindsError::TooMany(requested.len()));
    }
    let mut out: Vec<LoopbackKind> = Vec::new();
    for k in requested {
        let kind = match k {
            RequestedKind::Known(kind) => *kind,
            RequestedKind::Unknown(name) => {
                return Err(KindsError::Unknown(crate::untrusted::text(name, 64)));
            }
        };
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    Ok(out)
}

/// Why a request's `spec.kinds` is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KindsError {
    #[error("spec.kinds names {0} kinds; at most {MAX_KINDS} (there are {n})", n = ALL_KINDS.len())]
    TooMany(usize),
    #[error("unknown kind {0:?} (known: {known})", known = ALL_KINDS.map(LoopbackKind::as_str).join(", "))]
    Unknown(String),
}

/// Where a test's connections are made from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// The node itself (the agent's own namespace).
    Node,
    /// A pod of this node, by its IP (and `namespace/name` when the API named it): the call is
    /// made from inside its network namespace.
    Pod { ip: IpAddr, name: Option<String> },
}

impl Client {
    /// What a result's `source` says.
    pub fn text(&self) -> String {
        match self {
            Client::Node => FROM_NODE.to_owned(),
            Client::Pod { ip, name } => {
                format!("pod {} ({ip})", name.as_deref().unwrap_or("(name unknown)"))
            }
        }
    }

    /// Whether `e`'s looping packet came from this client.
    pub fn sent(&self, e: &LoopbackEvent) -> bool {
        match self {
            Client::Node => !from_pod(e),
            Client::Pod { ip, .. } => e.src == *ip,
        }
    }

    /// Whether a call from this client can trip `kind`.
    pub fn can_trip(&self, kind: LoopbackKind) -> bool {
        match self {
            Client::Node => kind.spec().node_testable,
            Client::Pod { .. } => pod_testable(kind),
        }
    }
}

/// Whether `e`'s packet came from a pod: the correlator's address tags say so, or (a kind
/// whose sender it does not tag, the PROXY-protocol reset) the API named the pod.
fn from_pod(e: &LoopbackEvent) -> bool {
    e.facts.source == SourceKind::Pod
        || (e.facts.source == SourceKind::Unknown && e.client_pod.is_some())
}

/// Whether `e` names the Service `namespace/name` (an event names it `namespace/name:port`
/// when the port has a name).
pub fn names_service(e: &LoopbackEvent, service: &str) -> bool {
    e.service
        .as_deref()
        .is_some_and(|s| probe_contract::names_service(s, service))
}

/// A loop this node confirmed for a Service: its kind, its client, the LB IP:port it looped
/// through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Looped {
    pub kind: LoopbackKind,
    pub client: Client,
    pub target: Target,
}

/// The loops of `service` (`namespace/name`) among this node's confirmations, once each
/// (an aggregate per client and port: the events' sources): those that name it, and those
/// that looped through one of its LB IP:ports `lb` (the LB may send a call to another
/// Service's NodePort, and the event then names that one: the path still went through this
/// Service's LB). Health checks are the LB's own calls (tested per LB IP by waiting,
/// [`decide_healthcheck`]), not a client's.
pub fn loops_of<'a>(
    confirmed: impl IntoIterator<Item = &'a LoopbackEvent>,
    service: &str,
    lb: &[Target],
) -> Vec<Looped> {
    let mut out: Vec<Looped> = Vec::new();
    for e in confirmed {
        if e.kind == LoopbackKind::HealthcheckBlackhole {
            continue;
        }
        let (Some(ip), Some(port)) = (e.vip, e.vip_port) else {
            continue;
        };
        let through_lb = lb
            .iter()
            .any(|t| t.ip == ip && t.port == port && t.proto == e.proto);
        if !names_service(e, service) && !through_lb {
            continue;
        }
        let client = if from_pod(e) {
            Client::Pod {
                ip: e.src,
                name: e.client_pod.clone(),
            }
        } else {
            Client::Node
        };
        let l = Looped {
            kind: e.kind,
            client,
            target: Target {
                ip,
                port,
                proto: e.proto,
            },
        };
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

/// One test: connections from `client` to `target`, judged for `kinds`; `looped`: the kinds
/// this node confirmed a loop of from that client at that target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Test {
    pub client: Client,
    pub target: Target,
    pub kinds: Vec<LoopbackKind>,
    pub looped: Vec<LoopbackKind>,
}

/// What a request tests on this node: every TCP target of the Service from the node (the
/// node's own loops among them), then each pod that looped (at most [`MAX_CLIENTS`]) at the
/// targets it looped through, for the kinds it looped with; and the results known without a
/// test. `service_targets` is [`targets`]'s answer; `every_kind`: the request named no kind
/// (then every loop is tested, `service_self_loop` too). Pure.
pub fn plan(
    service_targets: (Vec<Target>, Vec<VerifyResult>),
    kinds: &[LoopbackKind],
    every_kind: bool,
    loops: &[Looped],
) -> (Vec<Test>, Vec<VerifyResult>) {
    let (targets, mut untestable) = service_targets;
    let asked: Vec<&Looped> = loops
        .iter()
        .filter(|l| every_kind || kinds.contains(&l.kind))
        .collect();
    let mut tests: Vec<Test> = targets
        .iter()
        .map(|t| Test {
            client: Client::Node,
            target: *t,
            kinds: kinds.to_vec(),
            looped: asked
                .iter()
                .filter(|l| l.client == Client::Node && l.target == *t)
                .map(|l| l.kind)
                .collect(),
        })
        .collect();
    // A node loop at an LB IP:port the Service no longer has cannot be tested (the agent
    // connects only to the Service's targets as the API lists them).
    for l in asked.iter().filter(|l| l.client == Client::Node) {
        if !targets.contains(&l.target) {
            untestable.push(not_testable_loop(l, "the loop's LB IP:port is not one of the Service's now (the API's ingress and ports): the agent tests only those"));
        }
    }
    let mut clients: Vec<&Client> = Vec::new();
    for l in asked.iter().filter(|l| l.client != Client::Node) {
        if !clients.contains(&&l.client) {
            clients.push(&l.client);
        }
    }
    for (i, client) in clients.into_iter().enumerate() {
        let mine: Vec<&&Looped> = asked.iter().filter(|l| l.client == *client).collect();
        for l in &mine {
            if i >= MAX_CLIENTS {
                untestable.push(not_testable_loop(
                    l,
                    &format!("over the limit of {MAX_CLIENTS} pods a request tests from"),
                ));
            } else if !targets.contains(&l.target) {
                untestable.push(not_testable_loop(l, "the loop's LB IP:port is not one of the Service's now (the API's ingress and ports): the agent tests only those"));
            } else if let Some(test) = tests
                .iter_mut()
                .find(|t| t.client == *client && t.target == l.target)
            {
                test.kinds.push(l.kind);
                test.looped.push(l.kind);
            } else {
                tests.push(Test {
                    client: client.clone(),
                    target: l.target,
                    kinds: vec![l.kind],
                    looped: vec![l.kind],
                });
            }
        }
    }
    (tests, untestable)
}

fn not_testable_loop(l: &Looped, reason: &str) -> VerifyResult {
    VerifyResult {
        kind: l.kind.as_str().to_owned(),
        source: l.client.text(),
        looped: true,
        ..not_testable("", l.target.text(), reason)
    }
}

/// The results of `test` when its client cannot be tested from (`why`): every kind it asks
/// for, `not_testable`.
pub fn untestable_client(test: &Test, why: &str) -> Vec<VerifyResult> {
    test.kinds
        .iter()
        .filter(|k| **k != LoopbackKind::HealthcheckBlackhole)
        .map(|k| VerifyResult {
            kind: k.as_str().to_owned(),
            source: test.client.text(),
            looped: test.looped.contains(k),
            ..not_testable("", test.target.text(), why)
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
        source: String::new(),
        looped: false,
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

impl Attempt {
    /// Whether the far end answered (a handshake, or a refusal): the path completed.
    pub fn answered(&self) -> bool {
        matches!(self, Attempt::Connected(_) | Attempt::Refused)
    }
}

/// "3 TCP connections from the node: 2 connected (≤ 12 ms), 1 timed out after 1.5 s" (or
/// "from pod default/a (10.0.0.5)").
pub fn tried(attempts: &[Attempt], client: &Client) -> String {
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
    let from = match client {
        Client::Node => "the node".to_owned(),
        pod => pod.text(),
    };
    format!(
        "{} TCP connection{} from {from}: {}",
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

/// The results of `test` from the connections made and the confirmations published during
/// the test (any target, any client: this picks its own). Per kind: `confirmed` when the
/// correlator confirmed that kind at the target from the test's client; `not_testable` when
/// the client cannot trip it or no connection was made; `clean` only when every connection
/// was answered; else `not_proven`. Health checks are [`decide_healthcheck`]'s.
pub fn decide(
    test: &Test,
    attempts: &[Attempt],
    confirmations: &[LoopbackEvent],
) -> Vec<VerifyResult> {
    test.kinds
        .iter()
        .filter(|k| !matches!(k, LoopbackKind::HealthcheckBlackhole))
        .map(|kind| {
            let confirmed = confirmations
                .iter()
                .rev()
                .find(|e| e.kind == *kind && test.target.is_of(e) && test.client.sent(e));
            let base = VerifyResult {
                kind: kind.as_str().to_owned(),
                target: test.target.text(),
                outcome: VerifyOutcome::Clean,
                evidence: Vec::new(),
                tried: String::new(),
                reason: String::new(),
                source: test.client.text(),
                looped: test.looped.contains(kind),
            };
            match confirmed {
                Some(e) => VerifyResult {
                    outcome: VerifyOutcome::Confirmed,
                    evidence: evidence_of(e),
                    tried: tried(attempts, &test.client),
                    ..base
                },
                None if !test.client.can_trip(*kind) => VerifyResult {
                    outcome: VerifyOutcome::NotTestable,
                    reason: match test.client {
                        Client::Node => "needs a call from a pod that is its own Service's endpoint: tested from a pod only when this node confirmed that pod's loop".into(),
                        Client::Pod { .. } => "a pod's call cannot trip it (the VIP as a source is a node socket's)".into(),
                    },
                    ..base
                },
                None if attempts.is_empty() => VerifyResult {
                    outcome: VerifyOutcome::NotTestable,
                    reason: "no connection was made".into(),
                    ..base
                },
                None if attempts.iter().all(Attempt::answered) => VerifyResult {
                    outcome: VerifyOutcome::Clean,
                    tried: tried(attempts, &test.client),
                    ..base
                },
                None => VerifyResult {
                    outcome: VerifyOutcome::NotProven,
                    tried: tried(attempts, &test.client),
                    reason: "not every connection was answered and nothing was confirmed: a call that gets no answer may be the loop (an LB that drops hairpinned calls) or anything else on the path; silence proves neither".into(),
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
        source: String::new(),
        looped: false,
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

/// The overall outcome of a set of results, worst first ([`VerifyOutcome::ALL`]'s order:
/// confirmed, not proven, clean, not testable).
pub fn worst(results: &[VerifyResult]) -> Option<VerifyOutcome> {
    let rank = |o: VerifyOutcome| VerifyOutcome::ALL.iter().position(|a| *a == o);
    results.iter().map(|r| r.outcome).min_by_key(|o| rank(*o))
}

/// One canary round's targets (hostile round 4: first-come, one tenant Service with 5,000 ports
/// put every other Service 1,250 rounds away). Rounds are shared per Service: each round takes
/// the next `n` Services in turn (those with a risk in the node's checks first), and from each
/// its next target, so every Service comes up every `services / n` rounds whatever its number
/// of ports. `services`: (key, its TCP targets, has a risk), any order; `cursor` and `next`
/// carry the turn between rounds. Pure.
pub fn canary_round(
    services: &[(String, Vec<Target>, bool)],
    cursor: &mut usize,
    next: &mut std::collections::HashMap<String, usize>,
    n: usize,
) -> Vec<Target> {
    let mut order: Vec<&(String, Vec<Target>, bool)> =
        services.iter().filter(|(_, t, _)| !t.is_empty()).collect();
    // Risks first, then by name: a stable order for the cursor to walk.
    order.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    if order.is_empty() {
        return Vec::new();
    }
    let take = n.min(order.len());
    let mut round = Vec::with_capacity(take);
    for i in 0..take {
        let (key, targets, _) = order[(*cursor + i) % order.len()];
        let at = next.entry(key.clone()).or_default();
        round.push(targets[*at % targets.len()]);
        *at = (*at + 1) % targets.len();
    }
    *cursor = (*cursor + take) % order.len();
    // Services gone from the cache are forgotten.
    next.retain(|k, _| order.iter().any(|(key, _, _)| key == k));
    round
}

/// Bounds an answer to [`probe_contract::verify::MAX_RESULTS`] results: the first ones kept
/// (the tests' order: the node's, then the pods'), and a note of how many were left out.
pub fn bounded(mut results: Vec<VerifyResult>) -> (Vec<VerifyResult>, Option<String>) {
    let max = probe_contract::verify::MAX_RESULTS;
    if results.len() <= max {
        return (results, None);
    }
    let left = results.len() - max;
    results.truncate(max);
    (
        results,
        Some(format!(
            "{left} results left out (an answer carries at most {max})"
        )),
    )
}

pub mod rate;

#[cfg(test)]
mod tests;
