//! Unit tests: every rule, its healthy twin, both event orders, aggregation, throttling,
//! expiry and bounded memory.

use std::net::IpAddr;

use super::{unserved::PROGRAMMED_TTL_NS, *};
use crate::state::{NodePortEntry, ServiceEntry};

/// Field variants (issue 10): the IPVS access filter, `vip_as_source`, health checks only.
mod field;

pub(super) const MS: u64 = 1_000_000;
pub(super) const S: u64 = 1_000 * MS;

pub(super) const LB_VIP: &str = "192.0.2.10"; // bound on kube-ipvs0 (blackhole / unserved)
pub(super) const EXT_VIP: &str = "203.0.113.80"; // LB VIP not bound locally (hairpin)
pub(super) const NODE: &str = "198.18.0.2";
pub(super) const POD: &str = "198.18.1.5";
pub(super) const POD_B: &str = "198.18.1.6";
pub(super) const CLIENT: &str = "198.51.100.7"; // outside the cluster

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn pkt(
    src: &str,
    sport: u16,
    dst: &str,
    dport: u16,
    st: Option<Tag>,
    dt: Option<Tag>,
) -> Packet {
    Packet {
        src: ip(src),
        dst: ip(dst),
        sport,
        dport,
        proto: Proto::Tcp,
        tcp_flags: tcp_flags::SYN,
        src_tag: st,
        dst_tag: dt,
    }
}

fn hc(sport: u16) -> Packet {
    pkt(LB_VIP, sport, NODE, 30080, Some(Tag::Vip), Some(Tag::Node))
}

/// The node calling one of its own ports from its own address.
pub(super) fn node_to_itself(sport: u16, dport: u16) -> Packet {
    pkt(NODE, sport, NODE, dport, Some(Tag::Node), Some(Tag::Node))
}

pub(super) fn hp(sport: u16, dport: u16) -> Packet {
    pkt(POD, sport, NODE, dport, Some(Tag::Pod), Some(Tag::Node))
}

pub(super) fn suspect(ts: u64, p: &Packet) -> KernelEvent {
    KernelEvent::Suspect {
        ts_ns: ts,
        nic: "eth0".into(),
        packet: p.clone(),
    }
}

pub(super) fn drop_ev(
    ts: u64,
    p: &Packet,
    name: &str,
    code: u32,
    loc: Option<&str>,
) -> KernelEvent {
    KernelEvent::Drop {
        ts_ns: ts,
        iface: Some("eth0".into()),
        packet: p.clone(),
        reason: DropReason {
            code,
            name: name.into(),
        },
        location: loc.map(Into::into),
        foreign_netns: false,
    }
}

pub(super) fn local_source(ts: u64, p: &Packet) -> KernelEvent {
    drop_ev(
        ts,
        p,
        "IP_LOCAL_SOURCE",
        89,
        Some("ip_rcv_finish_core+0x2d5"),
    )
}

pub(super) fn egress(sport: u16, dst: &str, dport: u16, ts: u64) -> EgressRecord {
    EgressRecord {
        src: ip(POD),
        sport,
        dst: ip(dst),
        dport,
        proto: Proto::Tcp,
        ts_ns: ts,
        last_ns: None,
        nic: "eth0".into(),
    }
}

pub(super) fn table() -> ServiceTable {
    ServiceTable {
        source: Some(ServiceSource::Ipvs),
        services: vec![ServiceEntry {
            vip: ip(LB_VIP),
            port: 80,
            proto: Proto::Tcp,
            service: Some("default/web:http".into()),
            backends: vec!["198.18.1.20:8080".into()],
        }],
        nodeports: vec![
            NodePortEntry {
                port: 30080,
                proto: Proto::Tcp,
                service: Some("default/web:http".into()),
                local_only: false,
            },
            NodePortEntry {
                port: 30081,
                proto: Proto::Tcp,
                service: Some("shop/cart:http".into()),
                local_only: true,
            },
        ],
        masquerade_rules: vec![
            "-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE".into(),
        ],
        access_filter: Vec::new(),
        no_endpoint_drops: Vec::new(),
        no_endpoint_rejects: Vec::new(),
        pod_short_circuits: Vec::new(),
        firewall: Vec::new(),
        health_checks: Vec::new(),
        from_api: false,
        serves_index: Default::default(),
    }
}

pub(super) fn corr() -> Correlator {
    corr_configured(CorrelatorConfig::default())
}

/// A correlator with `cfg` and the test table.
fn corr_configured(cfg: CorrelatorConfig) -> Correlator {
    let mut c = Correlator::new(cfg);
    c.set_services(table());
    c
}

/// A correlator with the default configuration reading service table `t`.
pub(super) fn corr_with(t: ServiceTable) -> Correlator {
    let mut c = Correlator::new(CorrelatorConfig::default());
    c.set_services(t);
    c
}

/// Each named case (a service table and one kernel event) reports nothing and confirms
/// nothing, also after the windows close.
pub(super) fn assert_none_confirmed(cases: Vec<(&str, ServiceTable, KernelEvent)>) {
    for (name, t, ev) in cases {
        let mut c = corr_with(t);
        let outs = c.ingest(ev);
        assert!(
            outs.iter().all(|o| !matches!(o, Output::Report(_))),
            "{name}: {outs:?}"
        );
        let _ = c.tick(10 * S);
        assert_eq!(c.stats().confirmed, KindCounts::default(), "{name}");
        invariants(&c);
    }
}

pub(super) fn reports(outs: &[Output]) -> Vec<Confirmation> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Report(r) => Some(r.clone()),
            Output::Query(_) => None,
        })
        .collect()
}

pub(super) fn queries(outs: &[Output]) -> Vec<Query> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Query(q) => Some(q.clone()),
            Output::Report(_) => None,
        })
        .collect()
}

pub(super) fn only_query(outs: &[Output]) -> Query {
    let q = queries(outs);
    assert_eq!(q.len(), 1, "expected one query in {outs:?}");
    assert!(reports(outs).is_empty(), "unexpected report in {outs:?}");
    q[0].clone()
}

pub(super) fn only_report(outs: &[Output]) -> Confirmation {
    let r = reports(outs);
    assert_eq!(r.len(), 1, "expected one report in {outs:?}");
    r[0].clone()
}

pub(super) fn invariants(c: &Correlator) {
    let s = c.stats();
    assert_eq!(
        s.suspects_seen.total(),
        s.suspects_confirmed + s.suspects_unconfirmed + s.pending_suspects,
        "suspect accounting: {s:#?}"
    );
    assert_eq!(
        s.drops_seen,
        s.drops_confirming + s.drops_unmatched + s.pending_drops,
        "drop accounting: {s:#?}"
    );
    assert!(s.pending as usize <= c.config().max_pending);
}

pub(super) fn has_line(lines: &[String], needle: &str) -> bool {
    lines.iter().any(|l| l.contains(needle))
}

