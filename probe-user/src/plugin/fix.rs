//! `kubectl clb-probe fix [-n NS] SERVICE`: the fixes for one Service (pure part).
//!
//! The kinds come from the agents' Events regarding the Service (what was confirmed), the
//! facts from the plugin's own reading of the Service (policy, ipMode, annotations, class,
//! resourceVersion), the provider from `--provider`, else the Nodes' providerIDs, else the
//! Service's own settings. `--apply ID` is refused (exit 2) when the fix is not offered for
//! these facts (another provider's, or already in place), has no patch, or was computed from
//! another resourceVersion of the Service. The dry run's diff and the undo are [`super::undo`]'s.

use std::{collections::BTreeSet, fmt::Write as _};

use k8s_openapi::api::{core::v1::Service, events::v1::Event};
use probe_contract::{
    Fix, LoopbackKind,
    kube_event::{REPORTING_CONTROLLER, kind_of_reason},
};
use serde::Serialize;

use crate::{
    fixes::{self, Facts, Origin, Profile, Provider, TABLE},
    kube::index::ServiceFacts,
};

/// A refusal: exit 2, nothing changed.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// What `fix` lists (and `-o json` prints).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// `namespace/name`.
    pub service: String,
    /// The version the fixes were computed from (`--apply --resource-version` checks it).
    pub resource_version: Option<String>,
    pub provider: String,
    /// `flag`, `node providerID`, `service settings`, `default`.
    pub provider_from: String,
    /// The kinds the agents confirmed for this Service (from their Events).
    pub kinds: Vec<String>,
    pub fixes: Vec<Fix>,
}

/// The kinds clb-probe's Events regarding `namespace/name` report, and whether one of them
/// names a client Pod (a pod source).
pub fn confirmed_kinds(events: &[Event], namespace: &str, name: &str) -> Vec<(LoopbackKind, bool)> {
    let mut out: Vec<(LoopbackKind, bool)> = Vec::new();
    for ev in events {
        if ev.reporting_controller.as_deref() != Some(REPORTING_CONTROLLER) {
            continue;
        }
        let Some(r) = &ev.regarding else { continue };
        if r.kind.as_deref() != Some("Service")
            || r.namespace.as_deref() != Some(namespace)
            || r.name.as_deref() != Some(name)
        {
            continue;
        }
        let Some(kind) = ev.reason.as_deref().and_then(kind_of_reason) else {
            continue;
        };
        let pod = ev
            .related
            .as_ref()
            .is_some_and(|r| r.kind.as_deref() == Some("Pod"));
        match out.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, p)) => *p |= pod,
            None => out.push((kind, pod)),
        }
    }
    out
}

/// The Service `fix` names: `NAME` in `namespace` (`-n`, default `default`), or
/// `NAMESPACE/NAME` as `report` prints it. `-n` naming another namespace than the argument's
/// is refused. `explicit_namespace`: `-n` as given, None when not.
pub fn service_ref(
    arg: &str,
    explicit_namespace: Option<&str>,
) -> Result<(String, String), Refused> {
    match arg.split_once('/') {
        None => Ok((
            explicit_namespace.unwrap_or("default").to_string(),
            arg.to_string(),
        )),
        Some((ns, name)) if ns.is_empty() || name.is_empty() || name.contains('/') => {
            Err(Refused(format!("{arg:?} is not NAME or NAMESPACE/NAME")))
        }
        Some((ns, _)) if explicit_namespace.is_some_and(|n| n != ns) => Err(Refused(format!(
            "{arg} names namespace {ns}, and -n names {}",
            explicit_namespace.unwrap_or_default()
        ))),
        Some((ns, name)) => Ok((ns.to_string(), name.to_string())),
    }
}

