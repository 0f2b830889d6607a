//! `etp_local_drop` in iptables mode: kube-proxy's local-traffic detector misses a pod range
//! of this node (issue #51 shape 2, kubernetes#112820). For an externalTrafficPolicy Local
//! Service without an endpoint on this node, kube-proxy's iptables proxier writes a `DROP` of
//! the LB IP:port in the filter chain `KUBE-EXTERNAL-SERVICES` (`INPUT`, `FORWARD`), and in
//! the Service's `KUBE-EXT-*` chain a "pod traffic for ... external destinations" rule that
//! sends the pods its detector matches (`IfLocal()`: `-s <cluster CIDR>`, `-i <prefix>+`,
//! `-i <bridge>`) to the cluster-wide endpoints first (kubernetes/kubernetes
//! `pkg/proxy/iptables/proxier.go`, `syncProxyRules`). A pod the detector misses (a second IP
//! pool outside `--cluster-cidr`) falls through to the drop: a risk before its first call.
//!
//! Judged from what the node shows: the rules read whole (the API's table holds no pod short
//! circuit) and the pod ranges of its routes (or `--pod-cidr`). A CIDR detector is compared
//! with those ranges; an interface detector is not judged (the check does not read which
//! interface each pod route leaves by), and the correlator names its miss when a call dies.

use std::net::IpAddr;

use probe_contract::{
    Proto,
    check::{Finding, Kind, Severity},
    sock,
};

use crate::{
    check::Inputs,
    state::{NoEndpointDrop, addrs::Prefix},
};

/// Whether `range` holds every address of `pods`.
fn covers(range: &Prefix, pods: &Prefix) -> bool {
    range.addr.is_ipv4() == pods.addr.is_ipv4()
        && range.len <= pods.len
        && range.contains(pods.addr)
}

/// kube-proxy's local-traffic detector for `d`'s family, as its nat rules show it: the pod
/// short circuit of `d`'s own chain, else any of the family (kube-proxy has one detector per
/// family, the same in every Service's chain). None: no pod short circuit at all (no
/// detector, or none read).
fn detector_for<'a>(inp: &'a Inputs, d: &NoEndpointDrop) -> Option<&'a str> {
    let t = &inp.services;
    t.pod_short_circuit(d.addr, d.port, d.proto)
        .or_else(|| {
            t.pod_short_circuits
                .iter()
                .find(|s| s.addr.is_ipv4() == d.addr.is_ipv4())
        })
        .map(|s| s.detector.as_str())
}

/// The pod ranges of this node (in `d`'s family) the detector leaves out: all of them without
/// a detector; None for an interface detector (not judged here).
fn missed(inp: &Inputs, addr: IpAddr, detector: Option<&str>) -> Option<Vec<Prefix>> {
    let pods = inp
        .pod_prefixes
        .iter()
        .filter(|p| p.addr.is_ipv4() == addr.is_ipv4());
    let Some(detector) = detector else {
        return Some(pods.copied().collect());
    };
    let cidr = Prefix::parse(detector.strip_prefix("-s ")?.trim()).ok()?;
    Some(pods.filter(|p| !covers(&cidr, p)).copied().collect())
}

/// One risk per `KUBE-EXTERNAL-SERVICES` drop whose Service's pod short circuit misses a pod
/// range of this node (iptables mode, the rules read whole).
pub fn etp_local_detector_miss(inp: &Inputs) -> Vec<Finding> {
    if inp.services.from_api {
        return Vec::new();
    }
    let mut out = Vec::new();
    for d in &inp.services.no_endpoint_drops {
        let detector = detector_for(inp, d);
        let Some(missed) = missed(inp, d.addr, detector).filter(|m| !m.is_empty()) else {
            continue;
        };
        out.push(finding(inp, d, detector, &missed));
    }
    out
}