/// Every needle stands somewhere in `lines` (an event's evidence or remedy); a missing one is
/// named with the whole text.
#[track_caller]
pub(super) fn assert_mentions(lines: &[String], needles: &[&str]) {
    let text = lines.join("\n");
    for needle in needles {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}

/// What a kube-proxy drop of [`POD`]'s TCP call to `lb_ip:port` (`etp_local_drop`,
/// `source_ranges_drop`) confirms: the kind, the key, the caller, the LB IP:port, dropped.
/// `case` names the table row on a failure.
#[track_caller]
pub(super) fn assert_dropped_pod_call(
    e: &LoopbackEvent,
    kind: LoopbackKind,
    key: &str,
    (lb_ip, port): (&str, u16),
    case: &str,
) {
    assert_eq!(e.kind, kind, "{case}");
    assert_eq!(e.key, key, "{case}");
    assert_eq!(e.src, ip(POD), "{case}");
    assert_eq!(e.vip, Some(ip(lb_ip)), "{case}");
    assert_eq!(e.vip_port, Some(port), "{case}");
    assert_eq!(e.outcome, probe_contract::Outcome::Dropped, "{case}");
}

/// The one suspect folded into its confirmation: counted as confirming, none left pending.
#[track_caller]
pub(super) fn assert_suspect_folded(c: &Correlator) {
    let s = c.stats();
    assert_eq!((s.suspects_confirmed, s.pending_suspects), (1, 0));
    invariants(c);
}

pub(super) fn ct(orig: Tuple, snat: bool, state: Option<&str>) -> ConntrackEntry {
    let reply = Tuple {
        src: orig.dst,
        dst: orig.src,
        sport: orig.dport,
        dport: orig.sport,
        proto: orig.proto,
    };
    ConntrackEntry {
        orig,
        reply,
        snat,
        dnat: false,
        seen_reply: false,
        assured: false,
        tcp_state: state.map(Into::into),
        timeout_s: None,
    }
}

// ----- healthcheck_blackhole -------------------------------------------------------------------

#[test]
fn blackhole_drop_alone_confirms() {
    let mut c = corr();
    let r = only_report(&c.ingest(local_source(S, &hc(41000))));
    let e = &r.event;
    assert!(r.is_new && r.write_json);
    assert_eq!(e.kind, LoopbackKind::HealthcheckBlackhole);
    assert_eq!(e.src, ip(LB_VIP));
    assert_eq!(e.dst, ip(NODE));
    assert_eq!(e.dst_port, 30080);
    assert_eq!(e.vip, Some(ip(LB_VIP)));
    assert_eq!(e.vip_port, None);
    assert_eq!(e.drop_reason.as_deref(), Some("IP_LOCAL_SOURCE"));
    assert_eq!(e.outcome, Outcome::Dropped);
    assert_eq!(e.snat, SnatState::Unknown);
    assert_eq!(e.service.as_deref(), Some("default/web"));
    assert_eq!(e.nic.as_deref(), Some("eth0"));
    assert_eq!(e.count, 1);
    assert!(has_line(&e.evidence, "kfree_skb"));
    assert!(has_line(
        &e.evidence,
        "NodePort 30080/tcp belongs to default/web"
    ));
    // A SYN spoofed from the VIP is the same bytes: the evidence says the source is trusted,
    // not proven.
    assert!(has_line(
        &e.evidence,
        &format!("the source {LB_VIP} is not authenticated")
    ));
    assert!(has_line(&e.remedy, "kube-ipvs0"));
    assert!(has_line(&e.remedy, "health checks from a source range"));
    assert!(has_line(&e.remedy, "all backends as alive"));
    invariants(&c);
    assert_eq!(c.stats().confirmed.healthcheck_blackhole, 1);
}

/// A VIP-source packet dropped at the route input confirms the health-check black hole
/// however the kernel names the drop, with or without its suspect.
#[test]
fn a_route_input_drop_of_a_vip_source_packet_confirms_the_blackhole() {
    struct Case {
        name: &'static str,
        suspect_first: bool,
        reason: &'static str,
        code: u32,
        site: &'static str,
        named: &'static str,
        lines: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "IP_LOCAL_SOURCE after its suspect",
            suspect_first: true,
            reason: "IP_LOCAL_SOURCE",
            code: 89,
            site: "ip_rcv_finish_core+0x2d5",
            named: "IP_LOCAL_SOURCE",
            lines: &["tc ingress on eth0"],
        },
        Case {
            name: "Debian 6.1: NOT_SPECIFIED at the route input, alone",
            suspect_first: false,
            reason: "NOT_SPECIFIED",
            code: 1,
            site: "ip_rcv_finish_core.constprop.0+0x1ab",
            named: "NOT_SPECIFIED",
            lines: &["route-input site"],
        },
        Case {
            name: "no drop reasons (< 5.17): UNREPORTED at the route input",
            suspect_first: true,
            reason: DropReason::UNREPORTED,
            code: 0,
            site: "ip_rcv_finish_core.constprop.0+0x1b7",
            named: "IP_LOCAL_SOURCE",
            lines: &[
                "inferred from the drop site",
                "no drop reason on this kernel",
            ],
        },
    ];
    for case in cases {
        let name = case.name;
        let mut c = corr();
        let p = hc(41000);
        if case.suspect_first {
            assert!(c.ingest(suspect(S, &p)).is_empty(), "{name}");
            assert_eq!(c.stats().pending_suspects, 1, "{name}");
        }
        let drop = drop_ev(S + 50_000, &p, case.reason, case.code, Some(case.site));
        let r = only_report(&c.ingest(drop));
        let e = &r.event;
        assert_eq!(e.kind, LoopbackKind::HealthcheckBlackhole, "{name}");
        assert_eq!(e.drop_reason.as_deref(), Some(case.named), "{name}");
        assert_eq!(e.drop_location.as_deref(), Some(case.site), "{name}");
        for line in case.lines {
            assert!(has_line(&e.evidence, line), "{name}: {line}");
        }
        c.tick(10 * S);
        let s = c.stats();
        assert_eq!(
            (s.suspects_confirmed, s.suspects_unconfirmed),
            (u64::from(case.suspect_first), 0),
            "{name}"
        );
        assert_eq!(s.confirmed.healthcheck_blackhole, 1, "{name}");
        invariants(&c);
    }
}

#[test]
fn blackhole_drop_then_suspect() {
    let mut c = corr();
    let r = only_report(&c.ingest(local_source(S, &hc(41000))));
    assert!(!has_line(&r.event.evidence, "tc ingress"));
    assert!(c.ingest(suspect(S + 10_000, &hc(41000))).is_empty());
    c.tick(10 * S);
    let s = c.stats();
    assert_eq!((s.suspects_confirmed, s.suspects_unconfirmed), (1, 0));
    assert_eq!(s.confirmed.healthcheck_blackhole, 1);
    // The late suspect's evidence is in the aggregate, seen on the next repeat.
    let r2 = only_report(&c.ingest(local_source(11 * S, &hc(41001))));
    assert_eq!(r2.event.count, 2);
    invariants(&c);
}

