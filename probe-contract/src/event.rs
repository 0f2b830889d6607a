//! What a confirmed loopback is, as the agent reports it: one [`LoopbackEvent`] per line of
//! `probe agent --events -`, the `event` of a live-view report, the subject of a Kubernetes
//! Event.
//!
//! Field names and enum spellings here are depended on by other tools; change them only
//! together with those tools.

use std::{fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::facts::Facts;

/// What the node's address sets say an address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Tag {
    /// An address of an interface of the node.
    Node,
    /// An address bound on the VIP interface (kube-ipvs0).
    Vip,
    /// A local pod address.
    Pod,
}

impl Tag {
    pub fn from_raw(raw: u8) -> Option<Tag> {
        match raw {
            probe_common::tag::NODE => Some(Tag::Node),
            probe_common::tag::VIP => Some(Tag::Vip),
            probe_common::tag::POD => Some(Tag::Pod),
            _ => None,
        }
    }

    pub fn to_raw(self) -> u8 {
        match self {
            Tag::Node => probe_common::tag::NODE,
            Tag::Vip => probe_common::tag::VIP,
            Tag::Pod => probe_common::tag::POD,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tag::Node => "node",
            Tag::Vip => "vip",
            Tag::Pod => "pod",
        }
    }

    pub const ALL: [Tag; 3] = [Tag::Node, Tag::Vip, Tag::Pod];
}

/// IP protocol of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    Tcp,
    Udp,
    Icmp,
    Other(u8),
}

impl Proto {
    pub fn from_raw(raw: u8) -> Proto {
        match raw {
            6 => Proto::Tcp,
            17 => Proto::Udp,
            1 | 58 => Proto::Icmp,
            n => Proto::Other(n),
        }
    }

    /// The IP protocol number, the inverse of [`Proto::from_raw`] (ICMP's depends on the
    /// family).
    pub fn to_raw(self, ipv6: bool) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Icmp if ipv6 => 58,
            Proto::Icmp => 1,
            Proto::Other(n) => n,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Icmp => "icmp",
            Proto::Other(_) => "other",
        }
    }
}

/// Whether an event's `service` (`namespace/name`, or `namespace/name:port` when the service
/// table named the port) is the Service `service` (`namespace/name`): every reader of that
/// field matches both spellings.
pub fn names_service(named: &str, service: &str) -> bool {
    named == service
        || named
            .strip_prefix(service)
            .is_some_and(|rest| rest.starts_with(':'))
}

