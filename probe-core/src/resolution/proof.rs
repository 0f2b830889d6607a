//! Proof that a quiet loop's traffic flows again: answered conntrack connections *from the
//! loop's own clients* (the pods or the node that looped, the LB's check source) through the
//! same VIP:port, whose latest packet passed after the loop's last confirmation. Pure: the
//! entries and the node's timeouts are read by the agent (`state::conntrack`) and handed in.
//!
//! Why conntrack: every kind's traffic crosses the node's conntrack (the health checks to the
//! node, the pod's calls to the LB, the calls to the VIP port), and `SEEN_REPLY` says the
//! answer came back, which is exactly what the loop prevented. Why the age: an entry answered
//! *before* the loop was last seen (a call that picked another node) proves nothing about
//! the time since; the entry's timeout left, against its state's full timeout, bounds how long
//! ago its latest packet passed ([`StateTimeouts::idle_s`]).
//!
//! Why the loop's own clients: another client's answered call proves nothing about them. The
//! node's own call to the LB is never sent back to it (the LB's guard skips the backend equal
//! to the source), so it is answered while a pod on the node still loops.
//!
//! Why the same client *and* port (issue #49): a loop is a client's calls to one LB IP:port;
//! the node's answered calls to another port of the same Service (which the LB sends
//! elsewhere) say nothing about the pod's loop on this one. A shape keeps the (client, port)
//! pairs that looped, and only those prove.
//!
//! Why a hairpin wants NAT on this node, or many calls: the LB picks the backend, and in a
//! cluster of several nodes the looping pod's call that the LB sent to another node is
//! answered too, with no NAT here, while the loop stands. A call masqueraded or
//! short-circuited (DNAT) on this node shows the node's path changed. Calls answered by the LB
//! alone prove it only when there are [`MIN_ANSWERED_THROUGH_LB`] of them since the loop was
//! last confirmed, across which a standing loop would have been confirmed again. A change of
//! the Service alone proves nothing (a fix that changed an annotation nothing acted on).

use std::{collections::BTreeSet, net::IpAddr};

use probe_contract::{LoopbackEvent, ProofShape, Proto};

use crate::state::{ConntrackEntry, conntrack::StateTimeouts};

/// The loop's client (or destination) addresses kept at most: one per aggregate.
pub const MAX_ADDRESSES: usize = super::MAX_AGGREGATES;

/// A hairpin's answered calls with no NAT on this node that prove it gone: the LB sends a
/// call back to the caller's own node with a chance of one in the number of nodes it picks
/// from; at one in two, 8 calls answered elsewhere in a row while the loop stands is a
/// 1-in-256 chance (and each looping call would have been confirmed again).
pub const MIN_ANSWERED_THROUGH_LB: usize = 8;

/// What traffic of a loop looks like in conntrack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Connections *to* `addr` from the loop's own clients, each to the port it looped on
    /// (hairpin: the pods or the node calling the LB; vip_port_unserved: the callers of the VIP
    /// port; service_self_loop: the pod calling its Service).
    To {
        addr: IpAddr,
        /// The port and protocol of the loop's first aggregate (the proof's text names it
        /// first).
        port: u16,
        proto: Proto,
        /// A hairpin: the LB chose the backend, so an answer with no NAT on this node may be
        /// the LB having sent the call elsewhere ([`Found::only_through_lb`]).
        lb_picks_backend: bool,
        /// The (client, port, protocol) calls that looped, across the loop's aggregates: only
        /// the same client's calls to the same port prove (a loop is one Service's, and its
        /// aggregates may call several of its ports: the node-sourced hairpin on one, the
        /// pods' on another). Bounded by [`MAX_ADDRESSES`].
        pairs: BTreeSet<(IpAddr, u16, Proto)>,
    },
    /// Connections *from* `addr` (healthcheck_blackhole: the LB's health checks, whose source
    /// is the VIP, to the node addresses they were dropped at; vip_as_source: the node's own
    /// connections from the VIP, to the destinations that dropped them).
    From {
        addr: IpAddr,
        /// The destinations the loop's packets went to.
        to: BTreeSet<IpAddr>,
        /// The loop's packets come from outside the node (the LB's health checks): a
        /// connection from `addr` while `addr` is local to the node was made on the node,
        /// by anyone, and is never theirs ([`find_on_node`]).
        from_outside: bool,
    },
}

