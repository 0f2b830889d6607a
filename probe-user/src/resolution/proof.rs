//! Proof that a quiet loop's traffic still flows: answered conntrack connections of the loop's
//! shape whose latest packet passed after the loop's last confirmation. Pure: the entries and
//! the node's timeouts are read by the agent (`state::conntrack`) and handed in.
//!
//! Why conntrack: every kind's traffic crosses the node's conntrack (the health checks to the
//! node, the pod's calls to the LB, the calls to the VIP port), and `SEEN_REPLY` says the
//! answer came back, which is exactly what the loop prevented. Why the age: an entry answered
//! *before* the loop was last seen (a call that picked another node) proves nothing about
//! the time since; the entry's timeout left, against its state's full timeout, bounds how long
//! ago its latest packet passed ([`StateTimeouts::idle_s`]).

use std::net::IpAddr;

use probe_contract::{LoopbackEvent, LoopbackKind, Proto};

use crate::state::{ConntrackEntry, conntrack::StateTimeouts};

/// What traffic of a loop looks like in conntrack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Connections *to* `addr:port` (hairpin: the pod's calls to the LB; vip_port_unserved:
    /// the calls to the VIP port; service_self_loop: the pod's calls to its Service).
    To {
        addr: IpAddr,
        port: u16,
        proto: Proto,
        /// Only from this source (the pod of a self-loop), else any.
        from: Option<IpAddr>,
    },
    /// Connections *from* `addr` (healthcheck_blackhole: the LB's health checks, whose source
    /// is the VIP; vip_as_source: the node's own connections from the VIP).
    From { addr: IpAddr },
}

impl Shape {
    /// The shape of a loop's traffic, from its event. None when the event lacks the address
    /// the shape needs (then nothing can prove it and it stays quiet).
    pub fn of(e: &LoopbackEvent) -> Option<Shape> {
        match e.kind {
            LoopbackKind::Hairpin
            | LoopbackKind::VipPortUnserved
            | LoopbackKind::ServiceSelfLoop => {
                Some(Shape::To {
                    addr: e.vip?,
                    port: e.vip_port?,
                    proto: e.proto,
                    // A self-loop's proof is the pod's own call answered.
                    from: (e.kind == LoopbackKind::ServiceSelfLoop).then_some(e.src),
                })
            }
            LoopbackKind::HealthcheckBlackhole | LoopbackKind::VipAsSource => Some(Shape::From {
                addr: e.vip.unwrap_or(e.src),
            }),
        }
    }

    /// The address family the entries must come from.
    pub fn is_v6(&self) -> bool {
        match self {
            Shape::To { addr, .. } | Shape::From { addr } => addr.is_ipv6(),
        }
    }

    fn matches(&self, e: &ConntrackEntry) -> bool {
        match self {
            Shape::To {
                addr,
                port,
                proto,
                from,
            } => {
                e.orig.dst == *addr
                    && e.orig.dport == *port
                    && e.orig.proto == *proto
                    && from.is_none_or(|f| e.orig.src == f)
            }
            Shape::From { addr } => e.orig.src == *addr,
        }
    }

    fn describe(&self) -> String {
        match self {
            Shape::To {
                addr,
                port,
                proto,
                from,
            } => format!(
                "{}connections to {}/{}",
                from.map(|f| format!("{f}'s ")).unwrap_or_default(),
                std::net::SocketAddr::new(*addr, *port),
                proto.as_str()
            ),
            Shape::From { addr } => format!("connections from {addr}"),
        }
    }
}

/// At most this many connections are quoted in a proof.
const QUOTED: usize = 3;

