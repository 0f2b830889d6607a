//! Unit tests of `conntrack.rs`: the netlink dump parser on captured replies, bad input, and look-
//! ups in a real network namespace.

use std::process::{Command, Stdio};

use netlink_packet_core::Nla;
use probe_core::test_events::{DO_PP, LB, POD_A, POD_B, proxy_protocol_ingress};

use super::*;
use crate::state::test_netns::{Netns, scratch_with, sh};

/// The call's connection, masqueraded or not; not another call of the pod's, nor an
/// answer from another port.
#[test]
fn a_self_call_is_matched_by_its_ports_whatever_answered_it() {
    let t = |src: &str, sport, dst: &str, dport| Tuple {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        sport,
        dport,
        proto: Proto::Tcp,
    };
    let call = t("198.19.1.11", 40000, "198.19.1.11", 8080);
    let entry = |reply_dst: &str, reply_sport| ConntrackEntry {
        orig: t("198.19.1.11", 40000, "198.18.100.10", 80),
        reply: t("198.19.1.11", reply_sport, reply_dst, 40000),
        snat: reply_dst != "198.19.1.11",
        dnat: true,
        seen_reply: false,
        assured: false,
        tcp_state: None,
        timeout_s: None,
    };
    assert!(is_self_call(&entry("198.19.1.11", 8080), &call));
    assert!(is_self_call(&entry("198.19.1.1", 8080), &call));
    assert!(!is_self_call(&entry("198.19.1.1", 9090), &call));
    let other_call = t("198.19.1.11", 40001, "198.19.1.11", 8080);
    assert!(!is_self_call(&entry("198.19.1.1", 8080), &other_call));
}
use std::time::Duration;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/conntrack/");

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn t(src: &str, sport: u16, dst: &str, dport: u16, proto: Proto) -> Tuple {
    Tuple {
        src: ip(src),
        dst: ip(dst),
        sport,
        dport,
        proto,
    }
}

/// `e`'s original and reply tuples are `orig` and `reply`.
#[track_caller]
fn assert_tuples(e: &ConntrackEntry, orig: Tuple, reply: Tuple) {
    assert_eq!(e.orig, orig);
    assert_eq!(e.reply, reply);
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DATA}{name}")).expect("fixture")
}

/// Real kernel bytes: see `capture_ctnetlink_fixtures` for how they were made.
#[test]
fn parses_captured_v4_dump() {
    let entries = parse_messages(&fixture("dump-v4.bin")).unwrap();
    // Real traffic: pod-like client 198.18.0.2 -> server 198.51.100.2:8080, masqueraded by
    // the router to 198.51.100.1.
    let direct = entries
        .iter()
        .find(|e| e.orig.dst == ip("198.51.100.2") && e.orig.proto == Proto::Tcp)
        .expect("direct flow");
    assert_eq!(direct.orig.src, ip("198.18.0.2"));
    assert_eq!(direct.orig.dport, 8080);
    assert_eq!(direct.reply.src, ip("198.51.100.2"));
    assert_eq!(direct.reply.sport, 8080);
    assert_eq!(direct.reply.dst, ip("198.51.100.1"), "masqueraded");
    assert!(direct.snat && !direct.dnat && direct.seen_reply);
    assert!(direct.tcp_state.is_some());

    // Real traffic through a DNAT (a NodePort / VIP stand-in) and the masquerade.
    let vip = entries
        .iter()
        .find(|e| e.orig.dst == ip("203.0.113.80"))
        .expect("dnat flow");
    assert_eq!(vip.orig.src, ip("198.18.0.2"));
    assert_eq!(vip.orig.dport, 80);
    assert_eq!(vip.reply.src, ip("198.51.100.2"));
    assert_eq!(vip.reply.sport, 8080);
    assert_eq!(vip.reply.dst, ip("198.51.100.1"));
    assert_eq!(vip.reply.dport, vip.orig.sport);
    assert!(vip.snat && vip.dnat && vip.seen_reply);

    // Inserted with `conntrack -I ... --src-nat 198.51.100.1`.
    let inserted = entries
        .iter()
        .find(|e| e.orig == t("198.18.0.10", 40000, "203.0.113.10", 80, Proto::Tcp))
        .expect("inserted entry");
    assert_eq!(
        inserted.reply,
        t("203.0.113.10", 80, "198.51.100.1", 40000, Proto::Tcp)
    );
    assert!(inserted.snat && !inserted.dnat && inserted.seen_reply);
    assert_eq!(inserted.tcp_state.as_deref(), Some("ESTABLISHED"));

    // Inserted UDP without NAT or reply: no TCP state, not SNATed.
    let udp = entries
        .iter()
        .find(|e| e.orig.proto == Proto::Udp)
        .expect("udp entry");
    assert_tuples(
        udp,
        t("198.18.0.11", 5353, "203.0.113.53", 53, Proto::Udp),
        t("203.0.113.53", 53, "198.18.0.11", 5353, Proto::Udp),
    );
    assert!(!udp.snat && !udp.dnat && !udp.seen_reply);
    assert_eq!(udp.tcp_state, None);
}

