//! `service_self_loop` end to end through the correlator: each drop site, its conntrack and
//! node facts, the healthy twin (SNAT seen), retransmits, no answer.

use super::{
    self_loop::{call_of, is_answer},
    tests::{
        MS, S, assert_mentions, corr, has_line, invariants, ip, only_query, only_report, pkt,
        reports,
    },
    *,
};
use crate::state::BridgePort;

/// The endpoint of `default/web` in the shared test table (`tests::table`).
const EP: &str = "198.18.1.20";

fn self_pkt(sport: u16) -> Packet {
    pkt(EP, sport, EP, 8080, Some(Tag::Pod), Some(Tag::Pod))
}

fn self_drop(ts: u64, sport: u16, foreign: bool, name: &str, loc: &str) -> KernelEvent {
    KernelEvent::Drop {
        ts_ns: ts,
        iface: (!foreign).then(|| "veth1".to_string()),
        packet: self_pkt(sport),
        reason: DropReason {
            code: 89,
            name: name.into(),
        },
        location: Some(loc.into()),
        foreign_netns: foreign,
    }
}

fn in_pod(ts: u64, sport: u16) -> KernelEvent {
    self_drop(
        ts,
        sport,
        true,
        "IP_LOCAL_SOURCE",
        "ip_rcv_finish_core+0x25b",
    )
}

fn at_bridge(ts: u64, sport: u16) -> KernelEvent {
    self_drop(
        ts,
        sport,
        false,
        "NOT_SPECIFIED",
        "br_handle_frame_finish+0x380",
    )
}

/// The node's entry for a call to `LB_VIP:80` DNATed to the pod itself (`snat`: masqueraded).
fn entry(sport: u16, snat: bool) -> ConntrackEntry {
    let t = crate::test_events::tcp_tuple;
    ConntrackEntry {
        orig: t(EP, sport, super::tests::LB_VIP, 80),
        reply: t(EP, 8080, if snat { "198.18.1.1" } else { EP }, sport),
        snat,
        dnat: true,
        seen_reply: false,
        assured: false,
        tcp_state: Some("SYN_SENT".into()),
        timeout_s: None,
    }
}

fn facts(loop_back_entry: Option<bool>, hairpin_mode: Option<bool>) -> SelfLoopFacts {
    SelfLoopFacts {
        loop_back_entry,
        bridge_port: hairpin_mode.map(|hairpin_mode| BridgePort {
            bridge: "cbr0".into(),
            port: "veth1".into(),
            hairpin_mode,
        }),
        br_netfilter: Some(true),
    }
}

/// The look-up `q` answered with the conntrack entry of client port `sport` (not SNATed) and
/// `f`: its one confirmation.
fn confirmed_by(c: &mut Correlator, q: &Query, sport: u16, f: SelfLoopFacts) -> Confirmation {
    only_report(&answer(c, q, Ok(Some(entry(sport, false))), f))
}

fn answer(
    c: &mut Correlator,
    q: &Query,
    ct: Result<Option<ConntrackEntry>, crate::state::ReadFailed>,
    f: SelfLoopFacts,
) -> Vec<Output> {
    c.answer(Answer::SelfLoop {
        id: q.id(),
        conntrack: ct,
        facts: f,
    })
}

#[test]
fn dead_in_the_pod_without_snat_names_the_service_and_the_missing_loop_back_entry() {
    let mut c = corr();
    let q = only_query(&c.ingest(in_pod(S, 40000)));
    let Query::SelfLoop { tuple, iface, .. } = &q else {
        panic!("not a self-loop query: {q:?}");
    };
    assert_eq!((tuple.src, tuple.sport, tuple.dport), (ip(EP), 40000, 8080));
    assert_eq!(iface, &None, "a drop in the pod has no node interface");
    invariants(&c);
    let r = confirmed_by(&mut c, &q, 40000, facts(Some(false), None));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::ServiceSelfLoop);
    assert_eq!(
        e.key,
        "service_self_loop/pod/198.18.1.20->192.0.2.10:80->198.18.1.20:8080/tcp"
    );
    assert_eq!((e.src, e.dst, e.dst_port), (ip(EP), ip(EP), 8080));
    assert_eq!(
        (e.vip, e.vip_port),
        (Some(ip(super::tests::LB_VIP)), Some(80))
    );
    assert_eq!(e.service.as_deref(), Some("default/web"));
    assert_eq!((e.snat, e.outcome), (SnatState::No, Outcome::Dropped));
    assert_eq!(e.drop_reason.as_deref(), Some("IP_LOCAL_SOURCE"));
    assert_eq!(e.nic, None);
    assert_mentions(
        &e.evidence,
        &[
            "dropped in the pod's own network namespace",
            "no SRC_NAT",
            "ipset KUBE-LOOP-BACK lacks 198.18.1.20,tcp:8080,198.18.1.20",
            "missing: the hairpin SNAT; the KUBE-LOOP-BACK entry",
        ],
    );
    assert_mentions(&e.remedy, &["KUBE-LOOP-BACK ipset entry"]);
    assert!(!has_line(&e.remedy, "hairpin-mode"), "{:#?}", e.remedy);
    assert_eq!(c.stats().confirmed.service_self_loop, 1);
    invariants(&c);
    assert_eq!(
        serde_json::to_value(e).unwrap()["kind"],
        serde_json::json!("service_self_loop")
    );
}

