//! The nf_tables netlink message format (`NFNL_SUBSYS_NFTABLES`, uapi
//! `linux/netfilter/nf_tables.h` and `nfnetlink.h`; userdata TLVs of libnftnl's
//! `include/libnftnl/udata.h`), which no kept crate has: encoding the few requests the readers
//! send and decoding their replies. Pure: no socket here; [`super`] talks to the kernel.
//!
//! Bounded and hostile-safe: every length is checked against what holds it, nothing indexes
//! past a slice, an unknown attribute is skipped, an expression this file does not know is
//! [`Expr::Other`] and a malformed one is an error, never a panic.

use netlink_packet_core::{NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NetlinkSerializable};

/// `NFNL_SUBSYS_NFTABLES`: the high byte of every nf_tables message type.
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;

// enum nf_tables_msg_types
pub const NFT_MSG_GETTABLE: u8 = 1;
pub const NFT_MSG_NEWCHAIN: u8 = 3;
pub const NFT_MSG_GETCHAIN: u8 = 4;
pub const NFT_MSG_NEWRULE: u8 = 6;
pub const NFT_MSG_GETRULE: u8 = 7;
pub const NFT_MSG_NEWSETELEM: u8 = 12;
pub const NFT_MSG_GETSETELEM: u8 = 13;
pub const NFT_MSG_NEWGEN: u8 = 15;
pub const NFT_MSG_GETGEN: u8 = 16;

/// `NLM_F_DUMP_INTR`: the ruleset changed while the dump ran (its parts are of two generations).
pub const NLM_F_DUMP_INTR: u16 = 0x10;
const NLA_TYPE_MASK: u16 = 0x3fff;
const HEADER_LEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

// enum nft_gen_attributes
const NFTA_GEN_ID: u16 = 1;
/// `NFTA_TABLE_NAME`.
pub const NFTA_TABLE_NAME: u16 = 1;
// enum nft_chain_attributes
pub const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_HANDLE: u16 = 2;
pub const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
// enum nft_rule_attributes
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
// enum nft_list_attributes
const NFTA_LIST_ELEM: u16 = 1;
// enum nft_expr_attributes
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
// enum nft_set_elem_list_attributes
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
// enum nft_set_elem_attributes
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_KEY_END: u16 = 9;
// enum nft_data_attributes, nft_verdict_attributes
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// libnftnl udata types: `NFTNL_UDATA_RULE_COMMENT`, `NFTNL_UDATA_SET_ELEM_COMMENT`.
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;

/// Why a reply could not be decoded (what of it, and where).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{what}: attribute of length {len} at offset {offset} overruns its {room} bytes")]
    BadAttribute {
        what: &'static str,
        len: usize,
        offset: usize,
        room: usize,
    },
    #[error("{what}: {len} bytes where {want} were expected")]
    BadLength {
        what: &'static str,
        len: usize,
        want: usize,
    },
    #[error("{what} without its {missing}")]
    Missing {
        what: &'static str,
        missing: &'static str,
    },
    #[error("a message of {len} bytes is shorter than its headers")]
    ShortMessage { len: usize },
    #[error("the ruleset changed during the dump (NLM_F_DUMP_INTR)")]
    Interrupted,
}

// ----- attributes -------------------------------------------------------------------------------

/// The attributes of `buf` as (type without flags, value), in order; the first malformed one
/// ends the walk with an error.
pub fn attrs<'a>(
    what: &'static str,
    buf: &'a [u8],
) -> impl Iterator<Item = Result<(u16, &'a [u8]), WireError>> + 'a {
    let mut offset = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || offset >= buf.len() {
            return None;
        }
        let rest = &buf[offset..];
        let bad = |len| WireError::BadAttribute {
            what,
            len,
            offset,
            room: rest.len(),
        };
        if rest.len() < 4 {
            failed = true;
            return Some(Err(bad(rest.len())));
        }
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > rest.len() {
            failed = true;
            return Some(Err(bad(len)));
        }
        offset += (len + 3) & !3;
        Some(Ok((kind, &rest[4..len])))
    })
}

