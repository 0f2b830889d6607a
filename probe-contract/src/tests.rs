//! The contract survives a round trip through its JSON: what the agent writes, a client reads
//! back unchanged.

use std::net::IpAddr;

use crate::*;

fn event() -> LoopbackEvent {
    LoopbackEvent {
        kind: LoopbackKind::Hairpin,
        key: "hairpin/l4/10.0.0.5->203.0.113.10:80->10.0.0.1:30080/tcp".into(),
        src: "203.0.113.10".parse::<IpAddr>().unwrap(),
        src_port: 40000,
        dst: "10.0.0.5".parse().unwrap(),
        dst_port: 8080,
        vip: Some("203.0.113.10".parse().unwrap()),
        vip_port: Some(80),
        proto: Proto::Tcp,
        drop_reason: None,
        drop_location: None,
        snat: SnatState::No,
        outcome: Outcome::Reset,
        count: 3,
        evidence: vec!["egress 10.0.0.5:40000 -> 203.0.113.10:80".into()],
        remedy: vec!["SNAT the pod's traffic to the VIP".into()],
        first_seen_ns: 1,
        last_seen_ns: 2,
        nic: Some("eth0".into()),
        service: Some("default/web".into()),
        layer: Some(Layer::L4),
        client_pod: Some("default/client".into()),
        node: Some("node-a".into()),
        fixes: Vec::new(),
        facts: facts::Facts {
            owner: Some(facts::AddressOwner::local_route(Some("eth0".into()), 66)),
            host_listener: true,
            ..Default::default()
        },
        listener: Some(Listener {
            addr: "0.0.0.0".parse().unwrap(),
            port: 6443,
            proto: Proto::Tcp,
            uid: 0,
            inode: 777,
            process: Some("kube-apiserver".into()),
            pid: Some(4242),
            pod: Some("kube-system/kube-apiserver-node-a".into()),
        }),
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        node: "node-a".into(),
        status: NodeStatus {
            attached: vec![("eth0".into(), 2)],
            nics: vec!["eth0".into()],
            vip_iface: "kube-ipvs0".into(),
            vip_iface_present: true,
            vips: vec!["203.0.113.10".parse().unwrap()],
            set_sizes: [("vip".to_string(), 1)].into(),
            left_out: [("vip".to_string(), 0)].into(),
            address_capacity: 16_384,
            drop_destinations_left_out: 0,
            owner_counts: [("kube-ipvs0".to_string(), 1)].into(),
            features: Some(Features {
                tc_mode: TcMode::Tcx,
                drop_hook: DropHook::TpBtf,
                drop_reason_arg: true,
                kernel: "6.12.0".into(),
                drop_reasons: 120,
            }),
            ready: true,
            dataplane: "kube-proxy ipvs".into(),
        },
        counters: CounterSnapshot {
            suspects: vec![(2, Tag::Vip, Proto::Other(47), 5)],
            drops: vec![(2, Some(Tag::Vip), None, 4)],
            budget_suppressed_by_class: vec![("suspect".into(), "vip".into(), 1)],
            ..Default::default()
        },
        drops_by_reason: [("IP_LOCAL_SOURCE".to_string(), 4)].into(),
        userspace_queue_full: 0,
        events_read: 9,
        correlator: CorrelatorStats {
            suspects_seen: TagCounts {
                vip: 5,
                ..Default::default()
            },
            ..Default::default()
        },
        confirmed: vec![event()],
        capabilities: vec![("drop_hook".into(), true)],
        kube_connected: false,
        kube_event_writes: vec![("created".into(), 1)],
        loops: crate::LoopLifecycle {
            active: [("hairpin".to_string(), 1)].into(),
            resolutions: [("hairpin".to_string(), 1)].into(),
            resolved: vec![crate::LoopResolution {
                key: "hairpin/x".into(),
                kind: LoopbackKind::Hairpin,
                service: Some("shop/web".into()),
                vip: Some("203.0.113.10".parse().unwrap()),
                vip_port: Some(80),
                first_seen: "2026-11-25T01:00:00Z".into(),
                last_seen: "2026-11-25T01:01:00Z".into(),
                resolved_at: "2026-11-25T01:06:00Z".into(),
                lasted_s: 60,
                count: 3,
                episode: 0,
                aggregates: vec!["hairpin/l4/x".into()],
                proof: vec!["answered".into()],
                changed: vec!["spec.externalTrafficPolicy: Local -> Cluster".into()],
            }],
            ..Default::default()
        },
    }
}

