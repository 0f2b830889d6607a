//! `proxy_protocol_short_circuit`'s correlation over conntrack entries: shaped as the lab
//! node leaves them (no kernel; the kernel's own encoding is probe-user's `state::conntrack`
//! test).

use std::net::IpAddr;

use probe_contract::Proto;

use super::{
    proxy_protocol::{ProxyProtocolTarget, confirm, targets},
    tests::has_line,
};
use crate::state::{ConntrackEntry, Tuple};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

use crate::test_events::{DO_PP, LB, POD_A, POD_B, proxy_protocol_ingress as ingress};

/// pod A -> LB:9443, DNATed to pod B:9443 and masqueraded to the pod gateway (what the lab's
/// kube-proxy rules make of it), in `state`.
fn entry(state: &str, assured: bool) -> ConntrackEntry {
    ConntrackEntry {
        orig: Tuple {
            src: ip(POD_A),
            dst: ip(LB),
            sport: 54084,
            dport: 9443,
            proto: Proto::Tcp,
        },
        reply: Tuple {
            src: ip(POD_B),
            dst: ip("198.19.1.1"),
            sport: 9443,
            dport: 45613,
            proto: Proto::Tcp,
        },
        snat: true,
        dnat: true,
        seen_reply: true,
        assured,
        tcp_state: Some(state.into()),
        timeout_s: Some(9),
    }
}

#[test]
fn only_the_tcp_ports_of_a_proxy_protocol_service_are_targets() {
    assert_eq!(
        targets(&[ingress(&[DO_PP], None)]),
        vec![ProxyProtocolTarget {
            ip: ip(LB),
            port: 9443,
            service: "default/ingress".into(),
            annotation: format!("{}: {}", DO_PP.0, DO_PP.1),
            ip_mode_proxy: false,
        }]
    );
    assert!(targets(&[ingress(&[], None)]).is_empty());
    assert!(targets(&[ingress(&[(DO_PP.0, "false")], None)]).is_empty());
}

#[test]
fn a_reset_short_circuited_call_is_confirmed_and_its_twins_are_not() {
    let t = targets(&[ingress(&[DO_PP], None)]);
    let reset = entry("CLOSE", true);
    let got = confirm(std::slice::from_ref(&reset), &t);
    assert_eq!(got.len(), 1, "{got:#?}");
    let r = &got[0];
    assert_eq!(r.client, (ip(POD_A), 54084));
    assert_eq!(r.lb, (ip(LB), 9443));
    assert_eq!(r.endpoint, (ip(POD_B), 9443));
    assert!(r.snat);
    assert_eq!(r.service, "default/ingress");
    let evidence = r.evidence.join("\n");
    assert!(evidence.contains(DO_PP.0), "{evidence}");
    assert!(evidence.contains("198.19.1.11:9443"), "{evidence}");

    // Twins: the same call with the header (answered, closed cleanly); a connect that never
    // completed; a call that went to the LB (no DNAT here); an LB without PROXY protocol.
    let clean = entry("TIME_WAIT", true);
    let refused = entry("CLOSE", false);
    let via_lb = ConntrackEntry {
        dnat: false,
        reply: Tuple {
            src: ip(LB),
            dst: ip(POD_A),
            sport: 9443,
            dport: 54084,
            proto: Proto::Tcp,
        },
        ..entry("CLOSE", true)
    };
    for (what, e) in [
        ("clean close", &clean),
        ("never established", &refused),
        ("through the LB", &via_lb),
    ] {
        assert!(confirm(std::slice::from_ref(e), &t).is_empty(), "{what}");
    }
    assert!(
        confirm(
            std::slice::from_ref(&reset),
            &targets(&[ingress(&[], None)])
        )
        .is_empty()
    );

    // ipMode Proxy, yet DNATed on this node (an older kube-proxy): confirmed, and said.
    let got = confirm(&[reset], &targets(&[ingress(&[DO_PP], Some("Proxy"))]));
    assert_eq!(got.len(), 1);
    assert!(
        got[0].evidence.iter().any(|e| e.contains("ignores ipMode")),
        "{got:#?}"
    );
}

/// The correlator's report: one per reset call, however many dumps still show its entry
/// (10 s in CLOSE); another call is another occurrence of the same aggregate.
#[test]
fn each_reset_call_is_one_occurrence_of_its_aggregate() {
    use probe_contract::{LoopbackKind, Outcome, SnatState};

    use super::{Correlator, CorrelatorConfig, Output};
    let mut c = Correlator::new(CorrelatorConfig::default());
    let t = targets(&[ingress(&[DO_PP], None)]);
    let reports = |out: Vec<Output>| -> Vec<probe_contract::Confirmation> {
        out.into_iter()
            .filter_map(|o| match o {
                Output::Report(r) => Some(r),
                Output::Query(_) => None,
            })
            .collect()
    };
    let first = reports(c.proxy_protocol(&[entry("CLOSE", true)], &t, 1_000_000_000));
    assert_eq!(first.len(), 1);
    let e = &first[0].event;
    assert_eq!(e.kind, LoopbackKind::ProxyProtocolShortCircuit);
    assert_eq!(e.outcome, Outcome::Reset);
    assert_eq!(e.snat, SnatState::Yes);
    assert_eq!((e.vip, e.vip_port), (Some(ip(LB)), Some(9443)));
    assert_eq!((e.src, e.dst, e.dst_port), (ip(POD_A), ip(POD_B), 9443));
    assert_eq!(
        e.key,
        "proxy_protocol_short_circuit/203.0.113.10:9443->198.19.1.11:9443/tcp"
    );
    assert!(has_line(&e.remedy, "do-loadbalancer-hostname"), "{e:#?}");
    assert!(first[0].is_new);
    // The same entry in the next dump: already counted.
    assert!(reports(c.proxy_protocol(&[entry("CLOSE", true)], &t, 4_000_000_000)).is_empty());
    // Another call: the aggregate's second occurrence.
    let mut other = entry("CLOSE", true);
    other.orig.sport = 54100;
    let second = reports(c.proxy_protocol(&[other], &t, 7_000_000_000));
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].event.count, 2);
    assert!(!second[0].is_new);
}

/// Hostile round 4: a tenant Service with 5,000 ports is one dump a round (its LB IP), not
/// 5,000; the IP:ports still say which entries count.
#[test]
fn a_round_dumps_each_lb_ip_once_whatever_its_ports() {
    let many: Vec<ProxyProtocolTarget> = (0..5000u16)
        .map(|p| ProxyProtocolTarget {
            ip: ip("203.0.113.10"),
            port: 10_000 + p,
            service: "tenant/many".into(),
            annotation: "x".into(),
            ip_mode_proxy: false,
        })
        .chain(std::iter::once(ProxyProtocolTarget {
            ip: ip("203.0.113.11"),
            port: 443,
            service: "shop/web".into(),
            annotation: "x".into(),
            ip_mode_proxy: false,
        }))
        .collect();
    let (ips, wanted) = super::proxy_protocol::dump_plan(&many);
    assert_eq!(ips, vec![ip("203.0.113.10"), ip("203.0.113.11")]);
    assert_eq!(wanted.len(), 5001);
    assert!(wanted.contains(&(ip("203.0.113.11"), 443)));
}
