//! `loadBalancerSourceRanges` in the lab's nftables mode (issue #51 shape 1): kube-proxy's
//! firewall for `default/web`'s LB IP, as its nftables proxier writes it (kubernetes PR
//! #122614, 1.30; kubernetes `pkg/proxy/nftables/proxier.go`, `syncProxyRules`): the element
//! `VIP . tcp . 80 : goto firewall-<HASH>-default/web/tcp/http` of `firewall-ips` (no comment,
//! as kube-proxy's own test output has it), and in that chain `ip saddr != { ranges } drop`.
//! The lab's table already has `firewall-ips` and `firewall-check` (in `filter-prerouting` and
//! `filter-output` at priority -110, before DNAT): a pod's call from outside the ranges dies
//! there, before the short-circuit to pod-b (kubernetes#109575). IPv6: the same in the
//! dual-stack layer's `ip6 kube-proxy` table ([`set_source_ranges_in`], VIP6).

//!
//! iptables mode ([`set_iptables_source_ranges`]; kubernetes PR #110289, 1.25;
//! `pkg/proxy/iptables/proxier.go`, `syncProxyRules`): the LB IP's `KUBE-SERVICES` rule jumps
//! to `KUBE-FW-<HASH>`, which sends each range on to the Service's `KUBE-EXT-*` chain and lets
//! the rest fall through undNATed; the filter chain `KUBE-PROXY-FIREWALL` (jumped from `INPUT`,
//! `FORWARD` and `OUTPUT` for new connections) drops the LB IP:port: a pod's call from outside
//! the ranges dies in `FORWARD`. In `ip6tables` too, for the dual-stack lab's VIP6.

use anyhow::{Context, Result, bail};

use super::{
    KUBE_EXT_CHAIN, KubeProxyMode, NS_NODE, SERVICE_PORT, VIP,
    cmd::{exec, restore_rules, run_stdin, succeeds},
    kube_proxy,
    nft::NFT_TABLE,
    v6::VIP6,
};

/// `default/web:http`'s firewall chain (kube-proxy's hash of "default/web/tcp/http").
pub const NFT_FIREWALL_CHAIN: &str = "firewall-SUSTUHLJ-default/web/tcp/http";
/// kube-proxy's map of firewalled destinations.
pub const NFT_FIREWALL_IPS: &str = "firewall-ips";

/// `default/web`'s LB IP:port as a key of `family`'s `firewall-ips`.
fn key(family: IpFamily) -> String {
    format!("{{ {} . tcp . {SERVICE_PORT} }}", family.lb_addr())
}

/// Whether `default/web`'s LB IP:port is an element of `firewall-ips` (the `ip` table).
pub fn firewalled() -> bool {
    firewalled_in(IpFamily::V4)
}

/// Whether `default/web`'s LB IP:port (VIP6 in the `ip6` table) is an element of
/// `family`'s `firewall-ips`.
pub fn firewalled_in(family: IpFamily) -> bool {
    succeeds(&[
        "ip",
        "netns",
        "exec",
        NS_NODE,
        "nft",
        "get",
        "element",
        family.nft(),
        NFT_TABLE,
        NFT_FIREWALL_IPS,
        &key(family),
    ])
}

/// Gives `default/web` `loadBalancerSourceRanges: ranges` (kube-proxy's firewall chain and
/// element), or none (`None`: the element goes, the chain is flushed and kept, as kube-proxy
/// keeps a chain a map element pointed at for a moment). Needs the lab in nftables mode.
pub fn set_source_ranges(ranges: Option<&[&str]>) -> Result<()> {
    set_source_ranges_in(IpFamily::V4, ranges)
}

/// [`set_source_ranges`] in `family`'s table: IPv6 is the `ip6 kube-proxy` table of the
/// dual-stack layer (`Lab::add_ipv6` in nftables mode) with VIP6 and `ip6 saddr`, as the
/// IPv6 proxier writes it (`pkg/proxy/nftables/proxier.go`: `ipX` is "ip6" in
/// `syncProxyRules`' `ipX saddr != { ranges } drop`).
pub fn set_source_ranges_in(family: IpFamily, ranges: Option<&[&str]>) -> Result<()> {
    let (fam, t, c) = (family.nft(), NFT_TABLE, NFT_FIREWALL_CHAIN);
    if firewalled_in(family) {
        exec(
            NS_NODE,
            &[
                "nft",
                "delete",
                "element",
                fam,
                t,
                NFT_FIREWALL_IPS,
                &key(family),
            ],
        )?;
    }
    let mut script = format!("add chain {fam} {t} {c}\nflush chain {fam} {t} {c}\n");
    if let Some(ranges) = ranges {
        script += &format!(
            "add rule {fam} {t} {c} {fam} saddr != {{ {} }} drop\n",
            ranges.join(", ")
        );
        script += &format!(
            "add element {fam} {t} {NFT_FIREWALL_IPS} {{ {} . tcp . {SERVICE_PORT} : goto {c} }}\n",
            family.lb_addr()
        );
    }
    run_stdin(&["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"], &script)
        .context("writing default/web's loadBalancerSourceRanges firewall")
        .map(drop)
}

