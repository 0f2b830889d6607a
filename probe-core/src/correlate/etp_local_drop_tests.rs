//! `etp_local_drop` without a kernel: kube-proxy's nftables `no-endpoint-services` drop, and
//! its iptables `KUBE-EXTERNAL-SERVICES` drop, of a pod's call to an ETP Local LB IP,
//! confirmed from the drop (reason or site) and the drop in the service table, naming the
//! local-traffic detector the pod missed in iptables mode; every twin stays silent.

use probe_contract::facts::{Etp, ProxyMode};

use super::{
    tests::{
        MS, NODE, POD, S, assert_dropped_pod_call, assert_mentions, assert_none_confirmed,
        corr_with, drop_ev, invariants, ip, only_report, pkt, table,
    },
    *,
};
use crate::state::{NoEndpointDrop, PodShortCircuit, ServiceEntry, ServiceSource};

/// An LB IP of `default/web-local` (ETP Local) with no endpoint on this node.
const LB_IP: &str = "203.0.113.10";
const PORT: u16 = 8445;

/// The nftables-mode table: the LB IP:port in `service-ips` (endpoints elsewhere) and, with
/// `dropped`, in `no-endpoint-services` with verdict drop.
fn nft_table(dropped: bool) -> ServiceTable {
    let mut t = table();
    t.source = Some(ServiceSource::Nftables);
    t.services.push(ServiceEntry {
        vip: ip(LB_IP),
        port: PORT,
        proto: Proto::Tcp,
        service: Some("default/web-local:http".into()),
        backends: vec!["198.19.2.10:30080".into()],
    });
    if dropped {
        t.no_endpoint_drops.push(NoEndpointDrop {
            addr: ip(LB_IP),
            proto: Proto::Tcp,
            port: PORT,
            service: Some("default/web-local:http".into()),
        });
    }
    t
}

/// pod -> LB IP:8445 (the LB IP is not local: no tag).
fn call(sport: u16) -> Packet {
    pkt(POD, sport, LB_IP, PORT, Some(Tag::Pod), None)
}

/// The forward hook's drop as the kernel reports it: on the pod's veth, NETFILTER_DROP (6.x)
/// or, without reasons (< 5.17), only the site.
fn nf_drop(ts: u64, p: &Packet, reason: &str) -> KernelEvent {
    let (code, site) = match reason {
        "NETFILTER_DROP" => (7, "nf_hook_slow+0xa5"),
        DropReason::UNREPORTED => (0, "nf_hook_slow+0xa5"),
        _ => (1, "nf_hook_slow+0xa5"),
    };
    let mut ev = drop_ev(ts, p, reason, code, Some(site));
    if let KernelEvent::Drop { iface, .. } = &mut ev {
        *iface = Some("veth-pod-a".into());
    }
    ev
}

#[test]
fn a_pods_call_dropped_by_the_no_endpoint_element_is_confirmed_with_the_rule() {
    // 6.x names the reason; 6.1 the same; kernels before 5.17 give only the site.
    for reason in ["NETFILTER_DROP", DropReason::UNREPORTED] {
        let mut c = corr_with(nft_table(true));
        let r = only_report(&c.ingest(nf_drop(S, &call(40000), reason)));
        let e = &r.event;
        assert_dropped_pod_call(
            e,
            LoopbackKind::EtpLocalDrop,
            &format!("etp_local_drop/{LB_IP}:{PORT}/tcp"),
            (LB_IP, PORT),
            reason,
        );
        assert_eq!(e.drop_reason.as_deref(), Some("NETFILTER_DROP"));
        assert_eq!(e.service.as_deref(), Some("default/web-local"));
        assert_eq!(e.facts.etp_rules, Some(Etp::Local));
        let ev = e.evidence.join("\n");
        assert!(
            ev.contains(&format!(
                "map no-endpoint-services has the element {LB_IP} . tcp . {PORT} comment \
                 \"default/web-local:http\" : drop"
            )),
            "{ev}"
        );
        assert!(
            ev.contains("none of them on this node: 198.19.2.10:30080"),
            "{ev}"
        );
        if reason == DropReason::UNREPORTED {
            assert!(ev.contains("inferred from the drop site"), "{ev}");
        }
        assert_mentions(
            &e.remedy,
            &[
                "kubernetes#131765",
                "kubernetes#132456",
                "#133969",
                "1.29 to 1.32",
                "set externalTrafficPolicy: Cluster",
                "an endpoint of Service default/web-local on every node",
                "local-traffic detector",
            ],
        );
        assert_eq!(c.stats().confirmed.etp_local_drop, 1);
        invariants(&c);
    }
}

