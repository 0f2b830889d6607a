//! Hairpin variants and the rules against false pairing (issue 10, items 4, 5 and 8's
//! conntrack errors). Tables where several inputs share one expectation.

use super::{
    tests::{
        CLIENT, EXT_VIP, LB_VIP, MS, NODE, POD, POD_B, S, corr, ct, drop_ev, egress,
        hairpin_to_settling, hairpin_to_settling_after_a_call_to_80, hairpin_without_egress,
        has_line, hp, invariants, ip, local_source, node_to_itself, only_query, only_report, pkt,
        queries, suspect,
    },
    *,
};
use crate::state::NodePortEntry;

/// Where a looping packet went decides whether it can be an LB's backend at all. A node
/// address on a port that is no NodePort is a host-listener candidate (its listener is asked
/// for; only an exact layer-4 match confirms it: `host_tests.rs`).
#[test]
fn suspect_destination_must_be_an_lb_backend() {
    // (what, destination, port, its tag, service table known, a candidate?)
    type Row = (&'static str, &'static str, u16, Option<Tag>, bool, bool);
    let rows: [Row; 8] = [
        (
            "node address, NodePort",
            NODE,
            30080,
            Some(Tag::Node),
            true,
            true,
        ),
        (
            "local pod (LB to pod)",
            POD_B,
            8080,
            Some(Tag::Pod),
            true,
            true,
        ),
        (
            "node address, not a NodePort: a host listener",
            NODE,
            22,
            Some(Tag::Node),
            true,
            true,
        ),
        (
            "node address, a Local NodePort",
            NODE,
            30081,
            Some(Tag::Node),
            true,
            true,
        ),
        ("a bound VIP", LB_VIP, 80, Some(Tag::Vip), true, false),
        ("not local at all", CLIENT, 80, None, true, false),
        (
            "node address, table unknown",
            NODE,
            22,
            Some(Tag::Node),
            false,
            true,
        ),
        ("not local, table unknown", CLIENT, 80, None, false, false),
    ];
    for (what, dst, dport, tag, known, candidate) in rows {
        let mut c = corr();
        if !known {
            c.set_services(ServiceTable::default());
        }
        let p = pkt(POD, 41000, dst, dport, Some(Tag::Pod), tag);
        let outs = c.ingest(suspect(S, &p));
        let host_listener = known && tag == Some(Tag::Node) && dport == 22;
        let asked = queries(&outs);
        assert_eq!(
            asked.iter().any(|q| matches!(q, Query::Egress { .. })),
            candidate,
            "{what}: {outs:?}"
        );
        assert_eq!(
            asked.iter().any(|q| matches!(q, Query::Listener { .. })),
            host_listener,
            "{what}: {outs:?}"
        );
        assert_eq!(
            c.stats().hairpin_not_a_backend,
            u64::from(!candidate),
            "{what}"
        );
        invariants(&c);
    }
}

/// An egress record whose destination is this node (or a pod on it) is no call to an LB, in
/// either layer: each of these finds no egress.
#[test]
fn egress_to_a_local_destination_never_pairs() {
    let t0 = 5 * S;
    // (what, record destination) with the suspect's own source port (layer 4 would match).
    let rows = [
        ("the suspect's own destination", NODE),
        ("a pod seen tagged pod", POD_B),
        ("the pod itself", POD),
    ];
    for (what, dst) in rows {
        let mut c = corr();
        // A pod-to-pod packet teaches the correlator that POD_B is local.
        c.learn(&pkt(POD_B, 1, NODE, 2, Some(Tag::Pod), Some(Tag::Node)));
        let p = hp(40001, 30080);
        hairpin_without_egress(&mut c, t0, &p, vec![egress(40001, dst, 80, t0 - MS)]);
        assert_eq!(c.stats().confirmed.hairpin, 0, "{what}");
        invariants(&c);
    }
}