#[test]
fn messages_and_snapshots_read_back_as_written() {
    for msg in [
        Message::Snapshot {
            snapshot: Box::new(snapshot()),
        },
        Message::Report {
            event: Box::new(event()),
            is_new: true,
        },
    ] {
        let line = serde_json::to_string(&msg).unwrap();
        assert_eq!(
            serde_json::from_str::<Message>(&line).unwrap(),
            msg,
            "{line}"
        );
    }
    let snap = snapshot();
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(serde_json::from_value::<Snapshot>(json).unwrap(), snap);
}

/// The spellings clients select on: a renamed field or variant fails here, not in a client.
#[test]
fn the_wire_spellings_are_the_documented_ones() {
    let v = serde_json::to_value(Message::Snapshot {
        snapshot: Box::new(snapshot()),
    })
    .unwrap();
    assert_eq!(v["type"], "snapshot");
    assert_eq!(v["snapshot"]["status"]["features"]["tc_mode"], "tcx");
    assert_eq!(v["snapshot"]["status"]["features"]["drop_hook"], "tp_btf");
    assert_eq!(v["snapshot"]["confirmed"][0]["kind"], "hairpin");
    assert_eq!(v["snapshot"]["confirmed"][0]["layer"], "l4");
    assert_eq!(v["snapshot"]["counters"]["suspects"][0][1], "vip");
    assert_eq!(v["snapshot"]["counters"]["suspects"][0][2]["other"], 47);
    let r = serde_json::to_value(Message::Report {
        event: Box::new(event()),
        is_new: false,
    })
    .unwrap();
    assert_eq!(r["type"], "report");
    assert_eq!(r["event"]["outcome"], "reset");
    assert_eq!(r["is_new"], false);
}

#[test]
fn every_kind_has_a_reason_that_names_it_back() {
    for kind in LoopbackKind::ALL {
        assert_eq!(
            kube_event::kind_of_reason(kube_event::reason(kind)),
            Some(kind)
        );
    }
    assert_eq!(kube_event::kind_of_reason("Pulled"), None);
}

/// `as_str` (what the live view and the metrics print) is the JSON spelling.
#[test]
fn as_str_is_the_json_spelling() {
    fn same<T: serde::Serialize>(v: T, s: &str) {
        assert_eq!(serde_json::to_value(v).unwrap(), s);
    }
    for k in LoopbackKind::ALL {
        same(k, k.as_str());
    }
    for o in [
        Outcome::Dropped,
        Outcome::Reset,
        Outcome::NoReply,
        Outcome::Refused,
    ] {
        same(o, o.as_str());
    }
    for t in Tag::ALL {
        same(t, t.as_str());
    }
    for m in [TcMode::Tcx, TcMode::Netlink] {
        same(m, m.as_str());
    }
    for h in [DropHook::TpBtf, DropHook::RawTracepoint, DropHook::None] {
        same(h, h.as_str());
    }
    for p in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
        same(p, p.as_str());
    }
}

#[test]
fn a_recorded_stream_reads_back_as_written() {
    use record::{DropReason, EgressRecord, KernelEvent, Packet, tcp_flags};
    let packet = Packet {
        src: "203.0.113.10".parse().unwrap(),
        dst: "10.0.0.1".parse().unwrap(),
        sport: 31000,
        dport: 30080,
        proto: Proto::Tcp,
        tcp_flags: tcp_flags::SYN,
        src_tag: Some(Tag::Vip),
        dst_tag: None,
    };
    let stream = [
        KernelEvent::Suspect {
            ts_ns: 1,
            nic: "eth0".into(),
            packet: packet.clone(),
        },
        KernelEvent::Drop {
            ts_ns: 2,
            iface: Some("eth0".into()),
            packet: packet.clone(),
            reason: DropReason {
                code: 89,
                name: "IP_LOCAL_SOURCE".into(),
            },
            location: Some("ip_rcv_finish_core+0x1a4".into()),
            foreign_netns: false,
        },
        KernelEvent::VipEgress {
            ts_ns: 3,
            nic: "eth0".into(),
            packet,
        },
    ];
    for ev in &stream {
        let line = serde_json::to_string(ev).unwrap();
        assert_eq!(
            &serde_json::from_str::<KernelEvent>(&line).unwrap(),
            ev,
            "{line}"
        );
    }
    // The spelling replay files are written in (probe-core/tests/data/streams).
    let drop = serde_json::to_value(&stream[1]).unwrap();
    assert_eq!(drop["type"], "drop");
    assert_eq!(drop["reason"]["name"], "IP_LOCAL_SOURCE");
    assert!(drop.get("foreign_netns").is_none(), "false is left out");

    let egress = EgressRecord {
        src: "10.244.1.5".parse().unwrap(),
        sport: 40000,
        dst: "203.0.113.10".parse().unwrap(),
        dport: 80,
        proto: Proto::Tcp,
        ts_ns: 5,
        last_ns: None,
        nic: "eth0".into(),
    };
    let line = serde_json::to_string(&egress).unwrap();
    assert!(!line.contains("last_ns"), "{line}");
    assert_eq!(serde_json::from_str::<EgressRecord>(&line).unwrap(), egress);
}