fn be32(what: &'static str, v: &[u8]) -> Result<u32, WireError> {
    match v {
        [a, b, c, d] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => Err(WireError::BadLength {
            what,
            len: v.len(),
            want: 4,
        }),
    }
}

fn be64(what: &'static str, v: &[u8]) -> Result<u64, WireError> {
    let b: [u8; 8] = v.try_into().map_err(|_| WireError::BadLength {
        what,
        len: v.len(),
        want: 8,
    })?;
    Ok(u64::from_be_bytes(b))
}

/// A NUL-terminated (or not) string attribute.
fn string(v: &[u8]) -> String {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// The comment of a libnftnl userdata blob (TLVs of u8 type, u8 length).
fn udata_comment(buf: &[u8], comment_type: u8) -> Option<String> {
    let mut rest = buf;
    while let [kind, len, tail @ ..] = rest {
        let len = *len as usize;
        let value = tail.get(..len)?;
        if *kind == comment_type {
            return Some(string(value));
        }
        rest = &tail[len..];
    }
    None
}

// ----- requests ---------------------------------------------------------------------------------

/// One nf_tables request: a message type, the nfgenmsg family and attributes (strings are
/// sent NUL-terminated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRequest {
    /// The nfnetlink subsystem: [`NFNL_SUBSYS_NFTABLES`], or [`NFNL_SUBSYS_IPSET`] for the one
    /// ipset question the iptables reader asks (a set's name by its index).
    pub subsystem: u16,
    pub msg: u8,
    pub family: u8,
    pub attrs: Vec<(u16, Vec<u8>)>,
}

impl NftRequest {
    pub fn new(msg: u8, family: u8) -> NftRequest {
        NftRequest {
            subsystem: NFNL_SUBSYS_NFTABLES,
            msg,
            family,
            attrs: Vec::new(),
        }
    }

    pub fn with_bytes(mut self, kind: u16, value: &[u8]) -> NftRequest {
        self.attrs.push((kind, value.to_vec()));
        self
    }

    pub fn with_str(mut self, kind: u16, value: &str) -> NftRequest {
        let mut v = value.as_bytes().to_vec();
        v.push(0);
        self.attrs.push((kind, v));
        self
    }
}

impl NetlinkSerializable for NftRequest {
    fn message_type(&self) -> u16 {
        (self.subsystem << 8) | self.msg as u16
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN
            + self
                .attrs
                .iter()
                .map(|(_, v)| (4 + v.len() + 3) & !3)
                .sum::<usize>()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        // nfgenmsg: family, NFNETLINK_V0, res_id 0.
        buffer[..NFGENMSG_LEN].copy_from_slice(&[self.family, 0, 0, 0]);
        let mut at = NFGENMSG_LEN;
        for (kind, v) in &self.attrs {
            let len = 4 + v.len();
            buffer[at..at + 2].copy_from_slice(&(len as u16).to_ne_bytes());
            buffer[at + 2..at + 4].copy_from_slice(&kind.to_ne_bytes());
            buffer[at + 4..at + len].copy_from_slice(v);
            let padded = (len + 3) & !3;
            buffer[at + len..at + padded].fill(0);
            at += padded;
        }
    }
}

// ----- ipset: a set's name by its index -------------------------------------------------------

/// `NFNL_SUBSYS_IPSET` and what `IPSET_CMD_GET_BYINDEX` takes and answers (uapi
/// `linux/netfilter/ipset/ip_set.h`; the kernel's `ip_set_get_byindex`): an xtables `set`
/// match holds the set's index, `iptables-save` prints its name.
pub const NFNL_SUBSYS_IPSET: u16 = 6;
pub const IPSET_CMD_GET_BYINDEX: u8 = 15;
pub const IPSET_ATTR_PROTOCOL: u16 = 1;
pub const IPSET_ATTR_SETNAME: u16 = 2;
pub const IPSET_ATTR_INDEX: u16 = 11;
/// `IPSET_PROTOCOL` (7; the kernel takes 6 and 7).
pub const IPSET_PROTOCOL: u8 = 7;

