//! `probe check --as nftables [--json]`: what moving kube-proxy to nftables mode changes on
//! this node (the [`Prediction`]): risks that disappear, appear or remain, the fixes to apply
//! first, and `ipMode: Proxy` advice per LB address. The agent's node report carries its
//! summary (`nftablesReadiness`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{
    Fix,
    check::{Kind, Mode},
};

/// One risk that disappears, appears or stays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub kind: Kind,
    /// As the finding names it (`ip`, `ip:port/proto`, ...).
    pub subject: String,
    /// `namespace/name` when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub why: String,
    /// For an appearing risk: the fixes to apply before migrating.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<Fix>,
}

/// Whether `ipMode: Proxy` would avoid the loop for one LB ingress IP, and what it costs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpModeAdvice {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub ip: IpAddr,
    /// As the Service's status has it (`VIP`, `Proxy`, or an unknown value kept as written;
    /// `VIP` when unset or not read).
    pub ip_mode: String,
    /// The provider profile the advice used.
    pub provider: String,
    /// `already` (Proxy now), `avoids_now` (Proxy would stop kube-proxy binding it, as the
    /// move does), `not_needed` (nothing bound to undo), `does_not_help` (made local by a NIC
    /// or a route, not kube-proxy).
    pub verdict: String,
    pub advice: String,
    /// With `Proxy` in nftables mode, a pod's call to it would leave for the LB unSNATed.
    pub would_hairpin: bool,
    /// What `Proxy` costs (the fixes table's `ip-mode-proxy` entry).
    pub costs: Vec<String>,
    /// When `would_hairpin`: the fixes for that hairpin on this provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<Fix>,
}

/// The prediction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prediction {
    pub from: Mode,
    pub to: Mode,
    pub disappear: Vec<Change>,
    pub appear: Vec<Change>,
    pub remain: Vec<Change>,
    /// The fixes of the appearing risks, once each (by id and Service): apply before migrating.
    pub before_migrating: Vec<Fix>,
    pub ip_mode: Vec<IpModeAdvice>,
    /// LB addresses no kube-proxy mode short-circuits (`ipMode: Proxy`, hostname-only
    /// ingress, from the API): pod calls to them go to the LB before and after the move.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_short_circuited: Vec<Exposure>,
    /// Risks `probe check` will report after the move (remain + appear).
    pub risks_after: usize,
}

/// An LB address pod calls reach only through the LB, in either mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exposure {
    pub service: String,
    /// The ingress IP or hostname.
    pub address: String,
    pub why: String,
}

impl Prediction {
    /// `ready` when nothing appears, else `N new`; with what disappears: the node report's
    /// `nftablesReadiness`.
    pub fn summary(&self) -> String {
        let new = if self.appear.is_empty() {
            "ready".to_string()
        } else {
            format!("{} new", self.appear.len())
        };
        format!("{new}, {} gone", self.disappear.len())
    }
}
