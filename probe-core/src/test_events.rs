//! One confirmed event for the unit tests that need any (the report's loops, the Event
//! planner, the OTLP records, the resolution tracker): a hairpin of `shop/web`'s LB, pod
//! 10.244.1.7 -> LB 203.0.113.10:80, back to this node's NodePort 198.51.100.20:30080, every
//! optional fact empty. Each test sets what it is about. And the PROXY-protocol Service the
//! core's and the agent's conntrack tests share. Test support (the agent's tests use it too):
//! not the product's API.

use std::net::IpAddr;

use probe_contract::{LoopbackEvent, LoopbackKind, Outcome, Proto, SnatState};

use crate::{
    service::{LbIngress, ServiceFacts, ServicePort},
    state::Tuple,
};

/// Panics unless some line of `lines` contains `needle`, showing every line.
#[track_caller]
pub fn assert_some_line_has(lines: &[String], needle: &str) {
    assert!(
        lines.iter().any(|l| l.contains(needle)),
        "no line has {needle:?}: {lines:#?}"
    );
}

/// [`hairpin`] of `service` (or none), counted once, with a remedy: the node report's and the
/// resolution tracker's tests.
pub fn hairpin_for(key: &str, service: Option<&str>) -> LoopbackEvent {
    LoopbackEvent {
        count: 1,
        remedy: vec!["call web.shop.svc instead".to_string()],
        service: service.map(String::from),
        ..hairpin(key)
    }
}

/// A TCP connection's tuple, as conntrack entries hold them (the conntrack tests').
pub fn tcp_tuple(src: &str, sport: u16, dst: &str, dport: u16) -> Tuple {
    Tuple {
        src: ip(src),
        dst: ip(dst),
        sport,
        dport,
        proto: Proto::Tcp,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn hairpin(key: &str) -> LoopbackEvent {
    LoopbackEvent {
        key: key.to_string(),
        vip: Some("203.0.113.10".parse().unwrap()),
        vip_port: Some(80),
        snat: SnatState::No,
        count: 1,
        first_seen_ns: 1,
        last_seen_ns: 2,
        ..LoopbackEvent::between(
            LoopbackKind::Hairpin,
            ("10.244.1.7".parse().unwrap(), 40000),
            ("198.51.100.20".parse().unwrap(), 30080),
            Proto::Tcp,
            Outcome::NoReply,
        )
    }
}

pub const LB: &str = "203.0.113.10";
pub const POD_A: &str = "198.19.1.10";
pub const POD_B: &str = "198.19.1.11";

/// `default/ingress` on the LB IP's 9443 (and 53/udp), with `annotations`.
pub fn proxy_protocol_ingress(annotations: &[(&str, &str)], ip_mode: Option<&str>) -> ServiceFacts {
    let port = |port: u16, protocol: &str| ServicePort {
        name: None,
        protocol: protocol.into(),
        port,
        node_port: None,
    };
    ServiceFacts {
        cluster_ips: vec![ip("198.18.100.20")].into(),
        ingress: vec![LbIngress {
            ip: Some(ip(LB)),
            hostname: None,
            ip_mode: ip_mode.map(Into::into),
        }]
        .into(),
        ports: vec![port(9443, "TCP"), port(53, "UDP")].into(),
        endpoints: vec![ip(POD_B)].into(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..ServiceFacts::named("default", "ingress", "LoadBalancer")
    }
}

pub const DO_PP: (&str, &str) = (
    "service.beta.kubernetes.io/do-loadbalancer-enable-proxy-protocol",
    "true",
);
