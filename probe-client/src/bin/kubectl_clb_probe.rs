//! `kubectl-clb_probe` (`kubectl clb-probe` once on PATH, krew's naming): confirmed loopbacks
//! cluster-wide from the Kubernetes Events, and one node's live view. Exit codes: 0 ok,
//! 1 runtime failure, 2 usage error. `report` gates a pipeline instead: 0 clean, 1 a risk or
//! an active loop, 2 any error. `verify`: 0 nothing confirmed and nothing unproven, 3 a loop
//! confirmed (still looping), 4 not proven (a test got no answer), 1 an error (a node that
//! did not answer included). `fix --apply --verify`: 0 resolved (every loop tested from its own
//! client, clean), 3 still looping, 4 not proven resolved (each reason printed), 1 an error.
#![allow(
    clippy::print_stdout,
    reason = "the plugin's output is its job: tables, JSON and fixes on stdout"
)]

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use clb_probe_client::plugin::{self, KubeArgs, api};

#[derive(Parser, Debug)]
#[command(
    name = "kubectl clb-probe",
    bin_name = "kubectl clb-probe",
    version,
    about = "clb-probe's confirmed load-balancer loopbacks, cluster-wide"
)]
struct Cli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<String>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the confirmed loopbacks from the Events of every namespace, newest first.
    Events {
        /// Only this namespace's Events (`list events` there is then all it needs).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// The cluster table from the agents' LoopbackReports (no exec into pods): per node the
    /// kube-proxy mode, kernel, risks and active loops by kind; the most affected Services;
    /// nodes without a report or with a stale one. Exit 0 clean, 1 a risk or an active loop,
    /// 2 error.
    Report {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = ReportOutput::Table)]
        output: ReportOutput,
        /// Only this Service (`namespace/name`).
        #[arg(long, value_name = "NAMESPACE/NAME")]
        service: Option<String>,
        /// Only this node.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
    },
    /// Open the live view (`probe watch`) of the agent on NODE, through `kubectl exec`.
    Watch {
        node: String,
        /// The agent's namespace: only the DaemonSet's pods there are chosen.
        #[arg(short, long, default_value = plugin::AGENT_NAMESPACE)]
        namespace: String,
        /// Print the `kubectl exec` command instead of running it.
        #[arg(long)]
        print_command: bool,
    },
    /// Fetch each node's evidence of the loops it confirmed for SERVICE (the first packets as
    /// pcapng, the event, the conntrack entries and rules it cites, `probe check`'s risks)
    /// from the agents, through the API server's pod proxy (RBAC: pods/proxy get in the
    /// agent's namespace), into DIR: one folder per node and a README.txt. Exit 1 when a
    /// node's agent could not be read (the others are still written).
    Evidence {
        /// NAME, or NAMESPACE/NAME as `report` prints it.
        service: String,
        /// The Service's namespace (default: `default`, or the one SERVICE names).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Where to write (a new or empty directory).
        #[arg(short, long, value_name = "DIR")]
        output: std::path::PathBuf,
        /// The agent's namespace: only the DaemonSet's pods there are asked.
        #[arg(long, default_value = plugin::AGENT_NAMESPACE)]
        agent_namespace: String,
        /// The agent's HTTP port when its pod names no `metrics` port.
        #[arg(long, default_value_t = plugin::evidence::DEFAULT_PORT)]
        port: u16,
    },
    /// List the fixes for SERVICE (from the agents' Events and the Service and Nodes as read);
    /// `--apply ID` applies one: a server-side dry run shown as a diff of the Service, then
    /// the patch, with its undo kept on the Service (annotation clb-probe.io/undo);
    /// `--undo` restores what the applied fixes moved.
    Fix {
        /// NAME, or NAMESPACE/NAME as `report` prints it.
        service: String,
        /// The Service's namespace (default: `default`, or the one SERVICE names).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Output format of the listing.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Apply the fix with this id.
        #[arg(long, value_name = "ID")]
        apply: Option<String>,
        /// Refuse unless the Service is still at this resourceVersion (the one a listing
        /// showed).
        #[arg(long, value_name = "RV", requires = "apply")]
        resource_version: Option<String>,
        /// With --apply or --undo: only the server's dry run (dryRun=All), shown as a diff
        /// of the Service; nothing is changed.
        #[arg(long)]
        dry_run: bool,
        /// Apply without asking. Without it, --apply and --undo show the dry run's diff and
        /// ask on the terminal; with no terminal on stdin they refuse (exit 2).
        #[arg(short, long)]
        yes: bool,
        /// Restore every field the fixes applied with --apply moved (the undo kept on the
        /// Service); refused if one of them changed since.
        #[arg(long, conflicts_with_all = ["apply", "resource_version"])]
        undo: bool,
        /// The cloud (aws, azure, gce, alicloud, tencentcloud, hcloud, digitalocean,
        /// openstack, generic). Default: the Nodes' providerIDs, else the Service's settings.
        #[arg(long, env = "CLB_PROBE_PROVIDER")]
        provider: Option<clb_probe_client::fixes::Provider>,
        /// With --apply: then verify on every node that had the loop (its Events, the
        /// reports' active loops) and say "resolved" only when every loop, tested from its own
        /// client, is clean (exit 3 when a node still loops, 4 when not proven).
        #[arg(long, requires = "apply")]
        verify: bool,
        /// --verify's wait for the agents' answers, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = plugin::verify::DEFAULT_TIMEOUT_S, value_parser = clap::value_parser!(u64).range(1..=plugin::verify::MAX_TIMEOUT_S))]
        timeout: u64,
    },
    /// Ask the agents to test SERVICE's LB IP:ports now (a LoopbackVerification request they
    /// answer through the API) and print per node and kind: confirmed (with the evidence),
    /// clean (what was tried), not proven (no answer), not testable (why); a pod's loop is
    /// tested from that pod. Exit 0 nothing confirmed or unproven, 3 a loop confirmed, 4 not
    /// proven, 1 an error (a node that did not answer in time is named).
    Verify {
        /// NAME, or NAMESPACE/NAME.
        service: String,
        /// The Service's namespace (default: `default`, or the one SERVICE names).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Test from this node (repeatable). Default: the nodes whose report or Events name
        /// a loop or a risk for the Service.
        #[arg(long = "node", value_name = "NODE")]
        nodes: Vec<String>,
        /// How long to wait for the agents' answers, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = plugin::verify::DEFAULT_TIMEOUT_S, value_parser = clap::value_parser!(u64).range(1..=plugin::verify::MAX_TIMEOUT_S))]
        timeout: u64,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Serve the read-only views above (report, events, fixes, evidence) to an AI assistant
    /// as a Model Context Protocol server on stdin/stdout (the assistant starts this command;
    /// no port is opened), with this kubeconfig and its RBAC. Nothing is applied, ever.
    Mcp {
        /// Also offer the `verify` tool, which creates a LoopbackVerification request (as
        /// `verify` does). Without it the tool is not listed.
        #[arg(long)]
        allow_verify: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ReportOutput {
    Table,
    /// The table with each agent's version and what it cannot confirm.
    Wide,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    // `events -o json | head`: a closed pipe ends the plugin quietly, as it ends `cat`, instead
    // of a panic in println! (Rust ignores SIGPIPE by default).
    // SAFETY: restoring the default disposition of one signal, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // `report` is a gate: 1 means "a risk or a loop", so its errors are 2.
    let error_code = if matches!(cli.command, Command::Report { .. }) {
        2
    } else {
        1
    };
    let kube = KubeArgs {
        kubeconfig: cli.kubeconfig,
        context: cli.context,
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::anyhow!("starting the runtime: {e}"), error_code),
    };
    match rt.block_on(run(cli.command, kube)) {
        Ok(code) => code,
        Err(e) if e.is::<plugin::fix::Refused>() => {
            eprintln!("kubectl clb-probe: refused: {}", esc(&format!("{e:#}")));
            ExitCode::from(2)
        }
        Err(e) => fail(&e, error_code),
    }
}

#[expect(clippy::print_stdout, reason = "the plugin's output")]
async fn run(command: Command, kube: KubeArgs) -> anyhow::Result<ExitCode> {
    let client = api::client(&kube).await?;
    match command {
        Command::Events { namespace, output } => {
            let rows = plugin::query::events(client, namespace.as_deref()).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                Output::Table if rows.is_empty() => println!("{}", plugin::NO_EVENTS),
                Output::Table => print!(
                    "{}",
                    plugin::table(&rows, k8s_openapi::jiff::Timestamp::now())
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report {
            output,
            service,
            node,
        } => {
            use clb_probe_client::report::cluster;
            let view = plugin::query::report(client, cluster::Filter { service, node }).await?;
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            match output {
                ReportOutput::Json => println!("{}", serde_json::to_string_pretty(&view)?),
                ReportOutput::Table => print!("{}", cluster::table(&view, now, false)),
                ReportOutput::Wide => print!("{}", cluster::table(&view, now, true)),
            }
            Ok(ExitCode::from(view.exit_code()))
        }
        Command::Watch {
            node,
            namespace,
            print_command,
        } => {
            let pods = api::agent_pods(client, &namespace, &node).await?;
            let (ns, pod) =
                plugin::agent_pod(&pods, &namespace, &node).map_err(anyhow::Error::msg)?;
            let cmd = plugin::exec_command(&kube, &ns, &pod);
            if print_command {
                println!("{}", plugin::shell_words(&cmd));
                return Ok(ExitCode::SUCCESS);
            }
            // Replace this process: the terminal, signals and exit status are kubectl's.
            let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| cmd[0].clone());
            let err = std::os::unix::process::CommandExt::exec(
                std::process::Command::new(&kubectl).args(&cmd[1..]),
            );
            anyhow::bail!("running {kubectl}: {err} (is kubectl on PATH? set KUBECTL to its path)")
        }
        Command::Evidence {
            service,
            namespace,
            output,
            agent_namespace,
            port,
        } => {
            evidence(
                client,
                &service,
                namespace.as_deref(),
                &output,
                &agent_namespace,
                port,
            )
            .await
        }
        Command::Fix {
            service,
            namespace,
            output,
            apply,
            resource_version,
            dry_run,
            yes,
            undo,
            provider,
            verify,
            timeout,
        } => {
            use plugin::fix;
            if dry_run && apply.is_none() && !undo {
                anyhow::bail!("--dry-run goes with --apply ID or --undo");
            }
            let (namespace, service) = fix::service_ref(&service, namespace.as_deref())?;
            let svc = api::get_service(client.clone(), &namespace, &service).await?;
            if undo {
                return undo_fixes(client, &svc, dry_run, yes).await;
            }
            let plugin::query::FixListing {
                plan,
                events,
                reports,
                warnings,
            } = plugin::query::fix_listing(client.clone(), &namespace, &service, &svc, provider)
                .await?;
            for w in &warnings {
                eprintln!("kubectl clb-probe: warning: {}", esc(w));
            }
            let Some(id) = apply else {
                match output {
                    Output::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
                    Output::Table => print!("{}", esc(&fix::render(&plan))),
                }
                return Ok(ExitCode::SUCCESS);
            };
            let chosen = fix::select(&plan, &id, resource_version.as_deref())?;
            let applied = apply_fix(
                client.clone(),
                &svc,
                chosen,
                plan.resource_version.as_deref(),
                dry_run,
                yes,
            )
            .await?;
            if !verify || dry_run {
                return Ok(applied);
            }
            // The nodes that had the loop: their Events about the Service, and the reports'
            // active loops naming it.
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
            let looped = plugin::verify::nodes_for(
                &key,
                &active,
                &plugin::verify::event_nodes(&events, &namespace, &service),
            );
            if looped.is_empty() {
                anyhow::bail!(
                    "applied, but no node has a confirmed loop for {key} to verify (no Event, no active loop in the reports): run `kubectl clb-probe verify -n {namespace} {service} --node NODE`"
                );
            }
            let spec = plugin::verify::spec(&namespace, &service, &looped);
            let v = api::run_verification(client, &spec, std::time::Duration::from_secs(timeout))
                .await?;
            print!("{}", esc(&plugin::verify::render(&v)));
            if v.confirmed() {
                for (node, what) in v.still_looping() {
                    println!("still looping on node {}: {}", esc(&node), esc(&what));
                }
                return Ok(ExitCode::from(plugin::verify::CONFIRMED_EXIT));
            }
            if !v.missing.is_empty() {
                anyhow::bail!(plugin::verify::missing_error(&v.missing, timeout));
            }
            let because = v.not_resolved_because();
            if because.is_empty() {
                println!(
                    "resolved: every loop tested from its own client is clean on every node that had it ({})",
                    esc(&looped.join(", "))
                );
                Ok(ExitCode::SUCCESS)
            } else {
                println!("not proven resolved:");
                for line in because {
                    println!("  {}", esc(&line));
                }
                Ok(ExitCode::from(plugin::verify::NOT_PROVEN_EXIT))
            }
        }
        Command::Mcp { allow_verify } => {
            plugin::mcp::serve(client, allow_verify).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            service,
            namespace,
            nodes,
            timeout,
            output,
        } => {
            let (namespace, service) = plugin::fix::service_ref(&service, namespace.as_deref())?;
            let v = plugin::query::verify(
                client,
                &namespace,
                &service,
                nodes,
                std::time::Duration::from_secs(timeout),
            )
            .await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&v)?),
                Output::Table => print!("{}", esc(&plugin::verify::render(&v))),
            }
            if v.confirmed() {
                return Ok(ExitCode::from(plugin::verify::CONFIRMED_EXIT));
            }
            if !v.missing.is_empty() {
                anyhow::bail!(plugin::verify::missing_error(&v.missing, timeout));
            }
            if v.not_proven() {
                return Ok(ExitCode::from(plugin::verify::NOT_PROVEN_EXIT));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--apply ID`: the server's dry run as a diff, then (unless `dry_run`) the patch carrying
/// the undo computed from that answer (kept in the annotation, one write).
#[expect(clippy::print_stdout, reason = "the plugin's output")]
async fn apply_fix(
    client: kube::Client,
    svc: &k8s_openapi::api::core::v1::Service,
    chosen: &probe_contract::Fix,
    resource_version: Option<&str>,
    dry_run: bool,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    use plugin::{fix, undo};
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
    plugin::confirm::ask(
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
    svc: &k8s_openapi::api::core::v1::Service,
    dry_run: bool,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    use plugin::undo;
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
    plugin::confirm::ask(
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
fn names(svc: &k8s_openapi::api::core::v1::Service) -> (String, String) {
    (
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    )
}

/// API text (annotation values, an error Status's `message`, names) made safe for a terminal:
/// issue 36, E11 and E16. JSON output (`-o json`) is printed as it is: JSON escapes controls.
/// `evidence`: see the command's help and `plugin::evidence`.
#[expect(clippy::print_stdout, reason = "the plugin's output")]
async fn evidence(
    client: kube::Client,
    service: &str,
    namespace: Option<&str>,
    dir: &std::path::Path,
    agent_namespace: &str,
    port: u16,
) -> anyhow::Result<ExitCode> {
    use plugin::evidence::{self as ev, NodeOutcome};
    let (namespace, name) = plugin::fix::service_ref(service, namespace)?;
    ev::check_dir(dir).map_err(anyhow::Error::msg)?;
    let events = api::service_events(client.clone(), &namespace, &name).await?;
    let nodes = ev::nodes_of(&events);
    if nodes.is_empty() {
        anyhow::bail!(
            "no clb-probe Event regards Service {namespace}/{name}: no agent confirmed a loop for \
             it (or Events are off: --kube-events)"
        );
    }
    let full = format!("{namespace}/{name}");
    let mut outcomes = Vec::new();
    for node in &nodes {
        let outcome = match node_evidence(&client, node, &full, agent_namespace, port).await {
            Ok((bundles, captures)) if bundles.is_empty() => {
                let _ = captures;
                NodeOutcome::NoLoops
            }
            Ok((bundles, captures)) => {
                let folder = ev::node_dir(dir, node);
                ev::create_private_dir(dir).map_err(anyhow::Error::msg)?;
                ev::create_node_dir(&folder).map_err(anyhow::Error::msg)?;
                for (file, bytes) in ev::node_files(&bundles, &captures) {
                    ev::write_new(&folder.join(file), &bytes).map_err(anyhow::Error::msg)?;
                }
                NodeOutcome::Written(
                    bundles
                        .iter()
                        .map(|b| (b.id.clone(), b.packets.len()))
                        .collect(),
                )
            }
            Err(e) => NodeOutcome::Failed(format!("{e:#}")),
        };
        outcomes.push((node.clone(), outcome));
    }
    ev::create_private_dir(dir).map_err(anyhow::Error::msg)?;
    let readme = ev::readme(&full, &outcomes);
    ev::write_new(&dir.join("README.txt"), readme.as_bytes()).map_err(anyhow::Error::msg)?;
    print!("{}", esc(&readme));
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, NodeOutcome::Failed(_)))
        .map(|(n, _)| n.as_str())
        .collect();
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for (node, o) in &outcomes {
            if let NodeOutcome::Failed(why) = o {
                eprintln!("kubectl clb-probe: error: node {}: {}", esc(node), esc(why));
            }
        }
        eprintln!(
            "kubectl clb-probe: error: no evidence from {} (the other nodes were written)",
            esc(&failed.join(", "))
        );
        Ok(ExitCode::from(1))
    }
}

/// One node's bundles for `service` and their captures, through the pod proxy.
async fn node_evidence(
    client: &kube::Client,
    node: &str,
    service: &str,
    agent_namespace: &str,
    port: u16,
) -> anyhow::Result<(Vec<probe_contract::evidence::EvidenceBundle>, Vec<Vec<u8>>)> {
    use plugin::evidence as ev;
    let plugin::query::AgentIndex {
        namespace: ns,
        pod,
        port,
        index,
        token,
    } = plugin::query::evidence_index(client, node, agent_namespace, port).await?;
    let auth = [(probe_contract::evidence::TOKEN_HEADER, token.as_str())];
    let mut bundles = Vec::new();
    let mut captures = Vec::new();
    for id in ev::loops_of(&index, service) {
        let bundle: probe_contract::evidence::EvidenceBundle = serde_json::from_slice(
            &api::proxy_get(client, &ns, &pod, port, &format!("/evidence/{id}"), &auth).await?,
        )
        .map_err(|e| anyhow::anyhow!("the agent's /evidence/{id} on {pod}: {e}"))?;
        captures.push(
            api::proxy_get(
                client,
                &ns,
                &pod,
                port,
                &format!("/evidence/{id}/capture.pcapng"),
                &auth,
            )
            .await?,
        );
        bundles.push(bundle);
    }
    Ok((bundles, captures))
}

fn esc(s: &str) -> std::borrow::Cow<'_, str> {
    clb_probe_client::term::escape_lines(s)
}

/// One clear line on stderr, exit `code`.
fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("kubectl clb-probe: error: {}", esc(&format!("{e:#}")));
    ExitCode::from(code)
}