/// The proof lines, or None: answered connections of `shape` whose latest packet passed less
/// than `quiet_for_ms` ago, i.e. after the loop's last confirmation (the idle time is an upper
/// bound: conntrack rounds the time left down to the second). Pure.
pub fn find(
    shape: &Shape,
    entries: &[ConntrackEntry],
    quiet_for_ms: u64,
    timeouts: &StateTimeouts,
) -> Option<Vec<String>> {
    let fresh: Vec<(&ConntrackEntry, u32)> = entries
        .iter()
        .filter(|e| e.seen_reply && shape.matches(e))
        .filter_map(|e| Some((e, timeouts.idle_s(e)?)))
        .filter(|(_, idle)| u64::from(*idle) * 1000 < quiet_for_ms)
        .collect();
    if fresh.is_empty() {
        return None;
    }
    let mut lines = vec![format!(
        "not confirmed again for {} s, while {} answered {} passed packets since \
         (conntrack, SEEN_REPLY)",
        quiet_for_ms / 1000,
        fresh.len(),
        shape.describe()
    )];
    for (e, idle) in fresh.iter().take(QUOTED) {
        lines.push(format!(
            "conntrack: {} -> {} ({}), answered, latest packet {idle} s ago",
            std::net::SocketAddr::new(e.orig.src, e.orig.sport),
            std::net::SocketAddr::new(e.orig.dst, e.orig.dport),
            e.tcp_state.as_deref().unwrap_or(e.orig.proto.as_str())
        ));
    }
    Some(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Tuple;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entry(
        src: &str,
        dst: &str,
        dport: u16,
        state: &str,
        left: u32,
        answered: bool,
    ) -> ConntrackEntry {
        let t = |src: &str, sport, dst: &str, dport| Tuple {
            src: ip(src),
            dst: ip(dst),
            sport,
            dport,
            proto: Proto::Tcp,
        };
        ConntrackEntry {
            orig: t(src, 40000, dst, dport),
            reply: t(dst, dport, src, 40000),
            snat: true,
            dnat: false,
            seen_reply: answered,
            tcp_state: Some(state.into()),
            timeout_s: Some(left),
        }
    }

    const LB: &str = "203.0.113.10";

    #[test]
    fn only_an_answered_connection_of_the_shape_after_the_last_sighting_proves_it() {
        let t = StateTimeouts::kernel_defaults();
        let shape = Shape::To {
            addr: ip(LB),
            port: 80,
            proto: Proto::Tcp,
            from: None,
        };
        // TIME_WAIT (120 s) with 110 s left: its latest packet passed 10 s ago.
        let fresh = entry("198.19.1.10", LB, 80, "TIME_WAIT", 110, true);
        let lines = find(&shape, std::slice::from_ref(&fresh), 60_000, &t).expect("proved");
        assert!(
            lines[0].contains("1 answered connections to 203.0.113.10:80/tcp"),
            "{lines:?}"
        );
        assert!(lines[1].contains("latest packet 10 s ago"), "{lines:?}");
        // The same connection, but older than the quiet stretch: from before the last sighting.
        let old = entry("198.19.1.10", LB, 80, "TIME_WAIT", 20, true);
        assert_eq!(find(&shape, &[old], 60_000, &t), None);
        // Not answered (the loop itself: SYN_SENT, no reply), another port, another address.
        let unanswered = entry("198.19.1.10", LB, 80, "SYN_SENT", 119, false);
        let other_port = entry("198.19.1.10", LB, 443, "TIME_WAIT", 119, true);
        let other_addr = entry("198.19.1.10", "203.0.113.11", 80, "TIME_WAIT", 119, true);
        assert_eq!(
            find(&shape, &[unanswered, other_port, other_addr], 60_000, &t),
            None
        );
        // No timeout (a recording without it) or an unknown state: no age, no proof.
        let mut no_age = fresh.clone();
        no_age.timeout_s = None;
        assert_eq!(find(&shape, &[no_age], 60_000, &t), None);
    }

    #[test]
    fn each_kind_has_its_shape() {
        let t = StateTimeouts::kernel_defaults();
        // A health check from the VIP to the node, answered 5 s ago.
        let hc = entry(LB, "192.0.2.1", 30080, "TIME_WAIT", 115, true);
        let from_vip = Shape::From { addr: ip(LB) };
        assert!(find(&from_vip, std::slice::from_ref(&hc), 60_000, &t).is_some());
        let to_vip = Shape::To {
            addr: ip(LB),
            port: 80,
            proto: Proto::Tcp,
            from: None,
        };
        assert_eq!(find(&to_vip, &[hc], 60_000, &t), None);
        // A self-loop's proof must be the pod's own call.
        let pod_only = Shape::To {
            addr: ip(LB),
            port: 80,
            proto: Proto::Tcp,
            from: Some(ip("198.19.1.11")),
        };
        let another_pod = entry("198.19.1.10", LB, 80, "TIME_WAIT", 115, true);
        assert_eq!(find(&pod_only, &[another_pod], 60_000, &t), None);
        let the_pod = entry("198.19.1.11", LB, 80, "TIME_WAIT", 115, true);
        assert!(find(&pod_only, &[the_pod], 60_000, &t).is_some());
    }
}
