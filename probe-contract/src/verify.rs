//! The `LoopbackVerification` (#40): a request to the agents to test a Service's LB IP:ports
//! now, and each agent's answer in its `status` (`kubectl clb-probe verify` creates one and
//! reads the answers; `fix --apply ID --verify` does the same after applying). camelCase JSON;
//! the chart's CRD schema (`crd-loopbackverification.yaml`) lists the same fields.
//!
//! Decisions (docs/cluster-view.md, "Verify"):
//! - Cluster-scoped, like the reports: the agents watch one resource, and the Service it names
//!   is data (`spec.service`), never an address: an agent tests only the LB ingress IPs and
//!   ports of that Service as its own API cache holds them.
//! - `status.nodes` is a map keyed by node name: each agent writes only its own entry, with a
//!   JSON merge patch to `/status`, so agents never overwrite each other's answers.
//! - One object per node (issue #49, H3), labelled [`NODE_LABEL`] with that node and
//!   [`RUN_LABEL`] with the run: each agent watches its own node's objects only.
//! - An agent answers a request once (an entry for its node exists: answered), one at a time,
//!   and ignores requests older than [`MAX_AGE_S`]; the plugin deletes the object when done.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::LoopbackKind;
pub use crate::report::{API_VERSION, GROUP, VERSION};

pub const KIND: &str = "LoopbackVerification";
pub const PLURAL: &str = "loopbackverifications";
/// The LoopbackVerification resource: the plugin writes it, the agents answer in its status.
pub const RESOURCE: crate::report::CustomResource = crate::report::CustomResource {
    group: GROUP,
    version: VERSION,
    api_version: API_VERSION,
    kind: KIND,
    plural: PLURAL,
};
/// The prefix of the names the plugin generates (`metadata.generateName`).
pub const GENERATE_NAME: &str = "verify-";

/// A request older than this (by `metadata.creationTimestamp`) is not answered: whoever asked
/// has given up (the plugin waits at most its `--timeout`, 120 s at most), and an agent that
/// starts late must not replay an old queue of connections.
pub const MAX_AGE_S: i64 = 300;

/// The targets one request tests at most on a node (LB IPs x ports of one Service); the rest
/// are answered `not_testable` ("over the limit").
pub const MAX_TARGETS: usize = 8;

/// The loop clients (pods) one request tests from at most on a node; the rest are answered
/// `not_testable` ("over the limit").
pub const MAX_CLIENTS: usize = 4;

/// The kinds a request may name at most (the CRD's `maxItems`: there are 7 kinds, and a repeat
/// says nothing). Issue #49: one request repeating a kind 140,000 times made an agent build
/// 1,120,000 results (2.3 GiB) and a 144 MB status patch.
pub const MAX_KINDS: usize = 16;

/// Requests one node tests in a minute at most (hostile round 4: one requester could keep
/// every node connecting; a black-holed Service ties a node's tester up ~40 s a request). Past
/// it a request is answered `refused` at once ("rate limited"), counted in
/// `clbprobe_verify_requests_total{phase="refused"}`.
pub const MAX_TESTS_PER_MINUTE: usize = 6;

/// Of those, the requests one requester (the [`REQUESTER_ANNOTATION`]) may have tested on a
/// node in a minute: one requester cannot take a node's whole minute from the others.
pub const MAX_TESTS_PER_REQUESTER_PER_MINUTE: usize = 3;

/// Who asked: the user name the API server authenticated for the plugin (a
/// SelfSubjectReview), set by the plugin on every request object. Trustworthy where the
/// chart's ValidatingAdmissionPolicy refuses a request whose annotation is not its creator's
/// user name (SECURITY.md); the agents rate-limit per value.
pub const REQUESTER_ANNOTATION: &str = "verify.clb-probe.io/requester";

/// The results one node's answer carries at most: targets x kinds x clients, bounded above,
/// plus the not-testable lines; past it the answer says how many were left out.
pub const MAX_RESULTS: usize = 256;

/// The label naming the one node a request object is for (issue #49, H3): the plugin creates
/// one object per node, and each agent watches only the objects with its own node's value
/// ([`node_label_value`]), so an agent receives its own request and its own answer, not every
/// node's answers to everyone's requests (one request naming 100 nodes sent each agent 201
/// watch events, 52 MiB). The agent still answers only when `spec.nodes` names it: a label
/// set by hand selects, it does not authorize.
pub const NODE_LABEL: &str = "verify.clb-probe.io/node";

/// The label shared by the objects of one `verify` run (one per node): the plugin lists them
/// by it and deletes them when done.
pub const RUN_LABEL: &str = "verify.clb-probe.io/run";