/// What kind of loopback was confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopbackKind {
    /// The LB's health checks (source = the LB VIP) are dropped as a local (martian) source,
    /// because the VIP is bound on kube-ipvs0.
    HealthcheckBlackhole,
    /// A pod's un-SNATed call to an LB VIP came back to its own node through the LB.
    Hairpin,
    /// A VIP bound on kube-ipvs0 was called on a port nothing on the node serves.
    VipPortUnserved,
    /// A packet whose source is a LB VIP went from one node to a pod (or a non-NodePort
    /// port) of another node that binds the same VIP: a host-network call to the LB IP,
    /// forwarded without SNAT (externalTrafficPolicy: Local, no local endpoint).
    VipAsSource,
    /// A pod called its own Service (ClusterIP, LB IP or NodePort), the endpoint chosen was
    /// the pod itself, and without the hairpin SNAT the call came back with the pod's own
    /// address as source and was dropped (in the pod as a local source, or at its bridge port
    /// without hairpin mode).
    ServiceSelfLoop,
    /// kube-proxy dropped a call from this node to an external or LB IP of an
    /// externalTrafficPolicy Local Service that has no endpoint on this node: in nftables mode
    /// the IP:port is a `drop` element of its `no-endpoint-services` map (kubernetes#131765);
    /// in iptables mode a `DROP` rule of `KUBE-EXTERNAL-SERVICES` ("has no local endpoints"),
    /// which a pod's call escapes only when kube-proxy's local-traffic detector matches the
    /// pod (`--cluster-cidr`, or the interface detectors; kubernetes#112820): the evidence
    /// names the detector the pod missed.
    EtpLocalDrop,
    /// An in-cluster call to the LB IP of an LB that sends PROXY protocol headers was
    /// short-circuited by kube-proxy (DNATed to an endpoint on this node, never reaching the
    /// LB) and reset: the backend got no header.
    ProxyProtocolShortCircuit,
    /// A UDP sender with a fixed 5-tuple (statsd, DNS, syslog) keeps refreshing a conntrack
    /// entry to a Service IP that is DNATed to an endpoint that is no longer one (or that has
    /// no DNAT at all while the Service now has endpoints): unreplied, its datagrams go nowhere
    /// (kubernetes#139628).
    StaleUdpConntrack,
    /// kube-proxy dropped a call from this node (a local pod's, or the node's own) to an LB IP
    /// whose Service sets `loadBalancerSourceRanges`, because the caller's source is outside
    /// those ranges: nftables mode's `firewall-ips` map and the Service's `firewall-` chain
    /// (`ip saddr != { ranges } drop`, kubernetes PR #122614, 1.30); iptables mode has done it
    /// since 1.25 (`KUBE-FW-*`, PR #110289), not yet named here. kubernetes#109575.
    SourceRangesDrop,
    /// The LB's own health probe to this node, on kube-proxy's healthz :10256 (probed for
    /// externalTrafficPolicy Cluster) or a Service's healthCheckNodePort (Local), was refused
    /// (nothing listens: `NO_SOCKET`) or dropped here (a firewall, a probe source the kernel
    /// refuses): the LB takes the node out (issue #51, shape 4).
    LbProbeRefused,
}

impl LoopbackKind {
    /// Every kind, in the order every list of kinds shows them (the report's columns, verify's
    /// names): the three of the mission first, then the field's later shapes. Adding a kind
    /// adds it here and a row to [`KINDS`] (docs/architecture.md, "Adding a kind").
    pub const ALL: [LoopbackKind; 10] = [
        LoopbackKind::Hairpin,
        LoopbackKind::HealthcheckBlackhole,
        LoopbackKind::VipPortUnserved,
        LoopbackKind::VipAsSource,
        LoopbackKind::ServiceSelfLoop,
        LoopbackKind::EtpLocalDrop,
        LoopbackKind::ProxyProtocolShortCircuit,
        LoopbackKind::StaleUdpConntrack,
        LoopbackKind::SourceRangesDrop,
        LoopbackKind::LbProbeRefused,
    ];

    /// The kind spelled as [`LoopbackKind::as_str`] writes it.
    pub fn parse(s: &str) -> Option<LoopbackKind> {
        LoopbackKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The kind's row of [`KINDS`].
    pub const fn spec(self) -> &'static KindSpec {
        let mut i = 0;
        while i < KINDS.len() {
            if KINDS[i].kind as u8 == self as u8 {
                return &KINDS[i];
            }
            i += 1;
        }
        panic!("every kind has a row in KINDS (a test checks)")
    }

    /// A table column's header for the kind (`kubectl clb-probe report`).
    pub const fn column(self) -> &'static str {
        self.spec().column
    }

    /// The JSON spelling.
    pub const fn as_str(self) -> &'static str {
        self.spec().name
    }
}

/// Who makes a kind's looping call: the fixes' `Source` (which change helps depends on it),
/// and where verify tests from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The LB itself (its health checks).
    Lb,
    /// A pod.
    Pod,
    /// The node (a host-network socket).
    Node,
    /// A pod, or the node when the event's facts say the call was the node's
    /// (`facts.source: node`).
    PodOrNode,
    /// A pod when the event names one, else not known (an unserved port anyone can call).
    PodIfNamed,
}