/// `default/web:http`'s firewall chain in iptables mode (kube-proxy's hash of
/// "default/web:http" + "tcp", the one its `KUBE-SVC-*` and `KUBE-EXT-*` chains carry).
pub const IPT_FIREWALL_CHAIN: &str = "KUBE-FW-CDGGSHYLG3RE2FKL";
/// kube-proxy's filter chain of the source-range drops.
pub const IPT_PROXY_FIREWALL_CHAIN: &str = "KUBE-PROXY-FIREWALL";

/// Which side of kube-proxy's iptables rules: `iptables` with the LB IP, or `ip6tables` with
/// the dual-stack lab's VIP6 (`Lab::add_ipv6` first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    fn cmd(self) -> &'static str {
        match self {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        }
    }

    pub(crate) fn restore(self) -> &'static str {
        match self {
            IpFamily::V4 => "iptables-restore",
            IpFamily::V6 => "ip6tables-restore",
        }
    }

    /// kube-proxy's nftables table family (and its address match keyword).
    fn nft(self) -> &'static str {
        match self {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        }
    }

    /// The LB IP.
    fn lb_addr(self) -> std::net::IpAddr {
        match self {
            IpFamily::V4 => VIP.into(),
            IpFamily::V6 => VIP6.into(),
        }
    }

    /// The LB IP as kube-proxy's rules match it.
    pub(crate) fn lb_ip(self) -> String {
        match self {
            IpFamily::V4 => format!("{VIP}/32"),
            IpFamily::V6 => format!("{VIP6}/128"),
        }
    }
}

/// The nat chain `KUBE-FW-*` of `ranges` (kube-proxy writes one rule per range, then a
/// comment-only rule the rest falls through).
fn iptables_fw_chain(ranges: &[&str]) -> String {
    let fw = IPT_FIREWALL_CHAIN;
    let name = "default/web:http";
    let mut rules = format!("*nat\n:{fw} - [0:0]\n");
    for r in ranges {
        rules += &format!(
            "-A {fw} -m comment --comment \"{name} loadbalancer IP\" -s {r} -j {KUBE_EXT_CHAIN}\n"
        );
    }
    rules += &format!(
        "-A {fw} -m comment --comment \"other traffic to {name} will be dropped by \
         KUBE-PROXY-FIREWALL\"\nCOMMIT\n"
    );
    rules
}

/// `KUBE-PROXY-FIREWALL` with the LB IP:port's drop.
fn iptables_proxy_firewall(family: IpFamily) -> String {
    let c = IPT_PROXY_FIREWALL_CHAIN;
    format!(
        "*filter\n:{c} - [0:0]\n\
         -A {c} -m comment --comment \"default/web:http traffic not accepted by \
         {IPT_FIREWALL_CHAIN}\" -m tcp -p tcp -d {} --dport {SERVICE_PORT} -j DROP\n\
         COMMIT\n",
        family.lb_ip()
    )
}

/// The LB IP's `KUBE-SERVICES` rule, to the firewall chain.
fn iptables_lb_rule(family: IpFamily) -> Vec<String> {
    let lb_ip = family.lb_ip();
    let rule = super::switch::lb_ip_rule(&lb_ip, IPT_FIREWALL_CHAIN);
    std::iter::once("KUBE-SERVICES")
        .chain(rule)
        .map(str::to_string)
        .collect()
}

/// The jump kube-proxy prepends to `INPUT`, `FORWARD` and `OUTPUT` of the filter table.
fn iptables_firewall_jump(chain: &str) -> Vec<String> {
    kube_proxy::new_connections_jump(
        chain,
        "kubernetes load balancer firewall",
        IPT_PROXY_FIREWALL_CHAIN,
    )
}