#[test]
fn a_check_report_reads_back_as_written() {
    use check::{CheckReport, Dataplane, Finding, Kind, Limit, Mode, Replacement, Severity};
    let finding = |kind, severity, subject: &str| Finding {
        kind,
        severity,
        subject: subject.into(),
        summary: "s".into(),
        evidence: vec!["e".into()],
        remedy: vec!["r".into()],
        fixes: Vec::new(),
    };
    let report = CheckReport::new(vec![
        finding(Kind::KptrRestrict, Severity::Warn, "kernel"),
        finding(Kind::HealthcheckBlackhole, Severity::Risk, "203.0.113.10"),
    ])
    .with_dataplane(Some(Dataplane {
        mode: Mode::None,
        replacement: Some(Replacement::Cilium),
        evidence: vec!["cilium_host".into()],
        still_possible: vec![Limit {
            kind: "healthcheck_blackhole".into(),
            why: "w".into(),
        }],
        cannot_confirm: Vec::new(),
    }));
    assert_eq!(
        (report.risks, report.warnings, report.exit_code()),
        (1, 1, 1)
    );
    assert_eq!(
        report.findings[0].kind,
        Kind::HealthcheckBlackhole,
        "risks first"
    );
    let text = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<CheckReport>(&text).unwrap(), report);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], check::SCHEMA_VERSION);
    assert_eq!(v["findings"][0]["kind"], "healthcheck_blackhole");
    assert_eq!(v["findings"][0]["severity"], "risk");
    assert!(
        v["findings"][0].get("fixes").is_none(),
        "no fixes: left out"
    );
    assert_eq!(v["dataplane"]["mode"], "none");
    assert_eq!(v["dataplane"]["replacement"], "cilium");
    assert!(v["dataplane"].get("cannot_confirm").is_none());
    for k in [
        Kind::Hairpin,
        Kind::ModeLeftover,
        Kind::NicSourceValidation,
        Kind::ProxyProtocolShortCircuit,
        Kind::SourceRangesDrop,
        Kind::LbProbeRefused,
    ] {
        assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
    }
}

#[test]
fn the_node_condition_reads_back_as_written() {
    use condition::{Condition, ConditionStatus, NodeCondition, TYPE, reason_of_kind};
    let c = Condition {
        status: ConditionStatus::True,
        reason: reason_of_kind(LoopbackKind::HealthcheckBlackhole.as_str()),
        message: "active loop healthcheck_blackhole on Service shop/web (203.0.113.10)".into(),
    };
    assert_eq!(c.reason, "HealthcheckBlackhole");
    let entry = NodeCondition::new(&c, "2027-01-15T08:20:00Z", "2027-01-15T08:00:00Z");
    let v = serde_json::to_value(&entry).unwrap();
    assert_eq!(v["type"], TYPE);
    assert_eq!(v["status"], "True");
    assert_eq!(v["lastTransitionTime"], "2027-01-15T08:00:00Z");
    assert_eq!(serde_json::from_value::<NodeCondition>(v).unwrap(), entry);
    for s in [ConditionStatus::True, ConditionStatus::False] {
        assert_eq!(ConditionStatus::parse(s.as_str()), Some(s));
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
    assert_eq!(ConditionStatus::parse("Unknown"), None);
}

#[test]
fn a_readiness_prediction_reads_back_as_written() {
    use check::{Kind, Mode};
    use readiness::{Change, Exposure, IpModeAdvice, Prediction};
    let change = |kind| Change {
        kind,
        subject: "203.0.113.10".into(),
        service: Some("default/dns".into()),
        why: "w".into(),
        fixes: Vec::new(),
    };
    let p = Prediction {
        from: Mode::Ipvs,
        to: Mode::Nftables,
        disappear: vec![change(Kind::HealthcheckBlackhole)],
        appear: vec![change(Kind::Hairpin)],
        remain: Vec::new(),
        before_migrating: Vec::new(),
        ip_mode: vec![IpModeAdvice {
            service: None,
            ip: "203.0.113.10".parse().unwrap(),
            ip_mode: "VIP".into(),
            provider: "generic".into(),
            verdict: "avoids_now".into(),
            advice: "a".into(),
            would_hairpin: true,
            costs: vec!["c".into()],
            fixes: Vec::new(),
        }],
        not_short_circuited: vec![Exposure {
            service: "default/web".into(),
            address: "lb.example".into(),
            why: "hostname".into(),
        }],
        risks_after: 1,
    };
    let text = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Prediction>(&text).unwrap(), p);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (v["from"].as_str(), v["to"].as_str()),
        (Some("ipvs"), Some("nftables"))
    );
    assert!(v["ip_mode"][0].get("service").is_none(), "None is left out");
    assert_eq!(p.summary(), "1 new, 1 gone");
}

