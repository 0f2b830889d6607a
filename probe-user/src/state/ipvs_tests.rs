//! Unit tests of `ipvs.rs`: the generic-netlink decoder on captured replies, bad input, and the
//! service table read from a real network namespace.

use std::{path::PathBuf, process::Command};

use netlink_packet_core::{NlaBuffer, NlasIterator, ParseableParametrized};
use netlink_packet_generic::GenlHeader;

use super::{wire::*, *};
use crate::state::{
    test_data::{data_bytes, data_file},
    test_netns::{Netns, sh},
};

fn fixture(name: &str) -> Vec<u8> {
    data_bytes(&format!("ipvs/{name}"))
}

fn capture_fixture() -> Capture {
    let mut dests = Vec::new();
    for i in 0.. {
        let p = data_file(&format!("ipvs/dests-{i}.bin"));
        if !p.exists() {
            break;
        }
        dests.push(std::fs::read(p).unwrap());
    }
    Capture {
        family: fixture("family.bin"),
        services: fixture("services.bin"),
        dests,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A virtual service by address (no firewall mark).
fn by_address(af: u16, protocol: u16, addr: &str, port: u16, scheduler: &str) -> IpvsService {
    IpvsService {
        af,
        protocol,
        addr: Some(ip(addr)),
        port,
        fwmark: 0,
        scheduler: scheduler.into(),
    }
}

/// What the VM test below builds, and what the fixtures hold.
fn expected_services() -> Vec<(&'static str, u16, u16, &'static str, Vec<&'static str>)> {
    // (address, port, protocol, scheduler, real servers)
    vec![
        ("198.18.0.2", 30080, 6, "rr", vec!["198.19.1.11:8080"]),
        ("198.18.100.10", 80, 6, "rr", vec!["198.19.1.11:8080"]),
        (
            "203.0.113.10",
            80,
            6,
            "rr",
            vec!["198.19.1.11:8080", "198.19.1.12:8080"],
        ),
        ("198.18.100.53", 53, 17, "rr", vec!["198.19.1.11:53"]),
        ("2001:db8::10", 443, 6, "wrr", vec!["[2001:db8::11]:8443"]),
    ]
}

fn check(decoded: &[ServiceWithDests]) {
    let addr_services: Vec<_> = decoded.iter().filter(|(s, _)| s.addr.is_some()).collect();
    let mut got: Vec<(String, u16, u16, String, Vec<String>)> = addr_services
        .iter()
        .map(|(s, d)| {
            let mut backends: Vec<String> =
                d.iter().map(|d| socket_string(d.addr, d.port)).collect();
            backends.sort();
            (
                s.addr.unwrap().to_string(),
                s.port,
                s.protocol,
                s.scheduler.clone(),
                backends,
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<(String, u16, u16, String, Vec<String>)> = expected_services()
        .into_iter()
        .map(|(a, p, pr, s, b)| {
            (
                a.to_string(),
                p,
                pr,
                s.to_string(),
                b.into_iter().map(String::from).collect(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
    let fwm: Vec<_> = decoded.iter().filter(|(s, _)| s.addr.is_none()).collect();
    assert_eq!(fwm.len(), 1, "one firewall-mark service");
    assert_eq!(fwm[0].0.fwmark, 7);
    assert_eq!(fwm[0].0.port, 0);
    assert_eq!(
        fwm[0].1.iter().map(|d| d.addr).collect::<Vec<_>>(),
        vec![ip("198.19.1.11")]
    );
    for (s, d) in decoded {
        for dest in d {
            let want = if s.fwmark != 0 {
                Forward::Route
            } else {
                Forward::Masq
            };
            assert_eq!(dest.forward, want, "{s:?} {dest:?}");
            assert!(dest.weight >= 1);
        }
    }
}

#[test]
fn parses_captured_replies() {
    let cap = capture_fixture();
    let id = parse_family_id(&cap.family).unwrap().expect("family id");
    assert!(id >= 0x10, "a dynamic generic-netlink id: {id}");
    let decoded = decode_capture(&cap).unwrap();
    check(&decoded);
    let t = table_from(&decoded);
    assert_eq!(t.source, Some(ServiceSource::Ipvs));
    assert_eq!(t.services.len(), 5, "firewall-mark service left out");
    let web = t.serves(ip("203.0.113.10"), 80, Proto::Tcp).unwrap();
    assert_eq!(web.backends.len(), 2);
    assert!(t.serves(ip("203.0.113.10"), 443, Proto::Tcp).is_none());
    assert!(t.serves(ip("198.18.100.53"), 53, Proto::Udp).is_some());
    assert!(t.serves(ip("198.18.100.53"), 53, Proto::Tcp).is_none());
    assert_eq!(
        t.serves(ip("2001:db8::10"), 443, Proto::Tcp)
            .unwrap()
            .backends,
        vec!["[2001:db8::11]:8443"]
    );
}

#[test]
fn captured_empty_table_and_missing_family() {
    // A namespace with IPVS but no services: one NLMSG_DONE.
    assert!(
        parse_services(&fixture("services-empty.bin"))
            .unwrap()
            .is_empty()
    );
    // The controller's answer for a family that does not exist: ENOENT.
    let err = parse_family_id(&fixture("family-enoent.bin")).unwrap_err();
    assert!(
        matches!(&err, IpvsError::Kernel { source, .. } if source.raw_os_error() == Some(libc::ENOENT)),
        "{err}"
    );
}

#[test]
fn truncated_and_garbage_input() {
    let cap = capture_fixture();
    let cut = &cap.services[..cap.services.len() - 7];
    assert!(parse_services(cut).is_err());
    assert!(parse_services(&[0xff; 40]).is_err());
    assert!(parse_services(&[]).unwrap().is_empty());
    assert!(parse_dests(&[1, 2, 3]).is_err());
}

#[test]
fn request_encoding() {
    let svc = by_address(AF_INET, 6, "203.0.113.10", 80, "rr");
    let mut m = genl(IpvsMessage::get_dests(&svc), 0x20);
    m.finalize();
    let mut bytes = vec![0u8; m.buffer_len()];
    m.serialize(&mut bytes);
    assert_eq!(
        u32::from_ne_bytes(bytes[..4].try_into().unwrap()) as usize,
        bytes.len()
    );
    assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 0x20, "family id");
    assert_eq!(bytes[16], IPVS_CMD_GET_DEST);
    assert_eq!(bytes[17], IPVS_GENL_VERSION);
    // One nested IPVS_CMD_ATTR_SERVICE holding the key: AF, protocol, address, port
    // (network order), as ipvsadm sends it.
    let outer = NlaBuffer::new(&bytes[20..]);
    assert_eq!(outer.kind(), IPVS_CMD_ATTR_SERVICE);
    assert!(outer.nested_flag());
    let key: Vec<(u16, Vec<u8>)> = NlasIterator::new(outer.value())
        .map(|n| {
            let n = n.unwrap();
            (n.kind(), n.value().to_vec())
        })
        .collect();
    assert_eq!(
        key.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        vec![
            IPVS_SVC_ATTR_AF,
            IPVS_SVC_ATTR_PROTOCOL,
            IPVS_SVC_ATTR_ADDR,
            IPVS_SVC_ATTR_PORT
        ]
    );
    assert_eq!(key[2].1[..4], [203, 0, 113, 10]);
    assert_eq!(key[2].1.len(), 16);
    assert_eq!(key[3].1, [0, 80]);
    // The firewall-mark key, and the message decodes back to what was sent.
    let fwm = IpvsService {
        addr: None,
        fwmark: 7,
        port: 0,
        ..svc
    };
    let msg = IpvsMessage::get_dests(&fwm);
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.emit(&mut buf);
    let back = IpvsMessage::parse_with_param(
        &buf,
        GenlHeader {
            cmd: IPVS_CMD_GET_DEST,
            version: IPVS_GENL_VERSION,
        },
    )
    .unwrap();
    assert_eq!(back, msg);
    assert_eq!(
        back.attrs,
        vec![IpvsAttr::Service(vec![
            ServiceAttr::Af(AF_INET),
            ServiceAttr::Fwmark(7)
        ])]
    );
}

#[test]
fn one_service_is_asked_for_with_the_same_key_as_its_real_servers() {
    let svc = by_address(AF_INET6, 17, "2001:db8::10", 53, "");
    let one = IpvsMessage::get_service(&svc);
    let dests = IpvsMessage::get_dests(&svc);
    assert_eq!(one.cmd, IPVS_CMD_GET_SERVICE);
    assert_eq!(
        one.attrs, dests.attrs,
        "ip_vs_genl_parse_service reads one key"
    );
    let IpvsAttr::Service(key) = &one.attrs[0] else {
        panic!("{one:?}")
    };
    assert_eq!(key[0], ServiceAttr::Af(AF_INET6));
    assert_eq!(key[1], ServiceAttr::Protocol(17));
    assert_eq!(key[3], ServiceAttr::Port(53));
}

fn vm_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    std::env::var_os("CLB_VM").is_some() && unsafe { libc::geteuid() } == 0
}

/// Against the real kernel (the VM tier, where IPVS exists): a scratch namespace with the
/// services of [`expected_services`] plus a firewall-mark service, read over generic
/// netlink from inside it. With `CLB_IPVS_CAPTURE=<dir>` the raw replies are written there
/// (how `tests/data/ipvs/` was made). Skips (with a line) outside the VM.
#[test]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn real_ipvs_in_a_namespace() {
    if !vm_root() {
        eprintln!("skipping real_ipvs_in_a_namespace: needs the VM tier (CLB_VM) and root");
        return;
    }
    let _ = Command::new("modprobe")
        .args(["ip_vs", "ip_vs_rr", "ip_vs_wrr"])
        .status();
    let scratch = Netns::new("ipvs", &[""]);
    let ns = scratch.name(0).to_string();
    // Real servers must be unicast addresses by the namespace's table local
    // (ip_vs_new_dest: inet_addr_type), which exists once an address does.
    for args in [
        vec!["link", "set", "lo", "up"],
        vec!["link", "add", "clb0", "type", "dummy"],
        vec!["link", "set", "clb0", "up"],
        vec!["addr", "add", "198.19.0.1/16", "dev", "clb0"],
        vec![
            "-6",
            "addr",
            "add",
            "2001:db8::1/64",
            "dev",
            "clb0",
            "nodad",
        ],
    ] {
        let mut v = vec!["ip", "-n", ns.as_str()];
        v.extend(args);
        sh(&v);
    }
    // The virtual services (-A) and their real servers (-a), as ipvsadm takes them.
    for rule in [
        "-A -t 198.18.0.2:30080 -s rr",
        "-a -t 198.18.0.2:30080 -r 198.19.1.11:8080 -m",
        "-A -t 198.18.100.10:80 -s rr",
        "-a -t 198.18.100.10:80 -r 198.19.1.11:8080 -m",
        "-A -t 203.0.113.10:80 -s rr",
        "-a -t 203.0.113.10:80 -r 198.19.1.11:8080 -m",
        "-a -t 203.0.113.10:80 -r 198.19.1.12:8080 -m -w 3",
        "-A -u 198.18.100.53:53 -s rr",
        "-a -u 198.18.100.53:53 -r 198.19.1.11:53 -m",
        "-A -t [2001:db8::10]:443 -s wrr",
        "-a -t [2001:db8::10]:443 -r [2001:db8::11]:8443 -m",
        "-A -f 7 -s rr",
        "-a -f 7 -r 198.19.1.11 -g",
    ] {
        let mut v = vec!["ip", "netns", "exec", ns.as_str(), "ipvsadm"];
        v.extend(rule.split_whitespace());
        sh(&v);
    }
    let listing = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "exec", &ns, "ipvsadm", "-Ln"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    eprintln!("ipvsadm -Ln:\n{listing}");

    let (cap, table, empty, enoent) = scratch.run_in(0, || {
        let cap = capture().unwrap().expect("IPVS present");
        let table = read().unwrap().expect("IPVS present");
        let digest = services_digest().unwrap().expect("IPVS present");
        let mut listed = Vec::new();
        for_each_virtual_service(|s| listed.push(s))
            .unwrap()
            .expect("IPVS present");
        // An unknown family: the controller's ENOENT, raw (the helper would turn it
        // into an error).
        let mut sock = netlink_sys::Socket::new(NETLINK_GENERIC).unwrap();
        sock.bind_auto().unwrap();
        let mut req = family_request("CLB_NO_SUCH");
        req.header.flags = netlink_packet_core::NLM_F_REQUEST;
        req.header.sequence_number = 9;
        req.finalize();
        let mut tx = vec![0u8; req.buffer_len()];
        req.serialize(&mut tx);
        sock.send_to(&tx, &netlink_sys::SocketAddr::new(0, 0), 0)
            .unwrap();
        let mut rx = vec![0u8; 4096];
        let n = sock.recv(&mut &mut rx[..], 0).unwrap();
        let enoent = rx[..n].to_vec();
        // The same through the reader's own path: "no such family", typed.
        let mut conn = Connection::open(NETLINK_GENERIC, "test").unwrap();
        let refused = conn
            .request("test", family_request("CLB_NO_SUCH"), false)
            .unwrap_err();
        assert_eq!(refused.kernel_errno(), Some(libc::ENOENT), "{refused}");
        // One service asked for by its key (issue #52's per-question read): found with its
        // scheduler, v4 and v6; another port, or TCP for the UDP service, is absent (ESRCH).
        let Lookup::Found(web) = virtual_service(ip("203.0.113.10"), 80, Proto::Tcp).unwrap()
        else {
            panic!("203.0.113.10:80/tcp is a virtual service here")
        };
        assert_eq!((web.port, web.scheduler.as_str()), (80, "rr"));
        assert!(matches!(
            virtual_service(ip("2001:db8::10"), 443, Proto::Tcp).unwrap(),
            Lookup::Found(s) if s.scheduler == "wrr"
        ));
        assert!(matches!(
            virtual_service(ip("198.18.100.53"), 53, Proto::Udp).unwrap(),
            Lookup::Found(_)
        ));
        for (addr, port, proto) in [
            ("203.0.113.10", 81, Proto::Tcp),
            ("198.18.100.53", 53, Proto::Tcp),
            ("2001:db8::10", 80, Proto::Tcp),
        ] {
            assert_eq!(
                virtual_service(ip(addr), port, proto).unwrap(),
                Lookup::Absent,
                "{addr}:{port}/{proto:?}"
            );
        }
        // Empty table: flush, then dump again.
        sh(&["ipvsadm", "-C"]);
        let empty = capture().unwrap().expect("IPVS present");
        assert_eq!(services_digest().unwrap(), Some(empty_digest()));
        (cap, (table, digest, listed), empty, enoent)
    });
    let (table, digest, listed) = table;
    let decoded = decode_capture(&cap).unwrap();
    check(&decoded);
    assert_eq!(table.services.len(), 5);
    // The streamed read and digest (decoded as the replies arrive) are what the held replies
    // give.
    assert_eq!(table, table_from(&decoded));
    let services: Vec<IpvsService> = decoded.iter().map(|(s, _)| s.clone()).collect();
    assert_eq!(digest, digest_of(&services));
    assert_eq!(listed, services);
    assert_ne!(digest, empty_digest());
    assert!(empty.dests.is_empty());
    assert!(parse_services(&empty.services).unwrap().is_empty());
    assert!(parse_family_id(&enoent).is_err());
    if let Some(dir) = std::env::var_os("CLB_IPVS_CAPTURE") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("family.bin"), &cap.family).unwrap();
        std::fs::write(dir.join("services.bin"), &cap.services).unwrap();
        for (i, d) in cap.dests.iter().enumerate() {
            std::fs::write(dir.join(format!("dests-{i}.bin")), d).unwrap();
        }
        std::fs::write(dir.join("services-empty.bin"), &empty.services).unwrap();
        std::fs::write(dir.join("family-enoent.bin"), &enoent).unwrap();
        std::fs::write(dir.join("ipvsadm-Ln.txt"), &listing).unwrap();
        eprintln!("captured into {}", dir.display());
    }
}
