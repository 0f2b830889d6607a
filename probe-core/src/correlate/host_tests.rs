//! Field shapes of issue 23: hairpins to a host-network listener (no NodePort, no pod), and
//! local addresses named by their owner (kube-ipvs0, a NIC, a `local` route and its protocol).

use std::collections::BTreeMap;

use probe_contract::facts::Announcer;

use super::{
    tests::{
        EXT_VIP, LB_VIP, MS, NODE, POD, S, assert_mentions, corr, ct, drop_ev, egress, has_line,
        invariants, ip, local_source, node_to_itself, only_query, only_report, pkt, queries,
        suspect,
    },
    *,
};
use crate::state::addrs::Prefix;

/// The node's API server port: no NodePort of the test table.
const HOST_PORT: u16 = 6443;

/// `owner` makes `addr` local on this node (the owners map the node sync fills).
fn own(c: &mut Correlator, addr: &str, owner: AddressOwner) {
    c.set_owners(Arc::new(BTreeMap::from([(Prefix::host(ip(addr)), owner)])));
}

/// A VIP-sourced packet `p` seen (its suspect) and dropped as a local source: the
/// confirmation.
fn vip_sourced_confirmed(c: &mut Correlator, p: &Packet) -> Confirmation {
    c.ingest(suspect(S, p));
    only_report(&c.ingest(local_source(S + MS, p)))
}

fn apiserver() -> Listener {
    Listener {
        addr: "0.0.0.0".parse().unwrap(),
        port: HOST_PORT,
        proto: Proto::Tcp,
        uid: 0,
        inode: 777,
        process: Some("kube-apiserver".into()),
        pid: Some(4242),
        pod: None,
    }
}

/// The two queries a host-listener suspect raises: (listener id, egress id).
fn host_suspect(c: &mut Correlator, ts: u64, p: &Packet) -> (u64, u64) {
    let qs = queries(&c.ingest(suspect(ts, p)));
    let listener = qs.iter().find_map(|q| match q {
        Query::Listener {
            id,
            addr,
            port,
            proto,
        } => {
            assert_eq!((*addr, *port, *proto), (p.dst, p.dport, p.proto));
            Some(*id)
        }
        _ => None,
    });
    let egress = qs.iter().find_map(|q| match q {
        Query::Egress { id, .. } => Some(*id),
        _ => None,
    });
    (
        listener.expect("listener asked"),
        egress.expect("egress asked"),
    )
}

/// Answers the egress query with `records` and the conntrack query of the egress flow with
/// an unanswered, un-SNATed entry: the candidate settles.
fn egress_proven(c: &mut Correlator, egress_id: u64, records: Vec<EgressRecord>) {
    let q = only_query(&c.answer(Answer::Egress {
        id: egress_id,
        records,
    }));
    let Query::Conntrack { id, tuple } = q else {
        panic!("expected the egress flow's conntrack query, got {q:?}");
    };
    let entry = Some(ct(tuple, false, Some("SYN_SENT")));
    assert!(c.answer(Answer::Conntrack { id, entry }).is_empty());
}

/// pod -> LB -> node:6443 from port 40001, its call to the LB 1 ms before, up to the drop
/// (reverse path filter) the test then ingests: (the listener query's id, the drop).
fn pod_to_host_listener_dropped(c: &mut Correlator, t0: u64) -> (u64, KernelEvent) {
    let p = pkt(POD, 40001, NODE, HOST_PORT, Some(Tag::Pod), Some(Tag::Node));
    let (listener_id, egress_id) = host_suspect(c, t0, &p);
    egress_proven(
        c,
        egress_id,
        vec![egress(40001, EXT_VIP, HOST_PORT, t0 - MS)],
    );
    let drop = drop_ev(
        t0 + MS,
        &p,
        "IP_RPFILTER",
        12,
        Some("ip_rcv_finish_core+0x1"),
    );
    (listener_id, drop)
}

