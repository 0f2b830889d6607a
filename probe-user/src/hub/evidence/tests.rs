use std::net::IpAddr;

use pcap_parser::{Block, PcapBlockOwned, PcapNGSlice, pcapng::OptionCode};
use probe_contract::{
    LoopbackEvent, LoopbackKind, Outcome, Proto,
    evidence::{Hook, MAX_LOOPS, PACKETS_PER_LOOP},
    record::{DropReason, KernelEvent, KernelRecord, Packet},
};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// An IPv4 TCP SYN from `src:sport` to `dst:dport` with `payload` after a 20-byte TCP header.
fn ipv4_tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 20 + payload.len();
    let mut b = vec![
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        0,
        0x40,
        0,
        64,
        6,
        0,
        0,
    ];
    b.extend_from_slice(&src);
    b.extend_from_slice(&dst);
    b.extend_from_slice(&sport.to_be_bytes());
    b.extend_from_slice(&dport.to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    b.extend_from_slice(payload);
    b
}

/// The SYN of the loop the tests confirm: 203.0.113.10:40000 -> 10.244.1.5:8080.
fn the_syn() -> Vec<u8> {
    ipv4_tcp([203, 0, 113, 10], 40000, [10, 244, 1, 5], 8080, b"")
}

/// [`the_syn`], dropped on eth0 at `ts_ns`.
fn the_syn_dropped_at(ts_ns: u64) -> KernelRecord {
    drop_record(ts_ns, "203.0.113.10", 40000, "10.244.1.5", 8080, the_syn())
}

fn drop_record(
    ts_ns: u64,
    src: &str,
    sport: u16,
    dst: &str,
    dport: u16,
    bytes: Vec<u8>,
) -> KernelRecord {
    KernelRecord {
        event: KernelEvent::Drop {
            ts_ns,
            iface: Some("eth0".into()),
            packet: Packet {
                src: ip(src),
                dst: ip(dst),
                sport,
                dport,
                proto: Proto::Tcp,
                tcp_flags: 0x02,
                src_tag: Some(probe_contract::Tag::Vip),
                dst_tag: None,
            },
            reason: DropReason {
                code: 89,
                name: "IP_LOCAL_SOURCE".into(),
            },
            location: None,
            foreign_netns: false,
        },
        packet_bytes: bytes,
    }
}

fn loop_event(key: &str, src: &str, sport: u16, last_seen_ns: u64) -> LoopbackEvent {
    LoopbackEvent {
        key: key.into(),
        last_seen_ns,
        count: 1,
        service: Some("default/web".into()),
        ..LoopbackEvent::between(
            LoopbackKind::HealthcheckBlackhole,
            (ip(src), sport),
            (ip("198.18.0.2"), 30080),
            Proto::Tcp,
            Outcome::Dropped,
        )
    }
}

#[test]
fn a_confirmation_takes_the_recent_packets_of_its_flow_only() {
    let mut store = EvidenceStore::new(EvidenceMode::Full);
    let syn = the_syn();
    store.packet(&the_syn_dropped_at(1_000));
    // Another flow, and a record without bytes: neither is this loop's packet.
    store.packet(&drop_record(
        1_100,
        "203.0.113.99",
        40000,
        "10.244.1.5",
        8080,
        syn.clone(),
    ));
    store.packet(&drop_record(
        1_200,
        "203.0.113.10",
        40000,
        "10.244.1.5",
        8080,
        Vec::new(),
    ));
    store.confirmed(&loop_event("hc/a", "203.0.113.10", 40000, 2_000));
    let l = store.get(&loop_id("hc/a")).unwrap();
    assert_eq!(l.packets.len(), 1);
    assert_eq!(l.packets[0].bytes, syn);
    assert_eq!(
        l.packets[0].summary.drop_reason.as_deref(),
        Some("IP_LOCAL_SOURCE")
    );
    // A repeat confirmation does not add the same packet again.
    store.confirmed(&loop_event("hc/a", "203.0.113.10", 40000, 3_000));
    assert_eq!(store.get(&loop_id("hc/a")).unwrap().packets.len(), 1);
}

