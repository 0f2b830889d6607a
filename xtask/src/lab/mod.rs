//! The network-namespace lab: a Kubernetes node, a cloud LB, another node, two pods and an
//! outside client, wired so that the three load-balancer loopback failures of DOMAIN.md (and
//! their healthy twins) happen for real.
//!
//! Two kube-proxy modes ([`KubeProxyMode`], chosen by [`MODE_ENV`]): `iptables` (the default,
//! works on any kernel: kube-ipvs0 is a bridge with no ports standing in for kube-proxy's dummy,
//! services are kube-proxy's iptables-mode nat rules) and `ipvs` (a real `dummy` kube-ipvs0
//! holding the ClusterIP and, vip-bound, the VIP; IPVS virtual services made with `ipvsadm` as
//! kube-proxy's IPVS mode makes them, plus its ipsets and nat rules; needs a kernel with IPVS
//! and `dummy`, i.e. the VM tier).
//!
//! Nothing touches the host's namespace: every veth is created inside a lab namespace, and all
//! addresses come from ranges reserved for tests and documentation. Deleting the namespaces (after
//! killing the servers in them) removes everything, which is what [`Lab::down`] and the rollback of
//! a failed [`Lab::up`] do.

mod client;
pub(crate) mod cmd;
pub(crate) mod kube_proxy;
pub(crate) mod net;
pub mod nft;
pub(crate) mod servers;
pub(crate) mod switch;
mod udp;
pub mod v6;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub use client::{Attempt, connect_here, connect_in, http_get_in, in_netns};
pub use net::UP_STEPS;
pub use servers::SERVERS;
pub use switch::POD_BRIDGE;
pub use udp::{UDP_SERVERS, udp_exchange_in};

/// Every lab namespace's name starts with this.
pub const PREFIX: &str = "clb-";
/// The Kubernetes node.
pub const NS_NODE: &str = "clb-node";
/// The cloud load balancer.
pub const NS_LB: &str = "clb-lb";
/// Another node (the LB's other backend; also hosts the outside backend of VIP:443).
pub const NS_PEER: &str = "clb-peer";
/// Pod A on the node: the in-cluster client.
pub const NS_POD_A: &str = "clb-pod-a";
/// Pod B on the node: the endpoint of `default/web`.
pub const NS_POD_B: &str = "clb-pod-b";
/// A client outside the cluster, behind the LB.
pub const NS_CLIENT: &str = "clb-client";
/// All lab namespaces, in creation order.
pub const NAMESPACES: [&str; 6] = [NS_NODE, NS_LB, NS_PEER, NS_POD_A, NS_POD_B, NS_CLIENT];

