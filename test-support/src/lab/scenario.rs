//! The scenarios: the failures of DOMAIN.md and their healthy twins, how each drives its
//! traffic, what it must come to, and what a run of one saw.

use super::{
    Attempt, CLUSTER_IP, Context, Ipv4Addr, KubeProxyMode, NODE_IP, NODE_PORT, NS_CLIENT, NS_LB,
    NS_NODE, NS_PEER, NS_POD_A, NS_POD_B, POD_B_IP, POD_PORT, Result, SERVICE_PORT, SocketAddrV4,
    VIP, VIP_ETP_CLUSTER_PORT, VIP_ETP_LOCAL_PORT, VIP_HOST_LISTENER_PORT, VIP_NO_GUARD_PORT,
    VIP_TO_POD_PORT, VIP_UDP_PORT, VIP_UNSERVED_PORT, Variant, Variants, fmt,
};

/// What a TCP client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Connected and the server answered.
    Ok,
    /// The connect got a RST (ECONNREFUSED).
    Refused,
    /// The connection was reset (or closed without an answer).
    Reset,
    /// No answer within the timeout.
    Timeout,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Refused => "refused",
            Outcome::Reset => "reset",
            Outcome::Timeout => "timeout",
        }
    }
}

super::variant::display_as_name!(Outcome);

/// The failures and their healthy twins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Scenario {
    /// Failure 1: LB health check from the VIP to a node that binds the VIP.
    HealthcheckBlackhole,
    /// Twin of 1: the VIP is not bound.
    HealthcheckOk,
    /// Failure 2: pod A -> VIP:80, the LB sends it back to the node, the reply bypasses the LB.
    Hairpin,
    /// Failure 2 with strict rp_filter on the node.
    HairpinRpfilter,
    /// Twin of 2: pod egress masqueraded, the LB sends it to the peer.
    HairpinSnat,
    /// Failure 3: pod A -> VIP:443 while the VIP is bound for port 80 only.
    VipPortUnserved,
    /// Twin of 3: pod A -> VIP:80, served locally by the KUBE-SERVICES rule.
    VipPortServed,
    /// Twin: an outside client through the LB (VIP not bound).
    OutsideClient,
    /// An outside client through the LB while the node binds the VIP (still fine).
    OutsideClientVipBound,
    /// Twin: pod A -> pod B directly.
    PodToPod,
    /// Failure 3 under kube-proxy >= 1.25's IPVS access filter: KUBE-IPVS-FILTER REJECTs
    /// pod A -> VIP:443.
    VipPortUnservedFiltered,
    /// Twin: pod A -> VIP:80 with the access filter (the VIP:port is a service: RETURN).
    VipPortServedFiltered,
    /// VIP as source: the peer (a node with the VIP bound, ETP Local, no local endpoint)
    /// forwards a host-network call to the LB IP to pod B without SNAT; the node drops it.
    VipAsSource,
    /// Twin: the same call masqueraded to the peer's IP (ETP Cluster).
    VipAsSourceSnat,
    /// VIP as source, sending side: a host-network call on the node to VIP:8443 (ETP Local, no
    /// local endpoint) leaves unSNATed with the VIP as source to the pod on the peer, which
    /// binds the VIP and drops it.
    VipAsSourceOut,
    /// Twin: the node calls VIP:8444 (ETP Cluster): masqueraded, the peer's pod answers.
    VipAsSourceOutCluster,
    /// Failure 2, node-sourced: the node itself -> VIP:8081 (a listener without the guard),
    /// back to node:30080 with the node's own IP as source: dropped as a local source.
    HairpinNodeSourced,
    /// Twin: the node itself -> VIP:80 (the guarded listener): the LB picks the peer.
    NodeToLbGuarded,
    /// Failure 2, LB straight to a pod (VPC-CNI style): pod A -> VIP:8082 -> pod B:8080 on
    /// the same node; pod B's answer goes straight to pod A, which resets it.
    HairpinLbToPod,
    /// Twin: an outside client -> VIP:8082 -> pod B.
    OutsideClientLbToPod,
    /// Failure 2 over UDP: pod A -> VIP:53/udp -> node:30053/udp -> pod B; the answer comes
    /// from the node, not the VIP: the pod's resolver never sees it.
    HairpinUdp,
    /// Twin: an outside client -> VIP:53/udp -> node:30053 -> pod B, answered.
    OutsideClientUdp,
    /// Failure 2, host listener: pod A -> VIP:6443, an LB listener whose instance target is
    /// the node's own host-network listener on :6443 (no NodePort): back on the node with
    /// pod A as source; the listener answers pod A straight, which resets it.
    HairpinHostListener,
    /// The same from the node itself: back with the node's own IP as source, dropped as a
    /// local source.
    HairpinHostListenerNodeSourced,
    /// Twin: an outside client -> VIP:6443 -> the node's listener, answered.
    OutsideClientHostListener,
    /// Failure 1 with the VIP local through a `local` route (proto 66, no address), as the
    /// GCE guest agent makes LB IPs local: the LB's health check from the VIP is a martian.
    HealthcheckBlackholeLocalRoute,
    /// Failure 1 with the VIP held on the node's NIC as kube-vip holds it (a /32 with
    /// preferred_lft 0): the LB's health check from the VIP is a martian.
    HealthcheckBlackholeAnnounced,
    /// The sending side of `vip_as_source` with the VIP held on the node's NIC as kube-vip
    /// holds it (kube-vip/kube-vip#1086: the VIP unreachable from the node holding it): the
    /// node's call to VIP:8443 (ETP Local, endpoint only on the peer) leaves with the VIP as
    /// source and the peer drops it.
    VipAsSourceOutAnnounced,
    /// Twin: the same node's call to VIP:8444 (ETP Cluster): masqueraded, answered.
    VipAsSourceOutAnnouncedCluster,
    /// A pod reaches itself through its own Service: pod B -> ClusterIP:80 -> pod B without
    /// the hairpin SNAT; it comes back with its own address as source and pod B drops it.
    SelfLoop,
    /// Twin: the same call with kube-proxy's hairpin masquerade in place, answered.
    SelfLoopSnat,
    /// pod B behind a bridge with br_netfilter on and hairpin mode off: its call to its own
    /// ClusterIP is DNATed in the bridge and never leaves its bridge port (in IPVS mode, seen
    /// on 6.12: the reply is un-NATed in the bridge and dies at the same port).
    SelfLoopBridge,
}

