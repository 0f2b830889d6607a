//! iptables-nft rules read back from their nf_tables expressions: what `iptables-save` does
//! (iptables `iptables/nft-ruleparse.c`, `nft-ipv4.c`, `nft-ipv6.c`), reduced to the
//! [`Rule`] fields the service table uses. Pure and total: an expression run it does not
//! know is skipped (the rule keeps what it did understand).
//!
//! What iptables-nft 1.8.9 writes (read with `nft --debug=netlink list table ip nat` after an
//! `iptables-nft-restore` of `tests/data/iptables/lab-kube-proxy.rules`):
//! - `-s`/`-d`: `payload load Nb @ network header + 12/16` (ip6: + 8/24), N the prefix's whole
//!   bytes, with a `bitwise` mask for a prefix that is not, then `cmp eq` (`neq` for `!`);
//! - `-p tcp`: `meta load l4proto` + `cmp` (older releases: `payload @ network header + 9`);
//! - `-m tcp --dport P`: `payload load 2b @ transport header + 2` + `cmp eq`; `-m tcp`
//!   without ports stays the compat match `tcp` (`struct xt_tcp`), as do older releases';
//! - `-m comment`, `-m addrtype`, `-m mark` (older), ...: compat matches (`match name X rev R`
//!   with the xtables `info` struct); `-m mark` of 1.8.9 is `meta load mark` + `bitwise` + `cmp`;
//! - `-j CHAIN` / `-g CHAIN` / `-j RETURN`: an immediate verdict; other targets (`DNAT`,
//!   `MASQUERADE`, `MARK`, `SNAT`) compat targets (`target name X rev R`);
//! - iptables-nft may write `--src-type LOCAL` natively as `fib saddr type local` (the kernel
//!   then needs no xt_addrtype); both are read.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::rules::Rule;
use crate::state::{
    changes::FAMILY_IP6,
    nft_netlink::wire::{self, Data, Expr, NftRule},
};

/// `NF_NAT_RANGE_*` flags (uapi `linux/netfilter/nf_nat.h`).
const NF_NAT_RANGE_MAP_IPS: u32 = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
const NF_NAT_RANGE_PROTO_RANDOM: u32 = 4;
const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 16;
/// `XT_ADDRTYPE_LOCAL` (1 << RTN_LOCAL) and `XT_ADDRTYPE_INVERT_SOURCE`
/// (uapi `linux/netfilter/xt_addrtype.h`).
const XT_ADDRTYPE_LOCAL: u16 = 1 << 2;
const XT_ADDRTYPE_INVERT_SOURCE: u32 = 1;
/// `RTN_LOCAL`: what `fib ... type` loads for a local address.
const RTN_LOCAL: u32 = 2;
/// `XT_TCP_INV_DSTPT` / `XT_UDP_INV_DSTPT`.
const XT_INV_DSTPT: u8 = 0x02;

/// What the last load put in the register a `cmp` then reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loaded {
    Nothing,
    Payload { base: u32, offset: u32, len: u32 },
    Meta(u32),
    Fib { flags: u32, result: u32 },
}

/// The pieces of `iptables -S` text, kept for the rules whose text is evidence
/// (`MASQUERADE`), in the order `iptables-save` prints them (`nft_ipv46_save_rule`: addresses,
/// interfaces, protocol, then the matches in rule order, then the target).
#[derive(Default)]
struct Text {
    src: Option<String>,
    dst: Option<String>,
    iif: Option<String>,
    oif: Option<String>,
    proto: Option<String>,
    matches: Vec<String>,
}