/// The nodes one `verify` run asks at most (one request object each). More: the plugin says
/// so and asks for `--node`; nothing is created.
pub const MAX_NODES: usize = 256;

/// [`NODE_LABEL`]'s value for `node`: the name itself when it is a valid label value (at most
/// 63 characters, `[A-Za-z0-9._-]`, alphanumeric at both ends: every node name of 63
/// characters or fewer is), else `h` and 16 hex digits of its FNV-1a hash (node names may be
/// 253 characters; a collision only makes another agent see, and skip, the object).
pub fn node_label_value(node: &str) -> String {
    let valid = !node.is_empty()
        && node.len() <= 63
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && node.as_bytes()[0].is_ascii_alphanumeric()
        && node.as_bytes()[node.len() - 1].is_ascii_alphanumeric();
    if valid {
        return node.to_owned();
    }
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("h{hash:016x}")
}

/// The request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VerificationSpec {
    pub service: ServiceRef,
    /// The nodes to test from. Empty: every agent that has a loop or a risk for the Service
    /// (an active or resolved loop in its memory, a risk in its node report) answers.
    pub nodes: Vec<String>,
    /// Only these kinds (`hairpin`, `vip_port_unserved`, ...); empty: every kind. At most
    /// [`MAX_KINDS`], each a known kind (the CRD's `enum`); repeats count once.
    pub kinds: Vec<RequestedKind>,
}

/// One name in a request's `spec.kinds`, as written: a kind, or a name no kind has. An unknown
/// name is kept, so that the agent refuses the request saying which, rather than the whole
/// request failing to parse (then no agent would answer it at all). On the wire it is the
/// name either way (`hairpin`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestedKind {
    Known(LoopbackKind),
    Unknown(String),
}

impl From<LoopbackKind> for RequestedKind {
    fn from(kind: LoopbackKind) -> Self {
        RequestedKind::Known(kind)
    }
}

impl From<&str> for RequestedKind {
    /// The kind spelled `name`, else the name as an unknown one.
    fn from(name: &str) -> Self {
        LoopbackKind::parse(name)
            .map_or_else(|| RequestedKind::Unknown(name.to_owned()), Into::into)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceRef {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl VerificationSpec {
    /// A request object's content (`{"spec": ...}`, beside its metadata): what the plugin
    /// creates and [`VerificationSpec::of_object`] reads.
    pub fn object_data(&self) -> serde_json::Value {
        serde_json::json!({ "spec": self })
    }

    /// The request in an object's content (`spec`), when it reads as one.
    pub fn of_object(data: &serde_json::Value) -> Option<VerificationSpec> {
        serde_json::from_value(data.get("spec")?.clone()).ok()
    }
}

/// The answers, by node name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VerificationStatus {
    pub nodes: BTreeMap<String, NodeVerification>,
}

impl VerificationStatus {
    /// The answers in an object's content (`status`); none yet, or unreadable: empty.
    pub fn of_object(data: &serde_json::Value) -> VerificationStatus {
        data.get("status")
            .cloned()
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default()
    }

    /// Whether an object's content holds an entry for `node` (answered or under way), read
    /// without parsing the other nodes' entries.
    pub fn has_entry(data: &serde_json::Value, node: &str) -> bool {
        data.get("status")
            .and_then(|s| s.get("nodes"))
            .and_then(|n| n.get(node))
            .is_some()
    }
}

/// Where one node's answer is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The agent took the request and is testing.
    #[default]
    Running,
    /// Every target has a result.
    Done,
    /// The agent will not test (its flags forbid it, the Service is not in its cache):
    /// `message` says why.
    Refused,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Done => "done",
            Phase::Refused => "refused",
        }
    }
}

/// One node's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeVerification {
    pub phase: Phase,
    /// RFC 3339 UTC.
    pub started_at: String,
    /// RFC 3339 UTC; empty while running.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub finished_at: String,
    /// Why the request was refused, or a note on the whole answer.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub results: Vec<VerifyResult>,
}

/// What a test came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyOutcome {
    /// The agent confirmed the loop during the test (`evidence`).
    Confirmed,
    /// Tested, the path completed (a connection answered, or refused by the far end), and
    /// nothing was confirmed (`tried` says what was tried and what happened).
    Clean,
    /// Tested, but no connection got an answer (all timed out or failed) and nothing was
    /// confirmed: silence is no verdict (`tried` says what happened). Issue #49: an LB that
    /// drops every call reads like a fixed loop.
    NotProven,
    /// This node cannot test it (`reason`).
    NotTestable,
}

