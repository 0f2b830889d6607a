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

use std::net::IpAddr;

use serde::Serialize;

use super::{
    Finding, Inputs, Kind, Severity,
    dataplane::{Dataplane, Mode},
};
use crate::{
    event::AddressOwner,
    fixes::{self, Facts, Provider},
    kube::index::ServiceFacts,
};

/// The modes `--as` predicts.
pub const TARGETS: &[Mode] = &[Mode::Nftables];

/// Checks `--as MODE` against the node's mode: the one-line error of exit 2.
pub fn validate(target: &str, current: Option<Mode>) -> Result<Mode, String> {
    let mode = match target {
        "nftables" => Mode::Nftables,
        other => {
            return Err(format!(
                "--as {other}: only `--as nftables` is predicted (the move off IPVS mode)"
            ));
        }
    };
    match current {
        Some(m) if m == mode => Err(format!(
            "--as {target}: this node already runs kube-proxy in {target} mode"
        )),
        Some(Mode::None) => Err(format!(
            "--as {target}: this node runs no kube-proxy (dataplane none): nothing to predict"
        )),
        _ => Ok(mode),
    }
}

/// One risk that disappears, appears or stays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    pub kind: Kind,
    /// As the finding names it (`ip`, `ip:port/proto`, ...).
    pub subject: String,
    /// `namespace/name` when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub why: String,
    /// For an appearing risk: the fixes to apply before migrating.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<probe_contract::Fix>,
}

/// Whether `ipMode: Proxy` would avoid the loop for one LB ingress IP, and what it costs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IpModeAdvice {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub ip: IpAddr,
    /// `VIP` or `Proxy`, as the Service's status has it (`VIP` when unset or not read).
    pub ip_mode: &'static str,
    /// The provider profile the advice used.
    pub provider: &'static str,
    /// `already` (Proxy now), `avoids_now` (Proxy would stop kube-proxy binding it, as the
    /// move does), `not_needed` (nothing bound to undo), `does_not_help` (made local by a NIC
    /// or a route, not kube-proxy).
    pub verdict: &'static str,
    pub advice: String,
    /// With `Proxy` in nftables mode, a pod's call to it would leave for the LB unSNATed.
    pub would_hairpin: bool,
    /// What `Proxy` costs (the fixes table's `ip-mode-proxy` entry).
    pub costs: Vec<String>,
    /// When `would_hairpin`: the fixes for that hairpin on this provider.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<probe_contract::Fix>,
}

/// The prediction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Prediction {
    pub from: Mode,
    pub to: Mode,
    pub disappear: Vec<Change>,
    pub appear: Vec<Change>,
    pub remain: Vec<Change>,
    /// The fixes of the appearing risks, once each (by id and Service): apply before migrating.
    pub before_migrating: Vec<probe_contract::Fix>,
    pub ip_mode: Vec<IpModeAdvice>,
    /// LB addresses no kube-proxy mode short-circuits (`ipMode: Proxy`, hostname-only
    /// ingress, from the API): pod calls to them go to the LB before and after the move.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_short_circuited: Vec<Exposure>,
    /// Risks `probe check` will report after the move (remain + appear).
    pub risks_after: usize,
}

/// An LB address pod calls reach only through the LB, in either mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Exposure {
    pub service: String,
    /// The ingress IP or hostname.
    pub address: String,
    pub why: String,
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

impl Prediction {
    /// `ready` when nothing appears, else `N new`; with what disappears: the node report's
    /// `nftablesReadiness`.
    pub fn summary(&self) -> String {
        let new = if self.appear.is_empty() {
            "ready".to_string()
        } else {
            format!("{} new", self.appear.len())
        };
        format!("{new}, {} gone", self.disappear.len())
    }
}

/// kube-proxy made `ip` local: bound on the VIP interface (or owner unknown, as on IPVS nodes).
fn kube_proxy_binds(inp: &Inputs, ip: IpAddr) -> bool {
    matches!(
        inp.owners.get(&ip),
        None | Some(AddressOwner::VipInterface { .. })
    )
}

/// The node as kube-proxy's nftables mode would leave it (pure; see the module doc).
pub fn as_nftables(inp: &Inputs) -> Inputs {
    let mut out = inp.clone();
    out.bound.retain(|ip| !kube_proxy_binds(inp, *ip));
    out.owners.retain(|ip, _| out.bound.contains(ip));
    out.services.source = Some(crate::state::ServiceSource::Nftables);
    out.services.access_filter.clear();
    out.self_loop.loop_back = None;
    out.dataplane = Some(Dataplane {
        mode: Mode::Nftables,
        replacement: None,
        evidence: vec!["predicted: kube-proxy in nftables mode".into()],
        still_possible: Vec::new(),
        cannot_confirm: Vec::new(),
    });
    out
}

