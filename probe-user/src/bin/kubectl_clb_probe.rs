//! `kubectl-clb_probe` (`kubectl clb-probe` once on PATH, krew's naming): confirmed loopbacks
//! cluster-wide from the Kubernetes Events, and one node's live view. Exit codes: 0 ok,
//! 1 runtime failure, 2 usage error.

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
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let kube = KubeArgs {
        kubeconfig: cli.kubeconfig,
        context: cli.context,
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::anyhow!("starting the runtime: {e}")),
    };
    match rt.block_on(run(cli.command, kube)) {
        Ok(code) => code,
        Err(e) => fail(&e),
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
    }
}

/// One clear line on stderr, exit 1.
fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("kubectl clb-probe: error: {e:#}");
    ExitCode::from(1)
}