/// Answered connections of a loop's shape, since its last confirmation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The proof's lines: what was seen, then the connections quoted by 5-tuple.
    pub lines: Vec<String>,
    /// A hairpin's calls answered with no NAT on this node only: at least
    /// [`MIN_ANSWERED_THROUGH_LB`] of them (fewer is no proof: the LB may just have picked
    /// another node).
    pub only_through_lb: bool,
}

impl Shape {
    /// The shape of a loop's traffic, from its event. None when the event lacks the address
    /// the shape needs (then nothing can prove it and it stays quiet).
    pub fn of(e: &LoopbackEvent) -> Option<Shape> {
        match e.kind.spec().proof {
            ProofShape::To { lb_picks_backend } => Some(Shape::To {
                addr: e.vip?,
                port: e.vip_port?,
                proto: e.proto,
                lb_picks_backend,
                pairs: BTreeSet::from([(e.src, e.vip_port?, e.proto)]),
            }),
            ProofShape::Unprovable => None,
            ProofShape::From { from_outside } => Some(Shape::From {
                addr: e.vip.unwrap_or(e.src),
                to: BTreeSet::from([e.dst]),
                from_outside,
            }),
        }
    }

    /// Another aggregate of the same loop: its (client, port) (or its destination) joins the
    /// shape.
    pub fn widen(&mut self, e: &LoopbackEvent) {
        match self {
            Shape::To { addr, pairs, .. } => {
                if e.vip == Some(*addr)
                    && let Some(p) = e.vip_port
                    && pairs.len() < MAX_ADDRESSES
                {
                    pairs.insert((e.src, p, e.proto));
                }
            }
            Shape::From { to, .. } => {
                if to.len() < MAX_ADDRESSES {
                    to.insert(e.dst);
                }
            }
        }
    }

    /// The loop's clients (a To shape's pairs' sources; none for a From shape).
    fn clients(&self) -> BTreeSet<IpAddr> {
        match self {
            Shape::To { pairs, .. } => pairs.iter().map(|(c, ..)| *c).collect(),
            Shape::From { .. } => BTreeSet::new(),
        }
    }

    /// A To shape's ports other than its first, once each.
    fn other_ports(&self) -> Vec<(u16, Proto)> {
        let Shape::To {
            port, proto, pairs, ..
        } = self
        else {
            return Vec::new();
        };
        let set: BTreeSet<(u16, Proto)> = pairs
            .iter()
            .map(|(_, p, pr)| (*p, *pr))
            .filter(|pp| *pp != (*port, *proto))
            .collect();
        set.into_iter().collect()
    }

    /// The address family the entries must come from.
    pub fn is_v6(&self) -> bool {
        match self {
            Shape::To { addr, .. } | Shape::From { addr, .. } => addr.is_ipv6(),
        }
    }

    /// The loop's address: the VIP called, or the source of its packets.
    pub fn addr(&self) -> IpAddr {
        match self {
            Shape::To { addr, .. } | Shape::From { addr, .. } => *addr,
        }
    }

    /// Whether `e` is the loop's own traffic through the path the loop broke. `addr_is_local`:
    /// the loop's address is an address of this node now (issue #36, E3: any local user can
    /// bind it, listen on it and connect from it).
    fn matches(&self, e: &ConntrackEntry, addr_is_local: bool) -> bool {
        match self {
            Shape::To { addr, pairs, .. } => {
                // Served by a listener on the VIP itself (nothing rewrote the destination)
                // while the VIP is local: a local socket answered, not the LB path.
                let local_listener = addr_is_local
                    && !e.dnat
                    && (e.reply.src, e.reply.sport) == (e.orig.dst, e.orig.dport);
                e.orig.dst == *addr
                    && pairs.contains(&(e.orig.src, e.orig.dport, e.orig.proto))
                    // A connection from the VIP is a local socket bound to it, no client's.
                    && e.orig.src != *addr
                    && !local_listener
            }
            Shape::From {
                addr,
                to,
                from_outside,
            } => {
                e.orig.src == *addr && to.contains(&e.orig.dst) && !(*from_outside && addr_is_local)
            }
        }
    }

    fn describe(&self) -> String {
        let list = |set: &BTreeSet<IpAddr>| {
            set.iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Shape::To {
                addr, port, proto, ..
            } => format!(
                "connections to {}/{}{} from the loop's own clients ({})",
                std::net::SocketAddr::new(*addr, *port),
                proto.as_str(),
                self.other_ports()
                    .iter()
                    .map(|(p, proto)| format!(", :{p}/{}", proto.as_str()))
                    .collect::<String>(),
                list(&self.clients())
            ),
            Shape::From { addr, to, .. } => {
                format!("connections from {addr} to {}", list(to))
            }
        }
    }
}

