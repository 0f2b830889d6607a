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

use anyhow::{Context, Result};

use super::{
    NODE_PORT, NS_NODE, POD_PORT, SERVICE_PORT, VIP_NFT_ETP_LOCAL_PORT,
    cmd::{exec, run_stdin, succeeds},
    nft::{NFT_NO_ENDPOINT_SERVICES, NFT_TABLE},
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

/// `default/web-local`'s IPv6 chains: kube-proxy's hashes of "default/web-local/tcp/http" (as
/// in the `ip` table) and of its endpoints ("...__2001.db8.19.1..11/8080" on pod-b,
/// "...__2001.db8.18.1..2/30080" on the other node).
const WEB_LOCAL_SERVICE_CHAIN: &str = super::nft::NFT_WEB_LOCAL_SERVICE_CHAIN;
const WEB_LOCAL_EXTERNAL_CHAIN: &str = super::nft::NFT_WEB_LOCAL_EXTERNAL_CHAIN;
const WEB_LOCAL_LOCAL_CHAIN: &str = super::nft::NFT_WEB_LOCAL_LOCAL_CHAIN;
const WEB_LOCAL_EP_POD_B: &str =
    "endpoint-GANM2U7W-default/web-local/tcp/http__2001.db8.19.1..11/8080";
const WEB_LOCAL_EP_REMOTE: &str =
    "endpoint-JJLQLVBM-default/web-local/tcp/http__2001.db8.18.1..2/30080";

fn web_local_key6() -> String {
    format!("{{ {VIP6} . tcp . {VIP_NFT_ETP_LOCAL_PORT} }}")
}

fn has_element6(map: &str, key: &str) -> bool {
    succeeds(&[
        "ip", "netns", "exec", NS_NODE, "nft", "get", "element", "ip6", NFT_TABLE, map, key,
    ])
}

fn change_element6(verb: &str, map: &str, element: &str) -> Result<()> {
    exec(
        NS_NODE,
        &["nft", verb, "element", "ip6", NFT_TABLE, map, element],
    )
    .map(drop)
}

/// Whether `default/web-local`'s [VIP6]:8445 is a `drop` element of the `ip6`
/// `no-endpoint-services`.
pub fn web_local6_dropped() -> bool {
    has_element6(NFT_NO_ENDPOINT_SERVICES, &web_local_key6())
}

/// The chains of `default/web-local`'s IPv6 side, as [`super::nft`] writes the IPv4 side's
/// (kube-proxy's `syncProxyRules`): the node's own traffic short-circuited (`fib saddr type
/// local`), no pod short circuit (no local-traffic detector), the `local-` chain only with a
/// local endpoint (pod-b); else the cluster-wide endpoint is the other node's.
fn web_local_rules6(local_endpoint: bool) -> String {
    let t = NFT_TABLE;
    let (svc, ext, local) = (
        WEB_LOCAL_SERVICE_CHAIN,
        WEB_LOCAL_EXTERNAL_CHAIN,
        WEB_LOCAL_LOCAL_CHAIN,
    );
    let (ep_b, ep_r) = (WEB_LOCAL_EP_POD_B, WEB_LOCAL_EP_REMOTE);
    let mut s = String::new();
    for c in [svc, ext, local, ep_b, ep_r] {
        s += &format!("add chain ip6 {t} {c}\nflush chain ip6 {t} {c}\n");
    }
    s += &format!("add rule ip6 {t} {ep_b} ip6 saddr {POD_B_IP6} jump mark-for-masquerade\n");
    s += &format!("add rule ip6 {t} {ep_b} meta l4proto tcp dnat to [{POD_B_IP6}]:{POD_PORT}\n");
    s += &format!("add rule ip6 {t} {ep_r} ip6 saddr {PEER_IP6} jump mark-for-masquerade\n");
    s += &format!("add rule ip6 {t} {ep_r} meta l4proto tcp dnat to [{PEER_IP6}]:{NODE_PORT}\n");
    let cluster_ep = if local_endpoint { ep_b } else { ep_r };
    s += &format!("add rule ip6 {t} {svc} numgen random mod 1 vmap {{ 0 : goto {cluster_ep} }}\n");
    s += &format!(
        "add rule ip6 {t} {ext} fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n"
    );
    s += &format!(
        "add rule ip6 {t} {ext} fib saddr type local goto {svc} comment \"short-circuit local traffic\"\n"
    );
    if local_endpoint {
        s += &format!("add rule ip6 {t} {local} numgen random mod 1 vmap {{ 0 : goto {ep_b} }}\n");
        s += &format!("add rule ip6 {t} {ext} goto {local}\n");
    }
    s
}

/// Writes `default/web-local`'s IPv6 side (see [`web_local_rules6`]): with `local_endpoint`
/// pod-b is its endpoint and pod-a's call is answered; without, the `drop` element of
/// `no-endpoint-services` is in place. Chains are flushed and rewritten, never deleted (as
/// [`super::nft`] does).
pub fn set_web_local6(local_endpoint: bool) -> Result<()> {
    let key = web_local_key6();
    for map in ["service-ips", NFT_NO_ENDPOINT_SERVICES] {
        if has_element6(map, &key) {
            change_element6("delete", map, &key)?;
        }
    }
    run_stdin(
        &["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"],
        &web_local_rules6(local_endpoint),
    )
    .context("writing default/web-local's ip6 chains")?;
    let service_ip =
        format!("{{ {VIP6} . tcp . {VIP_NFT_ETP_LOCAL_PORT} : goto {WEB_LOCAL_EXTERNAL_CHAIN} }}");
    change_element6("add", "service-ips", &service_ip)?;
    if !local_endpoint {
        let drop = format!(
            "{{ {VIP6} . tcp . {VIP_NFT_ETP_LOCAL_PORT} comment \"default/web-local:http\" : drop }}"
        );
        change_element6("add", NFT_NO_ENDPOINT_SERVICES, &drop)?;
    }
    Ok(())
}
