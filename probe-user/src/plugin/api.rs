//! The plugin's API calls: a client configured as kubectl would be, Events and agent pods.

use anyhow::Context as _;
use k8s_openapi::api::{core::v1::Pod, events::v1::Event};
use kube::{
    Api, Client, Config,
    api::ListParams,
    config::{KubeConfigOptions, Kubeconfig},
};

use super::{AGENT_LABEL, KubeArgs};

/// Page size of the cluster-wide lists (the API server's own pagination).
const PAGE: u32 = 500;

/// A client as kubectl's would be: `--kubeconfig` (else `$KUBECONFIG`, else `~/.kube/config`,
/// else the in-cluster service account), `--context` (else the current context).
pub async fn client(args: &KubeArgs) -> anyhow::Result<Client> {
    let opts = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).with_context(|| format!("--kubeconfig {path}"))?;
            Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("--kubeconfig {path}"))?
        }
        (None, Some(_)) => Config::from_kubeconfig(&opts)
            .await
            .context("loading the kubeconfig")?,
        (None, None) => Config::infer()
            .await
            .context("no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster")?,
    };
    Client::try_from(config).context("building the API client")
}

/// The one line for an API failure: a denied verb says which permission is missing.
pub fn explain(e: kube::Error, what: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(status) if status.code == 403 => anyhow::anyhow!(
            "forbidden: cannot {what} ({}): ask for that permission (RBAC)",
            status.message
        ),
        kube::Error::Api(status) => {
            anyhow::anyhow!(
                "{what}: the API server answered {}: {}",
                status.code,
                status.message
            )
        }
        other => anyhow::anyhow!("{what}: {other}"),
    }
}

/// Every `events.k8s.io/v1` Event in the cluster (paged); the caller keeps clb-probe's.
pub async fn list_events(client: Client) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::all(client);
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| explain(e, "list events.k8s.io events in all namespaces"))?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// The clb-probe pods on `node` in the agent's `namespace` (never other namespaces: a tenant
/// may label its pods `app.kubernetes.io/name=clb-probe`).
pub async fn agent_pods(client: Client, namespace: &str, node: &str) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let params = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(&format!("{}={}", AGENT_LABEL.0, AGENT_LABEL.1));
    Ok(api
        .list(&params)
        .await
        .map_err(|e| explain(e, "list pods"))?
        .items)
}