/// pod -> LB -> node:6443 (no NodePort): the exact layer-4 match confirms it; the confirmation
/// waits for the listener, which the event names.
#[test]
fn host_listener_hairpin_is_confirmed_on_the_exact_layer_4_match_and_names_the_listener() {
    let mut c = corr();
    let t0 = 5 * S;
    let (listener_id, drop) = pod_to_host_listener_dropped(&mut c, t0);
    assert!(
        c.ingest(drop).is_empty(),
        "the confirmation waits for the listener"
    );
    let r = only_report(&c.answer(Answer::Listener {
        id: listener_id,
        listener: Ok(Some(apiserver())),
    }));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::Hairpin);
    assert_eq!(e.layer, Some(Layer::L4));
    assert_eq!((e.dst, e.dst_port), (ip(NODE), HOST_PORT));
    assert_eq!((e.vip, e.vip_port), (Some(ip(EXT_VIP)), Some(HOST_PORT)));
    assert_eq!(e.listener, Some(apiserver()));
    assert_mentions(
        &e.evidence,
        &[
            "198.18.0.2:6443 is no NodePort",
            "listener of 198.18.0.2:6443/tcp on this node: tcp socket 0.0.0.0:6443 of process \
             kube-apiserver (pid 4242",
        ],
    );
    let cause = &e.remedy[0];
    assert!(cause.starts_with("Cause: pod 198.18.1.5"), "{e:#?}");
    assert!(cause.contains("host process kube-apiserver"), "{e:#?}");
    assert_mentions(&e.remedy, &["externalTrafficPolicy does not apply"]);
    assert!(!has_line(&e.remedy, "NodePort 6443"), "{e:#?}");
    assert_eq!(c.stats().confirmed.hairpin, 1);
    invariants(&c);
}

/// Layer 7 (same source, another port) keeps requiring a NodePort or a local pod: the same
/// record that pairs a NodePort suspect at layer 7 pairs nothing for a host port.
#[test]
fn host_listener_takes_no_layer_7_match() {
    let t0 = 5 * S;
    // Another connection of the pod to the LB (another source port), 1 ms before.
    let records = || vec![egress(40999, EXT_VIP, HOST_PORT, t0 - MS)];
    let mut c = corr();
    let p = pkt(POD, 40001, NODE, HOST_PORT, Some(Tag::Pod), Some(Tag::Node));
    let (listener_id, egress_id) = host_suspect(&mut c, t0, &p);
    let outs = c.answer(Answer::Egress {
        id: egress_id,
        records: records(),
    });
    assert!(outs.is_empty(), "no pair, no conntrack query: {outs:?}");
    assert_eq!(c.stats().hairpin_no_egress, 1);
    let late = c.answer(Answer::Listener {
        id: listener_id,
        listener: Ok(Some(apiserver())),
    });
    assert!(late.is_empty(), "{late:?}");
    assert!(c.tick(t0 + 30 * S).is_empty());
    assert_eq!(c.stats().confirmed.hairpin, 0);
    invariants(&c);

    // The NodePort twin: the same record is a layer-7 match there.
    let mut c = corr();
    let p = pkt(POD, 40001, NODE, 30080, Some(Tag::Pod), Some(Tag::Node));
    let q = only_query(&c.ingest(suspect(t0, &p)));
    let q = only_query(&c.answer(Answer::Egress {
        id: q.id(),
        records: records(),
    }));
    assert!(matches!(q, Query::Conntrack { .. }), "{q:?}");
}