/// What is true of a kind wherever the product handles it: its names, how its Event is
/// written, who calls, what verify can test. One row per kind in [`KINDS`]; the code that
/// differs per kind (its rule, remedy and proof) is the core's, one function per kind
/// (docs/architecture.md, "Adding a kind").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindSpec {
    pub kind: LoopbackKind,
    /// The JSON spelling (`hairpin`, ...).
    pub name: &'static str,
    /// The report's column header.
    pub column: &'static str,
    /// The Kubernetes Event's `reason` (UpperCamelCase, as Kubernetes reasons are).
    pub reason: &'static str,
    /// The order Events are written in when the API's budget is short: 0 first (a blackhole
    /// takes the node out of the LB for every client; an unserved port is what anyone can
    /// make by the thousand).
    pub severity: u8,
    /// How bad it is for the node, higher worse: the node report's order and the Node
    /// condition's pick. A black-holed health check takes the node out of its LBs (every
    /// Service on it); a hairpin fails a Service's calls from pods; a self-loop a pod's calls
    /// to its own Service, a PROXY protocol short-circuit the in-cluster calls to one LB,
    /// kube-proxy's ETP Local drop the pods' calls to one LB IP:port; a VIP as source and an
    /// unserved port are what any local user makes with one connect.
    pub harm: u8,
    /// Who makes the looping call.
    pub caller: Caller,
    /// A call from the node can trip it (verify's node-sourced test).
    pub node_testable: bool,
    /// A call from a pod can trip it (verify from the loop's pod).
    pub pod_testable: bool,
    /// Its Event names the client pod as `related`.
    pub relates_client_pod: bool,
    /// The traffic that proves its loop gone.
    pub proof: ProofShape,
    /// How its Service is found from its addresses: each way in turn until one finds it.
    pub attribution: &'static [ServiceLookup],
    /// The LB address whose ingress entry (its `ipMode`) applies.
    pub lb_address: LbAddress,
}

/// The shape of traffic that proves a kind's loop gone (probe-core's `resolution::proof`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProofShape {
    /// Calls *to* the loop's VIP and port from its clients, answered.
    To {
        /// The LB picks the backend node (a hairpin): an answer may only mean it picked
        /// another node, so only answers through the LB with no NAT here prove.
        lb_picks_backend: bool,
    },
    /// Connections *from* the loop's address (its VIP, else its source) to where its packets
    /// were dropped, answered.
    From {
        /// The loop's packets come from outside the node (the LB's health checks): a
        /// connection from that address made on the node is never theirs.
        from_outside: bool,
    },
    /// No answered call proves it: its proof is a reset entry, not an answer.
    Unprovable,
}

/// One way to find the Service a kind's event is about (probe-user's `kube::enrich`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceLookup {
    /// The Service whose frontend is the event's VIP and VIP port.
    Frontend,
    /// The Service whose NodePort (or healthCheckNodePort) is the event's destination port.
    NodePortOfDestination,
    /// The Service whose NodePort is the event's VIP port (a call to a node address).
    NodePortOfVipPort,
    /// The only Service whose LB IP is the event's source (several: none).
    OnlyOwnerOfSource,
    /// The only Service whose LB IP is the event's VIP (several: none).
    OnlyOwnerOfVip,
    /// Of the Services whose LB IP is the event's VIP, the one the service table named,
    /// else the only one.
    NamedOwnerOfVip,
}

/// Which of an event's addresses is the LB's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LbAddress {
    /// The event's VIP.
    Vip,
    /// The event's VIP, else its source (the LB's health checks come from the LB address).
    VipElseSource,
}