const LOOP_KINDS: [Kind; 4] = [
    Kind::HealthcheckBlackhole,
    Kind::VipPortUnserved,
    Kind::Hairpin,
    Kind::ServiceSelfLoop,
];

fn risks(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Risk && LOOP_KINDS.contains(&f.kind))
        .collect()
}

/// `ip`, `ip:port/proto` or `[v6]:port/proto` -> (ip, port, proto).
fn parse_subject(subject: &str) -> Option<(IpAddr, Option<(u16, String)>)> {
    if let Ok(ip) = subject.parse() {
        return Some((ip, None));
    }
    let (addr, proto) = subject.rsplit_once('/')?;
    let sa: std::net::SocketAddr = addr.parse().ok()?;
    Some((sa.ip(), Some((sa.port(), proto.to_string()))))
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
    use probe_contract::LoopbackKind as L;
    let kind = match kind {
        Kind::HealthcheckBlackhole => L::HealthcheckBlackhole,
        Kind::VipPortUnserved => L::VipPortUnserved,
        Kind::Hairpin => L::Hairpin,
        Kind::ServiceSelfLoop => L::ServiceSelfLoop,
        _ => return Vec::new(),
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
    if let Some((_, proto)) = port
        && proto == "udp"
    {
        facts.proto = probe_contract::Proto::Udp;
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
        .or(inp.services.source.map(Mode::of_source))
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

/// The AWS Load Balancer Controller annotations that make the NLB not keep a TCP client's
/// address (fixes table: `aws-nlb-target-type-ip`, `aws-preserve-client-ip-off`).
fn aws_client_ip_not_kept(s: &ServiceFacts) -> Option<&'static str> {
    let ann = |k: &str| s.annotations.get(k).map(String::as_str);
    if ann("service.beta.kubernetes.io/aws-load-balancer-nlb-target-type") == Some("ip") {
        return Some(
            "the NLB registers pods (nlb-target-type: ip): TCP calls come back from its address",
        );
    }
    ann("service.beta.kubernetes.io/aws-load-balancer-target-group-attributes")
        .is_some_and(|v| v.contains("preserve_client_ip.enabled=false"))
        .then_some("the NLB's client IP preservation is off: calls come back from its address")
}

fn ip_mode_advice(
    inp: &Inputs,
    services: &[ServiceFacts],
    provider: Option<Provider>,
    risks_now: &[&Finding],
) -> Vec<IpModeAdvice> {
    let entry = fixes::TABLE.iter().find(|e| e.id == "ip-mode-proxy");
    let costs: Vec<String> = entry
        .map(|e| {
            e.side_effects
                .iter()
                .chain(e.preconditions)
                .map(|s| s.to_string())
                .collect()
        })
        .unwrap_or_default();
    let pod_masq = inp
        .services
        .masquerade_rules
        .iter()
        .any(|r| super::rules::covers_pod_egress(r, &inp.pod_prefixes));
    // (ip, Service) pairs: from the API when listed, else the node's LB targets.
    let mut pairs: Vec<(IpAddr, Option<&ServiceFacts>)> = Vec::new();
    for s in services {
        for ip in s.ingress.iter().filter_map(|i| i.ip) {
            if !pairs
                .iter()
                .any(|(i, x)| *i == ip && x.map(|x| x.key()) == Some(s.key()))
            {
                pairs.push((ip, Some(s)));
            }
        }
    }
    if services.is_empty() {
        for t in &inp.lb_targets {
            if !pairs.iter().any(|(i, _)| *i == t.ip) {
                pairs.push((t.ip, None));
            }
        }
    }
    pairs
        .into_iter()
        .map(|(ip, svc)| {
            let proxy = svc.is_some_and(|s| s.ip_mode(ip) == Some("Proxy"))
                || inp.lb_targets.iter().any(|t| t.ip == ip && t.ip_mode_proxy);
            let prov = provider
                .or_else(|| svc.and_then(fixes::service_provider))
                .unwrap_or(Provider::Generic);
            let guard: Vec<String> = svc
                .map(|s| {
                    s.loopback_annotations
                        .iter()
                        .filter(|(_, v)| !v.is_empty() && v.as_str() != "false")
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default();
            let aws = svc.and_then(aws_client_ip_not_kept);
            let not_looping = if pod_masq {
                Some("pod egress is masqueraded to the node".to_string())
            } else if !guard.is_empty() {
                Some(format!(
                    "prevent-loopback annotation set ({})",
                    guard.join(", ")
                ))
            } else {
                aws.map(str::to_string)
            };
            let would_hairpin = not_looping.is_none();
            let bound_now = inp.bound.contains(&ip);
            let now: Vec<&str> = risks_now
                .iter()
                .filter(|f| {
                    matches!(f.kind, Kind::HealthcheckBlackhole | Kind::VipPortUnserved)
                        && parse_subject(&f.subject).is_some_and(|(i, _)| i == ip)
                })
                .map(|f| f.kind.as_str())
                .collect();
            let hairpin_note = match &not_looping {
                None => "with Proxy, a pod's call to it leaves for the LB without SNAT and can \
                         hairpin (fixes listed)"
                    .to_string(),
                Some(why) => format!("Proxy would not loop here: {why}"),
            };
            let (verdict, advice) = if proxy {
                (
                    "already",
                    format!(
                        "ipMode is Proxy already: no kube-proxy mode binds or short-circuits \
                         it; {hairpin_note}"
                    ),
                )
            } else if bound_now && !kube_proxy_binds(inp, ip) {
                (
                    "does_not_help",
                    format!(
                        "{ip} is made local by {}, not kube-proxy: ipMode does not unbind it",
                        inp.owners
                            .get(&ip)
                            .map_or_else(|| "another owner".to_string(), ToString::to_string)
                    ),
                )
            } else if bound_now {
                (
                    "avoids_now",
                    format!(
                        "Proxy would stop kube-proxy binding it now ({}); nftables mode binds \
                         nothing, so after the move VIP (the default) loops no more and keeps \
                         in-cluster calls on the node; {hairpin_note}",
                        if now.is_empty() {
                            "no risk on it now".to_string()
                        } else {
                            format!("its {} go", now.join(", "))
                        }
                    ),
                )
            } else {
                (
                    "not_needed",
                    format!(
                        "not bound on this node: Proxy removes no loop here and would only send \
                         in-cluster calls out through the LB; {hairpin_note}"
                    ),
                )
            };
            let fixes = match (would_hairpin, svc) {
                (true, Some(s)) => {
                    let mut f = Facts::of_risk(probe_contract::LoopbackKind::Hairpin, ip, s, prov);
                    f.ip_mode = Some(fixes::IpMode::Proxy);
                    fixes::fixes(&f)
                }
                _ => Vec::new(),
            };
            IpModeAdvice {
                service: svc.map(ServiceFacts::key),
                ip,
                ip_mode: if proxy { "Proxy" } else { "VIP" },
                provider: prov.as_str(),
                verdict,
                advice,
                would_hairpin,
                costs: costs.clone(),
                fixes,
            }
        })
        .collect()
}

/// The prediction as text: one line per change, the fixes to apply first, the ipMode advice.
pub fn table(p: &Prediction) -> String {
    let mut out = format!(
        "Moving kube-proxy from {} to {} mode (predicted from this node):\n",
        p.from.as_str(),
        p.to.as_str()
    );
    let all = || p.disappear.iter().chain(&p.appear).chain(&p.remain);
    let w_kind = all().map(|c| c.kind.as_str().len()).max().unwrap_or(0);
    let w_subject = all().map(|c| c.subject.len()).max().unwrap_or(0);
    let w_service = all()
        .map(|c| c.service.as_deref().map_or(1, str::len))
        .max()
        .unwrap_or(0);
    let line = |out: &mut String, sign: &str, c: &Change| {
        out.push_str(&format!(
            "  {sign} {:<w_kind$}  {:<w_subject$}  {:<w_service$}  {}\n",
            c.kind.as_str(),
            c.subject,
            c.service.as_deref().unwrap_or("-"),
            c.why
        ));
    };
    for (title, sign, list) in [
        ("disappear", "-", &p.disappear),
        ("appear", "+", &p.appear),
        ("remain", "=", &p.remain),
    ] {
        out.push_str(&format!("{title}: {}\n", list.len()));
        for c in list {
            line(&mut out, sign, c);
        }
    }
    out.push_str(&format!(
        "fixes before migrating: {}\n",
        p.before_migrating.len()
    ));
    for f in &p.before_migrating {
        out.push_str(&format!(
            "  {} ({}{}): {}\n",
            f.id,
            f.provider,
            f.service
                .as_deref()
                .map(|s| format!(", {s}"))
                .unwrap_or_default(),
            f.change
        ));
    }
    if !p.not_short_circuited.is_empty() {
        out.push_str(&format!(
            "short-circuited in neither mode: {}\n",
            p.not_short_circuited.len()
        ));
        for e in &p.not_short_circuited {
            out.push_str(&format!("  {} {}: {}\n", e.address, e.service, e.why));
        }
    }
    out.push_str(&format!("ipMode advice: {}\n", p.ip_mode.len()));
    for a in &p.ip_mode {
        out.push_str(&format!(
            "  {} {} ({}, {}): {}: {}\n",
            a.ip,
            a.service.as_deref().unwrap_or("-"),
            a.ip_mode,
            a.provider,
            a.verdict,
            a.advice
        ));
    }
    out.push_str(&format!(
        "{} risk(s) after the move ({}): {} (evidence, fixes and costs: --json)\n",
        p.risks_after,
        p.summary(),
        if p.risks_after == 0 {
            "no loopback risk predicted"
        } else {
            "loopback risks predicted"
        }
    ));
    out
}
