//! `source_ranges_drop` without a kernel: kube-proxy's nftables `firewall-ips` drop of a pod's
//! (or the node's) call to a LB IP whose Service sets `loadBalancerSourceRanges`, confirmed
//! from the drop and the firewall entry in the service table; every twin stays silent.

use probe_contract::facts::ProxyMode;

use super::{
    tests::{
        MS, NODE, POD, S, assert_dropped_pod_call, assert_mentions, assert_none_confirmed,
        corr_with, drop_ev, invariants, ip, only_report, pkt, table,
    },
    *,
};
use crate::state::{FirewallEntry, ServiceSource, SourceRange};

/// An LB IP of `default/web` with `loadBalancerSourceRanges: [192.0.2.0/24]`.
const LB_IP: &str = "203.0.113.10";
const PORT: u16 = 80;

/// The firewall entry of `lb`:PORT/tcp allowing `allowed`, naming no Service and no chain
/// (as IPVS mode's sets read).
fn fw_entry(lb: &str, allowed: &[&str]) -> FirewallEntry {
    FirewallEntry {
        addr: ip(lb),
        proto: Proto::Tcp,
        port: PORT,
        service: None,
        chain: None,
        allowed: allowed
            .iter()
            .map(|r| SourceRange::parse(r).unwrap())
            .collect(),
    }
}

/// The nftables-mode table with the LB IP:port in `firewall-ips`, allowing `allowed`.
fn fw_table(allowed: &[&str]) -> ServiceTable {
    let mut t = table();
    t.source = Some(ServiceSource::Nftables);
    t.firewall.push(FirewallEntry {
        service: Some("default/web:http".into()),
        chain: Some("firewall-SUSTUHLJ-default/web/tcp/http".into()),
        ..fw_entry(LB_IP, allowed)
    });
    t
}

fn call(src: &str, tag: Tag, port: u16) -> Packet {
    pkt(src, 40000, LB_IP, port, Some(tag), None)
}

/// The prerouting (or output) hook's drop: NETFILTER_DROP, or only the site before 5.17.
fn nf_drop(ts: u64, p: &Packet, reason: &str) -> KernelEvent {
    let code = if reason == "NETFILTER_DROP" { 7 } else { 0 };
    drop_ev(ts, p, reason, code, Some("nf_hook_slow+0xa5"))
}

#[test]
fn a_pods_call_from_outside_the_ranges_is_confirmed_with_the_firewall_entry() {
    for reason in ["NETFILTER_DROP", DropReason::UNREPORTED] {
        let mut c = corr_with(fw_table(&["192.0.2.0/24"]));
        let r = only_report(&c.ingest(nf_drop(S, &call(POD, Tag::Pod, PORT), reason)));
        let e = &r.event;
        assert_dropped_pod_call(
            e,
            LoopbackKind::SourceRangesDrop,
            &format!("source_ranges_drop/{LB_IP}:{PORT}/tcp"),
            (LB_IP, PORT),
            reason,
        );
        assert_eq!(e.service.as_deref(), Some("default/web"));
        let ev = e.evidence.join("\n");
        assert!(
            ev.contains(&format!(
                "map firewall-ips has the element {LB_IP} . tcp . {PORT} of \
                 default/web:http, whose chain drops every new connection from a source \
                 outside {{ 192.0.2.0/24 }}"
            )),
            "{ev}"
        );
        assert!(ev.contains(&format!("the caller {POD} is in none")), "{ev}");
        assert_mentions(
            &e.remedy,
            &[
                "kubernetes#109575",
                "PR #122614",
                "PR #110289",
                "(192.0.2.0/24)",
                &format!("the pod {POD}"),
                "cluster DNS name or its ClusterIP",
                "add the pod CIDR",
                "security group",
                "ipMode: Proxy",
            ],
        );
        assert_eq!(c.stats().confirmed.source_ranges_drop, 1);
        invariants(&c);
    }
}

/// iptables mode (PR #110289): the entry read from `KUBE-PROXY-FIREWALL` and its `KUBE-FW-*`
/// chain; the evidence quotes the filter rule and names the nat chain, not nftables' map.
#[test]
fn iptables_mode_names_the_proxy_firewall_rule_and_its_fw_chain() {
    let mut t = fw_table(&["192.0.2.0/24"]);
    t.source = Some(ServiceSource::Iptables);
    t.firewall[0].chain = Some("KUBE-FW-CDGGSHYLG3RE2FKL".into());
    let mut c = corr_with(t);
    let r = only_report(&c.ingest(nf_drop(S, &call(POD, Tag::Pod, PORT), "NETFILTER_DROP")));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::SourceRangesDrop);
    assert_eq!(e.facts.proxy_mode, Some(ProxyMode::Iptables));
    let ev = e.evidence.join("\n");
    assert!(
        ev.contains(&format!(
            "kube-proxy's iptables rules (iptables): filter chain KUBE-PROXY-FIREWALL has -d \
             {LB_IP}/32 -p tcp --dport {PORT} -m comment --comment \"default/web:http traffic \
             not accepted by KUBE-FW-CDGGSHYLG3RE2FKL\" -j DROP"
        )),
        "{ev}"
    );
    assert!(
        ev.contains("nat chain KUBE-FW-CDGGSHYLG3RE2FKL sends on (DNATs) only the sources"),
        "{ev}"
    );
    assert!(!ev.contains("firewall-ips"), "{ev}");
    // The remedy reads the ranges back from either mode's line.
    assert!(e.remedy[0].contains("(192.0.2.0/24)"), "{:?}", e.remedy);
    invariants(&c);
}