#[test]
fn parses_captured_v6_dump() {
    let entries = parse_messages(&fixture("dump-v6.bin")).unwrap();
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_tuples(
        e,
        t("2001:db8:1::10", 41000, "2001:db8:2::80", 443, Proto::Tcp),
        t("2001:db8:2::80", 443, "2001:db8:1::1", 41000, Proto::Tcp),
    );
    assert!(e.snat && e.seen_reply);
    assert_eq!(e.tcp_state.as_deref(), Some("SYN_RECV"));
}

#[test]
fn truncated_and_garbage_input() {
    let raw = fixture("dump-v4.bin");
    let all = parse_messages(&raw).unwrap().len();
    for cut in 0..raw.len() {
        let _ = parse_messages(&raw[..cut]);
    }
    // A cut in the middle of the last entry keeps the earlier ones.
    let some = parse_messages(&raw[..raw.len() - 40]).unwrap();
    assert!(some.len() < all && !some.is_empty());
    assert!(
        parse_messages(&[0xff; 64]).is_err() || parse_messages(&[0xff; 64]).unwrap().is_empty()
    );
    assert!(parse_messages(&[]).unwrap().is_empty());
    // Flip bytes inside messages: never panics.
    for i in (0..raw.len()).step_by(3) {
        let mut m = raw.clone();
        m[i] ^= 0x5a;
        let _ = parse_messages(&m);
    }
}

#[test]
fn tcp_state_names() {
    assert_eq!(tcp_state_name(3), "ESTABLISHED");
    assert_eq!(tcp_state_name(9), "SYN_SENT2");
    assert_eq!(tcp_state_name(42), "UNKNOWN(42)");
}

#[test]
fn icmp_lookup_is_unsupported() {
    let r = lookup(&t("198.18.0.1", 0, "198.18.0.2", 0, Proto::Icmp));
    assert!(matches!(r, Err(ConntrackError::Unsupported(Proto::Icmp))));
}

