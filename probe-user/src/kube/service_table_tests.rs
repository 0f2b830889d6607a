use serde_json::json;

use super::*;
use crate::state::{
    iptables::parse_iptables_save,
    test_netns::{Netns, root_with},
};

const NODE: &str = "test-node";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn service(v: serde_json::Value) -> Service {
    serde_json::from_value(v).expect("a Service")
}

fn slice(v: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(v).expect("an EndpointSlice")
}

fn node(mode: ServiceSource) -> NodeView {
    NodeView {
        mode,
        node_name: Some(NODE.into()),
        node_ips: vec![ip("192.168.0.2")],
    }
}

/// `shop/web`: port `http` 80/TCP (NodePort 30080), LB IP 203.0.113.10, with `spec` merged in.
fn web(spec: serde_json::Value) -> PrunedService {
    let mut s = json!({
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {
            "type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}
    });
    for (k, v) in spec.as_object().unwrap() {
        s["spec"][k] = v.clone();
    }
    PrunedService::from_api(&service(s)).expect("programmed")
}

/// A slice of `shop/web` with `endpoints` (`[address, node, ready, serving, terminating]`).
fn web_slice(name: &str, endpoints: &[(&str, &str, bool, bool, bool)]) -> PrunedSlice {
    let eps: Vec<_> = endpoints
        .iter()
        .map(|(a, n, r, s, t)| {
            json!({"addresses": [a], "nodeName": n,
                   "conditions": {"ready": r, "serving": s, "terminating": t}})
        })
        .collect();
    PrunedSlice::from_api(&slice(json!({
        "metadata": {"namespace": "shop", "name": name,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    })))
    .expect("read")
}

fn table(mode: ServiceSource, svc: PrunedService, slices: &[PrunedSlice]) -> ApiServiceTable {
    let mut t = ApiServiceTable::new(node(mode));
    t.apply_service("shop/web", Some(svc));
    for (i, s) in slices.iter().enumerate() {
        t.apply_slice(&format!("shop/web-{i}"), Some(s.clone()));
    }
    t
}

const READY: (bool, bool, bool) = (true, true, false);
const TERMINATING: (bool, bool, bool) = (false, true, true);

fn ep(
    addr: &'static str,
    node: &'static str,
    c: (bool, bool, bool),
) -> (&'static str, &'static str, bool, bool, bool) {
    (addr, node, c.0, c.1, c.2)
}

#[test]
fn services_kube_proxy_ignores_are_not_programmed() {
    let base = json!({
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}
    });
    assert!(PrunedService::from_api(&service(base.clone())).is_some());
    let mut headless = base.clone();
    headless["spec"]["clusterIP"] = json!("None");
    let mut external_name = base.clone();
    external_name["spec"]["type"] = json!("ExternalName");
    let mut other_proxy = base.clone();
    other_proxy["metadata"]["labels"] = json!({SERVICE_PROXY_NAME: "cilium"});
    for (why, s) in [
        ("headless", headless),
        ("ExternalName", external_name),
        ("another proxy's", other_proxy),
    ] {
        assert_eq!(PrunedService::from_api(&service(s)), None, "{why}");
    }
    // Slices: headless or another proxy's are not read, nor FQDN ones.
    let s = json!({
        "metadata": {"namespace": "shop", "name": "web-1",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]
    });
    let read = PrunedSlice::from_api(&slice(s.clone())).unwrap();
    assert_eq!(&*read.service, "shop/web");
    let e = &read.endpoints[0];
    assert!(
        e.ready && e.serving && !e.terminating,
        "unset conditions: ready"
    );
    for (label, value) in [(HEADLESS, ""), (SERVICE_PROXY_NAME, "cilium")] {
        let mut s = s.clone();
        s["metadata"]["labels"][label] = json!(value);
        assert_eq!(PrunedSlice::from_api(&slice(s)), None, "{label}");
    }
    let mut fqdn = s;
    fqdn["addressType"] = json!("FQDN");
    assert_eq!(PrunedSlice::from_api(&slice(fqdn)), None);
}

#[test]
fn proxy_mode_lb_ips_and_etp_on_cluster_ip_services_are_left_out() {
    let s = web(json!({}));
    assert_eq!(s.lb_ips, [ip("203.0.113.10")]);
    let mut v = json!({
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "ports": [{"port": 80}],
                 "externalTrafficPolicy": "Local"},
        "status": {"loadBalancer": {"ingress": [
            {"ip": "203.0.113.10", "ipMode": "Proxy"}, {"ip": "203.0.113.11", "ipMode": "VIP"},
            {"hostname": "lb.example.com"}]}}
    });
    let s = PrunedService::from_api(&service(v.clone())).unwrap();
    assert_eq!(s.lb_ips, [ip("203.0.113.11")]);
    assert!(s.external_policy_local);
    v["spec"]["type"] = json!("ClusterIP");
    assert!(
        !PrunedService::from_api(&service(v))
            .unwrap()
            .external_policy_local,
        "ETP counts only on NodePort / LoadBalancer Services"
    );
}

