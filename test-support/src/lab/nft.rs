//! kube-proxy's nftables mode for the lab: the table `ip kube-proxy` as kube-proxy (1.33)
//! writes it for `default/web` port `http` (chain hashes are kube-proxy's own:
//! base32(sha256("default/web/tcp/http"))[:8], and for the endpoint the same with
//! "__198.19.1.11/8080" appended), loaded with `nft -f`.
//!
//! No LB IP is bound anywhere in this mode (kube-proxy's nftables mode binds nothing). The
//! `vip-bound` variant means here what `ipMode: VIP` (the default) means to kube-proxy: the LB
//! IP is an element of `service-ips`, so in-cluster calls to it are DNATed on the node (short-
//! circuited). Off, it is left out, as kube-proxy does for `ipMode: Proxy` or a LB published
//! as a hostname: in-cluster calls then really go to the LB.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};

use super::{
    NODE_PORT, NS_NODE, PEER_POD_IP, POD_B_IP, POD_PORT, SERVICE_PORT, VIP, VIP_NFT_ETP_LOCAL_PORT,
    cmd::{exec, run_stdin, succeeds},
};

/// kube-proxy's table name (family `ip`).
pub const NFT_TABLE: &str = "kube-proxy";
/// The `external-` chain of `default/web:http` (LB IPs and the NodePort go through it).
pub const NFT_EXTERNAL_CHAIN: &str = "external-SUSTUHLJ-default/web/tcp/http";
/// The `endpoint-` chain of `default/web:http`'s endpoint pod-b:8080.
pub const NFT_ENDPOINT_CHAIN: &str = "endpoint-DNOLUD2M-default/web/tcp/http__198.19.1.11/8080";
/// The `service-` chain of `default/web:http` (its ClusterIP).
pub const NFT_SERVICE_CHAIN: &str = "service-SUSTUHLJ-default/web/tcp/http";

/// The table, as `nft -f` input.
pub(crate) fn kube_proxy_table() -> String {
    KUBE_PROXY_NFT.to_string()
}

const KUBE_PROXY_NFT: &str = r#"table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 198.18.100.10 }
	}
	set nodeport-ips {
		type ipv4_addr
		comment "IPs that accept NodePort traffic"
		elements = { 198.18.0.2 }
	}
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
	}
	map no-endpoint-nodeports {
		type inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to service nodeports with no endpoints"
	}
	map firewall-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "destinations that are subject to LoadBalancerSourceRanges"
	}
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 198.18.100.10 . tcp . 80 : goto service-SUSTUHLJ-default/web/tcp/http }
	}
	map service-nodeports {
		type inet_proto . inet_service : verdict
		comment "NodePort traffic"
		elements = { tcp . 30080 : goto external-SUSTUHLJ-default/web/tcp/http }
	}
	chain filter-prerouting {
		type filter hook prerouting priority -110; policy accept;
		ct state new jump firewall-check
	}
	chain filter-input {
		type filter hook input priority -110; policy accept;
		ct state new jump nodeport-endpoints-check
		ct state new jump service-endpoints-check
	}
	chain filter-forward {
		type filter hook forward priority -110; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump cluster-ips-check
	}
	chain filter-output {
		type filter hook output priority -110; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump firewall-check
	}
	chain filter-output-post-dnat {
		type filter hook output priority -90; policy accept;
		ct state new jump cluster-ips-check
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}
	chain cluster-ips-check {
		ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
	}
	chain firewall-check {
		ip daddr . meta l4proto . th dport vmap @firewall-ips
	}
	chain nodeport-endpoints-check {
		ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
	}
	chain service-endpoints-check {
		ip daddr . meta l4proto . th dport vmap @no-endpoint-services
	}
	chain reject-chain {
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject
	}
	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}
	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
		ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
	}
	chain service-SUSTUHLJ-default/web/tcp/http {
		ip daddr 198.18.100.10 tcp dport 80 ip saddr != 198.19.0.0/16 jump mark-for-masquerade
		numgen random mod 1 vmap { 0 : goto endpoint-DNOLUD2M-default/web/tcp/http__198.19.1.11/8080 }
	}
	chain external-SUSTUHLJ-default/web/tcp/http {
		jump mark-for-masquerade
		goto service-SUSTUHLJ-default/web/tcp/http
	}
	chain endpoint-DNOLUD2M-default/web/tcp/http__198.19.1.11/8080 {
		ip saddr 198.19.1.11 jump mark-for-masquerade
		meta l4proto tcp dnat to 198.19.1.11:8080
	}
}
"#;

