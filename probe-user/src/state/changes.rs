//! Cheap signals that the service table may have changed, so the full read (the nf_tables
//! dumps, `iptables-legacy-save`, the IPVS dump) runs on change instead of on a timer.
//!
//! - nf_tables: every commit (iptables-nft, `iptables-restore` on the nft backend, `nft -f`,
//!   kube-proxy's nftables mode) ends with an `NFT_MSG_NEWGEN` message on the
//!   `NFNLGRP_NFTABLES` multicast group of `NETLINK_NETFILTER`. [`NftWatch`] subscribes and
//!   reports each commit. A full restore also publishes one message per rule: when they
//!   overflow the socket buffer the kernel says `ENOBUFS`, and that counts as a commit (the
//!   generation message may be among the lost ones). The generation is per network namespace
//!   and counts commits to any table, so a commit here is "maybe changed": the reader's hash of
//!   its dump says whether kube-proxy's rules really did.
//!   Each message names its table and object (a rule its chain, a set element its set):
//!   [`Touched`] gathers them between two reads, so the iptables reader lists only those
//!   chains again (see `state::iptables`).
//! - iptables-legacy has no notification: [`legacy_fingerprint`] is the entry count and blob
//!   size of each loaded legacy table (`IPT_SO_GET_INFO`, one `getsockopt` each; no module is
//!   loaded, only tables named in `/proc/net/ip*_tables_names` are asked). A rewrite that keeps
//!   both the same (an endpoint's address swapped for one of the same width) is not seen: the
//!   `--services-every` safety net catches it.
//! - IPVS's generic-netlink family has no multicast group: [`super::ipvs::services_digest`]
//!   dumps the virtual services alone (no per-service destination dumps, one round trip) and
//!   hashes them. Destination-only changes (endpoint churn) wait for the safety net: verdicts
//!   use which VIP:ports are served, the backends are evidence text.
//! - ipsets (IPVS mode's `externalTrafficPolicy: Local` NodePorts) have no notification either;
//!   they are re-read with every full read.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    os::fd::AsRawFd,
};

use netlink_packet_core::NlasIterator;

use crate::netlink;

/// `NFNLGRP_NFTABLES` (include/uapi/linux/netfilter/nfnetlink.h).
pub const NFNLGRP_NFTABLES: u32 = 7;
/// `NETLINK_NETFILTER`.
const NETLINK_NETFILTER: isize = 12;
/// `NFNL_SUBSYS_NFTABLES`.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFT_MSG_NEWGEN`: the message closing every nf_tables commit.
const NFT_MSG_NEWGEN: u16 = 15;
/// The netlink message type of a new generation.
pub const NEWGEN_TYPE: u16 = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN;

/// Whether a buffer of multicast messages holds a commit's generation message. Pure; a
/// malformed buffer counts as a commit (re-reading is the safe side).
pub fn has_new_generation(buf: &[u8]) -> bool {
    match netlink::split(buf) {
        Ok(messages) => messages
            .iter()
            .any(|m| m.len() >= 6 && u16::from_ne_bytes([m[4], m[5]]) == NEWGEN_TYPE),
        Err(_) => true,
    }
}

/// `NFPROTO_IPV4` / `NFPROTO_IPV6`: the nfgenmsg family of `ip` / `ip6` tables.
pub const FAMILY_IP: u8 = 2;
pub const FAMILY_IP6: u8 = 10;

/// More names than this between two reads is "everything" (a full restore publishes one
/// message per rule; their chains are then better read in one dump than one by one).
pub const MAX_NAMED: usize = 4096;

/// What changed in one table since the last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableChange<'a> {
    Untouched,
    /// The table itself was created, deleted or changed, or messages were lost.
    Whole,
    /// Only these chains, sets and maps (by name).
    Named(&'a BTreeSet<String>),
}

/// What a run of nf_tables messages changed: per table, the chains and sets they name
/// (rules name their chain, set elements their set), so a reader can re-read those alone.
/// Lost or unreadable messages make it [`Touched::everything`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Touched {
    everything: bool,
    /// (family, table) -> the names touched; None: the whole table.
    tables: BTreeMap<(u8, String), Option<BTreeSet<String>>>,
    named: usize,
}

impl Touched {
    /// Anything may have changed (the first read, a lost message, the safety net).
    pub fn everything() -> Touched {
        Touched {
            everything: true,
            ..Touched::default()
        }
    }

    /// `names` of table `table` in `family` touched (the readers' tests).
    pub fn naming<'a>(
        family: u8,
        table: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Touched {
        let mut t = Touched::default();
        for n in names {
            t.name(family, table.to_string(), n.to_string());
        }
        t
    }

