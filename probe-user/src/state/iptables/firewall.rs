//! kube-proxy's iptables firewall for `loadBalancerSourceRanges` (kubernetes PR #110289, in
//! 1.25; kubernetes/kubernetes `pkg/proxy/iptables/proxier.go`, `syncProxyRules`), read into
//! the [`FirewallEntry`]s the nftables reader fills (`super::super::nft_firewall`):
//!
//! - nat: the LB IP's `KUBE-SERVICES` rule jumps to `KUBE-FW-<HASH>`, which holds one rule
//!   per range, `-m comment --comment "<svc> loadbalancer IP" -s <range> -j KUBE-EXT-<HASH>`
//!   (and `-s <LB IP>` when a range holds the node IP), then a comment-only rule ("other
//!   traffic to <svc> will be dropped by KUBE-PROXY-FIREWALL"): a source outside the ranges
//!   falls through, not DNATed;
//! - filter: `KUBE-PROXY-FIREWALL` (jumped from `INPUT`, `FORWARD` and `OUTPUT` for new
//!   connections, "kubernetes load balancer firewall") drops the LB IP:port, `-m comment
//!   --comment "<svc> traffic not accepted by KUBE-FW-<HASH>" -d <LB IP> --dport <port> -j
//!   DROP`: what was not DNATed dies there, a pod's call in `FORWARD`, the node's in `OUTPUT`
//!   (kubernetes#109575).
//!
//! Pure: the readers in `super` fetch the chains (netlink or `iptables -S`).

use std::net::IpAddr;

use probe_contract::Proto;
use probe_core::state::{FirewallEntry, SourceRange};

use super::rules::{Rule, chain_rules, commented_destinations, strip_counters, tokenize};

/// kube-proxy's filter chain of the source-range drops.
pub const PROXY_FIREWALL_CHAIN: &str = "KUBE-PROXY-FIREWALL";
/// The per-Service nat chain's prefix.
const FW_CHAIN_PREFIX: &str = "KUBE-FW-";
/// The drop rule's comment between the Service and the nat chain.
const NOT_ACCEPTED_BY: &str = " traffic not accepted by ";

/// One `KUBE-PROXY-FIREWALL` drop: the LB IP:port and the nat chain whose ranges pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirewallDrop {
    pub addr: IpAddr,
    pub proto: Proto,
    pub port: u16,
    /// `namespace/name:port`, from the comment.
    pub service: String,
    /// `KUBE-FW-<HASH>`, from the comment.
    pub chain: String,
}

/// The source-range drops among `rules` (those of [`PROXY_FIREWALL_CHAIN`]): `-j DROP` with a
/// host destination, protocol and port, whose comment names a `KUBE-FW-*` chain.
pub fn firewall_drops(rules: &[Rule]) -> Vec<FirewallDrop> {
    let named = |c: &str| {
        c.split_once(NOT_ACCEPTED_BY)
            .filter(|(_, chain)| chain.starts_with(FW_CHAIN_PREFIX))
            .map(|(service, chain)| (service.to_string(), chain.to_string()))
    };
    commented_destinations(rules, PROXY_FIREWALL_CHAIN, "DROP", named)
        .into_iter()
        .map(|(addr, proto, port, (service, chain))| FirewallDrop {
            addr,
            proto,
            port,
            service,
            chain,
        })
        .collect()
}

/// [`firewall_drops`] of `iptables -S KUBE-PROXY-FIREWALL` text (the legacy backend).
pub fn parse_firewall_drops(text: &str) -> Vec<FirewallDrop> {
    firewall_drops(&chain_rules(text, PROXY_FIREWALL_CHAIN))
}

/// The sources a `KUBE-FW-*` chain sends on, from its rules' text (`iptables -S` lines, or the
/// netlink reader's rendering): each `-s <range>` (not negated) of a rule that jumps to a
/// kube-proxy chain other than `KUBE-MARK-DROP` (the pre-1.25 form dropped by mark), in address
/// order. A rule without a source match or a jump (the closing comment) passes nothing.
pub fn allowed_sources<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<SourceRange> {
    let mut out: Vec<SourceRange> = Vec::new();
    for text in texts {
        let tokens = tokenize(strip_counters(text.trim()));
        let value_of = |names: &[&str]| {
            tokens.windows(2).enumerate().find_map(|(i, w)| {
                let negated = i > 0 && tokens[i - 1] == "!";
                (names.contains(&w[0].as_str()) && !negated).then(|| w[1].as_str())
            })
        };
        let passes = value_of(&["-j", "--jump", "-g", "--goto"])
            .is_some_and(|t| t.starts_with("KUBE-") && t != "KUBE-MARK-DROP");
        let Some(range) = value_of(&["-s", "--source", "--src"])
            .filter(|_| passes)
            .and_then(SourceRange::parse)
        else {
            continue;
        };
        if !out.contains(&range) {
            out.push(range);
        }
    }
    out.sort_by_key(|r| r.first);
    out
}