/// Drops no rule claims confirm nothing: each event yields no output, and after the windows
/// close the suspects and drops are counted unconfirmed and unmatched.
#[test]
fn drops_no_rule_claims_confirm_nothing() {
    let hc = hc(41000);
    let cases: [(&str, Vec<KernelEvent>, (u64, u64)); 4] = [
        (
            "a VIP-source suspect, then NOT_SPECIFIED away from the route input or without a \
             site, and NETFILTER_DROP",
            vec![
                suspect(S, &hc),
                drop_ev(
                    S + 1,
                    &hc,
                    "NOT_SPECIFIED",
                    1,
                    Some("sk_stream_kill_queues+0x50"),
                ),
                drop_ev(S + 2, &hc, "NOT_SPECIFIED", 1, None),
                drop_ev(S + 3, &hc, "NETFILTER_DROP", 7, None),
            ],
            (1, 3),
        ),
        (
            "no drop reasons: a VIP-source suspect, then UNREPORTED at sites of no rule",
            vec![
                suspect(S, &hc),
                unreported(S + 1, &hc, "sk_stream_kill_queues+0x50"),
                unreported(S + 2, &hc, "nf_hook_slow+0xa5"),
                unreported(S + 3, &hc, "tcp_v4_rcv+0x9f"),
            ],
            (1, 3),
        ),
        (
            "NO_SOCKET for a served VIP port, NETFILTER_DROP for an unserved one",
            vec![
                drop_ev(S, &to_vip(80, Proto::Tcp), "NO_SOCKET", 3, None),
                drop_ev(S, &to_vip(443, Proto::Tcp), "NETFILTER_DROP", 7, None),
            ],
            (0, 2),
        ),
        (
            "no drop reasons: UNREPORTED at tcp_v4_rcv for a served VIP port",
            vec![unreported(
                S + 1,
                &to_vip(80, Proto::Tcp),
                "tcp_v4_rcv+0x9f",
            )],
            (0, 1),
        ),
    ];
    for (name, events, counts) in cases {
        let mut c = corr();
        for ev in events {
            assert!(c.ingest(ev).is_empty(), "{name}");
        }
        assert!(c.tick(10 * S).is_empty(), "{name}");
        let s = c.stats();
        assert_eq!(s.confirmed, KindCounts::default(), "{name}");
        assert_eq!(
            (s.suspects_unconfirmed, s.drops_unmatched),
            counts,
            "{name}"
        );
        invariants(&c);
    }
}

#[test]
fn blackhole_suspect_alone_is_only_counted() {
    let mut c = corr();
    assert!(c.ingest(suspect(S, &hc(41000))).is_empty());
    assert!(c.tick(S + 2 * S - 1).is_empty());
    assert_eq!(c.stats().pending_suspects, 1);
    assert!(c.tick(S + 2 * S + 1).is_empty());
    let s = c.stats();
    assert_eq!(
        (s.suspects_seen.vip, s.suspects_unconfirmed, s.pending),
        (1, 1, 0)
    );
    invariants(&c);
}

#[test]
fn blackhole_drop_without_iface_waits_for_suspect() {
    let mut c = corr();
    let p = hc(41000);
    let mut d = local_source(S, &p);
    if let KernelEvent::Drop { iface, .. } = &mut d {
        *iface = None;
    }
    assert!(c.ingest(d.clone()).is_empty());
    let r = only_report(&c.ingest(suspect(S + 1000, &p)));
    assert_eq!(r.event.nic.as_deref(), Some("eth0"));
    invariants(&c);
    // Without a suspect it stays unconfirmed.
    let mut c = corr();
    assert!(c.ingest(d).is_empty());
    assert!(c.tick(10 * S).is_empty());
    assert_eq!(c.stats().drops_unmatched, 1);
    invariants(&c);
}

#[test]
fn blackhole_suspect_outside_pair_window_does_not_pair() {
    let mut c = corr();
    assert!(c.ingest(suspect(S, &hc(41000))).is_empty());
    let r = only_report(&c.ingest(local_source(S + 3 * S, &hc(41000))));
    assert!(!has_line(&r.event.evidence, "tc ingress"));
}

// ----- aggregation and the JSON throttle --------------------------------------------------------

#[test]
fn repeats_aggregate_and_json_is_throttled() {
    let mut c = corr();
    let mut got = Vec::new();
    for (i, t) in [0, S, 2 * S, 10 * S, 11 * S, 21 * S].iter().enumerate() {
        let r = only_report(&c.ingest(local_source(S + t, &hc(41000 + i as u16))));
        got.push((r.event.count, r.is_new, r.write_json));
        assert_eq!(r.event.src_port, 41000 + i as u16);
        assert_eq!(r.event.first_seen_ns, S);
        assert_eq!(r.event.last_seen_ns, S + t);
    }
    assert_eq!(
        got,
        vec![
            (1, true, true),
            (2, false, false),
            (3, false, false),
            (4, false, true), // 10 s after the first line
            (5, false, false),
            (6, false, true),
        ]
    );
    assert_eq!(c.stats().confirmed.healthcheck_blackhole, 6);
    assert_eq!(c.stats().aggregates, 1);
}

#[test]
fn different_nodeports_are_different_aggregates() {
    let mut c = corr();
    let a = only_report(&c.ingest(local_source(S, &hc(41000))));
    let mut p = hc(41001);
    p.dport = 30081;
    let b = only_report(&c.ingest(local_source(S + 1, &p)));
    assert!(a.is_new && b.is_new);
    assert_ne!(a.event.key, b.event.key);
    assert_eq!(b.event.service.as_deref(), Some("shop/cart"));
}

#[test]
fn aggregates_expire_and_are_bounded() {
    let cfg = CorrelatorConfig {
        max_aggregates: 2,
        aggregate_ttl_ns: 60 * S,
        ..Default::default()
    };
    let mut c = corr_configured(cfg);
    for port in [30001, 30002, 30003] {
        let mut p = hc(41000);
        p.dport = port;
        assert!(only_report(&c.ingest(local_source(S + u64::from(port), &p))).is_new);
    }
    assert_eq!(c.stats().aggregates, 2);
    assert_eq!(c.stats().aggregates_evicted, 1);
    c.tick(200 * S);
    assert_eq!(c.stats().aggregates, 0);
    let r = only_report(&c.ingest(local_source(201 * S, &hc(41000))));
    assert!(r.is_new && r.event.count == 1);
}

#[test]
fn event_json_contract() {
    let mut c = corr();
    let r = only_report(&c.ingest(local_source(S, &hc(41000))));
    let v = serde_json::to_value(&r.event).unwrap();
    for k in [
        "kind",
        "src",
        "src_port",
        "dst",
        "dst_port",
        "vip",
        "vip_port",
        "proto",
        "drop_reason",
        "snat",
        "outcome",
        "count",
        "evidence",
        "remedy",
        "first_seen_ns",
        "last_seen_ns",
        "nic",
        "service",
        "layer",
    ] {
        assert!(v.get(k).is_some(), "missing key {k} in {v}");
    }
    assert_eq!(v["kind"], "healthcheck_blackhole");
    assert_eq!(v["snat"], "unknown");
    assert_eq!(v["outcome"], "dropped");
    assert_eq!(v["proto"], "tcp");
    assert_eq!(v["vip_port"], serde_json::Value::Null);
    assert_eq!(v["layer"], serde_json::Value::Null);
    assert_eq!(v["src"], LB_VIP);
    let back: LoopbackEvent = serde_json::from_value(v).unwrap();
    assert_eq!(back, r.event);
}