/// The [`Rule`] an iptables-nft rule of an `ip`/`ip6` table is; its `iptables -S` text is
/// kept for a `MASQUERADE` rule (evidence), a pod short circuit (its detector) or with
/// `keep_text`.
pub(super) fn rule_from_nft(r: &NftRule, keep_text: bool) -> Rule {
    let v6 = r.family == FAMILY_IP6;
    let mut rule = Rule {
        chain: r.chain.clone(),
        comment: r.comment.clone(),
        ..Rule::default()
    };
    let mut text = Text::default();
    let mut loaded = Loaded::Nothing;
    let mut mask: Option<&[u8]> = None;
    let mut target_text = String::new();
    for e in &r.exprs {
        match e {
            Expr::Payload {
                base, offset, len, ..
            } => {
                loaded = Loaded::Payload {
                    base: *base,
                    offset: *offset,
                    len: *len,
                };
                mask = None;
            }
            Expr::Meta {
                key, dreg: Some(_), ..
            } => {
                loaded = Loaded::Meta(*key);
                mask = None;
            }
            Expr::Fib { flags, result, .. } => {
                loaded = Loaded::Fib {
                    flags: *flags,
                    result: *result,
                };
                mask = None;
            }
            Expr::Bitwise { mask: m, .. } => mask = Some(m),
            Expr::Cmp { op, data, .. } => {
                let neg = match *op {
                    wire::NFT_CMP_EQ => false,
                    wire::NFT_CMP_NEQ => true,
                    // Ranges (`--dport A:B`) are not a port kube-proxy matches on.
                    _ => continue,
                };
                if !compare_loaded(&mut rule, &mut text, loaded, mask, data, neg, v6) {
                    continue;
                }
                loaded = Loaded::Nothing;
                mask = None;
            }
            Expr::Match { name, rev, info } => {
                text.matches.push(compat_match(&mut rule, name, *rev, info));
            }
            Expr::Immediate {
                dreg: 0,
                data: Data::Verdict(v),
            } => {
                let (flag, target) = match (v.code, v.target()) {
                    (wire::NFT_GOTO, Some(c)) => ("-g", c.to_string()),
                    (_, Some(c)) => ("-j", c.to_string()),
                    (wire::NF_ACCEPT, _) => ("-j", "ACCEPT".into()),
                    (wire::NF_DROP, _) => ("-j", "DROP".into()),
                    (wire::NFT_RETURN, _) => ("-j", "RETURN".into()),
                    _ => continue,
                };
                target_text = format!("{flag} {target}");
                rule.target = Some(target);
            }
            Expr::Target { name, rev, info } => {
                target_text = format!("-j {name}");
                match name.as_str() {
                    "DNAT" => {
                        if let Some(to) = dnat_destination(*rev, info, v6) {
                            target_text.push_str(&format!(" --to-destination {to}"));
                            rule.to_destination = Some(to);
                        }
                    }
                    "MASQUERADE" => {
                        target_text.push_str(&masquerade_options(info, v6));
                    }
                    _ => {}
                }
                rule.target = Some(name.clone());
            }
            Expr::Masq { flags, .. } => {
                target_text = format!("-j MASQUERADE{}", nat_flag_options(*flags));
                rule.target = Some("MASQUERADE".into());
            }
            _ => {}
        }
    }
    if keep_text || super::rules::keeps_text(&rule) {
        rule.text = save_text(&r.chain, text, target_text);
    }
    rule
}

/// The rule as `iptables -S` prints it.
fn save_text(chain: &str, text: Text, target_text: String) -> String {
    let mut parts = vec![format!("-A {chain}")];
    parts.extend(
        [text.src, text.dst, text.iif, text.oif, text.proto]
            .into_iter()
            .flatten(),
    );
    parts.extend(text.matches);
    parts.push(target_text);
    parts.join(" ")
}

