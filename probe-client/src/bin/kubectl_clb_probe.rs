//! `kubectl-clb_probe` (`kubectl clb-probe` once on PATH, krew's naming): confirmed loopbacks
//! cluster-wide from the Kubernetes Events, and one node's live view. Exit codes: 0 ok,
//! 1 runtime failure, 2 usage error. `report` gates a pipeline instead: 0 clean, 1 a risk or
//! an active loop, 2 any error. `verify`: 0 nothing confirmed and nothing unproven, 3 a loop
//! confirmed (still looping), 4 not proven (a test got no answer), 1 an error (a node that
//! did not answer included). `fix --apply --verify`: 0 resolved (every loop tested from its own
//! client, clean), 3 still looping, 4 not proven resolved (each reason printed), 1 an error.
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use clb_probe_client::plugin::{
    self, KubeArgs, api,
    command::{self, Output, ReportOutput, esc},
};

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
    Fix(command::fix::FixRequest),
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

/// Dispatches the parsed command to its flow (`plugin::command`).
async fn run(command: Command, kube: KubeArgs) -> anyhow::Result<ExitCode> {
    let client = api::client(&kube).await?;
    match command {
        Command::Events { namespace, output } => {
            command::events::run(client, namespace.as_deref(), output).await
        }
        Command::Report {
            output,
            service,
            node,
        } => {
            let filter = clb_probe_client::report::cluster::Filter { service, node };
            command::report::run(client, filter, output).await
        }
        Command::Watch {
            node,
            namespace,
            print_command,
        } => command::watch::run(client, &kube, &node, &namespace, print_command).await,
        Command::Evidence {
            service,
            namespace,
            output,
            agent_namespace,
            port,
        } => {
            let request = command::evidence::EvidenceRequest {
                service: &service,
                namespace: namespace.as_deref(),
                dir: &output,
                agent_namespace: &agent_namespace,
                port,
            };
            command::evidence::run(client, request).await
        }
        Command::Fix(request) => command::fix::run(client, request).await,
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
            command::verify::run(
                client,
                &service,
                namespace.as_deref(),
                nodes,
                timeout,
                output,
            )
            .await
        }
    }
}

/// One clear line on stderr, exit `code`.
fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("kubectl clb-probe: error: {}", esc(&format!("{e:#}")));
    ExitCode::from(code)
}
