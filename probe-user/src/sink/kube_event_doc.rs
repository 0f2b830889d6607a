//! What a clb-probe Event says and names: the objects it regards, its deterministic name, its
//! note (the cause in one sentence and the first fix, under the API's 1 KiB), and the Event
//! document of a confirmed loop or a resolution. Pure; [`super::kube_event_plan`] decides when
//! each is written.

use std::time::SystemTime;

use probe_contract::{
    LoopResolution, LoopbackEvent, LoopbackKind,
    kube_event::{ACTION, RESOLVED_ACTION, RESOLVED_REASON, fnv1a, reason, reporting_instance},
};

/// The API server's limit on `note` (bytes).
pub const NOTE_MAX: usize = 1024;

/// A Kubernetes object an Event points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    pub kind: &'static str,
    /// Empty for cluster-scoped objects (Node).
    pub namespace: String,
    pub name: String,
    /// `metadata.uid`, when the API told it.
    pub uid: Option<String>,
}

impl ObjectRef {
    /// `namespace/name` (or the service table's `namespace/name:port`, whose port is not
    /// part of the object's name); `None` when it is not in that form.
    pub fn namespaced(kind: &'static str, ns_name: &str) -> Option<Self> {
        let (ns, name) = ns_name.split_once('/')?;
        let name = name.split(':').next().unwrap_or(name);
        (!ns.is_empty() && !name.is_empty()).then(|| Self {
            kind,
            namespace: ns.to_string(),
            name: name.to_string(),
            uid: None,
        })
    }

    /// The Node `name` (an Event without a Service regards the agent's own Node).
    pub fn node(name: &str) -> Self {
        Self {
            kind: "Node",
            namespace: String::new(),
            name: name.to_string(),
            uid: None,
        }
    }

    /// Where an Event about this object lives: its own namespace, `default` for a
    /// cluster-scoped object (as the kubelet files Node Events).
    pub fn event_namespace(&self) -> String {
        if self.namespace.is_empty() {
            "default".to_string()
        } else {
            self.namespace.clone()
        }
    }
}

/// What attribution knows about a confirmed event (all optional: without API access or for
/// an address no Pod/Service owns, the Event regards the Node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    /// `namespace/name` of the Service.
    pub service: Option<String>,
    /// The Service's `metadata.uid` from the API.
    pub service_uid: Option<String>,
    /// `namespace/name` of the client Pod (hairpin).
    pub client_pod: Option<String>,
}

impl Names {
    /// What attribution put on `event`: the API's Service (with its uid) first, else the
    /// service table's name.
    pub fn of(event: &LoopbackEvent) -> Names {
        let api = event.facts.service.as_ref();
        Names {
            service: api.map(|s| s.key()).or_else(|| event.service.clone()),
            service_uid: api.and_then(|s| s.uid.clone()),
            client_pod: event.client_pod.clone(),
        }
    }
}

/// One Event as it should be after the write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventDoc {
    pub namespace: String,
    pub name: String,
    /// `Warning` for a loop, `Normal` for its resolution.
    pub event_type: &'static str,
    /// [`ACTION`] or [`RESOLVED_ACTION`].
    pub action: &'static str,
    pub reason: &'static str,
    pub note: String,
    pub regarding: ObjectRef,
    pub related: Option<ObjectRef>,
    /// `reportingInstance`: the node, cut by [`reporting_instance`].
    pub instance: String,
    /// `eventTime`: the first time this agent wrote the Event.
    pub event_time: SystemTime,
    /// `series`: present once the aggregate repeated (count >= 2).
    pub series: Option<Series>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Series {
    pub count: u64,
    pub last_observed: SystemTime,
}

/// `clb-probe.<node>.<kind>.<16 hex of FNV-1a(key)>`: a valid object name (DNS subdomain),
/// the same for the same aggregate on the same node across restarts.
pub fn event_name(node: &str, key: &str, kind: LoopbackKind) -> String {
    let hash = fnv1a(key.as_bytes());
    let kind = kind.as_str().replace('_', "-");
    let mut node: String = node
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    // 253 bytes at most: a node name that long is shortened to its own hash.
    if node.len() + kind.len() + 16 + 12 > 253 {
        node = format!("{:016x}", fnv1a(node.as_bytes()));
    }
    let node = node.trim_matches(|c| c == '.' || c == '-');
    if node.is_empty() {
        format!("clb-probe.{kind}.{hash:016x}")
    } else {
        format!("clb-probe.{node}.{kind}.{hash:016x}")
    }
}