/// The filtered dump's request as the kernel parses it: `CTA_TUPLE_ORIG` (1) nesting
/// `CTA_TUPLE_IP` { `CTA_IP_V4_DST` (2): the address in network order } and `CTA_TUPLE_PROTO`
/// { `CTA_PROTO_NUM` (1): 6, `CTA_PROTO_DST_PORT` (3): the port in network order }, then
/// `CTA_FILTER` (25, `NLA_F_NESTED` set: the kernel's `nla_parse_nested` refuses it without)
/// { `CTA_FILTER_ORIG_FLAGS` (1): IP_DST | PROTO_NUM | PROTO_DST_PORT as a host-order u32 }.
#[test]
fn filtered_dump_request_encodes_the_tuple_and_cta_filter() {
    let attrs = filter_attributes(&OrigFilter {
        dst: Some(ip("203.0.113.10")),
        proto: Some(Proto::Tcp),
        dport: Some(443),
        ..OrigFilter::default()
    });
    let mut bytes = vec![0u8; attrs.as_slice().buffer_len()];
    attrs.as_slice().emit(&mut bytes);
    let nla = |len: u16, kind: u16| [len.to_ne_bytes(), kind.to_ne_bytes()].concat();
    let mut want = Vec::new();
    want.extend(nla(36, 1 | NLA_F_NESTED)); // CTA_TUPLE_ORIG
    want.extend(nla(12, 1 | NLA_F_NESTED)); //   CTA_TUPLE_IP
    want.extend(nla(8, 2)); //                     CTA_IP_V4_DST
    want.extend([203, 0, 113, 10]);
    want.extend(nla(20, 2 | NLA_F_NESTED)); //   CTA_TUPLE_PROTO
    want.extend(nla(5, 1)); //                     CTA_PROTO_NUM
    want.extend([6, 0, 0, 0]);
    want.extend(nla(6, 3)); //                     CTA_PROTO_DST_PORT
    want.extend([0x01, 0xbb, 0, 0]);
    want.extend(nla(12, 25 | NLA_F_NESTED)); // CTA_FILTER
    want.extend(nla(8, 1)); //                   CTA_FILTER_ORIG_FLAGS
    want.extend(((1u32 << 1) | (1 << 3) | (1 << 5)).to_ne_bytes());
    assert_eq!(bytes, want);
}

/// IPv6 addresses are compared in userspace only (the kernel's comparison is inverted, see
/// `dump_filtered`); IPv4 ones go to the kernel; nothing to filter is a plain dump.
#[test]
fn ipv6_addresses_are_not_sent_to_the_kernel_filter() {
    let flags_of = |f: &OrigFilter| {
        filter_attributes(f)
            .iter()
            .find(|nla| nla.kind() == CTA_FILTER | NLA_F_NESTED)
            .map(|nla| {
                let mut v = vec![0u8; nla.value_len()];
                nla.emit_value(&mut v);
                u32::from_ne_bytes(v[4..8].try_into().unwrap())
            })
    };
    let v6 = OrigFilter {
        dst: Some(ip("2001:db8::10")),
        proto: Some(Proto::Tcp),
        dport: Some(443),
        ..OrigFilter::default()
    };
    assert_eq!(flags_of(&v6), Some((1 << 3) | (1 << 5)));
    assert_eq!(v6.family(), NetfilterProtoFamily::IPv6);
    let v4_src = OrigFilter {
        src: Some(ip("198.18.0.10")),
        ..OrigFilter::default()
    };
    assert_eq!(flags_of(&v4_src), Some(1));
    let v6_src = OrigFilter {
        src: Some(ip("2001:db8::1")),
        ..OrigFilter::default()
    };
    assert!(filter_attributes(&v6_src).is_empty());
}

// ---- root-only: real namespaces ----

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn skip() -> bool {
    if !is_root() {
        eprintln!("skipping: needs root");
        return true;
    }
    if !have("conntrack") || !have("ip") {
        eprintln!("skipping: needs the ip and conntrack tools");
        return true;
    }
    false
}

/// Inserts, in the namespace `ns` holds at `index`, the answered call 198.18.0.10:40000 ->
/// 203.0.113.10:80/tcp masqueraded to 198.51.100.1, kept for `timeout` seconds.
/// `conntrack -I` in namespace `index` of the entry `proto` `src`:`sport` -> `dst`:`dport`,
/// then `rest` (its state, timeout, status and NAT).
fn conntrack_insert(
    ns: &Netns,
    index: usize,
    [proto, src, sport, dst, dport]: [&str; 5],
    rest: &[&str],
) {
    let mut args = vec![
        "conntrack",
        "-I",
        "-p",
        proto,
        "-s",
        src,
        "-d",
        dst,
        "--sport",
        sport,
        "--dport",
        dport,
    ];
    args.extend_from_slice(rest);
    ns.exec(index, &args);
}

fn insert_the_snatted_call(ns: &Netns, index: usize, timeout: &str) {
    conntrack_insert(
        ns,
        index,
        ["tcp", "198.18.0.10", "40000", "203.0.113.10", "80"],
        &[
            "--state",
            "ESTABLISHED",
            "--timeout",
            timeout,
            "-u",
            "SEEN_REPLY,ASSURED",
            "--src-nat",
            "198.51.100.1",
        ],
    );
}