impl VerifyOutcome {
    /// Every outcome, worst first (the order [`crate::verify`]'s consumers rank them in).
    pub const ALL: [VerifyOutcome; 4] = [
        VerifyOutcome::Confirmed,
        VerifyOutcome::NotProven,
        VerifyOutcome::Clean,
        VerifyOutcome::NotTestable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VerifyOutcome::Confirmed => "confirmed",
            VerifyOutcome::Clean => "clean",
            VerifyOutcome::NotProven => "not_proven",
            VerifyOutcome::NotTestable => "not_testable",
        }
    }
}

/// One kind tested at one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResult {
    /// `hairpin`, `vip_port_unserved`, ... (a `LoopbackKind`'s spelling).
    pub kind: String,
    /// `ip:port/proto`, or `ip` for a kind tested per LB IP (health checks).
    pub target: String,
    pub outcome: VerifyOutcome,
    /// `confirmed`: the confirmation's evidence lines (its key first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// `clean`: what was tried and what happened.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tried: String,
    /// `not_testable`: why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Where the test connections were made from: `node`, or `pod NAMESPACE/NAME (IP)` for a
    /// loop whose client is a pod (the call made from inside that pod's network namespace,
    /// along the path that looped). Empty in answers written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// This result tests a loop this node confirmed (its kind, from its client, at its LB
    /// IP:port): `fix --apply --verify` says "resolved" only when every such result is clean.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub looped: bool,
}

/// What [`VerifyResult::source`] says for a test made from the node itself.
pub const FROM_NODE: &str = "node";

/// The status a merge patch sets for `node`'s entry alone (`{"status":{"nodes":{NODE:..}}}`):
/// other nodes' entries are left as they are.
pub fn status_patch(node: &str, entry: &NodeVerification) -> serde_json::Value {
    let mut nodes = serde_json::Map::new();
    nodes.insert(
        node.to_owned(),
        serde_json::to_value(entry).unwrap_or_default(),
    );
    serde_json::json!({ "status": { "nodes": nodes } })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `spec.kinds` on the wire is names, as it always was: a known one reads as its kind, an
    /// unknown one is kept as written (the agent refuses it by name).
    #[test]
    fn requested_kinds_are_names_on_the_wire_and_an_unknown_one_is_kept() {
        let spec: VerificationSpec =
            serde_json::from_str(r#"{"kinds":["hairpin","loop"]}"#).unwrap();
        assert_eq!(
            spec.kinds,
            [
                RequestedKind::Known(LoopbackKind::Hairpin),
                RequestedKind::Unknown("loop".into())
            ]
        );
        assert_eq!(
            serde_json::to_value(&spec).unwrap()["kinds"],
            serde_json::json!(["hairpin", "loop"])
        );
        assert_eq!(
            RequestedKind::from("vip_port_unserved"),
            RequestedKind::Known(LoopbackKind::VipPortUnserved)
        );
        assert!(serde_json::from_str::<VerificationSpec>(r#"{"kinds":[7]}"#).is_err());
    }

    /// The plugin writes the object's content and the agent reads it back through the same
    /// two functions; a node's entry is found by its name whatever characters it holds.
    #[test]
    fn a_request_object_reads_back_and_a_node_entry_is_found_by_name() {
        let spec = VerificationSpec {
            nodes: vec!["a/b~c".into()],
            kinds: vec![LoopbackKind::Hairpin.into()],
            ..Default::default()
        };
        let mut data = spec.object_data();
        assert_eq!(VerificationSpec::of_object(&data), Some(spec));
        assert_eq!(
            VerificationStatus::of_object(&data),
            VerificationStatus::default()
        );
        assert!(!VerificationStatus::has_entry(&data, "a/b~c"));
        let patch = status_patch("a/b~c", &NodeVerification::default());
        data["status"] = patch["status"].clone();
        assert!(VerificationStatus::has_entry(&data, "a/b~c"));
        assert!(!VerificationStatus::has_entry(&data, "a"));
        assert!(
            VerificationStatus::of_object(&data)
                .nodes
                .contains_key("a/b~c")
        );
        assert_eq!(VerificationSpec::of_object(&serde_json::json!({})), None);
    }

    #[test]
    fn a_node_name_is_its_own_label_value_unless_it_cannot_be() {
        assert_eq!(
            node_label_value("ip-10-0-1-7.ec2.internal"),
            "ip-10-0-1-7.ec2.internal"
        );
        let long = format!("{}.example.com", "a".repeat(60));
        let value = node_label_value(&long);
        assert_eq!(value.len(), 17);
        assert!(value.starts_with('h'));
        assert_eq!(value, node_label_value(&long), "stable");
        assert_ne!(value, node_label_value(&format!("b{long}")));
        assert!(node_label_value("-x").starts_with('h'));
        assert!(node_label_value("").starts_with('h'));
        assert!(node_label_value("a/b").starts_with('h'));
    }
}
