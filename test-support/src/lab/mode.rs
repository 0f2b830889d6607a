//! How kube-proxy programs the lab node's services: the modes the lab can build.

use super::{
    CLUSTER_IP, MODE_ENV, NODE_IP, NODE_PORT, Result, SERVICE_PORT, SocketAddrV4, VIP, bail, fmt,
};

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