#[test]
fn cluster_endpoints_are_the_ready_ones_else_the_serving_terminating_ones() {
    let t = table(
        ServiceSource::Iptables,
        web(json!({})),
        &[web_slice(
            "a",
            &[
                ep("10.0.1.1", NODE, READY),
                ep("10.0.2.1", "other", READY),
                ep("10.0.1.2", NODE, TERMINATING),
                ep("10.0.2.2", "other", (false, false, false)),
            ],
        )],
    );
    let cluster = t.serves(ip("10.96.0.10"), 80, Proto::Tcp).unwrap();
    assert_eq!(cluster.backends, ["10.0.1.1:8080", "10.0.2.1:8080"]);
    assert_eq!(cluster.service.as_deref(), Some("shop/web:http"));
    // None ready anywhere: the serving terminating ones (kube-proxy >= 1.28).
    let t = table(
        ServiceSource::Iptables,
        web(json!({})),
        &[web_slice(
            "a",
            &[
                ep("10.0.1.2", NODE, TERMINATING),
                ep("10.0.2.2", "other", (false, false, true)),
            ],
        )],
    );
    assert_eq!(
        t.serves(ip("10.96.0.10"), 80, Proto::Tcp).unwrap().backends,
        ["10.0.1.2:8080"]
    );
}

#[test]
fn no_endpoint_no_entry_in_iptables_and_nftables_modes() {
    for mode in [ServiceSource::Iptables, ServiceSource::Nftables] {
        let t = table(mode, web(json!({})), &[web_slice("a", &[])]);
        let e = t.expected();
        assert!(e.services.is_empty() && e.nodeports.is_empty(), "{mode:?}");
        assert!(e.no_endpoint_drops.is_empty(), "a reject is no drop");
    }
}

#[test]
fn a_health_check_node_port_is_listed_with_or_without_endpoints() {
    let svc = web(json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000}));
    let want = vec![crate::state::HealthCheckPort {
        port: 32000,
        service: "shop/web".into(),
    }];
    for slices in [
        &[][..],
        &[web_slice("a", &[ep("10.0.2.1", "other", READY)])][..],
    ] {
        let t = table(ServiceSource::Iptables, svc.clone(), slices);
        assert_eq!(t.expected().health_checks, want, "{slices:?}");
    }
    let cluster = table(ServiceSource::Iptables, web(json!({})), &[]);
    assert!(cluster.expected().health_checks.is_empty());
}

#[test]
fn etp_local_without_local_endpoint_drops_in_iptables_and_nftables_modes() {
    let svc = web(json!({"externalTrafficPolicy": "Local"}));
    let remote = [web_slice("a", &[ep("10.0.2.1", "other", READY)])];
    let nft = table(ServiceSource::Nftables, svc.clone(), &remote);
    let lb = ip("203.0.113.10");
    let drop = nft.no_endpoint_drop(lb, 80, Proto::Tcp).unwrap();
    assert_eq!(drop.service.as_deref(), Some("shop/web:http"));
    // The LB IP's entry stays (pods and the node short-circuit to the Cluster endpoints).
    assert_eq!(
        nft.serves(lb, 80, Proto::Tcp).unwrap().backends,
        ["10.0.2.1:8080"]
    );
    assert!(nft.nodeport(30080, Proto::Tcp).unwrap().local_only);
    // iptables mode: the same drop, a `KUBE-EXTERNAL-SERVICES` rule.
    let ipt = table(ServiceSource::Iptables, svc.clone(), &remote);
    assert_eq!(
        ipt.expected().no_endpoint_drops,
        std::slice::from_ref(&drop)
    );
    // A local endpoint: no drop, and the external backends are both sets.
    let both = [web_slice(
        "a",
        &[ep("10.0.2.1", "other", READY), ep("10.0.1.1", NODE, READY)],
    )];
    let nft = table(ServiceSource::Nftables, svc, &both);
    assert!(nft.no_endpoint_drop(lb, 80, Proto::Tcp).is_none());
    assert_eq!(
        nft.serves(lb, 80, Proto::Tcp).unwrap().backends,
        ["10.0.1.1:8080", "10.0.2.1:8080"]
    );
}