#[test]
fn dead_at_the_bridge_port_names_its_hairpin_mode_and_the_service_from_the_endpoints() {
    let mut c = corr();
    let q = only_query(&c.ingest(at_bridge(S, 40001)));
    assert!(matches!(&q, Query::SelfLoop { iface: Some(i), .. } if i == "veth1"));
    // The bridge dropped it before conntrack confirmed the connection: no entry.
    let r = only_report(&answer(&mut c, &q, Ok(None), facts(None, Some(false))));
    let e = &r.event;
    assert_eq!(e.nic.as_deref(), Some("veth1"));
    assert_eq!(
        (e.vip, e.vip_port),
        (Some(ip(super::tests::LB_VIP)), Some(80))
    );
    assert_eq!(e.service.as_deref(), Some("default/web"));
    assert_mentions(
        &e.evidence,
        &[
            "before conntrack confirms",
            "is the endpoint of 192.0.2.10:80 (default/web:http)",
            "port veth1 of cbr0, hairpin_mode 0",
            "bridge-nf-call-iptables = 1",
            "missing: hairpin mode on cbr0 port veth1",
        ],
    );
    assert_mentions(&e.remedy, &["--hairpin-mode=hairpin-veth"]);
    assert!(!has_line(&e.remedy, "KUBE-LOOP-BACK ipset entry"));
    invariants(&c);
}

#[test]
fn healthy_twin_snat_in_conntrack_is_not_reported() {
    let mut c = corr();
    let q = only_query(&c.ingest(in_pod(S, 40002)));
    let outs = answer(
        &mut c,
        &q,
        Ok(Some(entry(40002, true))),
        facts(Some(true), None),
    );
    assert!(reports(&outs).is_empty(), "{outs:?}");
    assert_eq!(c.stats().self_loop_snat_seen, 1);
    assert_eq!(c.stats().confirmed.service_self_loop, 0);
    invariants(&c);
}

#[test]
fn retransmits_fold_into_their_connect_and_a_new_connect_counts() {
    let mut c = corr();
    let q = only_query(&c.ingest(in_pod(S, 40003)));
    // A retransmit while the look-up is out, and one after the confirmation.
    assert!(c.ingest(in_pod(2 * S, 40003)).is_empty());
    let r = confirmed_by(&mut c, &q, 40003, facts(None, None));
    assert_eq!(r.event.count, 1);
    assert!(c.ingest(in_pod(4 * S, 40003)).is_empty());
    assert_eq!(c.stats().self_loop_retransmits, 2);
    let q2 = only_query(&c.ingest(in_pod(5 * S, 40004)));
    let r2 = confirmed_by(&mut c, &q2, 40004, facts(None, None));
    assert_eq!(r2.event.count, 2);
    assert!(!r2.is_new);
    invariants(&c);
}

#[test]
fn a_pod_namespace_drop_for_another_reason_is_no_self_loop() {
    let mut c = corr();
    let outs = c.ingest(self_drop(S, 40005, true, "NO_SOCKET", "tcp_v4_rcv+0x10"));
    assert!(outs.is_empty(), "{outs:?}");
    assert_eq!(c.stats().drops_unmatched, 1);
    invariants(&c);
}

/// Debian 5.10 (no drop reasons): the pod's namespace drops its own packet at route input with
/// no reason and no interface of ours; the site and the self-addressed packet name it.
#[test]
fn a_kernel_without_drop_reasons_is_judged_by_the_drop_site() {
    let mut c = corr();
    let mut ev = self_drop(
        S,
        40007,
        true,
        DropReason::UNREPORTED,
        "ip_rcv_finish_core.constprop.0+0x20e",
    );
    if let KernelEvent::Drop { reason, .. } = &mut ev {
        reason.code = 0;
    }
    let q = only_query(&c.ingest(ev));
    let r = confirmed_by(&mut c, &q, 40007, facts(Some(false), None));
    assert_eq!(r.event.kind, LoopbackKind::ServiceSelfLoop);
    assert_eq!(r.event.drop_reason.as_deref(), Some("IP_LOCAL_SOURCE"));
    assert!(has_line(&r.event.evidence, "inferred"), "{:#?}", r.event);
    // The same kernel's unreported drop elsewhere in the pod is still no self-loop.
    let outs = c.ingest(self_drop(
        S + MS,
        40008,
        true,
        DropReason::UNREPORTED,
        "sk_stream_kill_queues+0x50",
    ));
    assert!(outs.is_empty(), "{outs:?}");
    invariants(&c);
}

