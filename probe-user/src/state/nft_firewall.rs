//! kube-proxy's nftables firewall for `loadBalancerSourceRanges` (kubernetes PR #122614, in
//! 1.30; iptables mode has had its `KUBE-FW-*` form since PR #110289, 1.25): the verdict map
//! `firewall-ips` (`addr . proto . port : goto firewall-<HASH>-<ns>/<name>/<proto>/<port>`),
//! consulted by chain `firewall-check` in prerouting and output before DNAT, and in each
//! element's chain one rule `ip saddr != { <ranges> } drop` (`ip6 saddr` in the ip6 table).
//! So a pod's or the node's call to the LB IP from outside the ranges dies on the node
//! (kubernetes#109575). Read here into [`FirewallEntry`]s, from netlink or from `nft -j`.

use std::{collections::HashMap, net::IpAddr};

use probe_core::state::{FirewallEntry, SourceRange};
use serde_json::Value;

use super::nft_netlink::{
    self,
    wire::{self, Data, Expr, NftRule, SetElem},
};

/// The verdict map of firewalled destinations.
pub const FIREWALL_IPS: &str = "firewall-ips";
/// The chain that applies it (not a per-Service firewall chain).
const FIREWALL_CHECK: &str = "firewall-check";

/// `NFT_LOOKUP_F_INV`: the look-up matches when the key is *not* in the set.
const LOOKUP_INV: u32 = 1;
/// `NFT_SET_ELEM_INTERVAL_END`: the element ends an interval (exclusive).
const INTERVAL_END: u32 = 1;

/// A per-Service firewall chain (`firewall-<HASH>-...`), not `firewall-check`.
pub fn is_firewall_chain(chain: &str) -> bool {
    chain.starts_with("firewall-") && chain != FIREWALL_CHECK
}

/// One `firewall-ips` element, as either reader sees it.
pub struct FirewallElem {
    pub addr: IpAddr,
    pub proto: probe_contract::Proto,
    pub port: u16,
    pub chain: String,
    pub comment: Option<String>,
}

/// The entries of `elems`, each with its chain's allowed sources (`ranges`, by chain); an
/// element whose chain has no range rule is kept with none (it drops nothing).
pub fn entries(
    elems: &[FirewallElem],
    ranges: &HashMap<String, Vec<SourceRange>>,
) -> Vec<FirewallEntry> {
    elems
        .iter()
        .map(|e| FirewallEntry {
            addr: e.addr,
            proto: e.proto,
            port: e.port,
            service: e
                .comment
                .clone()
                .or_else(|| super::nftables::service_name(&e.chain)),
            chain: Some(e.chain.clone()),
            allowed: ranges.get(&e.chain).cloned().unwrap_or_default(),
        })
        .collect()
}

/// The allowed sources of each firewall chain in `raw` (one family's rule dump): its
/// `saddr != { ... } drop` rule's set, dumped (an anonymous interval set), or the single
/// prefix nft writes as a masked compare when the set has one element.
pub fn ranges_from_netlink(
    family: u8,
    table: &str,
    raw: &[NftRule],
) -> Result<HashMap<String, Vec<SourceRange>>, nft_netlink::NftNetlinkError> {
    let mut out = HashMap::new();
    for r in raw.iter().filter(|r| is_firewall_chain(&r.chain)) {
        let drops = r.exprs.iter().any(|e| {
            matches!(e, Expr::Immediate { dreg: 0, data: Data::Verdict(v) } if v.code == wire::NF_DROP)
        });
        if !drops {
            continue;
        }
        let ranges = match saddr_match(family, &r.exprs) {
            Some(SaddrMatch::NotInSet(set)) => {
                intervals(&nft_netlink::set_elems(family, table, &set)?)
            }
            Some(SaddrMatch::NotEqual(range)) => vec![range],
            None => continue,
        };
        out.insert(r.chain.clone(), ranges);
    }
    Ok(out)
}

/// How a rule matches a source outside the allowed ones.
enum SaddrMatch {
    /// `saddr != @set` (a look-up with the inverted flag).
    NotInSet(String),
    /// `saddr != prefix` (a payload load, a mask, a compare).
    NotEqual(SourceRange),
}

/// Where `family`'s source address sits in the network header: (offset, width).
fn saddr_field(family: u8) -> (u32, usize) {
    if family == super::changes::FAMILY_IP6 {
        (8, 16)
    } else {
        (12, 4)
    }
}

