//! `probe check --json`: the node's loopback risks, judged before they fail.
//!
//! Schema version [`SCHEMA_VERSION`]: `{"schema": 1, "risks": n, "warnings": n, "findings":
//! [{"kind", "severity", "subject", "summary", "evidence": [..], "remedy": [..], "fixes"?}],
//! "dataplane"?: {"mode", "replacement"?, "evidence", "still_possible"?, "cannot_confirm"?}}`.
//! Fields are only ever added. The agent's `probe check` builds a [`CheckReport`]; scripts, the
//! tests and the node report read it back with these types.

use serde::{Deserialize, Serialize};

use crate::Fix;

/// Version of the JSON output; bumped only if a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// How much a finding matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// A loopback failure can happen on this node as it is configured: exit 1.
    Risk,
    /// Something that limits what the probe (or this check) can see or conclude.
    Warn,
    /// A setting worth knowing (how the kernel decides drop vs reply), no action needed.
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Risk => "risk",
            Severity::Warn => "warn",
            Severity::Info => "info",
        }
    }
}

/// What a finding is about; the names match the agent's event kinds where they predict one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An LB ingress IP is a local address: the LB's health checks from it are discarded.
    HealthcheckBlackhole,
    /// An LB ingress IP is bound locally: in-cluster calls to its other ports are refused.
    VipPortUnserved,
    /// Pod egress to an LB leaves without SNAT: the LB can send it back to this node.
    Hairpin,
    /// A pod that calls its own Service cannot reach itself: a local endpoint without its
    /// KUBE-LOOP-BACK entry (IPVS mode), or bridge ports without hairpin mode while
    /// br_netfilter runs kube-proxy's DNAT in the bridge.
    ServiceSelfLoop,
    /// kube-proxy's nftables mode drops calls from this node's pods to an LB IP:port: an
    /// externalTrafficPolicy Local Service without an endpoint here (its
    /// `no-endpoint-services` element has verdict `drop`, kubernetes#131765).
    EtpLocalDrop,
    /// A NIC's `rp_filter` / `accept_local` / `route_localnet` (drop vs reply).
    NicSourceValidation,
    /// `kernel.kptr_restrict` hides kernel addresses: drop sites unreadable.
    KptrRestrict,
    /// What the running kernel lets the probe see (tcx vs clsact, drop reasons vs sites, BTF).
    KernelVisibility,
    /// Whether the Services were read from the Kubernetes API.
    KubeApi,
    /// No kube-proxy on this node: which kinds can still happen, what cannot be confirmed.
    Dataplane,
    /// Another kube-proxy mode's state left on the node: kube-ipvs0 (its addresses keep LB
    /// IPs local), IPVS virtual services, or kube-proxy's nftables table, while kube-proxy
    /// runs in another mode or not at all.
    ModeLeftover,
    /// An LB that sends PROXY protocol headers to its backends, whose IP this node
    /// short-circuits: in-cluster calls to it reach the backend without the header.
    ProxyProtocolShortCircuit,
    /// An LB IP whose Service sets `loadBalancerSourceRanges` that leave out this node's pod
    /// range: kube-proxy drops the pods' calls to it (issue #51, shape 1). Named as the event
    /// kind it predicts; `source_ranges`, its first name, still reads back.
    #[serde(alias = "source_ranges")]
    SourceRangesDrop,
    /// A port the LB probes on every node (kube-proxy's healthz :10256, an ETP Local
    /// Service's healthCheckNodePort) on which nothing listens here: the LB's probe is
    /// refused and the node taken out (issue #51, shape 4).
    LbProbeRefused,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::HealthcheckBlackhole => "healthcheck_blackhole",
            Kind::VipPortUnserved => "vip_port_unserved",
            Kind::Hairpin => "hairpin",
            Kind::ServiceSelfLoop => "service_self_loop",
            Kind::EtpLocalDrop => "etp_local_drop",
            Kind::NicSourceValidation => "nic_source_validation",
            Kind::KptrRestrict => "kptr_restrict",
            Kind::KernelVisibility => "kernel_visibility",
            Kind::KubeApi => "kube_api",
            Kind::Dataplane => "dataplane",
            Kind::ModeLeftover => "mode_leftover",
            Kind::ProxyProtocolShortCircuit => "proxy_protocol_short_circuit",
            Kind::SourceRangesDrop => "source_ranges_drop",
            Kind::LbProbeRefused => "lb_probe_refused",
        }
    }

    /// The event kind a finding of this kind predicts: the one of the same name, if any.
    pub fn predicted(self) -> Option<crate::LoopbackKind> {
        crate::LoopbackKind::parse(self.as_str())
    }
}

