//! The node snapshots and the Service the unit tests of `probe check` share
//! (`tests.rs`, `readiness_tests.rs`): the lab node in iptables mode, the same node as
//! kube-proxy's IPVS mode leaves it, and `shop/web` on the lab's LB IP.

use std::{collections::BTreeMap, net::IpAddr};

use probe_contract::Proto;
use probe_core::service::{LbIngress, ServiceFacts, ServicePort};

use super::{Inputs, KernelView, NicSysctls, gather};
use crate::state::{NodePortEntry, ServiceEntry, ServiceSource, ServiceTable, addrs::Prefix};

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Each of `parts` stands in `lines` joined (a finding's evidence or remedy); a failure names
/// the part and shows the text.
#[track_caller]
pub(super) fn assert_holds(lines: &[String], parts: &[&str]) {
    let text = lines.join("\n");
    for part in parts {
        assert!(text.contains(part), "{part:?} not in:\n{text}");
    }
}

pub(super) const VIP: &str = "203.0.113.10";
/// `iptables-save -t nat` masquerade rule of every kube-proxy mode (as the reader keeps it).
pub(super) const KUBE_MASQ: &str = "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic \
                         requiring SNAT\" -j MASQUERADE --random-fully";
pub(super) const POD_MASQ: &str = "-A CLB-LAB-MASQ -s 198.19.1.0/24 -o eth0 -m comment --comment \"clb-lab: \
                        pod egress masquerade\" -j MASQUERADE";

fn served(vip: &str, port: u16) -> ServiceEntry {
    ServiceEntry {
        vip: ip(vip),
        port,
        proto: Proto::Tcp,
        service: Some("default/web:http".into()),
        backends: vec!["198.19.1.11:8080".into()],
    }
}

/// The lab node in iptables mode: eth0, kube-ipvs0 with the VIP bound and served on 80, a pod
/// /24, kube-proxy's marked masquerade only, a 6.18 kernel.
pub(super) fn lab() -> Inputs {
    Inputs {
        vip_iface: "kube-ipvs0".into(),
        bound: vec![ip(VIP)],
        owners: Default::default(),
        cluster_ips: vec![],
        lb_targets: vec![],
        pod_prefixes: vec![Prefix::parse("198.19.1.0/24").unwrap()],
        services: ServiceTable {
            source: Some(ServiceSource::Iptables),
            services: vec![served("198.18.100.10", 80), served(VIP, 80)],
            nodeports: vec![NodePortEntry {
                port: 30080,
                proto: Proto::Tcp,
                service: Some("default/web:http".into()),
                local_only: false,
            }],
            masquerade_rules: vec![KUBE_MASQ.into()],
            access_filter: vec![],
            no_endpoint_drops: vec![],
            no_endpoint_rejects: Vec::new(),
            pod_short_circuits: vec![],
            firewall: vec![],
            health_checks: vec![],
            from_api: false,
            serves_index: Default::default(),
        },
        nics: vec![NicSysctls {
            name: "eth0".into(),
            ..Default::default()
        }],
        kernel: KernelView {
            release: "6.18.0".into(),
            tcx: true,
            btf_error: None,
            drop_reason_arg: true,
            drop_reasons: 130,
            kptr_restrict: Some(0),
            kallsyms_readable: true,
        },
        api: super::ApiState::NotUsed,
        api_table: None,
        api_table_error: None,
        self_loop: Default::default(),
        dataplane: None,
        leftovers: Default::default(),
        // Not read: no probe-port findings unless a test gives listeners.
        tcp_listeners: None,
    }
}

pub(super) fn unbind(mut i: Inputs) -> Inputs {
    i.bound.clear();
    i.services.services.retain(|s| s.vip != ip(VIP));
    i
}

pub(super) fn masquerade(mut i: Inputs) -> Inputs {
    i.services.masquerade_rules.push(POD_MASQ.into());
    i
}

/// IPVS mode as kube-proxy leaves it: ClusterIPs bound and in KUBE-CLUSTER-IP, the LB
/// ingress in KUBE-LOAD-BALANCER (and -LOCAL when externalTrafficPolicy is Local).
pub(super) fn ipvs(local: bool, bound: bool) -> Inputs {
    let mut sets: BTreeMap<String, Vec<String>> = BTreeMap::new();
    sets.insert(
        gather::CLUSTER_IP_SET.into(),
        vec!["198.18.100.10,tcp:80".into()],
    );
    sets.insert(gather::LB_SET.into(), vec![format!("{VIP},tcp:80")]);
    if local {
        sets.insert(gather::LB_LOCAL_SET.into(), vec![format!("{VIP},tcp:80")]);
    }
    let (lb_targets, cluster_ips) = gather::ipset_targets(&sets);
    let mut i = lab();
    i.services.source = Some(ServiceSource::Ipvs);
    i.lb_targets = lb_targets;
    i.cluster_ips = cluster_ips;
    i.bound = vec![ip("198.18.100.10")];
    i.services.services = vec![served("198.18.100.10", 80)];
    if bound {
        i.bound.push(ip(VIP));
        i.services.services.push(served(VIP, 80));
    }
    i
}

/// `shop/web` on the lab's LB IP: 80 (served in `lab()` and `ipvs()`) and 443 (declared
/// only); externalTrafficPolicy Local (health-check NodePort 32000) or Cluster; no annotations.
pub(super) fn web(etp_local: bool, ip_mode: Option<&str>) -> ServiceFacts {
    let port = |port: u16, node_port: u16| ServicePort {
        name: None,
        protocol: "TCP".into(),
        port,
        node_port: Some(node_port),
    };
    ServiceFacts {
        cluster_ips: vec![ip("198.18.100.10")].into(),
        ingress: vec![LbIngress {
            ip: Some(ip(VIP)),
            hostname: None,
            ip_mode: ip_mode.map(Into::into),
        }]
        .into(),
        ports: vec![port(80, 30080), port(443, 30443)].into(),
        external_traffic_policy: Some(if etp_local { "Local" } else { "Cluster" }.into()),
        health_check_node_port: etp_local.then_some(32000),
        ..ServiceFacts::named("shop", "web", "LoadBalancer")
    }
}

/// Annotations as `ServiceFacts` keeps them.
pub(super) fn pairs(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