/// How a scenario drives its traffic, and what it must come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScenarioSpec {
    /// The variants set before the traffic.
    pub variants: Variants,
    /// Namespace the client runs in.
    pub from_ns: &'static str,
    /// Source address the client binds (None: the kernel chooses).
    pub src: Option<Ipv4Addr>,
    pub dst: SocketAddrV4,
    pub expected: Outcome,
    /// One line on what happens.
    pub what: &'static str,
}

/// Only the VIP bound.
const BOUND: Variants = on(Variant::VipBound);
const HOST_LISTENER: SocketAddrV4 = SocketAddrV4::new(VIP, VIP_HOST_LISTENER_PORT);
const VIP80: SocketAddrV4 = SocketAddrV4::new(VIP, SERVICE_PORT);
const NODEPORT: SocketAddrV4 = SocketAddrV4::new(NODE_IP, NODE_PORT);

/// `v` on, every other variant off.
const fn on(v: Variant) -> Variants {
    Variants::OFF.with(v, true)
}

/// The VIP bound and `v` on.
const fn bound_and(v: Variant) -> Variants {
    BOUND.with(v, true)
}

/// One scenario: its name on the command line and its [`ScenarioSpec`].
struct Row {
    scenario: Scenario,
    name: &'static str,
    spec: ScenarioSpec,
}

