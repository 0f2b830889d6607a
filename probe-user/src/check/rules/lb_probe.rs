//! `lb_probe_refused`: a port the LB probes on every node on which nothing listens here, so
//! the LB's probe is refused and the node taken out (issue #51, shape 4; the agent confirms
//! the refused probe live, `probe_core::correlate::lb_probe_refused`).
//!
//! - A healthCheckNodePort of an externalTrafficPolicy Local LoadBalancer Service (the API's
//!   table): kube-proxy serves each itself (kubernetes `pkg/proxy/healthcheck/
//!   service_health.go`), and the LB probes it on every node: a risk.
//! - kube-proxy's healthz, :10256 (`--healthz-bind-address`, default `0.0.0.0:10256`): probed
//!   for externalTrafficPolicy Cluster by some providers only (Azure's
//!   `clusterServiceLoadBalancerHealthProbeMode: Shared`; cloud-provider-aws PR #622), so a
//!   warning, and only when the node has LB IPs.

use probe_contract::check::{Finding, Kind, Severity};
use probe_core::correlate::lb_probe_refused::{KUBE_PROXY_HEALTHZ_PORT, ProbeTarget, probe_target};

use crate::{check::Inputs, state::ServiceTable};

/// Whether a listening TCP socket holds `port`, on any address.
fn served(inp: &Inputs, port: u16) -> Option<bool> {
    inp.tcp_listeners
        .as_ref()
        .map(|l| l.iter().any(|s| s.port == port))
}

/// The table whose healthCheckNodePorts count: the API's when read, else the dataplane's
/// (which has none: without API access only :10256 is judged).
fn table_of(inp: &Inputs) -> ServiceTable {
    inp.api_table
        .as_ref()
        .map(|t| t.expected())
        .unwrap_or_else(|| ServiceTable {
            health_checks: inp.services.health_checks.clone(),
            ..ServiceTable::default()
        })
}

fn finding(port: u16, target: &ProbeTarget) -> Finding {
    let subject = format!("tcp/{port}");
    match target {
        ProbeTarget::HealthCheckNodePort(svc) => Finding {
            kind: Kind::LbProbeRefused,
            severity: Severity::Risk,
            subject,
            summary: format!(
                "nothing listens on {svc}'s healthCheckNodePort {port}: the LB's probe is refused and this node taken out"
            ),
            evidence: vec![
                format!("{svc}: externalTrafficPolicy Local, spec.healthCheckNodePort {port}"),
                format!("no listening TCP socket on port {port} on this node"),
                "kube-proxy serves each healthCheckNodePort itself (kubernetes \
                 pkg/proxy/healthcheck/service_health.go); the LB probes it on every node"
                    .into(),
            ],
            remedy: vec![
                "run kube-proxy on this node, or have the kube-proxy replacement serve \
                 healthCheckNodePorts"
                    .into(),
            ],
            fixes: Vec::new(),
        },
        ProbeTarget::KubeProxyHealthz => Finding {
            kind: Kind::LbProbeRefused,
            severity: Severity::Warn,
            subject,
            summary: format!(
                "nothing listens on kube-proxy's healthz port {port}: an LB that probes it for externalTrafficPolicy Cluster takes this node out"
            ),
            evidence: vec![
                format!("no listening TCP socket on port {port} on this node"),
                "Azure's clusterServiceLoadBalancerHealthProbeMode: Shared probes :10256 \
                 (learn.microsoft.com ClusterServiceLoadBalancerHealthProbeMode); \
                 cloud-provider-aws PR #622 makes it the AWS default"
                    .into(),
            ],
            remedy: vec![
                "kube-proxy: keep its healthz on (--healthz-bind-address / healthzBindAddress, \
                 default 0.0.0.0:10256)"
                    .into(),
                "a kube-proxy replacement: turn on its healthz (Cilium: \
                 kubeProxyReplacementHealthzBindAddr=0.0.0.0:10256)"
                    .into(),
            ],
            fixes: Vec::new(),
        },
    }
}

/// One finding per probed port nothing listens on (none when the listeners were not read).
pub fn lb_probe(inp: &Inputs) -> Vec<Finding> {
    let table = table_of(inp);
    let mut ports: Vec<u16> = table.health_checks.iter().map(|h| h.port).collect();
    // :10256 matters only where LBs send traffic to this node.
    if !inp.lb_targets.is_empty() {
        ports.push(KUBE_PROXY_HEALTHZ_PORT);
    }
    ports.sort_unstable();
    ports.dedup();
    ports
        .into_iter()
        .filter(|&p| served(inp, p) == Some(false))
        .filter_map(|p| probe_target(&table, p).map(|t| finding(p, &t)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        check::test_nodes,
        state::{HealthCheckPort, sockets::DiagSocket},
    };

    fn listening(port: u16) -> DiagSocket {
        DiagSocket {
            addr: "0.0.0.0".parse().unwrap(),
            port,
            peer_port: 0,
            state: 10,
            uid: 0,
            inode: 1,
        }
    }

    /// A node with an LB IP (IPVS mode's sets) and `shop/web`'s healthCheckNodePort.
    fn node(listeners: Option<Vec<DiagSocket>>) -> Inputs {
        let mut i = test_nodes::ipvs(true, true);
        i.services.health_checks.push(HealthCheckPort {
            port: 32000,
            service: "shop/web".into(),
        });
        i.tcp_listeners = listeners;
        i
    }

    #[test]
    fn unserved_probe_ports_are_named_with_their_severity() {
        let f = lb_probe(&node(Some(vec![])));
        let found: Vec<(&str, Severity)> =
            f.iter().map(|f| (f.subject.as_str(), f.severity)).collect();
        assert_eq!(
            found,
            vec![("tcp/10256", Severity::Warn), ("tcp/32000", Severity::Risk)],
            "{f:#?}"
        );
        assert!(f[1].summary.contains("shop/web"), "{}", f[1].summary);
        assert_eq!(
            f[0].kind.predicted(),
            Some(probe_contract::LoopbackKind::LbProbeRefused)
        );
    }

    #[test]
    fn served_ports_and_unread_listeners_give_nothing() {
        assert!(lb_probe(&node(Some(vec![listening(10256), listening(32000)]))).is_empty());
        assert!(lb_probe(&node(None)).is_empty());
    }

    #[test]
    fn healthz_is_judged_only_where_lbs_send_traffic() {
        let mut i = node(Some(vec![listening(32000)]));
        i.lb_targets.clear();
        assert!(lb_probe(&i).is_empty());
    }
}