fn finding(inp: &Inputs, d: &NoEndpointDrop, detector: Option<&str>, missed: &[Prefix]) -> Finding {
    let proto = d.proto.as_str();
    let at = sock(d.addr, d.port);
    let svc = super::etp_local_drop::service_of(d);
    let svc_text = svc.as_deref().unwrap_or("its Service");
    let missed_text = missed
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let (cmd, host) = if d.addr.is_ipv4() {
        ("iptables", 32)
    } else {
        ("ip6tables", 128)
    };
    let mut evidence = vec![format!(
        "{cmd}: filter chain KUBE-EXTERNAL-SERVICES has -d {}/{host} -p {proto} --dport {}{} \
         -j DROP: externalTrafficPolicy Local without an endpoint on this node",
        d.addr,
        d.port,
        d.service
            .as_deref()
            .map(|c| format!(" -m comment --comment \"{c} has no local endpoints\""))
            .unwrap_or_default(),
    )];
    evidence.push(match detector {
        Some(det) => format!(
            "{cmd}: kube-proxy's local-traffic detector is `{det}` (its \"pod traffic for ... \
             external destinations\" rule): only the pods it matches are sent to the \
             cluster-wide endpoints before that drop"
        ),
        None => format!(
            "{cmd}: kube-proxy's nat rules have no \"pod traffic for ... external \
             destinations\" rule: kube-proxy has no local-traffic detector, so no pod's call is \
             sent to the cluster-wide endpoints before that drop"
        ),
    });
    evidence.push(format!(
        "pod ranges of this node outside the detector (pod routes, --pod-cidr): {missed_text}"
    ));
    if let Some(s) = inp.services.serves(d.addr, d.port, d.proto)
        && !s.backends.is_empty()
    {
        evidence.push(format!(
            "{cmd}: {at}/{proto} has endpoints, none of them on this node: {}",
            s.backends.join(", ")
        ));
    }
    let why = match detector {
        Some(det) => format!("its local-traffic detector `{det}` misses them"),
        None => "kube-proxy has no local-traffic detector".to_string(),
    };
    Finding {
        kind: Kind::EtpLocalDrop,
        severity: Severity::Risk,
        subject: format!("{at}/{proto}"),
        summary: format!(
            "kube-proxy (iptables mode) drops calls from this node's pods in {missed_text} to \
             {at}/{proto}: {why}, and {svc_text} has externalTrafficPolicy Local with no \
             endpoint on this node (kubernetes#112820)"
        ),
        evidence,
        remedy: remedy(
            d.addr,
            d.port,
            d.proto,
            svc.as_deref(),
            detector,
            &missed_text,
        ),
        fixes: Vec::new(),
    }
}