/// A `cmp` against what the last load put in the register: the match it reads as, into
/// `rule` and `text`. False when the value is not one the rule can hold (the load then stays
/// for a later `cmp`).
fn compare_loaded(
    rule: &mut Rule,
    text: &mut Text,
    loaded: Loaded,
    mask: Option<&[u8]>,
    data: &[u8],
    neg: bool,
    v6: bool,
) -> bool {
    let (src_at, dst_at, addr_len) = if v6 { (8, 24, 16) } else { (12, 16, 4) };
    let bang = if neg { "! " } else { "" };
    match loaded {
        Loaded::Payload {
            base: wire::NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len,
        } if (offset == src_at || offset == dst_at) && len as usize <= addr_len => {
            let Some(addr) = prefix_text(data, mask, addr_len) else {
                return false;
            };
            if offset == dst_at {
                text.dst = Some(format!("{bang}-d {addr}"));
                rule.dst = Some(addr);
                rule.dst_negated = neg;
            } else {
                text.src = Some(format!("{bang}-s {addr}"));
            }
        }
        Loaded::Payload {
            base: wire::NFT_PAYLOAD_NETWORK_HEADER,
            offset: 9,
            len: 1,
        } if !v6 => set_proto(rule, text, data, neg),
        Loaded::Meta(wire::NFT_META_L4PROTO) => set_proto(rule, text, data, neg),
        Loaded::Payload {
            base: wire::NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: 2,
            len: 2,
        } => {
            if let [a, b, ..] = data[..] {
                let port = u16::from_be_bytes([a, b]);
                if !neg {
                    rule.dport = Some(port);
                }
                let m = rule.proto.clone().unwrap_or_else(|| "tcp".into());
                text.matches.push(format!("-m {m} {bang}--dport {port}"));
            }
        }
        Loaded::Meta(key @ (wire::NFT_META_IIFNAME | wire::NFT_META_OIFNAME)) => {
            let name = interface_text(data);
            let flag = if key == wire::NFT_META_IIFNAME {
                &mut text.iif
            } else {
                &mut text.oif
            };
            let opt = if key == wire::NFT_META_IIFNAME {
                "-i"
            } else {
                "-o"
            };
            *flag = Some(format!("{bang}{opt} {name}"));
        }
        Loaded::Meta(wire::NFT_META_MARK) => {
            let value = u32_ne(data).unwrap_or(0);
            let m = mask.and_then(u32_ne).unwrap_or(u32::MAX);
            let mark = if m == u32::MAX {
                format!("{value:#x}")
            } else {
                format!("{value:#x}/{m:#x}")
            };
            text.matches.push(format!("-m mark {bang}--mark {mark}"));
        }
        Loaded::Fib {
            flags,
            result: wire::NFT_FIB_RESULT_ADDRTYPE,
        } => {
            let local = u32_ne(data) == Some(RTN_LOCAL);
            let which = if flags & wire::NFTA_FIB_F_SADDR != 0 {
                if local && !neg {
                    rule.src_type_local = true;
                }
                "--src-type"
            } else {
                "--dst-type"
            };
            if local {
                text.matches
                    .push(format!("-m addrtype {bang}{which} LOCAL"));
            }
        }
        _ => {}
    }
    true
}

fn set_proto(rule: &mut Rule, text: &mut Text, data: &[u8], neg: bool) {
    let Some(&n) = data.first() else { return };
    let name = match n {
        6 => "tcp".to_string(),
        17 => "udp".to_string(),
        132 => "sctp".to_string(),
        1 => "icmp".to_string(),
        58 => "ipv6-icmp".to_string(),
        n => n.to_string(),
    };
    text.proto = Some(format!("{}-p {name}", if neg { "! " } else { "" }));
    if !neg {
        rule.proto = Some(name);
    }
}

fn u32_ne(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?))
}

/// `198.19.0.0/16` from the compared bytes (the prefix's whole bytes) and the mask, if any.
fn prefix_text(data: &[u8], mask: Option<&[u8]>, addr_len: usize) -> Option<String> {
    if data.len() > addr_len {
        return None;
    }
    let mut addr = [0u8; 16];
    addr[..data.len()].copy_from_slice(data);
    let bits = match mask {
        Some(m) => m.iter().map(|b| b.count_ones()).sum::<u32>(),
        None => data.len() as u32 * 8,
    };
    let ip = if addr_len == 4 {
        IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(addr))
    };
    Some(format!("{ip}/{bits}"))
}