/// At most this many connections are quoted in a proof.
const QUOTED: usize = 3;

/// What NAT this node did to a connection, for the proof's quote.
fn nat_here(e: &ConntrackEntry) -> &'static str {
    match (e.snat, e.dnat) {
        (true, true) => "source- and destination-NATed on this node",
        (true, false) => "source-NATed on this node",
        (false, true) => "destination-NATed on this node",
        (false, false) => "no NAT on this node",
    }
}

/// The proof, or None: answered connections of `shape` whose latest packet passed less than
/// `quiet_for_ms` ago, i.e. after the loop's last confirmation (the idle time is an upper
/// bound: conntrack rounds the time left down to the second). For a hairpin, connections
/// NATed on this node are quoted when there are any ([`Found::only_through_lb`] otherwise).
/// Pure. For a node where the loop's address is not local ([`find_on_node`] otherwise).
pub fn find(
    shape: &Shape,
    entries: &[ConntrackEntry],
    quiet_for_ms: u64,
    timeouts: &StateTimeouts,
) -> Option<Found> {
    find_on_node(shape, entries, quiet_for_ms, timeouts, false)
}

/// [`find`] on a node where the loop's address is local or not (`addr_is_local`, the agent
/// asks [`is_local_address`]). Issue #36, E3: a local address can be bound, listened on and
/// connected from by any local user, so while it is local, a connection *from* it is never
/// the loop's (the LB's health checks never arrive with a local source; a To-shape's client
/// is never the VIP) and a connection *to* it answered by a listener on it, with nothing
/// rewritten, is not the path the loop broke. Such loops stay quiet rather than resolved:
/// a fix that leaves the VIP local and has no DNAT is not proved (no false claim). Pure.
pub fn find_on_node(
    shape: &Shape,
    entries: &[ConntrackEntry],
    quiet_for_ms: u64,
    timeouts: &StateTimeouts,
    addr_is_local: bool,
) -> Option<Found> {
    let fresh: Vec<(&ConntrackEntry, u32)> = entries
        .iter()
        .filter(|e| e.seen_reply && shape.matches(e, addr_is_local))
        .filter_map(|e| Some((e, timeouts.idle_s(e)?)))
        .filter(|(_, idle)| u64::from(*idle) * 1000 < quiet_for_ms)
        .collect();
    if fresh.is_empty() {
        return None;
    }
    let lb_picks_backend = matches!(
        shape,
        Shape::To {
            lb_picks_backend: true,
            ..
        }
    );
    let natted: Vec<(&ConntrackEntry, u32)> = fresh
        .iter()
        .filter(|(e, _)| e.snat || e.dnat)
        .copied()
        .collect();
    let only_through_lb = lb_picks_backend && natted.is_empty();
    if only_through_lb && fresh.len() < MIN_ANSWERED_THROUGH_LB {
        return None;
    }
    let quoted = if lb_picks_backend && !natted.is_empty() {
        natted
    } else {
        fresh
    };
    let mut lines = vec![format!(
        "not confirmed again for {} s, while {} answered {} passed packets since \
         (conntrack, SEEN_REPLY)",
        quiet_for_ms / 1000,
        quoted.len(),
        shape.describe()
    )];
    for (e, idle) in quoted.iter().take(QUOTED) {
        lines.push(format!(
            "conntrack: {} {} -> {} ({}), answered, {}, latest packet {idle} s ago",
            e.orig.proto.as_str(),
            std::net::SocketAddr::new(e.orig.src, e.orig.sport),
            std::net::SocketAddr::new(e.orig.dst, e.orig.dport),
            e.tcp_state.as_deref().unwrap_or(e.orig.proto.as_str()),
            nat_here(e)
        ));
    }
    Some(Found {
        lines,
        only_through_lb,
    })
}

/// Whether `addr` is an address of this network namespace: a socket binds to it (port 0, no
/// packet sent, closed at once). With `net.ipv4.ip_nonlocal_bind` on, every address reads
/// as local, which only withholds proofs.
pub fn is_local_address(addr: IpAddr) -> bool {
    std::net::UdpSocket::bind(std::net::SocketAddr::new(addr, 0)).is_ok()
}

#[cfg(test)]
#[path = "proof_tests.rs"]
mod tests;