/// Inserts `rule` (chain first) at position 1 of `table` unless it is there (`on`), or
/// deletes every copy (`!on`).
pub(crate) fn iptables_first(
    family: IpFamily,
    table: &str,
    rule: &[String],
    on: bool,
) -> Result<()> {
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    let with = |op: &'static str| {
        let mut a = vec![family.cmd(), "-w", "-t", table, op];
        a.extend_from_slice(&rule);
        a
    };
    let present = || succeeds(&[&["ip", "netns", "exec", NS_NODE][..], &with("-C")].concat());
    if !on {
        while present() {
            exec(NS_NODE, &with("-D"))?;
        }
        return Ok(());
    }
    if present() {
        return Ok(());
    }
    let mut insert = vec![family.cmd(), "-w", "-t", table, "-I", rule[0], "1"];
    insert.extend_from_slice(&rule[1..]);
    exec(NS_NODE, &insert).map(drop)
}

/// Whether `default/web`'s LB IP:port has its `KUBE-PROXY-FIREWALL` drop (iptables mode).
pub fn iptables_firewalled(family: IpFamily) -> bool {
    exec(
        NS_NODE,
        &[
            family.cmd(),
            "-w",
            "-t",
            "filter",
            "-S",
            IPT_PROXY_FIREWALL_CHAIN,
        ],
    )
    .is_ok_and(|out| out.contains(IPT_FIREWALL_CHAIN))
}

/// Gives `default/web` `loadBalancerSourceRanges: ranges` in kube-proxy's iptables mode, in
/// `family`'s rules (see the module docs), or none (`None`: the LB IP's rule goes, both
/// chains are flushed). The LB IP must not be bound (`vip_bound: false`: kube-proxy's iptables
/// mode binds none).
pub fn set_iptables_source_ranges(family: IpFamily, ranges: Option<&[&str]>) -> Result<()> {
    if kube_proxy::node_mode()? != KubeProxyMode::Iptables {
        bail!("the iptables firewall is written for kube-proxy's iptables mode");
    }
    restore_rules(
        NS_NODE,
        family.restore(),
        &iptables_fw_chain(ranges.unwrap_or_default()),
    )
    .context("kube-proxy's KUBE-FW chain of default/web")?;
    let filter = match ranges {
        Some(_) => iptables_proxy_firewall(family),
        None => format!("*filter\n:{IPT_PROXY_FIREWALL_CHAIN} - [0:0]\nCOMMIT\n"),
    };
    restore_rules(NS_NODE, family.restore(), &filter).context("KUBE-PROXY-FIREWALL")?;
    iptables_first(family, "nat", &iptables_lb_rule(family), ranges.is_some())?;
    for chain in ["INPUT", "FORWARD", "OUTPUT"] {
        iptables_first(family, "filter", &iptables_firewall_jump(chain), true)?;
    }
    Ok(())
}

/// IPVS mode's set of firewalled LB IP:ports (kubernetes `pkg/proxy/ipvs/proxier.go`,
/// `ipsetInfo`).
pub const IPVS_FW_SET: &str = "KUBE-LOAD-BALANCER-FW";
/// IPVS mode's set of allowed (LB IP:port, range).
pub const IPVS_SOURCE_CIDR_SET: &str = "KUBE-LOAD-BALANCER-SOURCE-CIDR";
/// The IPv6 proxier's names for them: `KUBE-6-` for `KUBE-`, cut to ipset's 31 characters
/// (`pkg/proxy/ipvs/ipset.go`, `NewIPSet`).
pub const IPVS_FW_SET6: &str = "KUBE-6-LOAD-BALANCER-FW";
pub const IPVS_SOURCE_CIDR_SET6: &str = "KUBE-6-LOAD-BALANCER-SOURCE-CID";

impl IpFamily {
    /// IPVS mode's (FW set, source CIDR set, ipset family, LB IP as the sets hold it).
    fn ipvs_sets(self) -> (&'static str, &'static str, &'static str, String) {
        match self {
            IpFamily::V4 => (IPVS_FW_SET, IPVS_SOURCE_CIDR_SET, "inet", VIP.to_string()),
            IpFamily::V6 => (
                IPVS_FW_SET6,
                IPVS_SOURCE_CIDR_SET6,
                "inet6",
                VIP6.to_string(),
            ),
        }
    }
}
/// IPVS mode's filter chain that drops what the source sets do not return.
pub const IPVS_SOURCE_RANGES_CHAIN: &str = "KUBE-SOURCE-RANGES-FIREWALL";

