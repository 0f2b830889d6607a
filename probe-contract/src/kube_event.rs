//! How a confirmed loopback is named in a Kubernetes Event: what the agent writes
//! (`--kube-events`) and `kubectl clb-probe events` selects and reads back.

use crate::event::LoopbackKind;

/// The Event's `reportingController`; `kubectl clb-probe events` selects on it.
pub const REPORTING_CONTROLLER: &str = "clb-probe";
/// The Event's `action`.
pub const ACTION: &str = "Detected";
/// The `reason` of the Normal Event written when a loop is resolved (its `action`:
/// [`RESOLVED_ACTION`]).
pub const RESOLVED_REASON: &str = "LoopbackResolved";
pub const RESOLVED_ACTION: &str = "Resolved";

/// The API server's limit on `reportingInstance`, `reportingController`, `reason` and `action`
/// (`ReportingInstanceLengthLimit` and its neighbours in Kubernetes'
/// `pkg/apis/core/validation/events.go`): a longer one is refused with 422.
pub const SHORT_FIELD_MAX: usize = 128;

// Ours are constants: checked here once; a node name is cut by [`reporting_instance`].
const _: () = {
    assert!(REPORTING_CONTROLLER.len() <= SHORT_FIELD_MAX);
    assert!(ACTION.len() <= SHORT_FIELD_MAX);
    assert!(RESOLVED_ACTION.len() <= SHORT_FIELD_MAX);
    assert!(RESOLVED_REASON.len() <= SHORT_FIELD_MAX);
};

/// `reportingInstance` for `node`: the name itself when it fits the API's 128 bytes (node
/// names may have 253); a longer one is its first 111 bytes, `-` and 16 hex of FNV-1a of the
/// whole name: recognisable by its prefix, distinct by its hash, the same across restarts. A
/// reader that matches an Event to its node (the plugin's shape check) compares the Event's
/// instance with `reporting_instance(node)`, not with the node name.
pub fn reporting_instance(node: &str) -> String {
    if node.len() <= SHORT_FIELD_MAX {
        return node.to_string();
    }
    let mut end = SHORT_FIELD_MAX - 17;
    while !node.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{:016x}", &node[..end], fnv1a(node.as_bytes()))
}

/// FNV-1a, 64 bit: stable across builds and Rust versions (unlike `DefaultHasher`); the hash of
/// [`reporting_instance`] and of the agent's Event names.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The Event's `reason` per kind (its row of `event::KINDS`).
pub fn reason(kind: LoopbackKind) -> &'static str {
    kind.spec().reason
}

/// The kind a `reason` names (for `kubectl clb-probe events`).
pub fn kind_of_reason(reason: &str) -> Option<LoopbackKind> {
    LoopbackKind::ALL
        .into_iter()
        .find(|k| self::reason(*k) == reason)
}