/// node -> its own LB -> node:6443: node-sourced, dropped as a local source; the node
/// address's owner is named; the listener answer may come first.
#[test]
fn node_sourced_host_listener_hairpin_names_the_owner_of_the_node_address() {
    let mut c = corr();
    own(&mut c, NODE, AddressOwner::interface("eth0"));
    let t0 = 5 * S;
    let p = node_to_itself(40001, HOST_PORT);
    let (listener_id, egress_id) = host_suspect(&mut c, t0, &p);
    assert!(
        c.answer(Answer::Listener {
            id: listener_id,
            listener: Ok(Some(apiserver())),
        })
        .is_empty()
    );
    let record = EgressRecord {
        src: ip(NODE),
        ..egress(40001, EXT_VIP, HOST_PORT, t0 - MS)
    };
    egress_proven(&mut c, egress_id, vec![record]);
    let r = only_report(&c.ingest(local_source(t0 + MS, &p)));
    let e = &r.event;
    assert_eq!(e.src, ip(NODE));
    assert_eq!(e.outcome, Outcome::Dropped);
    assert_eq!(e.facts.owner, Some(AddressOwner::interface("eth0")));
    assert_mentions(
        &e.evidence,
        &["local address owner: 198.18.0.2 is local through an address on eth0"],
    );
    assert!(
        e.remedy[0].starts_with("Cause: this node (198.18.0.2)"),
        "{e:#?}"
    );
    assert_mentions(&e.remedy, &["SNAT to the node IP does not avoid"]);
    invariants(&c);
}

/// A listener look-up that never answers does not hold the confirmation past the query
/// timeout: the event says the listener is unknown.
#[test]
fn an_unanswered_listener_look_up_confirms_without_it() {
    let mut c = corr();
    let t0 = 5 * S;
    let (_, drop) = pod_to_host_listener_dropped(&mut c, t0);
    assert!(c.ingest(drop).is_empty());
    let r = only_report(&c.tick(t0 + 6 * S));
    assert_eq!(r.event.listener, None);
    assert!(
        has_line(
            &r.event.evidence,
            "listener of 198.18.0.2:6443/tcp unknown: the sock_diag look-up failed: no answer \
             in time"
        ),
        "{:#?}",
        r.event
    );
    invariants(&c);
}

/// The health-check black hole names what made the VIP local, and its remedy addresses that
/// owner: only a kube-ipvs0 binding is kube-proxy's to undo.
#[test]
fn blackhole_remedy_follows_the_owner_of_the_vip() {
    // (what, owner, a remedy line that must be there, whether kube-ipvs0 may be named)
    let held_by = |name: &str, pod: Option<&str>| {
        Some(AddressOwner::Interface {
            iface: "eth0".into(),
            announcer: Some(Announcer {
                name: name.into(),
                why: "a /32 on eth0".into(),
                pod: pod.map(Into::into),
            }),
        })
    };
    let rows: [(&str, Option<AddressOwner>, &str, bool); 7] = [
        (
            "owner unknown",
            None,
            "Or stop binding the LB ingress IP",
            true,
        ),
        (
            "kube-ipvs0",
            Some(AddressOwner::VipInterface {
                iface: "kube-ipvs0".into(),
            }),
            "Or stop binding the LB ingress IP",
            true,
        ),
        (
            "GCE guest agent route",
            Some(AddressOwner::local_route(Some("eth0".into()), 66)),
            "GoogleCloudPlatform/guest-agent#555",
            false,
        ),
        (
            "static local route",
            Some(AddressOwner::local_route(Some("lo".into()), 4)),
            "ip route del local 192.0.2.10 table local",
            false,
        ),
        (
            "keepalived VIP on the NIC",
            Some(AddressOwner::interface("eth0")),
            "keepalived or kube-vip",
            false,
        ),
        (
            "kube-vip's VIP, its pod named",
            held_by("kube-vip", Some("kube-system/kube-vip-ds-x2x9q")),
            "held on eth0 by kube-vip (pod kube-system/kube-vip-ds-x2x9q), not bound by \
             kube-proxy",
            false,
        ),
        (
            "keepalived's VIP, by its address protocol",
            held_by("keepalived", None),
            "keepalived's MASTER adds 192.0.2.10 (a virtual_ipaddress) to eth0",
            false,
        ),
    ];
    for (what, owner, line, kube_ipvs0) in rows {
        let mut c = corr();
        if let Some(o) = &owner {
            own(&mut c, LB_VIP, o.clone());
        }
        let p = pkt(LB_VIP, 50000, NODE, 30080, Some(Tag::Vip), Some(Tag::Node));
        let r = vip_sourced_confirmed(&mut c, &p);
        let e = &r.event;
        assert_eq!(e.kind, LoopbackKind::HealthcheckBlackhole, "{what}");
        // Not in the owners map (a replay, or no node sync yet): a `vip` tag reads as bound
        // on the VIP interface, as before owners were known.
        let named = owner.clone().or(Some(AddressOwner::VipInterface {
            iface: "kube-ipvs0".into(),
        }));
        assert_eq!(e.facts.owner, named, "{what}");
        assert!(has_line(&e.remedy, line), "{what}: {:#?}", e.remedy);
        assert_eq!(
            has_line(&e.remedy, "kube-ipvs0"),
            kube_ipvs0,
            "{what}: {:#?}",
            e.remedy
        );
        if let Some(o) = &owner {
            let want = format!("local address owner: 192.0.2.10 is local through {o}");
            assert!(has_line(&e.evidence, &want), "{what}: {:#?}", e.evidence);
        }
        invariants(&c);
    }
}