/// Every scenario, in the order of [`Scenario`]'s variants (checked when compiled).
const ROWS: [Row; 32] = [
    Row {
        scenario: Scenario::HealthcheckBlackhole,
        name: "healthcheck-blackhole",
        spec: ScenarioSpec {
            variants: BOUND,
            from_ns: NS_LB,
            src: Some(VIP),
            dst: NODEPORT,
            expected: Outcome::Timeout,
            what: "LB health check VIP -> node:30080; the node owns the VIP: martian source, dropped",
        },
    },
    Row {
        scenario: Scenario::HealthcheckOk,
        name: "healthcheck-ok",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_LB,
            src: Some(VIP),
            dst: NODEPORT,
            expected: Outcome::Ok,
            what: "LB health check VIP -> node:30080; VIP not bound: served by pod-b",
        },
    },
    Row {
        scenario: Scenario::Hairpin,
        name: "hairpin",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_POD_A,
            src: None,
            dst: VIP80,
            expected: Outcome::Timeout,
            what: "pod-a -> VIP:80, LB DNATs back to node:30080 keeping the pod source; the reply \
                 comes from node:30080 straight to pod-a, which RSTs it; the SYN is retried",
        },
    },
    Row {
        scenario: Scenario::HairpinRpfilter,
        name: "hairpin-rpfilter",
        spec: ScenarioSpec {
            variants: on(Variant::RpFilter),
            from_ns: NS_POD_A,
            src: None,
            dst: VIP80,
            expected: Outcome::Timeout,
            what: "as hairpin, but the node's strict rp_filter drops the looped SYN on eth0",
        },
    },
    Row {
        scenario: Scenario::HairpinSnat,
        name: "hairpin-snat",
        spec: ScenarioSpec {
            variants: on(Variant::Masquerade),
            from_ns: NS_POD_A,
            src: None,
            dst: VIP80,
            expected: Outcome::Ok,
            what: "pod-a -> VIP:80 masqueraded to the node IP; the LB's guard sends it to the peer",
        },
    },
    Row {
        scenario: Scenario::VipPortUnserved,
        name: "vip-port-unserved",
        spec: ScenarioSpec {
            variants: BOUND,
            from_ns: NS_POD_A,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_UNSERVED_PORT),
            expected: Outcome::Refused,
            what: "pod-a -> VIP:443; the VIP is local and nothing serves 443: the node answers RST",
        },
    },
    Row {
        scenario: Scenario::VipPortServed,
        name: "vip-port-served",
        spec: ScenarioSpec {
            variants: BOUND,
            from_ns: NS_POD_A,
            src: None,
            dst: VIP80,
            expected: Outcome::Ok,
            what: "pod-a -> VIP:80, DNATed on the node by KUBE-SERVICES to pod-b",
        },
    },
    Row {
        scenario: Scenario::OutsideClient,
        name: "outside-client",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_CLIENT,
            src: None,
            dst: VIP80,
            expected: Outcome::Ok,
            what: "outside client -> VIP:80 -> LB -> node:30080 -> pod-b",
        },
    },
    Row {
        scenario: Scenario::OutsideClientVipBound,
        name: "outside-client-vip-bound",
        spec: ScenarioSpec {
            variants: BOUND,
            from_ns: NS_CLIENT,
            src: None,
            dst: VIP80,
            expected: Outcome::Ok,
            what: "outside client through the LB while the node binds the VIP: the packets carry \
                 neither the VIP as source nor a local source, so nothing loops",
        },
    },
    Row {
        scenario: Scenario::PodToPod,
        name: "pod-to-pod",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_POD_A,
            src: None,
            dst: SocketAddrV4::new(POD_B_IP, POD_PORT),
            expected: Outcome::Ok,
            what: "pod-a -> pod-b:8080 on the same node",
        },
    },
    Row {
        scenario: Scenario::VipPortUnservedFiltered,
        name: "vip-port-unserved-filtered",
        spec: ScenarioSpec {
            variants: bound_and(Variant::IpvsFilter),
            from_ns: NS_POD_A,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_UNSERVED_PORT),
            expected: Outcome::Refused,
            what: "pod-a -> VIP:443 under kube-proxy's IPVS access filter: KUBE-IPVS-FILTER \
                 REJECTs it (ICMP port unreachable)",
        },
    },
    Row {
        scenario: Scenario::VipPortServedFiltered,
        name: "vip-port-served-filtered",
        spec: ScenarioSpec {
            variants: bound_and(Variant::IpvsFilter),
            from_ns: NS_POD_A,
            src: None,
            dst: VIP80,
            expected: Outcome::Ok,
            what: "pod-a -> VIP:80 under the IPVS access filter: VIP:80 is a service, served",
        },
    },
    Row {
        scenario: Scenario::VipAsSource,
        name: "vip-as-source",
        spec: ScenarioSpec {
            variants: bound_and(Variant::PeerNode),
            from_ns: NS_PEER,
            src: Some(VIP),
            dst: SocketAddrV4::new(POD_B_IP, POD_PORT),
            expected: Outcome::Timeout,
            what: "the peer binds the VIP too and forwards a call to the LB IP to pod-b unSNATed \
                 (ETP Local, no local endpoint): source = VIP, the node drops it as martian",
        },
    },
    Row {
        scenario: Scenario::VipAsSourceSnat,
        name: "vip-as-source-snat",
        spec: ScenarioSpec {
            variants: bound_and(Variant::PeerNode),
            from_ns: NS_PEER,
            src: None,
            dst: SocketAddrV4::new(POD_B_IP, POD_PORT),
            expected: Outcome::Ok,
            what: "the same call masqueraded to the peer's IP (ETP Cluster): pod-b answers",
        },
    },
    Row {
        scenario: Scenario::VipAsSourceOut,
        name: "vip-as-source-out",
        spec: ScenarioSpec {
            variants: bound_and(Variant::PeerNode),
            from_ns: NS_NODE,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_ETP_LOCAL_PORT),
            expected: Outcome::Timeout,
            what: "the node calls VIP:8443 (ETP Local, endpoint only on the peer): it leaves with \
                 the VIP as source, unSNATed; the peer binds the VIP and drops it as martian",
        },
    },
    Row {
        scenario: Scenario::VipAsSourceOutCluster,
        name: "vip-as-source-out-cluster",
        spec: ScenarioSpec {
            variants: bound_and(Variant::PeerNode),
            from_ns: NS_NODE,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_ETP_CLUSTER_PORT),
            expected: Outcome::Ok,
            what: "the node calls VIP:8444 (ETP Cluster): masqueraded to the node IP, the peer's \
                 pod answers",
        },
    },
    Row {
        scenario: Scenario::HairpinNodeSourced,
        name: "hairpin-node-sourced",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_NODE,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_NO_GUARD_PORT),
            expected: Outcome::Timeout,
            what: "node -> VIP:8081, a listener without the source-node guard: the LB sends it back \
                 to node:30080 with the node's own IP as source; dropped as a local source",
        },
    },
    Row {
        scenario: Scenario::NodeToLbGuarded,
        name: "node-to-lb-guarded",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_NODE,
            src: None,
            dst: VIP80,
            expected: Outcome::Ok,
            what: "node -> VIP:80: the LB's guard never sends a request back to its source node; \
                 the peer answers",
        },
    },
    Row {
        scenario: Scenario::HairpinLbToPod,
        name: "hairpin-lb-to-pod",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_POD_A,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_TO_POD_PORT),
            expected: Outcome::Timeout,
            what: "pod-a -> VIP:8082, an LB listener that targets pod-b directly: back on the node \
                 with pod-a as source; pod-b answers pod-a straight, which RSTs it",
        },
    },
    Row {
        scenario: Scenario::OutsideClientLbToPod,
        name: "outside-client-lb-to-pod",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_CLIENT,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_TO_POD_PORT),
            expected: Outcome::Ok,
            what: "outside client -> VIP:8082 -> pod-b:8080",
        },
    },
    Row {
        scenario: Scenario::HairpinUdp,
        name: "hairpin-udp",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_POD_A,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_UDP_PORT),
            expected: Outcome::Timeout,
            what: "pod-a -> VIP:53/udp -> node:30053/udp keeping the pod source; pod-b's answer \
                 comes from node:30053, not the VIP: the pod's socket never takes it",
        },
    },
    Row {
        scenario: Scenario::OutsideClientUdp,
        name: "outside-client-udp",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_CLIENT,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_UDP_PORT),
            expected: Outcome::Ok,
            what: "outside client -> VIP:53/udp -> node:30053/udp -> pod-b:5353",
        },
    },
    Row {
        scenario: Scenario::HairpinHostListener,
        name: "hairpin-host-listener",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_POD_A,
            src: None,
            dst: HOST_LISTENER,
            expected: Outcome::Timeout,
            what: "pod-a -> VIP:6443, an LB listener targeting the node's own host listener \
                 node:6443 (no NodePort) keeping the pod source: the listener answers pod-a \
                 straight, which RSTs it",
        },
    },
    Row {
        scenario: Scenario::HairpinHostListenerNodeSourced,
        name: "hairpin-host-listener-node-sourced",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_NODE,
            src: None,
            dst: HOST_LISTENER,
            expected: Outcome::Timeout,
            what: "node -> VIP:6443 -> back to node:6443 with the node's own IP as source: dropped \
                 as a local source",
        },
    },
    Row {
        scenario: Scenario::OutsideClientHostListener,
        name: "outside-client-host-listener",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_CLIENT,
            src: None,
            dst: HOST_LISTENER,
            expected: Outcome::Ok,
            what: "outside client -> VIP:6443 -> the node's host listener, answered",
        },
    },
    Row {
        scenario: Scenario::HealthcheckBlackholeLocalRoute,
        name: "healthcheck-blackhole-local-route",
        spec: ScenarioSpec {
            variants: on(Variant::VipLocalRoute),
            from_ns: NS_LB,
            src: Some(VIP),
            dst: NODEPORT,
            expected: Outcome::Timeout,
            what: "LB health check VIP -> node:30080; the node has the VIP as a `local` route \
                 (proto 66, no address, as a cloud guest agent adds it): martian source, dropped",
        },
    },
    Row {
        scenario: Scenario::HealthcheckBlackholeAnnounced,
        name: "healthcheck-blackhole-announced",
        spec: ScenarioSpec {
            variants: on(Variant::VipAnnounced),
            from_ns: NS_LB,
            src: Some(VIP),
            dst: NODEPORT,
            expected: Outcome::Timeout,
            what: "LB health check VIP -> node:30080; the node holds the VIP on eth0 as kube-vip \
                 does (a /32, preferred_lft 0): martian source, dropped",
        },
    },
    Row {
        scenario: Scenario::VipAsSourceOutAnnounced,
        name: "vip-as-source-out-announced",
        spec: ScenarioSpec {
            variants: on(Variant::PeerNode).with(Variant::VipAnnounced, true),
            from_ns: NS_NODE,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_ETP_LOCAL_PORT),
            expected: Outcome::Timeout,
            what: "the node holds the VIP on eth0 as kube-vip does and calls VIP:8443 (ETP \
                 Local, endpoint only on the peer): it leaves with the VIP as source, the peer \
                 drops it as martian",
        },
    },
    Row {
        scenario: Scenario::VipAsSourceOutAnnouncedCluster,
        name: "vip-as-source-out-announced-cluster",
        spec: ScenarioSpec {
            variants: on(Variant::PeerNode).with(Variant::VipAnnounced, true),
            from_ns: NS_NODE,
            src: None,
            dst: SocketAddrV4::new(VIP, VIP_ETP_CLUSTER_PORT),
            expected: Outcome::Ok,
            what: "the node holds the VIP as kube-vip does and calls VIP:8444 (ETP Cluster): \
                 masqueraded to the node IP, the peer's pod answers",
        },
    },
    Row {
        scenario: Scenario::SelfLoop,
        name: "self-loop",
        spec: ScenarioSpec {
            variants: on(Variant::SelfSnatMissing),
            from_ns: NS_POD_B,
            src: None,
            dst: SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT),
            expected: Outcome::Timeout,
            what: "pod-b -> ClusterIP:80 -> pod-b:8080 without the hairpin masquerade: it arrives \
                 with pod-b's own address as source, pod-b drops it as a local source",
        },
    },
    Row {
        scenario: Scenario::SelfLoopSnat,
        name: "self-loop-snat",
        spec: ScenarioSpec {
            variants: Variants::OFF,
            from_ns: NS_POD_B,
            src: None,
            dst: SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT),
            expected: Outcome::Ok,
            what: "pod-b -> ClusterIP:80 -> pod-b:8080, masqueraded to the node's address: answered",
        },
    },
    Row {
        scenario: Scenario::SelfLoopBridge,
        name: "self-loop-bridge",
        spec: ScenarioSpec {
            variants: on(Variant::BridgePod),
            from_ns: NS_POD_B,
            src: None,
            dst: SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT),
            expected: Outcome::Timeout,
            what: "pod-b on bridge cbr0 (br_netfilter on, hairpin mode off) -> ClusterIP:80: \
                 DNATed back to pod-b in the bridge, which will not send it out the port it came \
                 in on",
        },
    },
];