/// A pod-namespace drop whose look-up never came back: no kernel evidence of the DNAT, so no
/// event (issue #36, E4); counted. A real loop's retransmit is looked up again.
#[test]
fn without_an_answer_a_pod_namespace_drop_confirms_nothing() {
    let mut c = corr();
    let _ = only_query(&c.ingest(in_pod(S, 40006)));
    let timeout = c.config().query_timeout_ns;
    assert!(reports(&c.tick(S + timeout + 10 * MS)).is_empty());
    assert_eq!(c.stats().drops_unmatched, 1);
    assert_eq!(c.stats().confirmed.service_self_loop, 0);
    let q = only_query(&c.ingest(in_pod(2 * S + timeout, 40006)));
    let r = confirmed_by(&mut c, &q, 40006, facts(None, None));
    assert_eq!(r.event.snat, SnatState::No);
    invariants(&c);
}

#[test]
fn a_failed_conntrack_look_up_confirms_only_at_a_bridge_port_with_its_evidence() {
    let mut c = corr();
    let q = only_query(&c.ingest(in_pod(S, 40007)));
    assert!(reports(&answer(&mut c, &q, Err("EPERM".into()), facts(None, None))).is_empty());
    assert_eq!(c.stats().drops_unmatched, 1);
    let q = only_query(&c.ingest(at_bridge(S, 40008)));
    let r = only_report(&answer(
        &mut c,
        &q,
        Err("EPERM".into()),
        facts(None, Some(false)),
    ));
    assert_eq!(r.event.snat, SnatState::Unknown);
    assert!(has_line(
        &r.event.evidence,
        "conntrack look-up failed (EPERM)"
    ));
    invariants(&c);
}

/// An IPVS-mode table without a readable ipset: the entry to look for is named.
#[test]
fn an_unreadable_ipset_names_the_loop_back_entry_to_look_for() {
    let mut c = corr();
    let q = only_query(&c.ingest(in_pod(S, 40009)));
    let r = confirmed_by(&mut c, &q, 40009, facts(None, None));
    assert!(
        has_line(
            &r.event.evidence,
            "IPVS mode: the ipset KUBE-LOOP-BACK entry"
        ),
        "{:#?}",
        r.event
    );
}

/// Issue #36, E4: a pod (CAP_NET_RAW) forges SYNs with its own address both ways and sends
/// them to its gateway, which routes them back in: they die in the pod as a local source, like
/// a loop, but the node's conntrack entry is pod -> pod with nothing rewritten. Not a
/// self-loop: counted, no event. Nor is a DNAT to an address that is no Service's, nor no
/// entry at all in the pod's namespace.
#[test]
fn a_forged_self_addressed_packet_without_a_service_dnat_confirms_nothing() {
    let mut c = corr();
    let forged = |sport| {
        let mut e = entry(sport, false);
        e.orig.dst = ip(EP);
        e.orig.dport = 8080;
        e.dnat = false;
        e
    };
    let not_a_service = |sport| {
        let mut e = entry(sport, false);
        e.orig.dst = ip("198.18.77.77");
        e
    };
    let answers: [Result<Option<ConntrackEntry>, crate::state::ReadFailed>; 4] = [
        Ok(Some(forged(40020))),
        Ok(Some(forged(40021))),
        Ok(Some(not_a_service(40022))),
        Ok(None),
    ];
    for (i, ct) in answers.into_iter().enumerate() {
        let q = only_query(&c.ingest(in_pod(S + i as u64 * MS, 40020 + i as u16)));
        let outs = answer(&mut c, &q, ct, facts(Some(false), None));
        assert!(reports(&outs).is_empty(), "{outs:?}");
    }
    assert_eq!(c.stats().confirmed.service_self_loop, 0);
    assert_eq!(c.stats().drops_unmatched, 4);
    invariants(&c);
}