/// Loads the table into the node.
pub(crate) fn load() -> Result<()> {
    run_stdin(
        &["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"],
        &kube_proxy_table(),
    )
    .context("loading kube-proxy's nftables table into clb-node")
    .map(drop)
}

/// Whether the node has kube-proxy's nftables table (the lab is in nftables mode).
pub(crate) fn present() -> bool {
    succeeds(&[
        "ip", "netns", "exec", NS_NODE, "nft", "list", "table", "ip", NFT_TABLE,
    ])
}

fn lb_element() -> String {
    format!("{{ {VIP} . tcp . {SERVICE_PORT} : goto {NFT_EXTERNAL_CHAIN} }}")
}

/// Whether the LB IP is an element of `service-ips` (short-circuited, `ipMode: VIP`).
pub(crate) fn lb_ip_short_circuited() -> bool {
    has_element(SERVICE_IPS_MAP, &lb_key())
}

/// The LB IP's key in kube-proxy's maps: `{ VIP . tcp . 80 }`.
fn lb_key() -> String {
    format!("{{ {VIP} . tcp . {SERVICE_PORT} }}")
}

/// Adds or removes the LB IP's `service-ips` element.
pub(crate) fn set_lb_ip_short_circuited(on: bool) -> Result<()> {
    if on == lb_ip_short_circuited() {
        return Ok(());
    }
    if on {
        change_element("add", SERVICE_IPS_MAP, &lb_element())
    } else {
        change_element("delete", SERVICE_IPS_MAP, &lb_key())
    }
}

/// `nft <verb> element` (`add`, `delete`) of kube-proxy's `ip` table's `map`, in the node.
fn change_element(verb: &str, map: &str, element: &str) -> Result<()> {
    change_element_in("ip", verb, map, element)
}

/// [`change_element`] in kube-proxy's table of nft family `family` (`ip`, `ip6`).
fn change_element_in(family: &str, verb: &str, map: &str, element: &str) -> Result<()> {
    exec(
        NS_NODE,
        &["nft", verb, "element", family, NFT_TABLE, map, element],
    )
    .map(drop)
}

/// `default/web-local`'s chains: kube-proxy's hashes of "default/web-local/tcp/http" and of
/// its endpoints ("...__198.19.1.11/8080" on pod-b, "...__198.19.2.10/30080" on another node).
pub const NFT_WEB_LOCAL_SERVICE_CHAIN: &str = "service-MW3VTDQO-default/web-local/tcp/http";
pub const NFT_WEB_LOCAL_EXTERNAL_CHAIN: &str = "external-MW3VTDQO-default/web-local/tcp/http";
pub const NFT_WEB_LOCAL_LOCAL_CHAIN: &str = "local-MW3VTDQO-default/web-local/tcp/http";
const NFT_WEB_LOCAL_EP_POD_B: &str =
    "endpoint-QL4FIQQY-default/web-local/tcp/http__198.19.1.11/8080";
const NFT_WEB_LOCAL_EP_REMOTE: &str =
    "endpoint-6PGTBTN2-default/web-local/tcp/http__198.19.2.10/30080";
/// kube-proxy's map of destinations without (usable) endpoints.
pub const NFT_NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";

fn has_element(map: &str, key: &str) -> bool {
    has_element_in("ip", map, key)
}