/// The set name in a reply to `IPSET_CMD_GET_BYINDEX` (one netlink message, header included).
pub fn ipset_name(bytes: &[u8]) -> Result<Option<String>, WireError> {
    if bytes.len() < HEADER_LEN + NFGENMSG_LEN {
        return Ok(None);
    }
    let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
    if kind != (NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_GET_BYINDEX as u16 {
        return Ok(None);
    }
    for a in attrs("ipset reply", &bytes[HEADER_LEN + NFGENMSG_LEN..]) {
        let (kind, v) = a?;
        if kind == IPSET_ATTR_SETNAME {
            return Ok(Some(string(v)));
        }
    }
    Ok(None)
}

// ----- replies ----------------------------------------------------------------------------------

/// One nf_tables message of a reply: its type (low byte), family and attributes' bytes.
#[derive(Debug, Clone, Copy)]
pub struct NftMessage<'a> {
    pub msg: u8,
    pub family: u8,
    pub attrs: &'a [u8],
}

/// The nf_tables message in one netlink message (header included), None for the control
/// messages that end a reply (`NLMSG_DONE`, an ACK) and for other subsystems' messages.
/// A message of an interrupted dump is [`WireError::Interrupted`].
pub fn message(bytes: &[u8]) -> Result<Option<NftMessage<'_>>, WireError> {
    if bytes.len() < HEADER_LEN {
        return Err(WireError::ShortMessage { len: bytes.len() });
    }
    let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
    let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
    if flags & NLM_F_DUMP_INTR != 0 {
        return Err(WireError::Interrupted);
    }
    if matches!(kind, NLMSG_DONE | NLMSG_ERROR | NLMSG_NOOP) || kind >> 8 != NFNL_SUBSYS_NFTABLES {
        return Ok(None);
    }
    let Some(payload) = bytes.get(HEADER_LEN..) else {
        return Err(WireError::ShortMessage { len: bytes.len() });
    };
    if payload.len() < NFGENMSG_LEN {
        return Err(WireError::ShortMessage { len: bytes.len() });
    }
    Ok(Some(NftMessage {
        msg: (kind & 0xff) as u8,
        family: payload[0],
        attrs: &payload[NFGENMSG_LEN..],
    }))
}

/// The generation of an `NFT_MSG_NEWGEN` message.
pub fn generation(m: &NftMessage<'_>) -> Result<Option<u32>, WireError> {
    if m.msg != NFT_MSG_NEWGEN {
        return Ok(None);
    }
    for a in attrs("generation", m.attrs) {
        let (kind, v) = a?;
        if kind == NFTA_GEN_ID {
            return be32("generation id", v).map(Some);
        }
    }
    Err(WireError::Missing {
        what: "generation",
        missing: "NFTA_GEN_ID",
    })
}

/// A chain as listed (`NFT_MSG_GETCHAIN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftChain {
    pub family: u8,
    pub table: String,
    pub name: String,
    pub handle: u64,
    /// A base chain (attached to a hook) rather than a jump target.
    pub base: bool,
}

pub fn chain(m: &NftMessage<'_>) -> Result<Option<NftChain>, WireError> {
    if m.msg != NFT_MSG_NEWCHAIN {
        return Ok(None);
    }
    let mut c = NftChain {
        family: m.family,
        table: String::new(),
        name: String::new(),
        handle: 0,
        base: false,
    };
    for a in attrs("chain", m.attrs) {
        let (kind, v) = a?;
        match kind {
            NFTA_CHAIN_TABLE => c.table = string(v),
            NFTA_CHAIN_NAME => c.name = string(v),
            NFTA_CHAIN_HANDLE => c.handle = be64("chain handle", v)?,
            NFTA_CHAIN_HOOK => c.base = true,
            _ => {}
        }
    }
    if c.name.is_empty() {
        return Err(WireError::Missing {
            what: "chain",
            missing: "NFTA_CHAIN_NAME",
        });
    }
    Ok(Some(c))
}

