//! `probe check --as nftables`: what moving kube-proxy from IPVS (or iptables) mode to
//! nftables mode changes for loopback on this node, predicted from its real state (pure).
//!
//! The prediction is the check's own rules run twice: on the node as read, and on the same
//! node as kube-proxy's nftables mode would leave it ([`as_nftables`]); the difference of the
//! two risk sets is what disappears and what appears. So the prediction says what `probe
//! check` will say after the move, by construction (the VM tier compares it with the
//! nftables-mode lab: `tests/tests/ipvs.rs`).
//!
//! What nftables mode changes, and only that (kube-proxy's nftables proxier):
//! - no kube-ipvs0: nothing binds LB ingress or ClusterIPs on the node, so an LB IP that was
//!   local only because kube-proxy bound it stops being local (its health-check black hole
//!   and its refused ports go). An address a NIC or a `local` route makes local (keepalived,
//!   a cloud guest agent) stays;
//! - LB IP:ports kube-proxy serves today stay short-circuited (`service-ips`, for `ipMode:
//!   VIP`); a port it does not serve, which the bound address refused on the node, now leaves
//!   for the LB: a pod's call to it can hairpin. `ipMode: Proxy` and hostname-only LBs are
//!   short-circuited in neither mode. externalTrafficPolicy Local does not stop the short-
//!   circuit (in-cluster traffic to an LB IP has Cluster semantics); it only means kube-proxy
//!   does not masquerade what does leave;
//! - IPVS mode's `KUBE-LOOP-BACK` set and `KUBE-IPVS-FILTER` go (nftables mode masquerades a
//!   pod's call to itself in its endpoint chain).
//!
//! Masquerade rules, NodePorts, bridges and sysctls are the node's and do not change.
//!
//! Layout: this file predicts (the node as nftables mode would leave it, the risk sets'
//! difference and why); `readiness/prediction.rs` the answer's data, `readiness/ip_mode.rs` the
//! per-Service `ipMode: Proxy` advice, `readiness/node.rs` what both read off the node,
//! `readiness/render.rs` the prediction as text.

use probe_contract::check::{Dataplane, Finding, Kind, Mode, Severity};
use probe_core::{
    fixes::{self, Facts, Provider},
    service::ServiceFacts,
};

use super::Inputs;

mod ip_mode;
mod node;
mod render;

use probe_contract::readiness::{Change, Exposure, Prediction};

pub use self::render::table;
use self::{
    ip_mode::ip_mode_advice,
    node::{kube_proxy_binds, parse_subject},
};

/// The modes `--as` predicts.
pub const TARGETS: &[Mode] = &[Mode::Nftables];

/// Why `--as MODE` is a usage error (exit 2).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AsUsage {
    #[error("--as {0}: only `--as nftables` is predicted (the move off IPVS mode)")]
    NotPredicted(String),
    #[error("--as {0}: this node already runs kube-proxy in {0} mode")]
    Already(String),
    #[error("--as {0}: this node runs no kube-proxy (dataplane none): nothing to predict")]
    NoKubeProxy(String),
}

/// Checks `--as MODE` against the node's mode: the one-line error of exit 2.
pub fn validate(target: Mode, current: Option<Mode>) -> Result<Mode, AsUsage> {
    let name = target.as_str().to_owned();
    if target != Mode::Nftables {
        return Err(AsUsage::NotPredicted(name));
    }
    match current {
        Some(m) if m == target => Err(AsUsage::Already(name)),
        Some(Mode::None) => Err(AsUsage::NoKubeProxy(name)),
        _ => Ok(target),
    }
}

/// The Services' LB addresses that neither IPVS nor nftables mode short-circuits.
fn exposures(services: &[ServiceFacts]) -> Vec<Exposure> {
    let mut out = Vec::new();
    for s in services {
        for i in &s.ingress {
            let (address, why) = match (i.ip, i.hostname.as_deref()) {
                (Some(ip), _) if i.ip_mode.as_deref() == Some("Proxy") => (
                    ip.to_string(),
                    "ipMode: Proxy: kube-proxy writes no rule for it in any mode",
                ),
                (None, Some(h)) => (
                    h.to_string(),
                    "published as a hostname only: kube-proxy knows no address to short-circuit",
                ),
                _ => continue,
            };
            out.push(Exposure {
                service: s.key(),
                address,
                why: format!(
                    "{why}; pod calls go to the LB before and after the move (a hairpin when \
                     unSNATed and the LB keeps client addresses)"
                ),
            });
        }
    }
    out
}

