//! `stale_udp_conntrack` for a UDP Service scaled to zero in kube-proxy's iptables mode
//! (kubernetes#139628): no nat chain, so no entry in the table's services; the Service is
//! named from kube-proxy's REJECT rule "<svc> has no endpoints" and an entry still DNATed to
//! its old endpoint is stale.

use std::collections::HashMap;

use probe_contract::Proto;

use super::{
    stale_udp::{confirm, dump_ips},
    stale_udp_tests::{CLUSTER_IP, OLD, SENDER},
    tests::{S, assert_mentions, ip},
};
use crate::state::{ConntrackEntry, NoEndpointReject, ServiceTable, Tuple};

/// The statsd Service scaled to zero: only kube-proxy's REJECT rule names it.
fn scaled_to_zero(proto: Proto) -> ServiceTable {
    ServiceTable {
        no_endpoint_rejects: vec![NoEndpointReject {
            addr: ip(CLUSTER_IP),
            proto,
            port: 8125,
            service: "monitoring/statsd:statsd".into(),
        }],
        ..ServiceTable::default()
    }
}

/// The sender's UDP entry to the ClusterIP, sent to `to` (the ClusterIP itself: no DNAT).
fn entry(to: &str, timeout_s: u32) -> ConntrackEntry {
    let tuple = |src: &str, dst: &str, sport, dport| Tuple {
        src: ip(src),
        dst: ip(dst),
        sport,
        dport,
        proto: Proto::Udp,
    };
    ConntrackEntry {
        orig: tuple(SENDER, CLUSTER_IP, 40000, 8125),
        reply: tuple(to, SENDER, 8125, 40000),
        snat: false,
        dnat: to != CLUSTER_IP,
        seen_reply: false,
        assured: false,
        tcp_state: None,
        timeout_s: Some(timeout_s),
    }
}

/// Two dumps 5 s apart, the entry refreshed between them; what the second confirms.
fn confirmed(t: &ServiceTable, to: &str) -> Vec<super::stale_udp::StaleUdp> {
    let (_, seen) = confirm(&[entry(to, 29)], t, &HashMap::new(), 100 * S);
    confirm(&[entry(to, 30)], t, &seen, 105 * S).0
}

#[test]
fn a_dnated_entry_to_a_service_kube_proxy_rejects_is_named_from_the_reject_rule() {
    let got = confirmed(&scaled_to_zero(Proto::Udp), OLD);
    let [r] = got.as_slice() else {
        panic!("one: {got:#?}")
    };
    assert_eq!(r.service, "monitoring/statsd:statsd");
    assert_eq!(r.sent_to, (ip(OLD), 8125));
    assert_mentions(
        &r.evidence,
        &[
            "DNATed to 198.19.1.20:8125, which is no endpoint of it now",
            "current endpoints: none",
            "KUBE-SERVICES (filter) REJECTs 10.96.0.50:8125/udp: \"monitoring/statsd:statsd has no endpoints\"",
        ],
    );
}

#[test]
fn its_ip_is_dumped_and_its_twins_are_silent() {
    let t = scaled_to_zero(Proto::Udp);
    assert_eq!(dump_ips(&t), vec![ip(CLUSTER_IP)]);
    // Not DNATed: the Service has no endpoint to send it to instead.
    assert!(confirmed(&t, CLUSTER_IP).is_empty());
    // A TCP Service's REJECT names no UDP Service, and is not dumped.
    let tcp = scaled_to_zero(Proto::Tcp);
    assert!(dump_ips(&tcp).is_empty());
    assert!(confirmed(&tcp, OLD).is_empty());
    // Neither listed: not named, not reported.
    assert!(confirmed(&ServiceTable::default(), OLD).is_empty());
}