// ----- hairpin ---------------------------------------------------------------------------------

/// Drives a hairpin suspect through the egress and SNAT look-ups.
/// [`hairpin_to_settling`] after the pod's own call to the LB IP on port 80 from the same
/// port, a millisecond before the hairpin.
pub(super) fn hairpin_to_settling_after_a_call_to_80(c: &mut Correlator, ts: u64, p: &Packet) {
    hairpin_to_settling(c, ts, p, vec![egress(p.sport, EXT_VIP, 80, ts - MS)]);
}

pub(super) fn hairpin_to_settling(
    c: &mut Correlator,
    ts: u64,
    p: &Packet,
    records: Vec<EgressRecord>,
) {
    let q = only_query(&c.ingest(suspect(ts, p)));
    let Query::Egress { id, src, .. } = q else {
        panic!("expected an egress query, got {q:?}");
    };
    assert_eq!(src, p.src);
    let q = only_query(&c.answer(Answer::Egress { id, records }));
    let Query::Conntrack { id, tuple } = q else {
        panic!("expected a conntrack query, got {q:?}");
    };
    assert_eq!(tuple.src, p.src);
    let entry = ct(tuple, false, Some("SYN_SENT"));
    assert!(
        c.answer(Answer::Conntrack {
            id,
            entry: Some(entry)
        })
        .is_empty()
    );
}

/// Drives a hairpin suspect whose egress look-up finds `records` none of which explains it:
/// nothing is reported, and the candidate is counted as having no egress.
pub(super) fn hairpin_without_egress(
    c: &mut Correlator,
    ts: u64,
    p: &Packet,
    records: Vec<EgressRecord>,
) {
    let before = c.stats().hairpin_no_egress;
    let q = only_query(&c.ingest(suspect(ts, p)));
    assert!(
        c.answer(Answer::Egress {
            id: q.id(),
            records
        })
        .is_empty()
    );
    assert_eq!(c.stats().hairpin_no_egress, before + 1);
}

#[test]
fn hairpin_l4_dropped_by_rpfilter_local_policy() {
    let mut c = corr();
    let p = hp(40001, 30081);
    let t0 = 5 * S;
    hairpin_to_settling(
        &mut c,
        t0,
        &p,
        vec![egress(40001, EXT_VIP, 80, t0 - 2 * MS)],
    );
    let r = only_report(&c.ingest(drop_ev(t0 + 50_000, &p, "IP_RPFILTER", 16, None)));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::Hairpin);
    assert_eq!(e.layer, Some(Layer::L4));
    assert_eq!((e.src, e.src_port), (ip(POD), 40001));
    assert_eq!((e.dst, e.dst_port), (ip(NODE), 30081));
    assert_eq!((e.vip, e.vip_port), (Some(ip(EXT_VIP)), Some(80)));
    assert_eq!(e.snat, SnatState::No);
    assert_eq!(e.outcome, Outcome::Dropped);
    assert_eq!(e.drop_reason.as_deref(), Some("IP_RPFILTER"));
    assert_eq!(e.service.as_deref(), Some("shop/cart"));
    assert!(has_line(&e.evidence, "EGRESS_FLOWS"));
    assert!(has_line(&e.evidence, "conntrack (egress flow)"));
    assert!(has_line(&e.evidence, "externalTrafficPolicy: Local"));
    assert!(has_line(&e.remedy, "externalTrafficPolicy: Cluster"));
    assert!(has_line(&e.remedy, "anti-affinity"));
    assert!(has_line(&e.remedy, "layer 4"));
    assert!(has_line(&e.remedy, "rp_filter"));
    let s = c.stats();
    assert_eq!((s.suspects_confirmed, s.drops_confirming), (1, 1));
    assert_eq!(s.confirmed.hairpin, 1);
    invariants(&c);
}

/// A hairpin whose egress record explains the suspect is confirmed, dropped by rp_filter,
/// whatever the record's times, the drop's destination or the kernel's naming of the drop.
#[test]
fn a_hairpin_its_egress_explains_is_confirmed_dropped() {
    struct Case {
        name: &'static str,
        t0: u64,
        /// The egress record's first and latest opener.
        first_ns: u64,
        last_ns: Option<u64>,
        /// The endpoint the drop names (the NodePort DNAT already ran).
        dnat_to: Option<(&'static str, u16)>,
        /// A kernel without drop reasons: `UNREPORTED` at this site.
        unreported_at: Option<&'static str>,
        lines: &'static [&'static str],
    }
    let t0 = 5 * S;
    let cases = [
        Case {
            name: "the record refreshed by a SYN retransmit after the suspect (a late look-up)",
            t0,
            first_ns: t0 - 2 * MS,
            last_ns: Some(t0 + S),
            dnat_to: None,
            unreported_at: None,
            lines: &[],
        },
        Case {
            name: "a long-running flow: its first opener out of the window, its latest in it",
            t0: 60 * S,
            first_ns: S,
            last_ns: Some(60 * S - MS),
            dnat_to: None,
            unreported_at: None,
            lines: &[],
        },
        Case {
            name: "the drop after the NodePort DNAT: the flow's outcome, named by the NodePort",
            t0,
            first_ns: t0 - 2 * MS,
            last_ns: None,
            dnat_to: Some(("10.244.1.5", 8080)),
            unreported_at: None,
            lines: &[],
        },
        Case {
            name: "no drop reasons: UNREPORTED at the route input, a pod source",
            t0,
            first_ns: t0 - 2 * MS,
            last_ns: None,
            dnat_to: None,
            unreported_at: Some("ip_rcv_finish_core+0x2d5"),
            lines: &["IP_RPFILTER (inferred from the drop site"],
        },
    ];
    for case in cases {
        let name = case.name;
        let mut c = corr();
        let p = hp(40001, 30081);
        let mut record = egress(40001, EXT_VIP, 80, case.first_ns);
        record.last_ns = case.last_ns;
        hairpin_to_settling(&mut c, case.t0, &p, vec![record]);
        let mut dropped = p.clone();
        if let Some((dst, dport)) = case.dnat_to {
            dropped.dst = ip(dst);
            dropped.dport = dport;
        }
        let at = case.t0 + 50_000;
        let drop = match case.unreported_at {
            Some(site) => unreported(at, &dropped, site),
            None => drop_ev(at, &dropped, "IP_RPFILTER", 16, None),
        };
        let r = only_report(&c.ingest(drop));
        let e = &r.event;
        assert_eq!(e.kind, LoopbackKind::Hairpin, "{name}");
        assert_eq!(e.layer, Some(Layer::L4), "{name}");
        assert_eq!(e.outcome, Outcome::Dropped, "{name}");
        assert_eq!(e.drop_reason.as_deref(), Some("IP_RPFILTER"), "{name}");
        assert_eq!((e.vip, e.vip_port), (Some(ip(EXT_VIP)), Some(80)), "{name}");
        assert_eq!((e.dst, e.dst_port), (ip(NODE), 30081), "{name}");
        for line in case.lines {
            assert!(has_line(&e.evidence, line), "{name}: {line}");
        }
        invariants(&c);
    }
}