/// A rule as dumped (`NFT_MSG_GETRULE`): where it is, its expressions, its comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub family: u8,
    pub table: String,
    pub chain: String,
    pub handle: u64,
    pub exprs: Vec<Expr>,
    /// `NFTNL_UDATA_RULE_COMMENT` (nft's `comment "..."`; iptables-nft >= 1.8.? keeps
    /// `-m comment` as a compat match instead).
    pub comment: Option<String>,
}

pub fn rule(m: &NftMessage<'_>) -> Result<Option<NftRule>, WireError> {
    if m.msg != NFT_MSG_NEWRULE {
        return Ok(None);
    }
    let mut r = NftRule {
        family: m.family,
        table: String::new(),
        chain: String::new(),
        handle: 0,
        exprs: Vec::new(),
        comment: None,
    };
    for a in attrs("rule", m.attrs) {
        let (kind, v) = a?;
        match kind {
            NFTA_RULE_TABLE => r.table = string(v),
            NFTA_RULE_CHAIN => r.chain = string(v),
            NFTA_RULE_HANDLE => r.handle = be64("rule handle", v)?,
            NFTA_RULE_EXPRESSIONS => {
                for e in attrs("rule expressions", v) {
                    let (kind, v) = e?;
                    if kind == NFTA_LIST_ELEM {
                        r.exprs.push(expr(v)?);
                    }
                }
            }
            NFTA_RULE_USERDATA => r.comment = udata_comment(v, NFTNL_UDATA_RULE_COMMENT),
            _ => {}
        }
    }
    if r.chain.is_empty() {
        return Err(WireError::Missing {
            what: "rule",
            missing: "NFTA_RULE_CHAIN",
        });
    }
    Ok(Some(r))
}

/// An element of a set or map (`NFT_MSG_GETSETELEM`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetElem {
    /// The key's bytes: a concatenation's fields each padded to 4 bytes (kube-proxy's
    /// `ipv4_addr . inet_proto . inet_service` is 4 + 4 + 4: address, protocol in the first
    /// byte, port big-endian in the first two).
    pub key: Vec<u8>,
    /// The end of an interval element (`NFTA_SET_ELEM_KEY_END`).
    pub key_end: Option<Vec<u8>>,
    /// A map's value.
    pub data: Option<Data>,
    pub flags: u32,
    /// `NFTNL_UDATA_SET_ELEM_COMMENT`.
    pub comment: Option<String>,
}

/// The elements of one `NFT_MSG_NEWSETELEM` message (a dump sends several per message).
pub fn set_elems(m: &NftMessage<'_>) -> Result<Vec<SetElem>, WireError> {
    let mut out = Vec::new();
    if m.msg != NFT_MSG_NEWSETELEM {
        return Ok(out);
    }
    for a in attrs("set elements", m.attrs) {
        let (kind, v) = a?;
        if kind != NFTA_SET_ELEM_LIST_ELEMENTS {
            continue;
        }
        for e in attrs("set element list", v) {
            let (kind, v) = e?;
            if kind != NFTA_LIST_ELEM {
                continue;
            }
            let mut elem = SetElem {
                key: Vec::new(),
                key_end: None,
                data: None,
                flags: 0,
                comment: None,
            };
            for f in attrs("set element", v) {
                let (kind, v) = f?;
                match kind {
                    NFTA_SET_ELEM_KEY => elem.key = value(v)?,
                    NFTA_SET_ELEM_KEY_END => elem.key_end = Some(value(v)?),
                    NFTA_SET_ELEM_DATA => elem.data = Some(data(v)?),
                    NFTA_SET_ELEM_FLAGS => elem.flags = be32("set element flags", v)?,
                    NFTA_SET_ELEM_USERDATA => {
                        elem.comment = udata_comment(v, NFTNL_UDATA_SET_ELEM_COMMENT)
                    }
                    _ => {}
                }
            }
            out.push(elem);
        }
    }
    Ok(out)
}

