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
use serde::{Deserialize, Serialize};

use crate::{
    fixes::{self, Facts, Origin, Profile, Provider, TABLE},
    service::ServiceFacts,
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

/// What `fix` lists (and `-o json` prints; scripts and the tests read it back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Where the fixes come from: `agents` (the ids the agents computed on their nodes, in
    /// their LoopbackReports) or `service` (recomputed here from the Service alone).
    pub fixes_from: String,
    pub fixes: Vec<Fix>,
}

/// The fixes the agents computed for one loop or risk of the Service: its kind and the fix
/// ids, best fit first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentFixes {
    pub kind: LoopbackKind,
    pub ids: Vec<String>,
}

/// The agents' fix lists for `namespace/name` from the LoopbackReports: active loops first
/// (confirmed), then risks (a shared LB IP's risk regards each of its Services); entries
/// without ids (older agents) are skipped.
pub fn agent_fixes(
    reports: &[(String, probe_contract::report::ReportStatus)],
    service: &str,
) -> Vec<AgentFixes> {
    // An event's service label may carry the port name (`ns/name:http`).
    let is_it = |s: &str| s.split(':').next() == Some(service);
    let mut out = Vec::new();
    let mut push = |kind: &str, ids: &[String]| {
        let Ok(kind) = serde_json::from_value::<LoopbackKind>(kind.into()) else {
            return;
        };
        let entry = AgentFixes {
            kind,
            ids: ids.to_vec(),
        };
        if !ids.is_empty() && !out.contains(&entry) {
            out.push(entry);
        }
    };
    for (_, status) in reports {
        for l in &status.active_loops {
            if l.service.as_deref().is_some_and(is_it) {
                push(&l.kind, &l.fixes);
            }
        }
    }
    for (_, status) in reports {
        for r in &status.risks {
            if r.service.as_deref().is_some_and(is_it) || r.services.iter().any(|s| is_it(s)) {
                push(&r.kind, &r.fixes);
            }
        }
    }
    out
}

/// The kinds clb-probe's agents' Events regarding `namespace/name` report, and whether one of
/// them names a client Pod (a pod source).
///
/// Only the agents' Events count (issue 36, E6: an Event carries no author, and whoever may
/// create Events in a namespace can write one that says `reportingController: clb-probe`).
/// An agent writes a Service's Events in the Service's own namespace, in its shape
/// ([`super::forged_because`]), with its node's name as `reportingInstance`. So an Event counts
/// only when it is in the Service's namespace (a tenant's Events about another team's Service
/// live in the tenant's namespace), is in the agents' shape, and, when the Nodes could be
/// listed (`nodes`: `Some`), names a Node of the cluster. What is left is an Event written by
/// someone who may create Events in the Service's own namespace, i.e. its owners: they can
/// mislead only themselves. SECURITY.md says what closes even that (an admission policy).
/// How many clb-probe-shaped Events about the Service `confirmed_kinds` leaves out because
/// their `reportingInstance` is no Node the API lists (issue #49: dropped without a word).
pub fn events_from_unknown_nodes(
    events: &[Event],
    namespace: &str,
    name: &str,
    nodes: Option<&[String]>,
) -> usize {
    let Some(nodes) = nodes else { return 0 };
    events
        .iter()
        .filter(|ev| {
            ev.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)
                && ev.metadata.namespace.as_deref() == Some(namespace)
                && super::forged_because(ev).is_none()
                && ev.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Service") && r.name.as_deref() == Some(name)
                })
        })
        .filter(|ev| {
            let instance = ev.reporting_instance.as_deref().unwrap_or_default();
            !nodes
                .iter()
                .any(|n| probe_contract::kube_event::reporting_instance(n) == instance)
        })
        .count()
}

