//! An nf_tables netlink client (`NETLINK_NETFILTER`, `NFNL_SUBSYS_NFTABLES`): the questions the
//! iptables and nftables readers ask the kernel directly, instead of running `iptables-save`,
//! `iptables -S` or `nft -j` and parsing their text.
//!
//! - [`generation`]: the ruleset generation (`NFT_MSG_GETGEN`), bumped by every commit of any
//!   table in the network namespace: a reader that keeps what it read with the generation it
//!   read at re-reads nothing while it is unchanged;
//! - [`rules`]: the rules of one table, or of one chain only (`NFT_MSG_GETRULE` dump with
//!   `NFTA_RULE_TABLE` and `NFTA_RULE_CHAIN`: the kernel filters, `nf_tables_dump_rules`),
//!   handed over one by one as they are decoded (a 10,000-Service nat table is ~60,000 rules:
//!   never held as bytes);
//! - [`table_rules`]: every rule of a table, in one dump or chain by chain when the table is
//!   large (the kernel's whole-table dump is quadratic, see [`WHOLE_DUMP_MAX_CHAINS`]);
//! - [`chains`]: a table's chains (`NFT_MSG_GETCHAIN`);
//! - [`set_elems`]: a set's or map's elements (`NFT_MSG_GETSETELEM`).
//!
//! Rules come decoded into typed expressions ([`wire::Expr`]); what they mean for iptables-nft
//! is `state::iptables`' business, for kube-proxy's nftables mode `state::nftables`'.
//! Every call works in the calling thread's network namespace, on a socket the thread keeps
//! ([`crate::netlink::with_kept`]). A dump the kernel marks as interrupted
//! (`NLM_F_DUMP_INTR`: a commit landed during it) is run again, up to [`DUMP_TRIES`] times.

pub mod wire;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
pub use wire::{Data, Expr, NftChain, NftRule, SetElem, Verdict, WireError};
use wire::{NFT_MSG_GETCHAIN, NFT_MSG_GETGEN, NFT_MSG_GETRULE, NFT_MSG_GETSETELEM, NftRequest};

use crate::netlink::{self, NetlinkError};

/// `NETLINK_NETFILTER`.
const NETLINK_NETFILTER: isize = 12;
/// `NFPROTO_UNSPEC`: the family of a generation request.
const FAMILY_UNSPEC: u8 = 0;
/// How many times a dump interrupted by a commit is started again before giving up.
pub const DUMP_TRIES: u32 = 4;

/// Why an nf_tables question could not be answered; `what` names it (family, table, chain).
#[derive(Debug, thiserror::Error)]
pub enum NftNetlinkError {
    /// The socket failed, or the kernel refused (`ENOENT`: no such table or set).
    #[error("nf_tables {what}: {source}")]
    Netlink {
        what: String,
        #[source]
        source: NetlinkError,
    },
    #[error("nf_tables {what}: undecodable reply: {source}")]
    Decode {
        what: String,
        #[source]
        source: WireError,
    },
    #[error("nf_tables {what}: the ruleset changed during each of {tries} dumps")]
    Interrupted { what: String, tries: u32 },
}

impl NftNetlinkError {
    /// The kernel said the table, chain or set does not exist.
    pub fn is_absent(&self) -> bool {
        matches!(self, NftNetlinkError::Netlink { source, .. }
            if source.kernel_errno() == Some(libc::ENOENT))
    }
}

/// nft's name of an nfgenmsg family (`ip`, `ip6`, ...), for messages.
pub fn family_name(family: u8) -> &'static str {
    match family {
        1 => "inet",
        2 => "ip",
        3 => "arp",
        7 => "bridge",
        10 => "ip6",
        0 => "unspec",
        _ => "family?",
    }
}

/// Sends `req` and hands each nf_tables message of the reply to `on_message`; the first
/// decode error (or an interrupted dump) stops the handing and is returned.
fn ask(
    what: &dyn Fn() -> String,
    req: NftRequest,
    dump: bool,
    on_message: &mut dyn FnMut(wire::NftMessage<'_>) -> Result<(), WireError>,
) -> Result<(), NftNetlinkError> {
    let msg = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(req));
    let mut failed: Option<WireError> = None;
    let sent = netlink::with_kept(NETLINK_NETFILTER, "nf_tables request", |conn| {
        conn.request_each("nf_tables request", msg, dump, &mut |bytes| {
            if failed.is_some() {
                return;
            }
            let handled = wire::message(bytes).and_then(|m| match m {
                Some(m) => on_message(m),
                None => Ok(()),
            });
            if let Err(e) = handled {
                failed = Some(e);
            }
        })
    });
    sent.map_err(|source| NftNetlinkError::Netlink {
        what: what(),
        source,
    })?;
    match failed {
        Some(source) => Err(NftNetlinkError::Decode {
            what: what(),
            source,
        }),
        None => Ok(()),
    }
}

