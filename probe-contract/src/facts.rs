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

/// What made an address local on this node (what a remedy has to change): the kernel's
/// `local` routing table (not `ip addr`) decides what is a martian source, and each owner has
/// its own remedy (a cloud guest agent's route is not removed by reconfiguring kube-proxy).
/// Filled from the node's owners map (every RTN_LOCAL route of table local) when known.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AddressOwner {
    /// Bound on the VIP interface (`--vip-iface`, kube-ipvs0: kube-proxy in IPVS mode binds
    /// every ClusterIP and LB ingress IP there).
    VipInterface { iface: String },
    /// An address on another interface: the node's own, or a VIP that keepalived or kube-vip
    /// put on the NIC or on `lo` (or a manual `ip addr add`). `announcer` is set when the
    /// address is held like an announcer holds a VIP (see [`Announcer`]); absent for the
    /// node's own addresses (and in records written before it existed).
    Interface {
        iface: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        announcer: Option<Announcer>,
    },
    /// A `local` route of table local with no interface address behind it: a cloud guest
    /// agent (the GCE guest agent adds forwarding-rule IPs with protocol 66), or an operator's
    /// AnyIP route. `protocol` is the route's protocol number, `protocol_name` its name,
    /// `iface` the route's device when it has one.
    LocalRoute {
        #[serde(default)]
        iface: Option<String>,
        protocol: u8,
        protocol_name: String,
    },
}

/// Who holds a VIP as an address of this node to announce it (L2: ARP/NDP; L3: BGP), so that
/// the node answers for it. Only kube-vip and keepalived do that with an interface address:
/// - kube-vip adds the VIP to `vip_interface` (ARP mode: the NIC; BGP mode: `lo`, with host
///   scope unless `vip_interfaceloglobal`), with `vip_cidr` (32 by default) and
///   preferred_lft 0, "deprecated so it isn't used as source address" (kube-vip/kube-vip
///   pkg/vip/address.go `NewConfig`, `AddIP` -> `netlink.AddrReplace`); `svc_enable` makes it
///   do so for every LoadBalancer Service it serves, `cp_enable` for the control-plane VIP.
/// - keepalived adds each `virtual_ipaddress` as a /32 (/128) unless a prefix is given, and
///   tags it with its own address protocol (IFA_PROTO, Linux >= 5.18; the number is its
///   `rt_addrprotos` entry "keepalived") (acassen/keepalived keepalived/vrrp/vrrp_ipaddress.c).
/// - MetalLB holds no address: its speaker answers ARP/NDP (L2) or advertises routes (BGP)
///   from userspace (metallb/metallb: no netlink address call outside tests in `speaker/`,
///   `internal/layer2/`), so a MetalLB IP is local on a node only through kube-proxy (IPVS
///   mode's kube-ipvs0): that owner is [`AddressOwner::VipInterface`].
///
/// Calls from the holding node to the VIP and checks that arrive from it loop as with
/// kube-ipvs0 (kube-vip/kube-vip#1086, #1018: the VIP unreachable from the node holding it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Announcer {
    /// `kube-vip`, `keepalived`, or `unknown` (a host VIP on a NIC or `lo` with neither's
    /// mark and no announcer pod found on the node).
    pub name: String,
    /// What names it: the address's marks, and the pod when the API was read.
    pub why: String,
    /// `namespace/name` of the announcer's pod on this node (Kubernetes API), when found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

impl Announcer {
    pub const KUBE_VIP: &str = "kube-vip";
    pub const KEEPALIVED: &str = "keepalived";
    pub const UNKNOWN: &str = "unknown";

    /// "kube-vip", "keepalived (pod kube-system/x)", "an announcer (unknown)".
    pub fn who(&self) -> String {
        let name = if self.name == Self::UNKNOWN {
            "an announcer (unknown: kube-vip, keepalived or a manual address)".to_string()
        } else {
            self.name.clone()
        };
        match &self.pod {
            Some(pod) => format!("{name} (pod {pod})"),
            None => name,
        }
    }
}

impl AddressOwner {
    /// The announcer holding this address, if it is held like a VIP.
    pub fn announcer(&self) -> Option<&Announcer> {
        match self {
            AddressOwner::Interface { announcer, .. } => announcer.as_ref(),
            _ => None,
        }
    }

    /// An address on `iface` that is the node's own (no announcer).
    pub fn interface(iface: impl Into<String>) -> AddressOwner {
        AddressOwner::Interface {
            iface: iface.into(),
            announcer: None,
        }
    }