/// A suspect no egress record explains is no hairpin: counted as without egress, nothing
/// reported, nothing left pending.
#[test]
fn a_suspect_no_egress_record_explains_is_no_hairpin() {
    let late = {
        let mut r = egress(40001, EXT_VIP, 80, 5 * S + MS);
        r.last_ns = Some(5 * S + S);
        r
    };
    let cases = [
        ("no egress record at all", 5 * S, vec![]),
        (
            "a flow that started after the suspect, whatever its latest time",
            5 * S,
            vec![late],
        ),
        (
            "a flow whose only opener is older than the window (no latest time)",
            60 * S,
            vec![egress(40001, EXT_VIP, 80, S)],
        ),
    ];
    for (name, t0, records) in cases {
        let mut c = corr();
        hairpin_without_egress(&mut c, t0, &hp(40001, 30081), records);
        assert!(c.tick(t0 + 30 * S).is_empty(), "{name}");
        let s = c.stats();
        assert_eq!(
            (s.hairpin_no_egress, s.suspects_unconfirmed, s.pending),
            (1, 1, 0),
            "{name}"
        );
        invariants(&c);
    }
}

#[test]
fn hairpin_drop_before_suspect() {
    let mut c = corr();
    let p = hp(40001, 30081);
    let t0 = 5 * S;
    assert!(
        c.ingest(drop_ev(
            t0,
            &p,
            "IP_RPFILTER",
            16,
            Some("ip_rcv_finish_core+0x1")
        ))
        .is_empty()
    );
    assert_eq!(c.stats().pending_drops, 1);
    let q = only_query(&c.ingest(suspect(t0 + 1000, &p)));
    let Query::Egress { id, .. } = q else {
        panic!()
    };
    let q = only_query(&c.answer(Answer::Egress {
        id,
        records: vec![egress(40001, EXT_VIP, 80, t0 - MS)],
    }));
    let r = only_report(&c.answer(Answer::Conntrack {
        id: q.id(),
        entry: None,
    }));
    assert_eq!(r.event.outcome, Outcome::Dropped);
    assert!(has_line(&r.event.evidence, "no entry for the egress flow"));
    invariants(&c);
}

#[test]
fn hairpin_l7_reset_generic_remedy() {
    let mut c = corr();
    let p = hp(52000, 30080);
    let t0 = 5 * S;
    hairpin_to_settling(
        &mut c,
        t0,
        &p,
        vec![egress(41000, EXT_VIP, 443, t0 - 30 * MS)],
    );
    assert!(c.tick(t0 + S).is_empty());
    let q = only_query(&c.tick(t0 + 1_500 * MS));
    let Query::Conntrack { id, tuple } = q else {
        panic!()
    };
    assert_eq!(tuple, tuple_of(&p));
    let mut e = ct(tuple, false, Some("CLOSE"));
    e.dnat = true;
    e.seen_reply = true;
    let r = only_report(&c.answer(Answer::Conntrack { id, entry: Some(e) }));
    let e = &r.event;
    assert_eq!(e.layer, Some(Layer::L7));
    assert_eq!(e.outcome, Outcome::Reset);
    assert_eq!((e.vip, e.vip_port), (Some(ip(EXT_VIP)), Some(443)));
    assert_eq!(e.drop_reason, None);
    assert!(has_line(&e.evidence, "state CLOSE"));
    assert!(!has_line(&e.remedy, "externalTrafficPolicy"));
    assert!(has_line(&e.remedy, "DNS name"));
    assert!(has_line(&e.remedy, "Masquerade"));
    assert!(has_line(&e.remedy, "about 4 s"));
    invariants(&c);
}

#[test]
fn hairpin_no_reply_and_unanswered_outcome() {
    let mut c = corr();
    let p = hp(52000, 30080);
    hairpin_to_settling_after_a_call_to_80(&mut c, 5 * S, &p);
    let q = only_query(&c.tick(7 * S));
    let r = only_report(&c.answer(Answer::Conntrack {
        id: q.id(),
        entry: Some(ct(tuple_of(&p), false, Some("SYN_RECV"))),
    }));
    assert_eq!(r.event.outcome, Outcome::NoReply);

    // Unanswered: no_reply once the query expires.
    let p2 = hp(52001, 30080);
    hairpin_to_settling_after_a_call_to_80(&mut c, 20 * S, &p2);
    let _q = only_query(&c.tick(22 * S));
    assert!(c.tick(26 * S).is_empty());
    let r = only_report(&c.tick(28 * S));
    assert_eq!(r.event.outcome, Outcome::NoReply);
    assert_eq!(r.event.count, 2);
    assert!(has_line(&r.event.evidence, "not answered"));
    assert_eq!(c.stats().queries_expired, 1);
    invariants(&c);
}

#[test]
fn hairpin_drop_during_settle_wins() {
    let mut c = corr();
    let p = hp(40001, 30080);
    hairpin_to_settling_after_a_call_to_80(&mut c, 5 * S, &p);
    let r = only_report(&c.ingest(drop_ev(5 * S + S, &p, "IP_RPFILTER", 16, None)));
    assert_eq!(r.event.outcome, Outcome::Dropped);
    // Nothing further for that flow.
    assert!(c.tick(20 * S).is_empty());
    invariants(&c);
}

#[test]
fn l4_preferred_and_l7_takes_latest_non_local() {
    let mut c = corr();
    // A pod-to-pod packet teaches the correlator that POD_B is local.
    c.learn(&pkt(POD_B, 1, NODE, 2, Some(Tag::Pod), Some(Tag::Node)));
    let t0 = 50 * S;
    let f = |sport| Flow {
        seq: 0,
        ts: t0,
        nic: "eth0".into(),
        packet: hp(sport, 30080),
        n_suspects: 1,
        stage: Stage::AwaitEgress,
        drop: None,
        n_drops: 0,
        egress: None,
        evidence: vec![],
        snat_unknown: false,
        listener: None,
        deferred: None,
    };
    let recs = vec![
        egress(40001, EXT_VIP, 80, t0 - 5 * S),
        egress(40002, "203.0.113.81", 443, t0 - 2 * S),
        egress(40003, POD_B, 8080, t0 - S), // local pod: not an LB
        egress(40004, NODE, 30080, t0 - S / 2), // the node itself
        egress(40005, "203.0.113.82", 80, t0 + 1), // after the suspect
        egress(40006, "203.0.113.83", 80, t0 - 11 * S), // outside l7_window
    ];
    let m = c.match_egress(&f(40001), &recs).unwrap();
    assert_eq!((m.layer, m.record.sport), (Layer::L4, 40001));
    let m = c.match_egress(&f(50000), &recs).unwrap();
    assert_eq!((m.layer, m.record.dst), (Layer::L7, ip("203.0.113.81")));
    // Only local / out-of-window records: no match.
    assert!(c.match_egress(&f(50000), &recs[2..]).is_none());
    // A same-port record out of the window is not layer 4.
    let m = c.match_egress(&f(40006), &recs).unwrap();
    assert_eq!(m.layer, Layer::L7);
    // Protocol must match.
    let mut udp = egress(40001, EXT_VIP, 80, t0 - MS);
    udp.proto = Proto::Udp;
    assert!(c.match_egress(&f(40001), &[udp]).is_none());
}