/// The fixes for `service` given the confirmed kinds: per kind from the table, merged by id
/// (first rank wins).
pub fn plan<'a>(
    service: &Service,
    provider_ids: impl IntoIterator<Item = &'a str>,
    flag: Option<Provider>,
    kinds: &[(LoopbackKind, bool)],
) -> Result<Plan, Refused> {
    let facts = ServiceFacts::from_service(service)
        .ok_or_else(|| Refused("the Service has no namespace or name".into()))?;
    let profile = Profile::resolve(flag, provider_ids, fixes::service_provider(&facts));
    let vip = facts.ingress.iter().find_map(|i| i.ip);
    let mut out: Vec<Fix> = Vec::new();
    for (kind, pod) in kinds {
        let mut f = match vip {
            Some(vip) => Facts::of_risk(*kind, vip, &facts, profile.provider),
            None => Facts::of_risk(
                *kind,
                std::net::IpAddr::from([0, 0, 0, 0]),
                &facts,
                profile.provider,
            ),
        };
        if vip.is_none() {
            // No LB IP published: its ipMode is unknown.
            f.ip_mode = None;
        }
        if *kind == LoopbackKind::VipPortUnserved && *pod {
            f.source = Some(fixes::Source::Pod);
        }
        for fix in fixes::fixes(&f) {
            if !out.iter().any(|x| x.id == fix.id) {
                out.push(fix);
            }
        }
    }
    Ok(Plan {
        service: facts.key(),
        resource_version: facts.resource_version.clone(),
        provider: profile.provider.as_str().into(),
        provider_from: match profile.origin {
            Origin::Flag => "--provider",
            Origin::NodeProviderId => "node providerID",
            Origin::Service => "service settings",
            Origin::Default => "default",
        }
        .into(),
        kinds: kinds.iter().map(|(k, _)| k.as_str().to_string()).collect(),
        fixes: out,
    })
}