/// An interface name as compared: NUL-padded, or a `+` wildcard's prefix (no NUL).
fn interface_text(data: &[u8]) -> String {
    match data.iter().position(|&b| b == 0) {
        Some(end) => String::from_utf8_lossy(&data[..end]).into_owned(),
        None => format!("{}+", String::from_utf8_lossy(data)),
    }
}

/// Fills what a compat match says into `rule`; returns its `iptables -S` text.
fn compat_match(rule: &mut Rule, name: &str, rev: u32, info: &[u8]) -> String {
    match name {
        // struct xt_comment_info { char comment[256]; }
        "comment" => {
            let end = info.iter().position(|&b| b == 0).unwrap_or(info.len());
            let comment = String::from_utf8_lossy(&info[..end]).into_owned();
            let quoted = quote(&comment);
            rule.comment = Some(comment);
            format!("-m comment --comment {quoted}")
        }
        "addrtype" => {
            // rev 1: { u16 source; u16 dest; u32 flags; }, rev 0: { u16 source; u16 dest;
            // u32 invert_source; u32 invert_dest; }
            let (Some(src), Some(dst)) = (u16_at(info, 0), u16_at(info, 2)) else {
                return "-m addrtype".into();
            };
            let flags = u32_at(info, 4).unwrap_or(0);
            let inv_src = if rev == 0 {
                flags != 0
            } else {
                flags & XT_ADDRTYPE_INVERT_SOURCE != 0
            };
            if src & XT_ADDRTYPE_LOCAL != 0 && !inv_src {
                rule.src_type_local = true;
            }
            let mut t = "-m addrtype".to_string();
            if src & XT_ADDRTYPE_LOCAL != 0 {
                t.push_str(if inv_src {
                    " ! --src-type LOCAL"
                } else {
                    " --src-type LOCAL"
                });
            }
            if dst & XT_ADDRTYPE_LOCAL != 0 {
                t.push_str(" --dst-type LOCAL");
            }
            t
        }
        // struct xt_tcp { u16 spts[2], dpts[2]; u8 option, flg_mask, flg_cmp, invflags; }
        // struct xt_udp { u16 spts[2], dpts[2]; u8 invflags; }
        "tcp" | "udp" => {
            let inv_at = if name == "tcp" { 11 } else { 8 };
            let (lo, hi) = (u16_at(info, 4), u16_at(info, 6));
            let inv = info.get(inv_at).is_some_and(|f| f & XT_INV_DSTPT != 0);
            match (lo, hi) {
                (Some(lo), Some(hi)) if lo == hi => {
                    if !inv {
                        rule.dport = Some(lo);
                    }
                    format!("-m {name} {}--dport {lo}", if inv { "! " } else { "" })
                }
                _ => format!("-m {name}"),
            }
        }
        // struct xt_mark_mtinfo1 { u32 mark, mask; u8 invert; } (iptables-nft before 1.8.9;
        // 1.8.9 writes `meta mark` natively, read above).
        "mark" if rev >= 1 => match (u32_at(info, 0), u32_at(info, 4)) {
            (Some(mark), Some(mask)) => {
                let bang = if info.get(8).is_some_and(|i| *i != 0) {
                    "! "
                } else {
                    ""
                };
                if mask == u32::MAX {
                    format!("-m mark {bang}--mark {mark:#x}")
                } else {
                    format!("-m mark {bang}--mark {mark:#x}/{mask:#x}")
                }
            }
            _ => "-m mark".into(),
        },
        // struct xt_set_info_match_v1.. { struct xt_set_info { u16 index; u8 dim; u8 flags; }
        // match_set; ... }: flags bit 0 negates, bit i says dimension i is `src`
        // (uapi `linux/netfilter/ipset/ip_set.h`, iptables `extensions/libxt_set.c`). The
        // kernel keeps the set's index, not its name: it is written `set#INDEX`.
        "set" if rev >= 1 => match (u16_at(info, 0), info.get(2), info.get(3)) {
            (Some(index), Some(&dim), Some(&flags)) => {
                let dirs: Vec<&str> = (1..=dim.min(6))
                    .map(|i| if flags & (1 << i) != 0 { "src" } else { "dst" })
                    .collect();
                let bang = if flags & 1 != 0 { "! " } else { "" };
                format!("-m set {bang}--match-set set#{index} {}", dirs.join(","))
            }
            _ => "-m set".into(),
        },
        other => format!("-m {other}"),
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// iptables' quoting of a comment (`xtables_save_string`): always in double quotes, `"` and
/// `\` escaped.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `--to-destination` of a compat DNAT target, as `iptables-save` prints it (`IP[:port]`,
/// `[IP6]:port`, ranges as `a-b`). rev 0 (IPv4): `struct nf_nat_ipv4_multi_range_compat`
/// (u32 rangesize; { u32 flags; be32 min_ip, max_ip; be16 min, max; }); rev 1 and 2:
/// `struct nf_nat_range(2)` (u32 flags; 16-byte min_addr, max_addr; be16 min_proto,
/// max_proto; ...).
fn dnat_destination(rev: u32, info: &[u8], v6: bool) -> Option<String> {
    let (flags, min, max, pmin, pmax) = if rev == 0 && !v6 {
        let a = |at| -> Option<IpAddr> {
            let b: [u8; 4] = info.get(at..at + 4)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(b)))
        };
        (
            u32_at(info, 4)?,
            a(8)?,
            a(12)?,
            be16_at(info, 16)?,
            be16_at(info, 18)?,
        )
    } else {
        let a = |at| -> Option<IpAddr> {
            if v6 {
                let b: [u8; 16] = info.get(at..at + 16)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            } else {
                let b: [u8; 4] = info.get(at..at + 4)?.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(b)))
            }
        };
        (
            u32_at(info, 0)?,
            a(4)?,
            a(20)?,
            be16_at(info, 36)?,
            be16_at(info, 38)?,
        )
    };
    let mut out = String::new();
    if flags & NF_NAT_RANGE_MAP_IPS != 0 {
        out.push_str(&min.to_string());
        if max != min {
            out.push('-');
            out.push_str(&max.to_string());
        }
        if v6 && flags & NF_NAT_RANGE_PROTO_SPECIFIED != 0 {
            out = format!("[{out}]");
        }
    }
    if flags & NF_NAT_RANGE_PROTO_SPECIFIED != 0 {
        out.push_str(&format!(":{pmin}"));
        if pmax != pmin {
            out.push_str(&format!("-{pmax}"));
        }
    }
    (!out.is_empty()).then_some(out)
}