#[test]
fn healthy_snated_egress_is_not_hairpin() {
    let mut c = corr();
    let p = hp(40001, 30080);
    let q = only_query(&c.ingest(suspect(5 * S, &p)));
    let q = only_query(&c.answer(Answer::Egress {
        id: q.id(),
        records: vec![egress(40001, EXT_VIP, 80, 5 * S - MS)],
    }));
    let Query::Conntrack { id, tuple } = q else {
        panic!()
    };
    assert!(
        c.answer(Answer::Conntrack {
            id,
            entry: Some(ct(tuple, true, Some("SYN_SENT")))
        })
        .is_empty()
    );
    assert!(
        c.ingest(drop_ev(5 * S + 1, &p, "IP_RPFILTER", 16, None))
            .is_empty()
    );
    assert!(c.tick(30 * S).is_empty());
    let s = c.stats();
    assert_eq!(s.confirmed, KindCounts::default());
    assert_eq!((s.hairpin_snat_seen, s.suspects_unconfirmed), (1, 1));
    invariants(&c);
}

#[test]
fn healthy_ordinary_pod_traffic_is_not_hairpin() {
    let mut c = corr();
    // The pod's only un-SNATed egress went to another pod / the node: not through an LB.
    c.learn(&pkt(POD_B, 1, NODE, 2, Some(Tag::Pod), Some(Tag::Node)));
    let q = only_query(&c.ingest(suspect(5 * S, &hp(50000, 30080))));
    assert!(
        c.answer(Answer::Egress {
            id: q.id(),
            records: vec![egress(41000, POD_B, 8080, 5 * S - MS)]
        })
        .is_empty()
    );
    // A pod packet dropped for an unrelated reason, with no suspect.
    let other = pkt(POD, 1234, NODE, 22, Some(Tag::Pod), Some(Tag::Node));
    assert!(
        c.ingest(drop_ev(6 * S, &other, "TCP_CSUM", 4, None))
            .is_empty()
    );
    assert!(c.tick(30 * S).is_empty());
    assert_eq!(c.stats().confirmed, KindCounts::default());
    assert_eq!(c.stats().drops_unmatched, 1);
    invariants(&c);
}

#[test]
fn healthy_outside_client_through_nodeport() {
    let mut c = corr();
    // An outside client's packets carry no local tag; if one is dropped it confirms nothing.
    let p = pkt(CLIENT, 50000, NODE, 30080, None, Some(Tag::Node));
    assert!(c.ingest(suspect(S, &p)).is_empty());
    assert!(
        c.ingest(drop_ev(S + 1, &p, "NO_SOCKET", 3, None))
            .is_empty()
    );
    assert!(
        c.ingest(drop_ev(S + 2, &p, "IP_LOCAL_SOURCE", 89, None))
            .is_empty()
    );
    // A node-sourced suspect is a hairpin candidate (the node-sourced loop): without an
    // egress record of the node's own it confirms nothing.
    let n = node_to_itself(1, 30080);
    let q = only_query(&c.ingest(suspect(S + 3, &n)));
    assert!(
        c.answer(Answer::Egress {
            id: q.id(),
            records: vec![]
        })
        .is_empty()
    );
    c.tick(30 * S);
    let s = c.stats();
    assert_eq!(s.confirmed, KindCounts::default());
    assert_eq!((s.suspects_seen.untagged, s.suspects_seen.node), (1, 1));
    assert_eq!(s.suspects_unconfirmed, 2);
    invariants(&c);
}

#[test]
fn egress_query_is_shared_and_may_be_answered_late() {
    let mut c = corr();
    let a = hp(50000, 30080);
    let b = hp(50001, 30080);
    let q = only_query(&c.ingest(suspect(5 * S, &a)));
    // Another suspect of the same pod and an unrelated event arrive before the answer.
    assert!(c.ingest(suspect(5 * S + MS, &b)).is_empty());
    assert!(c.ingest(suspect(5 * S + 2 * MS, &a)).is_empty()); // retransmit: folded in
    let records = vec![egress(41000, EXT_VIP, 443, 5 * S - 10 * MS)];
    let outs = c.answer(Answer::Egress {
        id: q.id(),
        records: records.clone(),
    });
    // `a` (its key carried) is decided; `b` joined, and its own flow was neither carried nor
    // in the answer: it is asked again with its key before falling back to layer 7.
    let qs = queries(&outs);
    assert_eq!(qs.len(), 2, "{qs:?}");
    let again = qs
        .iter()
        .find_map(|q| match q {
            Query::Egress { id, src, keys } => Some((*id, *src, keys.clone())),
            Query::Conntrack { .. }
            | Query::Listener { .. }
            | Query::SelfLoop { .. }
            | Query::Programmed { .. } => None,
        })
        .expect("b's egress asked again");
    let key_b = EgressFlowKey {
        sport: 50001,
        proto: Proto::Tcp,
    };
    assert_eq!((again.1, again.2), (ip(POD), vec![key_b]));
    let mut qs: Vec<Query> = qs
        .into_iter()
        .filter(|q| matches!(q, Query::Conntrack { .. }))
        .collect();
    qs.extend(queries(&c.answer(Answer::Egress {
        id: again.0,
        records,
    })));
    assert_eq!(qs.len(), 2);
    for q in qs {
        let Query::Conntrack { id, tuple } = q else {
            panic!()
        };
        c.answer(Answer::Conntrack {
            id,
            entry: Some(ct(tuple, false, None)),
        });
    }
    let outs = c.tick(7 * S);
    let qs = queries(&outs);
    assert_eq!(qs.len(), 2);
    let mut n = Vec::new();
    for q in qs {
        let r = only_report(&c.answer(Answer::Conntrack {
            id: q.id(),
            entry: None,
        }));
        n.push((r.event.count, r.is_new));
    }
    assert_eq!(n, vec![(1, true), (2, false)]);
    assert_eq!(c.stats().suspects_confirmed, 3);
    invariants(&c);
}