// ----- data and verdicts ------------------------------------------------------------------------

/// `NF_DROP`, `NF_ACCEPT` and nf_tables' own verdict codes (`enum nft_verdicts`).
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_CONTINUE: i32 = -1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

/// A verdict: its code and, for a jump or goto, the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub code: i32,
    pub chain: Option<String>,
}

impl Verdict {
    /// The chain a jump or goto goes to.
    pub fn target(&self) -> Option<&str> {
        matches!(self.code, NFT_JUMP | NFT_GOTO)
            .then_some(self.chain.as_deref())
            .flatten()
    }
}

/// `struct nft_data`: a value (bytes) or a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    Value(Vec<u8>),
    Verdict(Verdict),
}

/// A nested `NFTA_DATA_*` attribute.
fn data(buf: &[u8]) -> Result<Data, WireError> {
    for a in attrs("data", buf) {
        let (kind, v) = a?;
        match kind {
            NFTA_DATA_VALUE => return Ok(Data::Value(v.to_vec())),
            NFTA_DATA_VERDICT => {
                let mut code = None;
                let mut chain = None;
                for b in attrs("verdict", v) {
                    let (kind, v) = b?;
                    match kind {
                        NFTA_VERDICT_CODE => code = Some(be32("verdict code", v)? as i32),
                        NFTA_VERDICT_CHAIN => chain = Some(string(v)),
                        _ => {}
                    }
                }
                let code = code.ok_or(WireError::Missing {
                    what: "verdict",
                    missing: "NFTA_VERDICT_CODE",
                })?;
                return Ok(Data::Verdict(Verdict { code, chain }));
            }
            _ => {}
        }
    }
    Err(WireError::Missing {
        what: "data",
        missing: "NFTA_DATA_VALUE or NFTA_DATA_VERDICT",
    })
}

/// The bytes of a nested `NFTA_DATA_VALUE` (a verdict where a value belongs is an error).
fn value(buf: &[u8]) -> Result<Vec<u8>, WireError> {
    match data(buf)? {
        Data::Value(v) => Ok(v),
        Data::Verdict(_) => Err(WireError::Missing {
            what: "key",
            missing: "NFTA_DATA_VALUE",
        }),
    }
}

// ----- expressions ------------------------------------------------------------------------------

/// `enum nft_payload_bases`.
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
/// `enum nft_cmp_ops`.
pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;
/// `enum nft_meta_keys`.
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_OIFNAME: u32 = 7;
pub const NFT_META_L4PROTO: u32 = 16;
/// `enum nft_fib_result`, `enum nft_fib_flags`.
pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub const NFTA_FIB_F_SADDR: u32 = 1;
pub const NFTA_FIB_F_DADDR: u32 = 2;
/// `enum nft_nat_types`.
pub const NFT_NAT_SNAT: u32 = 0;
pub const NFT_NAT_DNAT: u32 = 1;

/// One expression of a rule, typed for what kube-proxy and iptables-nft write; registers are
/// the kernel's numbers (`NFT_REG_1`..4 = 1..4 for 16 bytes, `NFT_REG32_00`.. = 8.. for 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// Load `len` bytes at `offset` of header `base` into `dreg`.
    Payload {
        dreg: u32,
        base: u32,
        offset: u32,
        len: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    /// `dreg = (sreg & mask) ^ xor` (the mask-and-xor form; shifts have no mask).
    Bitwise {
        sreg: u32,
        dreg: u32,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// Load (`dreg`) or set (`sreg`) a meta key.
    Meta {
        key: u32,
        dreg: Option<u32>,
        sreg: Option<u32>,
    },
    Immediate {
        dreg: u32,
        data: Data,
    },
    Fib {
        dreg: u32,
        result: u32,
        flags: u32,
    },
    Nat {
        kind: u32,
        family: u32,
        reg_addr_min: Option<u32>,
        reg_addr_max: Option<u32>,
        reg_proto_min: Option<u32>,
        reg_proto_max: Option<u32>,
        flags: u32,
    },
    Masq {
        flags: u32,
        reg_proto_min: Option<u32>,
        reg_proto_max: Option<u32>,
    },
    Numgen {
        dreg: u32,
        modulus: u32,
        kind: u32,
        offset: u32,
    },
    /// A set or map look-up (`ip daddr . meta l4proto . th dport vmap @service-ips`).
    Lookup {
        set: String,
        sreg: u32,
        dreg: Option<u32>,
        flags: u32,
    },
    Counter {
        packets: u64,
        bytes: u64,
    },
    /// An xtables match run by nft_compat (iptables-nft's `-m NAME` it has no native form for).
    Match {
        name: String,
        rev: u32,
        info: Vec<u8>,
    },
    /// An xtables target run by nft_compat (`-j DNAT`, `-j MASQUERADE`, `-j MARK`, ...).
    Target {
        name: String,
        rev: u32,
        info: Vec<u8>,
    },
    Other(String),
}

/// The attributes of an expression's data by type (the last of each wins), u32s decoded.
struct Fields<'a>(Vec<(u16, &'a [u8])>);