/// The node's NIC (inside `clb-node`).
pub const NODE_NIC: &str = "eth0";
/// kube-ipvs0 inside `clb-node`: a bridge with no ports in iptables mode, a real `dummy` (left
/// down, like kube-proxy leaves it) in IPVS mode.
pub const KUBE_IPVS0: &str = "kube-ipvs0";
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const LB_NODE_SIDE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
pub const POD_A_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 10);
pub const POD_B_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 11);
/// The node-side address of the pod veths (the pods' onlink gateway).
pub const POD_GW_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 1);
pub const POD_CIDR: &str = "198.19.1.0/24";
/// kube-proxy's `--cluster-cidr`.
pub const CLUSTER_CIDR: &str = "198.19.0.0/16";
/// ClusterIP of `default/web`.
pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 10);
/// The LB VIP (LoadBalancer ingress IP of `default/web`).
pub const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
pub const SERVICE_PORT: u16 = 80;
/// A listener of the same LB that belongs to something outside the cluster.
pub const VIP_UNSERVED_PORT: u16 = 443;
pub const NODE_PORT: u16 = 30080;
pub const POD_PORT: u16 = 8080;
/// Where the LB sends VIP:443 (a server on the peer).
pub const PEER_TLS_PORT: u16 = 30443;
/// Variant `peer-node`: a pod on the peer, the only endpoint of the node's VIP:8443 / :8444.
pub const PEER_POD_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 10);
pub const PEER_POD_CIDR: &str = "198.19.2.0/24";
/// Variant `peer-node`: VIP port of an externalTrafficPolicy Local service without a local
/// endpoint (forwarded to [`PEER_POD_IP`] unSNATed).
pub const VIP_ETP_LOCAL_PORT: u16 = 8443;
/// Variant `peer-node`: the same with externalTrafficPolicy Cluster (masqueraded).
pub const VIP_ETP_CLUSTER_PORT: u16 = 8444;
/// A listener of the LB without its guard against sending a request back to the node it came
/// from (-> node:30080, client address kept): the node-sourced loop.
pub const VIP_NO_GUARD_PORT: u16 = 8081;
/// A listener of the LB that targets the pod directly (VPC-CNI style, -> pod-b:8080).
pub const VIP_TO_POD_PORT: u16 = 8082;
/// A listener of the LB whose instance target is a host-network process on the node's own
/// address (-> node:6443, the API server's port; no NodePort, client address kept, no
/// source-node guard): the host-listener hairpin, from a pod or from the node.
pub const VIP_HOST_LISTENER_PORT: u16 = 6443;
/// The node's host-network listener (a plain TCP server on the node, no Service).
pub const HOST_LISTENER_PORT: u16 = 6443;
/// Variant `vip-local-route`: the route protocol the GCE guest agent gives forwarding-rule IPs.
pub const GUEST_AGENT_ROUTE_PROTO: u8 = 66;
/// The LB's UDP listener (-> node's UDP NodePort, client address kept).
pub const VIP_UDP_PORT: u16 = 53;
/// `default/dns`'s UDP NodePort on the node.
pub const NODE_PORT_UDP: u16 = 30053;
/// pod-b's UDP server (the endpoint of `default/dns`).
pub const POD_UDP_PORT: u16 = 5353;
/// kube-proxy's chains for `default/web:http` (real kube-proxy hashes).
pub const KUBE_SVC_CHAIN: &str = "KUBE-SVC-CDGGSHYLG3RE2FKL";
pub const KUBE_EXT_CHAIN: &str = "KUBE-EXT-CDGGSHYLG3RE2FKL";
pub const KUBE_SEP_CHAIN: &str = "KUBE-SEP-4DRJRB6QQEGQJZEC";
/// The lab's pod-egress masquerade chain (nat POSTROUTING jumps to it; variant `masquerade`).
pub const MASQ_CHAIN: &str = "CLB-LAB-MASQ";
/// Environment: the kube-proxy mode of [`Lab::up`] / [`LabGuard::up`], `iptables` (default) or
/// `ipvs`.
pub const MODE_ENV: &str = "CLB_LAB_MODE";
/// IPVS mode: the scheduler of every virtual service (kube-proxy's default).
pub const IPVS_SCHEDULER: &str = "rr";
/// Environment hook: make `up` fail right after the named step (see [`UP_STEPS`]).
pub const FAIL_AFTER_ENV: &str = "CLB_LAB_FAIL_AFTER";
/// Default client connect (and answer) timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// How kube-proxy programs the node's services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum KubeProxyMode {
    /// kube-proxy's iptables mode (nat rules with DNAT); kube-ipvs0 is a bridge stand-in that
    /// only holds the VIP when it is bound. Works on any kernel.
    #[default]
    Iptables,
    /// kube-proxy's IPVS mode: a `dummy` kube-ipvs0 with the ClusterIP (and the VIP when
    /// bound), IPVS virtual services (`-m` masquerade to pod-b), kube-proxy's ipsets and nat
    /// rules. Needs IPVS and `dummy` in the kernel (the VM tier).
    Ipvs,
    /// kube-proxy's nftables mode: the table `ip kube-proxy` (`service-ips`,
    /// `service-nodeports`, `masquerading`, ...), no kube-ipvs0, no address bound; `vip-bound`
    /// puts the LB IP in `service-ips` (short-circuit) instead. See [`nft`].
    Nftables,
    /// No kube-proxy at all, as under Cilium's kube-proxy replacement: none of kube-proxy's
    /// rules, ipsets, tables or kube-ipvs0; Cilium's `cilium_host`/`cilium_net` veth pair in
    /// the node (what `probe check` recognizes Cilium by). Services are not served on the node
    /// (the lab has no eBPF dataplane): it is for judging the node, not for traffic. `vip-bound`
    /// cannot be set (nothing binds LB IPs here); `vip-local-route` can.
    Cilium,
}

impl KubeProxyMode {
    pub fn name(self) -> &'static str {
        match self {
            KubeProxyMode::Iptables => "iptables",
            KubeProxyMode::Ipvs => "ipvs",
            KubeProxyMode::Nftables => "nftables",
            KubeProxyMode::Cilium => "cilium",
        }
    }

    /// [`MODE_ENV`]: unset or empty is iptables; anything but `iptables`/`ipvs` is an error.
    pub fn from_env() -> Result<KubeProxyMode> {
        match std::env::var(MODE_ENV) {
            Ok(v) => KubeProxyMode::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(KubeProxyMode::Iptables),
            Err(e) => bail!("{MODE_ENV}: {e}"),
        }
    }

    pub fn parse(s: &str) -> Result<KubeProxyMode> {
        match s.trim() {
            "" | "iptables" => Ok(KubeProxyMode::Iptables),
            "ipvs" => Ok(KubeProxyMode::Ipvs),
            "nftables" => Ok(KubeProxyMode::Nftables),
            "cilium" => Ok(KubeProxyMode::Cilium),
            other => {
                bail!(
                    "{MODE_ENV}={other:?}: the lab's modes are `iptables`, `ipvs`, `nftables` and \
                     `cilium`"
                )
            }
        }
    }

    /// The IPVS virtual services the lab creates in this mode (each `-m` to pod-b:8080):
    /// ClusterIP:80, NodeIP:30080, and VIP:80 while the VIP is bound. None in iptables mode.
    pub fn virtual_services(self, vip_bound: bool) -> Vec<SocketAddrV4> {
        match self {
            KubeProxyMode::Iptables | KubeProxyMode::Nftables | KubeProxyMode::Cilium => Vec::new(),
            KubeProxyMode::Ipvs => {
                let mut v = vec![
                    SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT),
                    SocketAddrV4::new(NODE_IP, NODE_PORT),
                ];
                if vip_bound {
                    v.push(SocketAddrV4::new(VIP, SERVICE_PORT));
                }
                v
            }
        }
    }
}