/// The rule's `saddr != ...` match: the source address loaded from the network header
/// (`family`'s [`saddr_field`]), then an inverted look-up or a not-equal compare. For one
/// prefix nft loads only the prefix's whole bytes (`ip6 saddr != 2001:db8:51::/48`: 6 bytes
/// at offset 8, then the compare; a bitwise mask only for a partial last byte), so a compare
/// of fewer bytes than an address is the prefix those bytes start.
fn saddr_match(family: u8, exprs: &[Expr]) -> Option<SaddrMatch> {
    let (saddr_offset, width) = saddr_field(family);
    let mut saddr_reg = None;
    let mut mask: Option<&[u8]> = None;
    for e in exprs {
        match e {
            Expr::Payload {
                dreg,
                base: wire::NFT_PAYLOAD_NETWORK_HEADER,
                offset,
                len,
            } if *offset == saddr_offset && (1..=width).contains(&(*len as usize)) => {
                saddr_reg = Some(*dreg);
            }
            Expr::Bitwise { sreg, mask: m, .. } if Some(*sreg) == saddr_reg => {
                mask = Some(m);
            }
            Expr::Lookup {
                set,
                sreg,
                dreg: None,
                flags,
            } if Some(*sreg) == saddr_reg && flags & LOOKUP_INV != 0 => {
                return Some(SaddrMatch::NotInSet(set.clone()));
            }
            Expr::Cmp { sreg, op, data }
                if Some(*sreg) == saddr_reg && *op == wire::NFT_CMP_NEQ =>
            {
                return prefix_of(data, mask, width).map(SaddrMatch::NotEqual);
            }
            _ => {}
        }
    }
    None
}

/// The range a not-equal compare of `data` (the loaded bytes, under `mask` if any) stands
/// for: the bytes not loaded or masked off are free, from all zeros to all ones.
fn prefix_of(data: &[u8], mask: Option<&[u8]>, width: usize) -> Option<SourceRange> {
    if data.is_empty() || data.len() > width {
        return None;
    }
    let mask = match mask {
        Some(m) if m.len() == data.len() => m.to_vec(),
        _ => vec![0xff; data.len()],
    };
    let mut first = vec![0u8; width];
    let mut last = vec![0xffu8; width];
    for (i, (d, m)) in data.iter().zip(&mask).enumerate() {
        first[i] = d & m;
        last[i] = d | !m;
    }
    Some(SourceRange {
        first: addr_of(&first)?,
        last: addr_of(&last)?,
    })
}

fn addr_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// The inclusive intervals of an interval set's elements: nft writes each interval as a start
/// element and an end element (exclusive, flagged `INTERVAL_END`; none when the interval runs
/// to the last address), in any order; newer kernels may give the end as the key's end.
pub fn intervals(elems: &[SetElem]) -> Vec<SourceRange> {
    let mut points: Vec<(&[u8], bool)> = Vec::new();
    let mut out = Vec::new();
    for e in elems {
        if let Some(end) = &e.key_end {
            if let (Some(first), Some(last)) = (addr_of(&e.key), addr_of(end)) {
                out.push(SourceRange { first, last });
            }
            continue;
        }
        points.push((&e.key, e.flags & INTERVAL_END == 0));
    }
    // Ends before starts at the same key: an end closes the interval before it.
    points.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
    let mut open: Option<&[u8]> = None;
    for (key, is_start) in points {
        match (is_start, open) {
            (true, None) => open = Some(key),
            (false, Some(start)) => {
                if let (Some(first), Some(last)) = (addr_of(start), addr_of(key).and_then(pred)) {
                    out.push(SourceRange { first, last });
                }
                open = None;
            }
            _ => {}
        }
    }
    if let Some(first) = open.and_then(addr_of) {
        let last = match first {
            IpAddr::V4(_) => IpAddr::from([0xff; 4]),
            IpAddr::V6(_) => IpAddr::from([0xff; 16]),
        };
        out.push(SourceRange { first, last });
    }
    out.sort_by_key(|r| r.first);
    out
}

/// The address before `a` (an exclusive end made inclusive).
fn pred(a: IpAddr) -> Option<IpAddr> {
    match a {
        IpAddr::V4(v) => u32::from(v)
            .checked_sub(1)
            .map(|n| IpAddr::from(n.to_be_bytes())),
        IpAddr::V6(v) => u128::from(v)
            .checked_sub(1)
            .map(|n| IpAddr::from(n.to_be_bytes())),
    }
}