/// At a bridge port with no conntrack entry, the bridge's own evidence is needed: hairpin mode
/// off, br_netfilter on, and the pod's port a Service endpoint.
#[test]
fn a_bridge_drop_without_an_entry_needs_the_bridges_own_evidence() {
    let mut c = corr();
    let mut no_br_netfilter = facts(None, Some(false));
    no_br_netfilter.br_netfilter = Some(false);
    for (sport, f) in [
        (40030, no_br_netfilter),
        (40031, facts(None, Some(true))),
        (40032, facts(None, None)),
    ] {
        let q = only_query(&c.ingest(at_bridge(S, sport)));
        let outs = answer(&mut c, &q, Ok(None), f);
        assert!(reports(&outs).is_empty(), "{outs:?}");
    }
    // Not an endpoint of any Service: port 9999.
    let mut ev = at_bridge(S, 40033);
    if let KernelEvent::Drop { packet, .. } = &mut ev {
        packet.dport = 9999;
    }
    let q = only_query(&c.ingest(ev));
    assert!(reports(&answer(&mut c, &q, Ok(None), facts(None, Some(false)))).is_empty());
    assert_eq!(c.stats().confirmed.service_self_loop, 0);
    invariants(&c);
}

/// IPVS mode with br_netfilter, seen on VM 6.12: the call (client port 40010 -> 8080) was
/// masqueraded by KUBE-LOOP-BACK; its SYN-ACK (8080 -> 40010), un-NATed back to the pod in
/// the bridge, dies at the pod's port. The event is the call's: endpoint port 8080, the
/// Service from conntrack, SNAT yes, the bridge port's hairpin mode missing.
fn answer_at_bridge(ts: u64, client_port: u16) -> KernelEvent {
    let KernelEvent::Drop {
        ts_ns,
        iface,
        reason,
        location,
        foreign_netns,
        ..
    } = at_bridge(ts, client_port)
    else {
        unreachable!()
    };
    KernelEvent::Drop {
        ts_ns,
        iface,
        packet: Packet {
            tcp_flags: probe_contract::record::tcp_flags::SYN
                | probe_contract::record::tcp_flags::ACK,
            ..pkt(EP, 8080, EP, client_port, Some(Tag::Pod), Some(Tag::Pod))
        },
        reason,
        location,
        foreign_netns,
    }
}

#[test]
fn an_answer_dropped_at_the_bridge_is_read_as_its_call_and_the_snat_does_not_dismiss_it() {
    let mut c = corr();
    let q = only_query(&c.ingest(answer_at_bridge(S, 40010)));
    let Query::SelfLoop {
        tuple,
        reply_dropped,
        ..
    } = &q
    else {
        panic!("not a self-loop query: {q:?}");
    };
    // The call's tuple, not the answer's: the endpoint port is the destination.
    assert_eq!((tuple.sport, tuple.dport), (40010, 8080));
    assert!(reply_dropped);
    let r = only_report(&answer(
        &mut c,
        &q,
        Ok(Some(entry(40010, true))),
        facts(Some(true), Some(false)),
    ));
    let e = &r.event;
    assert_eq!((e.src_port, e.dst_port), (40010, 8080), "{e:#?}");
    assert_eq!(
        (e.vip, e.vip_port),
        (Some(ip(super::tests::LB_VIP)), Some(80))
    );
    assert_eq!(e.service.as_deref(), Some("default/web"));
    assert_eq!(e.snat, SnatState::Yes);
    assert!(
        has_line(&e.evidence, "198.18.1.20:8080 -> 198.18.1.20:40010"),
        "the drop's own tuple: {e:#?}"
    );
    assert!(has_line(&e.evidence, "the call was masqueraded"), "{e:#?}");
    assert!(has_line(
        &e.evidence,
        "ipset KUBE-LOOP-BACK holds 198.18.1.20,tcp:8080,198.18.1.20"
    ));
    assert!(has_line(
        &e.evidence,
        "missing: hairpin mode on cbr0 port veth1"
    ));
    assert!(has_line(&e.remedy, "--hairpin-mode=hairpin-veth"));
    assert_eq!(c.stats().self_loop_snat_seen, 0);
    // The SYN-ACK's retransmit folds into the same call.
    assert!(c.ingest(answer_at_bridge(2 * S, 40010)).is_empty());
    assert_eq!(c.stats().self_loop_retransmits, 1);
    invariants(&c);
}

#[test]
fn only_an_ack_bearing_tcp_segment_is_read_as_the_answer() {
    let syn = self_pkt(40011);
    assert!(!is_answer(&syn));
    assert_eq!(call_of(&syn), syn);
    let syn_ack = Packet {
        tcp_flags: probe_contract::record::tcp_flags::SYN | probe_contract::record::tcp_flags::ACK,
        ..pkt(EP, 8080, EP, 40011, Some(Tag::Pod), Some(Tag::Pod))
    };
    assert!(is_answer(&syn_ack));
    assert_eq!(
        call_of(&syn_ack),
        Packet {
            tcp_flags: syn_ack.tcp_flags,
            ..syn.clone()
        }
    );
    // UDP carries no direction: read as the call.
    let udp = Packet {
        proto: Proto::Udp,
        tcp_flags: 0,
        ..syn_ack.clone()
    };
    assert_eq!(call_of(&udp), udp);
}