/// (else its Service, else the Node), named after the key and the episode. Pure.
pub fn resolved_doc(
    r: &LoopResolution,
    warning: Option<&EventDoc>,
    node: &str,
    wall: SystemTime,
) -> EventDoc {
    let regarding = warning
        .map(|w| w.regarding.clone())
        .or_else(|| {
            r.service
                .as_deref()
                .and_then(|s| ObjectRef::namespaced("Service", s))
        })
        .unwrap_or_else(|| ObjectRef::node(node));
    EventDoc {
        namespace: regarding.event_namespace(),
        name: event_name(node, &format!("{}#resolved{}", r.key, r.episode), r.kind),
        event_type: "Normal",
        action: RESOLVED_ACTION,
        reason: RESOLVED_REASON,
        note: resolved_note(r),
        regarding,
        related: warning.and_then(|w| w.related.clone()),
        instance: reporting_instance(node),
        event_time: wall,
        series: None,
    }
}

/// What stopped, for how long it had lasted, the proof, and what changed; cut to
/// [`NOTE_MAX`] bytes.
pub fn resolved_note(r: &LoopResolution) -> String {
    let at = match (r.vip, r.vip_port) {
        (Some(ip), Some(port)) => format!(" at {}", sock(ip, port)),
        (Some(ip), None) => format!(" at {ip}"),
        _ => String::new(),
    };
    let changed = if r.changed.is_empty() {
        " No change to the Service was seen (the fix may be elsewhere: the node, the LB, the clients).".to_string()
    } else {
        format!(" Changed since first seen: {}.", r.changed.join("; "))
    };
    truncate(
        format!(
            "Resolved: {}{at} is no longer confirmed; it lasted {} s (confirmed {} time{}, first {}, last {}). Proof: {}.{changed}",
            r.kind.as_str(),
            r.lasted_s,
            r.count,
            if r.count == 1 { "" } else { "s" },
            r.first_seen,
            r.last_seen,
            // What was seen, and the first connection quoted by its 5-tuple.
            match r.proof.as_slice() {
                [] => "-".to_string(),
                [seen] => seen.clone(),
                [seen, tuple, ..] => format!("{seen}; {tuple}"),
            },
        ),
        NOTE_MAX,
    )
}

/// The cause in one sentence and the first remedy, cut to [`NOTE_MAX`] bytes.
pub fn note(event: &LoopbackEvent) -> String {
    let port = service_port(event)
        .map(|p| format!(" Service port: {p}."))
        .unwrap_or_default();
    let cause = probe_core::correlate::remedy::cause(event);
    // The canary's own connection tripped it (`--canary-every`): a real loop, no user's call.
    let cause = if event.facts.canary {
        format!(
            "{cause} Found by the agent's canary (its own connection from this node), not by a user's call."
        )
    } else {
        cause
    };
    // The first (best-fitting) fix when there is one: the exact change, and the command that
    // applies it when it is a patch of the named Service.
    let remedy = event.remedy.iter().find(|r| !r.starts_with("Cause:"));
    let text = match (event.fixes.first(), remedy) {
        (Some(fix), _) => match (
            &fix.patch,
            fix.service.as_deref().and_then(|s| s.split_once('/')),
        ) {
            (Some(_), Some((ns, name))) => format!(
                "{cause}{port} Fix: kubectl clb-probe fix -n {ns} {name} --apply {} ({}).",
                fix.id, fix.change
            ),
            _ => format!("{cause}{port} Fix: {}.", fix.short()),
        },
        (None, Some(remedy)) => format!("{cause}{port} Remedy: {remedy}"),
        (None, None) => format!("{cause}{port}"),
    };
    note_text(&text)
}

/// A note's text as written: terminal controls escaped (a second fence: the names in it were
/// escaped where they entered, `probe_core::untrusted`), cut to [`NOTE_MAX`] bytes.
fn note_text(text: &str) -> String {
    truncate(probe_core::term::escape(text).into_owned(), NOTE_MAX)
}

/// The Service port the event went through, `http (80/TCP)`: from the API, else the port
/// name of the service table's `namespace/name:port`.
fn service_port(event: &LoopbackEvent) -> Option<String> {
    let proto = event.proto.as_str().to_ascii_uppercase();
    if let Some(s) = &event.facts.service {
        return match (&s.port_name, s.port) {
            (Some(name), Some(port)) => Some(format!("{name} ({port}/{proto})")),
            (None, Some(port)) => Some(format!("{port}/{proto}")),
            (Some(name), None) => Some(name.clone()),
            (None, None) => None,
        };
    }
    let label = event.service.as_deref()?;
    let (_, port) = label.split_once(':')?;
    Some(match event.vip_port {
        Some(p) => format!("{port} ({p}/{proto})"),
        None => port.to_string(),
    })
}