/// The entry of `drop` with the sources its chain passes.
pub fn entry(drop: FirewallDrop, allowed: Vec<SourceRange>) -> FirewallEntry {
    FirewallEntry {
        addr: drop.addr,
        proto: drop.proto,
        port: drop.port,
        service: Some(drop.service),
        chain: Some(drop.chain),
        allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube-proxy's own expected output (`pkg/proxy/iptables/proxier_test.go`, the
    /// `loadBalancerSourceRanges` Service ns5/svc5), with the counters `iptables-save -c` adds.
    const FILTER: &str = r#"-N KUBE-PROXY-FIREWALL
-A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP
[3:180] -A KUBE-PROXY-FIREWALL -d 2001:db8::10/128 -p udp -m comment --comment "ns6/svc6:dns traffic not accepted by KUBE-FW-ABCDEFGHIJKLMNOP" -m udp --dport 53 -j DROP
-A KUBE-PROXY-FIREWALL -m comment --comment "ns7/svc7:p80 has no endpoints" -d 5.6.7.9 --dport 80 -p tcp -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-X" -d 5.6.7.8/32 -p tcp --dport 80 -j DROP
"#;

    #[test]
    fn the_firewall_drops_are_read_with_their_chain() {
        let drops = parse_firewall_drops(FILTER);
        assert_eq!(drops.len(), 2, "{drops:?}");
        assert_eq!(drops[0].addr, IpAddr::from([5, 6, 7, 8]));
        assert_eq!((drops[0].port, drops[0].proto), (80, Proto::Tcp));
        assert_eq!(drops[0].service, "ns5/svc5:p80");
        assert_eq!(drops[0].chain, "KUBE-FW-NUKIZ6OKUXPJNT4C");
        assert_eq!(drops[1].addr, "2001:db8::10".parse::<IpAddr>().unwrap());
        assert_eq!((drops[1].port, drops[1].proto), (53, Proto::Udp));
    }

    #[test]
    fn the_fw_chain_passes_its_ranges_and_the_lb_ip() {
        let nat = [
            r#"-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C"#,
            r#"-A KUBE-FW-NUKIZ6OKUXPJNT4C -s 192.0.2.7/32 -m comment --comment "ns5/svc5:p80 loadbalancer IP" -j KUBE-EXT-NUKIZ6OKUXPJNT4C"#,
            r#"-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 5.6.7.8 -j KUBE-EXT-NUKIZ6OKUXPJNT4C"#,
            r#"-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL""#,
            r#"-A KUBE-FW-NUKIZ6OKUXPJNT4C ! -s 10.0.0.0/8 -j KUBE-EXT-NUKIZ6OKUXPJNT4C"#,
            r#"-A KUBE-FW-NUKIZ6OKUXPJNT4C -s 10.9.0.0/16 -j KUBE-MARK-DROP"#,
        ];
        let allowed: Vec<String> = allowed_sources(nat).iter().map(|r| r.to_string()).collect();
        assert_eq!(allowed, ["5.6.7.8", "192.0.2.7", "203.0.113.0/25"]);
        let drop = parse_firewall_drops(FILTER).remove(0);
        let e = entry(drop, allowed_sources(nat));
        assert!(e.drops("198.19.1.10".parse().unwrap()));
        assert!(!e.drops("203.0.113.5".parse().unwrap()));
        assert_eq!(e.chain.as_deref(), Some("KUBE-FW-NUKIZ6OKUXPJNT4C"));
        // IPv6 ranges, as ip6tables writes them.
        let v6 = allowed_sources([
            "-A KUBE-FW-ABCDEFGHIJKLMNOP -s 2001:db8:1::/48 -j KUBE-EXT-ABCDEFGHIJKLMNOP",
        ]);
        assert_eq!(v6[0].to_string(), "2001:db8:1::/48");
    }

    /// kube-proxy's firewall (both families) as iptables-restore loads it into a scratch
    /// namespace, read back by the agent's reader (netlink on iptables-nft, `iptables -S` on
    /// the legacy backend): one entry per family with the chain's ranges (root only).
    #[test]
    fn the_reader_reads_a_real_firewall_in_both_families() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let tools = ["iptables-restore", "ip6tables-restore"];
        if !root || !tools.iter().all(|t| super::super::command_exists(t)) {
            eprintln!("skipping: needs root, iptables-restore and ip6tables-restore");
            return;
        }
        let ns = crate::state::test_netns::Netns::new("iptfw", &[""]);
        let rules = |lb: &str, range: &str| {
            format!(
                "*nat\n:KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]\n:KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]\n\
                 -A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment \"ns5/svc5:p80 loadbalancer IP\" -s {range} -j KUBE-EXT-NUKIZ6OKUXPJNT4C\n\
                 -A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment \"other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL\"\n\
                 COMMIT\n*filter\n:KUBE-PROXY-FIREWALL - [0:0]\n\
                 -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
                 -A KUBE-PROXY-FIREWALL -m comment --comment \"ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C\" -m tcp -p tcp -d {lb} --dport 80 -j DROP\n\
                 COMMIT\n"
            )
        };
        ns.restore(
            0,
            &["iptables-restore"],
            &rules("5.6.7.8", "203.0.113.0/25"),
        );
        ns.restore(
            0,
            &["ip6tables-restore"],
            &rules("2001:db8::10", "2001:db8:1::/48"),
        );
        let read = ns.run_in(0, || {
            super::super::read_firewall_now(&crate::state::changes::Touched::everything())
        });
        let got: Vec<(String, String, String)> = read
            .iter()
            .map(|e| {
                (
                    format!("{}:{}/{}", e.addr, e.port, e.proto.as_str()),
                    e.allowed_text(),
                    e.chain.clone().unwrap_or_default(),
                )
            })
            .collect();
        let want = |a: &str, r: &str| {
            (
                a.to_string(),
                r.to_string(),
                "KUBE-FW-NUKIZ6OKUXPJNT4C".to_string(),
            )
        };
        assert_eq!(
            got,
            [
                want("5.6.7.8:80/tcp", "203.0.113.0/25"),
                want("2001:db8::10:80/tcp", "2001:db8:1::/48"),
            ]
        );
        assert_eq!(read[0].service.as_deref(), Some("ns5/svc5:p80"));
    }
}
