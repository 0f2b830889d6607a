//! A ready fix for a confirmed loopback (or a `probe check` risk): what to change, how to undo
//! it, what it costs and where the provider documents it. Computed by the agent from the
//! event's facts (`probe_user::fixes`), carried on [`crate::LoopbackEvent::fixes`], listed and
//! applied by `kubectl clb-probe fix`.

use serde::{Deserialize, Serialize};

/// One fix. `patch`/`undo` are JSON merge patches (RFC 7386) of the Service, when the fix is a
/// change of the Service; a fix of something else (a node setting, the caller's code, the LB
/// controller) has no patch and says what to do in `change`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fix {
    /// Stable id (`etp-cluster`, `aws-nlb-target-type-ip`, ...): what `--apply` takes.
    pub id: String,
    /// The provider profile the fix is for (`generic` fits every provider).
    pub provider: String,
    /// What it changes, one sentence.
    pub change: String,
    /// `namespace/name` of the Service the patch applies to; null for a fix without a patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// JSON merge patch of the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<serde_json::Value>,
    /// JSON merge patch that restores what `patch` changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<serde_json::Value>,
    /// What must hold for the fix to work (versions, controllers, values to fill in).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preconditions: Vec<String>,
    /// What it costs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub side_effects: Vec<String>,
    /// The documentation that describes the setting (the provider's own, for provider fixes).
    pub source: String,
}

impl Fix {
    /// One line: `id: change`.
    pub fn short(&self) -> String {
        format!("{}: {}", self.id, self.change)
    }
}