#[test]
fn itp_local_cluster_ip_has_local_endpoints_only() {
    let svc = web(json!({"internalTrafficPolicy": "Local"}));
    let cip = ip("10.96.0.10");
    let remote = [web_slice("a", &[ep("10.0.2.1", "other", READY)])];
    let t = table(ServiceSource::Iptables, svc.clone(), &remote);
    assert!(t.serves(cip, 80, Proto::Tcp).is_none(), "no local endpoint");
    // The LB IP (ETP Cluster) still has the Cluster endpoints.
    assert!(t.serves(ip("203.0.113.10"), 80, Proto::Tcp).is_some());
    let local = [web_slice(
        "a",
        &[ep("10.0.2.1", "other", READY), ep("10.0.1.1", NODE, READY)],
    )];
    let t = table(ServiceSource::Iptables, svc, &local);
    assert_eq!(
        t.serves(cip, 80, Proto::Tcp).unwrap().backends,
        ["10.0.1.1:8080"]
    );
}

/// IPVS mode: kube-proxy's tests have no whole-table fixture, so one test per rule.
#[test]
fn ipvs_virtual_servers_exist_without_endpoints() {
    let t = table(ServiceSource::Ipvs, web(json!({})), &[web_slice("a", &[])]);
    for vip in ["10.96.0.10", "203.0.113.10"] {
        let vs = t.serves(ip(vip), 80, Proto::Tcp).expect(vip);
        assert!(vs.backends.is_empty());
    }
    assert!(t.serves(ip("192.168.0.2"), 30080, Proto::Tcp).is_some());
    assert!(t.expected().no_endpoint_drops.is_empty());
}

#[test]
fn ipvs_nodeport_is_a_virtual_server_per_node_ip() {
    let mut n = node(ServiceSource::Ipvs);
    n.node_ips = vec![ip("192.168.0.2"), ip("192.168.1.2"), ip("2001:db8::1")];
    let mut t = ApiServiceTable::new(n);
    t.apply_service("shop/web", Some(web(json!({}))));
    t.apply_slice(
        "shop/web-a",
        Some(web_slice("a", &[ep("10.0.2.1", "other", READY)])),
    );
    let nodeport_vs: Vec<IpAddr> = t
        .expected()
        .services
        .iter()
        .filter(|s| s.port == 30080)
        .map(|s| s.vip)
        .collect();
    // IPv4 Service: the IPv4 node IPs only.
    assert_eq!(nodeport_vs, [ip("192.168.0.2"), ip("192.168.1.2")]);
    let np = t.nodeport(30080, Proto::Tcp).unwrap();
    assert!(!np.local_only);
    assert_eq!(np.service.as_deref(), Some("shop/web:http"));
}

#[test]
fn ipvs_etp_local_real_servers_are_the_local_endpoints_if_any() {
    let svc = web(json!({"externalTrafficPolicy": "Local"}));
    let eps = [web_slice(
        "a",
        &[ep("10.0.2.1", "other", READY), ep("10.0.1.1", NODE, READY)],
    )];
    let t = table(ServiceSource::Ipvs, svc.clone(), &eps);
    let both = ["10.0.1.1:8080", "10.0.2.1:8080"];
    assert_eq!(
        t.serves(ip("10.96.0.10"), 80, Proto::Tcp).unwrap().backends,
        both
    );
    for (vip, port) in [("203.0.113.10", 80), ("192.168.0.2", 30080)] {
        assert_eq!(
            t.serves(ip(vip), port, Proto::Tcp).unwrap().backends,
            ["10.0.1.1:8080"],
            "{vip}"
        );
    }
    assert!(t.nodeport(30080, Proto::Tcp).unwrap().local_only);
    // No local endpoint: the Cluster ones (kubernetes#97081), unlike iptables and nftables.
    let t = table(
        ServiceSource::Ipvs,
        svc,
        &[web_slice("a", &[ep("10.0.2.1", "other", READY)])],
    );
    assert_eq!(
        t.serves(ip("203.0.113.10"), 80, Proto::Tcp)
            .unwrap()
            .backends,
        ["10.0.2.1:8080"]
    );
}