/// The fix `--apply ID` names, if it may be applied as computed.
pub fn select<'p>(
    plan: &'p Plan,
    id: &str,
    resource_version: Option<&str>,
) -> Result<&'p Fix, Refused> {
    if let Some(wanted) = resource_version
        && plan.resource_version.as_deref() != Some(wanted)
    {
        return Err(Refused(format!(
            "Service {} changed since the fix was computed (resourceVersion {wanted}, now {}): list the fixes again",
            plan.service,
            plan.resource_version.as_deref().unwrap_or("unknown")
        )));
    }
    if let Some(fix) = plan.fixes.iter().find(|f| f.id == id) {
        if fix.patch.is_none() {
            return Err(Refused(format!(
                "fix {id} has no patch to apply: {}",
                fix.change
            )));
        }
        return Ok(fix);
    }
    match TABLE.iter().find(|e| e.id == id) {
        Some(e) if e.provider != Provider::Generic && e.provider.as_str() != plan.provider => {
            Err(Refused(format!(
                "fix {id} is for provider {}, and this Service's provider is {} (from {}); \
                 pass --provider if that is wrong",
                e.provider, plan.provider, plan.provider_from
            )))
        }
        Some(_) => Err(Refused(format!(
            "fix {id} is not offered for Service {}: already in place, or not for the \
             loopbacks confirmed there ({})",
            plan.service,
            if plan.kinds.is_empty() {
                "none".to_string()
            } else {
                plan.kinds.join(", ")
            }
        ))),
        None => Err(Refused(format!(
            "no fix {id:?} (known: {})",
            TABLE
                .iter()
                .map(|e| e.id)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The patch sent: the fix's, plus the resourceVersion it was computed from (the API server
/// then refuses it with 409 if the Service changed in between).
pub fn guarded_patch(fix: &Fix, resource_version: Option<&str>) -> serde_json::Value {
    let mut patch = fix.patch.clone().unwrap_or_default();
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = serde_json::json!(rv);
    }
    patch
}

/// `kubectl patch service -n NS NAME --type merge -p '<patch>'`: an undo by hand.
pub fn patch_command(patch: &serde_json::Value, namespace: &str, name: &str) -> String {
    super::shell_words(&[
        "kubectl".into(),
        "patch".into(),
        "service".into(),
        "-n".into(),
        namespace.into(),
        name.into(),
        "--type".into(),
        "merge".into(),
        "-p".into(),
        patch.to_string(),
    ])
}

/// The listing for people.
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Service {} (resourceVersion {}), provider {} (from {})",
        plan.service,
        plan.resource_version.as_deref().unwrap_or("?"),
        plan.provider,
        plan.provider_from
    );
    if plan.kinds.is_empty() {
        let _ = writeln!(
            out,
            "no confirmed loopback regards this Service: no fixes to offer"
        );
        return out;
    }
    let _ = writeln!(out, "confirmed: {}", plan.kinds.join(", "));
    let (ns, name) = plan.service.split_once('/').unwrap_or(("", &plan.service));
    for (i, f) in plan.fixes.iter().enumerate() {
        let _ = writeln!(out, "\n{}. {} [{}] {}", i + 1, f.id, f.provider, f.change);
        if let Some(p) = &f.patch {
            let _ = writeln!(out, "   patch: {p}");
            let _ = writeln!(
                out,
                "   apply: kubectl clb-probe fix -n {ns} {name} --apply {}",
                f.id
            );
        }
        if let Some(u) = &f.undo {
            let _ = writeln!(out, "   undo:  {u}");
        }
        for p in &f.preconditions {
            let _ = writeln!(out, "   needs: {p}");
        }
        for s in &f.side_effects {
            let _ = writeln!(out, "   costs: {s}");
        }
        let _ = writeln!(out, "   source: {}", f.source);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(etp: &str, annotations: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "web", "resourceVersion": "7",
                         "annotations": annotations},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": etp,
                     "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}},
        }))
        .unwrap()
    }

    #[test]
    fn apply_refuses_a_moved_service_another_provider_s_fix_and_advice() {
        let kinds = [(LoopbackKind::Hairpin, true)];
        let plan = plan(&service("Local", json!({})), ["gce://p/z/vm"], None, &kinds).unwrap();
        assert_eq!(
            (plan.provider.as_str(), plan.provider_from.as_str()),
            ("gce", "node providerID")
        );
        // The plugin does not see the nodes' kube-proxy: etp-cluster says it assumes it.
        let etp = plan.fixes.iter().find(|f| f.id == "etp-cluster").unwrap();
        assert!(
            etp.preconditions.iter().any(|p| p.contains("kube-proxy")),
            "{etp:?}"
        );
        assert!(select(&plan, "etp-cluster", Some("7")).is_ok());
        let moved = select(&plan, "etp-cluster", Some("6")).unwrap_err().0;
        assert!(
            moved.contains("changed since the fix was computed"),
            "{moved}"
        );
        let other = select(&plan, "aws-nlb-target-type-ip", None).unwrap_err().0;
        assert!(
            other.contains("is for provider aws") && other.contains("provider is gce"),
            "{other}"
        );
        let advice = select(&plan, "call-by-service-name", None).unwrap_err().0;
        assert!(advice.contains("has no patch"), "{advice}");
        assert!(
            select(&plan, "nope", None)
                .unwrap_err()
                .0
                .contains("no fix \"nope\"")
        );
        let fix = select(&plan, "etp-cluster", None).unwrap();
        assert_eq!(
            guarded_patch(fix, Some("7")),
            json!({"metadata": {"resourceVersion": "7"}, "spec": {"externalTrafficPolicy": "Cluster"}})
        );
        assert_eq!(
            patch_command(fix.undo.as_ref().unwrap(), "shop", "web"),
            r#"kubectl patch service -n shop web --type merge -p '{"spec":{"externalTrafficPolicy":"Local"}}'"#
        );
        // Cluster already: "set Cluster" is not offered, so not applied.
        let cluster = plan_of("Cluster");
        assert!(
            select(&cluster, "etp-cluster", None)
                .unwrap_err()
                .0
                .contains("already in place")
        );
    }

    #[test]
    fn a_service_is_named_as_report_prints_it_or_by_name_and_namespace() {
        let ok = |a: &str, n: Option<&str>| service_ref(a, n).map_err(|e| e.0);
        let pair = |ns: &str, name: &str| Ok((ns.to_string(), name.to_string()));
        assert_eq!(ok("web", None), pair("default", "web"));
        assert_eq!(ok("web", Some("shop")), pair("shop", "web"));
        assert_eq!(ok("shop/web", None), pair("shop", "web"));
        assert_eq!(ok("shop/web", Some("shop")), pair("shop", "web"));
        assert!(ok("shop/web", Some("other")).is_err());
        assert!(ok("/web", None).is_err());
        assert!(ok("a/b/c", None).is_err());
    }

    fn plan_of(etp: &str) -> Plan {
        plan(
            &service(etp, json!({})),
            [],
            None,
            &[(LoopbackKind::Hairpin, true)],
        )
        .unwrap()
    }
}
