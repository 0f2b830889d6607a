//! `mode_leftover` (issue 39, IPVS retirement): another mode's state is named only where the
//! live mode is known, and kube-ipvs0's addresses after a switch are a risk.

use probe_contract::check::{Kind, Severity};

use super::{
    Inputs, ModeState,
    dataplane::{Traces, detect},
    readiness, rules,
    test_nodes::{VIP, ip, lab},
};
use crate::state::ServiceSource;

/// The lab node with its service table from `source`, the dataplane detected from it, and
/// kube-ipvs0 holding the VIP when `vip_iface_present`.
fn node(source: ServiceSource, vip_iface_present: bool, leftovers: ModeState) -> Inputs {
    let mut i = lab();
    i.services.source = Some(source);
    i.dataplane = Some(detect(&Traces::of_table(&i.services, &[])));
    i.leftovers = ModeState {
        vip_iface_present,
        ..leftovers
    };
    i
}

fn leftovers(i: &Inputs) -> Vec<super::Finding> {
    rules::judge(i)
        .into_iter()
        .filter(|f| f.kind == Kind::ModeLeftover)
        .collect()
}

#[test]
fn kube_ipvs0_addresses_on_a_nftables_node_are_a_risk_and_its_absence_is_silent() {
    let found = leftovers(&node(ServiceSource::Nftables, true, ModeState::default()));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].severity, Severity::Risk);
    assert_eq!(found[0].subject, "kube-ipvs0");
    assert!(
        found[0].summary.contains("nftables mode"),
        "{}",
        found[0].summary
    );
    assert!(
        found[0].evidence.iter().any(|e| e.contains(VIP)),
        "{:?}",
        found[0].evidence
    );
    assert!(
        found[0].remedy[0].contains("--cleanup"),
        "{:?}",
        found[0].remedy
    );
    // The twin: the switch cleaned up (no kube-ipvs0).
    assert!(leftovers(&node(ServiceSource::Nftables, false, ModeState::default())).is_empty());
    // Addresses made local by a route, not by kube-ipvs0, are not its leftovers.
    let mut routed = node(ServiceSource::Nftables, true, ModeState::default());
    routed.owners.insert(
        ip(VIP),
        probe_contract::facts::AddressOwner::LocalRoute {
            protocol: 66,
            protocol_name: "cloud guest agent".into(),
            iface: Some("eth0".into()),
        },
    );
    assert!(leftovers(&routed).is_empty());
}

#[test]
fn iptables_rules_alone_do_not_tell_ipvs_mode_from_a_leftover_but_kube_proxy_does() {
    // IPVS mode writes KUBE-* iptables rules too; an IPVS reader without the module sees none.
    assert!(leftovers(&node(ServiceSource::Iptables, true, ModeState::default())).is_empty());
    let said = ModeState {
        proxy_mode: Some("iptables".into()),
        ..Default::default()
    };
    let found = leftovers(&node(ServiceSource::Iptables, true, said));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].severity, Severity::Risk);
    assert!(
        found[0].evidence[0].contains("/proxyMode"),
        "{:?}",
        found[0].evidence
    );
    // kube-proxy says IPVS: kube-ipvs0 is its own.
    let ipvs = ModeState {
        proxy_mode: Some("ipvs".into()),
        ..Default::default()
    };
    assert!(leftovers(&node(ServiceSource::Ipvs, true, ipvs)).is_empty());
}

#[test]
fn leftover_ipvs_services_without_addresses_are_a_warning() {
    let said = ModeState {
        proxy_mode: Some("nftables".into()),
        ..Default::default()
    };
    // The reader took IPVS's services (it reads IPVS first) though kube-proxy runs nftables.
    let mut i = node(ServiceSource::Ipvs, false, said);
    let n = i.services.services.len();
    assert!(n > 0);
    i.bound.clear();
    let found = leftovers(&i);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].severity, Severity::Warn);
    assert_eq!(found[0].subject, "ipvs");
    assert!(found[0].summary.contains(&format!("{n} virtual service")));
}

#[test]
fn a_nftables_table_beside_ipvs_is_named_as_a_leftover_or_as_ambiguous() {
    let nft = |proxy_mode: Option<&str>| ModeState {
        nft_services: 3,
        proxy_mode: proxy_mode.map(Into::into),
        ..Default::default()
    };
    let found = leftovers(&node(ServiceSource::Ipvs, true, nft(Some("ipvs"))));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].subject, "table ip kube-proxy");
    assert_eq!(found[0].severity, Severity::Warn);
    // kube-proxy did not say: both named, neither guessed.
    let found = leftovers(&node(ServiceSource::Ipvs, true, nft(None)));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].subject, "ipvs, table ip kube-proxy");
    assert!(
        found[0].summary.contains("3 Services"),
        "{}",
        found[0].summary
    );
    // Continued string literals read as one sentence (no run of the source's indentation).
    let f = &found[0];
    for line in std::iter::once(&f.summary)
        .chain(&f.evidence)
        .chain(&f.remedy)
    {
        assert!(!line.contains("  "), "{line:?}");
    }
}

#[test]
fn a_replaced_kube_proxy_leaves_kube_ipvs0_as_a_risk() {
    let mut i = node(ServiceSource::Iptables, true, ModeState::default());
    i.services.services.clear();
    i.services.nodeports.clear();
    i.services.masquerade_rules.clear();
    i.dataplane = Some(detect(&Traces {
        links: vec!["cilium_host".into(), "kube-ipvs0".into()],
        ..Default::default()
    }));
    let found = leftovers(&i);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].severity, Severity::Risk);
    assert!(
        found[0].summary.contains("no kube-proxy rules"),
        "{}",
        found[0].summary
    );
}

#[test]
fn the_nftables_prediction_has_no_leftovers() {
    let i = node(
        ServiceSource::Ipvs,
        true,
        ModeState {
            nft_services: 2,
            ..Default::default()
        },
    );
    let predicted = readiness::as_nftables(&i);
    assert_eq!(predicted.leftovers, ModeState::default());
    assert!(leftovers(&predicted).is_empty());
}