/// The node as kube-proxy's nftables mode would leave it (pure; see the module doc).
pub fn as_nftables(inp: &Inputs) -> Inputs {
    let mut out = inp.clone();
    out.bound.retain(|ip| !kube_proxy_binds(inp, *ip));
    out.owners.retain(|ip, _| out.bound.contains(ip));
    out.services.source = Some(crate::state::ServiceSource::Nftables);
    out.services.access_filter.clear();
    out.self_loop.loop_back = None;
    // kube-proxy started in nftables mode removes IPVS mode's state (see `mode_leftover`).
    out.leftovers = Default::default();
    out.dataplane = Some(Dataplane {
        mode: Mode::Nftables,
        replacement: None,
        evidence: vec!["predicted: kube-proxy in nftables mode".into()],
        still_possible: Vec::new(),
        cannot_confirm: Vec::new(),
    });
    out
}

/// `etp_local_drop` is not predicted: it needs the API's endpoints per node, which the
/// prediction from today's rules does not have. The PROXY-protocol short-circuit stays as it
/// is (nftables mode short-circuits LB IPs too).
const LOOP_KINDS: [Kind; 5] = [
    Kind::HealthcheckBlackhole,
    Kind::VipPortUnserved,
    Kind::Hairpin,
    Kind::ServiceSelfLoop,
    Kind::ProxyProtocolShortCircuit,
];

fn risks(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Risk && LOOP_KINDS.contains(&f.kind))
        .collect()
}

/// The Service behind a finding: the LB target of its IP (and port), else the Service the
/// API lists with that ingress IP.
/// (Every Service sharing the IP, comma-separated, for an IP-only subject.)
fn service_of(inp: &Inputs, f: &Finding, services: &[ServiceFacts]) -> Option<String> {
    let (ip, port) = parse_subject(&f.subject)?;
    let mut names: Vec<String> = inp
        .lb_targets
        .iter()
        .filter(|t| t.ip == ip)
        .filter(|t| match &port {
            Some((p, proto)) => t.port == Some(*p) && t.proto.as_str() == proto,
            None => true,
        })
        .filter_map(|t| t.service.clone())
        .collect();
    if names.is_empty() {
        names = services
            .iter()
            .filter(|s| s.ingress.iter().any(|i| i.ip == Some(ip)))
            .map(ServiceFacts::key)
            .collect();
    }
    names.sort();
    names.dedup();
    (!names.is_empty()).then(|| names.join(", "))
}

fn why_gone(inp: &Inputs, f: &Finding) -> String {
    match f.kind {
        Kind::HealthcheckBlackhole | Kind::VipPortUnserved => format!(
            "nftables mode binds no LB IP: {} is local today only because kube-proxy bound it on \
             {}",
            f.subject, inp.vip_iface
        ),
        Kind::ServiceSelfLoop => "nftables mode has no KUBE-LOOP-BACK: it masquerades a pod's \
                                  call to itself in the Service's endpoint chain"
            .into(),
        _ => "served on the node in nftables mode (service-ips)".into(),
    }
}

fn why_new(inp: &Inputs, f: &Finding) -> String {
    let Some((ip, port)) = parse_subject(&f.subject) else {
        return "nftables mode leaves it to the LB".into();
    };
    let target = inp.lb_targets.iter().find(|t| {
        t.ip == ip
            && match &port {
                Some((p, proto)) => t.port == Some(*p) && t.proto.as_str() == proto,
                None => true,
            }
    });
    let mut why = if target.is_some_and(|t| t.ip_mode_proxy) {
        format!(
            "ipMode: Proxy: no kube-proxy mode short-circuits {}",
            f.subject
        )
    } else if inp.bound.contains(&ip) {
        format!(
            "today {ip} is bound on {}, so the node answers (refuses) {} itself; in nftables \
             mode nothing binds it and no kube-proxy rule serves that port: pod calls leave for \
             the LB without SNAT",
            inp.vip_iface, f.subject
        )
    } else {
        format!("nothing serves {} on the node in nftables mode", f.subject)
    };
    if target.is_some_and(|t| t.etp_local == Some(true)) {
        why.push_str("; externalTrafficPolicy: Local: kube-proxy does not masquerade them");
    }
    why
}