impl fmt::Display for KubeProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One switchable property of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Variant {
    /// The VIP is bound to kube-ipvs0 and served locally for port 80 (IPVS-mode behaviour).
    VipBound,
    /// Strict reverse-path filtering on the node (all and eth0).
    RpFilter,
    /// Pod egress to eth0 is masqueraded to the node IP (chain CLB-LAB-MASQ).
    Masquerade,
    /// kube-proxy >= 1.25's IPVS access filter: filter chain `KUBE-IPVS-FILTER` (jumped from
    /// INPUT) and its ipsets, as kube-proxy writes them; REJECTs new connections to a
    /// kube-ipvs0 address on a port no service uses. Works in both modes (the iptables mode
    /// gets the ipsets it lacks).
    IpvsFilter,
    /// The peer node binds the VIP too (kube-ipvs0 on every node) and calls from it, and the
    /// LB's subnet does not validate sources (`accept_local` on its peer side), as a VPC does
    /// not: a call from the peer with the VIP as source reaches the node.
    PeerNode,
    /// The VIP is local on the node through a route, not an address: `ip route add local
    /// <VIP> dev eth0 proto 66 table local`, as the GCE guest agent makes forwarding-rule IPs
    /// local. Exclusive with `vip-bound` (its address brings its own local route).
    VipLocalRoute,
    /// kube-proxy's masquerade for pod-b calling its own Service is missing: the KUBE-SEP
    /// rule `-s pod-b -j KUBE-MARK-MASQ` (iptables), the endpoint chain's `ip saddr pod-b jump
    /// mark-for-masquerade` (nftables), the KUBE-LOOP-BACK entry (IPVS, kubernetes#134884).
    SelfSnatMissing,
    /// pod-b hangs off a bridge (`cbr0`, kubenet style) with br_netfilter on
    /// (`bridge-nf-call-iptables=1`) and hairpin mode off on its port (the kubelet's
    /// `--hairpin-mode=none`), instead of a routed veth.
    BridgePod,
}