    /// The route protocol's name (iproute2's `rt_protos`, plus 66: the GCE guest agent's).
    pub fn protocol_name(protocol: u8) -> &'static str {
        match protocol {
            0 => "unspec",
            1 => "redirect",
            2 => "kernel",
            3 => "boot",
            4 => "static",
            8 => "gated",
            9 => "ra",
            10 => "mrt",
            11 => "zebra",
            12 => "bird",
            13 => "dnrouted",
            14 => "xorp",
            15 => "ntk",
            16 => "dhcp",
            17 => "mrouted",
            18 => "keepalived",
            42 => "babel",
            66 => "cloud guest agent",
            186 => "bgp",
            187 => "isis",
            188 => "ospf",
            189 => "rip",
            192 => "eigrp",
            _ => "unknown",
        }
    }

    pub fn local_route(iface: Option<String>, protocol: u8) -> AddressOwner {
        AddressOwner::LocalRoute {
            iface,
            protocol,
            protocol_name: Self::protocol_name(protocol).to_string(),
        }
    }

    /// A bounded label for metrics: `kube-ipvs0`, `nic:eth0`, `kube-vip:eth0`, `route:66`.
    pub fn label(&self) -> String {
        match self {
            AddressOwner::VipInterface { iface } => iface.clone(),
            AddressOwner::Interface {
                iface,
                announcer: None,
            } => format!("nic:{iface}"),
            // Names outside the known two are folded: the label stays bounded.
            AddressOwner::Interface {
                iface,
                announcer: Some(a),
            } => match a.name.as_str() {
                n @ (Announcer::KUBE_VIP | Announcer::KEEPALIVED) => format!("{n}:{iface}"),
                _ => format!("announcer:{iface}"),
            },
            AddressOwner::LocalRoute { protocol, .. } => format!("route:{protocol}"),
        }
    }
}

impl std::fmt::Display for AddressOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddressOwner::VipInterface { iface } => {
                write!(f, "an address on {iface} (kube-proxy IPVS)")
            }
            AddressOwner::Interface {
                iface,
                announcer: None,
            } => write!(f, "an address on {iface}"),
            AddressOwner::Interface {
                iface,
                announcer: Some(a),
            } => write!(f, "a VIP on {iface} held by {}", a.who()),
            AddressOwner::LocalRoute {
                iface,
                protocol,
                protocol_name,
            } => {
                write!(f, "a local route (table local")?;
                if let Some(i) = iface {
                    write!(f, ", dev {i}")?;
                }
                write!(
                    f,
                    ", proto {protocol} = {protocol_name}) with no interface address"
                )
            }
        }
    }
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

/// `service_self_loop`: the piece of the hairpin that the drop site and the node's state say
/// was missing (what the remedy asks to restore).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SelfLoopMissing {
    /// The hairpin SNAT: the packet reached the pod with its own address as source.
    /// `loop_back_entry`: IPVS mode's `KUBE-LOOP-BACK` holds the pod's entry (None: no set).
    HairpinSnat { loop_back_entry: Option<bool> },
    /// The pod's bridge port has `hairpin_mode` 0 (and br_netfilter bridged the DNAT).
    HairpinMode {
        bridge: String,
        port: String,
        br_netfilter: Option<bool>,
    },
    /// Dropped on the node, but not at a bridge port without hairpin mode: not determined.
    Undetermined,
}

/// Where the node's service table came from: which kube-proxy mode's rules a remedy names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProxyMode {
    Ipvs,
    Iptables,
    Nftables,
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
    /// `vip_port_unserved`: the API's Service serves this port, but this node's kube-proxy has
    /// not programmed it (the dataplane, read when the packet was refused, holds no rule for
    /// it): kube-proxy lags the API or failed to sync.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kube_proxy_lags: bool,
    /// `hairpin`: the LB sent the request to a host-network listener of a node address (a
    /// port that is no NodePort; the event's `listener` names the socket when found): no
    /// Service rule is involved.
    #[serde(default)]
    pub host_listener: bool,
    /// `service_self_loop`: the missing piece of the hairpin.
    #[serde(default)]
    pub self_loop: Option<SelfLoopMissing>,
    /// The kube-proxy mode the node's service table was read from (null: no table read).
    #[serde(default)]
    pub proxy_mode: Option<ProxyMode>,
    /// The looping connection was the agent's own canary (`--canary-every`), not a user's:
    /// the loop is real, its traffic is the agent's test (left out when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub canary: bool,
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