#[test]
fn repeats_fold_into_one_aggregate_whoever_calls() {
    let mut c = corr_with(nft_table(true));
    let first = only_report(&c.ingest(nf_drop(S, &call(40000), "NETFILTER_DROP")));
    let other = pkt("198.18.1.9", 40001, LB_IP, PORT, Some(Tag::Pod), None);
    let again = only_report(&c.ingest(nf_drop(S + 100 * MS, &other, "NETFILTER_DROP")));
    assert!(first.is_new && !again.is_new);
    assert_eq!(again.event.count, 2);
    assert_eq!(again.event.src, ip("198.18.1.9"), "the latest caller");
    invariants(&c);
}

/// What must stay silent: each case is one drop the kind must not claim.
#[test]
fn twins_confirm_nothing() {
    let udp = Packet {
        proto: Proto::Udp,
        ..call(40000)
    };
    let cases: Vec<(&str, ServiceTable, KernelEvent)> = vec![
        (
            "no drop element (a local endpoint, ETP Cluster, or a fixed rule set)",
            nft_table(false),
            nf_drop(S, &call(40000), "NETFILTER_DROP"),
        ),
        (
            "another port of the same LB IP",
            nft_table(true),
            nf_drop(
                S,
                &pkt(POD, 40000, LB_IP, 443, Some(Tag::Pod), None),
                "NETFILTER_DROP",
            ),
        ),
        (
            "another protocol on the element's port",
            nft_table(true),
            nf_drop(S, &udp, "NETFILTER_DROP"),
        ),
        (
            "not a netfilter drop (a route or neighbour failure on the way out)",
            nft_table(true),
            drop_ev(
                S,
                &call(40000),
                "NEIGH_FAILED",
                70,
                Some("neigh_invalidate+0x8c"),
            ),
        ),
        (
            "NOT_SPECIFIED away from netfilter",
            nft_table(true),
            drop_ev(
                S,
                &call(40000),
                "NOT_SPECIFIED",
                2,
                Some("sk_stream_kill_queues+0x50"),
            ),
        ),
        (
            "an outside source (not ours: kube-proxy's drop of outside traffic is the policy)",
            nft_table(true),
            nf_drop(
                S,
                &pkt("198.51.100.7", 40000, LB_IP, PORT, None, None),
                "NETFILTER_DROP",
            ),
        ),
    ];
    assert_none_confirmed(cases);
}

#[test]
fn the_nodes_own_call_is_named_as_a_host_network_caller() {
    let mut c = corr_with(nft_table(true));
    let p = pkt(NODE, 40000, LB_IP, PORT, Some(Tag::Node), None);
    let r = only_report(&c.ingest(nf_drop(S, &p, "NETFILTER_DROP")));
    assert_eq!(r.event.kind, LoopbackKind::EtpLocalDrop);
    assert!(
        r.event.remedy[0].contains("a host-network caller on this node"),
        "{:?}",
        r.event.remedy
    );
}

/// The drop program's report of the node's own call: no interface (it was dropped at the
/// output hook, before it had a device), on 6.x with its reason, before 5.17 by its site.
fn output_drop(ts: u64, p: &Packet, reason: &str) -> KernelEvent {
    let mut ev = nf_drop(ts, p, reason);
    if let KernelEvent::Drop { iface, .. } = &mut ev {
        *iface = None;
    }
    ev
}