/// A connection conntrack shows answered is no failure: the layer-4 egress flow with a reply
/// (the LB answered it), or the looping flow established.
#[test]
fn answered_connections_are_no_failure() {
    let t0 = 5 * S;
    // Egress flow entries: (what, seen_reply, state) -> dismissed.
    let egress_rows = [
        ("egress SEEN_REPLY", true, "SYN_SENT"),
        ("egress ESTABLISHED", true, "ESTABLISHED"),
        ("egress TIME_WAIT", false, "TIME_WAIT"),
    ];
    for (what, seen_reply, state) in egress_rows {
        let mut c = corr();
        let p = hp(40001, 30080);
        let q = only_query(&c.ingest(suspect(t0, &p)));
        let q = only_query(&c.answer(Answer::Egress {
            id: q.id(),
            records: vec![egress(40001, EXT_VIP, 80, t0 - MS)],
        }));
        let Query::Conntrack { id, tuple } = q else {
            panic!("{what}: {q:?}");
        };
        let mut entry = ct(tuple, false, Some(state));
        entry.seen_reply = seen_reply;
        let entry = Some(entry);
        assert!(
            c.answer(Answer::Conntrack { id, entry }).is_empty(),
            "{what}"
        );
        assert!(c.tick(t0 + 10 * S).is_empty(), "{what}");
        assert_eq!(c.stats().hairpin_answered, 1, "{what}");
        assert_eq!(c.stats().confirmed.hairpin, 0, "{what}");
        invariants(&c);
    }
    // Looping flow entries: (what, state, outcome or None = dismissed).
    let outcome_rows = [
        ("established", Some("ESTABLISHED"), None),
        ("closed normally", Some("TIME_WAIT"), None),
        ("reset by the caller", Some("CLOSE"), Some(Outcome::Reset)),
        ("half-open", Some("SYN_RECV"), Some(Outcome::NoReply)),
        ("UDP (no TCP state)", None, Some(Outcome::NoReply)),
    ];
    for (what, state, want) in outcome_rows {
        let mut c = corr();
        let p = hp(40001, 30080);
        hairpin_to_settling_after_a_call_to_80(&mut c, t0, &p);
        let q = only_query(&c.tick(t0 + 2 * S));
        let outs = c.answer(Answer::Conntrack {
            id: q.id(),
            entry: Some(ct(tuple_of(&p), false, state)),
        });
        match want {
            Some(o) => assert_eq!(only_report(&outs).event.outcome, o, "{what}"),
            None => {
                assert!(outs.is_empty(), "{what}: {outs:?}");
                assert_eq!(c.stats().hairpin_answered, 1, "{what}");
            }
        }
        invariants(&c);
    }
}

/// One failed connect, a SYN and its retransmits, is confirmed once: the retransmit's suspect
/// and its drop (already DNATed) fold in. Another source port, or the same one long after, is
/// another attempt.
#[test]
fn one_failed_connect_counts_once() {
    let mut c = corr();
    let t0 = 5 * S;
    let p = hp(40001, 30080);
    hairpin_to_settling_after_a_call_to_80(&mut c, t0, &p);
    let r = only_report(&c.ingest(drop_ev(t0 + MS, &p, "IP_RPFILTER", 16, None)));
    assert_eq!(r.event.count, 1);
    // Retransmits at +1 s and +3 s: a suspect each, and drops carrying the endpoint.
    let dnated = pkt(POD, 40001, POD_B, 8080, Some(Tag::Pod), Some(Tag::Pod));
    for at in [t0 + S, t0 + 3 * S] {
        assert!(c.ingest(suspect(at, &p)).is_empty());
        assert!(
            c.ingest(drop_ev(at + MS, &dnated, "IP_RPFILTER", 16, None))
                .is_empty()
        );
    }
    let s = c.stats();
    assert_eq!(s.confirmed.hairpin, 1);
    assert_eq!(s.hairpin_retries_folded, 4);
    assert_eq!((s.suspects_confirmed, s.drops_confirming), (3, 3));
    // Another attempt: a new source port, and the old port after the retry gap.
    for (sport, at) in [
        (40002, t0 + 10 * S),
        (40001, t0 + 3 * S + hairpin::RETRY_GAP_NS + S),
    ] {
        let p = hp(sport, 30080);
        hairpin_to_settling_after_a_call_to_80(&mut c, at, &p);
        let r = only_report(&c.ingest(drop_ev(at + MS, &p, "IP_RPFILTER", 16, None)));
        assert!(r.event.count >= 2, "{sport}");
    }
    assert_eq!(c.stats().confirmed.hairpin, 3);
    invariants(&c);
}

