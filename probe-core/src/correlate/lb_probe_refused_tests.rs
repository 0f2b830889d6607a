//! `lb_probe_refused` without a kernel: the LB's probe to :10256 or a healthCheckNodePort,
//! refused or dropped on the node, confirmed with the provider's range and the port's owner;
//! every twin stays silent.

use super::{
    lb_probe_refused::{KUBE_PROXY_HEALTHZ_PORT, probe_source_of, watched_probe_ports},
    tests::{
        NODE, S, assert_mentions, drop_ev, invariants, ip, node_to_itself, only_report, pkt,
        reports, table,
    },
    *,
};
use crate::state::HealthCheckPort;

/// A GCE health checker's address (35.191.0.0/16).
const GCE_PROBE: &str = "35.191.0.10";
const HC_PORT: u16 = 32000;

fn corr() -> Correlator {
    let mut t = table();
    t.health_checks.push(HealthCheckPort {
        port: HC_PORT,
        service: "shop/web".into(),
    });
    let mut c = Correlator::new(CorrelatorConfig::default());
    c.set_services(t);
    c.set_nics(vec!["eth0".into()]);
    c
}

fn probe(src: &str, port: u16) -> Packet {
    pkt(src, 40000, NODE, port, None, Some(Tag::Node))
}

fn no_socket(ts: u64, p: &Packet) -> KernelEvent {
    drop_ev(ts, p, "NO_SOCKET", 2, Some("tcp_v4_rcv+0x1a0"))
}

#[test]
fn a_refused_healthz_probe_from_gce_is_confirmed_with_its_range_and_remedy() {
    let mut c = corr();
    let r = only_report(&c.ingest(no_socket(S, &probe(GCE_PROBE, KUBE_PROXY_HEALTHZ_PORT))));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::LbProbeRefused);
    assert_eq!(e.key, format!("lb_probe_refused/{NODE}:10256/tcp"));
    assert_eq!(e.outcome, probe_contract::Outcome::Refused);
    assert_eq!(e.vip, None);
    assert_eq!(e.service, None);
    assert_mentions(
        &e.evidence,
        &[
            "kube-proxy's healthz port",
            "Google Cloud's documented probe range 35.191.0.0/16",
            "nothing listens there",
        ],
    );
    assert_mentions(
        &e.remedy,
        &[
            "healthzBindAddress",
            "kubeProxyReplacementHealthzBindAddr",
            "Google Cloud's probe range 35.191.0.0/16",
        ],
    );
    assert_eq!(c.stats().confirmed.lb_probe_refused, 1);
    invariants(&c);
}

#[test]
fn a_healthcheck_node_port_probe_names_its_service_and_repeats_fold() {
    let mut c = corr();
    only_report(&c.ingest(no_socket(S, &probe(GCE_PROBE, HC_PORT))));
    // Another checker of the same range, the same port: one loop, counted twice.
    let r = only_report(&c.ingest(no_socket(2 * S, &probe("35.191.3.4", HC_PORT))));
    assert_eq!(r.event.count, 2);
    assert_eq!(r.event.service.as_deref(), Some("shop/web"));
    assert!(
        r.event
            .evidence
            .join("\n")
            .contains("the healthCheckNodePort of shop/web"),
        "{:?}",
        r.event.evidence
    );
    invariants(&c);
}

#[test]
fn a_firewall_drop_of_azures_probe_says_to_allow_its_address() {
    let mut c = corr();
    let p = probe("168.63.129.16", KUBE_PROXY_HEALTHZ_PORT);
    let r = only_report(&c.ingest(drop_ev(
        S,
        &p,
        "NETFILTER_DROP",
        7,
        Some("nf_hook_slow+0xa5"),
    )));
    assert_eq!(r.event.outcome, probe_contract::Outcome::Dropped);
    let remedy = r.event.remedy.join("\n");
    assert!(
        remedy.contains("allow TCP 10256 from 168.63.129.16/32"),
        "{remedy}"
    );
    let cause = (kind_texts(LoopbackKind::LbProbeRefused).cause)(&r.event);
    assert!(cause.contains("dropped by a firewall rule"), "{cause}");
}

#[test]
fn a_probe_from_no_known_range_is_from_outside_the_node() {
    let mut c = corr();
    let r = only_report(&c.ingest(no_socket(S, &probe("10.0.5.9", KUBE_PROXY_HEALTHZ_PORT))));
    assert!(
        r.event
            .evidence
            .join("\n")
            .contains("from outside the node"),
        "{:?}",
        r.event.evidence
    );
}

#[test]
fn twins_stay_silent() {
    let mut c = corr();
    // A port no LB probes; a late ACK of a closed check; a node's own call (tagged source);
    // a probe that came in through no monitored NIC.
    let other_port = probe(GCE_PROBE, 10250);
    let mut late_ack = probe(GCE_PROBE, KUBE_PROXY_HEALTHZ_PORT);
    late_ack.tcp_flags = probe_contract::record::tcp_flags::ACK;
    let node_call = node_to_itself(40000, KUBE_PROXY_HEALTHZ_PORT);
    for (i, p) in [other_port, late_ack, node_call].iter().enumerate() {
        let outs = c.ingest(no_socket(S + i as u64, p));
        assert!(reports(&outs).is_empty(), "{p:?}: {outs:?}");
    }
    let mut ev = no_socket(5 * S, &probe(GCE_PROBE, HC_PORT));
    if let KernelEvent::Drop { iface, .. } = &mut ev {
        *iface = Some("cni0".into());
    }
    assert!(reports(&c.ingest(ev)).is_empty());
    assert_eq!(c.stats().confirmed, KindCounts::default());
    invariants(&c);
}

#[test]
fn without_api_access_only_healthz_is_watched() {
    assert_eq!(watched_probe_ports(&table()), vec![KUBE_PROXY_HEALTHZ_PORT]);
    let mut t = table();
    t.health_checks.push(HealthCheckPort {
        port: HC_PORT,
        service: "shop/web".into(),
    });
    assert_eq!(
        watched_probe_ports(&t),
        vec![KUBE_PROXY_HEALTHZ_PORT, HC_PORT]
    );
}

#[test]
fn provider_ranges_hold_their_documented_probe_sources() {
    for (src, provider) in [
        ("35.191.200.1", Some("Google Cloud")),
        ("130.211.3.255", Some("Google Cloud")),
        ("130.211.4.0", None),
        ("168.63.129.16", Some("Azure")),
        ("fe80::1234:5678:9abc", Some("Azure")),
        ("fe80::1", None),
    ] {
        assert_eq!(
            probe_source_of(ip(src)).map(|s| s.provider),
            provider,
            "{src}"
        );
    }
}