/// The allowed sources of one firewall chain's rule as `nft -j` prints it (`expr`: the rule's
/// statements): `{"match": {"op": "!=", "left": {"payload": {"field": "saddr"}}, "right":
/// <set, prefix, range or address>}}` followed by `{"drop": null}`. None: not that rule.
pub fn ranges_from_json(expr: &str) -> Option<Vec<SourceRange>> {
    let stmts: Vec<Value> = serde_json::from_str(expr).ok()?;
    if !stmts.iter().any(|s| s.get("drop").is_some()) {
        return None;
    }
    stmts.iter().find_map(|s| {
        let m = s.get("match")?;
        let saddr = m.get("left")?.get("payload")?.get("field")?.as_str() == Some("saddr");
        if !saddr || m.get("op")?.as_str() != Some("!=") {
            return None;
        }
        let right = m.get("right")?;
        let items = match right.get("set") {
            Some(Value::Array(items)) => items.iter().collect(),
            _ => vec![right],
        };
        let mut ranges: Vec<SourceRange> =
            items.into_iter().map(json_range).collect::<Option<_>>()?;
        // In address order, as the netlink reader gives them.
        ranges.sort_by_key(|r| r.first);
        Some(ranges)
    })
}

/// `"a.b.c.d"`, `{"prefix": {"addr": ..., "len": n}}` or `{"range": [a, b]}`.
fn json_range(v: &Value) -> Option<SourceRange> {
    if let Some(s) = v.as_str() {
        return SourceRange::parse(s);
    }
    if let Some(p) = v.get("prefix") {
        let text = format!("{}/{}", p.get("addr")?.as_str()?, p.get("len")?.as_u64()?);
        return SourceRange::parse(&text);
    }
    let r = v.get("range")?.as_array()?;
    Some(SourceRange {
        first: r.first()?.as_str()?.parse().ok()?,
        last: r.get(1)?.as_str()?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::changes::{FAMILY_IP, FAMILY_IP6};

    fn elem(key: [u8; 4], end: bool) -> SetElem {
        SetElem {
            key: key.to_vec(),
            key_end: None,
            data: None,
            flags: if end { INTERVAL_END } else { 0 },
            comment: None,
        }
    }

    /// `{ 192.0.2.0/24, 198.19.0.0/16 }` as nft writes it into the kernel (a leading end at
    /// 0.0.0.0, each interval's end exclusive), in the kernel's dump order (descending).
    #[test]
    fn interval_set_elements_make_the_ranges() {
        let elems = [
            elem([198, 20, 0, 0], true),
            elem([198, 19, 0, 0], false),
            elem([192, 0, 3, 0], true),
            elem([192, 0, 2, 0], false),
            elem([0, 0, 0, 0], true),
        ];
        let text: Vec<String> = intervals(&elems).iter().map(|r| r.to_string()).collect();
        assert_eq!(text, ["192.0.2.0/24", "198.19.0.0/16"]);
        // An interval to the last address has no end element.
        let open = intervals(&[elem([0, 0, 0, 0], true), elem([128, 0, 0, 0], false)]);
        assert_eq!(open[0].to_string(), "128.0.0.0/1");
    }

    /// The firewall chain's rule as `nft -j` (1.0.6) prints kube-proxy's
    /// `ip saddr != { 192.0.2.0/24, 10.0.0.7 } drop`, and its one-prefix form.
    #[test]
    fn json_firewall_rule_is_read() {
        let set = r#"[{"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
            "right": {"set": [{"prefix": {"addr": "192.0.2.0", "len": 24}}, "10.0.0.7",
            {"range": ["10.1.0.1", "10.1.0.4"]}]}}}, {"drop": null}]"#;
        let r: Vec<String> = ranges_from_json(set)
            .unwrap()
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(r, ["10.0.0.7", "10.1.0.1-10.1.0.4", "192.0.2.0/24"]);
        let one = r#"[{"match": {"op": "!=", "left": {"payload": {"protocol": "ip6", "field": "saddr"}},
            "right": {"prefix": {"addr": "2001:db8::", "len": 32}}}}, {"drop": null}]"#;
        assert_eq!(
            ranges_from_json(one).unwrap()[0].to_string(),
            "2001:db8::/32"
        );
        // Not the range rule: no drop, or a destination match.
        assert!(ranges_from_json(&set.replace("drop", "accept")).is_none());
        assert!(ranges_from_json(&set.replace("saddr", "daddr")).is_none());
    }

    /// kube-proxy's firewall as `nft -f` loads it into a scratch namespace, read back over
    /// netlink and from `nft -j list table` (the two readers): the same entries, with the
    /// set's prefix, address and range, and the Service from the chain name.
    #[test]
    fn both_readers_read_a_real_firewall_alike() {
        if !crate::state::test_netns::root_with("nft") {
            return;
        }
        let ns = crate::state::test_netns::Netns::new("nftfw", &[""]);
        ns.restore(
            0,
            &["nft", "-f", "-"],
            "add table ip kube-proxy\n\
             add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
             add chain ip kube-proxy firewall-check\n\
             add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips\n\
             add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80\n\
             add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25, 192.0.2.7, 10.1.0.1-10.1.0.4 } drop\n\
             add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }\n",
        );
        let netlink = ns
            .run_in(0, || {
                crate::state::nftables::read_family(crate::state::changes::FAMILY_IP)
            })
            .unwrap()
            .unwrap();
        let json = ns.nft_list_table(0, "ip", "kube-proxy");
        let from_json =
            crate::state::nftables::parse_nft_json(&String::from_utf8_lossy(&json.stdout)).unwrap();
        assert_eq!(netlink.firewall.len(), 1, "{:?}", netlink.firewall);
        let f = &netlink.firewall[0];
        assert_eq!(f.addr, IpAddr::from([5, 6, 7, 8]));
        assert_eq!(f.service.as_deref(), Some("ns5/svc5:p80"));
        assert_eq!(
            f.allowed_text(),
            "10.1.0.1-10.1.0.4, 192.0.2.7, 203.0.113.0/25"
        );
        assert_eq!(
            from_json.firewall, netlink.firewall,
            "the JSON reader agrees"
        );
    }

    /// `ip saddr != 198.19.0.0/16 drop` as the kernel holds it (nft folds a one-element
    /// set): payload, bitwise mask, not-equal compare.
    #[test]
    fn netlink_masked_compare_is_one_range() {
        let exprs = [
            Expr::Payload {
                dreg: 1,
                base: wire::NFT_PAYLOAD_NETWORK_HEADER,
                offset: 12,
                len: 4,
            },
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                len: 4,
                mask: vec![255, 255, 0, 0],
                xor: vec![0; 4],
            },
            Expr::Cmp {
                sreg: 1,
                op: wire::NFT_CMP_NEQ,
                data: vec![198, 19, 0, 0],
            },
        ];
        let Some(SaddrMatch::NotEqual(r)) = saddr_match(FAMILY_IP, &exprs) else {
            panic!("not read");
        };
        assert_eq!(r.to_string(), "198.19.0.0/16");
    }

    /// One prefix on a byte boundary, as nft 1.x writes it (`nft --debug=netlink`): only the
    /// prefix's bytes loaded, no mask. `ip6 saddr != { 2001:db8:51::/48 } drop` is a 6-byte
    /// load at offset 8 (the lab's IPv6 firewall read no range from it: the call was dropped
    /// and nothing confirmed), `ip saddr != { 192.0.2.0/24 } drop` a 3-byte load at 12; a
    /// partial last byte keeps its mask (`192.0.16.0/20`).
    #[test]
    fn netlink_short_compare_is_the_prefix_of_its_bytes() {
        let read = |family, offset, data: &[u8], mask: Option<&[u8]>| {
            let len = data.len() as u32;
            let mut exprs = vec![Expr::Payload {
                dreg: 1,
                base: wire::NFT_PAYLOAD_NETWORK_HEADER,
                offset,
                len,
            }];
            exprs.extend(mask.map(|m| Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                len,
                mask: m.to_vec(),
                xor: vec![0; m.len()],
            }));
            exprs.push(Expr::Cmp {
                sreg: 1,
                op: wire::NFT_CMP_NEQ,
                data: data.to_vec(),
            });
            match saddr_match(family, &exprs) {
                Some(SaddrMatch::NotEqual(r)) => r.to_string(),
                _ => panic!("not read"),
            }
        };
        let v6 = [0x20, 0x01, 0x0d, 0xb8, 0x00, 0x51];
        assert_eq!(read(FAMILY_IP6, 8, &v6, None), "2001:db8:51::/48");
        assert_eq!(read(FAMILY_IP, 12, &[192, 0, 2], None), "192.0.2.0/24");
        assert_eq!(
            read(FAMILY_IP, 12, &[192, 0, 16], Some(&[255, 255, 0xf0])),
            "192.0.16.0/20"
        );
        // The IPv6 offset read in the ip table is not the source (TTL, protocol, checksum).
        let ttl = [Expr::Payload {
            dreg: 1,
            base: wire::NFT_PAYLOAD_NETWORK_HEADER,
            offset: 8,
            len: 1,
        }];
        assert!(saddr_match(FAMILY_IP, &ttl).is_none());
    }
}
