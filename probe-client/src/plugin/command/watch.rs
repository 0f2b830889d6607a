//! `watch NODE`: the agent's live view on NODE, through `kubectl exec`.

use std::process::ExitCode;

use crate::plugin::{self, KubeArgs, api};

/// Finds the agent pod on `node` (in `namespace` only) and replaces this process with
/// `kubectl exec ... probe watch`, or prints that command (`print_command`).
#[expect(clippy::print_stdout, reason = "the plugin's output")]
pub async fn run(
    client: kube::Client,
    kube: &KubeArgs,
    node: &str,
    namespace: &str,
    print_command: bool,
) -> anyhow::Result<ExitCode> {
    let pods = api::agent_pods(client, namespace, node).await?;
    let (ns, pod) = plugin::agent_pod(&pods, namespace, node).map_err(anyhow::Error::msg)?;
    let cmd = plugin::exec_command(kube, &ns, &pod);
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
