//! Issue 10's field variants, as tables: kube-proxy's IPVS access filter confirms
//! `vip_port_unserved`; a local-source drop of a VIP-source packet is a health check only for
//! a NodePort (or healthCheckNodePort) of a node address, `vip_as_source` otherwise.

use super::*;

const FILTER_REJECT: &str = "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set \
                             --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with \
                             icmp-port-unreachable";

fn filtered_table() -> ServiceTable {
    ServiceTable {
        access_filter: vec![
            "-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN".into(),
            FILTER_REJECT.into(),
        ],
        ..table()
    }
}

fn to_vip(port: u16) -> Packet {
    pkt(POD, 45000, LB_VIP, port, Some(Tag::Pod), Some(Tag::Vip))
}

/// (what, service table, drop reason, drop site, VIP port, confirmed as unserved).
type UnservedCase = (
    &'static str,
    ServiceTable,
    &'static str,
    Option<&'static str>,
    u16,
    bool,
);

/// (what, destination, its tag, port, service table known, expected kind).
type VipSourceCase = (
    &'static str,
    &'static str,
    Option<Tag>,
    u16,
    bool,
    LoopbackKind,
);

#[test]
fn unserved_vip_port_from_no_socket_or_the_ipvs_access_filter() {
    let cases: &[UnservedCase] = &[
        ("no socket", table(), "NO_SOCKET", None, 443, true),
        (
            "filter REJECT",
            filtered_table(),
            "NETFILTER_DROP",
            Some("nf_hook_slow+0xa4"),
            443,
            true,
        ),
        (
            "filter REJECT, kernel without the reason",
            filtered_table(),
            "NOT_SPECIFIED",
            Some("nf_hook_slow+0xa4"),
            443,
            true,
        ),
        (
            "netfilter drop without kube-proxy's filter",
            table(),
            "NETFILTER_DROP",
            Some("nf_hook_slow+0xa4"),
            443,
            false,
        ),
        (
            "filter present, port served",
            filtered_table(),
            "NETFILTER_DROP",
            Some("nf_hook_slow+0xa4"),
            80,
            false,
        ),
        (
            "unspecified elsewhere",
            filtered_table(),
            "NOT_SPECIFIED",
            Some("tcp_v4_rcv+0x10"),
            443,
            false,
        ),
    ];
    for (what, services, reason, site, port, confirmed) in cases {
        let mut c = Correlator::new(CorrelatorConfig::default());
        c.set_services(services.clone());
        let out = c.ingest(drop_ev(S, &to_vip(*port), reason, 0, *site));
        let got = reports(&out);
        assert_eq!(got.len(), usize::from(*confirmed), "{what}: {out:#?}");
        if let Some(r) = got.first() {
            let e = &r.event;
            assert_eq!(e.kind, LoopbackKind::VipPortUnserved, "{what}");
            assert_eq!(e.outcome, Outcome::Refused, "{what}");
            let filtered = *reason != "NO_SOCKET";
            assert_eq!(
                has_line(&e.evidence, "chain KUBE-IPVS-FILTER"),
                filtered,
                "{what}: {:#?}",
                e.evidence
            );
            assert_eq!(has_line(&e.evidence, FILTER_REJECT), filtered, "{what}");
            assert_eq!(
                has_line(&e.evidence, "ICMP port unreachable"),
                filtered,
                "{what}"
            );
        } else {
            // Not confirmed (a pod-source drop waits as a possible hairpin).
            assert_eq!(c.stats().drops_confirming, 0, "{what}");
        }
        invariants(&c);
    }
}

#[test]
fn a_vip_source_drop_is_a_health_check_only_for_a_nodeport_of_a_node_address() {
    use LoopbackKind::{HealthcheckBlackhole as Hc, VipAsSource as Vas};
    let cases: &[VipSourceCase] = &[
        (
            "NodePort of the table",
            NODE,
            Some(Tag::Node),
            30080,
            true,
            Hc,
        ),
        (
            "unlisted port of the NodePort range (healthCheckNodePort)",
            NODE,
            Some(Tag::Node),
            32100,
            true,
            Hc,
        ),
        (
            "node address, no table",
            NODE,
            Some(Tag::Node),
            8080,
            false,
            Hc,
        ),
        (
            "node address, other port",
            NODE,
            Some(Tag::Node),
            8080,
            true,
            Vas,
        ),
        ("a pod of this node", POD_B, Some(Tag::Pod), 8080, true, Vas),
        ("a pod, no table", POD_B, Some(Tag::Pod), 8080, false, Vas),
        (
            "a pod on a NodePort-numbered port",
            POD_B,
            Some(Tag::Pod),
            30080,
            true,
            Vas,
        ),
        ("no local address", CLIENT, None, 8080, true, Vas),
    ];
    for (what, dst, tag, port, known, kind) in cases {
        for with_suspect in [false, true] {
            let mut c = Correlator::new(CorrelatorConfig::default());
            if *known {
                c.set_services(table());
            }
            let p = pkt(LB_VIP, 41000, dst, *port, Some(Tag::Vip), *tag);
            if with_suspect {
                assert!(c.ingest(suspect(S, &p)).is_empty(), "{what}");
            }
            let r = only_report(&c.ingest(local_source(S + MS, &p)));
            let e = &r.event;
            assert_eq!(e.kind, *kind, "{what} (suspect: {with_suspect})");
            assert_eq!((e.src, e.vip), (ip(LB_VIP), Some(ip(LB_VIP))), "{what}");
            assert_eq!((e.dst, e.dst_port), (ip(dst), *port), "{what}");
            assert_eq!(e.outcome, Outcome::Dropped, "{what}");
            assert_eq!(
                has_line(&e.evidence, "tc ingress on eth0"),
                with_suspect,
                "{what}"
            );
            if *kind == Vas {
                assert!(has_line(&e.evidence, "not a health check"), "{what}");
                assert!(
                    has_line(&e.remedy, "externalTrafficPolicy: Local"),
                    "{what}"
                );
                assert!(has_line(&e.remedy, "ClusterIP"), "{what}");
                assert!(has_line(&e.remedy, "internalTrafficPolicy"), "{what}");
                assert!(
                    has_line(&e.remedy, "externalTrafficPolicy: Cluster"),
                    "{what}"
                );
                assert!(e.key.starts_with("vip_as_source/"), "{}", e.key);
            }
            let s = c.stats();
            assert_eq!(
                (s.confirmed.healthcheck_blackhole, s.confirmed.vip_as_source),
                if *kind == Hc { (1, 0) } else { (0, 1) },
                "{what}"
            );
            invariants(&c);
        }
    }
}