/// A query recorded before it carried flow keys still reads (as the index alone), and one
/// with keys round-trips.
#[test]
fn egress_query_without_keys_still_deserializes() {
    let old: Query = serde_json::from_str(r#"{"Egress":{"id":7,"src":"198.18.1.5"}}"#).unwrap();
    assert_eq!(
        old,
        Query::Egress {
            id: 7,
            src: ip(POD),
            keys: vec![]
        }
    );
    let new = Query::Egress {
        id: 8,
        src: ip(POD),
        keys: vec![EgressFlowKey {
            sport: 40001,
            proto: Proto::Udp,
        }],
    };
    let back: Query = serde_json::from_str(&serde_json::to_string(&new).unwrap()).unwrap();
    assert_eq!(back, new);
}

#[test]
fn unanswered_egress_query_expires_and_late_answer_is_stale() {
    let mut c = corr();
    let q = only_query(&c.ingest(suspect(5 * S, &hp(50000, 30080))));
    assert!(c.tick(9 * S).is_empty());
    assert_eq!(c.stats().pending, 1);
    assert!(c.tick(11 * S).is_empty());
    let s = c.stats().clone();
    assert_eq!(
        (s.queries_expired, s.pending, s.hairpin_no_egress),
        (1, 0, 1)
    );
    assert!(
        c.answer(Answer::Egress {
            id: q.id(),
            records: vec![egress(50000, EXT_VIP, 80, 5 * S - 1)]
        })
        .is_empty()
    );
    assert_eq!(c.stats().answers_stale, 1);
    assert!(c.queries.is_empty() && c.egress_inflight.is_empty() && c.flows.is_empty());
    invariants(&c);
}

// ----- vip_port_unserved -----------------------------------------------------------------------

fn to_vip(port: u16, proto: Proto) -> Packet {
    let mut p = pkt(POD, 45000, LB_VIP, port, Some(Tag::Pod), Some(Tag::Vip));
    p.proto = proto;
    p
}

#[test]
fn unserved_vip_port_refused() {
    let mut c = corr();
    let r = only_report(&c.ingest(drop_ev(S, &to_vip(443, Proto::Tcp), "NO_SOCKET", 3, None)));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::VipPortUnserved);
    assert_eq!((e.vip, e.vip_port), (Some(ip(LB_VIP)), Some(443)));
    assert_eq!(e.outcome, Outcome::Refused);
    assert_eq!(e.service.as_deref(), Some("default/web"));
    assert!(has_line(&e.evidence, "no entry for 192.0.2.10:443/tcp"));
    assert!(has_line(&e.evidence, "served on 80/tcp (default/web:http)"));
    assert!(has_line(&e.remedy, "add it to the Service's ports"));
    assert!(has_line(&e.remedy, "its own LB"));
    // Another client, same port: same aggregate.
    let mut p = to_vip(443, Proto::Tcp);
    p.src = ip(POD_B);
    let r = only_report(&c.ingest(drop_ev(2 * S, &p, "NO_SOCKET", 3, None)));
    assert_eq!((r.event.count, r.event.src), (2, ip(POD_B)));
    invariants(&c);
}

/// With the table from the API, a refused port the API's Service serves is asked of the
/// dataplane once: kube-proxy holding no rule for it is the disagreement, confirmed as
/// `vip_port_unserved` with kube-proxy (not the Service) as its remedy; a rule found, an
/// unreadable dataplane or no answer in time confirm nothing.
#[test]
fn a_port_the_api_serves_and_kube_proxy_did_not_program_is_the_disagreement() {
    let api_corr = || {
        let mut c = Correlator::new(CorrelatorConfig::default());
        c.set_services(ServiceTable {
            from_api: true,
            ..table()
        });
        c
    };
    let refused = |ts| drop_ev(ts, &to_vip(80, Proto::Tcp), "NO_SOCKET", 3, None);
    let missing = DataplaneRead {
        read: "kube-proxy iptables nat KUBE-SERVICES".into(),
        found: None,
    };

    // Not programmed: one question, then confirmed with the disagreement.
    let mut c = api_corr();
    let q = only_query(&c.ingest(refused(S)));
    assert!(matches!(
        q,
        Query::Programmed {
            port: 80,
            proto: Proto::Tcp,
            ..
        }
    ));
    // Retransmits while the question is out ask nothing more.
    assert!(c.ingest(refused(S + S / 2)).is_empty());
    let r = only_report(&c.answer(Answer::Programmed {
        id: q.id(),
        read: Ok(missing.clone()),
    }));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::VipPortUnserved);
    assert!(e.facts.kube_proxy_lags);
    assert!(has_line(
        &e.evidence,
        "the API and this node disagree: default/web:http serves 192.0.2.10:80/tcp"
    ));
    assert!(has_line(&e.evidence, "KUBE-SERVICES holds nothing for it"));
    assert!(!has_line(&e.evidence, "no entry for"));
    assert!(has_line(
        &e.remedy,
        "kube-proxy on this node has not programmed it"
    ));
    assert!(!has_line(&e.remedy, "add it to the Service's ports"));
    // A later refusal within the answer's life is confirmed from it, without a new question.
    let outs = c.ingest(refused(3 * S));
    assert!(queries(&outs).is_empty());
    assert_eq!(only_report(&outs).event.count, 2);
    // After it, asked again.
    assert!(matches!(
        only_query(&c.ingest(refused(3 * S + PROGRAMMED_TTL_NS))),
        Query::Programmed { .. }
    ));
    invariants(&c);

    // Programmed: nothing confirmed.
    let mut c = api_corr();
    let q = only_query(&c.ingest(refused(S)));
    let outs = c.answer(Answer::Programmed {
        id: q.id(),
        read: Ok(DataplaneRead {
            found: Some("192.0.2.10:80/tcp (default/web:http)".into()),
            ..missing.clone()
        }),
    });
    assert!(reports(&outs).is_empty());
    assert!(reports(&c.ingest(refused(2 * S))).is_empty());

    // Unreadable, or no answer in time: nothing confirmed, asked again on the next drop.
    let mut c = api_corr();
    let q = only_query(&c.ingest(refused(S)));
    assert!(
        reports(&c.answer(Answer::Programmed {
            id: q.id(),
            read: Err("EPERM".into())
        }))
        .is_empty()
    );
    assert!(matches!(
        only_query(&c.ingest(refused(2 * S))),
        Query::Programmed { .. }
    ));
    assert!(reports(&c.tick(60 * S)).is_empty());
    assert!(c.queries.is_empty());

    // The table read from the rules (not the API) is the verdict as before: served, silent.
    let mut c = corr();
    assert!(c.ingest(refused(S)).is_empty());
}