/// [`ask`] for a dump, started again while the kernel marks it interrupted; `reset` drops
/// what a try had handed over.
fn dump(
    what: &dyn Fn() -> String,
    req: NftRequest,
    reset: &mut dyn FnMut(),
    on_message: &mut dyn FnMut(wire::NftMessage<'_>) -> Result<(), WireError>,
) -> Result<(), NftNetlinkError> {
    for _ in 0..DUMP_TRIES {
        match ask(what, req.clone(), true, on_message) {
            Err(NftNetlinkError::Decode {
                source: WireError::Interrupted,
                ..
            }) => reset(),
            other => return other,
        }
    }
    Err(NftNetlinkError::Interrupted {
        what: what(),
        tries: DUMP_TRIES,
    })
}

/// The calling thread's network namespace, by its cookie (`SO_NETNS_COOKIE`, Linux 5.14+), to
/// key what a reader keeps with the generation it read at: unlike the namespace file's inode, never reused by a later namespace, and a generation
/// (which starts again low in every new namespace) is only meaningful within one. Falls back
/// to the inode.
pub fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    const SO_NETNS_COOKIE: libc::c_int = 71;
    // SAFETY: plain socket calls on a descriptor this function owns and closes; the option
    // value is a u64 with its size passed.
    let cookie = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            None
        } else {
            let mut v: u64 = 0;
            let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
            let rc = libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_NETNS_COOKIE,
                (&mut v as *mut u64).cast(),
                &mut len,
            );
            libc::close(fd);
            (rc == 0).then_some(v)
        }
    };
    cookie.unwrap_or_else(|| {
        std::fs::metadata("/proc/thread-self/ns/net")
            .map(|m| m.ino() | 1 << 63)
            .unwrap_or(0)
    })
}

/// The ruleset generation of the calling thread's network namespace (`NFTA_GEN_ID`).
pub fn generation() -> Result<u32, NftNetlinkError> {
    let what = || "generation".to_string();
    let mut id = None;
    ask(
        &what,
        NftRequest::new(NFT_MSG_GETGEN, FAMILY_UNSPEC),
        false,
        &mut |m| {
            if let Some(g) = wire::generation(&m)? {
                id = Some(g);
            }
            Ok(())
        },
    )?;
    id.ok_or(NftNetlinkError::Decode {
        what: what(),
        source: WireError::Missing {
            what: "generation reply",
            missing: "NFT_MSG_NEWGEN",
        },
    })
}