    pub fn is_everything(&self) -> bool {
        self.everything
    }

    /// How many names (chains, sets) are touched.
    pub fn named(&self) -> usize {
        self.named
    }

    pub fn is_empty(&self) -> bool {
        !self.everything && self.tables.is_empty()
    }

    /// What changed in table `table` of `family`.
    pub fn table(&self, family: u8, table: &str) -> TableChange<'_> {
        if self.everything {
            return TableChange::Whole;
        }
        match self.tables.get(&(family, table.to_string())) {
            None => TableChange::Untouched,
            Some(None) => TableChange::Whole,
            Some(Some(names)) => TableChange::Named(names),
        }
    }

    fn whole_table(&mut self, family: u8, table: String) {
        if let Some(Some(names)) = self.tables.insert((family, table), None) {
            self.named -= names.len();
        }
    }

    fn name(&mut self, family: u8, table: String, name: String) {
        if self.everything {
            return;
        }
        // A whole-table entry (None) already covers the name.
        if let Some(names) = self
            .tables
            .entry((family, table))
            .or_insert_with(|| Some(BTreeSet::new()))
            && names.insert(name)
        {
            self.named += 1;
        }
        if self.named > MAX_NAMED {
            *self = Touched::everything();
        }
    }

    pub fn merge(&mut self, other: Touched) {
        if other.everything {
            *self = Touched::everything();
            return;
        }
        for ((family, table), names) in other.tables {
            match names {
                None => self.whole_table(family, table),
                Some(names) => {
                    for n in names {
                        self.name(family, table.clone(), n);
                    }
                }
            }
        }
    }
}

/// The nf_tables message types (the low byte; include/uapi/linux/netfilter/nf_tables.h).
const NFT_MSG_NEWTABLE: u8 = 0;
const NFT_MSG_DELTABLE: u8 = 2;
const NFT_MSG_NEWCHAIN: u8 = 3;
const NFT_MSG_DELCHAIN: u8 = 5;
const NFT_MSG_NEWRULE: u8 = 6;
const NFT_MSG_DELRULE: u8 = 8;
const NFT_MSG_NEWSET: u8 = 9;
const NFT_MSG_DELSET: u8 = 11;
const NFT_MSG_NEWSETELEM: u8 = 12;
const NFT_MSG_DELSETELEM: u8 = 14;
/// `NFT_MSG_DESTROY*` (6.3+), from DESTROYTABLE to DESTROYSETELEM.
const NFT_MSG_DESTROY: std::ops::RangeInclusive<u8> = 26..=30;

/// The attribute that names the table: 1 in every object's message (`NFTA_TABLE_NAME`,
/// `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`, `NFTA_SET_ELEM_LIST_TABLE`).
const ATTR_TABLE: u16 = 1;
/// `NFTA_CHAIN_NAME`.
const ATTR_CHAIN_NAME: u16 = 3;
/// `NFTA_RULE_CHAIN`, `NFTA_SET_NAME`, `NFTA_SET_ELEM_LIST_SET`.
const ATTR_OBJECT: u16 = 2;

