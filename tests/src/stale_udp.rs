//! What the stale UDP conntrack tests (IPv4 and IPv6, every mode) assert of the agent's events.

use std::{net::IpAddr, time::Duration};

use probe_contract::{LoopbackEvent, LoopbackKind};
use test_support::lab::stale_udp;

use crate::agent::Agent;

/// The `stale_udp_conntrack` events the agent has written so far.
pub fn stale_events(agent: &Agent) -> Vec<LoopbackEvent> {
    agent
        .events()
        .into_iter()
        .filter(|e| e.kind == LoopbackKind::StaleUdpConntrack)
        .collect()
}

/// The first `stale_udp_conntrack` event the agent writes within `wait`: it must name the
/// statsd Service and pod B's first endpoint (`pod_b`, the old endpoint port) as the stale one.
pub fn stale_event_of_the_first_endpoint(
    agent: &Agent,
    pod_b: IpAddr,
    wait: Duration,
) -> LoopbackEvent {
    let e = agent.first_event_of(LoopbackKind::StaleUdpConntrack, wait);
    assert_eq!(
        (e.dst, e.dst_port),
        (pod_b, stale_udp::OLD_ENDPOINT_PORT),
        "{e:#?}"
    );
    assert!(
        e.service
            .as_deref()
            .is_some_and(|s| s.starts_with(stale_udp::STATSD_SERVICE)),
        "{e:#?}"
    );
    e
}