/// The node-sourced loop: the node's own address called the LB, the LB sent it back, the
/// kernel dropped it as a local source. Kind `hairpin`, said node-sourced, its own remedy.
#[test]
fn node_sourced_loop_is_a_hairpin_with_its_own_remedy() {
    let mut c = corr();
    let t0 = 5 * S;
    let p = node_to_itself(40100, 30080);
    let record = EgressRecord {
        src: ip(NODE),
        ..egress(40100, EXT_VIP, 8081, t0 - MS)
    };
    hairpin_to_settling(&mut c, t0, &p, vec![record]);
    let r = only_report(&c.ingest(local_source(t0 + MS, &p)));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::Hairpin);
    assert_eq!(
        (e.src, e.vip, e.vip_port),
        (ip(NODE), Some(ip(EXT_VIP)), Some(8081))
    );
    assert_eq!(e.outcome, Outcome::Dropped);
    assert_eq!(e.drop_reason.as_deref(), Some("IP_LOCAL_SOURCE"));
    assert!(has_line(&e.evidence, "node-sourced"), "{e:#?}");
    assert!(has_line(&e.evidence, "the node's own address"), "{e:#?}");
    assert!(has_line(&e.remedy, "does not avoid"), "{e:#?}");
    assert!(
        !has_line(&e.remedy, "Masquerade (SNAT) pod traffic"),
        "{e:#?}"
    );
    invariants(&c);
}

/// The LB sends straight to a pod on this node (no NodePort), TCP and UDP alike: a hairpin
/// whose destination is the pod.
#[test]
fn lb_to_pod_and_udp_hairpins() {
    // (what, protocol, looping destination, its port, tag, VIP port)
    let rows = [
        ("LB to pod, TCP", Proto::Tcp, POD_B, 8080, Tag::Pod, 8082),
        ("LB to pod, UDP", Proto::Udp, POD_B, 5353, Tag::Pod, 53),
        ("UDP NodePort", Proto::Udp, NODE, 30053, Tag::Node, 53),
    ];
    for (what, proto, dst, dport, tag, vip_port) in rows {
        let mut c = corr();
        let mut table = super::tests::table();
        table.nodeports.push(NodePortEntry {
            port: 30053,
            proto: Proto::Udp,
            service: Some("default/dns:dns".into()),
            local_only: false,
        });
        c.set_services(table);
        let t0 = 5 * S;
        let p = Packet {
            proto,
            ..pkt(POD, 40200, dst, dport, Some(Tag::Pod), Some(tag))
        };
        let record = EgressRecord {
            proto,
            ..egress(40200, EXT_VIP, vip_port, t0 - MS)
        };
        hairpin_to_settling(&mut c, t0, &p, vec![record]);
        let q = only_query(&c.tick(t0 + 2 * S));
        let r = only_report(&c.answer(Answer::Conntrack {
            id: q.id(),
            entry: None,
        }));
        let e = &r.event;
        assert_eq!(e.kind, LoopbackKind::Hairpin, "{what}");
        assert_eq!(
            (e.dst, e.dst_port, e.proto),
            (ip(dst), dport, proto),
            "{what}"
        );
        assert_eq!(
            (e.vip, e.vip_port),
            (Some(ip(EXT_VIP)), Some(vip_port)),
            "{what}"
        );
        assert_eq!(e.outcome, Outcome::NoReply, "{what}");
        let to_pod = tag == Tag::Pod;
        assert_eq!(
            has_line(&e.evidence, "straight to the local pod"),
            to_pod,
            "{what}"
        );
        assert_eq!(
            has_line(&e.remedy, "targets pods directly"),
            to_pod,
            "{what}"
        );
        invariants(&c);
    }
}