/// Every kind's row, in [`LoopbackKind::ALL`]'s order.
pub const KINDS: [KindSpec; 10] = [
    KindSpec {
        kind: LoopbackKind::Hairpin,
        name: "hairpin",
        column: "HAIRPIN",
        reason: "LoopbackHairpin",
        severity: 1,
        harm: 3,
        caller: Caller::Pod,
        node_testable: true,
        pod_testable: true,
        relates_client_pod: true,
        proof: ProofShape::To {
            lb_picks_backend: true,
        },
        attribution: &[
            ServiceLookup::Frontend,
            ServiceLookup::NodePortOfDestination,
        ],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::HealthcheckBlackhole,
        name: "healthcheck_blackhole",
        column: "HC-BLACKHOLE",
        reason: "HealthCheckBlackhole",
        severity: 0,
        harm: 4,
        caller: Caller::Lb,
        // The LB's own checks: only its next checks show it (verify waits for them).
        node_testable: false,
        pod_testable: false,
        relates_client_pod: false,
        proof: ProofShape::From { from_outside: true },
        // The check's destination is the NodePort (or healthCheckNodePort) on this node.
        attribution: &[
            ServiceLookup::NodePortOfDestination,
            ServiceLookup::OnlyOwnerOfSource,
        ],
        lb_address: LbAddress::VipElseSource,
    },
    KindSpec {
        kind: LoopbackKind::VipPortUnserved,
        name: "vip_port_unserved",
        column: "VIP-UNSERVED",
        reason: "VipPortUnserved",
        severity: 3,
        harm: 0,
        caller: Caller::PodIfNamed,
        node_testable: true,
        pod_testable: true,
        relates_client_pod: false,
        proof: ProofShape::To {
            lb_picks_backend: false,
        },
        // No Service serves the port: the one that owns the VIP (none when several do, unless
        // the service table named one of them).
        attribution: &[ServiceLookup::Frontend, ServiceLookup::NamedOwnerOfVip],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::VipAsSource,
        name: "vip_as_source",
        column: "VIP-AS-SOURCE",
        reason: "VipAsSource",
        severity: 2,
        harm: 1,
        caller: Caller::Node,
        node_testable: true,
        // The VIP as source is a node socket's.
        pod_testable: false,
        relates_client_pod: false,
        proof: ProofShape::From {
            from_outside: false,
        },
        attribution: &[
            ServiceLookup::Frontend,
            ServiceLookup::NodePortOfDestination,
            ServiceLookup::OnlyOwnerOfVip,
        ],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::ServiceSelfLoop,
        name: "service_self_loop",
        column: "SELF-LOOP",
        reason: "ServiceSelfLoop",
        severity: 1,
        harm: 2,
        caller: Caller::Pod,
        // A pod calling its own Service: never the node's call.
        node_testable: false,
        pod_testable: true,
        relates_client_pod: true,
        proof: ProofShape::To {
            lb_picks_backend: false,
        },
        attribution: &[ServiceLookup::Frontend, ServiceLookup::NodePortOfVipPort],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::EtpLocalDrop,
        name: "etp_local_drop",
        column: "ETP-LOCAL-DROP",
        reason: "EtpLocalDrop",
        severity: 1,
        harm: 2,
        caller: Caller::PodOrNode,
        node_testable: true,
        pod_testable: true,
        relates_client_pod: true,
        proof: ProofShape::To {
            lb_picks_backend: false,
        },
        // The LB or external IP and port kube-proxy dropped the call to.
        attribution: &[ServiceLookup::Frontend],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::ProxyProtocolShortCircuit,
        name: "proxy_protocol_short_circuit",
        column: "PROXY-PROTOCOL",
        reason: "ProxyProtocolShortCircuit",
        severity: 1,
        harm: 2,
        caller: Caller::Pod,
        node_testable: true,
        pod_testable: true,
        relates_client_pod: false,
        // Its proof is a reset entry, not an answered call.
        proof: ProofShape::Unprovable,
        // The address the pod called: a ClusterIP or LB IP, or a node address's NodePort.
        attribution: &[ServiceLookup::Frontend, ServiceLookup::OnlyOwnerOfVip],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::StaleUdpConntrack,
        name: "stale_udp_conntrack",
        column: "STALE-UDP-CT",
        reason: "StaleUdpConntrack",
        severity: 1,
        // Every datagram of one sender to one Service is lost, for as long as it sends.
        harm: 2,
        caller: Caller::PodOrNode,
        // Tripping it takes a rule change under a fixed-port sender: not a call verify makes.
        node_testable: false,
        pod_testable: false,
        relates_client_pod: false,
        // Its proof is a refreshed entry in a conntrack dump, not an answered call: it is
        // gone when the entry is (the remedy deletes it), and an answer to a new source port
        // says nothing about the sender's fixed one.
        proof: ProofShape::Unprovable,
        // The ClusterIP or LB IP:port the sender calls.
        attribution: &[ServiceLookup::Frontend, ServiceLookup::OnlyOwnerOfVip],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::SourceRangesDrop,
        name: "source_ranges_drop",
        column: "SOURCE-RANGES",
        reason: "SourceRangesDrop",
        // Every in-cluster caller of one LB IP:port outside its ranges fails, as with
        // kube-proxy's ETP Local drop.
        severity: 1,
        harm: 2,
        caller: Caller::PodOrNode,
        // kube-proxy's firewall chain runs in prerouting (a pod's call) and output (the
        // node's): both callers trip it, and both prove it gone when answered.
        node_testable: true,
        pod_testable: true,
        relates_client_pod: true,
        // Gone when calls to the LB IP:port from the same callers are answered (the ranges
        // now hold them, or the firewall element went).
        proof: ProofShape::To {
            lb_picks_backend: false,
        },
        // The LB IP and port kube-proxy's firewall guards.
        attribution: &[ServiceLookup::Frontend, ServiceLookup::NamedOwnerOfVip],
        lb_address: LbAddress::Vip,
    },
    KindSpec {
        kind: LoopbackKind::LbProbeRefused,
        name: "lb_probe_refused",
        column: "LB-PROBE",
        reason: "LbProbeRefused",
        // As the black-holed health check: the LB takes the node out (of every ETP Cluster
        // Service's backends for :10256, of one ETP Local Service's for its port).
        severity: 0,
        harm: 4,
        caller: Caller::Lb,
        // The LB's own probes: only its next probes show it.
        node_testable: false,
        pod_testable: false,
        relates_client_pod: false,
        // Gone when the probe's source is answered on the port.
        proof: ProofShape::From { from_outside: true },
        // A healthCheckNodePort names its Service; :10256 is every ETP Cluster Service's.
        attribution: &[ServiceLookup::NodePortOfDestination],
        lb_address: LbAddress::VipElseSource,
    },
];