impl Variant {
    pub const ALL: [Variant; 8] = [
        Variant::VipBound,
        Variant::RpFilter,
        Variant::Masquerade,
        Variant::IpvsFilter,
        Variant::PeerNode,
        Variant::VipLocalRoute,
        Variant::SelfSnatMissing,
        Variant::BridgePod,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::VipBound => "vip-bound",
            Variant::RpFilter => "rp-filter",
            Variant::Masquerade => "masquerade",
            Variant::IpvsFilter => "ipvs-filter",
            Variant::PeerNode => "peer-node",
            Variant::VipLocalRoute => "vip-local-route",
            Variant::SelfSnatMissing => "self-snat-missing",
            Variant::BridgePod => "bridge-pod",
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The state of every [`Variant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variants {
    pub vip_bound: bool,
    pub rp_filter: bool,
    pub masquerade: bool,
    pub ipvs_filter: bool,
    pub peer_node: bool,
    pub vip_local_route: bool,
    pub self_snat_missing: bool,
    pub bridge_pod: bool,
}

impl Default for Variants {
    /// vip-bound on, everything else off.
    fn default() -> Self {
        Variants {
            vip_bound: true,
            rp_filter: false,
            masquerade: false,
            ipvs_filter: false,
            peer_node: false,
            vip_local_route: false,
            self_snat_missing: false,
            bridge_pod: false,
        }
    }
}

impl Variants {
    pub fn get(&self, v: Variant) -> bool {
        match v {
            Variant::VipBound => self.vip_bound,
            Variant::RpFilter => self.rp_filter,
            Variant::Masquerade => self.masquerade,
            Variant::IpvsFilter => self.ipvs_filter,
            Variant::PeerNode => self.peer_node,
            Variant::VipLocalRoute => self.vip_local_route,
            Variant::SelfSnatMissing => self.self_snat_missing,
            Variant::BridgePod => self.bridge_pod,
        }
    }

    pub fn with(mut self, v: Variant, on: bool) -> Self {
        match v {
            Variant::VipBound => self.vip_bound = on,
            Variant::RpFilter => self.rp_filter = on,
            Variant::Masquerade => self.masquerade = on,
            Variant::IpvsFilter => self.ipvs_filter = on,
            Variant::PeerNode => self.peer_node = on,
            Variant::VipLocalRoute => self.vip_local_route = on,
            Variant::SelfSnatMissing => self.self_snat_missing = on,
            Variant::BridgePod => self.bridge_pod = on,
        }
        self
    }
}

impl fmt::Display for Variants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<String> = Variant::ALL
            .iter()
            .map(|v| format!("{v}={}", if self.get(*v) { "on" } else { "off" }))
            .collect();
        f.write_str(&words.join(" "))
    }
}

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

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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

impl Scenario {
    pub const ALL: [Scenario; 29] = [
        Scenario::HealthcheckBlackhole,
        Scenario::HealthcheckOk,
        Scenario::Hairpin,
        Scenario::HairpinRpfilter,
        Scenario::HairpinSnat,
        Scenario::VipPortUnserved,
        Scenario::VipPortServed,
        Scenario::OutsideClient,
        Scenario::OutsideClientVipBound,
        Scenario::PodToPod,
        Scenario::VipPortUnservedFiltered,
        Scenario::VipPortServedFiltered,
        Scenario::VipAsSource,
        Scenario::VipAsSourceSnat,
        Scenario::VipAsSourceOut,
        Scenario::VipAsSourceOutCluster,
        Scenario::HairpinNodeSourced,
        Scenario::NodeToLbGuarded,
        Scenario::HairpinLbToPod,
        Scenario::OutsideClientLbToPod,
        Scenario::HairpinUdp,
        Scenario::OutsideClientUdp,
        Scenario::HairpinHostListener,
        Scenario::HairpinHostListenerNodeSourced,
        Scenario::OutsideClientHostListener,
        Scenario::HealthcheckBlackholeLocalRoute,
        Scenario::SelfLoop,
        Scenario::SelfLoopSnat,
        Scenario::SelfLoopBridge,
    ];

    /// Scenarios whose client speaks UDP (one datagram, one answer).
    pub fn udp(self) -> bool {
        matches!(self, Scenario::HairpinUdp | Scenario::OutsideClientUdp)
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::HealthcheckBlackhole => "healthcheck-blackhole",
            Scenario::HealthcheckOk => "healthcheck-ok",
            Scenario::Hairpin => "hairpin",
            Scenario::HairpinRpfilter => "hairpin-rpfilter",
            Scenario::HairpinSnat => "hairpin-snat",
            Scenario::VipPortUnserved => "vip-port-unserved",
            Scenario::VipPortServed => "vip-port-served",
            Scenario::OutsideClient => "outside-client",
            Scenario::OutsideClientVipBound => "outside-client-vip-bound",
            Scenario::PodToPod => "pod-to-pod",
            Scenario::VipPortUnservedFiltered => "vip-port-unserved-filtered",
            Scenario::VipPortServedFiltered => "vip-port-served-filtered",
            Scenario::VipAsSource => "vip-as-source",
            Scenario::VipAsSourceSnat => "vip-as-source-snat",
            Scenario::VipAsSourceOut => "vip-as-source-out",
            Scenario::VipAsSourceOutCluster => "vip-as-source-out-cluster",
            Scenario::HairpinNodeSourced => "hairpin-node-sourced",
            Scenario::NodeToLbGuarded => "node-to-lb-guarded",
            Scenario::HairpinLbToPod => "hairpin-lb-to-pod",
            Scenario::OutsideClientLbToPod => "outside-client-lb-to-pod",
            Scenario::HairpinUdp => "hairpin-udp",
            Scenario::OutsideClientUdp => "outside-client-udp",
            Scenario::HairpinHostListener => "hairpin-host-listener",
            Scenario::HairpinHostListenerNodeSourced => "hairpin-host-listener-node-sourced",
            Scenario::OutsideClientHostListener => "outside-client-host-listener",
            Scenario::HealthcheckBlackholeLocalRoute => "healthcheck-blackhole-local-route",
            Scenario::SelfLoop => "self-loop",
            Scenario::SelfLoopSnat => "self-loop-snat",
            Scenario::SelfLoopBridge => "self-loop-bridge",
        }
    }

    pub fn spec(self) -> ScenarioSpec {
        let off = Variants {
            vip_bound: false,
            rp_filter: false,
            masquerade: false,
            ipvs_filter: false,
            peer_node: false,
            vip_local_route: false,
            self_snat_missing: false,
            bridge_pod: false,
        };
        let bound = off.with(Variant::VipBound, true);
        let host_listener = SocketAddrV4::new(VIP, VIP_HOST_LISTENER_PORT);
        let vip80 = SocketAddrV4::new(VIP, SERVICE_PORT);
        let nodeport = SocketAddrV4::new(NODE_IP, NODE_PORT);
        let s = |variants, from_ns, src, dst, expected, what| ScenarioSpec {
            variants,
            from_ns,
            src,
            dst,
            expected,
            what,
        };
        match self {
            Scenario::HealthcheckBlackhole => s(
                bound,
                NS_LB,
                Some(VIP),
                nodeport,
                Outcome::Timeout,
                "LB health check VIP -> node:30080; the node owns the VIP: martian source, dropped",
            ),
            Scenario::HealthcheckOk => s(
                off,
                NS_LB,
                Some(VIP),
                nodeport,
                Outcome::Ok,
                "LB health check VIP -> node:30080; VIP not bound: served by pod-b",
            ),
            Scenario::Hairpin => s(
                off,
                NS_POD_A,
                None,
                vip80,
                Outcome::Timeout,
                "pod-a -> VIP:80, LB DNATs back to node:30080 keeping the pod source; the reply \
                 comes from node:30080 straight to pod-a, which RSTs it; the SYN is retried",
            ),
            Scenario::HairpinRpfilter => s(
                off.with(Variant::RpFilter, true),
                NS_POD_A,
                None,
                vip80,
                Outcome::Timeout,
                "as hairpin, but the node's strict rp_filter drops the looped SYN on eth0",
            ),
            Scenario::HairpinSnat => s(
                off.with(Variant::Masquerade, true),
                NS_POD_A,
                None,
                vip80,
                Outcome::Ok,
                "pod-a -> VIP:80 masqueraded to the node IP; the LB's guard sends it to the peer",
            ),
            Scenario::VipPortUnserved => s(
                bound,
                NS_POD_A,
                None,
                SocketAddrV4::new(VIP, VIP_UNSERVED_PORT),
                Outcome::Refused,
                "pod-a -> VIP:443; the VIP is local and nothing serves 443: the node answers RST",
            ),
            Scenario::VipPortServed => s(
                bound,
                NS_POD_A,
                None,
                vip80,
                Outcome::Ok,
                "pod-a -> VIP:80, DNATed on the node by KUBE-SERVICES to pod-b",
            ),
            Scenario::OutsideClient => s(
                off,
                NS_CLIENT,
                None,
                vip80,
                Outcome::Ok,
                "outside client -> VIP:80 -> LB -> node:30080 -> pod-b",
            ),
            Scenario::OutsideClientVipBound => s(
                bound,
                NS_CLIENT,
                None,
                vip80,
                Outcome::Ok,
                "outside client through the LB while the node binds the VIP: the packets carry \
                 neither the VIP as source nor a local source, so nothing loops",
            ),
            Scenario::PodToPod => s(
                off,
                NS_POD_A,
                None,
                SocketAddrV4::new(POD_B_IP, POD_PORT),
                Outcome::Ok,
                "pod-a -> pod-b:8080 on the same node",
            ),
            Scenario::VipPortUnservedFiltered => s(
                bound.with(Variant::IpvsFilter, true),
                NS_POD_A,
                None,
                SocketAddrV4::new(VIP, VIP_UNSERVED_PORT),
                Outcome::Refused,
                "pod-a -> VIP:443 under kube-proxy's IPVS access filter: KUBE-IPVS-FILTER \
                 REJECTs it (ICMP port unreachable)",
            ),
            Scenario::VipPortServedFiltered => s(
                bound.with(Variant::IpvsFilter, true),
                NS_POD_A,
                None,
                vip80,
                Outcome::Ok,
                "pod-a -> VIP:80 under the IPVS access filter: VIP:80 is a service, served",
            ),
            Scenario::VipAsSource => s(
                bound.with(Variant::PeerNode, true),
                NS_PEER,
                Some(VIP),
                SocketAddrV4::new(POD_B_IP, POD_PORT),
                Outcome::Timeout,
                "the peer binds the VIP too and forwards a call to the LB IP to pod-b unSNATed \
                 (ETP Local, no local endpoint): source = VIP, the node drops it as martian",
            ),
            Scenario::VipAsSourceSnat => s(
                bound.with(Variant::PeerNode, true),
                NS_PEER,
                None,
                SocketAddrV4::new(POD_B_IP, POD_PORT),
                Outcome::Ok,
                "the same call masqueraded to the peer's IP (ETP Cluster): pod-b answers",
            ),
            Scenario::VipAsSourceOut => s(
                bound.with(Variant::PeerNode, true),
                NS_NODE,
                None,
                SocketAddrV4::new(VIP, VIP_ETP_LOCAL_PORT),
                Outcome::Timeout,
                "the node calls VIP:8443 (ETP Local, endpoint only on the peer): it leaves with \
                 the VIP as source, unSNATed; the peer binds the VIP and drops it as martian",
            ),
            Scenario::VipAsSourceOutCluster => s(
                bound.with(Variant::PeerNode, true),
                NS_NODE,
                None,
                SocketAddrV4::new(VIP, VIP_ETP_CLUSTER_PORT),
                Outcome::Ok,
                "the node calls VIP:8444 (ETP Cluster): masqueraded to the node IP, the peer's \
                 pod answers",
            ),
            Scenario::HairpinNodeSourced => s(
                off,
                NS_NODE,
                None,
                SocketAddrV4::new(VIP, VIP_NO_GUARD_PORT),
                Outcome::Timeout,
                "node -> VIP:8081, a listener without the source-node guard: the LB sends it back \
                 to node:30080 with the node's own IP as source; dropped as a local source",
            ),
            Scenario::NodeToLbGuarded => s(
                off,
                NS_NODE,
                None,
                vip80,
                Outcome::Ok,
                "node -> VIP:80: the LB's guard never sends a request back to its source node; \
                 the peer answers",
            ),
            Scenario::HairpinLbToPod => s(
                off,
                NS_POD_A,
                None,
                SocketAddrV4::new(VIP, VIP_TO_POD_PORT),
                Outcome::Timeout,
                "pod-a -> VIP:8082, an LB listener that targets pod-b directly: back on the node \
                 with pod-a as source; pod-b answers pod-a straight, which RSTs it",
            ),
            Scenario::OutsideClientLbToPod => s(
                off,
                NS_CLIENT,
                None,
                SocketAddrV4::new(VIP, VIP_TO_POD_PORT),
                Outcome::Ok,
                "outside client -> VIP:8082 -> pod-b:8080",
            ),
            Scenario::HairpinUdp => s(
                off,
                NS_POD_A,
                None,
                SocketAddrV4::new(VIP, VIP_UDP_PORT),
                Outcome::Timeout,
                "pod-a -> VIP:53/udp -> node:30053/udp keeping the pod source; pod-b's answer \
                 comes from node:30053, not the VIP: the pod's socket never takes it",
            ),
            Scenario::OutsideClientUdp => s(
                off,
                NS_CLIENT,
                None,
                SocketAddrV4::new(VIP, VIP_UDP_PORT),
                Outcome::Ok,
                "outside client -> VIP:53/udp -> node:30053/udp -> pod-b:5353",
            ),
            Scenario::HairpinHostListener => s(
                off,
                NS_POD_A,
                None,
                host_listener,
                Outcome::Timeout,
                "pod-a -> VIP:6443, an LB listener targeting the node's own host listener \
                 node:6443 (no NodePort) keeping the pod source: the listener answers pod-a \
                 straight, which RSTs it",
            ),
            Scenario::HairpinHostListenerNodeSourced => s(
                off,
                NS_NODE,
                None,
                host_listener,
                Outcome::Timeout,
                "node -> VIP:6443 -> back to node:6443 with the node's own IP as source: dropped \
                 as a local source",
            ),
            Scenario::OutsideClientHostListener => s(
                off,
                NS_CLIENT,
                None,
                host_listener,
                Outcome::Ok,
                "outside client -> VIP:6443 -> the node's host listener, answered",
            ),
            Scenario::HealthcheckBlackholeLocalRoute => s(
                off.with(Variant::VipLocalRoute, true),
                NS_LB,
                Some(VIP),
                nodeport,
                Outcome::Timeout,
                "LB health check VIP -> node:30080; the node has the VIP as a `local` route \
                 (proto 66, no address, as a cloud guest agent adds it): martian source, dropped",
            ),
            Scenario::SelfLoop => s(
                off.with(Variant::SelfSnatMissing, true),
                NS_POD_B,
                None,
                SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT),
                Outcome::Timeout,
                "pod-b -> ClusterIP:80 -> pod-b:8080 without the hairpin masquerade: it arrives \
                 with pod-b's own address as source, pod-b drops it as a local source",
            ),
            Scenario::SelfLoopSnat => s(
                off,
                NS_POD_B,
                None,
                SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT),
                Outcome::Ok,
                "pod-b -> ClusterIP:80 -> pod-b:8080, masqueraded to the node's address: answered",
            ),
            Scenario::SelfLoopBridge => s(
                off.with(Variant::BridgePod, true),
                NS_POD_B,
                None,
                SocketAddrV4::new(CLUSTER_IP, SERVICE_PORT),
                Outcome::Timeout,
                "pod-b on bridge cbr0 (br_netfilter on, hairpin mode off) -> ClusterIP:80: \
                 DNATed back to pod-b in the bridge, which will not send it out the port it came \
                 in on",
            ),
        }
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

/// The result of one scenario run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub scenario: Scenario,
    pub expected: Outcome,
    pub attempt: Attempt,
}

impl Report {
    pub fn outcome(&self) -> Outcome {
        self.attempt.outcome
    }

    pub fn as_expected(&self) -> bool {
        self.attempt.outcome == self.expected
    }
}

impl fmt::Display for Report {
    /// `<scenario>: <outcome> (expected <outcome>)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (expected {})",
            self.scenario, self.attempt.outcome, self.expected
        )
    }
}