fn why_stays(inp: &Inputs, f: &Finding) -> String {
    match parse_subject(&f.subject) {
        Some((ip, _))
            if matches!(f.kind, Kind::HealthcheckBlackhole | Kind::VipPortUnserved)
                && !kube_proxy_binds(inp, ip) =>
        {
            format!(
                "{ip} is made local by {}, not kube-proxy: the move does not unbind it",
                inp.owners
                    .get(&ip)
                    .map_or_else(|| "another owner".to_string(), ToString::to_string)
            )
        }
        _ => "the same in nftables mode (nothing kube-proxy's mode decides)".into(),
    }
}

/// The fixes of an appearing risk, from the Service that owns it (its profile from its own
/// settings, else `provider`).
fn fixes_of(
    kind: Kind,
    subject: &str,
    service: Option<&str>,
    services: &[ServiceFacts],
    provider: Option<Provider>,
) -> Vec<probe_contract::Fix> {
    let Some(kind) = kind.predicted() else {
        return Vec::new();
    };
    let Some((ip, port)) = parse_subject(subject) else {
        return Vec::new();
    };
    let Some(svc) = service.and_then(|k| services.iter().find(|s| s.key() == k)) else {
        return Vec::new();
    };
    let provider = provider
        .or_else(|| fixes::service_provider(svc))
        .unwrap_or(Provider::Generic);
    let mut facts = Facts::of_risk(kind, ip, svc, provider);
    // The prediction is of kube-proxy in nftables mode: it runs.
    facts.kube_proxy = Some(true);
    if let Some((port, proto)) = port {
        let proto = if proto == "udp" {
            probe_contract::Proto::Udp
        } else {
            probe_contract::Proto::Tcp
        };
        facts = facts.with_port(port, proto);
    }
    fixes::fixes(&facts)
}

/// The prediction for `inp` (read from the node in its current mode) as `to`, with the
/// Services the API listed (may be empty). `provider`: `--provider`-like override (None: each
/// Service's own settings, else generic).
pub fn predict(
    inp: &Inputs,
    services: &[ServiceFacts],
    provider: Option<Provider>,
    to: Mode,
) -> Prediction {
    let from = inp
        .dataplane
        .as_ref()
        .map(|d| d.mode)
        .or(inp.services.source.map(super::dataplane::mode_of))
        .unwrap_or(Mode::Iptables);
    let predicted = as_nftables(inp);
    let before_all = super::rules::judge(inp);
    let after_all = super::rules::judge(&predicted);
    let before = risks(&before_all);
    let after = risks(&after_all);
    let key = |f: &Finding| (f.kind, f.subject.clone());
    let mut disappear = Vec::new();
    let mut remain = Vec::new();
    for f in &before {
        let service = service_of(inp, f, services);
        if after.iter().any(|a| key(a) == key(f)) {
            remain.push(Change {
                kind: f.kind,
                subject: f.subject.clone(),
                service,
                why: why_stays(inp, f),
                fixes: Vec::new(),
            });
        } else {
            disappear.push(Change {
                kind: f.kind,
                subject: f.subject.clone(),
                service,
                why: why_gone(inp, f),
                fixes: Vec::new(),
            });
        }
    }
    let mut appear = Vec::new();
    for f in after
        .iter()
        .filter(|a| !before.iter().any(|b| key(b) == key(a)))
    {
        let service = service_of(inp, f, services);
        let mut fixes = fixes_of(f.kind, &f.subject, service.as_deref(), services, provider);
        if fixes.is_empty() {
            fixes = f.fixes.clone();
        }
        appear.push(Change {
            kind: f.kind,
            subject: f.subject.clone(),
            service,
            why: why_new(inp, f),
            fixes,
        });
    }
    let mut before_migrating: Vec<probe_contract::Fix> = Vec::new();
    for fix in appear.iter().flat_map(|c| c.fixes.iter()) {
        if !before_migrating
            .iter()
            .any(|b| b.id == fix.id && b.service == fix.service)
        {
            before_migrating.push(fix.clone());
        }
    }
    let ip_mode = ip_mode_advice(inp, services, provider, &before);
    Prediction {
        from,
        to,
        not_short_circuited: exposures(services),
        risks_after: after.len(),
        disappear,
        appear,
        remain,
        before_migrating,
        ip_mode,
    }
}
