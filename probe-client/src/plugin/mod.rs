//! `kubectl clb-probe`: the cluster-wide view of what the agents confirmed, and a way onto
//! one node's live view. This module is the pure part (rows from Events, the table, the
//! choice of the agent pod, the `kubectl exec` command line); [`api`] talks to the API server,
//! [`query`] composes its reads, and [`command`] holds each subcommand's flow (the binary only
//! parses and dispatches).
//!
//! - `events`: every `events.k8s.io/v1` Event whose `reportingController` is `clb-probe`, in
//!   every namespace or the one `-n` names (Service events live in the Service's namespace,
//!   Node events in `default`), newest first. The API server selects them
//!   (`fieldSelector`), a page at a time ([`api::event_rows`]): other controllers' Events are
//!   neither fetched nor held. Every field is printed through [`crate::term::escape`] (a
//!   tenant may write any bytes into an Event it creates); `-o json` is left as the API gave
//!   it (JSON escapes control characters itself). Anyone allowed to create Events may set
//!   `reportingController: clb-probe`, and an Event records nothing of who wrote it, so the
//!   table marks (`*` after the kind) the rows not in the shape an agent writes
//!   ([`forged_because`]); a well-made forgery about a tenant's own Service in its own
//!   namespace passes that check: SECURITY.md says what closes it (an admission
//!   policy tying `reportingController: clb-probe` to the agent's service account).
//! - `watch NODE`: finds the Running clb-probe pod on NODE (pods labelled
//!   `app.kubernetes.io/name=clb-probe` with `spec.nodeName=NODE`, in the agent's namespace
//!   only, [`AGENT_NAMESPACE`] unless `-n` says otherwise, and owned by a DaemonSet: a tenant can
//!   label a pod of its own, it cannot put one there) and replaces itself with
//!   `kubectl exec -it -n NS POD -c agent -- probe watch`: the live view is a terminal UI on the
//!   agent's Unix socket, which only a process in the pod can reach, and `kubectl exec` is how a
//!   plugin user already gets there (same kubeconfig, same RBAC: `pods/exec`).
//! - `evidence SERVICE -o DIR`: each node's capture and evidence of the loops it confirmed
//!   for SERVICE, through the API server's pod proxy ([`evidence`]).

pub mod api;
pub mod command;
pub mod confirm;
pub mod evidence;
pub mod fix;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod query;
pub mod undo;
pub mod verify;

use std::fmt::Write as _;

use k8s_openapi::{
    api::{core::v1::Pod, events::v1::Event},
    jiff::Timestamp,
};
use probe_contract::kube_event::{
    ACTION, REPORTING_CONTROLLER, RESOLVED_ACTION, RESOLVED_REASON, kind_of_reason,
    reporting_instance,
};
use serde::{Deserialize, Serialize};

use crate::term::escape;

/// The label the chart puts on the agent's pods.
pub const AGENT_LABEL: (&str, &str) = ("app.kubernetes.io/name", "clb-probe");
/// The chart's namespace (`namespace.name`): where `watch` looks for the agent's pods unless
/// `-n` names another.
pub const AGENT_NAMESPACE: &str = "clb-probe";
/// The agent's container in the DaemonSet.
pub const AGENT_CONTAINER: &str = "agent";

/// One confirmed loopback as the Events tell it (`kubectl clb-probe events -o json` prints
/// these; scripts and the tests read them back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Why the Event is not in the shape an agent writes (then it is likely forged), None
    /// when it is. Not in `-o json`, which stays as it was.
    #[serde(skip)]
    pub forged_because: Option<&'static str>,
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

/// Why `ev` (which says `reportingController: clb-probe`) is not in the shape an agent writes,
/// or None when it is. What an agent writes (`sink::kube_event_plan::event_doc`): type
/// Warning, action Detected, a reason of one of its kinds (or, for a resolution, Normal,
/// Resolved, `LoopbackResolved`), `reportingInstance` its node's name (cut: `reporting_instance`);
/// regarding either a Service in the Event's own namespace, or its own Node with the Event in
/// `default`; related, when present, a Pod. This is a consistency check, not authentication
/// (an Event carries no author): it catches forgeries that copy the look and not the shape,
/// such as a "clb-probe" Event in a tenant namespace about a Node or another namespace.
pub fn forged_because(ev: &Event) -> Option<&'static str> {
    let instance = ev.reporting_instance.as_deref().unwrap_or_default();
    let namespace = ev.metadata.namespace.as_deref().unwrap_or_default();
    let resolved = ev.reason.as_deref() == Some(RESOLVED_REASON);
    let shape = if resolved {
        (Some("Normal"), Some(RESOLVED_ACTION))
    } else {
        (Some("Warning"), Some(ACTION))
    };
    if (ev.type_.as_deref(), ev.action.as_deref()) != shape {
        return Some("not a Warning with action Detected (nor a Normal LoopbackResolved)");
    }
    if !resolved && ev.reason.as_deref().and_then(kind_of_reason).is_none() {
        return Some("a reason no agent writes");
    }
    let node_name = !instance.is_empty()
        && instance.len() <= 253
        && instance
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !node_name {
        return Some("reportingInstance is not a node name");
    }
    let regarding = ev.regarding.as_ref();
    let kind = regarding.and_then(|r| r.kind.as_deref());
    let ns_of =
        |r: &k8s_openapi::api::core::v1::ObjectReference| r.namespace.clone().unwrap_or_default();
    match (kind, regarding) {
        (Some("Service"), Some(r)) if ns_of(r) == namespace => {}
        // The agent cuts a node name over 128 bytes (the API's limit on reportingInstance).
        (Some("Node"), Some(r))
            if r.name.as_deref().map(reporting_instance).as_deref() == Some(instance)
                && namespace == "default" => {}
        _ => return Some("regards an object an agent would not write it about"),
    }
    if ev
        .related
        .as_ref()
        .is_some_and(|r| r.kind.as_deref() != Some("Pod"))
    {
        return Some("related to something other than a Pod");
    }
    None
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
    // A resolution is the loop's, not a kind of its own (issue #49): `hairpin resolved`, the
    // kind read from the note the agent writes ("Resolved: hairpin at ...").
    let kind = match kind_of_reason(&reason) {
        Some(k) => k.as_str().to_string(),
        None if reason == RESOLVED_REASON => {
            let resolved_kind = ev
                .note
                .as_deref()
                .and_then(|n| n.strip_prefix("Resolved: "))
                .and_then(|n| n.split_whitespace().next())
                .and_then(probe_contract::LoopbackKind::parse);
            match resolved_kind {
                Some(k) => format!("{} resolved", k.as_str()),
                None => "resolved".to_string(),
            }
        }
        None => reason,
    };
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
        forged_because: forged_because(ev),
    })
}