/// Options of [`Lab::up_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpOptions {
    /// Fail (and roll back) right after this step of [`UP_STEPS`]; for tests.
    pub fail_after: Option<String>,
}

impl UpOptions {
    /// Reads [`FAIL_AFTER_ENV`].
    pub fn from_env() -> Self {
        UpOptions {
            fail_after: std::env::var(FAIL_AFTER_ENV).ok().filter(|s| !s.is_empty()),
        }
    }
}

/// What `status` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Every lab namespace and whether it exists.
    pub namespaces: Vec<(String, bool)>,
    /// `(namespace, "iface state addr...")` for the namespaces that exist.
    pub addresses: Vec<(String, Vec<String>)>,
    /// The variants, when the node exists.
    pub variants: Option<Variants>,
    /// The kube-proxy mode, when the node exists.
    pub mode: Option<KubeProxyMode>,
    /// Whether VIP:80 is served locally (goes with vip-bound): the KUBE-SERVICES rule in
    /// iptables mode, the IPVS virtual service in IPVS mode.
    pub vip_rule: Option<bool>,
    /// `(namespace, port, listening)` for every lab server.
    pub servers: Vec<(String, u16, bool)>,
}

impl Status {
    /// Every namespace exists.
    pub fn is_up(&self) -> bool {
        self.namespaces.iter().all(|(_, p)| *p)
    }