#[test]
fn an_announcer_owner_is_an_added_field_of_the_interface_owner() {
    let held = facts::AddressOwner::Interface {
        iface: "eth0".into(),
        announcer: Some(facts::Announcer {
            name: facts::Announcer::KUBE_VIP.into(),
            why: "a deprecated /32".into(),
            pod: Some("kube-system/kube-vip-node-a".into()),
        }),
    };
    let json = serde_json::to_value(&held).unwrap();
    assert_eq!(json["kind"], "interface");
    assert_eq!(json["announcer"]["name"], "kube-vip");
    assert_eq!(
        serde_json::from_value::<facts::AddressOwner>(json).unwrap(),
        held
    );
    // A node's own address writes what it wrote before the field existed, and an old record
    // reads back as the node's own.
    let own = facts::AddressOwner::interface("eth0");
    let json = serde_json::to_string(&own).unwrap();
    assert_eq!(json, r#"{"kind":"interface","iface":"eth0"}"#);
    assert_eq!(
        serde_json::from_str::<facts::AddressOwner>(&json).unwrap(),
        own
    );
    assert_eq!(held.label(), "kube-vip:eth0");
    assert_eq!(own.label(), "nic:eth0");
    let odd = facts::AddressOwner::Interface {
        iface: "lo".into(),
        announcer: Some(facts::Announcer {
            name: "made-up".into(),
            why: String::new(),
            pod: None,
        }),
    };
    assert_eq!(odd.label(), "announcer:lo", "labels stay bounded");
}

#[test]
fn the_evidence_index_and_bundle_read_back_as_written() {
    use crate::evidence::{EvidenceBundle, EvidenceIndex, Hook, LoopSummary, PacketSummary};
    let index = EvidenceIndex {
        node: Some("node-a".into()),
        mode: "headers".into(),
        loops: vec![LoopSummary {
            id: "00112233445566ff".into(),
            key: event().key,
            kind: LoopbackKind::Hairpin,
            service: Some("default/web".into()),
            count: 3,
            packets: 2,
        }],
    };
    let text = serde_json::to_string(&index).unwrap();
    assert_eq!(serde_json::from_str::<EvidenceIndex>(&text).unwrap(), index);
    let bundle = EvidenceBundle {
        id: "00112233445566ff".into(),
        node: None,
        capture: "/evidence/00112233445566ff/capture.pcapng".into(),
        event: event(),
        packets: vec![PacketSummary {
            ts_ns: 7,
            hook: Hook::KfreeSkb,
            iface: Some("eth0".into()),
            drop_reason: Some("IP_RPFILTER".into()),
            src: "10.0.0.5".parse().unwrap(),
            sport: 40000,
            dst: "10.0.0.1".parse().unwrap(),
            dport: 30080,
            proto: Proto::Tcp,
            captured: 60,
        }],
        conntrack: vec!["conntrack (egress flow): ...".into()],
        rules: vec!["nat rule: -A KUBE-POSTROUTING".into()],
        check: vec![],
    };
    let text = serde_json::to_string(&bundle).unwrap();
    assert!(text.contains("\"hook\":\"kfree_skb\""), "{text}");
    assert_eq!(
        serde_json::from_str::<EvidenceBundle>(&text).unwrap(),
        bundle
    );
}

#[test]
fn a_verification_round_trips_and_a_node_patch_names_only_its_entry() {
    use verify::*;
    let spec = VerificationSpec {
        service: ServiceRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        nodes: vec!["node-a".into()],
        kinds: vec!["hairpin".into()],
    };
    let text = serde_json::to_string(&spec).unwrap();
    assert_eq!(
        serde_json::from_str::<VerificationSpec>(&text).unwrap(),
        spec
    );
    assert_eq!(spec.service.key(), "default/web");
    let entry = NodeVerification {
        phase: Phase::Done,
        started_at: "2026-01-01T00:00:00Z".into(),
        finished_at: "2026-01-01T00:00:05Z".into(),
        message: String::new(),
        results: vec![
            VerifyResult {
                kind: "hairpin".into(),
                target: "203.0.113.10:8081/tcp".into(),
                outcome: VerifyOutcome::Confirmed,
                evidence: vec!["hairpin/l4/...".into()],
                tried: String::new(),
                reason: String::new(),
                source: "pod default/a (10.0.0.5)".into(),
                looped: true,
            },
            VerifyResult {
                kind: "healthcheck_blackhole".into(),
                target: "203.0.113.10".into(),
                outcome: VerifyOutcome::NotTestable,
                evidence: vec![],
                tried: String::new(),
                reason: "no health check arrived".into(),
                source: String::new(),
                looped: false,
            },
        ],
    };
    let status = VerificationStatus {
        nodes: [("node-a".to_string(), entry.clone())].into(),
    };
    let text = serde_json::to_string(&status).unwrap();
    assert_eq!(
        serde_json::from_str::<VerificationStatus>(&text).unwrap(),
        status
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["nodes"]["node-a"]["phase"], "done");
    assert_eq!(v["nodes"]["node-a"]["startedAt"], "2026-01-01T00:00:00Z");
    assert_eq!(
        v["nodes"]["node-a"]["results"][1]["outcome"],
        "not_testable"
    );
    // The source and the loop mark are written when set, left out when not.
    assert_eq!(v["nodes"]["node-a"]["results"][0]["looped"], true);
    assert!(v["nodes"]["node-a"]["results"][1].get("looped").is_none());
    assert!(v["nodes"]["node-a"]["results"][1].get("source").is_none());
    let patch = status_patch("node-a", &entry);
    assert_eq!(
        patch["status"]["nodes"].as_object().unwrap().len(),
        1,
        "{patch}"
    );
    assert_eq!(
        patch["status"]["nodes"]["node-a"]["results"][0]["kind"],
        "hairpin"
    );
}

#[test]
fn every_kind_has_one_row_in_all_s_order_with_distinct_names() {
    use crate::{KINDS, LoopbackKind};
    assert_eq!(KINDS.len(), LoopbackKind::ALL.len());
    for (row, kind) in KINDS.iter().zip(LoopbackKind::ALL) {
        assert_eq!(row.kind, kind);
        assert_eq!(kind.spec(), row);
        assert_eq!(LoopbackKind::parse(row.name), Some(kind));
        // The JSON spelling is serde's.
        assert_eq!(
            serde_json::to_value(kind).unwrap(),
            serde_json::json!(row.name)
        );
    }
    for field in [
        |r: &crate::KindSpec| r.name,
        |r: &crate::KindSpec| r.column,
        |r: &crate::KindSpec| r.reason,
    ] {
        let mut seen: Vec<&str> = KINDS.iter().map(field).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), KINDS.len(), "{seen:?}");
    }
}

/// A check finding predicts the event kind of its name, and only the loop kinds do.
#[test]
fn check_kinds_predict_the_event_kind_of_their_name() {
    use crate::check::Kind;
    assert_eq!(Kind::Hairpin.predicted(), Some(LoopbackKind::Hairpin));
    assert_eq!(
        Kind::ProxyProtocolShortCircuit.predicted(),
        Some(LoopbackKind::ProxyProtocolShortCircuit)
    );
    assert_eq!(
        Kind::EtpLocalDrop.predicted(),
        Some(LoopbackKind::EtpLocalDrop)
    );
    assert_eq!(Kind::KptrRestrict.predicted(), None);
    assert_eq!(
        Kind::SourceRangesDrop.predicted(),
        Some(LoopbackKind::SourceRangesDrop)
    );
    // Its first name reads back as the same kind.
    assert_eq!(
        serde_json::from_str::<Kind>("\"source_ranges\"").unwrap(),
        Kind::SourceRangesDrop
    );
}
