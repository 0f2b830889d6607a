//! The clsact fallback's bookkeeping over rtnetlink (TC messages from `netlink-packet-route`),
//! so the agent never runs `tc`: list the filters of a clsact hook, remove one of ours, remove
//! the qdisc. aya adds the qdisc and the filters themselves (also over netlink).
//!
//! Our filters are cls_bpf filters with our program's name (`TCA_BPF_NAME`) and our handle
//! ([`OUR_HANDLE`]): anything else on the hook (another tool's matchall, another program's
//! cls_bpf) is foreign and never touched.

use netlink_packet_core::{NLMSG_ERROR, NetlinkBuffer, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcFilterBpf, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption},
};
use netlink_sys::protocols::NETLINK_ROUTE;

use crate::netlink::{self, FramingError, NetlinkError};

/// The handle our cls_bpf filters get (`tc filter show` prints `handle 0xc1b`): with the
/// program name, what tells our filters (this agent's, or a SIGKILLed one's) from anyone
/// else's. The priority stays the kernel's choice: before every filter already there.
pub const OUR_HANDLE: u32 = 0xc1b;

/// A clsact hook (`tcm_parent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    pub const BOTH: [Hook; 2] = [Hook::Ingress, Hook::Egress];

    fn parent(self) -> TcHandle {
        TcHandle {
            major: u16::MAX,
            minor: match self {
                Hook::Ingress => TcHandle::MIN_INGRESS,
                Hook::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }
}

/// One entry of a filter dump. The kernel also lists each filter chain's head (handle 0);
/// any entry at all means the hook is in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub hook: Hook,
    /// `tcm_info`: priority (upper 16 bits) and protocol (lower, network order).
    pub info: u32,
    pub handle: u32,
    /// `bpf`, `matchall`, ... (None when the entry could not be decoded).
    pub kind: Option<String>,
    /// A cls_bpf filter's program name.
    pub bpf_name: Option<String>,
}

impl Filter {
    /// Ours: a cls_bpf filter with our handle running the program `name`.
    pub fn is_ours(&self, name: &str) -> bool {
        self.kind.as_deref() == Some(TcFilterBpf::KIND)
            && self.handle == OUR_HANDLE
            && self.bpf_name.as_deref() == Some(name)
    }

    pub fn priority(&self) -> u16 {
        (self.info >> 16) as u16
    }
}

/// Why a TC netlink call failed.
#[derive(Debug, thiserror::Error)]
pub enum TcError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("tc filter dump: {0}")]
    Framing(#[from] FramingError),
}

fn message(
    header: TcHeader,
    attributes: Vec<TcAttribute>,
    build: fn(TcMessage) -> RouteNetlinkMessage,
) -> NetlinkMessage<RouteNetlinkMessage> {
    NetlinkMessage::from(build(TcMessage::from_parts(header, attributes)))
}

/// Every filter on `hook` of the interface `ifindex` (all chains).
pub fn filters(ifindex: u32, hook: Hook) -> Result<Vec<Filter>, TcError> {
    let header = TcHeader {
        index: ifindex as i32,
        parent: hook.parent(),
        ..Default::default()
    };
    let raw = netlink::request(
        NETLINK_ROUTE,
        "tc filter dump",
        message(header, vec![], RouteNetlinkMessage::GetTrafficFilter),
        true,
    )?;
    Ok(parse_filters(&raw, hook)?)
}

/// The filters in a raw `RTM_GETTFILTER` dump reply. An entry this crate cannot decode (a
/// filter kind or action it does not know) is kept, undecoded: it is someone's filter.
pub fn parse_filters(raw: &[u8], hook: Hook) -> Result<Vec<Filter>, FramingError> {
    let mut out = Vec::new();
    for bytes in netlink::split(raw)? {
        let kind = NetlinkBuffer::new(bytes).message_type();
        if kind < 16 || kind == NLMSG_ERROR {
            continue; // DONE, ACK (errors were refused by the request already)
        }
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) {
            Ok(NetlinkMessage {
                payload: NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(m)),
                ..
            }) => out.push(filter_from(&m, hook)),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "tc filter dump: an entry left undecoded");
                // tcmsg: family, pad, pad, ifindex, handle, parent, info.
                let word = |at: usize| {
                    bytes
                        .get(16 + at..20 + at)
                        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                };
                out.push(Filter {
                    hook,
                    info: word(16),
                    handle: word(8),
                    kind: None,
                    bpf_name: None,
                });
            }
        }
    }
    Ok(out)
}

