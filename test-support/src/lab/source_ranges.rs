//! `loadBalancerSourceRanges` in the lab's nftables mode (issue #51 shape 1): kube-proxy's
//! firewall for `default/web`'s LB IP, as its nftables proxier writes it (kubernetes PR
//! #122614, 1.30; kubernetes `pkg/proxy/nftables/proxier.go`, `syncProxyRules`): the element
//! `VIP . tcp . 80 : goto firewall-<HASH>-default/web/tcp/http` of `firewall-ips` (no comment,
//! as kube-proxy's own test output has it), and in that chain `ip saddr != { ranges } drop`.
//! The lab's table already has `firewall-ips` and `firewall-check` (in `filter-prerouting` and
//! `filter-output` at priority -110, before DNAT): a pod's call from outside the ranges dies
//! there, before the short-circuit to pod-b (kubernetes#109575).

use anyhow::{Context, Result};

use super::{
    NS_NODE, SERVICE_PORT, VIP,
    cmd::{exec, run_stdin, succeeds},
    nft::NFT_TABLE,
};

/// `default/web:http`'s firewall chain (kube-proxy's hash of "default/web/tcp/http").
pub const NFT_FIREWALL_CHAIN: &str = "firewall-SUSTUHLJ-default/web/tcp/http";
/// kube-proxy's map of firewalled destinations.
pub const NFT_FIREWALL_IPS: &str = "firewall-ips";

fn key() -> String {
    format!("{{ {VIP} . tcp . {SERVICE_PORT} }}")
}

/// Whether `default/web`'s LB IP:port is an element of `firewall-ips`.
pub fn firewalled() -> bool {
    succeeds(&[
        "ip",
        "netns",
        "exec",
        NS_NODE,
        "nft",
        "get",
        "element",
        "ip",
        NFT_TABLE,
        NFT_FIREWALL_IPS,
        &key(),
    ])
}

/// Gives `default/web` `loadBalancerSourceRanges: ranges` (kube-proxy's firewall chain and
/// element), or none (`None`: the element goes, the chain is flushed and kept, as kube-proxy
/// keeps a chain a map element pointed at for a moment). Needs the lab in nftables mode.
pub fn set_source_ranges(ranges: Option<&[&str]>) -> Result<()> {
    if firewalled() {
        exec(
            NS_NODE,
            &[
                "nft",
                "delete",
                "element",
                "ip",
                NFT_TABLE,
                NFT_FIREWALL_IPS,
                &key(),
            ],
        )?;
    }
    let (t, c) = (NFT_TABLE, NFT_FIREWALL_CHAIN);
    let mut script = format!("add chain ip {t} {c}\nflush chain ip {t} {c}\n");
    if let Some(ranges) = ranges {
        script += &format!(
            "add rule ip {t} {c} ip saddr != {{ {} }} drop\n",
            ranges.join(", ")
        );
        script += &format!(
            "add element ip {t} {NFT_FIREWALL_IPS} {{ {VIP} . tcp . {SERVICE_PORT} : goto {c} }}\n"
        );
    }
    run_stdin(&["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"], &script)
        .context("writing default/web's loadBalancerSourceRanges firewall")
        .map(drop)
}
