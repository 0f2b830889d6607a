//! Objects shaped as the real API returns them (fields a v1.34 API server fills in included),
//! with the lab's addresses: the node `clb-node`, pod A as `default/client-...` (198.19.1.10),
//! pod B as `default/web-...` (198.19.1.11), `default/web` (ClusterIP 198.18.100.10, LB ingress
//! 203.0.113.10 ipMode VIP, 80 -> 8080, NodePort 30080) and `default/dns` (UDP 53 -> 5353,
//! NodePort 30053) with their EndpointSlices.

use serde_json::Value;

pub const NODE: &str = include_str!("fixtures/node.json");
pub const POD_CLIENT: &str = include_str!("fixtures/pod-client.json");
pub const POD_WEB: &str = include_str!("fixtures/pod-web.json");
pub const SERVICE_WEB: &str = include_str!("fixtures/service-web.json");
pub const SERVICE_DNS: &str = include_str!("fixtures/service-dns.json");
pub const ENDPOINTSLICE_WEB: &str = include_str!("fixtures/endpointslice-web.json");
pub const ENDPOINTSLICE_DNS: &str = include_str!("fixtures/endpointslice-dns.json");
/// kube-vip's DaemonSet pod on `clb-node` in ARP mode with `svc_enable`, shaped as
/// `kube-vip manifest daemonset --arp --services --interface eth0` writes it
/// (kube-vip/kube-vip pkg/kubevip/config_generator.go: labels, hostNetwork, NET_ADMIN/NET_RAW)
/// and as the API server returns it. Not in [`lab`]: the tests of a VIP held on the node add it.
pub const POD_KUBE_VIP: &str = include_str!("fixtures/pod-kube-vip.json");
/// The name of kube-vip's pod.
pub const KUBE_VIP_POD: &str = "kube-vip-ds-7x95f";

/// The name of pod A's pod (the in-cluster client).
pub const CLIENT_POD: &str = "client-5d8f7c9b6-x2x9q";
/// The name of pod B's pod (the endpoint of `default/web`).
pub const WEB_POD: &str = "web-7c4b9d8f5-k8m2p";

/// Parses one fixture.
pub fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("fixtures are valid JSON")
}

/// Every fixture of the lab, ready for [`FakeApiServer::apply`](super::FakeApiServer::apply).
pub fn lab() -> Vec<Value> {
    [
        NODE,
        POD_CLIENT,
        POD_WEB,
        SERVICE_WEB,
        SERVICE_DNS,
        ENDPOINTSLICE_WEB,
        ENDPOINTSLICE_DNS,
    ]
    .into_iter()
    .map(parse)
    .collect()
}