/// Whether table `table` of `family` exists (`NFT_MSG_GETTABLE`: the kernel refuses with
/// `ENOENT` when not).
pub fn table_exists(family: u8, table: &str) -> Result<bool, NftNetlinkError> {
    let what = || format!("table {} {table}", family_name(family));
    match ask(
        &what,
        NftRequest::new(wire::NFT_MSG_GETTABLE, family).with_str(wire::NFTA_TABLE_NAME, table),
        false,
        &mut |_| Ok(()),
    ) {
        Ok(()) => Ok(true),
        Err(e) if e.is_absent() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether chain `chain` of table `table` in `family` exists (`NFT_MSG_GETCHAIN` for that one
/// chain: the kernel refuses with `ENOENT` when the table or the chain does not exist). No
/// rule is read.
pub fn chain_exists(family: u8, table: &str, chain: &str) -> Result<bool, NftNetlinkError> {
    let what = || format!("chain {} {table} {chain}", family_name(family));
    match ask(
        &what,
        NftRequest::new(NFT_MSG_GETCHAIN, family)
            .with_str(wire::NFTA_CHAIN_TABLE, table)
            .with_str(wire::NFTA_CHAIN_NAME, chain),
        false,
        &mut |_| Ok(()),
    ) {
        Ok(()) => Ok(true),
        Err(e) if e.is_absent() => Ok(false),
        Err(e) => Err(e),
    }
}

/// The rules of `table` in `family`, of chain `chain` only when given, in the kernel's order
/// (chain by chain, each in rule order), handed to `on_rule` one by one. `on_reset` is called
/// when an interrupted dump starts again (what was handed over is stale). A chain that does
/// not exist has no rules (the kernel's dump filter finds none); a missing table is
/// [`NftNetlinkError::is_absent`].
pub fn rules(
    family: u8,
    table: &str,
    chain: Option<&str>,
    on_reset: &mut dyn FnMut(),
    on_rule: &mut dyn FnMut(NftRule),
) -> Result<(), NftNetlinkError> {
    let what = || match chain {
        Some(c) => format!("rules of {} {table} chain {c}", family_name(family)),
        None => format!("rules of table {} {table}", family_name(family)),
    };
    let mut req = NftRequest::new(NFT_MSG_GETRULE, family).with_str(wire::NFTA_RULE_TABLE, table);
    if let Some(c) = chain {
        req = req.with_str(wire::NFTA_RULE_CHAIN, c);
    }
    dump(&what, req, on_reset, &mut |m| {
        if let Some(r) = wire::rule(&m)?
            && r.table == table
            && chain.is_none_or(|c| c == r.chain)
        {
            on_rule(r);
        }
        Ok(())
    })
}

/// Tables of more chains than this are dumped chain by chain ([`table_rules`]).
///
/// The kernel's dump of a whole table is quadratic in its rules: each reply batch (at most
/// 32 KiB, `netlink_recvmsg` caps `max_recvmsg_len`) walks every chain and rule from the
/// start again and skips the ones already sent (`nf_tables_dump_rules` and
/// `__nf_tables_dump_rules`, net/netfilter/nf_tables_api.c: one running `idx` over all
/// chains against `ctx->s_idx`). A dump filtered to one chain finds it in the table's chain
/// hash (`rhltable_lookup` on `chains_ht`) and walks that chain only. Measured here (perf,
/// `nft list table ip nat` of kube-proxy's rules for 30,000 Services, 32,000 chains and
/// 164,000 rules): 82% of the time in `__nf_tables_dump_rules`, 9 s of system time (0.8 s at
/// 10,000). One dump per chain costs a request each (tens of microseconds), so small tables
/// keep the single dump.
pub const WHOLE_DUMP_MAX_CHAINS: usize = 1_000;

/// The rules of every chain of `table` in `family`, handed to `on_rule` in the order of a
/// whole-table dump (chain by chain in the kernel's chain order, each in rule order): one
/// dump of the table when it has at most `max_whole_chains` chains, else one filtered dump
/// per chain (see [`WHOLE_DUMP_MAX_CHAINS`]). Chain by chain, a commit between two chains'
/// dumps (the generation moved) starts the read again, up to [`DUMP_TRIES`] times, with
/// `on_reset` first, as an interrupted dump does (a chain deleted after the chain list reads
/// as empty, as `rules` says, and its commit moved the generation). A missing table is
/// [`NftNetlinkError::is_absent`] (or no rules).
pub fn table_rules(
    family: u8,
    table: &str,
    max_whole_chains: usize,
    on_reset: &mut dyn FnMut(),
    on_rule: &mut dyn FnMut(NftRule),
) -> Result<(), NftNetlinkError> {
    for _ in 0..DUMP_TRIES {
        let before = generation()?;
        let names: Vec<String> = chains(family, table)?.into_iter().map(|c| c.name).collect();
        if names.len() <= max_whole_chains {
            return rules(family, table, None, on_reset, on_rule);
        }
        // An interrupted chain dump moved the generation too: the check below starts again.
        let mut ignore_reset = || {};
        for name in &names {
            rules(family, table, Some(name), &mut ignore_reset, on_rule)?;
        }
        if generation()? == before {
            return Ok(());
        }
        on_reset();
    }
    Err(NftNetlinkError::Interrupted {
        what: format!(
            "rules of table {} {table}, chain by chain",
            family_name(family)
        ),
        tries: DUMP_TRIES,
    })
}

/// [`rules`], collected.
pub fn rules_vec(
    family: u8,
    table: &str,
    chain: Option<&str>,
) -> Result<Vec<NftRule>, NftNetlinkError> {
    collect_rules(|on_reset, on_rule| rules(family, table, chain, on_reset, on_rule))
}

/// A read's rules in a `Vec`, emptied when the read starts again.
fn collect_rules(
    read: impl FnOnce(&mut dyn FnMut(), &mut dyn FnMut(NftRule)) -> Result<(), NftNetlinkError>,
) -> Result<Vec<NftRule>, NftNetlinkError> {
    let out = std::cell::RefCell::new(Vec::new());
    read(&mut || out.borrow_mut().clear(), &mut |r| {
        out.borrow_mut().push(r)
    })?;
    Ok(out.into_inner())
}

/// The chains of `table` in `family`.
pub fn chains(family: u8, table: &str) -> Result<Vec<NftChain>, NftNetlinkError> {
    let what = || format!("chains of table {} {table}", family_name(family));
    let out = std::cell::RefCell::new(Vec::new());
    dump(
        &what,
        NftRequest::new(NFT_MSG_GETCHAIN, family).with_str(wire::NFTA_CHAIN_TABLE, table),
        &mut || out.borrow_mut().clear(),
        &mut |m| {
            if let Some(c) = wire::chain(&m)?
                && c.table == table
            {
                out.borrow_mut().push(c);
            }
            Ok(())
        },
    )?;
    Ok(out.into_inner())
}

/// The elements of set or map `set` of `table` in `family`.
pub fn set_elems(family: u8, table: &str, set: &str) -> Result<Vec<SetElem>, NftNetlinkError> {
    let what = || format!("elements of {} {table} set {set}", family_name(family));
    let out = std::cell::RefCell::new(Vec::new());
    dump(
        &what,
        NftRequest::new(NFT_MSG_GETSETELEM, family)
            .with_str(wire::NFTA_SET_ELEM_LIST_TABLE, table)
            .with_str(wire::NFTA_SET_ELEM_LIST_SET, set),
        &mut || out.borrow_mut().clear(),
        &mut |m| {
            out.borrow_mut().extend(wire::set_elems(&m)?);
            Ok(())
        },
    )?;
    Ok(out.into_inner())
}

/// The name of the ipset of kernel index `index` (`IPSET_CMD_GET_BYINDEX`), None when no set
/// has it: what an iptables `-m set` match holds is the index.
pub fn ipset_name(index: u16) -> Result<Option<String>, NftNetlinkError> {
    let what = || format!("ipset of index {index}");
    let req = NftRequest::new(wire::IPSET_CMD_GET_BYINDEX, libc::AF_INET as u8)
        .with_bytes(wire::IPSET_ATTR_PROTOCOL, &[wire::IPSET_PROTOCOL])
        .with_bytes(wire::IPSET_ATTR_INDEX, &index.to_be_bytes());
    let req = NftRequest {
        subsystem: wire::NFNL_SUBSYS_IPSET,
        ..req
    };
    let msg = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(req));
    let reply = match netlink::with_kept(NETLINK_NETFILTER, "ipset request", |conn| {
        conn.request("ipset request", msg, false)
    }) {
        Ok(reply) => reply,
        Err(e) if e.kernel_errno() == Some(libc::ENOENT) => return Ok(None),
        Err(source) => {
            return Err(NftNetlinkError::Netlink {
                what: what(),
                source,
            });
        }
    };
    for m in split(&reply).map_err(|source| NftNetlinkError::Decode {
        what: what(),
        source,
    })? {
        if let Some(name) = wire::ipset_name(m).map_err(|source| NftNetlinkError::Decode {
            what: what(),
            source,
        })? {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// The raw reply of a rule dump of `table` (the messages as received, concatenated): how the
/// test captures are made (`CLB_NFT_CAPTURE`).
pub fn raw_rules(family: u8, table: &str) -> Result<Vec<u8>, NftNetlinkError> {
    raw(
        &|| format!("rules of table {} {table}", family_name(family)),
        NftRequest::new(NFT_MSG_GETRULE, family).with_str(wire::NFTA_RULE_TABLE, table),
    )
}

/// The raw reply of an element dump of `set` (see [`raw_rules`]).
pub fn raw_set_elems(family: u8, table: &str, set: &str) -> Result<Vec<u8>, NftNetlinkError> {
    raw(
        &|| format!("elements of {} {table} set {set}", family_name(family)),
        NftRequest::new(NFT_MSG_GETSETELEM, family)
            .with_str(wire::NFTA_SET_ELEM_LIST_TABLE, table)
            .with_str(wire::NFTA_SET_ELEM_LIST_SET, set),
    )
}

fn raw(what: &dyn Fn() -> String, req: NftRequest) -> Result<Vec<u8>, NftNetlinkError> {
    let msg = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(req));
    netlink::with_kept(NETLINK_NETFILTER, "nf_tables request", |conn| {
        conn.request("nf_tables request", msg, true)
    })
    .map_err(|source| NftNetlinkError::Netlink {
        what: what(),
        source,
    })
}

/// The rules in a captured reply (whole netlink messages, as [`raw_rules`] returns them).
pub fn decode_rules(bytes: &[u8]) -> Result<Vec<NftRule>, WireError> {
    let mut out = Vec::new();
    for m in split(bytes)? {
        if let Some(m) = wire::message(m)?
            && let Some(r) = wire::rule(&m)?
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// The set elements in a captured reply (see [`decode_rules`]).
pub fn decode_set_elems(bytes: &[u8]) -> Result<Vec<SetElem>, WireError> {
    let mut out = Vec::new();
    for m in split(bytes)? {
        if let Some(m) = wire::message(m)? {
            out.extend(wire::set_elems(&m)?);
        }
    }
    Ok(out)
}

fn split(bytes: &[u8]) -> Result<Vec<&[u8]>, WireError> {
    netlink::split(bytes).map_err(|_| WireError::ShortMessage { len: bytes.len() })
}

#[cfg(test)]
mod chain_dump_tests;
#[cfg(test)]
mod tests;
