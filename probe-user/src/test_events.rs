//! One confirmed event for the unit tests that need any (the report's loops, the Event
//! planner, the OTLP records, the resolution tracker): a hairpin of `shop/web`'s LB, pod
//! 10.244.1.7 -> LB 203.0.113.10:80, back to this node's NodePort 198.51.100.20:30080, every
//! optional fact empty. Each test sets what it is about.

use probe_contract::{LoopbackEvent, LoopbackKind, Outcome, Proto, SnatState};

pub(crate) fn hairpin(key: &str) -> LoopbackEvent {
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