    /// No namespace exists.
    pub fn is_down(&self) -> bool {
        self.namespaces.iter().all(|(_, p)| !*p)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.is_up() {
            "up"
        } else if self.is_down() {
            "down"
        } else {
            "partial (run `cargo xtask lab down`)"
        };
        writeln!(f, "lab: {state}")?;
        for (ns, present) in &self.namespaces {
            writeln!(f, "  {ns}: {}", if *present { "present" } else { "absent" })?;
            if let Some((_, addrs)) = self.addresses.iter().find(|(n, _)| n == ns) {
                for a in addrs {
                    writeln!(f, "      {a}")?;
                }
            }
        }
        if let Some(m) = &self.mode {
            writeln!(f, "kube-proxy mode: {m}")?;
        }
        if let Some(v) = &self.variants {
            write!(f, "variants: {v}")?;
            let what = match self.mode {
                Some(KubeProxyMode::Ipvs) => "IPVS virtual service VIP:80",
                Some(KubeProxyMode::Nftables) => "service-ips element VIP:80",
                _ => "KUBE-SERVICES VIP:80 rule",
            };
            match self.vip_rule {
                Some(r) if r != v.vip_bound => writeln!(f, " (INCONSISTENT: {what} present={r})")?,
                _ => writeln!(f)?,
            }
        }
        for (ns, port, up) in &self.servers {
            writeln!(
                f,
                "server {ns}:{port}: {}",
                if *up { "listening" } else { "not running" }
            )?;
        }
        Ok(())
    }
}

