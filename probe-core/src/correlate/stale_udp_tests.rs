//! `stale_udp_conntrack` over conntrack entries shaped as the lab node leaves them (no
//! kernel): a statsd-like sender 198.19.1.10:40000 -> ClusterIP 10.96.0.50:8125, DNATed
//! to the endpoint that was 198.19.1.20:8125 while the Service's endpoint is now
//! 198.19.1.21:8125.

use std::collections::HashMap;

use probe_contract::{LoopbackKind, Proto, facts::ProxyMode};

use super::{
    Correlator, CorrelatorConfig, Output,
    stale_udp::{confirm, delete_command, dump_ips},
    tests::{S, assert_mentions, ip},
};
use crate::state::{ConntrackEntry, ServiceEntry, ServiceSource, ServiceTable, Tuple};

/// The statsd sender, its Service's ClusterIP, and the endpoint that was (also the scenario
/// of `stale_udp_rejected_tests`).
pub(super) const SENDER: &str = "198.19.1.10";
pub(super) const CLUSTER_IP: &str = "10.96.0.50";
pub(super) const OLD: &str = "198.19.1.20";
const NEW: &str = "198.19.1.21";

fn table(backends: &[&str]) -> ServiceTable {
    ServiceTable {
        services: vec![ServiceEntry {
            vip: ip(CLUSTER_IP),
            port: 8125,
            proto: Proto::Udp,
            service: Some("monitoring/statsd:statsd".into()),
            backends: backends.iter().map(|b| format!("{b}:8125")).collect(),
        }],
        ..ServiceTable::default()
    }
}

/// The sender's entry, sent to `to` (the ClusterIP itself: no DNAT), with `timeout_s` left.
fn entry(proto: Proto, to: &str, seen_reply: bool, timeout_s: u32) -> ConntrackEntry {
    ConntrackEntry {
        orig: Tuple {
            src: ip(SENDER),
            dst: ip(CLUSTER_IP),
            sport: 40000,
            dport: 8125,
            proto,
        },
        reply: Tuple {
            src: ip(to),
            dst: ip(SENDER),
            sport: 8125,
            dport: 40000,
            proto,
        },
        snat: false,
        dnat: to != CLUSTER_IP,
        seen_reply,
        assured: false,
        tcp_state: None,
        timeout_s: Some(timeout_s),
    }
}

/// Two dumps 5 s apart: `first` then `second`; what the second confirms.
fn two_dumps(t: &ServiceTable, first: &ConntrackEntry, second: &ConntrackEntry) -> usize {
    let (none, seen) = confirm(std::slice::from_ref(first), t, &HashMap::new(), 100 * S);
    assert!(none.is_empty(), "one dump confirms nothing: {none:#?}");
    let (got, _) = confirm(std::slice::from_ref(second), t, &seen, 105 * S);
    got.len()
}

#[test]
fn a_refreshed_unreplied_entry_to_a_gone_endpoint_is_confirmed_with_its_evidence() {
    let t = table(&[NEW]);
    let (_, seen) = confirm(
        &[entry(Proto::Udp, OLD, false, 29)],
        &t,
        &HashMap::new(),
        100 * S,
    );
    let (got, _) = confirm(&[entry(Proto::Udp, OLD, false, 30)], &t, &seen, 105 * S);
    assert_eq!(got.len(), 1, "{got:#?}");
    let r = &got[0];
    assert_eq!((r.orig.src, r.orig.sport), (ip(SENDER), 40000));
    assert_eq!(r.sent_to, (ip(OLD), 8125));
    assert_eq!(r.service, "monitoring/statsd:statsd");
    assert_mentions(
        &r.evidence,
        &[
            "198.19.1.10:40000 -> 10.96.0.50:8125 DNATed to 198.19.1.20:8125",
            "UNREPLIED",
            "current endpoints: 198.19.1.21:8125",
            "from 29s to 30s",
        ],
    );
}

#[test]
fn a_service_scaled_to_zero_leaves_every_dnated_entry_stale() {
    assert_eq!(
        two_dumps(
            &table(&[]),
            &entry(Proto::Udp, OLD, false, 30),
            &entry(Proto::Udp, OLD, false, 29)
        ),
        1
    );
}

#[test]
fn an_entry_without_dnat_is_stale_once_the_service_has_endpoints() {
    let stale = entry(Proto::Udp, CLUSTER_IP, false, 30);
    assert_eq!(two_dumps(&table(&[NEW]), &stale, &stale), 1);
    // No endpoint yet: the ClusterIP has nowhere else to send it.
    assert_eq!(two_dumps(&table(&[]), &stale, &stale), 0);
}

