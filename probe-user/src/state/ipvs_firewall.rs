//! kube-proxy IPVS mode's firewall for `loadBalancerSourceRanges`, from `ipset save`, read into
//! the [`FirewallEntry`]s the nftables and iptables readers fill.
//!
//! kubernetes `pkg/proxy/ipvs/proxier.go` (`syncProxyRules`, `ipsetInfo`,
//! `ipsetWithIptablesChain`): for an LB ingress IP of a Service with source ranges it adds
//! `IP,proto:port` to `KUBE-LOAD-BALANCER-FW` (hash:ip,port), `IP,proto:port,range` per range
//! to `KUBE-LOAD-BALANCER-SOURCE-CIDR` (hash:ip,port,net), and, when a range holds the node IP,
//! `IP,proto:port,IP` to `KUBE-LOAD-BALANCER-SOURCE-IP` (hash:ip,port,ip). The filter table
//! applies them: `KUBE-PROXY-FIREWALL` (jumped from `INPUT` and `FORWARD`) sends the FW set to
//! `KUBE-SOURCE-RANGES-FIREWALL`, which `RETURN`s for the two source sets (`dst,dst,src`) and
//! `DROP`s the rest. Since 1.25 (kubernetes PR #110628; before it the nat table marked the
//! packet with `KUBE-MARK-DROP`). The LB IP is bound on kube-ipvs0, so a pod's call is
//! delivered locally and dies in `INPUT`, before IPVS sees it (kubernetes#109575). The IPv6
//! sets are named `KUBE-6-...`, cut to 31 characters (`pkg/proxy/ipvs/ipset.go`, `NewIPSet`).
//! Pure.

use std::{collections::BTreeMap, net::IpAddr};

use probe_contract::Proto;
use probe_core::state::{FirewallEntry, SourceRange};

/// The set of firewalled LB IP:ports, by family.
pub fn fw_set(v6: bool) -> &'static str {
    if v6 {
        "KUBE-6-LOAD-BALANCER-FW"
    } else {
        "KUBE-LOAD-BALANCER-FW"
    }
}

/// The set of allowed (LB IP:port, range), by family. The IPv6 name is cut to ipset's 31
/// characters (`NewIPSet` truncates it: "Ipset name truncated").
pub fn source_cidr_set(v6: bool) -> &'static str {
    if v6 {
        "KUBE-6-LOAD-BALANCER-SOURCE-CID"
    } else {
        "KUBE-LOAD-BALANCER-SOURCE-CIDR"
    }
}

/// The set of allowed (LB IP:port, LB IP) kube-proxy adds when a range holds the node IP.
pub fn source_ip_set(v6: bool) -> &'static str {
    if v6 {
        "KUBE-6-LOAD-BALANCER-SOURCE-IP"
    } else {
        "KUBE-LOAD-BALANCER-SOURCE-IP"
    }
}

/// The filter chain that drops what the source sets do not return.
pub const SOURCE_RANGES_CHAIN: &str = "KUBE-SOURCE-RANGES-FIREWALL";

/// `IP,proto:port` (an ipset `hash:ip,port` member, or the start of a longer one) and the rest.
fn ip_port(member: &str) -> Option<(IpAddr, Proto, u16, Option<&str>)> {
    let mut parts = member.splitn(3, ',');
    let addr: IpAddr = parts.next()?.parse().ok()?;
    let (proto, port) = parts.next()?.split_once(':')?;
    let proto = match proto {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        _ => return None,
    };
    Some((addr, proto, port.parse().ok()?, parts.next()))
}

/// One entry per member of the FW sets (TCP and UDP), with the sources the source sets return
/// for it, in address order. A member without any source entry gets none (then
/// [`FirewallEntry::drops`] says nothing is dropped: kube-proxy never writes one so).
pub fn firewall_entries(sets: &BTreeMap<String, Vec<String>>) -> Vec<FirewallEntry> {
    let members = |name: &str| sets.get(name).into_iter().flatten();
    let mut out: Vec<FirewallEntry> = Vec::new();
    for v6 in [false, true] {
        for (addr, proto, port, _) in members(fw_set(v6)).filter_map(|m| ip_port(m)) {
            if out
                .iter()
                .any(|e| (e.addr, e.proto, e.port) == (addr, proto, port))
            {
                continue;
            }
            let mut allowed: Vec<SourceRange> = members(source_cidr_set(v6))
                .chain(members(source_ip_set(v6)))
                .filter_map(|m| ip_port(m))
                .filter(|(a, p, n, _)| (*a, *p, *n) == (addr, proto, port))
                .filter_map(|(_, _, _, src)| SourceRange::parse(src?))
                .collect();
            allowed.sort_by_key(|r| (r.first, r.last));
            allowed.dedup();
            out.push(FirewallEntry {
                addr,
                proto,
                port,
                service: None,
                chain: None,
                allowed,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ipset::parse_save;

    /// `ipset save` (v7.17, captured on this project's host) of the sets as kube-proxy makes
    /// them for an LB IP with `loadBalancerSourceRanges: [192.0.2.0/24, 198.51.100.0/24,
    /// 10.0.0.0/8]` on a node whose IP is in a range, a UDP one, and an IPv6 one.
    const CAPTURE: &str = include_str!("../../tests/data/ipset/source-ranges-save.txt");

    fn texts(entries: &[FirewallEntry]) -> Vec<(String, String)> {
        entries
            .iter()
            .map(|e| {
                (
                    format!("{}:{}/{}", e.addr, e.port, e.proto.as_str()),
                    e.allowed_text(),
                )
            })
            .collect()
    }

    #[test]
    fn each_fw_member_gets_its_own_ranges() {
        let entries = firewall_entries(&parse_save(CAPTURE));
        assert_eq!(
            texts(&entries),
            [
                (
                    "203.0.113.10:80/tcp".to_string(),
                    "10.0.0.0/8, 192.0.2.0/24, 198.51.100.0/24, 203.0.113.10".to_string()
                ),
                ("203.0.113.11:53/udp".to_string(), "192.0.2.7".to_string()),
                (
                    "2001:db8:113::10:80/tcp".to_string(),
                    "2001:db8:51::/48".to_string()
                ),
            ]
        );
        let tcp = &entries[0];
        assert!(tcp.drops("198.19.1.10".parse().unwrap()));
        assert!(!tcp.drops("10.0.0.5".parse().unwrap()));
        // Another port of the same IP is not firewalled.
        assert!(!entries.iter().any(|e| e.port == 443));
    }

    #[test]
    fn no_fw_set_no_entry_and_garbage_never_panics() {
        assert!(
            firewall_entries(&parse_save("create KUBE-LOOP-BACK hash:ip,port,ip\n")).is_empty()
        );
        let sets = parse_save(
            "add KUBE-LOAD-BALANCER-FW 203.0.113.10,sctp:80\n\
             add KUBE-LOAD-BALANCER-FW notanip,tcp:80\n\
             add KUBE-LOAD-BALANCER-FW 203.0.113.10,tcp\n\
             add KUBE-LOAD-BALANCER-FW 203.0.113.10,tcp:99999\n\
             add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.10,tcp:80,nonsense\n",
        );
        assert!(firewall_entries(&sets).is_empty());
        for cut in 0..CAPTURE.len() {
            if CAPTURE.is_char_boundary(cut) {
                let _ = firewall_entries(&parse_save(&CAPTURE[..cut]));
            }
        }
    }
}