/// What of a lab is left on this machine: lab namespaces, lab servers (by their command line) and
/// lab interfaces in the host's namespace (there should never be any). Empty after `down`.
pub fn leftovers() -> Result<Vec<String>> {
    let mut left: Vec<String> = net::existing_namespaces()?
        .into_iter()
        .filter(|n| NAMESPACES.contains(&n.as_str()))
        .map(|n| format!("namespace {n}"))
        .collect();
    for entry in std::fs::read_dir("/proc")
        .context("reading /proc")?
        .flatten()
    {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == servers::SERVER_TAG.as_bytes())
        {
            left.push(format!("process {}", entry.file_name().to_string_lossy()));
        }
    }
    let host_links = cmd::run(&["ip", "-o", "link", "show"])?;
    for line in host_links.lines() {
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if net::LAB_LINKS.contains(&name) {
            left.push(format!("host interface {name}"));
        }
    }
    Ok(left)
}

/// Whether this process runs as root (the lab needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid never fails.
    unsafe { libc::geteuid() == 0 }
}

/// A handle on the lab (the lab itself lives in the namespaces; this holds client settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lab {
    /// Client connect timeout (and answer timeout).
    pub timeout: Duration,
}

impl Default for Lab {
    fn default() -> Self {
        Lab {
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Lab {
    /// A handle on a lab that is (or will be) up, without touching anything.
    pub fn attach() -> Lab {
        Lab::default()
    }

    /// Builds the lab with the given variants (honours [`FAIL_AFTER_ENV`] and [`MODE_ENV`]).
    /// On failure everything it made is removed and the error returned.
    pub fn up(variants: &Variants) -> Result<Lab> {
        Lab::up_with(variants, &UpOptions::from_env())
    }

    /// [`Lab::up`] with explicit options (the mode from [`MODE_ENV`]).
    pub fn up_with(variants: &Variants, opts: &UpOptions) -> Result<Lab> {
        Lab::up_in(KubeProxyMode::from_env()?, variants, opts)
    }

    /// [`Lab::up_with`] in an explicit kube-proxy mode. IPVS mode fails before creating
    /// anything when the kernel lacks IPVS or `dummy` (or `ipvsadm`/`ipset` are missing).
    pub fn up_in(mode: KubeProxyMode, variants: &Variants, opts: &UpOptions) -> Result<Lab> {
        if !is_root() {
            bail!("the lab needs root (network namespaces, iptables)");
        }
        if mode == KubeProxyMode::Ipvs {
            net::require_ipvs_support()?;
        }
        let mut created = Vec::new();
        match net::build(mode, variants, opts, &mut created) {
            Ok(()) => Ok(Lab::default()),
            Err(e) => match net::remove_namespaces(&created) {
                Ok(()) => Err(e.context("lab up failed; everything it made was removed")),
                Err(rb) => {
                    Err(e.context(format!("lab up failed, and so did the rollback: {rb:#}")))
                }
            },
        }
    }

    /// Kills the lab's processes and deletes its namespaces (and with them every veth, address
    /// and rule). Idempotent; works on a partial lab.
    pub fn down() -> Result<()> {
        net::remove_namespaces(&NAMESPACES)
    }

    /// What exists now.
    pub fn status() -> Result<Status> {
        let have = net::existing_namespaces()?;
        let present = |ns: &str| have.iter().any(|h| h == ns);
        let mut st = Status {
            namespaces: NAMESPACES
                .iter()
                .map(|n| (n.to_string(), present(n)))
                .collect(),
            addresses: Vec::new(),
            mode: None,
            variants: None,
            vip_rule: None,
            servers: Vec::new(),
        };
        for ns in NAMESPACES.iter().filter(|n| present(n)) {
            st.addresses.push((ns.to_string(), net::addresses(ns)?));
        }
        if present(NS_NODE) {
            st.mode = kube_proxy::node_mode().ok();
            st.variants = switch::read_variants().ok();
            st.vip_rule = Some(switch::vip_rule_present());
        }
        for (ns, port, _) in SERVERS {
            let up = present(ns) && servers::listening(ns, *port)?;
            st.servers.push((ns.to_string(), *port, up));
        }
        Ok(st)
    }

    /// The kube-proxy mode of the lab that is up (from kube-ipvs0's link type).
    pub fn mode(&self) -> Result<KubeProxyMode> {
        net::require_up()?;
        kube_proxy::node_mode()
    }

    /// The variants as the node has them now.
    pub fn variants(&self) -> Result<Variants> {
        net::require_up()?;
        switch::read_variants()
    }

    /// Turns one variant on or off.
    pub fn set(&self, variant: Variant, on: bool) -> Result<()> {
        net::require_up()?;
        switch::set_variant(variant, on).with_context(|| format!("setting {variant} {on}"))
    }

    /// Sets every variant.
    pub fn set_all(&self, variants: &Variants) -> Result<()> {
        net::require_up()?;
        switch::set_variants(variants)
    }

    /// Hairpin mode on pod-b's bridge port (variant `bridge-pod`), as the kubelet's
    /// `--hairpin-mode=hairpin-veth` sets it.
    pub fn set_pod_b_hairpin_mode(&self, on: bool) -> Result<()> {
        net::require_up()?;
        switch::set_pod_b_hairpin_mode(on)
    }

    /// One TCP attempt from inside `ns` (bound to `src` if given), with this lab's timeout.
    pub fn connect(&self, ns: &str, src: Option<Ipv4Addr>, dst: SocketAddrV4) -> Result<Attempt> {
        connect_in(ns, src, dst, self.timeout)
    }

    /// Sets the scenario's variants, drives its traffic once, reports.
    pub fn run(&self, scenario: Scenario) -> Result<Report> {
        let spec = scenario.spec();
        let before = self.variants()?;
        self.set_all(&spec.variants)?;
        if before != spec.variants {
            // A node changes its addresses and rules long before traffic uses them; give
            // observers (the agent's address sync debounces 100 ms) the same head start.
            std::thread::sleep(SETTLE);
        }
        let expected = scenario.expected_in(kube_proxy::node_mode()?);
        let attempt = if scenario.udp() {
            udp_exchange_in(spec.from_ns, spec.src, spec.dst, self.timeout)
        } else {
            self.connect(spec.from_ns, spec.src, spec.dst)
        }
        .with_context(|| format!("scenario {scenario}"))?;
        Ok(Report {
            scenario,
            expected,
            attempt,
        })
    }

    /// [`Lab::run`], the outcome only.
    pub fn traffic(&self, scenario: Scenario) -> Result<Outcome> {
        Ok(self.run(scenario)?.outcome())
    }
}

/// The lock file that serializes users of the (one, fixed) lab across processes.
/// (`/run/clb-lab.lock` itself is left to people who wrap whole test runs in `flock`.)
pub const LOCK_PATH: &str = "/run/clb-lab.guard.lock";

/// How long [`Lab::run`] waits after changing variants before it drives traffic.
pub const SETTLE: Duration = Duration::from_millis(400);

/// An exclusive hold on the lab (flock on [`LOCK_PATH`]), released on drop. Tests in different
/// binaries (or threads) that use the lab take it, so they wait for each other instead of
/// tearing down each other's lab. [`LabGuard`] holds one.
#[derive(Debug)]
pub struct LabLock {
    _file: std::fs::File,
}

impl LabLock {
    /// Blocks until the lab is free.
    pub fn acquire() -> Result<LabLock> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_PATH)
            .with_context(|| format!("opening {LOCK_PATH}"))?;
        loop {
            // SAFETY: flock on a valid fd.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(LabLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                bail!("flock {LOCK_PATH}: {e}");
            }
        }
    }
}

