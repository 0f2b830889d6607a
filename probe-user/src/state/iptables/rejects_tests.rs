//! kube-proxy's REJECTs of Service ports without endpoints (filter `KUBE-SERVICES`), read
//! into the table's `no_endpoint_rejects`: what names a UDP Service scaled to zero for
//! `stale_udp_conntrack`.

use std::net::IpAddr;

use probe_contract::Proto;

use super::{merge, parse_no_endpoint_rejects};
use crate::state::{NoEndpointReject, ServiceTable};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// kube-proxy's own line shape (`pkg/proxy/iptables/proxier_test.go`'s expected filter
/// table: `-m comment`, `-m <proto> -p <proto>`, `-d` without a prefix length), the same as
/// `iptables -S` prints it after a restore, an IPv6 one, and lines that are not ours.
const FILTER: &str = r#"-N KUBE-SERVICES
-A KUBE-SERVICES -m comment --comment "monitoring/statsd:statsd has no endpoints" -m udp -p udp -d 172.30.0.46 --dport 8125 -j REJECT
[4:240] -A KUBE-SERVICES -d 172.30.0.47/32 -p tcp -m comment --comment "ns7/svc7:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-SERVICES -d fd00:10:96::53/128 -p udp -m comment --comment "kube-system/dns6:dns has no endpoints" -m udp --dport 53 -j REJECT --reject-with icmp6-port-unreachable
-A KUBE-SERVICES -d 172.30.0.48/32 -p tcp -m comment --comment "ns8/svc8:p80 has no local endpoints" -m tcp --dport 80 -j DROP
-A KUBE-SERVICES -d 172.30.0.49/32 -p tcp -m comment --comment "ns9/svc9:p80 has no endpoints" -m tcp -j REJECT
-A KUBE-EXTERNAL-SERVICES -d 203.0.113.11/32 -p tcp -m comment --comment "ns10/svc10:http has no endpoints" -m tcp --dport 80 -j REJECT
"#;

#[test]
fn no_endpoint_rejects_are_read_with_the_service_their_comment_names() {
    let rejects = parse_no_endpoint_rejects(FILTER);
    let want = |addr: &str, proto, port, service: &str| NoEndpointReject {
        addr: ip(addr),
        proto,
        port,
        service: service.into(),
    };
    assert_eq!(
        rejects,
        [
            want("172.30.0.46", Proto::Udp, 8125, "monitoring/statsd:statsd"),
            want("172.30.0.47", Proto::Tcp, 80, "ns7/svc7:p80"),
            want("fd00:10:96::53", Proto::Udp, 53, "kube-system/dns6:dns"),
        ],
        "an ITP Local drop, a rule without a port and another chain's reject are not ours"
    );
}

#[test]
fn merging_two_families_keeps_each_reject_once() {
    let rejects = parse_no_endpoint_rejects(FILTER);
    let mut table = ServiceTable {
        no_endpoint_rejects: rejects.clone(),
        ..ServiceTable::default()
    };
    merge(
        &mut table,
        ServiceTable {
            no_endpoint_rejects: rejects.clone(),
            ..ServiceTable::default()
        },
    );
    assert_eq!(table.no_endpoint_rejects, rejects);
    assert!(
        table
            .no_endpoint_reject(ip("172.30.0.46"), 8125, Proto::Udp)
            .is_some()
    );
    assert!(
        table
            .no_endpoint_reject(ip("172.30.0.46"), 8125, Proto::Tcp)
            .is_none()
    );
}