/// What a buffer of multicast messages touched, and whether it holds a commit's generation
/// message. Pure; a malformed buffer or message touches everything (re-reading is the safe
/// side).
pub fn touched_by(buf: &[u8]) -> (Touched, bool) {
    let Ok(messages) = netlink::split(buf) else {
        return (Touched::everything(), true);
    };
    let mut touched = Touched::default();
    let mut commit = false;
    // The (family, table, name) of the last message, as raw bytes: a restore publishes a
    // chain's rules one after another, and a repeat needs no allocation and no set insert.
    let mut last: Option<(u8, &[u8], &[u8])> = None;
    for m in messages {
        if m.len() < 20 {
            continue;
        }
        let ty = u16::from_ne_bytes([m[4], m[5]]);
        if ty >> 8 != NFNL_SUBSYS_NFTABLES {
            continue;
        }
        let (op, family) = (ty as u8, m[16]);
        if u16::from(op) == NFT_MSG_NEWGEN {
            commit = true;
            continue;
        }
        let name_attr = match op {
            NFT_MSG_NEWTABLE | NFT_MSG_DELTABLE => None,
            NFT_MSG_NEWCHAIN | NFT_MSG_DELCHAIN => Some(ATTR_CHAIN_NAME),
            NFT_MSG_NEWRULE | NFT_MSG_DELRULE | NFT_MSG_NEWSET | NFT_MSG_DELSET
            | NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM => Some(ATTR_OBJECT),
            op if NFT_MSG_DESTROY.contains(&op) => None,
            // Objects, flowtables, and what this build does not know: no service table reads
            // them.
            _ => continue,
        };
        if touched.is_everything() {
            // Nothing a name could add: the rest of the buffer only matters for its commit.
            continue;
        }
        let (mut table, mut name) = (None, None);
        for attr in NlasIterator::new(&m[20..]) {
            let Ok(attr) = attr else {
                return (Touched::everything(), true);
            };
            let kind = attr.kind();
            if kind != ATTR_TABLE && Some(kind) != name_attr {
                continue;
            }
            // The value borrowed from the message itself (not from `attr`), so the last
            // message's names can be compared with the next one's.
            let len = usize::from(attr.length());
            let whole = attr.into_inner();
            let value = c_bytes(whole.get(4..len.min(whole.len())).unwrap_or_default());
            if kind == ATTR_TABLE {
                table = Some(value);
            } else {
                name = Some(value);
            }
        }
        match (table, name_attr, name) {
            (Some(table), None, _) => match c_string(table) {
                Some(table) => touched.whole_table(family, table),
                None => return (Touched::everything(), true),
            },
            (Some(table), Some(_), Some(name)) => {
                if last == Some((family, table, name)) {
                    continue;
                }
                match (c_string(table), c_string(name)) {
                    (Some(t), Some(n)) => touched.name(family, t, n),
                    _ => return (Touched::everything(), true),
                }
                last = Some((family, table, name));
            }
            // A message without the names it should carry: be safe.
            _ => return (Touched::everything(), true),
        }
    }
    (touched, commit)
}

/// An attribute's string bytes, up to its NUL.
fn c_bytes(value: &[u8]) -> &[u8] {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    &value[..end]
}

fn c_string(value: &[u8]) -> Option<String> {
    std::str::from_utf8(value).ok().map(str::to_string)
}

/// The receive buffer asked for (`SO_RCVBUFFORCE`; root): a kube-proxy partial sync at 10,000
/// Services rewrites `KUBE-SERVICES`, 20,000 messages of a few hundred bytes. Only a full
/// restore should overflow it (and that is read in one dump anyway).
const RCVBUF: libc::c_int = 64 << 20;

/// A subscription to nf_tables' commits in the calling thread's network namespace.
pub struct NftWatch {
    socket: netlink_sys::Socket,
    buf: Vec<u8>,
}