/// Confirmations (reports, repeats included), by kind: the agent's `/status` (a kind
/// confirmed by a later look-up, `proxy_protocol_short_circuit` and `stale_udp_conntrack`, has no
/// count here).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KindCounts {
    pub healthcheck_blackhole: u64,
    pub hairpin: u64,
    pub vip_port_unserved: u64,
    pub vip_as_source: u64,
    pub service_self_loop: u64,
    pub etp_local_drop: u64,
    pub source_ranges_drop: u64,
    pub lb_probe_refused: u64,
}

/// Whether the looping flow was source-NATed on its way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnatState {
    Yes,
    No,
    /// Not known, or not applicable to the kind (health checks, unserved ports).
    Unknown,
}

/// What happened to the looping packet / connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The kernel dropped it (see `drop_reason`).
    Dropped,
    /// The client answered the asymmetric reply with a RST (conntrack state `CLOSE`).
    Reset,
    /// Nothing dropped it, but no usable reply came back.
    NoReply,
    /// The kernel refused it: TCP RST, or ICMP port unreachable for UDP.
    Refused,
}

impl Outcome {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Dropped => "dropped",
            Outcome::Reset => "reset",
            Outcome::NoReply => "no_reply",
            Outcome::Refused => "refused",
        }
    }
}

/// Layer of the LB listener a hairpin went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The LB forwarded the pod's own connection (same source port).
    L4,
    /// The LB opened a new connection (only the pod address and timing match).
    L7,
}

