//! `etp_local_drop`: kube-proxy's nftables mode drops calls from this node's pods to an LB IP:port
//! of an externalTrafficPolicy Local Service without an endpoint on this node: the IP:port is a
//! `drop` element of its verdict map `no-endpoint-services` (kubernetes/kubernetes
//! `pkg/proxy/nftables/proxier.go`, `!hasExternalEndpoints`; kubernetes#131765). The reader keeps
//! only elements of LB and external IPs (`state::NoEndpointDrop`), so a ClusterIP's drop
//! (internalTrafficPolicy Local) is no risk here. A risk: every such element is a call that
//! fails from this node before it is made. The API, when read, adds the Service's policy (a
//! Service the API says is Cluster while the rules still drop: kube-proxy lags the API).

use probe_contract::{
    check::{Finding, Kind, Severity},
    facts::Etp,
    sock,
};

use crate::{check::Inputs, correlate::remedy};

/// The dropping element's Service as `namespace/name` (its port name left off).
pub(super) fn service_of(d: &crate::state::NoEndpointDrop) -> Option<String> {
    d.service
        .as_deref()
        .map(|s| s.split(':').next().unwrap_or(s).to_string())
}

pub fn etp_local_drop(inp: &Inputs) -> Vec<Finding> {
    // iptables mode's `KUBE-EXTERNAL-SERVICES` drops (the same table field) reach a pod's call
    // only when kube-proxy's local-traffic detector misses the pod: judged against the node's
    // pod ranges there.
    if inp.services.source == Some(crate::state::ServiceSource::Iptables) {
        return super::etp_local_detector::etp_local_detector_miss(inp);
    }
    inp.services
        .no_endpoint_drops
        .iter()
        .map(|d| {
            let proto = d.proto.as_str();
            let at = sock(d.addr, d.port);
            let service = service_of(d);
            let target = inp.lb_targets.iter().find(|t| {
                t.ip == d.addr && t.proto == d.proto && t.port.is_none_or(|p| p == d.port)
            });
            let etp_api = target
                .and_then(|t| t.etp_local)
                .map(|local| if local { Etp::Local } else { Etp::Cluster });
            let mut evidence = vec![format!(
                "nftables: map no-endpoint-services has the element {} . {proto} . {}{} : drop",
                d.addr,
                d.port,
                d.service
                    .as_deref()
                    .map(|c| format!(" comment \"{c}\""))
                    .unwrap_or_default()
            )];
            if let Some(s) = inp.services.serves(d.addr, d.port, d.proto)
                && !s.backends.is_empty()
            {
                evidence.push(format!(
                    "nftables: {at}/{proto} has endpoints, none of them on this node: {}",
                    s.backends.join(", ")
                ));
            }
            match (target, etp_api) {
                (Some(t), Some(etp)) => evidence.push(format!(
                    "{}: externalTrafficPolicy {}",
                    t.source,
                    etp.as_str()
                )),
                _ if !matches!(inp.api, crate::check::ApiState::Read { .. }) => evidence.push(
                    "the Service's policy was not read from the API (the rules' drop is \
                     written only for externalTrafficPolicy Local)"
                        .into(),
                ),
                _ => {}
            }
            Finding {
                kind: Kind::EtpLocalDrop,
                severity: Severity::Risk,
                subject: format!("{at}/{proto}"),
                summary: format!(
                    "kube-proxy (nftables mode) drops this node's pod calls to {at}/{proto}: {} \
                     has externalTrafficPolicy Local and no endpoint on this node \
                     (kubernetes#131765)",
                    service.as_deref().unwrap_or("its Service")
                ),
                evidence,
                remedy: remedy::etp_local_drop_risk(
                    d.addr,
                    d.port,
                    d.proto,
                    service.as_deref(),
                    etp_api,
                ),
                fixes: Vec::new(),
            }
        })
        .collect()
}
