//! Drop-reason and drop-site classification. Reason numbers differ between kernels, so
//! everything here matches names (from the kernel's BTF) and symbols only.

use probe_contract::{
    Tag,
    record::{DropReason, Packet},
};

use super::DropInfo;

/// Symbol prefixes of the IPv4 route-input path, where an older kernel drops a packet with a
/// local (martian) source without a specific reason (Debian 6.1: `NOT_SPECIFIED` at
/// `ip_rcv_finish_core.constprop.0+0x1ab`).
pub const ROUTE_INPUT_SITES: [&str; 4] = [
    "ip_rcv_finish_core",
    "ip_route_input",
    "fib_validate_source",
    "ip_rcv_finish",
];

/// The function name of a drop site `symbol[.suffix...]+0xoff[/0xsize]`, without compiler
/// suffixes (`.constprop.0`, `.isra.0`, `.cold`) and leading underscores.
pub fn site_symbol(location: &str) -> &str {
    let sym = location.split('+').next().unwrap_or("");
    let sym = sym.split('.').next().unwrap_or("");
    sym.trim_start_matches('_')
}

/// The drop site is on the route-input path (see [`ROUTE_INPUT_SITES`]).
pub fn is_route_input_site(location: Option<&str>) -> bool {
    location.is_some_and(|loc| {
        let sym = site_symbol(loc);
        !sym.is_empty() && ROUTE_INPUT_SITES.iter().any(|p| sym.starts_with(p))
    })
}

/// A source-validation reason: `IP_LOCAL_SOURCE`, `IP_INVALID_SOURCE`, any `*_SOURCE`.
pub fn is_source_reason(reason: &DropReason) -> bool {
    reason.name.ends_with("_SOURCE")
}

/// Why a drop counts as a local-source drop, if it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalSourceDrop {
    /// The kernel named a source-validation reason.
    Named,
    /// `NOT_SPECIFIED` at a route-input drop site (kernels before the `IP_*_SOURCE` reasons).
    UnspecifiedAtRouteInput,
}

/// Classifies a drop of a packet whose source is a local address.
pub fn local_source_drop(reason: &DropReason, location: Option<&str>) -> Option<LocalSourceDrop> {
    if is_source_reason(reason) {
        Some(LocalSourceDrop::Named)
    } else if reason.name == "NOT_SPECIFIED" && is_route_input_site(location) {
        Some(LocalSourceDrop::UnspecifiedAtRouteInput)
    } else {
        None
    }
}

/// Symbols of the transport receive paths, where a kernel drops a packet nobody listens for
/// (`tcp_v4_rcv`, `__udp4_lib_rcv` and their IPv6 twins; underscores are stripped).
pub const NO_SOCKET_SITES: [&str; 4] = ["tcp_v4_rcv", "udp4_lib_rcv", "tcp_v6_rcv", "udp6_lib_rcv"];

/// Where netfilter drops a packet (a DROP or REJECT verdict): the hook loop, or the table
/// walk itself where the kernel frees the packet there (seen on Debian 6.1:
/// `nft_do_chain`).
pub const NETFILTER_SITES: [&str; 3] = ["nf_hook_slow", "nft_do_chain", "ipt_do_table"];

/// The reason a kernel without drop reasons (< 5.17: `kfree_skb` passes only the skb and the
/// site) would have named, judged by the drop site; None when the site says nothing we use.
/// On the route-input path the source's tag tells a local source (`node`/`vip`: the kernel
/// owns that address) from a failed reverse-path check (`pod`: routed to the pod's veth, not
/// the NIC it came in on); both need the packet to have come in through a NIC. A
/// self-addressed pod packet (`service_self_loop`, dropped in the pod's own namespace, where
/// no NIC of ours is seen) can only fail route input as a local source: its source is the
/// receiving namespace's own address (seen on Debian 5.10).
pub fn reason_from_site(
    location: Option<&str>,
    src_tag: Option<Tag>,
    from_nic: bool,
    self_addressed: bool,
) -> Option<&'static str> {
    let sym = site_symbol(location?);
    if sym.is_empty() {
        return None;
    }
    if is_route_input_site(location) {
        if self_addressed && src_tag == Some(Tag::Pod) {
            return Some("IP_LOCAL_SOURCE");
        }
        return match (src_tag, from_nic) {
            (Some(Tag::Node | Tag::Vip), true) => Some("IP_LOCAL_SOURCE"),
            (Some(Tag::Pod), true) => Some("IP_RPFILTER"),
            _ => None,
        };
    }
    if NO_SOCKET_SITES.contains(&sym) {
        Some("NO_SOCKET")
    } else if NETFILTER_SITES.contains(&sym) {
        Some("NETFILTER_DROP")
    } else {
        None
    }
}

/// A local pod's or the node's TCP or UDP call that netfilter dropped: what kube-proxy's own
/// drops (`etp_local_drop`, `source_ranges_drop`) look like to the kernel.
pub(super) fn is_local_call_netfilter_drop(packet: &Packet, info: &DropInfo) -> bool {
    matches!(packet.src_tag, Some(Tag::Pod | Tag::Node))
        && matches!(
            packet.proto,
            probe_contract::Proto::Tcp | probe_contract::Proto::Udp
        )
        && is_netfilter_drop(&info.reason, info.location.as_deref())
}