#[test]
fn the_nodes_own_call_dropped_on_its_way_out_says_the_caller_is_the_node() {
    for reason in ["NETFILTER_DROP", DropReason::UNREPORTED] {
        let mut c = corr_with(nft_table(true));
        let p = pkt(NODE, 40000, LB_IP, PORT, Some(Tag::Node), None);
        let r = only_report(&c.ingest(output_drop(S, &p, reason)));
        let e = &r.event;
        assert_eq!(e.kind, LoopbackKind::EtpLocalDrop, "{reason}");
        assert_eq!(e.src, ip(NODE));
        assert_eq!(e.facts.source, probe_contract::facts::SourceKind::Node);
        assert_eq!(e.nic, None);
        let ev = e.evidence.join("\n");
        assert!(
            ev.contains(&format!(
                "the caller is this node: {NODE} is a node address and the packet came in on \
                 no interface"
            )),
            "{ev}"
        );
        assert!(ev.contains("before kubernetes#132456"), "{ev}");
        assert!(ev.contains("no-endpoint-services has the element"), "{ev}");
        invariants(&c);
    }
    // A pod's call names no host caller.
    let mut c = corr_with(nft_table(true));
    let r = only_report(&c.ingest(nf_drop(S, &call(40001), "NETFILTER_DROP")));
    assert!(
        !r.event
            .evidence
            .join("\n")
            .contains("the caller is this node"),
        "{:?}",
        r.event.evidence
    );
}

#[test]
fn the_nodes_own_call_to_an_lb_ip_without_the_drop_element_is_not_confirmed() {
    let mut c = corr_with(nft_table(false));
    let p = pkt(NODE, 40000, LB_IP, PORT, Some(Tag::Node), None);
    let out = c.ingest(output_drop(S, &p, "NETFILTER_DROP"));
    assert!(
        !out.iter().any(|o| matches!(o, Output::Report(_))),
        "{out:?}"
    );
}

/// The iptables-mode table read from the rules: the same LB IP:port with the
/// `KUBE-EXTERNAL-SERVICES` drop, and with `detector` the external chain's pod short circuit.
fn iptables_table(detector: Option<&str>) -> ServiceTable {
    let mut t = nft_table(true);
    t.source = Some(ServiceSource::Iptables);
    if let Some(d) = detector {
        t.pod_short_circuits.push(PodShortCircuit {
            addr: ip(LB_IP),
            proto: Proto::Tcp,
            port: PORT,
            chain: "KUBE-EXT-MW3VTDQOVRN3LBGC".into(),
            detector: d.into(),
        });
    }
    t
}

fn confirmed_in(t: ServiceTable) -> LoopbackEvent {
    let mut c = corr_with(t);
    let r = only_report(&c.ingest(nf_drop(S, &call(40000), "NETFILTER_DROP")));
    assert_eq!(c.stats().confirmed.etp_local_drop, 1);
    invariants(&c);
    r.event
}

#[test]
fn iptables_modes_drop_is_confirmed_with_the_external_services_rule() {
    let e = confirmed_in(iptables_table(None));
    assert_eq!(e.kind, LoopbackKind::EtpLocalDrop);
    assert_eq!(e.service.as_deref(), Some("default/web-local"));
    assert_eq!(e.facts.proxy_mode, Some(ProxyMode::Iptables));
    let ev = e.evidence.join("\n");
    assert!(
        ev.contains(&format!(
            "chain KUBE-EXTERNAL-SERVICES has -d {LB_IP}/32 -p tcp --dport {PORT} -m comment \
             --comment \"default/web-local:http has no local endpoints\" -j DROP"
        )),
        "{ev}"
    );
    assert!(!ev.contains("no-endpoint-services"), "{ev}");
    assert!(
        ev.contains("kube-proxy has no local-traffic detector"),
        "{ev}"
    );
    let remedy = e.remedy.join("\n");
    assert_mentions(
        &e.remedy,
        &[
            "in iptables mode its filter chain KUBE-EXTERNAL-SERVICES",
            "kube-proxy here has no local-traffic detector",
            "Give kube-proxy a local-traffic detector",
            "1.33.6, 1.34.2 and 1.35, kubernetes#134024",
            "set externalTrafficPolicy: Cluster",
        ],
    );
    assert!(!remedy.contains("no-endpoint-services"), "{remedy}");
    assert!(
        !remedy.contains("kubernetes#132456"),
        "not an nftables fix: {remedy}"
    );
    let cause = super::etp_local_drop::cause(&e);
    assert!(
        cause.ends_with("in iptables mode, whose kube-proxy has no local-traffic detector."),
        "{cause}"
    );
}

