//! `kubectl-clb_probe` (`kubectl clb-probe` once on PATH, krew's naming): confirmed loopbacks
//! cluster-wide from the Kubernetes Events, and one node's live view. Exit codes: 0 ok,
//! 1 runtime failure, 2 usage error. `report` gates a pipeline instead: 0 clean, 1 a risk or
//! an active loop, 2 any error.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use clb_probe::plugin::{self, KubeArgs, api};

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
    /// List the fixes for SERVICE (from the agents' Events and the Service and Nodes as read);
    /// `--apply ID` applies one: a server-side dry run, the patch, then the undo command.
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
        /// The cloud (aws, azure, gce, alicloud, tencentcloud, hcloud, digitalocean,
        /// openstack, generic). Default: the Nodes' providerIDs, else the Service's settings.
        #[arg(long, env = "CLB_PROBE_PROVIDER")]
        provider: Option<clb_probe::fixes::Provider>,
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
            eprintln!("kubectl clb-probe: refused: {e:#}");
            ExitCode::from(2)
        }
        Err(e) => fail(&e, error_code),
    }
}

#[expect(clippy::print_stdout, reason = "the plugin's output")]
async fn run(command: Command, kube: KubeArgs) -> anyhow::Result<ExitCode> {
    let client = api::client(&kube).await?;
    match command {
        Command::Events { output } => {
            let events = api::list_events(client).await?;
            let rows = plugin::rows(&events);
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
            use clb_probe::report::cluster;
            if let Some(s) = &service
                && s.split_once('/')
                    .is_none_or(|(ns, n)| ns.is_empty() || n.is_empty())
            {
                anyhow::bail!("--service {s:?}: give it as NAMESPACE/NAME");
            }
            let nodes = api::node_names(client.clone()).await?;
            let reports = api::node_reports(client).await?;
            if let Some(n) = &node
                && !nodes.contains(n)
                && !reports.iter().any(|(r, _)| r == n)
            {
                anyhow::bail!("--node {n:?}: no such node and no report for it");
            }
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let view = cluster::build(&nodes, &reports, now, &cluster::Filter { service, node });
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
        Command::Fix {
            service,
            namespace,
            output,
            apply,
            resource_version,
            provider,
        } => {
            use plugin::fix;
            let (namespace, service) = fix::service_ref(&service, namespace.as_deref())?;
            let svc = api::get_service(client.clone(), &namespace, &service).await?;
            let provider_ids = match provider {
                Some(_) => Vec::new(),
                None => api::node_provider_ids(client.clone())
                    .await
                    .unwrap_or_else(|e| {
                        eprintln!("kubectl clb-probe: warning: {e:#} (provider from the Service)");
                        Vec::new()
                    }),
            };
            let events = api::list_events(client.clone()).await?;
            let kinds = fix::confirmed_kinds(&events, &namespace, &service);
            let plan = fix::plan(
                &svc,
                provider_ids.iter().map(String::as_str),
                provider,
                &kinds,
            )?;
            let Some(id) = apply else {
                match output {
                    Output::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
                    Output::Table => print!("{}", fix::render(&plan)),
                }
                return Ok(ExitCode::SUCCESS);
            };
            let chosen = fix::select(&plan, &id, resource_version.as_deref())?;
            let patch = fix::guarded_patch(chosen, plan.resource_version.as_deref());
            api::patch_service(client.clone(), &namespace, &service, &patch, true).await?;
            println!("dry run ok: {id} on service {namespace}/{service}");
            let done = api::patch_service(client, &namespace, &service, &patch, false).await?;
            println!(
                "applied {id}: service {namespace}/{service} now at resourceVersion {}",
                done.metadata.resource_version.as_deref().unwrap_or("?")
            );
            println!("undo: {}", fix::undo_command(chosen, &namespace, &service));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One clear line on stderr, exit `code`.
fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("kubectl clb-probe: error: {e:#}");
    ExitCode::from(code)
}