pub fn confirmed_kinds(
    events: &[Event],
    namespace: &str,
    name: &str,
    nodes: Option<&[String]>,
) -> Vec<(LoopbackKind, bool)> {
    let mut out: Vec<(LoopbackKind, bool)> = Vec::new();
    for ev in events {
        if ev.reporting_controller.as_deref() != Some(REPORTING_CONTROLLER)
            || ev.metadata.namespace.as_deref() != Some(namespace)
            || super::forged_because(ev).is_some()
        {
            continue;
        }
        if let Some(nodes) = nodes {
            let instance = ev.reporting_instance.as_deref().unwrap_or_default();
            if !nodes
                .iter()
                .any(|n| probe_contract::kube_event::reporting_instance(n) == instance)
            {
                continue;
            }
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

/// The fixes for `service`: the agents' (`agent`, from their reports), each re-checked
/// against the Service as read now (a fix already in place, or no longer fitting, is
/// dropped); without any, per confirmed kind from the table. Merged by id (first rank wins).
pub fn plan<'a>(
    service: &Service,
    provider_ids: impl IntoIterator<Item = &'a str>,
    flag: Option<Provider>,
    kinds: &[(LoopbackKind, bool)],
    agent: &[AgentFixes],
) -> Result<Plan, Refused> {
    let facts = ServiceFacts::from_service(service)
        .ok_or_else(|| Refused("the Service has no namespace or name".into()))?;
    let profile = Profile::resolve(flag, provider_ids, fixes::service_provider(&facts));
    let vip = facts.ingress.iter().find_map(|i| i.ip);
    let mut out: Vec<Fix> = Vec::new();
    for a in agent {
        let mut f = risk_facts(a.kind, vip, &facts, profile.provider);
        // The agent offered these with the node's facts (kube-proxy's rules read there).
        f.kube_proxy = Some(true);
        for id in &a.ids {
            if let Some(fix) = fixes::fix_by_id(id, &f)
                && !in_place(&fix, service)
                && !out.iter().any(|x| x.id == fix.id)
            {
                out.push(fix);
            }
        }
    }
    // The agent reads no Nodes: one started without `--provider` computed the generic fixes
    // only. The plugin knows the provider from the Nodes' providerID (or its own flag): when
    // the agents' list has none of that provider's fixes, those come first, for the kinds the
    // agents saw, each decided from the Service's facts as the table decides them.
    if !agent.is_empty()
        && profile.provider != Provider::Generic
        && !out.iter().any(|f| f.provider == profile.provider.as_str())
    {
        let mut own: Vec<Fix> = Vec::new();
        for a in agent {
            let mut f = risk_facts(a.kind, vip, &facts, profile.provider);
            f.kube_proxy = Some(true);
            for fix in fixes::fixes(&f) {
                if fix.provider == profile.provider.as_str()
                    && !in_place(&fix, service)
                    && !own.iter().any(|x| x.id == fix.id)
                {
                    own.push(fix);
                }
            }
        }
        own.extend(out);
        out = own;
    }
    let fixes_from = if agent.is_empty() {
        "service"
    } else {
        "agents"
    };
    for (kind, pod) in kinds.iter().filter(|_| agent.is_empty()) {
        let mut f = risk_facts(*kind, vip, &facts, profile.provider);
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
        fixes_from: fixes_from.into(),
        fixes: out,
    })
}

/// The table's facts for `kind` on the Service's LB IP (none published: ipMode unknown).
fn risk_facts(
    kind: LoopbackKind,
    vip: Option<std::net::IpAddr>,
    facts: &ServiceFacts,
    provider: Provider,
) -> Facts {
    let mut f = Facts::of_risk(
        kind,
        vip.unwrap_or(std::net::IpAddr::from([0, 0, 0, 0])),
        facts,
        provider,
    );
    if vip.is_none() {
        f.ip_mode = None;
    }
    f
}

/// A patch fix whose patch would change nothing on `service` is already in place.
fn in_place(fix: &Fix, service: &Service) -> bool {
    let Some(patch) = &fix.patch else {
        return false;
    };
    let Ok(current) = serde_json::to_value(service) else {
        return false;
    };
    let mut patched = current.clone();
    merge_patch(&mut patched, patch);
    patched == current
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
    if plan.kinds.is_empty() && plan.fixes.is_empty() {
        let _ = writeln!(
            out,
            "no confirmed loopback regards this Service: no fixes to offer"
        );
        return out;
    }
    if !plan.kinds.is_empty() {
        let _ = writeln!(out, "confirmed: {}", plan.kinds.join(", "));
    }
    if plan.fixes_from == "agents" {
        let _ = writeln!(
            out,
            "fixes: as the agents computed them on their nodes (LoopbackReports), those in place dropped"
        );
    }
    let (ns, name) = plan.service.split_once('/').unwrap_or(("", &plan.service));
    for (i, f) in plan.fixes.iter().enumerate() {
        let _ = writeln!(out, "\n{}. {} [{}] {}", i + 1, f.id, f.provider, f.change);
        if let Some(p) = &f.patch {
            let _ = writeln!(out, "   patch: {p}");
            // The version listed: a copied line applies only to the Service as it was shown.
            let guard = plan
                .resource_version
                .as_deref()
                .map(|rv| format!(" --resource-version {rv}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "   apply: kubectl clb-probe fix -n {ns} {name} --apply {}{guard}",
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
#[path = "fix_tests.rs"]
mod tests;

/// RFC 7386: `patch` merged into `target` (null removes).
fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in fields {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
    }
}
