//! Unit tests of `self_loop.rs`'s pure helpers: what the node facts say is missing, and which
//! Service a self-call went through (the end-to-end cases are in `self_loop_tests.rs`).

use probe_contract::Proto;

use super::*;
use crate::state::{BridgePort, ServiceEntry};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_pods_namespace_means_the_snat_and_a_bridge_port_its_hairpin_mode() {
    let port = |hairpin_mode| BridgePort {
        bridge: "cbr0".into(),
        port: "veth1".into(),
        hairpin_mode,
    };
    let facts = SelfLoopFacts {
        loop_back_entry: Some(false),
        bridge_port: Some(port(false)),
        br_netfilter: Some(true),
    };
    // Dead in the pod: the packet got past the bridge, the SNAT is what was missing.
    assert_eq!(
        missing_piece(true, &facts),
        Missing::HairpinSnat {
            loop_back_entry: Some(false)
        }
    );
    assert_eq!(
        missing_piece(false, &facts),
        Missing::HairpinMode {
            bridge: "cbr0".into(),
            port: "veth1".into(),
            br_netfilter: Some(true)
        }
    );
    let on = SelfLoopFacts {
        bridge_port: Some(port(true)),
        ..facts.clone()
    };
    assert_eq!(missing_piece(false, &on), Missing::Undetermined);
    assert_eq!(
        missing_piece(false, &SelfLoopFacts::default()),
        Missing::Undetermined
    );
}

#[test]
fn the_service_is_conntracks_original_destination_else_the_endpoints_only_service() {
    let svc = |vip: &str, port, name: &str, backends: &[&str]| ServiceEntry {
        vip: ip(vip),
        port,
        proto: Proto::Tcp,
        service: Some(name.into()),
        backends: backends.iter().map(|b| b.to_string()).collect(),
    };
    let mut table = ServiceTable {
        services: vec![
            svc(
                "198.18.100.10",
                80,
                "default/web:http",
                &["198.19.1.11:8080"],
            ),
            svc(
                "198.18.100.20",
                80,
                "default/api:http",
                &["198.19.1.12:8080"],
            ),
        ],
        ..ServiceTable::default()
    };
    let pod = ip("198.19.1.11");
    let t = |src, sport, dst, dport| Tuple {
        src: ip(src),
        sport,
        dst: ip(dst),
        dport,
        proto: Proto::Tcp,
    };
    let entry = ConntrackEntry {
        orig: t("198.19.1.11", 40000, "198.18.100.10", 80),
        reply: t("198.19.1.11", 8080, "198.19.1.11", 40000),
        snat: false,
        dnat: true,
        seen_reply: false,
        assured: false,
        tcp_state: Some("SYN_SENT".into()),
        timeout_s: None,
    };
    assert_eq!(
        called_service(&table, Some(&entry), pod, 8080, Proto::Tcp),
        (
            Some((ip("198.18.100.10"), 80)),
            Some("default/web:http".into())
        )
    );
    assert_eq!(
        called_service(&table, None, pod, 8080, Proto::Tcp),
        (
            Some((ip("198.18.100.10"), 80)),
            Some("default/web:http".into())
        )
    );
    // Two addresses of one Service with the endpoint: the Service, not the address.
    table.services.push(svc(
        "203.0.113.10",
        80,
        "default/web:http",
        &["198.19.1.11:8080"],
    ));
    assert_eq!(
        called_service(&table, None, pod, 8080, Proto::Tcp),
        (None, Some("default/web:http".into()))
    );
    // Two Services with it: neither.
    table.services.push(svc(
        "198.18.100.30",
        81,
        "default/other:http",
        &["198.19.1.11:8080"],
    ));
    assert_eq!(
        called_service(&table, None, pod, 8080, Proto::Tcp),
        (None, None)
    );
    assert_eq!(
        called_service(&table, None, pod, 9090, Proto::Tcp),
        (None, None)
    );
}