#[test]
fn ipvs_itp_local_cluster_ip_real_servers_are_the_local_endpoints_if_any() {
    let svc = web(json!({"internalTrafficPolicy": "Local"}));
    let t = table(
        ServiceSource::Ipvs,
        svc.clone(),
        &[web_slice(
            "a",
            &[ep("10.0.2.1", "other", READY), ep("10.0.1.1", NODE, READY)],
        )],
    );
    assert_eq!(
        t.serves(ip("10.96.0.10"), 80, Proto::Tcp).unwrap().backends,
        ["10.0.1.1:8080"]
    );
    assert_eq!(
        t.serves(ip("203.0.113.10"), 80, Proto::Tcp)
            .unwrap()
            .backends,
        ["10.0.1.1:8080", "10.0.2.1:8080"]
    );
    // ITP Local on a ClusterIP-only Service uses no Cluster endpoints at all: none local,
    // the virtual server has no real server.
    let cluster_ip_only = PrunedService::from_api(&service(json!({
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "internalTrafficPolicy": "Local",
                 "ports": [{"name": "http", "port": 80}]}
    })))
    .unwrap();
    let t = table(
        ServiceSource::Ipvs,
        cluster_ip_only,
        &[web_slice("a", &[ep("10.0.2.1", "other", READY)])],
    );
    assert!(
        t.serves(ip("10.96.0.10"), 80, Proto::Tcp)
            .unwrap()
            .backends
            .is_empty()
    );
}

#[test]
fn dual_stack_programs_each_family_with_its_slices() {
    let svc = PrunedService::from_api(&service(json!({
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.10",
                 "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                 "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}
    })))
    .unwrap();
    let v6 = PrunedSlice::from_api(&slice(json!({
        "metadata": {"namespace": "shop", "name": "web-v6",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["fd00:1::5"]}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    })))
    .unwrap();
    let t = table(
        ServiceSource::Nftables,
        svc,
        &[web_slice("a", &[ep("10.0.1.1", NODE, READY)]), v6],
    );
    assert_eq!(
        t.serves(ip("fd00:96::10"), 80, Proto::Tcp)
            .unwrap()
            .backends,
        ["[fd00:1::5]:8080"]
    );
    assert_eq!(
        t.serves(ip("10.96.0.10"), 80, Proto::Tcp).unwrap().backends,
        ["10.0.1.1:8080"]
    );
    assert_eq!(
        t.expected().nodeports.len(),
        1,
        "one NodePort, both families"
    );
}

/// An event recomputes the Service it touches, not the table; a slice that moves to another
/// Service recomputes both.
#[test]
fn events_recompute_only_the_touched_service() {
    let mut t = ApiServiceTable::new(node(ServiceSource::Iptables));
    let services: Vec<(String, PrunedService)> = (0..1000)
        .map(|i| {
            let s = PrunedService::from_api(&service(json!({
                "metadata": {"namespace": "ns", "name": format!("s{i}")},
                "spec": {"clusterIP": format!("10.96.{}.{}", i / 250, i % 250 + 1),
                         "ports": [{"name": "http", "port": 80}]}
            })))
            .unwrap();
            (format!("ns/s{i}"), s)
        })
        .collect();
    t.replace(services, []);
    assert_eq!(t.recomputed(), 1000, "a relist computes each Service once");
    let slice_of = |svc: &str, addr: &str| {
        PrunedSlice::from_api(&slice(json!({
            "metadata": {"namespace": "ns", "name": "x-1",
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [addr]}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        })))
    };
    t.apply_slice("ns/x-1", slice_of("s7", "10.0.0.7"));
    assert_eq!(t.recomputed(), 1001);
    let s7 = ip("10.96.0.8");
    assert_eq!(
        t.serves(s7, 80, Proto::Tcp).unwrap().backends,
        ["10.0.0.7:8080"]
    );
    // Relabelled to s8: both recomputed, s7 has no endpoint any more.
    t.apply_slice("ns/x-1", slice_of("s8", "10.0.0.8"));
    assert_eq!(t.recomputed(), 1003);
    assert!(t.serves(s7, 80, Proto::Tcp).is_none());
    assert!(t.serves(ip("10.96.0.9"), 80, Proto::Tcp).is_some());
    t.apply_service("ns/s8", None);
    assert_eq!(t.recomputed(), 1004);
    assert!(t.expected().services.is_empty());
    assert_eq!(t.service_count(), 999);
}

