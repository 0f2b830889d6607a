//! The bench's own two namespaces: a sender and a "node" joined by a veth pair, the node
//! forwarding ordinary traffic into an `ifb` sink (a device that counts and frees what it is
//! given, with no `kfree_skb`), and a port-less bridge `kube-ipvs0` holding the VIP like
//! kube-proxy's. Removed on drop, whatever way the bench ends.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use test_support::lab::{cmd::run, net::remove_namespaces};

pub const NS_TX: &str = "clb-bench-tx";
pub const NS_NODE: &str = "clb-bench-node";
pub const TX_IF: &str = "tx0";
/// The probed NIC.
pub const NODE_IF: &str = "nic0";
pub const SINK_IF: &str = "sink0";
pub const VIP_IF: &str = "kube-ipvs0";

pub const TX_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// Forwarded to the sink: ordinary traffic the probe must let through untouched.
pub const SINK_DST: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
pub const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// A pod CIDR on the node, so the ordinary path pays the trie lookup a real node pays.
pub const POD_CIDR: &str = "10.244.1.0/24";

/// The namespaces, up; torn down on drop.
pub struct BenchNet {
    /// MAC of the node's NIC (trafgen writes whole frames).
    pub node_mac: String,
    pub tx_mac: String,
}

impl BenchNet {
    pub fn up() -> Result<BenchNet> {
        // A previous run killed hard leaves its namespaces: start clean.
        remove_namespaces(&[NS_TX, NS_NODE]).context("removing a previous bench's namespaces")?;
        // From here on, drop removes whatever was made.
        let mut net = BenchNet {
            node_mac: String::new(),
            tx_mac: String::new(),
        };
        build().context("building the bench namespaces")?;
        net.node_mac = mac(NS_NODE, NODE_IF)?;
        net.tx_mac = mac(NS_TX, TX_IF)?;
        let n = |ns: &str, args: &[&str]| -> Result<()> {
            let mut v = vec!["ip", "-n", ns];
            v.extend_from_slice(args);
            run(&v).map(drop)
        };
        // Static neighbours both ways: no ARP in the counts, and the VIP-source sender's
        // replies (there are none: they are dropped) never need resolving.
        n(
            NS_TX,
            &[
                "neigh",
                "replace",
                &NODE_IP.to_string(),
                "lladdr",
                &net.node_mac,
                "dev",
                TX_IF,
                "nud",
                "permanent",
            ],
        )?;
        n(
            NS_NODE,
            &[
                "neigh",
                "replace",
                &TX_IP.to_string(),
                "lladdr",
                &net.tx_mac,
                "dev",
                NODE_IF,
                "nud",
                "permanent",
            ],
        )?;
        Ok(net)
    }

    /// Packets the sink has taken so far (ordinary traffic that made it through the node).
    pub fn sink_packets(&self) -> Result<u64> {
        link_stat(NS_NODE, SINK_IF, "rx", "packets")
    }

    /// Packets the probed NIC has received so far.
    pub fn nic_rx_packets(&self) -> Result<u64> {
        link_stat(NS_NODE, NODE_IF, "rx", "packets")
    }

    /// Packets the sender's NIC has sent so far.
    pub fn tx_packets(&self) -> Result<u64> {
        link_stat(NS_TX, TX_IF, "tx", "packets")
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        if let Err(e) = remove_namespaces(&[NS_TX, NS_NODE]) {
            eprintln!("bench: teardown failed: {e:#}");
        }
    }
}

fn build() -> Result<()> {
    for ns in [NS_TX, NS_NODE] {
        run(&["ip", "netns", "add", ns])?;
        // No IPv6 (no ND, no MLD in the counts); the node forwards, accepts martian-looking
        // sources only as the kernel decides, sends no redirects.
        run(&[
            "ip",
            "netns",
            "exec",
            ns,
            "sysctl",
            "-q",
            "-w",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
        ])?;
        run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
    }
    run(&[
        "ip", "-n", NS_TX, "link", "add", TX_IF, "type", "veth", "peer", "name", NODE_IF, "netns",
        NS_NODE,
    ])?;
    let tx = format!("{TX_IP}/24");
    let node = format!("{NODE_IP}/24");
    run(&["ip", "-n", NS_TX, "addr", "add", &tx, "dev", TX_IF])?;
    run(&["ip", "-n", NS_TX, "link", "set", TX_IF, "up"])?;
    run(&[
        "ip",
        "-n",
        NS_TX,
        "route",
        "add",
        "default",
        "via",
        &NODE_IP.to_string(),
    ])?;
    run(&["ip", "-n", NS_NODE, "addr", "add", &node, "dev", NODE_IF])?;
    run(&["ip", "-n", NS_NODE, "link", "set", NODE_IF, "up"])?;
    run(&["ip", "-n", NS_NODE, "link", "add", SINK_IF, "type", "ifb"])?;
    run(&["ip", "-n", NS_NODE, "link", "set", SINK_IF, "up"])?;
    run(&[
        "ip",
        "-n",
        NS_NODE,
        "route",
        "add",
        "10.201.0.0/24",
        "dev",
        SINK_IF,
    ])?;
    // kube-ipvs0 as kube-proxy leaves it: down, holding the VIP (local route all the same).
    run(&["ip", "-n", NS_NODE, "link", "add", VIP_IF, "type", "bridge"])?;
    run(&[
        "ip",
        "-n",
        NS_NODE,
        "addr",
        "add",
        &format!("{VIP}/32"),
        "dev",
        VIP_IF,
    ])?;
    Ok(())
}

fn mac(ns: &str, dev: &str) -> Result<String> {
    let out = run(&["ip", "-n", ns, "-j", "link", "show", dev])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("ip -j link")?;
    v[0]["address"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no MAC for {dev} in {out}"))
}

/// One counter of `ip -s -j link show` (`dir` rx/tx, `what` packets/bytes/dropped).
fn link_stat(ns: &str, dev: &str, dir: &str, what: &str) -> Result<u64> {
    let out = run(&["ip", "-n", ns, "-s", "-j", "link", "show", dev])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("ip -s -j link")?;
    v[0]["stats64"][dir][what]
        .as_u64()
        .with_context(|| format!("no {dir} {what} for {dev} in {out}"))
}