impl<'a> Fields<'a> {
    fn parse(what: &'static str, buf: &'a [u8]) -> Result<Fields<'a>, WireError> {
        attrs(what, buf).collect::<Result<Vec<_>, _>>().map(Fields)
    }

    fn raw(&self, kind: u16) -> Option<&'a [u8]> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| *v)
    }

    fn opt_u32(&self, what: &'static str, kind: u16) -> Result<Option<u32>, WireError> {
        self.raw(kind).map(|v| be32(what, v)).transpose()
    }

    fn u32(&self, what: &'static str, kind: u16) -> Result<u32, WireError> {
        self.opt_u32(what, kind)?.ok_or(WireError::Missing {
            what,
            missing: "a required attribute",
        })
    }

    fn u32_or0(&self, what: &'static str, kind: u16) -> Result<u32, WireError> {
        Ok(self.opt_u32(what, kind)?.unwrap_or(0))
    }

    fn u64_or0(&self, what: &'static str, kind: u16) -> Result<u64, WireError> {
        self.raw(kind)
            .map(|v| be64(what, v))
            .transpose()
            .map(|v| v.unwrap_or(0))
    }

    fn value(&self, kind: u16) -> Result<Vec<u8>, WireError> {
        self.raw(kind)
            .map(value)
            .transpose()
            .map(Option::unwrap_or_default)
    }
}

/// One `NFTA_LIST_ELEM` of `NFTA_RULE_EXPRESSIONS`: `NFTA_EXPR_NAME` and `NFTA_EXPR_DATA`.
pub fn expr(buf: &[u8]) -> Result<Expr, WireError> {
    let mut name = None;
    let mut body: &[u8] = &[];
    for a in attrs("expression", buf) {
        let (kind, v) = a?;
        match kind {
            NFTA_EXPR_NAME => name = Some(string(v)),
            NFTA_EXPR_DATA => body = v,
            _ => {}
        }
    }
    let name = name.ok_or(WireError::Missing {
        what: "expression",
        missing: "NFTA_EXPR_NAME",
    })?;
    expr_of(name, body)
}