/// IPVS mode: IPVS schedules each datagram without an IPVS connection whatever conntrack
/// holds, so the un-NATed entry of a sender that predates the virtual service (and any other)
/// is no black hole; nothing is dumped either.
#[test]
fn in_ipvs_mode_no_entry_is_stale_and_nothing_is_dumped() {
    let mut t = table(&[NEW]);
    t.source = Some(crate::state::ServiceSource::Ipvs);
    let un_nated = entry(Proto::Udp, CLUSTER_IP, false, 30);
    assert_eq!(two_dumps(&t, &un_nated, &un_nated), 0);
    let to_old = entry(Proto::Udp, OLD, false, 30);
    assert_eq!(two_dumps(&t, &to_old, &to_old), 0);
    assert!(dump_ips(&t).is_empty());
    // The same entries are stale with iptables or nftables mode's table.
    t.source = Some(crate::state::ServiceSource::Iptables);
    assert_eq!(two_dumps(&t, &un_nated, &un_nated), 1);
    assert_eq!(dump_ips(&t), vec![ip(CLUSTER_IP)]);
}

#[test]
fn the_silent_twins() {
    let t = table(&[NEW]);
    // DNATed to a current endpoint.
    let current = entry(Proto::Udp, NEW, false, 30);
    assert_eq!(two_dumps(&t, &current, &current), 0);
    // Replied.
    let replied = entry(Proto::Udp, OLD, true, 30);
    assert_eq!(two_dumps(&t, &replied, &replied), 0);
    // TCP (the table's Service is UDP; a TCP one would be another entry).
    let tcp = entry(Proto::Tcp, OLD, false, 30);
    assert_eq!(two_dumps(&t, &tcp, &tcp), 0);
    // Not refreshed: its timeout fell by the 5 s between the dumps (give or take rounding).
    for after in [25, 26] {
        assert_eq!(
            two_dumps(
                &t,
                &entry(Proto::Udp, OLD, false, 30),
                &entry(Proto::Udp, OLD, false, after)
            ),
            0,
            "{after}"
        );
    }
    // Not a Service IP:port of the table.
    let mut elsewhere = entry(Proto::Udp, OLD, false, 30);
    elsewhere.orig.dport = 8126;
    assert_eq!(two_dumps(&t, &elsewhere, &elsewhere), 0);
}

#[test]
fn the_correlator_reports_an_entry_once_while_it_lives_and_again_after_it_was_deleted() {
    let mut c = Correlator::new(CorrelatorConfig::default());
    c.set_services(ServiceTable {
        source: Some(ServiceSource::Iptables),
        ..table(&[NEW])
    });
    assert_eq!(c.stale_udp_dump_ips(), vec![ip(CLUSTER_IP)]);
    let stale = [entry(Proto::Udp, OLD, false, 30)];
    assert!(c.stale_udp(&stale, 100 * S).is_empty());
    let out = c.stale_udp(&stale, 105 * S);
    let [Output::Report(report)] = out.as_slice() else {
        panic!("one report: {out:#?}")
    };
    let e = &report.event;
    assert_eq!(e.kind, LoopbackKind::StaleUdpConntrack);
    assert_eq!(
        e.key,
        "stale_udp_conntrack/198.19.1.10:40000->10.96.0.50:8125/udp"
    );
    assert_eq!((e.dst, e.dst_port), (ip(OLD), 8125));
    assert_eq!(e.service.as_deref(), Some("monitoring/statsd:statsd"));
    assert_eq!(
        e.facts.proxy_mode,
        Some(ProxyMode::Iptables),
        "the mode, as every kind's"
    );
    assert_mentions(
        &e.remedy,
        &[
            "conntrack -D -p udp --orig-src 198.19.1.10 --orig-dst 10.96.0.50 --sport 40000 --dport 8125",
            "kubernetes#139628",
            "#139629",
            "198.19.1.20:8125, which is no endpoint",
        ],
    );
    assert!(
        c.stale_udp(&stale, 110 * S).is_empty(),
        "once while it lives"
    );
    // Deleted (a dump without it), then made again by the same sender: a new occurrence.
    assert!(c.stale_udp(&[], 115 * S).is_empty());
    assert!(c.stale_udp(&stale, 120 * S).is_empty());
    assert_eq!(c.stale_udp(&stale, 125 * S).len(), 1);
}

#[test]
fn only_udp_service_ips_are_dumped_and_ipv6_deletes_name_the_family() {
    let mut t = table(&[NEW]);
    t.services.push(ServiceEntry {
        vip: ip("10.96.0.60"),
        port: 80,
        proto: Proto::Tcp,
        service: None,
        backends: vec![],
    });
    assert_eq!(dump_ips(&t), vec![ip(CLUSTER_IP)]);
    let e = probe_contract::LoopbackEvent {
        vip: Some(ip("fd00::50")),
        vip_port: Some(53),
        ..probe_contract::LoopbackEvent::between(
            LoopbackKind::StaleUdpConntrack,
            (ip("fd00::10"), 5353),
            (ip("fd00::20"), 53),
            Proto::Udp,
            probe_contract::Outcome::NoReply,
        )
    };
    assert_eq!(
        delete_command(&e),
        "conntrack -D -f ipv6 -p udp --orig-src fd00::10 --orig-dst fd00::50 --sport 5353 --dport 53"
    );
}