/// Netfilter dropped it: `NETFILTER_DROP`, or `NOT_SPECIFIED` at `nf_hook_slow` (kernels
/// before the netfilter reason).
pub fn is_netfilter_drop(reason: &DropReason, location: Option<&str>) -> bool {
    reason.name == "NETFILTER_DROP"
        || (reason.name == "NOT_SPECIFIED"
            && location.is_some_and(|l| NETFILTER_SITES.contains(&site_symbol(l))))
}

/// No socket for the packet (`NO_SOCKET`, and any future reason with that in its name).
pub fn is_no_socket(reason: &DropReason) -> bool {
    reason.name.contains("NO_SOCKET")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str) -> DropReason {
        DropReason {
            code: 0,
            name: name.into(),
        }
    }

    #[test]
    fn symbols_lose_suffixes() {
        assert_eq!(
            site_symbol("ip_rcv_finish_core.constprop.0+0x1ab"),
            "ip_rcv_finish_core"
        );
        assert_eq!(
            site_symbol("__fib_validate_source+0x3c/0x480"),
            "fib_validate_source"
        );
        assert_eq!(
            site_symbol("ip_route_input_slow.cold+0x10"),
            "ip_route_input_slow"
        );
        assert_eq!(site_symbol("tcp_v4_rcv"), "tcp_v4_rcv");
    }

    #[test]
    fn local_source_by_name_or_site() {
        assert_eq!(
            local_source_drop(&r("IP_LOCAL_SOURCE"), None),
            Some(LocalSourceDrop::Named)
        );
        assert_eq!(
            local_source_drop(&r("IP_INVALID_SOURCE"), Some("x+0x1")),
            Some(LocalSourceDrop::Named)
        );
        assert_eq!(
            local_source_drop(
                &r("NOT_SPECIFIED"),
                Some("ip_rcv_finish_core.constprop.0+0x1ab")
            ),
            Some(LocalSourceDrop::UnspecifiedAtRouteInput)
        );
        assert_eq!(
            local_source_drop(&r("NOT_SPECIFIED"), Some("ip_route_input_noref+0x5")),
            Some(LocalSourceDrop::UnspecifiedAtRouteInput)
        );
        // Not specific and not at a route-input site: not a local-source drop.
        assert_eq!(local_source_drop(&r("NOT_SPECIFIED"), None), None);
        assert_eq!(
            local_source_drop(&r("NOT_SPECIFIED"), Some("sk_stream_kill_queues+0x50")),
            None
        );
        assert_eq!(local_source_drop(&r("IP_RPFILTER"), None), None);
        assert_eq!(local_source_drop(&r("NETFILTER_DROP"), None), None);
    }

    #[test]
    fn reasons_from_drop_sites() {
        let rf = |site, tag, nic| reason_from_site(site, tag, nic, false);
        // Debian 5.10: a health check from a bound VIP, dropped on the route-input path.
        assert_eq!(
            rf(
                Some("ip_rcv_finish_core.constprop.0+0x1ab"),
                Some(Tag::Vip),
                true
            ),
            Some("IP_LOCAL_SOURCE")
        );
        assert_eq!(
            rf(Some("ip_route_input_slow+0x50"), Some(Tag::Node), true),
            Some("IP_LOCAL_SOURCE")
        );
        // A pod's source coming back through the NIC: the reverse-path check.
        assert_eq!(
            rf(Some("ip_rcv_finish_core.isra.0+0x9"), Some(Tag::Pod), true),
            Some("IP_RPFILTER")
        );
        // Route-input drops of packets that did not come in through a NIC, or whose source is
        // not ours, say nothing.
        assert_eq!(
            rf(Some("ip_rcv_finish_core+0x9"), Some(Tag::Vip), false),
            None
        );
        assert_eq!(rf(Some("ip_rcv_finish_core+0x9"), None, true), None);
        for site in [
            "tcp_v4_rcv+0x7a",
            "__udp4_lib_rcv+0x3f2",
            "tcp_v6_rcv+0x1",
            "__udp6_lib_rcv.cold+0x2",
        ] {
            assert_eq!(rf(Some(site), None, true), Some("NO_SOCKET"), "{site}");
        }
        assert_eq!(
            rf(Some("nf_hook_slow+0xa5"), Some(Tag::Vip), true),
            Some("NETFILTER_DROP")
        );
        assert_eq!(rf(Some("sk_stream_kill_queues+0x50"), None, true), None);
        assert_eq!(rf(Some("tcp_v4_rcv_other+0x1"), None, true), None);
        assert_eq!(rf(None, Some(Tag::Vip), true), None);
        // Debian 5.10: a pod's call DNATed back to itself, dropped in the pod's namespace.
        let self_loop = |site, tag| reason_from_site(site, tag, false, true);
        assert_eq!(
            self_loop(Some("ip_rcv_finish_core.constprop.0+0x20e"), Some(Tag::Pod)),
            Some("IP_LOCAL_SOURCE")
        );
        // Only on the route-input path, and only for a pod's own address.
        assert_eq!(
            self_loop(Some("tcp_v4_rcv+0x7a"), Some(Tag::Pod)),
            Some("NO_SOCKET")
        );
        assert_eq!(
            self_loop(Some("ip_rcv_finish_core+0x9"), Some(Tag::Node)),
            None
        );
    }

    #[test]
    fn no_socket_family() {
        assert!(is_no_socket(&r("NO_SOCKET")));
        assert!(!is_no_socket(&r("SOCKET_FILTER")));
    }
}