#[test]
fn lookup_and_dump_in_namespace() {
    if skip() {
        return;
    }
    let ns = Netns::new("ct", &["node"]);
    insert_the_snatted_call(&ns, 0, "120");
    let orig = t("198.18.0.10", 40000, "203.0.113.10", 80, Proto::Tcp);
    let orig2 = orig.clone();
    let reply = t("203.0.113.10", 80, "198.51.100.1", 40000, Proto::Tcp);
    let (found, missing, by_src, other_src, by_reply) = ns.run_in(0, move || {
        (
            lookup(&orig2),
            lookup(&t("198.18.0.10", 40001, "203.0.113.10", 80, Proto::Tcp)),
            dump_by_source(ip("198.18.0.10")),
            dump_by_source(ip("198.18.0.99")),
            lookup_reply(&reply),
        )
    });
    let e = found.unwrap().expect("entry found");
    assert!(e.snat && !e.dnat && e.seen_reply);
    assert_eq!(e.reply.src, ip("203.0.113.10"));
    assert_eq!(e.reply.dst, ip("198.51.100.1"));
    assert_eq!(e.reply.sport, 80);
    assert_eq!(e.tcp_state.as_deref(), Some("ESTABLISHED"));
    // The time left, as created (`--timeout 120`), read a moment later.
    assert!(
        e.timeout_s.is_some_and(|t| (100..=120).contains(&t)),
        "{:?}",
        e.timeout_s
    );
    // The same entry read again: equal but for the time left, which ticks between reads.
    let untimed = |e: ConntrackEntry| ConntrackEntry {
        timeout_s: None,
        ..e
    };
    assert_eq!(missing.unwrap(), None);
    let by_src: Vec<_> = by_src.unwrap().into_iter().map(untimed).collect();
    assert_eq!(by_src, vec![untimed(e.clone())]);
    assert!(other_src.unwrap().is_empty());
    // Found by how its answer comes back (after SNAT: to the NAT address).
    assert_eq!(by_reply.unwrap().map(untimed), Some(untimed(e.clone())));

    // The host's (or any other) namespace does not see the entry.
    let elsewhere = Netns::new("ct", &["other"]);
    let none = elsewhere.run_in(0, move || lookup(&orig));
    assert_eq!(none.unwrap(), None);
}