/// The detector's fix first (with the versions where nftables mode's detectors and its drop
/// differ: kubernetes#134024, #132456 in 1.34.0 and #133969 in 1.33.6), then the Service's.
fn remedy(
    addr: IpAddr,
    port: u16,
    proto: Proto,
    svc: Option<&str>,
    detector: Option<&str>,
    missed: &str,
) -> Vec<String> {
    let at = sock(addr, port);
    let proto = proto.as_str();
    let svc = svc
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    let detector_fix = match detector {
        Some(_) => format!(
            "Make kube-proxy's local-traffic detector match every pod on the node: \
             --cluster-cidr (--detect-local-mode ClusterCIDR) must cover {missed} too (one \
             CIDR per family, holding every pod pool), or use --detect-local-mode \
             InterfaceNamePrefix (--pod-interface-name-prefix) or BridgeInterface \
             (--pod-bridge-interface), which match a pod by its interface, not its address."
        ),
        None => "Give kube-proxy a local-traffic detector that matches every pod on the node: \
             --detect-local-mode ClusterCIDR with a --cluster-cidr covering every pod range, \
             NodeCIDR, InterfaceNamePrefix (--pod-interface-name-prefix) or BridgeInterface \
             (--pod-bridge-interface)."
            .to_string(),
    };
    vec![
        detector_fix,
        "Moving to kube-proxy's nftables mode does not help by itself: before 1.34.0 (1.33.6 \
         with the cherry-pick #133969; none for 1.32 or older) it drops such pod calls whatever \
         the detector (kubernetes#131765, fixed by #132456), and its InterfaceNamePrefix and \
         BridgeInterface detectors work only from 1.33.6, 1.34.2 and 1.35 (kubernetes#134024)."
            .to_string(),
        format!(
            "Or set externalTrafficPolicy: Cluster on {svc} (kube-proxy then writes no drop for \
             its LB IP; backends no longer see client source IPs)."
        ),
        format!(
            "Or run an endpoint of {svc} on every node whose pods call {at}/{proto} (a DaemonSet \
             or a topology spread), or have callers use the Service's cluster DNS name or \
             ClusterIP."
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{PodShortCircuit, ServiceSource, ServiceTable};

    const LB: &str = "203.0.113.10";

    /// iptables mode: `default/web-local`'s LB IP:8445 dropped in `KUBE-EXTERNAL-SERVICES`,
    /// its pod short circuit matching `detector` (None: no detector); the node's pods in
    /// `pods`.
    fn inputs(detector: Option<&str>, pods: &[&str]) -> Inputs {
        let addr: IpAddr = LB.parse().unwrap();
        let mut t = ServiceTable {
            source: Some(ServiceSource::Iptables),
            ..ServiceTable::default()
        };
        t.no_endpoint_drops.push(NoEndpointDrop {
            addr,
            proto: Proto::Tcp,
            port: 8445,
            service: Some("default/web-local:http".into()),
        });
        if let Some(d) = detector {
            t.pod_short_circuits.push(PodShortCircuit {
                addr,
                proto: Proto::Tcp,
                port: 8445,
                chain: "KUBE-EXT-V7ZMVOA2AOW6ATRL".into(),
                detector: d.into(),
            });
        }
        Inputs {
            services: t,
            pod_prefixes: pods.iter().map(|p| Prefix::parse(p).unwrap()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_cidr_detector_that_misses_a_pod_pool_is_a_risk_naming_both() {
        let f = etp_local_detector_miss(&inputs(
            Some("-s 10.244.0.0/16"),
            &["10.244.1.0/24", "10.245.0.0/24"],
        ));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::EtpLocalDrop);
        assert_eq!(f[0].severity, Severity::Risk);
        assert_eq!(f[0].subject, "203.0.113.10:8445/tcp");
        assert!(
            f[0].summary.contains("in 10.245.0.0/24")
                && f[0].summary.contains("`-s 10.244.0.0/16`")
                && f[0].summary.contains("default/web-local")
                && !f[0].summary.contains("10.244.1.0/24"),
            "{}",
            f[0].summary
        );
        let ev = f[0].evidence.join("\n");
        assert!(
            ev.contains("KUBE-EXTERNAL-SERVICES has -d 203.0.113.10/32"),
            "{ev}"
        );
        let remedy = f[0].remedy.join("\n");
        for needle in [
            "--cluster-cidr",
            "10.245.0.0/24",
            "#133969",
            "#132456",
            "#134024",
        ] {
            assert!(remedy.contains(needle), "{needle}: {remedy}");
        }
    }

    #[test]
    fn no_detector_misses_every_pod_range() {
        let f = etp_local_detector_miss(&inputs(None, &["10.244.1.0/24"]));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(
            f[0].summary.contains("no local-traffic detector"),
            "{}",
            f[0].summary
        );
        assert!(f[0].remedy[0].starts_with("Give kube-proxy a local-traffic detector"));
    }

    /// The twins: a detector covering every pod range; an interface detector (not judged); the
    /// API's table (no pod short circuits there); another family's pods only.
    #[test]
    fn twins_are_silent() {
        assert!(
            etp_local_detector_miss(&inputs(Some("-s 10.244.0.0/15"), &["10.245.0.0/24"]))
                .is_empty()
        );
        assert!(etp_local_detector_miss(&inputs(Some("-i cali+"), &["10.245.0.0/24"])).is_empty());
        let mut api = inputs(None, &["10.244.1.0/24"]);
        api.services.from_api = true;
        assert!(etp_local_detector_miss(&api).is_empty());
        assert!(etp_local_detector_miss(&inputs(None, &["fd00:10::/64"])).is_empty());
        assert!(etp_local_detector_miss(&inputs(None, &[])).is_empty());
    }

    /// A Service whose chain has no short circuit of its own (its LB rule goes through
    /// `KUBE-FW-*`) is judged by the family's detector from another Service's chain.
    #[test]
    fn the_familys_detector_stands_in_for_a_chain_without_one() {
        let mut inp = inputs(None, &["10.245.0.0/24"]);
        inp.services.pod_short_circuits.push(PodShortCircuit {
            addr: "203.0.113.99".parse().unwrap(),
            proto: Proto::Tcp,
            port: 80,
            chain: "KUBE-EXT-OTHER".into(),
            detector: "-s 10.245.0.0/16".into(),
        });
        assert!(etp_local_detector_miss(&inp).is_empty());
    }
}
