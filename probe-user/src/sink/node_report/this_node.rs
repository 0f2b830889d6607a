//! E12: the agent writes as node `node` only when this is that node.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{error, warn};

use super::{
    api::{HEARTBEAT, WRITE_TIMEOUT},
    gate::Backoff,
};
use crate::hub::outputs::ReportStats;

/// E12, for everything that speaks as node `node` (the report and condition writer, the verify
/// answers): in a Pod, the Pod is scheduled on `node`; outside one, one of the Node's
/// InternalIPs is an address of this host (`local`). With `stats` (the node report's own
/// check), false is said in one ERROR and `clbprobe_node_report_refused{reason}`; without
/// (another speaker, which says it its own way), nothing is logged or counted.
pub async fn is_this_node(
    client: &Client,
    node: &str,
    local: Option<watch::Receiver<crate::state::addrs::Owners>>,
    stats: Option<&ReportStats>,
    first_wait_ms: u64,
) -> bool {
    let quiet = ReportStats::default();
    let (stats, speak) = match stats {
        Some(s) => (s, true),
        None => (&quiet, false),
    };
    match own_pod() {
        Some(pod) => scheduled_here(client, &pod, node, stats, first_wait_ms, speak).await,
        None => node_address_here(client, node, local, stats, speak).await,
    }
}

/// This agent's Pod (namespace, name), from the downward API's `POD_NAMESPACE` and
/// `POD_NAME`; None outside a Pod.
pub fn own_pod() -> Option<(String, String)> {
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    Some((var("POD_NAMESPACE")?, var("POD_NAME")?))
}

/// Why `node` is not the node the Pod is scheduled on (`spec.nodeName`), if it is not (pure).
pub fn node_mismatch(scheduled: Option<&str>, node: &str) -> Option<String> {
    match scheduled {
        Some(s) if s == node => None,
        Some(s) => Some(format!(
            "this agent's Pod runs on node {s:?}, not on {node:?} (--node-name / NODE_NAME)"
        )),
        None => Some(format!(
            "this agent's Pod is not scheduled on any node, so not on {node:?}"
        )),
    }
}

/// Whether one of the Node's `InternalIP`s is among this host's addresses: None when there is
/// nothing to compare (no InternalIP, or no local address known) (pure).
pub fn internal_ip_is_local(
    internal_ips: &[std::net::IpAddr],
    local: &crate::state::addrs::Owners,
) -> Option<bool> {
    if internal_ips.is_empty() || local.is_empty() {
        return None;
    }
    Some(
        internal_ips
            .iter()
            .any(|ip| local.keys().any(|p| p.is_host() && p.contains(*ip))),
    )
}

/// E12 outside a Pod (no scheduler's word): the Node named `node` must have one of its
/// `InternalIP`s on this host. A Node that cannot be read, has no InternalIP, or a host whose
/// addresses are not known within [`WRITE_TIMEOUT`] is not refused (said in one WARN): the
/// check guards against a wrong flag, not against every missing fact.
async fn node_address_here(
    client: &Client,
    node: &str,
    local: Option<watch::Receiver<crate::state::addrs::Owners>>,
    stats: &ReportStats,
    speak: bool,
) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    let ips: Vec<std::net::IpAddr> =
        match tokio::time::timeout(WRITE_TIMEOUT, nodes.get(node)).await {
            Ok(Ok(n)) => n
                .status
                .and_then(|s| s.addresses)
                .unwrap_or_default()
                .into_iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect(),
            _ => Vec::new(),
        };
    let mut owners = crate::state::addrs::Owners::default();
    if let Some(mut local) = local {
        let _ = tokio::time::timeout(WRITE_TIMEOUT, local.wait_for(|o| !o.is_empty())).await;
        owners = local.borrow().clone();
    }
    match internal_ip_is_local(&ips, &owners) {
        Some(true) => true,
        Some(false) => {
            if let Ok(mut r) = stats.refused.lock() {
                *r = "node_address_not_local".into();
            }
            if speak {
                error!(node = %node, internal_ips = ?ips, "node report: none of the Node's InternalIPs is an address of this host, so this is not node {node:?} (--node-name / NODE_NAME): refusing to write any node's report or condition (clbprobe_node_report_refused{{reason=\"node_address_not_local\"}}; detection keeps running)");
            }
            false
        }
        None => {
            if speak {
                warn!(node = %node, "node report: cannot check that this host is node {node:?} (the Node or its InternalIP unreadable, or no local address yet): believing the flag");
            }
            true
        }
    }
}

/// E12: whether the agent's own Pod is scheduled on `node`. Read until it can be (backed off
/// up to the heartbeat: a report waits for the API rather than trusting the flag); a Pod on
/// another node is one ERROR and `clbprobe_node_report_refused{reason="pod_on_other_node"}`,
/// and nothing is ever written.
async fn scheduled_here(
    client: &Client,
    (namespace, name): &(String, String),
    node: &str,
    stats: &ReportStats,
    first_wait_ms: u64,
    speak: bool,
) -> bool {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let mut backoff = Backoff::new(first_wait_ms, HEARTBEAT.as_millis() as u64);
    let set_refused = |reason: &str| {
        if let Ok(mut r) = stats.refused.lock() {
            *r = reason.to_string();
        }
    };
    loop {
        match tokio::time::timeout(WRITE_TIMEOUT, pods.get(name)).await {
            Ok(Ok(pod)) => {
                let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
                return match node_mismatch(scheduled, node) {
                    None => {
                        set_refused("");
                        true
                    }
                    Some(why) => {
                        set_refused("pod_on_other_node");
                        if speak {
                            error!(pod = %format!("{namespace}/{name}"), "node report: {why}: refusing to write any node's report or condition (clbprobe_node_report_refused{{reason=\"pod_on_other_node\"}}; detection keeps running)");
                        }
                        false
                    }
                };
            }
            failed => {
                let e = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                set_refused("own_pod_unreadable");
                let wait = backoff.failed(0);
                if speak && backoff.failures() == 1 {
                    warn!(pod = %format!("{namespace}/{name}"), error = %e, "node report: cannot read this agent's own Pod (get pods) to check the node it runs on: nothing is written until it can (retried with a backoff)");
                }
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
        }
    }
}