/// IPVS mode: the entry comes from ipsets, which name no Service; the LB IP's IPVS virtual
/// service (named by the table) names it, and the evidence quotes the sets and chains.
#[test]
fn ipvs_mode_names_the_ipsets_and_the_service_from_the_table() {
    let mut t = fw_table(&["192.0.2.0/24"]);
    t.source = Some(ServiceSource::Ipvs);
    t.firewall[0].service = None;
    t.firewall[0].chain = None;
    t.services.push(crate::state::ServiceEntry {
        vip: ip(LB_IP),
        port: PORT,
        proto: Proto::Tcp,
        service: Some("default/web:http".into()),
        backends: vec!["198.19.1.20:8080".into()],
    });
    let mut c = corr_with(t);
    let r = only_report(&c.ingest(nf_drop(S, &call(POD, Tag::Pod, PORT), "NETFILTER_DROP")));
    let e = &r.event;
    assert_eq!(e.kind, LoopbackKind::SourceRangesDrop);
    assert_eq!(e.service.as_deref(), Some("default/web"));
    assert_eq!(e.facts.proxy_mode, Some(ProxyMode::Ipvs));
    let ev = e.evidence.join("\n");
    assert_mentions(
        &e.evidence,
        &[
            &format!("ipset KUBE-LOAD-BALANCER-FW has {LB_IP},tcp:{PORT}"),
            "KUBE-SOURCE-RANGES-FIREWALL",
            "ipset KUBE-LOAD-BALANCER-SOURCE-CIDR",
            "source outside { 192.0.2.0/24 }",
            "PR #110628",
        ],
    );
    assert!(!ev.contains("firewall-ips"), "{ev}");
    assert!(e.remedy[0].contains("(192.0.2.0/24)"), "{:?}", e.remedy);
    invariants(&c);
}

/// IPVS mode over IPv6: the evidence names the IPv6 proxier's sets (`KUBE-6-`, the CIDR set's
/// name cut to 31 characters), not the IPv4 ones (the VM lab's first run quoted
/// `KUBE-LOAD-BALANCER-SOURCE-IP` for an IPv6 drop).
#[test]
fn ipvs_mode_over_ipv6_names_the_ipv6_sets() {
    let (lb6, pod6) = ("2001:db8:113::10", "2001:db8:19:1::10");
    let mut t = table();
    t.source = Some(ServiceSource::Ipvs);
    t.firewall.push(fw_entry(lb6, &["2001:db8:51::/48"]));
    let mut c = corr_with(t);
    let call6 = pkt(pod6, 40000, lb6, PORT, Some(Tag::Pod), None);
    let r = only_report(&c.ingest(nf_drop(S, &call6, "NETFILTER_DROP")));
    assert_mentions(
        &r.event.evidence,
        &[
            "(ip6tables, ipset)",
            &format!("ipset KUBE-6-LOAD-BALANCER-FW has {lb6},tcp:{PORT}"),
            "ipset KUBE-6-LOAD-BALANCER-SOURCE-CID (and KUBE-6-LOAD-BALANCER-SOURCE-IP)",
            "source outside { 2001:db8:51::/48 }",
        ],
    );
    let ev = r.event.evidence.join("\n");
    assert!(!ev.contains(" KUBE-LOAD-BALANCER"), "{ev}");
    invariants(&c);
}

#[test]
fn the_nodes_call_is_confirmed_and_repeats_fold_into_one_aggregate() {
    let mut c = corr_with(fw_table(&["192.0.2.0/24"]));
    let first = only_report(&c.ingest(nf_drop(S, &call(NODE, Tag::Node, PORT), "NETFILTER_DROP")));
    assert!(
        first.event.remedy[0].contains("a host-network caller on this node"),
        "{:?}",
        first.event.remedy
    );
    let again = only_report(&c.ingest(nf_drop(
        S + 100 * MS,
        &call(POD, Tag::Pod, PORT),
        "NETFILTER_DROP",
    )));
    assert!(first.is_new && !again.is_new);
    assert_eq!(again.event.count, 2);
    assert_eq!(again.event.src, ip(POD), "the latest caller");
    invariants(&c);
}

/// What must stay silent: each case is one drop the kind must not claim.
#[test]
fn twins_confirm_nothing() {
    let cases: Vec<(&str, ServiceTable, KernelEvent)> = vec![
        (
            "the source is inside the ranges (the pod CIDR is listed)",
            fw_table(&["192.0.2.0/24", "198.18.1.0/24"]),
            nf_drop(S, &call(POD, Tag::Pod, PORT), "NETFILTER_DROP"),
        ),
        (
            "no firewall entry (ipMode: Proxy, a hostname LB, or no ranges)",
            table(),
            nf_drop(S, &call(POD, Tag::Pod, PORT), "NETFILTER_DROP"),
        ),
        (
            "a drop to another port of the same LB IP",
            fw_table(&["192.0.2.0/24"]),
            nf_drop(S, &call(POD, Tag::Pod, 443), "NETFILTER_DROP"),
        ),
        (
            "a firewall chain without a range rule drops nothing",
            fw_table(&[]),
            nf_drop(S, &call(POD, Tag::Pod, PORT), "NETFILTER_DROP"),
        ),
        (
            "not a netfilter drop",
            fw_table(&["192.0.2.0/24"]),
            drop_ev(
                S,
                &call(POD, Tag::Pod, PORT),
                "NEIGH_FAILED",
                70,
                Some("neigh_invalidate+0x8c"),
            ),
        ),
        (
            "an outside source (the firewall doing its job)",
            fw_table(&["192.0.2.0/24"]),
            nf_drop(
                S,
                &pkt("198.51.100.7", 40000, LB_IP, PORT, None, None),
                "NETFILTER_DROP",
            ),
        ),
    ];
    assert_none_confirmed(cases);
}