/// kube-proxy's IPVS-mode filter rules for `family`'s source-range sets
/// (`ipsetWithIptablesChain` and `iptablesJumpChain` in `pkg/proxy/ipvs/proxier.go`;
/// filter-table DROP since 1.25, kubernetes PR #110628). Declaring the chains flushes them
/// (`--noflush` keeps the rest).
fn ipvs_firewall_rules(family: IpFamily, on: bool) -> String {
    let (fw_set, cidr_set, _, _) = family.ipvs_sets();
    let mut rules = format!(
        "*filter\n:{IPT_PROXY_FIREWALL_CHAIN} - [0:0]\n:{IPVS_SOURCE_RANGES_CHAIN} - [0:0]\n"
    );
    if on {
        rules += &format!(
            "-A {IPT_PROXY_FIREWALL_CHAIN} -m comment --comment \"Kubernetes service load \
             balancer ip + port for load balancer with sourceRange\" -m set --match-set \
             {fw_set} dst,dst -j {IPVS_SOURCE_RANGES_CHAIN}\n\
             -A {IPVS_SOURCE_RANGES_CHAIN} -m comment --comment \"Kubernetes service load \
             balancer ip + port + source cidr for packet filter purpose\" -m set --match-set \
             {cidr_set} dst,dst,src -j RETURN\n\
             -A {IPVS_SOURCE_RANGES_CHAIN} -j DROP\n"
        );
    }
    rules + "COMMIT\n"
}

/// Gives `default/web` `loadBalancerSourceRanges: ranges` in kube-proxy's IPVS mode (IPv4):
/// its LB IP:port in [`IPVS_FW_SET`], each range in [`IPVS_SOURCE_CIDR_SET`], and the filter
/// chains (jumped from `INPUT` and `FORWARD`) that drop the rest; or none (`None`: the sets
/// emptied, the chains flushed, the jumps removed). The LB IP stays bound on kube-ipvs0, so a
/// pod's call from outside the ranges dies in `INPUT`, before IPVS.
pub fn set_ipvs_source_ranges(ranges: Option<&[&str]>) -> Result<()> {
    set_ipvs_source_ranges_in(IpFamily::V4, ranges)
}

/// [`set_ipvs_source_ranges`] in `family`'s sets and rules: IPv6 is VIP6's (bound on
/// kube-ipvs0 by [`super::Lab::serve_vip6_by_ipvs`]) in [`IPVS_FW_SET6`] and
/// [`IPVS_SOURCE_CIDR_SET6`], with the filter chains in `ip6tables`.
pub fn set_ipvs_source_ranges_in(family: IpFamily, ranges: Option<&[&str]>) -> Result<()> {
    if kube_proxy::node_mode()? != KubeProxyMode::Ipvs {
        bail!("the IPVS firewall is written for kube-proxy's IPVS mode");
    }
    let (fw_set, cidr_set, inet, lb_ip) = family.ipvs_sets();
    let mut sets = format!(
        "create {fw_set} hash:ip,port family {inet} hashsize 1024 maxelem 65536\n\
         create {cidr_set} hash:ip,port,net family {inet} hashsize 1024 maxelem 65536\n\
         flush {fw_set}\nflush {cidr_set}\n"
    );
    if let Some(ranges) = ranges {
        sets += &format!("add {fw_set} {lb_ip},tcp:{SERVICE_PORT}\n");
        for r in ranges {
            sets += &format!("add {cidr_set} {lb_ip},tcp:{SERVICE_PORT},{r}\n");
        }
    }
    run_stdin(
        &["ip", "netns", "exec", NS_NODE, "ipset", "-exist", "restore"],
        &sets,
    )
    .context("kube-proxy's source-range ipsets")?;
    restore_rules(
        NS_NODE,
        family.restore(),
        &ipvs_firewall_rules(family, ranges.is_some()),
    )
    .context("KUBE-PROXY-FIREWALL and KUBE-SOURCE-RANGES-FIREWALL")?;
    for chain in ["INPUT", "FORWARD"] {
        let jump = [
            chain,
            "-m",
            "comment",
            "--comment",
            "kube-proxy firewall rules",
            "-j",
            IPT_PROXY_FIREWALL_CHAIN,
        ]
        .map(str::to_string);
        iptables_first(family, "filter", &jump, ranges.is_some())?;
    }
    Ok(())
}
