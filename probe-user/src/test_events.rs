//! One confirmed event for the unit tests that need any (the report's loops, the Event
//! planner, the OTLP records, the resolution tracker): a hairpin of `shop/web`'s LB, pod
//! 10.244.1.7 -> LB 203.0.113.10:80, back to this node's NodePort 198.51.100.20:30080, every
//! optional fact empty. Each test sets what it is about.

use probe_contract::{LoopbackEvent, LoopbackKind, Outcome, Proto, SnatState};

pub(crate) fn hairpin(key: &str) -> LoopbackEvent {
    LoopbackEvent {
        kind: LoopbackKind::Hairpin,
        key: key.to_string(),
        src: "10.244.1.7".parse().unwrap(),
        src_port: 40000,
        dst: "198.51.100.20".parse().unwrap(),
        dst_port: 30080,
        vip: Some("203.0.113.10".parse().unwrap()),
        vip_port: Some(80),
        proto: Proto::Tcp,
        drop_reason: None,
        drop_location: None,
        snat: SnatState::No,
        outcome: Outcome::NoReply,
        count: 1,
        evidence: vec![],
        remedy: vec![],
        first_seen_ns: 1,
        last_seen_ns: 2,
        nic: None,
        service: None,
        layer: None,
        client_pod: None,
        node: None,
        fixes: Vec::new(),
        facts: Default::default(),
        listener: None,
    }
}
