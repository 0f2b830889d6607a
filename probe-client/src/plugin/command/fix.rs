//! `fix SERVICE`: the fixes listed; `--apply ID` (a server-side dry run shown as a diff, then
//! the patch with its undo kept on the Service), then `--verify`; `--undo` (the pure parts:
//! [`crate::plugin::fix`], [`crate::plugin::undo`]).

use std::process::ExitCode;

use k8s_openapi::api::core::v1::Service;
use probe_contract::report::ReportStatus;

use super::{Output, esc, verify::Question};
use crate::plugin::{self, api, confirm, fix, query, undo};

/// `fix`'s arguments (the binary's `fix` subcommand parses them as they are).
#[derive(clap::Args, Debug)]
pub struct FixRequest {
    /// NAME, or NAMESPACE/NAME as `report` prints it.
    pub service: String,
    /// The Service's namespace (default: `default`, or the one SERVICE names).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Output format of the listing.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Apply the fix with this id.
    #[arg(long, value_name = "ID")]
    pub apply: Option<String>,
    /// Refuse unless the Service is still at this resourceVersion (the one a listing
    /// showed).
    #[arg(long, value_name = "RV", requires = "apply")]
    pub resource_version: Option<String>,
    /// With --apply or --undo: only the server's dry run (dryRun=All), shown as a diff
    /// of the Service; nothing is changed.
    #[arg(long)]
    pub dry_run: bool,
    /// Apply without asking. Without it, --apply and --undo show the dry run's diff and
    /// ask on the terminal; with no terminal on stdin they refuse (exit 2).
    #[arg(short, long)]
    pub yes: bool,
    /// Restore every field the fixes applied with --apply moved (the undo kept on the
    /// Service); refused if one of them changed since.
    #[arg(long, conflicts_with_all = ["apply", "resource_version"])]
    pub undo: bool,
    /// The cloud (aws, azure, gce, alicloud, tencentcloud, hcloud, digitalocean,
    /// openstack, generic). Default: the Nodes' providerIDs, else the Service's settings.
    #[arg(long, env = "CLB_PROBE_PROVIDER")]
    pub provider: Option<crate::fixes::Provider>,
    /// With --apply: then verify on every node that had the loop (its Events, the
    /// reports' active loops) and say "resolved" only when every loop, tested from its own
    /// client, is clean (exit 3 when a node still loops, 4 when not proven).
    #[arg(long, requires = "apply")]
    pub verify: bool,
    /// --verify's wait for the agents' answers, in seconds.
    #[arg(
        long = "timeout",
        value_name = "SECS",
        default_value_t = plugin::verify::DEFAULT_TIMEOUT_S,
        value_parser = clap::value_parser!(u64).range(1..=plugin::verify::MAX_TIMEOUT_S)
    )]
    pub timeout_s: u64,
}

/// Lists the fixes, or applies one (and verifies), or undoes the applied ones.
#[expect(clippy::print_stdout, reason = "the plugin's output")]
pub async fn run(client: kube::Client, r: FixRequest) -> anyhow::Result<ExitCode> {
    if r.dry_run && r.apply.is_none() && !r.undo {
        anyhow::bail!("--dry-run goes with --apply ID or --undo");
    }
    let (namespace, service) = fix::service_ref(&r.service, r.namespace.as_deref())?;
    let svc = api::get_service(client.clone(), &namespace, &service).await?;
    if r.undo {
        return undo_fixes(client, &svc, r.dry_run, r.yes).await;
    }
    let query::FixListing {
        plan,
        events,
        reports,
        warnings,
    } = query::fix_listing(client.clone(), &namespace, &service, &svc, r.provider).await?;
    for w in &warnings {
        eprintln!("kubectl clb-probe: warning: {}", esc(w));
    }
    let Some(id) = r.apply else {
        match r.output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
            Output::Table => print!("{}", esc(&fix::render(&plan))),
        }
        return Ok(ExitCode::SUCCESS);
    };
    let chosen = fix::select(&plan, &id, r.resource_version.as_deref())?;
    let applied = apply_fix(
        client.clone(),
        &svc,
        chosen,
        plan.resource_version.as_deref(),
        r.dry_run,
        r.yes,
    )
    .await?;
    if !r.verify || r.dry_run {
        return Ok(applied);
    }
    let looped = looped_nodes(&namespace, &service, &events, &reports);
    if looped.is_empty() {
        anyhow::bail!(
            "applied, but no node has a confirmed loop for {namespace}/{service} to verify (no Event, no active loop in the reports): run `kubectl clb-probe verify -n {namespace} {service} --node NODE`"
        );
    }
    let spec = plugin::verify::spec(&namespace, &service, &looped);
    super::verify::flow(client, &spec, r.timeout_s, Question::Resolved).await
}