#[test]
fn packets_recorded_long_before_the_confirmation_are_not_its_own() {
    let mut store = EvidenceStore::new(EvidenceMode::Full);
    store.packet(&the_syn_dropped_at(1_000));
    store.confirmed(&loop_event(
        "hc/a",
        "203.0.113.10",
        40000,
        1_000 + MATCH_WINDOW_NS + 1,
    ));
    assert!(store.get(&loop_id("hc/a")).unwrap().packets.is_empty());
}

#[test]
fn each_loop_keeps_its_first_packets_and_the_oldest_loop_goes_first() {
    let mut store = EvidenceStore::new(EvidenceMode::Full);
    let syn = the_syn();
    for i in 0..(PACKETS_PER_LOOP as u64 + 5) {
        store.packet(&the_syn_dropped_at(1_000 + i));
    }
    store.confirmed(&loop_event("hc/first", "203.0.113.10", 40000, 2_000));
    let l = store.get(&loop_id("hc/first")).unwrap();
    assert_eq!(l.packets.len(), PACKETS_PER_LOOP);
    assert_eq!(
        l.packets[0].summary.ts_ns, 1_000,
        "the first packets are kept"
    );
    // The recent packets are bounded.
    for i in 0..(RECENT_MAX as u64 + 10) {
        store.packet(&drop_record(
            5_000 + i,
            "203.0.113.10",
            1,
            "10.244.1.5",
            8080,
            syn.clone(),
        ));
    }
    assert_eq!(store.recent.len(), RECENT_MAX);
    // MAX_LOOPS more loops: the first one confirmed is evicted, the latest are there.
    for i in 0..MAX_LOOPS {
        store.confirmed(&loop_event(
            &format!("hc/{i}"),
            "203.0.113.10",
            40000,
            3_000,
        ));
    }
    assert_eq!(store.index(None).loops.len(), MAX_LOOPS);
    assert!(store.get(&loop_id("hc/first")).is_none());
    assert!(
        store
            .get(&loop_id(&format!("hc/{}", MAX_LOOPS - 1)))
            .is_some()
    );
    assert!(store.get(&loop_id("hc/0")).is_some());
}

#[test]
fn headers_mode_zeroes_the_payload_and_keeps_the_headers() {
    let mut store = EvidenceStore::new(EvidenceMode::Headers);
    let pkt = ipv4_tcp(
        [203, 0, 113, 10],
        40000,
        [10, 244, 1, 5],
        8080,
        b"GET /secret",
    );
    store.packet(&drop_record(
        1_000,
        "203.0.113.10",
        40000,
        "10.244.1.5",
        8080,
        pkt.clone(),
    ));
    store.confirmed(&loop_event("hc/a", "203.0.113.10", 40000, 2_000));
    let kept = &store.get(&loop_id("hc/a")).unwrap().packets[0].bytes;
    assert_eq!(kept.len(), pkt.len());
    assert_eq!(kept[..40], pkt[..40], "IP and TCP headers as captured");
    assert!(kept[40..].iter().all(|&b| b == 0), "payload zeroed");
    // Off keeps nothing.
    let mut off = EvidenceStore::new(EvidenceMode::Off);
    off.packet(&drop_record(
        1_000,
        "203.0.113.10",
        40000,
        "10.244.1.5",
        8080,
        pkt,
    ));
    off.confirmed(&loop_event("hc/a", "203.0.113.10", 40000, 2_000));
    assert!(off.index(None).loops.is_empty());
}