/// Brings the lab up (after removing any leftover) and tears it down on drop, also when the
/// test holding it panics. Holds a [`LabLock`] from before `up` until after the teardown.
#[derive(Debug)]
pub struct LabGuard {
    lab: Lab,
    _lock: LabLock,
}

impl LabGuard {
    /// Takes the [`LabLock`], then `Lab::down()` and `Lab::up(variants)` in the mode of
    /// [`MODE_ENV`] (iptables unless it says `ipvs`).
    pub fn up(variants: &Variants) -> Result<LabGuard> {
        LabGuard::up_with(variants, &UpOptions::default())
    }

    pub fn up_with(variants: &Variants, opts: &UpOptions) -> Result<LabGuard> {
        LabGuard::up_in(KubeProxyMode::from_env()?, variants, opts)
    }

    /// [`LabGuard::up_with`] in an explicit kube-proxy mode.
    pub fn up_in(mode: KubeProxyMode, variants: &Variants, opts: &UpOptions) -> Result<LabGuard> {
        let lock = LabLock::acquire()?;
        Lab::down().context("removing a leftover lab")?;
        Ok(LabGuard {
            lab: Lab::up_in(mode, variants, opts)?,
            _lock: lock,
        })
    }
}

impl std::ops::Deref for LabGuard {
    type Target = Lab;

    fn deref(&self) -> &Lab {
        &self.lab
    }
}

impl std::ops::DerefMut for LabGuard {
    fn deref_mut(&mut self) -> &mut Lab {
        &mut self.lab
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Err(e) = Lab::down() {
            eprintln!("clb-lab: teardown failed: {e:#}");
        }
    }
}