/// A failed conntrack look-up is not "no entry": SNAT is reported unknown and the failure is
/// said and counted; the outcome look-up failing leaves the outcome no_reply, said as such.
#[test]
fn conntrack_failure_is_unknown_not_no_entry() {
    let mut c = corr();
    let t0 = 5 * S;
    let p = hp(40001, 30080);
    let q = only_query(&c.ingest(suspect(t0, &p)));
    let q = only_query(&c.answer(Answer::Egress {
        id: q.id(),
        records: vec![egress(40001, EXT_VIP, 80, t0 - MS)],
    }));
    assert!(
        c.answer(Answer::ConntrackFailed {
            id: q.id(),
            error: "netlink: Operation not permitted".into(),
        })
        .is_empty()
    );
    let q = only_query(&c.tick(t0 + 2 * S));
    let r = only_report(&c.answer(Answer::ConntrackFailed {
        id: q.id(),
        error: "netlink: Operation not permitted".into(),
    }));
    let e = &r.event;
    assert_eq!(e.snat, SnatState::Unknown);
    assert_eq!(e.outcome, Outcome::NoReply);
    assert!(has_line(&e.evidence, "egress flow failed"), "{e:#?}");
    assert!(has_line(&e.evidence, "cannot be confirmed"), "{e:#?}");
    assert!(!has_line(&e.evidence, "no entry"), "{e:#?}");
    assert_eq!(c.stats().conntrack_failures, 2);
    invariants(&c);
}

/// In IPVS mode Local shows as ipset membership: the evidence names the set and why it means
/// no masquerade, and the remedy says Local is the cause.
#[test]
fn ipvs_local_nodeport_names_its_ipset() {
    let mut c = corr();
    let t0 = 5 * S;
    let p = hp(40001, 30081);
    hairpin_to_settling_after_a_call_to_80(&mut c, t0, &p);
    let r = only_report(&c.ingest(drop_ev(t0 + MS, &p, "IP_RPFILTER", 16, None)));
    let e = &r.event;
    assert!(
        has_line(&e.evidence, "ipset KUBE-NODE-PORT-LOCAL-TCP"),
        "{e:#?}"
    );
    assert!(
        has_line(&e.remedy, "uses externalTrafficPolicy: Local"),
        "{e:#?}"
    );
}

/// The kernel's egress maps as the agent answers from them (`EgressTable::by_source_and_keys`):
/// a source's latest 16 records (its index) plus the exact record of each key the query
/// carries, once each.
struct EgressMaps(Vec<EgressRecord>);

impl EgressMaps {
    /// What the index alone names for `src`.
    fn index(&self, src: IpAddr) -> Vec<EgressRecord> {
        let mut of_src: Vec<EgressRecord> =
            self.0.iter().filter(|r| r.src == src).cloned().collect();
        of_src.sort_by_key(|r| r.ts_ns);
        let skip = of_src.len().saturating_sub(16);
        of_src.split_off(skip)
    }

    fn answer(&self, q: &Query) -> Answer {
        let Query::Egress { id, src, keys } = q else {
            panic!("expected an egress query, got {q:?}");
        };
        let mut records = self.index(*src);
        for k in keys {
            let exact = self
                .0
                .iter()
                .find(|r| r.src == *src && r.sport == k.sport && r.proto == k.proto);
            if let Some(r) = exact
                && !records.contains(r)
            {
                records.push(r.clone());
            }
        }
        Answer::Egress { id: *id, records }
    }
}

/// `POD`'s flow `sport` to `dst`, then 20 newer flows of `POD` (its index holds 16) to
/// another LB address: the layer-7 fallback would pick the newest of those.
fn busy_pod(flows: &[(u16, &str, u64)], t0: u64) -> EgressMaps {
    let mut records: Vec<EgressRecord> = flows
        .iter()
        .map(|(sport, dst, ts)| egress(*sport, dst, 80, *ts))
        .collect();
    records.extend((0..20).map(|i| {
        egress(
            41_000 + i,
            "203.0.113.99",
            443,
            t0 - 10 * MS + u64::from(i) * 100_000,
        )
    }));
    EgressMaps(records)
}

/// Answers every conntrack query "SYN_SENT, no SNAT" (the egress flow, unanswered): nothing
/// is reported yet. The egress tuples asked, in order.
fn answer_egress_conntrack(c: &mut Correlator, qs: Vec<Query>) -> Vec<Tuple> {
    let mut asked = Vec::new();
    for q in qs {
        let Query::Conntrack { id, tuple } = q else {
            panic!("expected a conntrack query, got {q:?}");
        };
        asked.push(tuple.clone());
        let entry = Some(ct(tuple, false, Some("SYN_SENT")));
        assert!(c.answer(Answer::Conntrack { id, entry }).is_empty());
    }
    asked
}

