//! The LB's own node probes (issue #51 shape 4, `lb_probe_refused`): a provider's documented
//! probe source on the LB's side of the lab, so a probe to the node's :10256 (kube-proxy's
//! healthz port) arrives through the node's NIC from an outside address, as a cloud's health
//! checker's does. The node's default route already leads back to the LB namespace, so the
//! node's answer (a RST when nothing listens) reaches the prober.

use std::net::Ipv4Addr;

use anyhow::Result;

use super::{
    NS_LB,
    cmd::{exec, run_stdin},
};

/// A Google Cloud health checker's address: 35.191.0.0/16 is a documented probe range
/// (https://cloud.google.com/load-balancing/docs/health-check-concepts, "Probe IP ranges").
pub const GCE_PROBE_IP: Ipv4Addr = Ipv4Addr::new(35, 191, 0, 10);
/// kube-proxy's healthz port (`--healthz-bind-address`, default `0.0.0.0:10256`).
pub const HEALTHZ_PORT: u16 = 10256;

/// Puts `addr` on the LB namespace's loopback, so a connection there can use it as source.
pub fn add_probe_source(addr: Ipv4Addr) -> Result<()> {
    exec(
        NS_LB,
        &["ip", "addr", "replace", &format!("{addr}/32"), "dev", "lo"],
    )?;
    Ok(())
}

/// Takes `addr` off the LB namespace again (the lab's teardown would as well).
pub fn remove_probe_source(addr: Ipv4Addr) -> Result<()> {
    exec(
        NS_LB,
        &["ip", "addr", "del", &format!("{addr}/32"), "dev", "lo"],
    )?;
    Ok(())
}

/// The node's own firewall table for the probe (not kube-proxy's: a host firewall).
const FIREWALL_TABLE: &str = "clb-lab-host-firewall";

/// A host firewall on the node that drops `port` from `source` in the input hook (`None`:
/// removes it), as a node's own nftables policy that forgot the LB's probe range would.
pub fn block_probe(source: Option<(&str, u16)>) -> Result<()> {
    let _ = exec(
        super::NS_NODE,
        &["nft", "delete", "table", "inet", FIREWALL_TABLE],
    );
    if let Some((range, port)) = source {
        let rules = format!(
            "table inet {FIREWALL_TABLE} {{\n chain input {{\n  type filter hook input priority 0; \
             policy accept;\n  ip saddr {range} tcp dport {port} drop\n }}\n}}\n"
        );
        run_stdin(
            &["ip", "netns", "exec", super::NS_NODE, "nft", "-f", "-"],
            &rules,
        )?;
    }
    Ok(())
}

/// Azure's IPv6 probe source: link-local (cilium#25242, cilium#31326).
pub const AZURE_PROBE_IP6: &str = "fe80::1234:5678:9abc";

/// One probe over IPv6 from [`AZURE_PROBE_IP6`] on the LB's link to the node (the dual-stack
/// layer must be up): the address is put on the LB's side of the link, and a connection made
/// from it (a link-local source needs its interface: python3 binds with the scope id).
/// Returns `refused`, `ok` or the error's name.
pub fn probe6_from_link_local(dst: std::net::Ipv6Addr, port: u16) -> Result<String> {
    exec(
        NS_LB,
        &[
            "ip",
            "-6",
            "addr",
            "replace",
            &format!("{AZURE_PROBE_IP6}/64"),
            "dev",
            "vnode",
            "nodad",
        ],
    )?;
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET6)\n\
         s.settimeout(2)\n\
         s.bind(('{AZURE_PROBE_IP6}', 0, 0, socket.if_nametoindex('vnode')))\n\
         try:\n    s.connect(('{dst}', {port}))\n    print('ok')\n\
         except ConnectionRefusedError:\n    print('refused')\n\
         except Exception as e:\n    print(type(e).__name__)\n"
    );
    let out = exec(NS_LB, &["python3", "-c", &script])?;
    Ok(out.trim().to_string())
}