/// The aggregate key: repeats of one failure fold into one event whose `count` grows.
///
/// - `healthcheck_blackhole`: (VIP = packet source, node address, NodePort, proto). The
///   health check's source port is ignored: every check uses a new one.
/// - `hairpin`: (layer, pod address, VIP, VIP port, node address, NodePort, proto). Source
///   ports are ignored: every connection of the pod through the LB uses new ones.
/// - `vip_port_unserved`: (VIP, port, proto). The client and its port are ignored: the
///   failure is the port, whoever calls it (the event shows the latest client).
/// - `vip_as_source`: (VIP = packet source, destination address and port, proto). The source
///   port is ignored: every call uses a new one.
/// - `service_self_loop`: (where it died: the pod's namespace or the node, pod, its port the
///   Service sent it to, the Service address called when known, proto). The site keeps two
///   causes apart (the hairpin SNAT, the bridge's hairpin mode). The source port is ignored:
///   every call uses a new one.
/// - `etp_local_drop`: (the dropped IP, port, proto). The caller and its port are ignored: the
///   failure is kube-proxy's element, whoever calls it (the event shows the latest caller).
/// - `source_ranges_drop`: (the firewalled LB IP, port, proto). The caller and its port are
///   ignored: every caller outside the ranges is dropped the same (the event shows the latest).
/// - `lb_probe_refused`: (the node address, the probed port; TCP). The probe's source is
///   ignored: a provider probes from many addresses of its range (the event shows the latest).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AggregateKey {
    HealthcheckBlackhole {
        vip: IpAddr,
        node: IpAddr,
        node_port: u16,
        proto: Proto,
    },
    Hairpin {
        layer: Layer,
        pod: IpAddr,
        vip: IpAddr,
        vip_port: u16,
        node: IpAddr,
        node_port: u16,
        proto: Proto,
    },
    VipPortUnserved {
        vip: IpAddr,
        port: u16,
        proto: Proto,
    },
    VipAsSource {
        vip: IpAddr,
        dst: IpAddr,
        dst_port: u16,
        proto: Proto,
    },
    ServiceSelfLoop {
        /// Dropped in the pod's own namespace (else on the node).
        in_pod: bool,
        pod: IpAddr,
        port: u16,
        service: Option<(IpAddr, u16)>,
        proto: Proto,
    },
    EtpLocalDrop {
        addr: IpAddr,
        port: u16,
        proto: Proto,
    },
    SourceRangesDrop {
        addr: IpAddr,
        port: u16,
        proto: Proto,
    },
    LbProbeRefused {
        node: IpAddr,
        port: u16,
    },
    ProxyProtocolShortCircuit {
        /// The LB IP:port called.
        lb: IpAddr,
        lb_port: u16,
        /// The endpoint kube-proxy sent it to.
        endpoint: IpAddr,
        endpoint_port: u16,
    },
    StaleUdpConntrack {
        /// The sender, with its fixed source port.
        sender: IpAddr,
        sender_port: u16,
        /// The Service IP:port it sends to.
        service: IpAddr,
        service_port: u16,
    },
}

impl AggregateKey {
    pub fn kind(&self) -> LoopbackKind {
        match self {
            AggregateKey::HealthcheckBlackhole { .. } => LoopbackKind::HealthcheckBlackhole,
            AggregateKey::Hairpin { .. } => LoopbackKind::Hairpin,
            AggregateKey::VipPortUnserved { .. } => LoopbackKind::VipPortUnserved,
            AggregateKey::VipAsSource { .. } => LoopbackKind::VipAsSource,
            AggregateKey::ServiceSelfLoop { .. } => LoopbackKind::ServiceSelfLoop,
            AggregateKey::EtpLocalDrop { .. } => LoopbackKind::EtpLocalDrop,
            AggregateKey::ProxyProtocolShortCircuit { .. } => {
                LoopbackKind::ProxyProtocolShortCircuit
            }
            AggregateKey::StaleUdpConntrack { .. } => LoopbackKind::StaleUdpConntrack,
            AggregateKey::SourceRangesDrop { .. } => LoopbackKind::SourceRangesDrop,
            AggregateKey::LbProbeRefused { .. } => LoopbackKind::LbProbeRefused,
        }
    }
}