/// Cut to at most `max` bytes at a char boundary, ending in `…` when cut.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let ellipsis = '…';
    let mut end = max - ellipsis.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push(ellipsis);
    text
}

/// `ip:port`, with brackets for IPv6.
fn sock(ip: std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// The Event for a report, without its write state.
pub fn event_doc(event: &LoopbackEvent, names: &Names, node: &str, wall: SystemTime) -> EventDoc {
    let service = names
        .service
        .as_deref()
        .and_then(|s| ObjectRef::namespaced("Service", s))
        .map(|r| ObjectRef {
            uid: names.service_uid.clone(),
            ..r
        })
        .or_else(|| {
            event
                .service
                .as_deref()
                .and_then(|s| ObjectRef::namespaced("Service", s))
        });
    let regarding = service.unwrap_or_else(|| ObjectRef::node(node));
    let related = names
        .client_pod
        .as_deref()
        .filter(|_| event.kind.spec().relates_client_pod)
        .and_then(|p| ObjectRef::namespaced("Pod", p));
    EventDoc {
        namespace: regarding.event_namespace(),
        name: event_name(node, &event.key, event.kind),
        event_type: "Warning",
        action: ACTION,
        reason: reason(event.kind),
        note: note(event),
        regarding,
        related,
        instance: reporting_instance(node),
        event_time: wall,
        series: (event.count >= 2).then_some(Series {
            count: event.count,
            last_observed: wall,
        }),
    }
}

#[cfg(test)]
mod tests {
    use probe_contract::{Listener, Proto, facts::SourceKind};

    use super::*;

    /// A host-listener hairpin of `src` (a pod's address, or the node's own) to a listener
    /// whose command name is `process`.
    fn host_listener_hairpin(src: &str, source: SourceKind, process: &str) -> LoopbackEvent {
        let mut e = crate::test_events::hairpin("k");
        e.src = src.parse().unwrap();
        e.dst = "198.18.0.2".parse().unwrap();
        e.dst_port = 6443;
        e.vip_port = Some(6443);
        e.facts.source = source;
        e.facts.host_listener = true;
        e.listener = Some(Listener {
            addr: "0.0.0.0".parse().unwrap(),
            port: 6443,
            proto: Proto::Tcp,
            uid: 65534,
            inode: 1,
            process: Some(process.into()),
            pid: Some(4242),
            pod: None,
        });
        e.remedy = vec![format!("Reach host process {process} without the LB")];
        e
    }

    /// #40: a loop the canary's own connection tripped says so in its Event's note; a user's
    /// does not.
    #[test]
    fn a_canary_loop_s_note_says_the_canary_found_it() {
        let mut e = crate::test_events::hairpin("k");
        assert!(!note(&e).contains("canary"));
        e.facts.canary = true;
        let n = note(&e);
        assert!(n.contains("Found by the agent's canary"), "{n}");
    }

    /// E8: the note names the host process and, for the node's own call, the node (it said
    /// "Pod <node address>"); a raw control character in any part of it comes out escaped.
    #[test]
    fn a_host_listener_note_names_the_process_and_the_node_and_is_escaped() {
        let from_node = note(&host_listener_hairpin(
            "198.18.0.2",
            SourceKind::Node,
            "kube-apiserver",
        ));
        assert!(
            from_node.starts_with(
                "This node (198.18.0.2) called the load balancer at 203.0.113.10:6443/tcp; the \
                 LB sent it back to host process kube-apiserver on this node (198.18.0.2:6443)"
            ),
            "{from_node}"
        );
        assert!(!from_node.contains("Pod 198.18.0.2"), "{from_node}");
        let from_pod = note(&host_listener_hairpin(
            "10.0.0.9",
            SourceKind::Pod,
            "kube-apiserver",
        ));
        assert!(
            from_pod.starts_with("Pod 10.0.0.9 called the load balancer")
                && from_pod.contains("back to host process kube-apiserver on this node"),
            "{from_pod}"
        );
        // Raw (as a listener read before the entry was escaped): escaped in the note.
        let raw = note(&host_listener_hairpin(
            "10.0.0.9",
            SourceKind::Pod,
            "\x1b[2J ALL CLEAR\x07",
        ));
        assert!(!raw.chars().any(char::is_control), "{raw:?}");
        assert!(
            raw.contains("host process \\x1b[2J ALL CLEAR\\x07"),
            "{raw}"
        );
        assert!(raw.len() <= NOTE_MAX);
    }
}
