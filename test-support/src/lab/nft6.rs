//! kube-proxy's nftables mode over IPv6, for the dual-stack layer ([`super::Lab::add_ipv6`] in
//! nftables mode): the table `ip6 kube-proxy` that kube-proxy's IPv6 proxier writes beside
//! `ip kube-proxy` (kubernetes `pkg/proxy/nftables/proxier.go`, read at 01d7de5464ba:
//! `NewDualStackProxier` makes one proxier per family; `setupNFTables` and `syncProxyRules`
//! write `ip6` for `ip` and `ipv6_addr` for `ipv4_addr`, with the same chains and maps), for
//! `default/web`'s IPv6 side: [VIP6]:80 (the LB IP, `ipMode: VIP`: an element of
//! `service-ips`) and NodePort 30080, both to pod-b's [IPv6]:8080. Chain names are kube-proxy's
//! hashes (the endpoint's with the address's colons as dots: "...__2001.db8.19.1..11/8080",
//! `servicePortEndpointChainNameBase`).

use anyhow::{Context, Result};

use super::{
    NODE_PORT, NS_NODE, POD_PORT, SERVICE_PORT,
    cmd::run_stdin,
    v6::{NODE_IP6, POD_B_IP6, VIP6},
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
	}}
	chain filter-output {{
		type filter hook output priority -110; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump firewall-check
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