/// `ip:port`, with brackets for IPv6.
pub fn sock(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

impl fmt::Display for AggregateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggregateKey::HealthcheckBlackhole {
                vip,
                node,
                node_port,
                proto,
            } => write!(
                f,
                "healthcheck_blackhole/{vip}->{}/{}",
                sock(*node, *node_port),
                proto.as_str()
            ),
            AggregateKey::Hairpin {
                layer,
                pod,
                vip,
                vip_port,
                node,
                node_port,
                proto,
            } => write!(
                f,
                "hairpin/{}/{pod}->{}->{}/{}",
                match layer {
                    Layer::L4 => "l4",
                    Layer::L7 => "l7",
                },
                sock(*vip, *vip_port),
                sock(*node, *node_port),
                proto.as_str()
            ),
            // One address, port and protocol: the kind's name says which rule keyed it.
            AggregateKey::VipPortUnserved {
                vip: addr,
                port,
                proto,
            }
            | AggregateKey::EtpLocalDrop { addr, port, proto }
            | AggregateKey::SourceRangesDrop { addr, port, proto } => write!(
                f,
                "{}/{}/{}",
                self.kind().as_str(),
                sock(*addr, *port),
                proto.as_str()
            ),
            AggregateKey::VipAsSource {
                vip,
                dst,
                dst_port,
                proto,
            } => write!(
                f,
                "vip_as_source/{vip}->{}/{}",
                sock(*dst, *dst_port),
                proto.as_str()
            ),
            AggregateKey::ServiceSelfLoop {
                in_pod,
                pod,
                port,
                service,
                proto,
            } => write!(
                f,
                "service_self_loop/{}/{pod}->{}->{}/{}",
                if *in_pod { "pod" } else { "node" },
                service.map_or_else(|| "?".to_string(), |(ip, p)| sock(ip, p)),
                sock(*pod, *port),
                proto.as_str()
            ),
            AggregateKey::LbProbeRefused { node, port } => {
                write!(f, "lb_probe_refused/{}/tcp", sock(*node, *port))
            }
            AggregateKey::ProxyProtocolShortCircuit {
                lb,
                lb_port,
                endpoint,
                endpoint_port,
            } => write!(
                f,
                "proxy_protocol_short_circuit/{}->{}/tcp",
                sock(*lb, *lb_port),
                sock(*endpoint, *endpoint_port)
            ),
            AggregateKey::StaleUdpConntrack {
                sender,
                sender_port,
                service,
                service_port,
            } => write!(
                f,
                "stale_udp_conntrack/{}->{}/udp",
                sock(*sender, *sender_port),
                sock(*service, *service_port)
            ),
        }
    }
}

/// The socket on this node that serves a port (from sock_diag), and who owns it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Listener {
    /// The address the socket is bound to (`0.0.0.0` / `::` for every address).
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Proto,
    pub uid: u32,
    /// The socket's inode (`socket:[inode]` in the owner's /proc/PID/fd).
    pub inode: u32,
    /// The owning process's command name and pid, when /proc shows it.
    #[serde(default)]
    pub process: Option<String>,
    #[serde(default)]
    pub pid: Option<u32>,
    /// `namespace/name` of the host-network pod that declares this port, from the Kubernetes
    /// API (null without API access or when no pod declares it).
    #[serde(default)]
    pub pod: Option<String>,
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = match self.addr {
            IpAddr::V4(a) => format!("{a}:{}", self.port),
            IpAddr::V6(a) => format!("[{a}]:{}", self.port),
        };
        write!(f, "{} socket {at}", self.proto.as_str())?;
        match (&self.process, self.pid) {
            (Some(p), Some(pid)) => write!(f, " of process {p} (pid {pid}")?,
            _ => write!(f, " (owner process not visible")?,
        }
        write!(f, ", uid {}, inode {})", self.uid, self.inode)?;
        if let Some(pod) = &self.pod {
            write!(f, ", host-network pod {pod}")?;
        }
        Ok(())
    }
}

