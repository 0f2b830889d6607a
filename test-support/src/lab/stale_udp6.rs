//! The stale UDP conntrack black hole over IPv6 (issue #51, shape 3; kubernetes#139628), on the
//! dual-stack lab ([`super::Lab::add_ipv6`]): the statsd Service of [`super::stale_udp`] with
//! an IPv6 ClusterIP, its endpoint pod B's IPv6 address at 8125, then moved to 8126 while
//! nothing deletes the node's conntrack entry. Pod B's sink reads both ports and answers on the
//! new one only: the entry to the gone endpoint stays UNREPLIED, the one to the current endpoint
//! is replied (the twin).
//!
//! The rules are kube-proxy's IPv6 proxier's: in iptables mode `ip6tables` nat chains
//! (`pkg/proxy/iptables/proxier.go`, one proxier per family), in nftables mode the table
//! `ip6 kube-proxy` (`pkg/proxy/nftables/proxier.go`: the same table in the `ip6` family, with
//! `ipv6_addr` sets and maps and `ip6 daddr` matches).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use anyhow::{Context, Result, bail};

use super::{
    KubeProxyMode, NS_NODE, NS_POD_B,
    cmd::{restore_rules, run_detached, run_stdin},
    kube_proxy,
    servers::SERVER_TAG,
    stale_udp::{IptablesService, NEW_ENDPOINT_PORT, NftService, OLD_ENDPOINT_PORT, STATSD_PORT},
    v6::POD_B_IP6,
};

/// The Service's IPv6 ClusterIP (the dual-stack Service's second `clusterIPs` entry).
pub const STATSD_CLUSTER_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x96, 0, 0, 0, 0, 0x30);

/// The ClusterIP and port, as the sender calls it.
pub fn statsd6() -> SocketAddr {
    SocketAddr::new(IpAddr::V6(STATSD_CLUSTER_IP6), STATSD_PORT)
}

/// The IPv6 proxier's iptables chains for the Service (made-up hashes of kube-proxy's shape;
/// each family's proxier hashes its own names).
const SVC_CHAIN6: &str = "KUBE-SVC-CLBSTATSDUDP6812";
const OLD_SEP_CHAIN6: &str = "KUBE-SEP-CLBSTATSD6EPOLD1";
const NEW_SEP_CHAIN6: &str = "KUBE-SEP-CLBSTATSD6EPNEW1";

/// Pod B's IPv6 sink: reads datagrams on the first port and answers none (the endpoint that
/// goes away), answers each one on the second (the current endpoint).
const SINK6_PY: &str = r#"
import select, socket, sys
socks = {}
for port in sys.argv[2:4]:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(("::", int(port)))
    socks[s] = port == sys.argv[3]
while True:
    for s in select.select(list(socks), [], [])[0]:
        data, peer = s.recvfrom(2048)
        if socks[s]:
            s.sendto(b"ok\n", peer)
"#;

/// The Service's `ip6tables` nat rules with its endpoint on pod B at `endpoint_port`, as the
/// IPv6 proxier writes them (the `KUBE-SERVICES` rule once: `with_service_rule`; the SVC chain
/// re-declared, so flushed).
fn ip6tables_rules(endpoint_port: u16, with_service_rule: bool) -> String {
    let service = IptablesService {
        chains: [SVC_CHAIN6, OLD_SEP_CHAIN6, NEW_SEP_CHAIN6],
        pod_b: POD_B_IP6.into(),
        cluster_ip: STATSD_CLUSTER_IP6.into(),
    };
    service.rules(endpoint_port, with_service_rule)
}

/// kube-proxy's nftables chains for the Service in `ip6 kube-proxy`
/// (`pkg/proxy/nftables/proxier.go`, `hashAndTruncate`; `servicePortEndpointChainNameBase`
/// writes an IPv6 endpoint's colons as dots): base32(sha256(name))[:8] of
/// "monitoring/statsd/udp/statsd" and of it with "__2001.db8.19.1..11/<port>" appended.
const NFT_SVC_CHAIN6: &str = "service-XTVCXYO3-monitoring/statsd/udp/statsd";
const NFT_OLD_EP_CHAIN6: &str =
    "endpoint-DGDHXOF5-monitoring/statsd/udp/statsd__2001.db8.19.1..11/8125";
const NFT_NEW_EP_CHAIN6: &str =
    "endpoint-YYZKF3Z5-monitoring/statsd/udp/statsd__2001.db8.19.1..11/8126";

/// The Service's chains in `ip6 kube-proxy` with its endpoint on pod B at `endpoint_port`
/// (`stale_udp`'s steps, IPv6), in the table the dual-stack layer loaded ([`super::nft6`]);
/// `first` also adds the ClusterIP's `cluster-ips` and `service-ips` elements.
fn nft6_rules(endpoint_port: u16, first: bool) -> String {
    let service = NftService {
        family: "ip6",
        chains: [NFT_SVC_CHAIN6, NFT_OLD_EP_CHAIN6, NFT_NEW_EP_CHAIN6],
        pod_b: POD_B_IP6.into(),
        cluster_ip: STATSD_CLUSTER_IP6.into(),
    };
    service.rules(endpoint_port, first)
}

/// Writes the Service's IPv6 rules in the node's kube-proxy mode (iptables or nftables).
fn write_rules6(endpoint_port: u16, first: bool) -> Result<()> {
    match kube_proxy::node_mode()? {
        KubeProxyMode::Iptables => restore_rules(
            NS_NODE,
            "ip6tables-restore",
            &ip6tables_rules(endpoint_port, first),
        )
        .map(drop),
        KubeProxyMode::Nftables => run_stdin(
            &["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"],
            &nft6_rules(endpoint_port, first),
        )
        .map(drop),
        mode => bail!(
            "the statsd Service's IPv6 rules are written for kube-proxy's iptables and nftables \
             modes, not {}",
            mode.name()
        ),
    }
}

/// Starts pod B's IPv6 sink (silent on 8125, answering on 8126) and writes the Service's IPv6
/// rules with pod B:8125 as its endpoint. The dual-stack layer first; removed with the lab.
pub fn serve_statsd6() -> Result<()> {
    let (old, new) = (OLD_ENDPOINT_PORT.to_string(), NEW_ENDPOINT_PORT.to_string());
    let argv = [
        "ip", "netns", "exec", NS_POD_B, "setsid", "-f", "python3", "-c", SINK6_PY, SERVER_TAG,
        &old, &new,
    ];
    run_detached(&argv).context("starting the IPv6 statsd sink in pod B")?;
    write_rules6(OLD_ENDPOINT_PORT, true).context("kube-proxy's IPv6 rules for statsd")
}

/// Moves the Service's IPv6 endpoint to pod B:8126; the node's conntrack entries are left as
/// they are.
pub fn move_endpoint6() -> Result<()> {
    write_rules6(NEW_ENDPOINT_PORT, false).context("moving the statsd Service's IPv6 endpoint")
}