/// Whether kube-proxy's table of nft family `family` has `key` in `map`.
fn has_element_in(family: &str, map: &str, key: &str) -> bool {
    succeeds(&[
        "ip", "netns", "exec", NS_NODE, "nft", "get", "element", family, NFT_TABLE, map, key,
    ])
}

/// Whether `default/web-local`'s LB IP:port is a `drop` element of `no-endpoint-services`.
pub fn web_local_dropped() -> bool {
    WEB_LOCAL.dropped()
}

/// One family's side of `default/web-local` (LB IP:8445, externalTrafficPolicy Local): its LB
/// IP and its two endpoints, each an `endpoint-` chain and an address: pod-b (the local one,
/// on [`POD_PORT`]) and the other node's (the cluster-wide one without it, its NodePort
/// [`NODE_PORT`]). The Service's own chains are named by a hash of
/// "default/web-local/tcp/http": the same in both families.
pub(crate) struct WebLocal {
    pub vip: IpAddr,
    pub pod_b: (&'static str, IpAddr),
    pub remote: (&'static str, IpAddr),
}

/// The IPv4 side ([`super::nft6`] has the IPv6 one).
const WEB_LOCAL: WebLocal = WebLocal {
    vip: IpAddr::V4(VIP),
    pod_b: (NFT_WEB_LOCAL_EP_POD_B, IpAddr::V4(POD_B_IP)),
    remote: (NFT_WEB_LOCAL_EP_REMOTE, IpAddr::V4(PEER_POD_IP)),
};

/// The rules of `default/web-local` (LB IP VIP:8445, externalTrafficPolicy Local, no
/// ClusterIP rules: nothing here calls it) as kube-proxy's nftables proxier writes them
/// (kubernetes/kubernetes `pkg/proxy/nftables/proxier.go`, `syncProxyRules`, read at
/// 01d7de5464ba): the LB IP is an element of `service-ips` whenever the Service has endpoints
/// anywhere (`goto external-...`), and, when the node has no local endpoint
/// (`!hasExternalEndpoints`), also an element of `no-endpoint-services` with verdict `drop`
/// ("DROP anything that didn't get short-circuited by the EXT chain"). The `external-` chain
/// of an ETP Local Service short-circuits the node's own traffic (`fib saddr type local`) to
/// the cluster-wide `service-` chain and falls through to `local-` only when there are local
/// endpoints. The "short-circuit pod traffic" rule (`ip saddr <cluster CIDR> goto service-`)
/// is written only when kube-proxy has a local-traffic detector
/// (`proxier.localDetector.IsImplemented()`); the lab's kube-proxy has none (e.g.
/// `--detect-local-mode=ClusterCIDR` without `--cluster-cidr`), so pod-a's call is never
/// DNATed and dies in `filter-forward` (`service-endpoints-check`, priority -110).
///
/// Before kubernetes#132456 (in 1.34, cherry-picked to 1.33 by #133969) the filter chains run
/// at priority -110, before DNAT, so the node's own call to the LB IP dies in `filter-output`
/// too; after it they run at priority 0 (kubernetes#131765). The lab's table is the pre-fix
/// one.
impl WebLocal {
    /// The nft family of kube-proxy's table for the LB IP (`ip`, `ip6`): also the keyword of
    /// its address matches.
    fn family(&self) -> &'static str {
        if self.vip.is_ipv4() { "ip" } else { "ip6" }
    }

    /// The LB IP:port's key in kube-proxy's maps.
    fn key(&self) -> String {
        format!("{{ {} . tcp . {VIP_NFT_ETP_LOCAL_PORT} }}", self.vip)
    }

    /// Whether the LB IP:port is a `drop` element of `no-endpoint-services`.
    pub(crate) fn dropped(&self) -> bool {
        has_element_in(self.family(), NFT_NO_ENDPOINT_SERVICES, &self.key())
    }

    /// The Service's chains as `nft -f` input, as kube-proxy writes them (above).
    fn rules(&self, local_endpoint: bool) -> String {
        let (f, t) = (self.family(), NFT_TABLE);
        let (svc, ext, local) = (
            NFT_WEB_LOCAL_SERVICE_CHAIN,
            NFT_WEB_LOCAL_EXTERNAL_CHAIN,
            NFT_WEB_LOCAL_LOCAL_CHAIN,
        );
        let (ep_b, pod_b) = (self.pod_b.0, SocketAddr::new(self.pod_b.1, POD_PORT));
        let (ep_r, remote) = (self.remote.0, SocketAddr::new(self.remote.1, NODE_PORT));
        let mut s = String::new();
        for c in [svc, ext, local, ep_b, ep_r] {
            s += &format!("add chain {f} {t} {c}\nflush chain {f} {t} {c}\n");
        }
        s += &format!(
            "add rule {f} {t} {ep_b} {f} saddr {} jump mark-for-masquerade\n",
            pod_b.ip()
        );
        s += &format!("add rule {f} {t} {ep_b} meta l4proto tcp dnat to {pod_b}\n");
        s += &format!(
            "add rule {f} {t} {ep_r} {f} saddr {} jump mark-for-masquerade\n",
            remote.ip()
        );
        s += &format!("add rule {f} {t} {ep_r} meta l4proto tcp dnat to {remote}\n");
        // Cluster-wide endpoints: pod-b when it is the local one, else the other node's.
        let cluster_ep = if local_endpoint { ep_b } else { ep_r };
        s += &format!(
            "add rule {f} {t} {svc} numgen random mod 1 vmap {{ 0 : goto {cluster_ep} }}\n"
        );
        s += &format!(
            "add rule {f} {t} {ext} fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n"
        );
        s += &format!(
            "add rule {f} {t} {ext} fib saddr type local goto {svc} comment \"short-circuit local traffic\"\n"
        );
        if local_endpoint {
            s += &format!(
                "add rule {f} {t} {local} numgen random mod 1 vmap {{ 0 : goto {ep_b} }}\n"
            );
            s += &format!("add rule {f} {t} {ext} goto {local}\n");
        }
        s
    }

    /// Writes the Service: with `local_endpoint`, pod-b is its endpoint and pod-a's call is
    /// answered; without, kube-proxy's `no-endpoint-services` drop element is in place. Chains
    /// are flushed and rewritten, never deleted: a chain a map element pointed at stays busy
    /// for a moment after the element goes on kernels before 6.2 (kube-proxy's own comment in
    /// `syncProxyRules`).
    pub(crate) fn set(&self, local_endpoint: bool) -> Result<()> {
        let (f, vip) = (self.family(), self.vip);
        let key = self.key();
        for map in [SERVICE_IPS_MAP, NFT_NO_ENDPOINT_SERVICES] {
            if has_element_in(f, map, &key) {
                change_element_in(f, "delete", map, &key)?;
            }
        }
        run_stdin(
            &["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"],
            &self.rules(local_endpoint),
        )
        .with_context(|| format!("writing default/web-local's {f} chains"))?;
        let service_ip = format!(
            "{{ {vip} . tcp . {VIP_NFT_ETP_LOCAL_PORT} : goto {NFT_WEB_LOCAL_EXTERNAL_CHAIN} }}"
        );
        change_element_in(f, "add", SERVICE_IPS_MAP, &service_ip)?;
        if !local_endpoint {
            let drop = format!(
                "{{ {vip} . tcp . {VIP_NFT_ETP_LOCAL_PORT} comment \"default/web-local:http\" : drop }}"
            );
            change_element_in(f, "add", NFT_NO_ENDPOINT_SERVICES, &drop)?;
        }
        Ok(())
    }
}

/// Writes `default/web-local`'s IPv4 side ([`WebLocal::set`]).
pub(crate) fn set_web_local(local_endpoint: bool) -> Result<()> {
    WEB_LOCAL.set(local_endpoint)
}

const SERVICE_IPS_MAP: &str = "service-ips";