fn filter_from(m: &TcMessage, hook: Hook) -> Filter {
    let mut kind = None;
    let mut bpf_name = None;
    for attr in &m.attributes {
        match attr {
            TcAttribute::Kind(k) => kind = Some(k.clone()),
            TcAttribute::Options(options) => {
                for o in options {
                    if let TcOption::Bpf(TcFilterBpfOption::ProgName(n)) = o {
                        bpf_name = Some(n.clone());
                    }
                }
            }
            _ => {}
        }
    }
    Filter {
        hook,
        info: m.header.info,
        handle: m.header.handle.into(),
        kind,
        bpf_name,
    }
}

/// Deletes one filter exactly (hook, priority, protocol, handle, kind).
pub fn delete_filter(ifindex: u32, filter: &Filter) -> Result<(), TcError> {
    let header = TcHeader {
        index: ifindex as i32,
        parent: filter.hook.parent(),
        handle: filter.handle.into(),
        info: filter.info,
        ..Default::default()
    };
    let attributes = filter
        .kind
        .clone()
        .map(TcAttribute::Kind)
        .into_iter()
        .collect();
    netlink::request(
        NETLINK_ROUTE,
        "tc filter delete",
        message(header, attributes, RouteNetlinkMessage::DelTrafficFilter),
        false,
    )?;
    Ok(())
}

/// Deletes the clsact qdisc of `ifindex` (and with it whatever filters it still holds: call
/// only once [`filters`] found it empty).
pub fn delete_clsact(ifindex: u32) -> Result<(), TcError> {
    let header = TcHeader {
        index: ifindex as i32,
        parent: TcHandle::CLSACT,
        handle: TcHandle {
            major: u16::MAX,
            minor: 0,
        },
        ..Default::default()
    };
    netlink::request(
        NETLINK_ROUTE,
        "tc qdisc delete",
        message(
            header,
            vec![TcAttribute::Kind("clsact".into())],
            RouteNetlinkMessage::DelQueueDiscipline,
        ),
        false,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::DefaultNla;

    use super::*;

    fn filter(kind: Option<&str>, handle: u32, name: Option<&str>) -> Filter {
        Filter {
            hook: Hook::Ingress,
            info: (49152 << 16) | 0x0300,
            handle,
            kind: kind.map(String::from),
            bpf_name: name.map(String::from),
        }
    }

    #[test]
    fn only_our_name_with_our_handle_is_ours() {
        assert!(filter(Some("bpf"), OUR_HANDLE, Some("clb_ingress")).is_ours("clb_ingress"));
        // Another program's cls_bpf, our program under another handle, a matchall.
        assert!(!filter(Some("bpf"), OUR_HANDLE, Some("cil_from_netdev")).is_ours("clb_ingress"));
        assert!(!filter(Some("bpf"), 1, Some("clb_ingress")).is_ours("clb_ingress"));
        assert!(!filter(Some("matchall"), OUR_HANDLE, None).is_ours("clb_ingress"));
        assert!(!filter(None, OUR_HANDLE, None).is_ours("clb_ingress"));
        assert_eq!(filter(None, 0, None).priority(), 49152);
    }

    #[test]
    fn a_dump_round_trips_and_undecodable_entries_are_kept() {
        let header = TcHeader {
            index: 7,
            parent: Hook::Egress.parent(),
            handle: OUR_HANDLE.into(),
            info: (49151 << 16) | 0x0300,
            ..Default::default()
        };
        let ours = TcMessage::from_parts(
            header.clone(),
            vec![
                TcAttribute::Kind("bpf".into()),
                TcAttribute::Options(vec![TcOption::Bpf(TcFilterBpfOption::ProgName(
                    "clb_egress".into(),
                ))]),
            ],
        );
        // An entry whose options do not decode: a program tag of 3 bytes instead of 8.
        let undecodable = TcMessage::from_parts(
            header,
            vec![
                TcAttribute::Kind("bpf".into()),
                TcAttribute::Options(vec![TcOption::Bpf(TcFilterBpfOption::Other(
                    DefaultNla::new(10, vec![1, 2, 3]),
                ))]),
            ],
        );
        let bytes = |m: TcMessage| {
            let mut msg = NetlinkMessage::from(RouteNetlinkMessage::NewTrafficFilter(m));
            msg.finalize();
            let mut buf = vec![0; msg.buffer_len()];
            msg.serialize(&mut buf);
            buf
        };
        let raw = bytes(ours);
        let bad = bytes(undecodable);
        let parsed = parse_filters(&raw, Hook::Egress).unwrap();
        assert_eq!(parsed.len(), 1);
        assert!(parsed[0].is_ours("clb_egress"));
        assert_eq!(parsed[0].priority(), 49151);
        let kept = parse_filters(&bad, Hook::Egress).unwrap();
        assert_eq!(kept.len(), 1, "an undecodable entry still counts");
        assert!(!kept[0].is_ours("clb_egress"));
        assert!(parse_filters(&raw[..raw.len() - 3], Hook::Egress).is_err());
    }
}