/// The kernel filters the dump (the raw reply, before the userspace filter, holds only the
/// matching entries, where a plain dump holds all of them), and the userspace filter does the
/// rest for IPv6 addresses.
#[test]
fn filtered_dumps_are_filtered_by_the_kernel() {
    if skip() {
        return;
    }
    let ns = Netns::new("ctf", &["node"]);
    let insert = |proto: &str, src: &str, sport: &str, dst: &str, dport: &str| {
        let mut rest = vec!["--timeout", "120"];
        if proto == "tcp" {
            rest.extend(["--state", "ESTABLISHED"]);
        }
        conntrack_insert(&ns, 0, [proto, src, sport, dst, dport], &rest);
    };
    // The wanted LB IP:port, the same IP on another port, another IP on the same port, UDP.
    insert("tcp", "198.18.0.10", "40000", "203.0.113.10", "443");
    insert("tcp", "198.18.0.11", "40001", "203.0.113.10", "80");
    insert("tcp", "198.18.0.10", "40002", "203.0.113.20", "443");
    insert("udp", "198.18.0.12", "40003", "203.0.113.10", "443");
    insert("tcp", "2001:db8::1", "40004", "2001:db8::10", "443");
    insert("tcp", "2001:db8::1", "40005", "2001:db8::20", "443");
    insert("tcp", "2001:db8::1", "40006", "2001:db8::10", "80");
    let to_lb = OrigFilter {
        dst: Some(ip("203.0.113.10")),
        proto: Some(Proto::Tcp),
        dport: Some(443),
        ..OrigFilter::default()
    };
    let from_client = OrigFilter {
        src: Some(ip("198.18.0.10")),
        ..OrigFilter::default()
    };
    // The agent's self-call question: the caller's entries from its port.
    let from_client_port = OrigFilter {
        proto: Some(Proto::Tcp),
        sport: Some(40002),
        ..from_client
    };
    let to_lb6 = OrigFilter {
        dst: Some(ip("2001:db8::10")),
        ..to_lb
    };
    let sports = |raw: Result<Vec<u8>, ConntrackError>| -> Vec<u16> {
        let mut p: Vec<u16> = parse_messages(&raw.expect("dump"))
            .expect("decodable")
            .iter()
            .map(|e| e.orig.sport)
            .collect();
        p.sort_unstable();
        p
    };
    let (all, lb_raw, client_raw, client_port_raw, lb6_raw, lb, client, lb6) =
        ns.run_in(0, move || {
            (
                sports(dump_raw(NetfilterProtoFamily::IPv4)),
                sports(dump_filtered_raw(&to_lb)),
                sports(dump_filtered_raw(&from_client)),
                sports(dump_filtered_raw(&from_client_port)),
                sports(dump_filtered_raw(&to_lb6)),
                dump_by_orig_destination(ip("203.0.113.10"), 443),
                dump_by_source(ip("198.18.0.10")),
                dump_by_orig_destination(ip("2001:db8::10"), 443),
            )
        });
    assert_eq!(
        all,
        vec![40000, 40001, 40002, 40003],
        "a plain dump holds every entry"
    );
    // What the kernel sent: CTA_FILTER was honoured.
    assert_eq!(lb_raw, vec![40000]);
    assert_eq!(client_raw, vec![40000, 40002]);
    assert_eq!(client_port_raw, vec![40002]);
    // IPv6: protocol and port by the kernel, the address here.
    assert_eq!(lb6_raw, vec![40004, 40005]);
    let sport_of = |r: Result<Vec<ConntrackEntry>, ConntrackError>| -> Vec<u16> {
        r.expect("dump").iter().map(|e| e.orig.sport).collect()
    };
    assert_eq!(sport_of(lb), vec![40000]);
    let mut client = sport_of(client);
    client.sort_unstable();
    assert_eq!(client, vec![40000, 40002]);
    assert_eq!(sport_of(lb6), vec![40004]);
}

