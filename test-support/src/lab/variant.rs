//! The node's switchable properties (variants) and the state of all of them.

use super::fmt;
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
    /// The VIP is held on the node's NIC as kube-vip holds it in ARP mode: `ip addr add
    /// <VIP>/32 dev eth0 preferred_lft 0` (kube-vip/kube-vip pkg/vip/address.go: `vip_cidr`
    /// 32, deprecated so it is never picked as a source). Exclusive with `vip-bound`.
    VipAnnounced,
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
    pub const ALL: [Variant; 9] = [
        Variant::VipBound,
        Variant::RpFilter,
        Variant::Masquerade,
        Variant::IpvsFilter,
        Variant::PeerNode,
        Variant::VipLocalRoute,
        Variant::VipAnnounced,
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
            Variant::VipAnnounced => "vip-announced",
            Variant::SelfSnatMissing => "self-snat-missing",
            Variant::BridgePod => "bridge-pod",
        }
    }
}

/// `Display` as the value's `name()`, for the lab's named enums.
macro_rules! display_as_name {
    ($($named:ty),*) => {$(
        impl fmt::Display for $named {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    )*};
}
pub(super) use display_as_name;

display_as_name!(Variant);

/// The state of every [`Variant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variants {
    pub vip_bound: bool,
    pub rp_filter: bool,
    pub masquerade: bool,
    pub ipvs_filter: bool,
    pub peer_node: bool,
    pub vip_local_route: bool,
    pub vip_announced: bool,
    pub self_snat_missing: bool,
    pub bridge_pod: bool,
}

impl Default for Variants {
    /// vip-bound on, everything else off.
    fn default() -> Self {
        Variants {
            vip_bound: true,
            ..Variants::OFF
        }
    }
}

impl Variants {
    /// All variants off.
    pub const OFF: Variants = Variants {
        vip_bound: false,
        rp_filter: false,
        masquerade: false,
        ipvs_filter: false,
        peer_node: false,
        vip_local_route: false,
        vip_announced: false,
        self_snat_missing: false,
        bridge_pod: false,
    };

    pub fn get(&self, v: Variant) -> bool {
        match v {
            Variant::VipBound => self.vip_bound,
            Variant::RpFilter => self.rp_filter,
            Variant::Masquerade => self.masquerade,
            Variant::IpvsFilter => self.ipvs_filter,
            Variant::PeerNode => self.peer_node,
            Variant::VipLocalRoute => self.vip_local_route,
            Variant::VipAnnounced => self.vip_announced,
            Variant::SelfSnatMissing => self.self_snat_missing,
            Variant::BridgePod => self.bridge_pod,
        }
    }

    pub const fn with(mut self, v: Variant, on: bool) -> Self {
        match v {
            Variant::VipBound => self.vip_bound = on,
            Variant::RpFilter => self.rp_filter = on,
            Variant::Masquerade => self.masquerade = on,
            Variant::IpvsFilter => self.ipvs_filter = on,
            Variant::PeerNode => self.peer_node = on,
            Variant::VipLocalRoute => self.vip_local_route = on,
            Variant::VipAnnounced => self.vip_announced = on,
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