/// A compat MASQUERADE target's options as `iptables-save` prints them: IPv4's info is
/// `struct nf_nat_ipv4_multi_range_compat` (the flags at 4, ports at 16), IPv6's
/// `struct nf_nat_range` (flags at 0, ports at 36).
fn masquerade_options(info: &[u8], v6: bool) -> String {
    let (flags, ports) = if v6 {
        (u32_at(info, 0), (be16_at(info, 36), be16_at(info, 38)))
    } else {
        (u32_at(info, 4), (be16_at(info, 16), be16_at(info, 18)))
    };
    let flags = flags.unwrap_or(0);
    let mut out = String::new();
    if flags & NF_NAT_RANGE_PROTO_SPECIFIED != 0
        && let (Some(lo), Some(hi)) = ports
    {
        out.push_str(&format!(" --to-ports {lo}"));
        if hi != lo {
            out.push_str(&format!("-{hi}"));
        }
    }
    out.push_str(&nat_flag_options(flags));
    out
}

fn nat_flag_options(flags: u32) -> String {
    let mut out = String::new();
    if flags & NF_NAT_RANGE_PROTO_RANDOM != 0 {
        out.push_str(" --random");
    }
    if flags & NF_NAT_RANGE_PROTO_RANDOM_FULLY != 0 {
        out.push_str(" --random-fully");
    }
    out
}