impl NftWatch {
    pub fn open() -> io::Result<NftWatch> {
        let mut socket = netlink_sys::Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.add_membership(NFNLGRP_NFTABLES)?;
        // Best effort: without it the default buffer overflows sooner, which reads more, not
        // less.
        let size: libc::c_int = RCVBUF;
        // SAFETY: setsockopt on a descriptor we own, with a c_int value and its size.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const size).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        Ok(NftWatch {
            socket,
            buf: vec![0; 256 * 1024],
        })
    }

    /// Blocks until the next commit (or until messages were lost, which may hide one), and
    /// says what the messages up to it touched.
    pub fn wait_commit(&mut self) -> io::Result<Touched> {
        let mut touched = Touched::default();
        loop {
            match self.socket.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => {
                    // Once everything is touched (a full restore), the names of the rest of
                    // its tens of thousands of messages change nothing: only the commit is
                    // looked for.
                    let commit = if touched.is_everything() {
                        has_new_generation(&self.buf[..n])
                    } else {
                        let (t, commit) = touched_by(&self.buf[..n]);
                        touched.merge(t);
                        commit
                    };
                    if commit {
                        return Ok(touched);
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    return Ok(Touched::everything());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO` (the same number at `SOL_IP` and `SOL_IPV6`).
const SO_GET_INFO: libc::c_int = 64;

/// `struct ipt_getinfo` (= `ip6t_getinfo`).
#[repr(C)]
struct GetInfo {
    name: [u8; 32],
    valid_hooks: u32,
    hook_entry: [u32; 5],
    underflow: [u32; 5],
    num_entries: u32,
    size: u32,
}

/// The entry count and blob size of each loaded legacy table, hashed; None when no legacy
/// table is loaded (then there is nothing of legacy to watch).
pub fn legacy_fingerprint() -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut any = false;
    for (names, family, level) in [
        (
            "/proc/thread-self/net/ip_tables_names",
            libc::AF_INET,
            libc::SOL_IP,
        ),
        (
            "/proc/thread-self/net/ip6_tables_names",
            libc::AF_INET6,
            libc::SOL_IPV6,
        ),
    ] {
        let Ok(text) = std::fs::read_to_string(names) else {
            continue;
        };
        for table in text.lines().map(str::trim).filter(|t| !t.is_empty()) {
            any = true;
            table.hash(&mut h);
            get_info(family, level, table).hash(&mut h);
        }
    }
    any.then(|| h.finish())
}

/// (entries, size, hook entry points) of one legacy table; None when it cannot be asked.
fn get_info(family: libc::c_int, level: libc::c_int, table: &str) -> Option<(u32, u32, [u32; 5])> {
    if table.len() >= 32 {
        return None;
    }
    // SAFETY: plain socket/getsockopt/close on a descriptor we own; `info` is a repr(C) struct
    // of the kernel's layout and its size is passed.
    unsafe {
        let fd = libc::socket(
            family,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        );
        if fd < 0 {
            return None;
        }
        let mut info: GetInfo = std::mem::zeroed();
        info.name[..table.len()].copy_from_slice(table.as_bytes());
        let mut len = std::mem::size_of::<GetInfo>() as libc::socklen_t;
        let rc = libc::getsockopt(fd, level, SO_GET_INFO, (&raw mut info).cast(), &mut len);
        libc::close(fd);
        (rc == 0).then_some((info.num_entries, info.size, info.hook_entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(ty: u16) -> Vec<u8> {
        let mut m = vec![0u8; 20];
        m[..4].copy_from_slice(&20u32.to_ne_bytes());
        m[4..6].copy_from_slice(&ty.to_ne_bytes());
        m
    }

    /// An nf_tables message as the kernel multicasts it: header, nfgenmsg, string attributes.
    /// [`nft_message`] naming a table and one object in it (a rule's chain, a set element's
    /// set).
    fn object_message(op: u8, family: u8, table: &str, object: &str) -> Vec<u8> {
        nft_message(op, family, &[(ATTR_TABLE, table), (ATTR_OBJECT, object)])
    }

    fn nft_message(op: u8, family: u8, attrs: &[(u16, &str)]) -> Vec<u8> {
        let mut m = vec![0u8; 20];
        m[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | u16::from(op)).to_ne_bytes());
        m[16] = family;
        for (kind, value) in attrs {
            let len = 4 + value.len() + 1;
            m.extend((len as u16).to_ne_bytes());
            m.extend(kind.to_ne_bytes());
            m.extend(value.as_bytes());
            m.push(0);
            m.resize(m.len().next_multiple_of(4), 0);
        }
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn a_commit_names_the_chains_and_sets_it_touched() {
        let mut batch = Vec::new();
        // An endpoint moved: its service chain rewritten, one endpoint chain created, one
        // deleted (iptables-nft, table ip nat).
        for (op, chain) in [
            (NFT_MSG_DELRULE, "KUBE-SVC-A"),
            (NFT_MSG_NEWRULE, "KUBE-SVC-A"),
            (NFT_MSG_NEWRULE, "KUBE-SVC-A"),
            (NFT_MSG_NEWRULE, "KUBE-SEP-NEW"),
        ] {
            batch.extend(object_message(op, FAMILY_IP, "nat", chain));
        }
        batch.extend(nft_message(
            NFT_MSG_DELCHAIN,
            FAMILY_IP,
            &[(ATTR_TABLE, "nat"), (ATTR_CHAIN_NAME, "KUBE-SEP-OLD")],
        ));
        // kube-proxy's nftables mode: a map element.
        batch.extend(object_message(
            NFT_MSG_NEWSETELEM,
            FAMILY_IP,
            "kube-proxy",
            "service-ips",
        ));
        // The same chain name in ip6 is another table.
        batch.extend(object_message(
            NFT_MSG_NEWRULE,
            FAMILY_IP6,
            "nat",
            "KUBE-SERVICES",
        ));
        let (touched, commit) = touched_by(&batch);
        assert!(!commit, "no generation message yet");
        let names = |family, table| match touched.table(family, table) {
            TableChange::Named(n) => n.iter().cloned().collect::<Vec<_>>(),
            other => panic!("{table}: {other:?}"),
        };
        assert_eq!(
            names(FAMILY_IP, "nat"),
            ["KUBE-SEP-NEW", "KUBE-SEP-OLD", "KUBE-SVC-A"]
        );
        assert_eq!(names(FAMILY_IP, "kube-proxy"), ["service-ips"]);
        assert_eq!(names(FAMILY_IP6, "nat"), ["KUBE-SERVICES"]);
        assert_eq!(touched.table(FAMILY_IP, "filter"), TableChange::Untouched);

        // The generation message ends the commit; a table-level message covers the table.
        let mut more = nft_message(NFT_MSG_DELTABLE, FAMILY_IP, &[(ATTR_TABLE, "nat")]);
        more.extend(message(NEWGEN_TYPE));
        let (whole, commit) = touched_by(&more);
        assert!(commit);
        let mut all = touched.clone();
        all.merge(whole);
        assert_eq!(all.table(FAMILY_IP, "nat"), TableChange::Whole);
        assert_eq!(names(FAMILY_IP6, "nat"), ["KUBE-SERVICES"]);
        assert!(matches!(
            all.table(FAMILY_IP6, "nat"),
            TableChange::Named(_)
        ));
    }

    #[test]
    fn what_cannot_be_read_touches_everything() {
        // A rule without its chain, a truncated attribute, garbage.
        let nameless = nft_message(NFT_MSG_NEWRULE, FAMILY_IP, &[(ATTR_TABLE, "nat")]);
        assert!(touched_by(&nameless).0.is_everything());
        let mut cut = nft_message(NFT_MSG_NEWRULE, FAMILY_IP, &[(ATTR_TABLE, "nat")]);
        cut.extend([200, 0, 2, 0]);
        let len = cut.len() as u32;
        cut[..4].copy_from_slice(&len.to_ne_bytes());
        assert!(touched_by(&cut).0.is_everything());
        assert!(
            touched_by(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17])
                .0
                .is_everything()
        );
        // Too many names to read one by one is everything too.
        let mut many = Touched::default();
        for i in 0..=MAX_NAMED {
            many.name(FAMILY_IP, "nat".into(), format!("KUBE-SEP-{i}"));
        }
        assert!(many.is_everything());
        // Another subsystem's messages touch nothing.
        let (other, commit) = touched_by(&message((1 << 8) | 6));
        assert!(other.is_empty() && !commit);
    }

    #[test]
    fn a_restore_names_each_chain_once_and_still_ends_in_its_commit() {
        // A chain's rules one after another (as a restore publishes them), then another.
        let mut batch = Vec::new();
        for chain in [
            "KUBE-SVC-A",
            "KUBE-SVC-A",
            "KUBE-SVC-A",
            "KUBE-SEP-B",
            "KUBE-SVC-A",
        ] {
            batch.extend(object_message(NFT_MSG_NEWRULE, FAMILY_IP, "nat", chain));
        }
        let (touched, commit) = touched_by(&batch);
        assert!(!commit);
        assert_eq!(touched.named(), 2);
        match touched.table(FAMILY_IP, "nat") {
            TableChange::Named(n) => assert_eq!(
                n.iter().cloned().collect::<Vec<_>>(),
                ["KUBE-SEP-B", "KUBE-SVC-A"]
            ),
            other => panic!("{other:?}"),
        }
        // The same chain name in another family is another table, not a repeat.
        let mut two = object_message(NFT_MSG_NEWRULE, FAMILY_IP, "nat", "KUBE-SERVICES");
        two.extend(object_message(
            NFT_MSG_NEWRULE,
            FAMILY_IP6,
            "nat",
            "KUBE-SERVICES",
        ));
        assert_eq!(touched_by(&two).0.named(), 2);
        // More names than can be read one by one: everything, and the generation message at
        // the end of the buffer is still the commit.
        let mut full = Vec::new();
        for i in 0..=MAX_NAMED + 10 {
            full.extend(object_message(
                NFT_MSG_NEWRULE,
                FAMILY_IP,
                "nat",
                &format!("KUBE-SEP-{i}"),
            ));
        }
        full.extend(message(NEWGEN_TYPE));
        let (touched, commit) = touched_by(&full);
        assert!(touched.is_everything() && commit);
    }

    #[test]
    fn a_commit_is_its_generation_message() {
        // NFT_MSG_NEWRULE (6) alone is part of a commit still being published.
        let rule = message((NFNL_SUBSYS_NFTABLES << 8) | 6);
        assert!(!has_new_generation(&rule));
        let mut batch = rule.clone();
        batch.extend(message(NEWGEN_TYPE));
        assert!(has_new_generation(&batch));
        // Another subsystem's message with the same low byte is not one.
        assert!(!has_new_generation(&message((1 << 8) | NFT_MSG_NEWGEN)));
        // Garbage is treated as a change (a re-read is the safe side).
        assert!(has_new_generation(&[
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17
        ]));
    }
}