/// A suspect arriving after its `vip_as_source` drop folds into that event, like a health
/// check's.
#[test]
fn a_late_suspect_folds_into_its_vip_as_source_event() {
    let mut c = corr();
    let p = pkt(LB_VIP, 41000, POD_B, 8080, Some(Tag::Vip), Some(Tag::Pod));
    let r = only_report(&c.ingest(local_source(S, &p)));
    assert_eq!(r.event.kind, LoopbackKind::VipAsSource);
    assert!(c.ingest(suspect(S + MS, &p)).is_empty());
    assert_suspect_folded(&c);
}

/// The sending side: a SYN that left a NIC with a bound VIP as source confirms alone, once per
/// aggregate (retransmits and new source ports count).
#[test]
fn a_vip_source_syn_leaving_a_nic_is_vip_as_source() {
    let mut c = corr();
    let remote_pod = "198.18.7.20";
    let egress = |ts: u64, sport: u16| KernelEvent::VipEgress {
        ts_ns: ts,
        nic: "eth0".into(),
        packet: pkt(LB_VIP, sport, remote_pod, 8080, Some(Tag::Vip), None),
    };
    let first = only_report(&c.ingest(egress(S, 41000)));
    let e = &first.event;
    assert_eq!(e.kind, LoopbackKind::VipAsSource);
    assert_eq!((e.src, e.vip), (ip(LB_VIP), Some(ip(LB_VIP))));
    assert_eq!((e.dst, e.dst_port), (ip(remote_pod), 8080));
    assert_eq!(e.outcome, Outcome::NoReply);
    assert_eq!(e.nic.as_deref(), Some("eth0"));
    assert!(has_line(&e.evidence, "tc egress on eth0"));
    assert!(has_line(&e.remedy, "on this node"));
    let second = only_report(&c.ingest(egress(2 * S, 41001)));
    assert_eq!(
        (second.event.key.as_str(), second.event.count),
        (e.key.as_str(), 2)
    );
    let s = c.stats();
    assert_eq!((s.vip_egress_seen, s.confirmed.vip_as_source), (2, 2));
    invariants(&c);
}

/// Seen in the demo: after a health check taught the NodePort DNAT to pod B, a VIP-source call
/// to pod B from another node (its retransmit's suspect deduplicated) must stay
/// `vip_as_source`, not be rewritten into the health check's NodePort.
#[test]
fn a_learned_nodeport_dnat_applies_only_to_its_own_flow() {
    let mut c = corr();
    let check = hc(35787);
    let mut dnated = check.clone();
    dnated.dst = ip(POD_B);
    dnated.dport = 8080;
    dnated.dst_tag = Some(Tag::Pod);
    c.ingest(suspect(S, &check));
    let r = only_report(&c.ingest(local_source(S + MS, &dnated)));
    assert_eq!(r.event.kind, LoopbackKind::HealthcheckBlackhole);
    // Another flow from the VIP to the same endpoint, its drop alone.
    let mut call = dnated.clone();
    call.sport = 46507;
    let r = only_report(&c.ingest(local_source(5 * S, &call)));
    assert_eq!(r.event.kind, LoopbackKind::VipAsSource);
    assert_eq!((r.event.dst, r.event.dst_port), (ip(POD_B), 8080));
    // The health check's own retransmit still lands in its NodePort aggregate.
    let r = only_report(&c.ingest(local_source(6 * S, &dnated)));
    assert_eq!(r.event.kind, LoopbackKind::HealthcheckBlackhole);
    assert_eq!(r.event.dst_port, 30080);
    invariants(&c);
}