// kube-proxy's own fixtures (tests/data/kube-proxy/overall/README.md).

const OVERALL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/kube-proxy/overall/"
);

fn items<T: serde::de::DeserializeOwned>(file: &str) -> Vec<T> {
    let text = std::fs::read_to_string(format!("{OVERALL}{file}")).expect("fixture");
    let list: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    list["items"]
        .as_array()
        .expect("a List")
        .iter()
        .map(|i| serde_json::from_value(i.clone()).expect("an API object"))
        .collect()
}

/// The API table of kube-proxy's `TestOverall*Rules` objects, fed one watch event at a time.
fn overall(mode: ServiceSource) -> ApiServiceTable {
    // kube-proxy's fake node (`testNodeName`, `testNodeIP`).
    let mut t = ApiServiceTable::new(node(mode));
    for s in items::<Service>("services.json") {
        let key = format!(
            "{}/{}",
            s.metadata.namespace.as_deref().unwrap(),
            s.metadata.name.as_deref().unwrap()
        );
        t.apply_service(&key, PrunedService::from_api(&s));
    }
    for s in items::<EndpointSlice>("endpointslices.json") {
        let key = format!(
            "{}/{}",
            s.metadata.namespace.as_deref().unwrap(),
            s.metadata.name.as_deref().unwrap()
        );
        t.apply_slice(&key, PrunedSlice::from_api(&s));
    }
    t
}

/// Order-free: the readers list in rule order, the API table in Service order.
fn sorted(mut t: ServiceTable) -> ServiceTable {
    t.services
        .sort_by_key(|s| (s.vip, s.port, s.proto.as_str()));
    t.nodeports.sort_by_key(|n| (n.port, n.proto.as_str()));
    t.no_endpoint_drops
        .sort_by_key(|d| (d.addr, d.port, d.proto.as_str()));
    // The external chains' pod short circuits: the rules' only (kube-proxy's flags).
    t.pod_short_circuits.clear();
    // The healthCheckNodePorts: the API's only (kube-proxy writes no rule for them).
    t.health_checks.clear();
    t
}

#[test]
fn kube_proxy_overall_iptables_rules() {
    let text = std::fs::read_to_string(format!("{OVERALL}iptables-expected.txt")).unwrap();
    let mut from_rules = parse_iptables_save(&text);
    // The filter table's no-endpoint drops (the whole-table reader reads that chain alone).
    from_rules.no_endpoint_drops = crate::state::iptables::parse_external_drops(&text);
    assert_eq!(from_rules.no_endpoint_drops.len(), 2);
    assert_eq!(
        from_rules.pod_short_circuits.len(),
        2,
        "{:?}",
        from_rules.pod_short_circuits
    );
    // KUBE-POSTROUTING's MASQUERADE: kube-proxy's configuration, not in the API objects.
    assert_eq!(from_rules.masquerade_rules.len(), 1);
    from_rules.masquerade_rules.clear();
    let from_api = overall(ServiceSource::Iptables).expected();
    // Not vacuous: 9 frontends (svc6 has no endpoint: REJECT, no nat rule), 3 NodePorts.
    assert_eq!(from_api.services.len(), 9);
    // svc2's healthCheckNodePort (its externalTrafficPolicy Local).
    assert_eq!(
        from_api.health_checks,
        vec![crate::state::HealthCheckPort {
            port: 30000,
            service: "ns2/svc2".into()
        }]
    );
    assert_eq!(from_api.nodeports.len(), 3);
    assert_eq!(sorted(from_api), sorted(from_rules));
}