/// One finding: what, about which object, why we think so, what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: Kind,
    pub severity: Severity,
    /// The object: an address, `ip:port/proto`, a NIC, a sysctl, `kernel`.
    pub subject: String,
    /// One line, for the table.
    pub summary: String,
    pub evidence: Vec<String>,
    pub remedy: Vec<String>,
    /// Ready fixes for the Service behind the risk (the agent's provider fix table), best fit first; left
    /// out when none (the node-level kinds, or no Service read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<Fix>,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    pub schema: u32,
    pub risks: usize,
    pub warnings: usize,
    pub findings: Vec<Finding>,
    /// What serves this node's Services (kube-proxy's mode, or none and the replacement);
    /// absent when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataplane: Option<Dataplane>,
}

impl CheckReport {
    /// Sorted by severity, then kind, then subject, so output is stable.
    pub fn new(mut findings: Vec<Finding>) -> CheckReport {
        findings.sort_by(|a, b| {
            (a.severity, a.kind, &a.subject).cmp(&(b.severity, b.kind, &b.subject))
        });
        let count = |s| findings.iter().filter(|f| f.severity == s).count();
        CheckReport {
            schema: SCHEMA_VERSION,
            risks: count(Severity::Risk),
            warnings: count(Severity::Warn),
            findings,
            dataplane: None,
        }
    }

    /// The report with the dataplane the node showed.
    pub fn with_dataplane(mut self, dataplane: Option<Dataplane>) -> CheckReport {
        self.dataplane = dataplane;
        self
    }

    /// 0 without risks, 1 with.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.risks > 0)
    }
}

/// kube-proxy's mode, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Iptables,
    Ipvs,
    Nftables,
    /// No kube-proxy rules on this node.
    None,
}

impl Mode {
    /// The spelling of the JSON, the node report's `kubeProxyMode` and `--as`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Ipvs => "ipvs",
            Mode::Nftables => "nftables",
            Mode::None => "none",
        }
    }
}

/// What serves Services when kube-proxy does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replacement {
    Cilium,
    /// No kube-proxy and no trace of a replacement the probe knows.
    Unknown,
}

impl Replacement {
    pub fn as_str(self) -> &'static str {
        match self {
            Replacement::Cilium => "cilium",
            Replacement::Unknown => "unknown",
        }
    }
}

/// A loopback kind and why it still can (or cannot be confirmed to) happen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    /// `healthcheck_blackhole`, `vip_port_unserved`, `hairpin`, `service_self_loop`, or what
    /// cannot be confirmed (`nodeport_attribution`, ...).
    pub kind: String,
    pub why: String,
}

/// The dataplane found, with the evidence and, without kube-proxy, the limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dataplane {
    pub mode: Mode,
    /// Only when `mode` is `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<Replacement>,
    pub evidence: Vec<String>,
    /// Kinds that can still happen on this node (`mode: none` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub still_possible: Vec<Limit>,
    /// What the check cannot confirm here, and why (`mode: none` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cannot_confirm: Vec<Limit>,
}

impl Dataplane {
    /// `kube-proxy ipvs`, `none (cilium)`: one phrase for a table line or a status field.
    pub fn name(&self) -> String {
        match (self.mode, self.replacement) {
            (Mode::None, r) => format!("none ({})", r.unwrap_or(Replacement::Unknown).as_str()),
            (m, _) => format!("kube-proxy {}", m.as_str()),
        }
    }

    /// The node report's `dataplane`: `kube-proxy`, `cilium` or `unknown`.
    pub fn serving(&self) -> &'static str {
        match (self.mode, self.replacement) {
            (Mode::None, r) => r.unwrap_or(Replacement::Unknown).as_str(),
            _ => "kube-proxy",
        }
    }
}
