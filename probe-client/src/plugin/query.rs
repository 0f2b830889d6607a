//! What `report`, `events` and `fix`'s listing read from the API and build from it, in one
//! place for the terminal commands (the binary prints it) and the MCP server ([`super::mcp`]
//! returns it): both show the same data, computed the same way.

use k8s_openapi::api::{core::v1::Service, events::v1::Event};
use kube::Client;
use probe_contract::report::ReportStatus;

use super::{Row, api, fix};
use crate::report::cluster::{self, ClusterView};

/// `report`: the cluster view of the Nodes and their LoopbackReports, filtered. A filter naming
/// no Service (`NAMESPACE/NAME`) or no known node is an error, not an empty view.
pub async fn report(client: Client, filter: cluster::Filter) -> anyhow::Result<ClusterView> {
    if let Some(s) = &filter.service
        && s.split_once('/')
            .is_none_or(|(ns, n)| ns.is_empty() || n.is_empty())
    {
        anyhow::bail!("--service {s:?}: give it as NAMESPACE/NAME");
    }
    let nodes = api::node_names(client.clone()).await?;
    let reports = api::node_reports(client).await?;
    if let Some(n) = &filter.node
        && !nodes.contains(n)
        && !reports.iter().any(|(r, _)| r == n)
    {
        anyhow::bail!("--node {n:?}: no such node and no report for it");
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    Ok(cluster::build(&nodes, &reports, now, &filter))
}

/// `events`: clb-probe's Events as rows, newest first (in `namespace`, else everywhere).
pub async fn events(client: Client, namespace: Option<&str>) -> anyhow::Result<Vec<Row>> {
    let mut rows = api::event_rows(client, namespace).await?;
    super::sort_rows(&mut rows);
    Ok(rows)
}

/// `fix SERVICE`'s listing and what it was computed from.
pub struct FixListing {
    pub plan: fix::Plan,
    /// The agents' Events regarding the Service (what the kinds were confirmed by).
    pub events: Vec<Event>,
    /// The LoopbackReports as read (empty when they could not be: then a warning says so).
    pub reports: Vec<(String, ReportStatus)>,
    /// What was read only in part, and what the listing fell back on (API text in them is
    /// not escaped: the caller escapes for its output).
    pub warnings: Vec<String>,
}

/// The fixes for `svc` (`namespace/service`, as read): its confirmed kinds from the agents'
/// Events (only those naming a listed Node), the provider from `provider`, else the Nodes'
/// providerIDs, else the Service; the agents' own fix lists from their reports, else recomputed
/// from the Service.
pub async fn fix_listing(
    client: Client,
    namespace: &str,
    service: &str,
    svc: &Service,
    provider: Option<crate::fixes::Provider>,
) -> anyhow::Result<FixListing> {
    let mut warnings = Vec::new();
    let provider_ids = match provider {
        Some(_) => Vec::new(),
        None => api::node_provider_ids(client.clone())
            .await
            .unwrap_or_else(|e| {
                warnings.push(format!("{e:#} (provider from the Service)"));
                Vec::new()
            }),
    };
    let events = api::service_events(client.clone(), namespace, service).await?;
    // The Nodes, to believe only Events naming one (none listed: shape and namespace).
    let nodes = api::node_names(client.clone()).await.ok();
    let kinds = fix::confirmed_kinds(&events, namespace, service, nodes.as_deref());
    let unknown = fix::events_from_unknown_nodes(&events, namespace, service, nodes.as_deref());
    if unknown > 0 {
        warnings.push(format!(
            "{unknown} clb-probe Event(s) about {namespace}/{service} ignored: their reportingInstance is no Node the API lists (a deleted node, or not an agent's)"
        ));
    }
    // The agents' own fix lists; without the reports (CRD not installed, `list
    // loopbackreports` denied) the fixes are recomputed from the Service.
    let reports = api::node_reports(client).await.unwrap_or_else(|e| {
        warnings.push(format!("{e:#} (fixes recomputed from the Service)"));
        Vec::new()
    });
    let agent = fix::agent_fixes(&reports, &format!("{namespace}/{service}"));
    let plan = fix::plan(
        svc,
        provider_ids.iter().map(String::as_str),
        provider,
        &kinds,
        &agent,
    )?;
    Ok(FixListing {
        plan,
        events,
        reports,
        warnings,
    })
}

/// `verify`: asks the agents on `nodes` (none: the nodes whose reports or Events name a loop or
/// a risk for the Service) to test `namespace/service` now, and waits up to `timeout` for their
/// answers. Creates a LoopbackVerification (deleted when done).
pub async fn verify(
    client: Client,
    namespace: &str,
    service: &str,
    nodes: Vec<String>,
    timeout: std::time::Duration,
) -> anyhow::Result<super::verify::Verification> {
    let spec = verify_spec(client.clone(), namespace, service, nodes).await?;
    api::run_verification(client, &spec, timeout).await
}

/// `verify`'s request for `namespace/service` from `nodes`, or (none named) from the nodes
/// whose reports or Events name a loop or a risk for it. An error for a Service that does not
/// exist, before anything is created.
pub async fn verify_spec(
    client: Client,
    namespace: &str,
    service: &str,
    nodes: Vec<String>,
) -> anyhow::Result<probe_contract::verify::VerificationSpec> {
    use super::verify as v;
    api::get_service(client.clone(), namespace, service).await?;
    let key = format!("{namespace}/{service}");
    let nodes = if nodes.is_empty() {
        let reports = api::node_reports(client.clone()).await.unwrap_or_default();
        let events = api::service_events(client, namespace, service)
            .await
            .unwrap_or_default();
        v::nodes_for(&key, &reports, &v::event_nodes(&events, namespace, service))
    } else {
        nodes
    };
    if nodes.is_empty() {
        anyhow::bail!(
            "no node has a loop or a risk for {key} (reports, Events): name the nodes to test from with --node NODE"
        );
    }
    Ok(v::spec(namespace, service, &nodes))
}

/// One node's agent, as `evidence` reaches it, and its evidence index (`GET /evidence`).
pub struct AgentIndex {
    pub namespace: String,
    pub pod: String,
    pub port: u16,
    pub index: probe_contract::evidence::EvidenceIndex,
    /// The evidence token the agent asked for (the bundles and captures need it too).
    pub token: String,
}

/// The evidence index of the agent on `node` (the DaemonSet's pod in `agent_namespace`, chosen
/// as `watch` chooses it), through the API server's pod proxy, on the pod's `metrics` port, else
/// `port`.
pub async fn evidence_index(
    client: &Client,
    node: &str,
    agent_namespace: &str,
    port: u16,
) -> anyhow::Result<AgentIndex> {
    let pods = api::agent_pods(client.clone(), agent_namespace, node).await?;
    let (namespace, pod) =
        super::agent_pod(&pods, agent_namespace, node).map_err(anyhow::Error::msg)?;
    let port = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()))
        .map_or(port, |p| super::evidence::metrics_port(p, port));
    // The agents serve /evidence only with the token of their Secret (issue #49, H9).
    let token = api::evidence_token(client, &namespace).await?;
    let auth = [(probe_contract::evidence::TOKEN_HEADER, token.as_str())];
    let index = serde_json::from_slice(
        &api::proxy_get(client, &namespace, &pod, port, "/evidence", &auth).await?,
    )
    .map_err(|e| anyhow::anyhow!("the agent's /evidence on {pod}: {e}"))?;
    Ok(AgentIndex {
        namespace,
        pod,
        port,
        index,
        token,
    })
}
