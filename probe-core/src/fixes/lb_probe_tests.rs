//! `lb_probe_refused`'s fixes: the healthz settings of kube-proxy and of Cilium's kube-proxy
//! replacement, offered only for a probe refused at :10256, and by whether kube-proxy's
//! rules were read on the node.

use std::net::IpAddr;

use probe_contract::{LoopbackEvent, LoopbackKind, Outcome, Proto, facts::ProxyMode};

use super::{Facts, LbProbe, Provider, fix_by_id, fixes};

const GCE_PROBE: &str = "35.191.0.8";
const NODE: &str = "10.0.0.5";
const HEALTH_CHECK_NODE_PORT: u16 = 31234;

fn probe(port: u16, outcome: Outcome, proxy_mode: Option<ProxyMode>) -> LoopbackEvent {
    let src: IpAddr = GCE_PROBE.parse().unwrap();
    let dst: IpAddr = NODE.parse().unwrap();
    let mut e = LoopbackEvent::between(
        LoopbackKind::LbProbeRefused,
        (src, 40000),
        (dst, port),
        Proto::Tcp,
        outcome,
    );
    e.facts.proxy_mode = proxy_mode;
    e
}

fn offered(e: &LoopbackEvent) -> Vec<String> {
    fixes(&Facts::of(e, None, Provider::Gce))
        .into_iter()
        .map(|f| f.id)
        .collect()
}

#[test]
fn a_refused_healthz_probe_where_kube_proxy_runs_gets_its_healthz_setting_only() {
    let e = probe(10256, Outcome::Refused, Some(ProxyMode::Iptables));
    assert_eq!(
        LbProbe::of(&e),
        Some(LbProbe {
            healthz: true,
            refused: true
        })
    );
    assert_eq!(offered(&e), ["kube-proxy-healthz-bind"]);
}

#[test]
fn a_refused_healthz_probe_without_a_service_table_gets_both_settings() {
    let e = probe(10256, Outcome::Refused, None);
    assert_eq!(
        offered(&e),
        ["kube-proxy-healthz-bind", "cilium-kpr-healthz-bind"]
    );
}

#[test]
fn without_kube_proxy_the_cilium_setting_alone() {
    let e = probe(10256, Outcome::Refused, None);
    let mut f = Facts::of(&e, None, Provider::Gce);
    f.kube_proxy = Some(false);
    let ids: Vec<String> = fixes(&f).into_iter().map(|x| x.id).collect();
    assert_eq!(ids, ["cilium-kpr-healthz-bind"]);
}

#[test]
fn a_dropped_probe_or_a_health_check_node_port_gets_no_healthz_setting() {
    for e in [
        probe(10256, Outcome::Dropped, Some(ProxyMode::Nftables)),
        probe(HEALTH_CHECK_NODE_PORT, Outcome::Refused, None),
        probe(HEALTH_CHECK_NODE_PORT, Outcome::Dropped, None),
    ] {
        assert_eq!(offered(&e), Vec::<String>::new(), "{e:?}");
    }
}

#[test]
fn other_kinds_carry_no_probe() {
    let mut e = probe(10256, Outcome::Refused, None);
    e.kind = LoopbackKind::Hairpin;
    assert_eq!(LbProbe::of(&e), None);
    assert!(
        !offered(&e).iter().any(|id| id.ends_with("healthz-bind")),
        "{:?}",
        offered(&e)
    );
}

#[test]
fn each_cites_its_setting_s_document() {
    for (id, source) in [
        (
            "kube-proxy-healthz-bind",
            "kubernetes.io/docs/reference/config-api/kube-proxy-config",
        ),
        (
            "cilium-kpr-healthz-bind",
            "docs.cilium.io/en/stable/network/kubernetes/kubeproxy-free",
        ),
    ] {
        let entry = super::TABLE.iter().find(|e| e.id == id).unwrap();
        assert!(entry.source.contains(source), "{id}: {}", entry.source);
    }
}

/// The plugin re-checks an agent's fix with the Service's facts (no event: the probe is not
/// known, kube-proxy assumed): both stay offered, each saying which probe it answers.
#[test]
fn without_the_event_both_are_offered_with_the_probe_as_a_precondition() {
    let e = probe(10256, Outcome::Refused, Some(ProxyMode::Iptables));
    let mut f = Facts::of(&e, None, Provider::Gce);
    f.lb_probe = None;
    for id in ["kube-proxy-healthz-bind", "cilium-kpr-healthz-bind"] {
        let fix = fix_by_id(id, &f).unwrap_or_else(|| panic!("{id} dropped"));
        assert!(
            fix.preconditions
                .iter()
                .any(|p| p.contains(":10256 is refused")),
            "{id}: {:?}",
            fix.preconditions
        );
    }
}
