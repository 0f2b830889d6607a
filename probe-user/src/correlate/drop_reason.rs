//! Drop-reason and drop-site classification. Reason numbers differ between kernels, so
//! everything here matches names (from the kernel's BTF) and symbols only.

use crate::event::DropReason;

/// Symbol prefixes of the IPv4 route-input path, where an older kernel drops a packet with a
/// local (martian) source without a specific reason (Debian 6.1: `NOT_SPECIFIED` at
/// `ip_rcv_finish_core.constprop.0+0x1ab`).
pub(crate) const ROUTE_INPUT_SITES: [&str; 4] = [
    "ip_rcv_finish_core",
    "ip_route_input",
    "fib_validate_source",
    "ip_rcv_finish",
];

/// The function name of a drop site `symbol[.suffix...]+0xoff[/0xsize]`, without compiler
/// suffixes (`.constprop.0`, `.isra.0`, `.cold`) and leading underscores.
pub(crate) fn site_symbol(location: &str) -> &str {
    let sym = location.split('+').next().unwrap_or("");
    let sym = sym.split('.').next().unwrap_or("");
    sym.trim_start_matches('_')
}

/// The drop site is on the route-input path (see [`ROUTE_INPUT_SITES`]).
pub(crate) fn is_route_input_site(location: Option<&str>) -> bool {
    location.is_some_and(|loc| {
        let sym = site_symbol(loc);
        !sym.is_empty() && ROUTE_INPUT_SITES.iter().any(|p| sym.starts_with(p))
    })
}

/// A source-validation reason: `IP_LOCAL_SOURCE`, `IP_INVALID_SOURCE`, any `*_SOURCE`.
pub(crate) fn is_source_reason(reason: &DropReason) -> bool {
    reason.name.ends_with("_SOURCE")
}

/// Why a drop counts as a local-source drop, if it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LocalSourceDrop {
    /// The kernel named a source-validation reason.
    Named,
    /// `NOT_SPECIFIED` at a route-input drop site (kernels before the `IP_*_SOURCE` reasons).
    UnspecifiedAtRouteInput,
}

/// Classifies a drop of a packet whose source is a local address.
pub(crate) fn local_source_drop(
    reason: &DropReason,
    location: Option<&str>,
) -> Option<LocalSourceDrop> {
    if is_source_reason(reason) {
        Some(LocalSourceDrop::Named)
    } else if reason.name == "NOT_SPECIFIED" && is_route_input_site(location) {
        Some(LocalSourceDrop::UnspecifiedAtRouteInput)
    } else {
        None
    }
}

/// No socket for the packet (`NO_SOCKET`, and any future reason with that in its name).
pub(crate) fn is_no_socket(reason: &DropReason) -> bool {
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
    fn no_socket_family() {
        assert!(is_no_socket(&r("NO_SOCKET")));
        assert!(!is_no_socket(&r("SOCKET_FILTER")));
    }
}