#[test]
fn the_bundle_splits_the_cited_conntrack_entries_and_rules_and_keeps_the_services_risks() {
    let mut store = EvidenceStore::new(EvidenceMode::Full);
    let mut ev = loop_event("hc/a", "203.0.113.10", 40000, 2_000);
    ev.evidence = vec![
        "kernel drop: IP_LOCAL_SOURCE".into(),
        "conntrack (egress flow): tcp 10.244.1.5:1 -> 203.0.113.10:80".into(),
        "nat rule: -A KUBE-POSTROUTING -j MASQUERADE".into(),
    ];
    store.confirmed(&ev);
    let risks = [
        probe_contract::report::RiskStatus {
            kind: "healthcheck_blackhole".into(),
            services: vec!["default/web".into()],
            ..Default::default()
        },
        probe_contract::report::RiskStatus {
            kind: "hairpin".into(),
            services: vec!["other/svc".into()],
            ..Default::default()
        },
    ];
    let b = store
        .bundle(&loop_id("hc/a"), Some("node-a"), &risks)
        .unwrap();
    assert_eq!(b.conntrack, [ev.evidence[1].clone()]);
    assert_eq!(b.rules, [ev.evidence[2].clone()]);
    assert_eq!(b.check.len(), 1);
    assert_eq!(b.check[0].kind, "healthcheck_blackhole");
    assert_eq!(b.capture, format!("/evidence/{}/capture.pcapng", b.id));
    assert!(store.bundle("0000000000000000", None, &[]).is_none());
}

#[test]
fn the_pcapng_reads_back_with_another_parser_with_its_packets_and_comments() {
    let mut store = EvidenceStore::new(EvidenceMode::Full);
    let syn = the_syn();
    store.packet(&the_syn_dropped_at(1_000));
    let mut suspect = drop_record(900, "203.0.113.10", 40000, "198.18.0.2", 30080, syn.clone());
    suspect.event = KernelEvent::Suspect {
        ts_ns: 900,
        nic: "eth0".into(),
        packet: suspect.event.packet().clone(),
    };
    store.packet(&suspect);
    store.confirmed(&loop_event("hc/a", "203.0.113.10", 40000, 2_000));
    let l = store.get(&loop_id("hc/a")).unwrap();
    let file = pcapng::write(l, 1_700_000_000_000_000_000).unwrap();

    let mut interfaces = Vec::new();
    let mut packets = Vec::new();
    for block in PcapNGSlice::from_slice(&file).unwrap() {
        match block.unwrap() {
            PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                interfaces.push((idb.linktype.0, idb.if_tsresol))
            }
            PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                let comment = epb
                    .options
                    .iter()
                    .find(|o| o.code == OptionCode::Comment)
                    .map(|o| String::from_utf8(o.as_bytes().unwrap().to_vec()).unwrap())
                    .unwrap();
                packets.push((
                    epb.if_id,
                    epb.data[..epb.caplen as usize].to_vec(),
                    epb.origlen,
                    comment,
                ));
            }
            _ => {}
        }
    }
    // Two interfaces (tc ingress and kfree_skb on eth0), Ethernet, nanoseconds.
    assert_eq!(interfaces, [(1, 9), (1, 9)]);
    assert_eq!(packets.len(), 2);
    // Oldest first: the suspect, then the drop; the IP packet behind a made-up Ethernet
    // header (zero MACs, IPv4's EtherType).
    assert_eq!(
        packets[0].1[..14],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00]
    );
    assert_eq!(packets[0].1[14..], syn);
    assert_eq!(packets[0].2, 14 + syn.len() as u32);
    assert!(packets[0].3.contains("hook tc_ingress") && packets[0].3.contains("iface eth0"));
    assert!(packets[1].3.contains("hook kfree_skb"));
    assert!(packets[1].3.contains("drop reason IP_LOCAL_SOURCE"));
    assert!(packets[1].3.contains(&format!("loop {}", l.id)));
    assert!(packets[1].3.contains("kind healthcheck_blackhole"));
    assert_ne!(packets[0].0, packets[1].0);
}

#[test]
fn loop_ids_are_stable_and_url_safe() {
    let id = loop_id("hairpin/l4/10.244.1.5->[2001:db8::1]:80->198.18.0.2:30080/tcp");
    assert_eq!(id.len(), 16);
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(
        id,
        loop_id("hairpin/l4/10.244.1.5->[2001:db8::1]:80->198.18.0.2:30080/tcp")
    );
    assert_ne!(
        id,
        loop_id("hairpin/l4/10.244.1.6->[2001:db8::1]:80->198.18.0.2:30080/tcp")
    );
}