/// A NO_SOCKET drop of an unserved VIP port confirms `vip_port_unserved` (refused) for UDP,
/// without a service table, and on kernels without drop reasons (named from the site).
#[test]
fn an_unserved_vip_port_is_refused_however_the_drop_is_told() {
    struct Case {
        name: &'static str,
        proto: Proto,
        with_table: bool,
        /// `UNREPORTED` at this site (no drop reasons), else `NO_SOCKET`.
        unreported_at: Option<&'static str>,
        evidence: &'static [&'static str],
        remedy: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "UDP: an ICMP port unreachable",
            proto: Proto::Udp,
            with_table: true,
            unreported_at: None,
            evidence: &["ICMP port unreachable"],
            remedy: &["ICMP port unreachable"],
        },
        Case {
            name: "no service table: still confirmed, and said",
            proto: Proto::Tcp,
            with_table: false,
            unreported_at: None,
            evidence: &["no service table was available"],
            remedy: &[],
        },
        Case {
            name: "no drop reasons: UNREPORTED at tcp_v4_rcv",
            proto: Proto::Tcp,
            with_table: true,
            unreported_at: Some("tcp_v4_rcv+0x9f"),
            evidence: &["inferred from the drop site"],
            remedy: &[],
        },
        Case {
            name: "no drop reasons: UNREPORTED at __udp4_lib_rcv",
            proto: Proto::Udp,
            with_table: true,
            unreported_at: Some("__udp4_lib_rcv+0x5c1"),
            evidence: &["inferred from the drop site"],
            remedy: &[],
        },
    ];
    for case in cases {
        let name = case.name;
        let mut c = if case.with_table {
            corr()
        } else {
            Correlator::new(CorrelatorConfig::default())
        };
        let p = to_vip(443, case.proto);
        let drop = match case.unreported_at {
            Some(site) => unreported(S, &p, site),
            None => drop_ev(S, &p, "NO_SOCKET", 3, None),
        };
        let r = only_report(&c.ingest(drop));
        let e = &r.event;
        assert_eq!(e.kind, LoopbackKind::VipPortUnserved, "{name}");
        assert_eq!(e.outcome, Outcome::Refused, "{name}");
        assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"), "{name}");
        assert_eq!((e.vip, e.vip_port), (Some(ip(LB_VIP)), Some(443)), "{name}");
        if !case.with_table {
            assert_eq!(e.service, None, "{name}");
        }
        for line in case.evidence {
            assert!(has_line(&e.evidence, line), "{name}: {line}");
        }
        for line in case.remedy {
            assert!(has_line(&e.remedy, line), "{name}: {line}");
        }
        invariants(&c);
    }
}

// ----- bounded memory ---------------------------------------------------------------------------

#[test]
fn flood_of_spoofed_pod_suspects_stays_bounded() {
    let cfg = CorrelatorConfig {
        max_pending: 1024,
        ..Default::default()
    };
    let max = cfg.max_pending;
    let mut c = corr_configured(cfg);
    let mut queries_out = Vec::new();
    let n: u64 = 100_000;
    for i in 0..n {
        let src = IpAddr::from([198, 18 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        let p = Packet {
            src,
            ..hp((i % 60_000) as u16 + 1024, 30080)
        };
        let outs = c.ingest(suspect(S + i * 1_000, &p));
        queries_out.extend(queries(&outs));
        assert!(c.stats().pending as usize <= max);
        assert!(c.queries.len() <= max && c.egress_inflight.len() <= max);
    }
    let s = c.stats().clone();
    assert_eq!(s.suspects_seen.pod, n);
    assert_eq!(s.pending as usize, max);
    assert_eq!(s.pending_overflow, n - max as u64);
    assert_eq!(s.suspects_unconfirmed, n - max as u64);
    assert_eq!(queries_out.len(), max);
    invariants(&c);
    // The agent answers every query with nothing: all resolved, nothing reported.
    for q in queries_out {
        assert!(
            c.answer(Answer::Egress {
                id: q.id(),
                records: vec![]
            })
            .is_empty()
        );
    }
    c.tick(60 * S);
    let s = c.stats();
    assert_eq!((s.pending, s.suspects_unconfirmed), (0, n));
    assert_eq!(s.confirmed, KindCounts::default());
    invariants(&c);
}

#[test]
fn flood_of_vip_suspects_and_drops_stays_bounded() {
    let cfg = CorrelatorConfig {
        max_pending: 512,
        ..Default::default()
    };
    let mut c = corr_configured(cfg);
    for i in 0..100_000u64 {
        let p = hc((i % 60_000) as u16);
        let p = Packet {
            dport: 1 + (i / 60_000) as u16,
            ..p
        };
        // Spaced over 10 s so the windows also expire while flooding.
        c.ingest(suspect(S + i * 100_000, &p));
        let mut d = pkt(POD, i as u16, NODE, 9, Some(Tag::Pod), Some(Tag::Node));
        d.dport = (i >> 16) as u16;
        c.ingest(drop_ev(S + i * 100_000, &d, "TCP_CSUM", 4, None));
        assert!(c.stats().pending <= 512);
    }
    invariants(&c);
    c.tick(100 * S);
    let s = c.stats();
    assert_eq!(s.pending, 0);
    assert_eq!(s.suspects_unconfirmed, 100_000);
    assert_eq!(s.drops_unmatched, 100_000);
    invariants(&c);
}

/// `p` after kube-proxy's NodePort DNAT: to the endpoint 10.244.1.5:8080, a pod.
fn dnated_to_the_endpoint(p: Packet) -> Packet {
    Packet {
        dst: ip("10.244.1.5"),
        dport: 8080,
        dst_tag: Some(Tag::Pod),
        ..p
    }
}

/// As recorded in the lab on 6.18: the NodePort DNAT ran before the local-source drop, so the
/// drop names the endpoint (a pod) while the suspect names the NodePort.
#[test]
fn blackhole_drop_after_nodeport_dnat_pairs_with_its_suspect_by_source() {
    let mut c = corr();
    let seen = hc(35787);
    let dnated = dnated_to_the_endpoint(seen.clone());
    assert!(c.ingest(suspect(S, &seen)).is_empty());
    let r = only_report(&c.ingest(local_source(S + 50_000, &dnated)));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::HealthcheckBlackhole);
    assert_eq!(
        (e.dst, e.dst_port),
        (ip(NODE), 30080),
        "the NodePort, not the endpoint"
    );
    assert_mentions(
        &e.evidence,
        &["tc ingress on eth0", "already DNATed to 10.244.1.5:8080"],
    );
    assert_suspect_folded(&c);
}

#[test]
fn a_drop_from_another_source_port_is_not_paired() {
    let mut c = corr();
    assert!(c.ingest(suspect(S, &hc(35787))).is_empty());
    let other = dnated_to_the_endpoint(hc(35788));
    let r = only_report(&c.ingest(local_source(S + 50_000, &other)));
    // Confirmed from the drop alone, with the destination the kernel saw: a VIP-source packet
    // to a pod is no health check (another node forwarded a call to the LB IP).
    assert_eq!(r.event.dst_port, 8080);
    assert_eq!(r.event.kind, LoopbackKind::VipAsSource);
    assert_eq!(c.stats().pending_suspects, 1);
}

/// A SYN retransmit whose suspect the kernel deduplicated still lands in the NodePort's
/// aggregate, through the translation learned from the first pairing.
#[test]
fn a_retransmit_without_its_suspect_reuses_the_learned_dnat() {
    let mut c = corr();
    let seen = hc(35787);
    let dnated = dnated_to_the_endpoint(seen.clone());
    c.ingest(suspect(S, &seen));
    let first = only_report(&c.ingest(local_source(S + 50_000, &dnated)));
    // One second later the retransmit's drop arrives alone.
    let second = only_report(&c.ingest(local_source(2 * S, &dnated)));
    assert_eq!(first.event.key, second.event.key);
    assert_eq!(second.event.count, 2);
    assert_eq!(second.event.dst_port, 30080);
    assert!(
        !second.write_json,
        "a repeat within 10 s is not written again"
    );
}

// Kernels without drop reasons (< 5.17, e.g. Debian 5.10): every drop is `UNREPORTED` with
// its site, and the site names it.

fn unreported(ts: u64, p: &Packet, site: &str) -> KernelEvent {
    drop_ev(ts, p, DropReason::UNREPORTED, 0, Some(site))
}