impl Scenario {
    pub const ALL: [Scenario; ROWS.len()] = {
        let mut all = [Scenario::HealthcheckBlackhole; ROWS.len()];
        let mut i = 0;
        while i < ROWS.len() {
            assert!(
                ROWS[i].scenario as usize == i,
                "ROWS is out of Scenario's order"
            );
            all[i] = ROWS[i].scenario;
            i += 1;
        }
        all
    };

    fn row(self) -> &'static Row {
        &ROWS[self as usize]
    }

    /// Scenarios whose client speaks UDP (one datagram, one answer).
    pub fn udp(self) -> bool {
        matches!(self, Scenario::HairpinUdp | Scenario::OutsideClientUdp)
    }

    pub fn name(self) -> &'static str {
        self.row().name
    }

    pub fn spec(self) -> ScenarioSpec {
        self.row().spec
    }
}

impl Scenario {
    /// What the client sees in `mode`. In nftables mode no LB IP is bound on the node, so
    /// the failures that need a bound VIP cannot happen: the health check is answered, and
    /// VIP:443 reaches the LB and its outside backend.
    pub fn expected_in(self, mode: KubeProxyMode) -> Outcome {
        match (mode, self) {
            (
                KubeProxyMode::Nftables,
                Scenario::HealthcheckBlackhole | Scenario::VipPortUnserved,
            ) => Outcome::Ok,
            _ => self.spec().expected,
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Scenario {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        Scenario::ALL
            .into_iter()
            .find(|sc| sc.name() == s)
            .with_context(|| format!("unknown scenario {s:?}"))
    }
}

/// One run of a scenario: what it was expected to come to and what the client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioRun {
    pub scenario: Scenario,
    pub expected: Outcome,
    pub attempt: Attempt,
}

impl ScenarioRun {
    pub fn outcome(&self) -> Outcome {
        self.attempt.outcome
    }

    pub fn as_expected(&self) -> bool {
        self.attempt.outcome == self.expected
    }
}

impl fmt::Display for ScenarioRun {
    /// `<scenario>: <outcome> (expected <outcome>)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (expected {})",
            self.scenario, self.attempt.outcome, self.expected
        )
    }
}