/// The nodes that had the loop: their Events about the Service, and the reports' active loops
/// naming it.
fn looped_nodes(
    namespace: &str,
    service: &str,
    events: &[k8s_openapi::api::events::v1::Event],
    reports: &[(String, ReportStatus)],
) -> Vec<String> {
    let key = format!("{namespace}/{service}");
    let active: Vec<_> = reports
        .iter()
        .filter(|(_, r)| {
            r.active_loops.iter().any(|l| {
                l.service
                    .as_deref()
                    .is_some_and(|s| probe_contract::names_service(s, &key))
            })
        })
        .cloned()
        .collect();
    plugin::verify::nodes_for(
        &key,
        &active,
        &plugin::verify::event_nodes(events, namespace, service),
    )
}

/// `--apply ID`: the server's dry run as a diff, then (unless `dry_run`) the patch carrying
/// the undo computed from that answer (kept in the annotation, one write).
#[expect(clippy::print_stdout, reason = "the plugin's output")]
async fn apply_fix(
    client: kube::Client,
    svc: &Service,
    chosen: &probe_contract::Fix,
    resource_version: Option<&str>,
    dry_run: bool,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    let (namespace, service) = names(svc);
    let before = serde_json::to_value(svc)?;
    let id = &chosen.id;
    let patch = fix::guarded_patch(chosen, resource_version);
    let answer = api::patch_service(client.clone(), &namespace, &service, &patch, true).await?;
    let answer = serde_json::to_value(&answer)?;
    let diff = undo::changes(&before, &answer);
    println!("dry run of {id} on service {namespace}/{service} (the API server's answer):");
    if diff.is_empty() {
        return Err(fix::Refused(format!(
            "the API server's dry run of {id} changes nothing on service {namespace}/{service}: not applied"
        ))
        .into());
    }
    print!("{}", esc(&undo::render_changes(&diff)));
    let record = undo::undo_of(id, &before, &answer).on_top_of(undo::kept(&before)?);
    if dry_run {
        println!(
            "nothing applied (--dry-run); the undo would restore: {}",
            esc(&record.restore.to_string())
        );
        return Ok(ExitCode::SUCCESS);
    }
    confirm::ask(
        yes,
        &format!("apply {id} to service {namespace}/{service} as shown above?"),
    )?;
    let sent = undo::apply_patch(&patch, &record);
    let done = api::patch_service(client, &namespace, &service, &sent, false).await?;
    println!(
        "applied {id}: service {namespace}/{service} now at resourceVersion {}",
        done.metadata.resource_version.as_deref().unwrap_or("?")
    );
    // The undo was computed from the dry run; say so if the write moved other fields.
    let applied = undo::changes(&before, &serde_json::to_value(&done)?);
    if applied != diff {
        eprintln!(
            "kubectl clb-probe: warning: the applied change differs from the dry run:\n{}\
             the kept undo restores only the dry run's fields",
            esc(&undo::render_changes(&applied))
        );
    }
    println!(
        "undo: kubectl clb-probe fix -n {namespace} {service} --undo   (kept in annotation {})",
        undo::UNDO_ANNOTATION
    );
    println!(
        "  or: {}",
        esc(&fix::patch_command(
            &undo::restore_patch(&record),
            &namespace,
            &service
        ))
    );
    Ok(ExitCode::SUCCESS)
}

/// `--undo`: the kept undo, checked against the Service as read now and guarded by its
/// resourceVersion; dry-run first and shown as a diff.
#[expect(clippy::print_stdout, reason = "the plugin's output")]
async fn undo_fixes(
    client: kube::Client,
    svc: &Service,
    dry_run: bool,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    let (namespace, service) = names(svc);
    let current = serde_json::to_value(svc)?;
    let (record, patch) = undo::undo_request(&current)?;
    // The record is an annotation anyone with `patch services` may have written.
    let fixes = esc(&record.fixes.join(", ")).into_owned();
    let answer = api::patch_service(client.clone(), &namespace, &service, &patch, true).await?;
    println!(
        "dry run of the undo of {fixes} on service {namespace}/{service} (the API server's answer):"
    );
    print!(
        "{}",
        esc(&undo::render_changes(&undo::changes(
            &current,
            &serde_json::to_value(&answer)?
        )))
    );
    if dry_run {
        println!("nothing applied (--dry-run)");
        return Ok(ExitCode::SUCCESS);
    }
    confirm::ask(
        yes,
        &format!("undo {fixes} on service {namespace}/{service} as shown above?"),
    )?;
    let done = api::patch_service(client, &namespace, &service, &patch, false).await?;
    println!(
        "undone {fixes}: service {namespace}/{service} now at resourceVersion {}",
        done.metadata.resource_version.as_deref().unwrap_or("?")
    );
    Ok(ExitCode::SUCCESS)
}

/// The Service's namespace and name as read.
fn names(svc: &Service) -> (String, String) {
    (
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    )
}
