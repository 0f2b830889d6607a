//! kube-proxy's nftables mode over IPv6, for the dual-stack layer ([`super::Lab::add_ipv6`] in
//! nftables mode): the table `ip6 kube-proxy` that kube-proxy's IPv6 proxier writes beside
//! `ip kube-proxy` (kubernetes `pkg/proxy/nftables/proxier.go`, read at 01d7de5464ba:
//! `NewDualStackProxier` makes one proxier per family; `setupNFTables` and `syncProxyRules`
//! write `ip6` for `ip` and `ipv6_addr` for `ipv4_addr`, with the same chains and maps), for
//! `default/web`'s IPv6 side: [VIP6]:80 (the LB IP, `ipMode: VIP`: an element of
//! `service-ips`) and NodePort 30080, both to pod-b's [IPv6]:8080. Chain names are kube-proxy's
//! hashes (the endpoint's with the address's colons as dots: "...__2001.db8.19.1..11/8080",
//! `servicePortEndpointChainNameBase`).
//!
//! `default/web-local` over IPv6 ([`set_web_local6`]): [VIP6]:8445, externalTrafficPolicy
//! Local, as the IPv4 one of [`super::nft`]: without a local endpoint its LB IP:port is a
//! `drop` element of the `ip6` `no-endpoint-services`, and the lab's kube-proxy has no
//! local-traffic detector, so pod-a's call is never short-circuited.

use std::net::IpAddr;

use anyhow::{Context, Result};

use super::{
    NODE_PORT, NS_NODE, POD_PORT, SERVICE_PORT,
    cmd::run_stdin,
    nft::WebLocal,
    v6::{NODE_IP6, PEER_IP6, POD_B_IP6, VIP6},
};

/// The `external-` and `service-` chains of `default/web:http` (the same hash in both
/// families: it is of "default/web/tcp/http").
const EXTERNAL_CHAIN: &str = super::nft::NFT_EXTERNAL_CHAIN;
const SERVICE_CHAIN: &str = super::nft::NFT_SERVICE_CHAIN;
/// The `endpoint-` chain of pod-b's [IPv6]:8080.
pub const NFT6_ENDPOINT_CHAIN: &str =
    "endpoint-3BP42DYS-default/web/tcp/http__2001.db8.19.1..11/8080";

/// The table, as `nft -f` input.
fn kube_proxy_table6() -> String {
    format!(
        r#"table ip6 kube-proxy {{
	comment "rules for kube-proxy"
	set cluster-ips {{
		type ipv6_addr
		comment "Active ClusterIPs"
	}}
	set nodeport-ips {{
		type ipv6_addr
		comment "IPs that accept NodePort traffic"
		elements = {{ {NODE_IP6} }}
	}}
	map no-endpoint-services {{
		type ipv6_addr . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
	}}
	map no-endpoint-nodeports {{
		type inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to service nodeports with no endpoints"
	}}
	map firewall-ips {{
		type ipv6_addr . inet_proto . inet_service : verdict
		comment "destinations that are subject to LoadBalancerSourceRanges"
	}}
	map service-ips {{
		type ipv6_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = {{ {VIP6} . tcp . {SERVICE_PORT} : goto {EXTERNAL_CHAIN} }}
	}}
	map service-nodeports {{
		type inet_proto . inet_service : verdict
		comment "NodePort traffic"
		elements = {{ tcp . {NODE_PORT} : goto {EXTERNAL_CHAIN} }}
	}}
	chain filter-prerouting {{
		type filter hook prerouting priority -110; policy accept;
		ct state new jump firewall-check
	}}
	chain filter-input {{
		type filter hook input priority -110; policy accept;
		ct state new jump nodeport-endpoints-check
		ct state new jump service-endpoints-check
	}}
	chain filter-forward {{
		type filter hook forward priority -110; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump cluster-ips-check
	}}
	chain filter-output {{
		type filter hook output priority -110; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump firewall-check
	}}
	chain filter-output-post-dnat {{
		type filter hook output priority -90; policy accept;
		ct state new jump cluster-ips-check
	}}
	chain nat-prerouting {{
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}}
	chain nat-output {{
		type nat hook output priority -100; policy accept;
		jump services
	}}
	chain nat-postrouting {{
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}}
	chain cluster-ips-check {{
		ip6 daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
	}}
	chain firewall-check {{
		ip6 daddr . meta l4proto . th dport vmap @firewall-ips
	}}
	chain nodeport-endpoints-check {{
		ip6 daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
	}}
	chain service-endpoints-check {{
		ip6 daddr . meta l4proto . th dport vmap @no-endpoint-services
	}}
	chain reject-chain {{
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject
	}}
	chain mark-for-masquerade {{
		meta mark set meta mark | 0x00004000
	}}
	chain masquerading {{
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}}
	chain services {{
		ip6 daddr . meta l4proto . th dport vmap @service-ips
		ip6 daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
	}}
	chain {SERVICE_CHAIN} {{
		numgen random mod 1 vmap {{ 0 : goto {NFT6_ENDPOINT_CHAIN} }}
	}}
	chain {EXTERNAL_CHAIN} {{
		jump mark-for-masquerade
		goto {SERVICE_CHAIN}
	}}
	chain {NFT6_ENDPOINT_CHAIN} {{
		ip6 saddr {POD_B_IP6} jump mark-for-masquerade
		meta l4proto tcp dnat to [{POD_B_IP6}]:{POD_PORT}
	}}
}}
"#
    )
}

/// Loads the `ip6` table into the node.
pub(crate) fn load6() -> Result<()> {
    run_stdin(
        &["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"],
        &kube_proxy_table6(),
    )
    .context("loading kube-proxy's ip6 nftables table into clb-node")
    .map(drop)
}

/// `default/web-local`'s IPv6 endpoint chains: kube-proxy's hashes of its endpoints
/// ("...__2001.db8.19.1..11/8080" on pod-b, "...__2001.db8.18.1..2/30080" on the other node;
/// the Service's own chains are named as in the `ip` table).
const WEB_LOCAL_EP_POD_B: &str =
    "endpoint-GANM2U7W-default/web-local/tcp/http__2001.db8.19.1..11/8080";
const WEB_LOCAL_EP_REMOTE: &str =
    "endpoint-JJLQLVBM-default/web-local/tcp/http__2001.db8.18.1..2/30080";

/// The IPv6 side of `default/web-local`, written as [`super::nft`] writes the IPv4 side's
/// (kube-proxy's `syncProxyRules`): the node's own traffic short-circuited (`fib saddr type
/// local`), no pod short circuit (no local-traffic detector), the `local-` chain only with a
/// local endpoint (pod-b); else the cluster-wide endpoint is the other node's.
const WEB_LOCAL6: WebLocal = WebLocal {
    vip: IpAddr::V6(VIP6),
    pod_b: (WEB_LOCAL_EP_POD_B, IpAddr::V6(POD_B_IP6)),
    remote: (WEB_LOCAL_EP_REMOTE, IpAddr::V6(PEER_IP6)),
};

/// Whether `default/web-local`'s [VIP6]:8445 is a `drop` element of the `ip6`
/// `no-endpoint-services`.
pub fn web_local6_dropped() -> bool {
    WEB_LOCAL6.dropped()
}

/// Writes `default/web-local`'s IPv6 side ([`WebLocal::set`]): with `local_endpoint` pod-b is
/// its endpoint and pod-a's call is answered; without, the `drop` element of
/// `no-endpoint-services` is in place.
pub fn set_web_local6(local_endpoint: bool) -> Result<()> {
    WEB_LOCAL6.set(local_endpoint)
}