/// A busy pod's looped flow left the index's latest 16 records: the query carries the
/// suspect's own key, its exact record confirms layer 4 (the index alone would give layer 7
/// through the pod's newest flow to another address).
#[test]
fn layer4_record_beyond_the_index_is_found_by_its_key() {
    let mut c = corr();
    let t0 = 5 * S;
    let maps = busy_pod(&[(40001, EXT_VIP, t0 - 20 * MS)], t0);
    assert!(!maps.index(ip(POD)).iter().any(|r| r.sport == 40001));
    let p = hp(40001, 30080);
    let q = only_query(&c.ingest(suspect(t0, &p)));
    let Query::Egress { src, keys, .. } = &q else {
        panic!("{q:?}");
    };
    let key = EgressFlowKey {
        sport: 40001,
        proto: Proto::Tcp,
    };
    assert_eq!((*src, keys.as_slice()), (ip(POD), &[key][..]));
    let q = only_query(&c.answer(maps.answer(&q)));
    let asked = answer_egress_conntrack(&mut c, vec![q]);
    assert_eq!((asked[0].sport, asked[0].dst), (40001, ip(EXT_VIP)));
    let r = only_report(&c.ingest(drop_ev(t0 + MS, &p, "IP_RPFILTER", 16, None)));
    assert_eq!(r.event.layer, Some(Layer::L4));
    assert_eq!(
        (r.event.vip, r.event.vip_port),
        (Some(ip(EXT_VIP)), Some(80))
    );
    invariants(&c);
}

/// Flows of one pod share its query in flight. A joiner with another source port whose record
/// the answer lacks is asked again with its own key (and confirms layer 4 from it); a joiner
/// whose record the answer already holds (the index named it) is decided at once.
#[test]
fn joiner_with_another_source_port_gets_its_own_key_looked_up() {
    let mut c = corr();
    let t0 = 5 * S;
    let maps = busy_pod(
        &[
            (40001, EXT_VIP, t0 - 30 * MS),
            (40002, EXT_VIP, t0 - 29 * MS),
        ],
        t0,
    );
    let (a, b, newest) = (hp(40001, 30080), hp(40002, 30080), hp(41_019, 30080));
    let q1 = only_query(&c.ingest(suspect(t0, &a)));
    assert!(c.ingest(suspect(t0 + MS, &b)).is_empty());
    assert!(c.ingest(suspect(t0 + 2 * MS, &newest)).is_empty());
    let outs = c.answer(maps.answer(&q1));
    let (egress_qs, ct_qs): (Vec<Query>, Vec<Query>) = queries(&outs)
        .into_iter()
        .partition(|q| matches!(q, Query::Egress { .. }));
    // `a` (carried) and `newest` (in the index) are decided; `b` is asked again.
    let asked = answer_egress_conntrack(&mut c, ct_qs);
    let mut sports: Vec<u16> = asked.iter().map(|t| t.sport).collect();
    sports.sort_unstable();
    assert_eq!(sports, [40001, 41_019]);
    let [q2] = egress_qs.as_slice() else {
        panic!("{egress_qs:?}");
    };
    let Query::Egress { keys, .. } = q2 else {
        unreachable!()
    };
    let key_b = EgressFlowKey {
        sport: 40002,
        proto: Proto::Tcp,
    };
    assert_eq!(keys, &[key_b]);
    let q = only_query(&c.answer(maps.answer(q2)));
    let asked = answer_egress_conntrack(&mut c, vec![q]);
    assert_eq!((asked[0].sport, asked[0].dst), (40002, ip(EXT_VIP)));
    for p in [&a, &b] {
        let r = only_report(&c.ingest(drop_ev(t0 + 3 * MS, p, "IP_RPFILTER", 16, None)));
        assert_eq!(r.event.layer, Some(Layer::L4), "{}", p.sport);
        assert_eq!(r.event.vip, Some(ip(EXT_VIP)), "{}", p.sport);
    }
    assert_eq!(c.stats().hairpin_no_egress, 0);
    invariants(&c);
}
