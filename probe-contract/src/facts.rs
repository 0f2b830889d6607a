//! The structured facts a confirmed event's remedy is built from (probe-user's
//! `correlate::remedy::build`).
//!
//! The correlator fills what the kernel and the node's rules say (who sent the packet, who
//! owns the local address, the NodePort's `externalTrafficPolicy` as the rules apply it);
//! attribution (`kube::enrich`) adds what the API says (the Service with its uid, the policy
//! as the Service is set, the LB ingress `ipMode`) and rebuilds the remedy from the merged
//! facts. The remedy never assumes a setting from the kind alone: what is not known is not
//! asserted. Serialized as the event's `facts` object.

use serde::{Deserialize, Serialize};

/// Who sent the looping packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A pod of this node (its own address).
    Pod,
    /// This node's own address: a host-network client, or pod traffic masqueraded to it.
    Node,
    /// A VIP bound on a node: the LB's health checker, or a host-network caller whose kernel
    /// picked the bound VIP as source.
    Vip,
    #[default]
    Unknown,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Pod => "pod",
            SourceKind::Node => "node",
            SourceKind::Vip => "vip",
            SourceKind::Unknown => "unknown",
        }
    }
}

/// Who makes the VIP a local address of this node (what a remedy has to change).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AddressOwner {
    /// Bound on the VIP interface (`--vip-iface`, kube-ipvs0: kube-proxy in IPVS mode binds
    /// every ClusterIP and LB ingress IP there).
    VipInterface { iface: String },
    /// An address on a named interface (keepalived, kube-vip, a manual `ip addr add`).
    Interface { iface: String },
    /// A `local` route of table local with no interface address (a cloud guest agent adds the
    /// LB's forwarding-rule IPs this way); `protocol` is the route's protocol number.
    LocalRoute { protocol: u8, protocol_name: String },
}

/// `externalTrafficPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Etp {
    Local,
    Cluster,
}

impl Etp {
    pub fn as_str(self) -> &'static str {
        match self {
            Etp::Local => "Local",
            Etp::Cluster => "Cluster",
        }
    }

    /// The API's spelling (unset: the API server defaults a NodePort / LoadBalancer Service
    /// to Cluster).
    pub fn from_api(value: Option<&str>) -> Etp {
        match value {
            Some("Local") => Etp::Local,
            _ => Etp::Cluster,
        }
    }
}

/// Which side of a `vip_as_source` this node saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VipSourceSide {
    /// This node received it (and dropped it as a local source).
    Receiving,
    /// This node sent it (a SYN left a NIC with a bound VIP as source).
    Sending,
}

/// The Service as the API server has it (attribution).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceFact {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid`; the Event's `regarding` carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The Service port the event went through (`port`, its name when it has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_name: Option<String>,
    /// Every port the Service serves, `80/TCP`.
    #[serde(default)]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_node_port: Option<u16>,
    /// The loopback-related annotations that are set, `key: value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<(String, String)>,
}

impl ServiceFact {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The cluster DNS name (assumes the default `cluster.local` domain).
    pub fn dns_name(&self) -> String {
        format!("{}.{}.svc.cluster.local", self.name, self.namespace)
    }
}

/// Everything the remedy depends on beyond the event's addresses, kind, layer and outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// Who sent the looping packet.
    #[serde(default)]
    pub source: SourceKind,
    /// Who owns the local address the loop runs through; null when not known.
    #[serde(default)]
    pub owner: Option<AddressOwner>,
    /// `externalTrafficPolicy` as this node's kube-proxy rules apply it to the NodePort
    /// (null: no rules read, or no NodePort involved).
    #[serde(default)]
    pub etp_rules: Option<Etp>,
    /// `externalTrafficPolicy` as the Service is set in the API (null: not attributed).
    #[serde(default)]
    pub etp_api: Option<Etp>,
    /// The LB ingress `ipMode` of the VIP from the API (`VIP`, `Proxy`); null: unset or not
    /// attributed.
    #[serde(default)]
    pub ip_mode: Option<String>,
    /// The Service from the API (attribution).
    #[serde(default)]
    pub service: Option<ServiceFact>,
    /// Masquerade rules found for pod egress (hairpin).
    #[serde(default)]
    pub masquerade_rules: usize,
    /// The LB sent the request straight to a local pod (no NodePort).
    #[serde(default)]
    pub lb_targets_pod: bool,
    /// `vip_as_source`: which side this node saw.
    #[serde(default)]
    pub side: Option<VipSourceSide>,
    /// `vip_port_unserved`: kube-proxy's IPVS access filter REJECTed it.
    #[serde(default)]
    pub access_filtered: bool,
}

impl Facts {
    /// The policy that decided this packet's path: the node's rules when read (they are
    /// what the kernel did), else the API's.
    pub fn etp(&self) -> Option<Etp> {
        self.etp_rules.or(self.etp_api)
    }

    /// The rules and the API disagree (kube-proxy on this node lags the API).
    pub fn etp_mismatch(&self) -> Option<(Etp, Etp)> {
        match (self.etp_rules, self.etp_api) {
            (Some(rules), Some(api)) if rules != api => Some((rules, api)),
            _ => None,
        }
    }
}