/// Regenerates tests/data/conntrack/dump-v{4,6}.bin from a real kernel:
/// `cargo test -p clb-probe --lib conntrack -- --ignored capture_ctnetlink_fixtures`.
#[test]
#[ignore = "regenerates fixtures; needs root, nc, iptables"]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn capture_ctnetlink_fixtures() {
    if skip() {
        return;
    }
    // client (198.18.0.2) -- router (198.18.0.1 | 198.51.100.1, MASQUERADE, DNAT of
    // 203.0.113.80:80) -- server (198.51.100.2:8080).
    let ns = Netns::new("ct", &["cli", "rtr", "srv"]);
    let (c, r, s) = (
        ns.name(0).to_string(),
        ns.name(1).to_string(),
        ns.name(2).to_string(),
    );
    let pid = std::process::id();
    let (vc, vs) = (format!("ctc{pid}"), format!("cts{pid}"));
    sh(&[
        "ip", "link", "add", &vc, "netns", &r, "type", "veth", "peer", "name", "eth0", "netns", &c,
    ]);
    sh(&[
        "ip", "link", "add", &vs, "netns", &r, "type", "veth", "peer", "name", "eth0", "netns", &s,
    ]);
    ns.exec(0, &["ip", "addr", "add", "198.18.0.2/24", "dev", "eth0"]);
    ns.exec(0, &["ip", "link", "set", "eth0", "up"]);
    ns.exec(0, &["ip", "route", "add", "default", "via", "198.18.0.1"]);
    ns.exec(1, &["ip", "addr", "add", "198.18.0.1/24", "dev", &vc]);
    ns.exec(1, &["ip", "addr", "add", "198.51.100.1/24", "dev", &vs]);
    ns.exec(1, &["ip", "link", "set", &vc, "up"]);
    ns.exec(1, &["ip", "link", "set", &vs, "up"]);
    ns.exec(1, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    ns.exec(
        1,
        &[
            "iptables",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-o",
            &vs,
            "-j",
            "MASQUERADE",
        ],
    );
    ns.exec(
        1,
        &[
            "iptables",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            "203.0.113.80",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "DNAT",
            "--to-destination",
            "198.51.100.2:8080",
        ],
    );
    ns.exec(2, &["ip", "addr", "add", "198.51.100.2/24", "dev", "eth0"]);
    ns.exec(2, &["ip", "link", "set", "eth0", "up"]);
    ns.exec(2, &["ip", "link", "set", "lo", "up"]);

    for dst in ["198.51.100.2", "203.0.113.80"] {
        let port = if dst == "203.0.113.80" { "80" } else { "8080" };
        let mut server = Command::new("ip")
            .args(["netns", "exec", &s, "nc", "-l", "198.51.100.2", "8080"])
            .stdout(Stdio::null())
            .spawn()
            .expect("nc -l");
        std::thread::sleep(Duration::from_millis(300));
        let client = Command::new("sh")
            .args([
                "-c",
                &format!("echo hello | ip netns exec {c} nc -N -w 3 {dst} {port}"),
            ])
            .status()
            .expect("nc");
        let _ = server.kill();
        let _ = server.wait();
        assert!(client.success(), "client to {dst}:{port}");
    }
    insert_the_snatted_call(&ns, 1, "600");
    conntrack_insert(
        &ns,
        1,
        ["udp", "198.18.0.11", "5353", "203.0.113.53", "53"],
        &["--timeout", "600"],
    );
    conntrack_insert(
        &ns,
        1,
        ["tcp", "2001:db8:1::10", "41000", "2001:db8:2::80", "443"],
        &[
            "--state",
            "SYN_RECV",
            "--timeout",
            "600",
            "-u",
            "SEEN_REPLY",
            "--src-nat",
            "2001:db8:1::1",
        ],
    );
    let (v4, v6) = ns.run_in(1, || {
        (
            dump_raw(NetfilterProtoFamily::IPv4).unwrap(),
            dump_raw(NetfilterProtoFamily::IPv6).unwrap(),
        )
    });
    let _ = r;
    std::fs::create_dir_all(DATA).unwrap();
    std::fs::write(format!("{DATA}dump-v4.bin"), &v4).unwrap();
    std::fs::write(format!("{DATA}dump-v6.bin"), &v6).unwrap();
    eprintln!("{:#?}", parse_messages(&v4).unwrap());
    eprintln!("{:#?}", parse_messages(&v6).unwrap());
}

/// The kernel's own encoding: entries made in a scratch namespace with `conntrack -I` as the
/// lab's reset call leaves them (CLOSE, ASSURED, DNAT to pod B) and as its answered twin does
/// (TIME_WAIT), read back through the agent's ctnetlink dump.
#[test]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn the_kernel_s_entries_of_a_reset_and_an_answered_call_are_told_apart() {
    let Some(ns) = scratch_with("conntrack", "pp") else {
        return;
    };
    for (sport, state) in [("54084", "CLOSE"), ("54096", "TIME_WAIT")] {
        conntrack_insert(
            &ns,
            0,
            ["tcp", POD_A, sport, LB, "9443"],
            &[
                "--state",
                state,
                "--timeout",
                "60",
                "-u",
                "SEEN_REPLY,ASSURED",
                "--dst-nat",
                "198.19.1.11:9443",
            ],
        );
    }
    let entries = ns.run_in(0, || dump_family(false)).expect("ctnetlink dump");
    assert_eq!(entries.len(), 2, "{entries:#?}");
    assert!(entries.iter().all(|e| e.dnat && e.assured), "{entries:#?}");
    let got = probe_core::correlate::proxy_protocol::confirm(
        &entries,
        &probe_core::correlate::proxy_protocol::targets(&[proxy_protocol_ingress(&[DO_PP], None)]),
    );
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].client, (POD_A.parse().unwrap(), 54084));
    assert_eq!(got[0].endpoint, (POD_B.parse().unwrap(), 9443));
}