#[test]
fn zeroing_handles_short_and_odd_captures() {
    let mut empty: [u8; 0] = [];
    zero_payload(&mut empty);
    // A capture that ends inside the TCP header keeps all of it.
    let pkt = ipv4_tcp([1, 2, 3, 4], 1, [5, 6, 7, 8], 2, b"");
    let mut short = pkt[..30].to_vec();
    zero_payload(&mut short);
    assert_eq!(short, pkt[..30]);
    // Not IP: nothing kept.
    let mut odd = vec![0x12, 0x34, 0x56];
    zero_payload(&mut odd);
    assert_eq!(odd, [0, 0, 0]);
    let _ = Hook::KfreeSkb;
}

/// Hostile round 4: `--evidence headers` kept payload bytes of IPv4 non-first fragments,
/// behind IPv6 extension headers, of ICMP echo and of SCTP. Each is zeroed now; the headers a
/// loop is about stay.
#[test]
fn headers_mode_zeroes_fragments_extension_headers_echo_and_sctp_payloads() {
    let secret = [0xaa_u8; 24];
    // IPv4 with protocol `proto`, fragment offset `frag` (8-byte units), then `l4`.
    let v4 = |proto: u8, frag: u16, l4: &[u8]| {
        let mut b = vec![0x45, 0, 0, 0, 0, 0];
        b.extend_from_slice(&frag.to_be_bytes());
        b.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        b.extend_from_slice(l4);
        b
    };
    // A non-first fragment: what follows the IP header is the middle of some payload.
    let mut frag = v4(6, 185, &secret);
    zero_payload(&mut frag);
    assert!(frag[20..].iter().all(|&b| b == 0), "{frag:?}");
    // ICMP echo: its 8-byte header stays, its data goes.
    let mut echo_l4 = vec![8, 0, 0, 0, 0, 1, 0, 1];
    echo_l4.extend_from_slice(&secret);
    let mut echo = v4(1, 0, &echo_l4);
    zero_payload(&mut echo);
    assert_eq!(echo[20..28], [8, 0, 0, 0, 0, 1, 0, 1]);
    assert!(echo[28..].iter().all(|&b| b == 0));
    // ICMP port unreachable keeps the packet it quotes (its header).
    let mut unreach_l4 = vec![3, 3, 0, 0, 0, 0, 0, 0];
    unreach_l4.extend_from_slice(&[0x45; 28]);
    unreach_l4.extend_from_slice(&secret);
    let mut unreach = v4(1, 0, &unreach_l4);
    zero_payload(&mut unreach);
    assert!(unreach[28..56].iter().all(|&b| b == 0x45));
    assert!(unreach[56..].iter().all(|&b| b == 0));
    // SCTP: the 12-byte common header stays, the chunks go.
    let mut sctp_l4 = vec![0x13, 0x88, 0x13, 0x89, 1, 2, 3, 4, 5, 6, 7, 8];
    sctp_l4.extend_from_slice(&secret);
    let mut sctp = v4(132, 0, &sctp_l4);
    zero_payload(&mut sctp);
    assert_eq!(sctp[20..32], sctp_l4[..12]);
    assert!(sctp[32..].iter().all(|&b| b == 0));
    // IPv6, a destination-options header (8 bytes) then TCP: the TCP header stays.
    let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 60, 64];
    v6.extend_from_slice(&[0x20; 32]);
    v6.extend_from_slice(&[6, 0, 1, 4, 0, 0, 0, 0]);
    let mut tcp = vec![0u8; 20];
    tcp[12] = 5 << 4;
    tcp[0] = 0x1f;
    v6.extend_from_slice(&tcp);
    v6.extend_from_slice(&secret);
    zero_payload(&mut v6);
    assert_eq!(
        v6[48], 0x1f,
        "the TCP header behind the extension header stays"
    );
    assert!(v6[68..].iter().all(|&b| b == 0), "{:?}", &v6[68..]);
    // IPv6, a fragment header of a non-first fragment: all after it zeroed.
    let mut v6frag = vec![0x60, 0, 0, 0, 0, 0, 44, 64];
    v6frag.extend_from_slice(&[0x20; 32]);
    v6frag.extend_from_slice(&[6, 0, 0x05, 0x00, 0, 0, 0, 1]);
    v6frag.extend_from_slice(&secret);
    zero_payload(&mut v6frag);
    assert!(v6frag[48..].iter().all(|&b| b == 0));
}