#[test]
fn a_cidr_detector_that_misses_the_pod_is_named_with_the_pod() {
    // The detector covers another pool (198.19.0.0/16); the pod is in 198.18.1.0/24.
    let e = confirmed_in(iptables_table(Some("-s 198.19.0.0/16")));
    let ev = e.evidence.join("\n");
    assert!(
        ev.contains(&format!(
            "kube-proxy's local-traffic detector `-s 198.19.0.0/16` (chain \
             KUBE-EXT-MW3VTDQOVRN3LBGC sends only the pods it matches to the cluster-wide \
             endpoints: rule \"pod traffic for ... external destinations\"): the pod {POD} is \
             outside it"
        )),
        "{ev}"
    );
    assert_mentions(
        &e.remedy,
        &[
            &format!(
                "Its detector here is `-s 198.19.0.0/16`, and it does not match the pod {POD}"
            ),
            "kubernetes#112820",
            &format!("--cluster-cidr must cover {POD}"),
            "--detect-local-mode InterfaceNamePrefix",
            "from 1.33.6, 1.34.2 and 1.35, kubernetes#134024",
        ],
    );
    let cause = super::etp_local_drop::cause(&e);
    assert!(
        cause.contains("its local-traffic detector (-s 198.19.0.0/16) missed the pod"),
        "{cause}"
    );
}

#[test]
fn an_interface_detector_that_misses_the_pod_is_named_with_the_interface() {
    let e = confirmed_in(iptables_table(Some("-i cali+")));
    let ev = e.evidence.join("\n");
    assert!(
        ev.contains("detector `-i cali+`")
            && ev.contains(&format!("did not match the pod {POD}'s interface")),
        "{ev}"
    );
    assert_mentions(
        &e.remedy,
        &[
            "--pod-interface-name-prefix or --pod-bridge-interface must name the interface of the pod",
            "(the drop was seen on veth-pod-a)",
        ],
    );
}

#[test]
fn the_apis_table_names_no_detector() {
    // From the API the nat rules are not read: whether a detector exists is not known.
    let mut t = iptables_table(None);
    t.from_api = true;
    let e = confirmed_in(t);
    assert!(
        !e.evidence.join("\n").contains("local-traffic detector"),
        "{:?}",
        e.evidence
    );
    let remedy = e.remedy.join("\n");
    assert!(
        remedy.contains("Give kube-proxy a local-traffic detector"),
        "{remedy}"
    );
    assert!(
        !remedy.contains("has no local-traffic detector"),
        "{remedy}"
    );
}

#[test]
fn a_short_circuit_matches_by_source_within_its_prefix_only() {
    let short = |d: &str| PodShortCircuit {
        addr: ip(LB_IP),
        proto: Proto::Tcp,
        port: PORT,
        chain: "KUBE-EXT-X".into(),
        detector: d.into(),
    };
    for (detector, src, expected) in [
        ("-s 198.19.0.0/16", "198.19.255.1", Some(true)),
        ("-s 198.19.0.0/16", "198.20.0.1", Some(false)),
        ("-s 10.0.0.0/8", "fd00::1", Some(false)),
        ("-s fd00:10::/64", "fd00:10::5", Some(true)),
        ("-s fd00:10::/64", "fd00:11::5", Some(false)),
        ("-s 0.0.0.0/0", "203.0.113.1", Some(true)),
        ("-s 198.19.1.10/32", "198.19.1.10", Some(true)),
        ("-s 198.19.1.10", "198.19.1.11", Some(false)),
        ("-i veth+", "198.19.1.10", None),
        ("-s not-an-address/8", "198.19.1.10", None),
    ] {
        assert_eq!(
            short(detector).matches_source(ip(src)),
            expected,
            "{detector} {src}"
        );
    }
}