#[test]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn kube_proxy_overall_nftables_rules() {
    if !root_with("nft") {
        return;
    }
    let text = std::fs::read_to_string(format!("{OVERALL}nftables-expected.nft")).unwrap();
    // The one adaptation: kube-proxy's test compares its transaction order-free and lists a
    // rule before the chain it jumps to; `nft -f` resolves in order, so every `add
    // table|chain|set|map` goes first (knftables sends them first too).
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    let defines = |l: &str| {
        matches!(
            l.split_whitespace().nth(1),
            Some("table" | "chain" | "set" | "map")
        )
    };
    let (mut ordered, rest): (Vec<&str>, Vec<&str>) = lines.iter().partition(|l| defines(l));
    ordered.extend(rest);
    let file = std::env::temp_dir().join(format!("kube-proxy-overall-{}.nft", std::process::id()));
    std::fs::write(&file, ordered.join("\n") + "\n").unwrap();
    let ns = Netns::new("apitable", &[""]);
    ns.exec(0, &["nft", "-f", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    let mut from_rules = ns
        .run_in(0, crate::state::nftables::read_blocking)
        .expect("read")
        .expect("kube-proxy's table");
    // The `masquerading` chain's rule: kube-proxy's configuration, not in the API objects.
    assert_eq!(from_rules.masquerade_rules.len(), 1);
    from_rules.masquerade_rules.clear();
    // kube-proxy's firewall for svc5's loadBalancerSourceRanges (issue #51): read from the
    // rules only (`ip saddr != { 203.0.113.0/25 } drop`, the element has no comment).
    let firewall = std::mem::take(&mut from_rules.firewall);
    assert_eq!(firewall.len(), 1, "{firewall:?}");
    assert_eq!(firewall[0].addr.to_string(), "5.6.7.8");
    assert_eq!((firewall[0].port, firewall[0].proto), (80, Proto::Tcp));
    assert_eq!(firewall[0].service.as_deref(), Some("ns5/svc5:p80"));
    assert_eq!(firewall[0].allowed_text(), "203.0.113.0/25");
    assert!(firewall[0].drops("10.180.0.1".parse().unwrap()));
    assert!(!firewall[0].drops("203.0.113.9".parse().unwrap()));
    let from_api = overall(ServiceSource::Nftables).expected();
    assert_eq!(from_api.services.len(), 9);
    assert_eq!(
        from_api.no_endpoint_drops.len(),
        2,
        "svc2's external and LB IP"
    );
    assert_eq!(sorted(from_api), sorted(from_rules));
}

/// kube-proxy's `TestOverallIPTablesRules` rules loaded into a scratch namespace with
/// `iptables-nft-restore` and read back over netlink (`state::iptables`, no text dump): the
/// same table as the API's, as the text parse above.
#[test]
#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn kube_proxy_overall_iptables_rules_over_netlink() {
    if !root_with("iptables-nft-restore") {
        return;
    }
    let text = std::fs::read_to_string(format!("{OVERALL}iptables-expected.txt")).unwrap();
    // Its nat table only (the service table is the nat table's), without kube-proxy's
    // `-m nfacct` counters: this kernel has no nfacct module (kube-proxy writes them only when
    // the kernel has it: kubernetes#125015 added them, #142068 is a kernel with the subsystem
    // but not the match); the matches decide nothing of the table.
    let start = text.find("*nat").expect("a nat table");
    let end = start + text[start..].find("COMMIT").expect("its COMMIT") + "COMMIT\n".len();
    let text: String = text[start..end]
        .lines()
        .map(|l| l.replace(" -m nfacct --nfacct-name localhost_nps_accepted_pkts", "") + "\n")
        .collect();
    // And the filter table's no-endpoint drops (the reader reads that chain alone).
    let all = std::fs::read_to_string(format!("{OVERALL}iptables-expected.txt")).unwrap();
    let drops: String = all
        .lines()
        .filter(|l| l.starts_with("-A KUBE-EXTERNAL-SERVICES "))
        .map(|l| format!("{l}\n"))
        .collect();
    let filter = format!("*filter\n:KUBE-EXTERNAL-SERVICES - [0:0]\n{drops}COMMIT\n");
    let ns = Netns::new("apitable-ipt", &[""]);
    ns.restore(0, &["iptables-nft-restore"], &text);
    ns.restore(0, &["iptables-nft-restore"], &filter);
    let mut from_netlink = ns
        .run_in(0, crate::state::iptables::read_blocking)
        .expect("read over netlink");
    // The pod short circuit decoded from nf_tables expressions: its detector as kube-proxy
    // wrote it (`-s 10.0.0.0/8`), for svc2's LB and external IP.
    assert_eq!(from_netlink.pod_short_circuits.len(), 2);
    assert!(
        from_netlink
            .pod_short_circuits
            .iter()
            .all(|p| p.detector == "-s 10.0.0.0/8" && p.chain == "KUBE-EXT-GNZBNJ2PO5MGZ6GT"),
        "{:?}",
        from_netlink.pod_short_circuits
    );
    assert_eq!(from_netlink.masquerade_rules.len(), 1);
    from_netlink.masquerade_rules.clear();
    from_netlink.access_filter.clear();
    let from_api = overall(ServiceSource::Iptables).expected();
    assert_eq!(from_api.services.len(), 9);
    assert_eq!(sorted(from_api), sorted(from_netlink));
}
