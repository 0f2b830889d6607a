//! `kubectl clb-probe`: the cluster-wide view of what the agents confirmed, and a way onto
//! one node's live view. This module is the pure part (rows from Events, the table, the
//! choice of the agent pod, the `kubectl exec` command line); [`api`] talks to the API server.
//!
//! - `events`: every `events.k8s.io/v1` Event whose `reportingController` is `clb-probe`, in
//!   every namespace (Service events live in the Service's namespace, Node events in
//!   `default`), newest first.
//! - `watch NODE`: finds the Running clb-probe pod on NODE (pods labelled
//!   `app.kubernetes.io/name=clb-probe` with `spec.nodeName=NODE`) and replaces itself with
//!   `kubectl exec -it -n NS POD -c agent -- probe watch`: the live view is a terminal UI on the
//!   agent's Unix socket, which only a process in the pod can reach, and `kubectl exec` is how a
//!   plugin user already gets there (same kubeconfig, same RBAC: `pods/exec`).

pub mod api;

use std::fmt::Write as _;

use k8s_openapi::{
    api::{core::v1::Pod, events::v1::Event},
    jiff::Timestamp,
};
use serde::Serialize;

use probe_contract::kube_event::{REPORTING_CONTROLLER, kind_of_reason};

/// The label the chart puts on the agent's pods.
pub const AGENT_LABEL: (&str, &str) = ("app.kubernetes.io/name", "clb-probe");
/// The agent's container in the DaemonSet.
pub const AGENT_CONTAINER: &str = "agent";

/// One confirmed loopback as the Events tell it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// When it was last seen (series.lastObservedTime, else eventTime).
    pub last_seen: Timestamp,
    pub node: String,
    /// The agent's kind (`hairpin`, ...), or the reason when it is not one clb-probe knows.
    pub kind: String,
    /// `namespace/name`, when the Event regards a Service.
    pub service: Option<String>,
    /// `namespace/name` of the client Pod (hairpin), when known.
    pub client_pod: Option<String>,
    pub count: u64,
    pub note: String,
    /// Where the Event is: `kubectl -n NAMESPACE describe event NAME`.
    pub namespace: String,
    pub name: String,
}

fn ns_name(r: &k8s_openapi::api::core::v1::ObjectReference, kind: &str) -> Option<String> {
    if r.kind.as_deref() != Some(kind) {
        return None;
    }
    let name = r.name.as_deref()?;
    Some(match r.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    })
}

/// The row of one Event; `None` for Events another controller reported.
pub fn row(ev: &Event) -> Option<Row> {
    if ev.reporting_controller.as_deref() != Some(REPORTING_CONTROLLER) {
        return None;
    }
    let last_seen = ev
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(ev.event_time.as_ref().map(|t| t.0))
        .or(ev.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let reason = ev.reason.clone().unwrap_or_default();
    let kind = kind_of_reason(&reason)
        .map(|k| k.as_str().to_string())
        .unwrap_or(reason);
    let count = ev
        .series
        .as_ref()
        .map(|s| u64::try_from(s.count).unwrap_or(0))
        .unwrap_or(1);
    Some(Row {
        last_seen,
        node: ev.reporting_instance.clone().unwrap_or_default(),
        kind,
        service: ev.regarding.as_ref().and_then(|r| ns_name(r, "Service")),
        client_pod: ev.related.as_ref().and_then(|r| ns_name(r, "Pod")),
        count,
        note: ev.note.clone().unwrap_or_default(),
        namespace: ev.metadata.namespace.clone().unwrap_or_default(),
        name: ev.metadata.name.clone().unwrap_or_default(),
    })
}

/// clb-probe's Events as rows, newest first (ties: by node, then name, for a stable order).
pub fn rows<'a>(events: impl IntoIterator<Item = &'a Event>) -> Vec<Row> {
    let mut rows: Vec<Row> = events.into_iter().filter_map(row).collect();
    rows.sort_by(|a, b| {
        b.last_seen
            .cmp(&a.last_seen)
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| a.name.cmp(&b.name))
    });
    rows
}

/// What `events` prints when there are none.
pub const NO_EVENTS: &str = "no loopback events: no clb-probe agent has confirmed a loopback (or Events are off: --kube-events)";

/// kubectl's age style: `45s`, `12m`, `5h`, `3d`.
pub fn age(now: Timestamp, then: Timestamp) -> String {
    let s = now.as_second().saturating_sub(then.as_second()).max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The table for people: LAST SEEN, NODE, KIND, SERVICE, CLIENT POD, COUNT.
pub fn table(rows: &[Row], now: Timestamp) -> String {
    let header = [
        "LAST SEEN",
        "NODE",
        "KIND",
        "SERVICE",
        "CLIENT POD",
        "COUNT",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                age(now, r.last_seen),
                r.node.clone(),
                r.kind.clone(),
                r.service.clone().unwrap_or_else(|| "-".into()),
                r.client_pod.clone().unwrap_or_else(|| "-".into()),
                r.count.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cols: Vec<&str>| {
        let mut l = String::new();
        for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
            if i + 1 == cols.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}   ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in &cells {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// The agent pod to exec into on `node`: the Running one carrying [`AGENT_LABEL`].
pub fn agent_pod(pods: &[Pod], node: &str) -> Result<(String, String), String> {
    let on_node: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(AGENT_LABEL.0))
                .is_some_and(|v| v == AGENT_LABEL.1)
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
        })
        .collect();
    let running: Vec<&Pod> = on_node
        .iter()
        .copied()
        .filter(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.metadata.deletion_timestamp.is_none()
        })
        .collect();
    let name = |p: &Pod| {
        (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        )
    };
    match running.as_slice() {
        [one] => Ok(name(one)),
        [] if on_node.is_empty() => Err(format!(
            "no clb-probe agent pod on node {node} (pods labelled {}={}); is the DaemonSet scheduled there?",
            AGENT_LABEL.0, AGENT_LABEL.1
        )),
        [] => Err(format!(
            "the clb-probe pod on node {node} is not Running ({})",
            on_node
                .iter()
                .map(|p| format!("{}/{}", name(p).0, name(p).1))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        many => Err(format!(
            "{} clb-probe pods run on node {node} ({}); choose one with -n NAMESPACE",
            many.len(),
            many.iter()
                .map(|p| format!("{}/{}", name(p).0, name(p).1))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Where the plugin's kubeconfig came from, passed on to `kubectl exec`.
#[derive(Clone, Debug, Default)]
pub struct KubeArgs {
    pub kubeconfig: Option<String>,
    pub context: Option<String>,
}

/// `kubectl [--kubeconfig K] [--context C] exec -it -n NS POD -c agent -- probe watch`.
pub fn exec_command(kube: &KubeArgs, namespace: &str, pod: &str) -> Vec<String> {
    let mut cmd = vec!["kubectl".to_string()];
    if let Some(k) = &kube.kubeconfig {
        cmd.extend(["--kubeconfig".into(), k.clone()]);
    }
    if let Some(c) = &kube.context {
        cmd.extend(["--context".into(), c.clone()]);
    }
    cmd.extend(
        [
            "exec",
            "-it",
            "-n",
            namespace,
            pod,
            "-c",
            AGENT_CONTAINER,
            "--",
            "probe",
            "watch",
        ]
        .map(String::from),
    );
    cmd
}

/// A command line as a shell would read it back.
pub fn shell_words(cmd: &[String]) -> String {
    cmd.iter()
        .map(|w| {
            if !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:@,+".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