/// A confirmed loopback, aggregated over its repeats. Serialized as one JSON object.
///
/// `src`/`src_port`/`dst`/`dst_port` are the looping packet as the node received it (for
/// `vip_port_unserved`: the refused packet; for `service_self_loop`: the pod's call, also when
/// the packet dropped was its answer), from the latest occurrence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopbackEvent {
    pub kind: LoopbackKind,
    /// The aggregate key as text (see [`AggregateKey`]); stable across repeats.
    pub key: String,
    pub src: IpAddr,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dst_port: u16,
    /// The LB VIP involved: the health check's source, the hairpin's egress destination, the
    /// refused destination.
    pub vip: Option<IpAddr>,
    /// The VIP's listener port; null when unknown (health checks do not carry it).
    pub vip_port: Option<u16>,
    pub proto: Proto,
    /// Kernel drop reason name (without `SKB_DROP_REASON_`), when a drop was seen.
    pub drop_reason: Option<String>,
    /// Kernel drop site (`symbol+0xoff`), when known.
    pub drop_location: Option<String>,
    pub snat: SnatState,
    pub outcome: Outcome,
    /// Occurrences folded into this event so far (1 on the first report).
    pub count: u64,
    /// One fact a line: which kernel event, map record, conntrack entry or rule.
    pub evidence: Vec<String>,
    /// What to do about it, specific to the cause; one option a line.
    pub remedy: Vec<String>,
    /// CLOCK_MONOTONIC ns of the first and latest occurrence.
    pub first_seen_ns: u64,
    pub last_seen_ns: u64,
    /// Interface the looping packet arrived on, when known.
    pub nic: Option<String>,
    /// `namespace/name` of the Service involved, when the service table names it.
    pub service: Option<String>,
    /// `l4` / `l7` for hairpin; null for the other kinds.
    pub layer: Option<Layer>,
    /// `namespace/name` of the pod that sent the looping packet, from the Kubernetes API
    /// (attribution); null without API access or when the source is not a pod.
    #[serde(default)]
    pub client_pod: Option<String>,
    /// This node's Kubernetes name (attribution: `--node-name`); null when unknown.
    #[serde(default)]
    pub node: Option<String>,
    /// Ready fixes, best fit first (see [`crate::Fix`]); empty (and left out of the JSON) when
    /// the event names no Service or no fix fits its facts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<crate::Fix>,
    /// What the remedy was built from: the sender's kind, the local address's owner,
    /// `externalTrafficPolicy` as the rules and the API say, the Service from the API.
    #[serde(default)]
    pub facts: Facts,
    /// A hairpin to a host-network listener (a node address on a port that is no NodePort):
    /// the socket that serves that port on this node. Null for the other cases.
    #[serde(default)]
    pub listener: Option<Listener>,
}

/// One confirmation (new or repeat) of an aggregate, as the correlator publishes it to the hub
/// and every writer receives it. Metrics count every one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    /// The aggregate after this occurrence (its `count` includes it).
    pub event: LoopbackEvent,
    /// First occurrence of this aggregate (or first since it was forgotten).
    pub is_new: bool,
    /// Write a JSON line: false for a repeat within `json_repeat_ns` of the last line written.
    pub write_json: bool,
}

impl LoopbackEvent {
    /// An event of `kind` from `src` to `dst` with every other field empty: no key, count 0,
    /// SNAT unknown, times 0, no names, facts or fixes. The correlator's rules, `probe check`'s
    /// remedies and the tests set the rest with struct update syntax
    /// (`LoopbackEvent { vip: Some(ip), ..LoopbackEvent::between(..) }`), so the 26 fields are
    /// spelled once.
    pub fn between(
        kind: LoopbackKind,
        (src, src_port): (IpAddr, u16),
        (dst, dst_port): (IpAddr, u16),
        proto: Proto,
        outcome: Outcome,
    ) -> LoopbackEvent {
        LoopbackEvent {
            kind,
            key: String::new(),
            src,
            src_port,
            dst,
            dst_port,
            vip: None,
            vip_port: None,
            proto,
            drop_reason: None,
            drop_location: None,
            snat: SnatState::Unknown,
            outcome,
            count: 0,
            evidence: Vec::new(),
            remedy: Vec::new(),
            first_seen_ns: 0,
            last_seen_ns: 0,
            nic: None,
            service: None,
            layer: None,
            client_pod: None,
            node: None,
            fixes: Vec::new(),
            facts: Facts::default(),
            listener: None,
        }
    }
}