/// The unserved port and the VIP-as-source remedies address a non-kube-proxy owner too.
#[test]
fn unserved_and_vip_as_source_remedies_address_a_route_owner() {
    let owner = AddressOwner::local_route(Some("eth0".into()), 66);
    let vip = ip(LB_VIP);
    let unserved = remedy::vip_port_unserved(vip, 443, Proto::Tcp, None, false, Some(&owner));
    assert!(
        unserved[0].contains("made local here by a route of table local (protocol 66"),
        "{unserved:#?}"
    );
    assert!(has_line(&unserved, "guest-agent#555"), "{unserved:#?}");
    assert!(!has_line(&unserved, "kube-ipvs0"), "{unserved:#?}");
    let kube = remedy::vip_port_unserved(vip, 443, Proto::Tcp, None, false, None);
    assert!(has_line(&kube, "bound on kube-ipvs0"), "{kube:#?}");
    let mut e = remedy::placeholder(LoopbackKind::VipAsSource, vip, 8080);
    e.dst = ip(POD);
    e.vip = Some(vip);
    e.facts.source = probe_contract::facts::SourceKind::Vip;
    e.facts.owner = Some(owner);
    let vas = remedy::build(&e);
    assert!(vas[1].contains("guest agent"), "{vas:#?}");
}

/// kube-vip in BGP mode holds the VIP on `lo` of every node it announces from: a call another
/// node forwarded with the VIP as source dies here as a local source. The `vip_as_source`
/// event names kube-vip on lo as the owner, and its remedy is kube-vip's, not kube-proxy's.
#[test]
fn vip_as_source_through_an_announcer_s_vip_on_lo_names_the_announcer() {
    let owner = AddressOwner::Interface {
        iface: "lo".into(),
        announcer: Some(Announcer {
            name: Announcer::KUBE_VIP.into(),
            why: "/32 on lo with preferred_lft 0 (deprecated), as kube-vip adds its VIPs".into(),
            pod: None,
        }),
    };
    let mut c = corr();
    own(&mut c, LB_VIP, owner.clone());
    let p = pkt(LB_VIP, 50000, POD, 8080, Some(Tag::Vip), Some(Tag::Pod));
    let r = vip_sourced_confirmed(&mut c, &p);
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::VipAsSource, "{e:#?}");
    assert_eq!(e.facts.owner, Some(owner), "{e:#?}");
    assert!(
        has_line(&e.remedy, "held on lo by kube-vip, not bound by kube-proxy"),
        "{:#?}",
        e.remedy
    );
    assert!(!has_line(&e.remedy, "kube-ipvs0"), "{:#?}", e.remedy);
    assert!(
        has_line(&e.evidence, "local through a VIP on lo held by kube-vip"),
        "{:#?}",
        e.evidence
    );
    invariants(&c);
}