/// clb-probe's Events as rows, newest first (ties: by node, then name, for a stable order).
pub fn rows<'a>(events: impl IntoIterator<Item = &'a Event>) -> Vec<Row> {
    let mut rows: Vec<Row> = events.into_iter().filter_map(row).collect();
    sort_rows(&mut rows);
    rows
}

/// Newest first (ties: by node, then name, for a stable order).
pub fn sort_rows(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        b.last_seen
            .cmp(&a.last_seen)
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| a.name.cmp(&b.name))
    });
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

/// The line under a table with marked rows.
pub const FORGED_FOOTER: &str = "* not in the shape a clb-probe agent writes: possibly forged by whoever may create Events there (kubectl -n NAMESPACE describe event NAME, SECURITY.md)";

/// The table for people: LAST SEEN, NODE, KIND, SERVICE, CLIENT POD, COUNT. Every cell is
/// escaped ([`crate::term::escape`]); rows with [`Row::forged_because`] get `*` after the
/// kind and the table a [`FORGED_FOOTER`].
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
            let mark = if r.forged_because.is_some() { "*" } else { "" };
            [
                age(now, r.last_seen),
                escape(&r.node).into_owned(),
                format!("{}{mark}", escape(&r.kind)),
                escape(r.service.as_deref().unwrap_or("-")).into_owned(),
                escape(r.client_pod.as_deref().unwrap_or("-")).into_owned(),
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
    if rows.iter().any(|r| r.forged_because.is_some()) {
        out.push_str(FORGED_FOOTER);
        out.push('\n');
    }
    out
}

/// Whether a DaemonSet controls `pod` (its controller ownerReference): the agent's pods are the
/// DaemonSet's; a pod someone created and labelled by hand is not.
fn daemonset_owned(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet" && o.api_version == "apps/v1")
}

/// The agent pod to exec into on `node`: the Running one in `namespace` carrying
/// [`AGENT_LABEL`] and controlled by a DaemonSet. Pods elsewhere, or not a DaemonSet's, are
/// never chosen, whatever their labels (a tenant may label its own pods anything).
/// Why no agent pod could be chosen on a node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AgentPodError {
    #[error(
        "no clb-probe agent pod on node {node} in namespace {namespace} (DaemonSet pods labelled {label}); is the DaemonSet scheduled there? (-n NAMESPACE if the agent runs in another namespace)",
        label = format!("{}={}", AGENT_LABEL.0, AGENT_LABEL.1)
    )]
    None { node: String, namespace: String },
    #[error("the clb-probe pod on node {node} is not Running ({pods})")]
    NotRunning { node: String, pods: String },
    #[error("{n} clb-probe pods run on node {node} ({pods}); delete the stale one")]
    Several {
        n: usize,
        node: String,
        pods: String,
    },
}

pub fn agent_pod(
    pods: &[Pod],
    namespace: &str,
    node: &str,
) -> Result<(String, String), AgentPodError> {
    let on_node: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(AGENT_LABEL.0))
                .is_some_and(|v| v == AGENT_LABEL.1)
                && p.metadata.namespace.as_deref() == Some(namespace)
                && daemonset_owned(p)
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
    let names = |pods: &[&Pod]| {
        pods.iter()
            .map(|p| format!("{}/{}", name(p).0, name(p).1))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match running.as_slice() {
        [one] => Ok(name(one)),
        [] if on_node.is_empty() => Err(AgentPodError::None {
            node: node.to_owned(),
            namespace: namespace.to_owned(),
        }),
        [] => Err(AgentPodError::NotRunning {
            node: node.to_owned(),
            pods: names(&on_node),
        }),
        many => Err(AgentPodError::Several {
            n: many.len(),
            node: node.to_owned(),
            pods: names(many),
        }),
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
