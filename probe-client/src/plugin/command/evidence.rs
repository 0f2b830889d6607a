//! `evidence SERVICE -o DIR`: each node's evidence of the loops it confirmed for SERVICE,
//! through the API server's pod proxy (the pure part: [`crate::plugin::evidence`]).

use std::{path::Path, process::ExitCode};

use probe_contract::evidence::{EvidenceBundle, TOKEN_HEADER};

use super::esc;
use crate::plugin::{
    api,
    evidence::{self as ev, NodeOutcome},
    fix, query,
};

/// Where `evidence` reads from and writes to.
pub struct EvidenceRequest<'a> {
    /// NAME, or NAMESPACE/NAME.
    pub service: &'a str,
    pub namespace: Option<&'a str>,
    pub dir: &'a Path,
    pub agent_namespace: &'a str,
    /// The agent's HTTP port when its pod names no `metrics` port.
    pub port: u16,
}

/// Writes one folder per node that confirmed a loop and a README.txt (printed); exit 1 when a
/// node's agent could not be read (the others are still written).
#[expect(clippy::print_stdout, reason = "the plugin's output")]
pub async fn run(client: kube::Client, r: EvidenceRequest<'_>) -> anyhow::Result<ExitCode> {
    let (namespace, name) = fix::service_ref(r.service, r.namespace)?;
    let dir = r.dir;
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
        let outcome = match node_evidence(&client, node, &full, r.agent_namespace, r.port).await {
            Ok((bundles, _)) if bundles.is_empty() => NodeOutcome::NoLoops,
            Ok((bundles, captures)) => write_node(dir, node, &bundles, &captures)?,
            Err(e) => NodeOutcome::Failed(format!("{e:#}")),
        };
        outcomes.push((node.clone(), outcome));
    }
    ev::create_private_dir(dir).map_err(anyhow::Error::msg)?;
    let readme = ev::readme(&full, &outcomes);
    ev::write_new(&dir.join("README.txt"), readme.as_bytes()).map_err(anyhow::Error::msg)?;
    print!("{}", esc(&readme));
    Ok(failures(&outcomes))
}

/// `node`'s folder under `dir`, with its bundles and captures.
fn write_node(
    dir: &Path,
    node: &str,
    bundles: &[EvidenceBundle],
    captures: &[Vec<u8>],
) -> anyhow::Result<NodeOutcome> {
    let folder = ev::node_dir(dir, node);
    ev::create_private_dir(dir).map_err(anyhow::Error::msg)?;
    ev::create_node_dir(&folder).map_err(anyhow::Error::msg)?;
    for (file, bytes) in ev::node_files(bundles, captures) {
        ev::write_new(&folder.join(file), &bytes).map_err(anyhow::Error::msg)?;
    }
    Ok(NodeOutcome::Written(
        bundles
            .iter()
            .map(|b| (b.id.clone(), b.packets.len()))
            .collect(),
    ))
}

/// The nodes that could not be read, said on stderr: exit 1 when there is one.
fn failures(outcomes: &[(String, NodeOutcome)]) -> ExitCode {
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, NodeOutcome::Failed(_)))
        .map(|(n, _)| n.as_str())
        .collect();
    if failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    for (node, o) in outcomes {
        if let NodeOutcome::Failed(why) = o {
            eprintln!("kubectl clb-probe: error: node {}: {}", esc(node), esc(why));
        }
    }
    eprintln!(
        "kubectl clb-probe: error: no evidence from {} (the other nodes were written)",
        esc(&failed.join(", "))
    );
    ExitCode::from(1)
}

/// One node's bundles for `service` and their captures, through the pod proxy.
async fn node_evidence(
    client: &kube::Client,
    node: &str,
    service: &str,
    agent_namespace: &str,
    port: u16,
) -> anyhow::Result<(Vec<EvidenceBundle>, Vec<Vec<u8>>)> {
    let query::AgentIndex {
        namespace: ns,
        pod,
        port,
        index,
        token,
    } = query::evidence_index(client, node, agent_namespace, port).await?;
    let auth = [(TOKEN_HEADER, token.as_str())];
    let mut bundles = Vec::new();
    let mut captures = Vec::new();
    for id in ev::loops_of(&index, service) {
        let bundle: EvidenceBundle = serde_json::from_slice(
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
