//! The per-Service `ipMode: Proxy` advice of the prediction: whether `Proxy` would avoid the
//! loop for one LB ingress IP, what it costs (the fixes table's `ip-mode-proxy` entry), and
//! whether it would hairpin in nftables mode.

use std::net::IpAddr;

use probe_contract::{
    check::{Finding, Kind},
    readiness::IpModeAdvice,
};
use probe_core::{
    fixes::{self, Facts, Provider},
    service::ServiceFacts,
};

use super::node::{kube_proxy_binds, parse_subject};
use crate::check::Inputs;

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

pub(super) fn ip_mode_advice(
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
        .any(|r| crate::check::rules::covers_pod_egress(r, &inp.pod_prefixes));
    ingress_pairs(inp, services)
        .into_iter()
        .map(|(ip, svc)| {
            let proxy = svc.is_some_and(|s| s.ip_mode(ip) == Some("Proxy"))
                || inp.lb_targets.iter().any(|t| t.ip == ip && t.ip_mode_proxy);
            let prov = provider
                .or_else(|| svc.and_then(fixes::service_provider))
                .unwrap_or(Provider::Generic);
            let guard: Vec<String> = svc
                .map(|s| probe_core::service::loop_guards(&s.loopback_annotations))
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
            let hairpin_note = match &not_looping {
                None => "with Proxy, a pod's call to it leaves for the LB without SNAT and can \
                         hairpin (fixes listed)"
                    .to_string(),
                Some(why) => format!("Proxy would not loop here: {why}"),
            };
            let (verdict, advice) = proxy_verdict(inp, ip, proxy, risks_now, &hairpin_note);
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
                // As written (an unknown value such as `Router` is not VIP); unset: VIP.
                ip_mode: svc
                    .and_then(|s| s.ip_mode(ip))
                    .map(str::to_string)
                    .unwrap_or_else(|| if proxy { "Proxy" } else { "VIP" }.to_string()),
                provider: prov.as_str().to_string(),
                verdict: verdict.to_string(),
                advice,
                would_hairpin,
                costs: costs.clone(),
                fixes,
            }
        })
        .collect()
}

/// The (ip, Service) pairs to advise on: from the API when listed, else the node's LB targets.
fn ingress_pairs<'a>(
    inp: &Inputs,
    services: &'a [ServiceFacts],
) -> Vec<(IpAddr, Option<&'a ServiceFacts>)> {
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
}

/// Whether ipMode Proxy would help for `ip`, and the advice in words.
fn proxy_verdict(
    inp: &Inputs,
    ip: IpAddr,
    proxy: bool,
    risks_now: &[&Finding],
    hairpin_note: &str,
) -> (&'static str, String) {
    let bound_now = inp.bound.contains(&ip);
    if proxy {
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
        let now: Vec<&str> = risks_now
            .iter()
            .filter(|f| {
                matches!(f.kind, Kind::HealthcheckBlackhole | Kind::VipPortUnserved)
                    && parse_subject(&f.subject).is_some_and(|(i, _)| i == ip)
            })
            .map(|f| f.kind.as_str())
            .collect();
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
    }
}