/// An expression's fields by its name: a table, one arm per expression kind.
fn expr_of(name: String, body: &[u8]) -> Result<Expr, WireError> {
    // Attribute numbers: each expression's enum in nf_tables.h (NFTA_PAYLOAD_*, NFTA_CMP_*, ...).
    Ok(match name.as_str() {
        "payload" => {
            let f = Fields::parse("payload", body)?;
            Expr::Payload {
                dreg: f.u32_or0("payload", 1)?,
                base: f.u32("payload base", 2)?,
                offset: f.u32("payload offset", 3)?,
                len: f.u32("payload length", 4)?,
            }
        }
        "cmp" => {
            let f = Fields::parse("cmp", body)?;
            Expr::Cmp {
                sreg: f.u32("cmp register", 1)?,
                op: f.u32("cmp op", 2)?,
                data: f.value(3)?,
            }
        }
        "bitwise" => {
            let f = Fields::parse("bitwise", body)?;
            Expr::Bitwise {
                sreg: f.u32("bitwise source", 1)?,
                dreg: f.u32("bitwise destination", 2)?,
                len: f.u32("bitwise length", 3)?,
                mask: f.value(4)?,
                xor: f.value(5)?,
            }
        }
        "meta" => {
            let f = Fields::parse("meta", body)?;
            Expr::Meta {
                key: f.u32("meta key", 2)?,
                dreg: f.opt_u32("meta register", 1)?,
                sreg: f.opt_u32("meta register", 3)?,
            }
        }
        "immediate" => {
            let f = Fields::parse("immediate", body)?;
            Expr::Immediate {
                dreg: f.u32("immediate register", 1)?,
                data: data(f.raw(2).ok_or(WireError::Missing {
                    what: "immediate",
                    missing: "NFTA_IMMEDIATE_DATA",
                })?)?,
            }
        }
        "fib" => {
            let f = Fields::parse("fib", body)?;
            Expr::Fib {
                dreg: f.u32_or0("fib register", 1)?,
                result: f.u32_or0("fib result", 2)?,
                flags: f.u32_or0("fib flags", 3)?,
            }
        }
        "nat" => {
            let f = Fields::parse("nat", body)?;
            Expr::Nat {
                kind: f.u32("nat type", 1)?,
                family: f.u32_or0("nat family", 2)?,
                reg_addr_min: f.opt_u32("nat register", 3)?,
                reg_addr_max: f.opt_u32("nat register", 4)?,
                reg_proto_min: f.opt_u32("nat register", 5)?,
                reg_proto_max: f.opt_u32("nat register", 6)?,
                flags: f.u32_or0("nat flags", 7)?,
            }
        }
        "masq" => {
            let f = Fields::parse("masq", body)?;
            Expr::Masq {
                flags: f.u32_or0("masq flags", 1)?,
                reg_proto_min: f.opt_u32("masq register", 2)?,
                reg_proto_max: f.opt_u32("masq register", 3)?,
            }
        }
        "numgen" => {
            let f = Fields::parse("numgen", body)?;
            Expr::Numgen {
                dreg: f.u32_or0("numgen register", 1)?,
                modulus: f.u32_or0("numgen modulus", 2)?,
                kind: f.u32_or0("numgen type", 3)?,
                offset: f.u32_or0("numgen offset", 4)?,
            }
        }
        "lookup" => {
            let f = Fields::parse("lookup", body)?;
            Expr::Lookup {
                set: f.raw(1).map(string).ok_or(WireError::Missing {
                    what: "lookup",
                    missing: "NFTA_LOOKUP_SET",
                })?,
                sreg: f.u32_or0("lookup register", 2)?,
                dreg: f.opt_u32("lookup register", 3)?,
                flags: f.u32_or0("lookup flags", 5)?,
            }
        }
        "counter" => {
            let f = Fields::parse("counter", body)?;
            Expr::Counter {
                bytes: f.u64_or0("counter bytes", 1)?,
                packets: f.u64_or0("counter packets", 2)?,
            }
        }
        "match" | "target" => {
            // NFTA_MATCH_NAME/REV/INFO and NFTA_TARGET_NAME/REV/INFO share numbers 1, 2, 3.
            let f = Fields::parse("xtables match or target", body)?;
            let compat =
                f.raw(1)
                    .map(string)
                    .filter(|n| !n.is_empty())
                    .ok_or(WireError::Missing {
                        what: "xtables match or target",
                        missing: "its name",
                    })?;
            let rev = f.u32_or0("xtables revision", 2)?;
            let info = f.raw(3).unwrap_or_default().to_vec();
            if name == "match" {
                Expr::Match {
                    name: compat,
                    rev,
                    info,
                }
            } else {
                Expr::Target {
                    name: compat,
                    rev,
                    info,
                }
            }
        }
        _ => Expr::Other(name),
    })
}
