//! Part 10's cluster ([`super::fleet`]): test-support's fake API holding a fleet's objects as
//! the agents and the plugin meet them: Nodes (the captured fixture's shape with the image
//! list a kubelet reports), the scale bench's Services and EndpointSlices (with
//! `managedFields` and kubectl's annotation, [`super::scale_api`]), one LoopbackReport per
//! node and the agents' Events. Each client gets a bearer token of its own, so the fake's
//! request log ([`FakeApiServer::traffic`]) tells one agent's requests from another's.

use std::path::{Path, PathBuf};

use anyhow::Result;
use probe_contract::report::{
    ActiveLoop, CapabilityStatus, ReportStatus, RiskStatus, object_name, rfc3339,
};
use serde_json::{Value, json};
use test_support::kubeapi::{FakeApiServer, fixtures};

use super::{net, scale_api};

/// Of every this many nodes, one has an active loop (two Services' hairpins) and Events for
/// them; of every [`RISK_EVERY`], one reports a risk; of every [`RESOLVED_EVERY`], one has a
/// resolved loop's Event.
pub const LOOP_EVERY: usize = 50;
pub const RISK_EVERY: usize = 10;
pub const RESOLVED_EVERY: usize = 20;
/// The Service every looping node's first loop names (the plugin's `fix` and `verify` read
/// it): in a real fleet, the one Service a bad LB setting breaks on many nodes.
pub const HOT_SERVICE: usize = 0;
/// Images a kubelet lists in a Node's status (it reports up to 50, `--node-status-max-images`).
const NODE_IMAGES: usize = 30;
const NOW: i64 = 1_795_000_000;

/// The node name of fleet node `i`.
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// The fake API with the fleet; stopped on drop.
pub struct FleetApi {
    api: FakeApiServer,
    work: PathBuf,
    nodes: usize,
    services: usize,
}

impl FleetApi {
    /// The fake API in the bench node namespace with `services` Services and their
    /// EndpointSlices, and no nodes yet ([`grow`](Self::grow)). It listens on every address
    /// of that namespace: the fleet's other nodes reach it over their link to it.
    pub fn start(work: &Path, services: usize) -> Result<FleetApi> {
        let api = FakeApiServer::start_in_netns_for_all(net::NS_NODE)?;
        for i in 0..services {
            api.apply(scale_api::service(i));
            api.apply(scale_api::endpoint_slice(i, false));
        }
        // Nobody watches yet: the history of the load is dropped (the clients list from the
        // current version, as after an API server's compaction).
        api.expire_history();
        Ok(FleetApi {
            api,
            work: work.to_path_buf(),
            nodes: 0,
            services,
        })
    }

    /// Nodes, reports and Events up to `nodes` nodes. The history is kept: the agents' watches
    /// stay valid (an expiry would make every agent relist 30,000 Services while the plugin is
    /// timed), and see only what they watch of it.
    pub fn grow(&mut self, nodes: usize) {
        for i in self.nodes..nodes {
            self.api.apply(node(i));
            self.api.apply(report(i, self.services));
            for event in events(i, self.services) {
                self.api.apply(event);
            }
        }
        self.nodes = self.nodes.max(nodes);
    }

    /// A kubeconfig whose requests the request log counts under `client`.
    pub fn kubeconfig(&self, client: &str) -> Result<PathBuf> {
        let path = self.work.join(format!("fleet-kubeconfig-{client}"));
        self.api.write_kubeconfig_as(&path, client)?;
        Ok(path)
    }

    /// [`kubeconfig`](Self::kubeconfig) for a client that reaches the API at `host`.
    pub fn kubeconfig_via(&self, client: &str, host: std::net::IpAddr) -> Result<PathBuf> {
        let path = self.work.join(format!("fleet-kubeconfig-{client}"));
        self.api.write_kubeconfig_as_via(&path, client, host)?;
        Ok(path)
    }

    /// One Service change: Service `services + k / 2` and its EndpointSlice added (even `k`)
    /// or removed again (odd `k`).
    pub fn change(&self, k: usize) {
        let i = self.services + k / 2;
        if k.is_multiple_of(2) {
            self.api.apply(scale_api::service(i));
            self.api.apply(scale_api::endpoint_slice(i, false));
        } else {
            self.api
                .delete("EndpointSlice", scale_api::NAMESPACE, &slice_name(i));
            self.api
                .delete("Service", scale_api::NAMESPACE, &format!("svc-{i}"));
        }
    }

    /// Node `node`'s LoopbackReport as stored, for a look after the run.
    pub fn report_of(&self, node: &str) -> Option<Value> {
        self.api
            .objects("LoopbackReport")
            .into_iter()
            .find(|r| r["metadata"]["name"] == node)
    }

    pub fn api(&self) -> &FakeApiServer {
        &self.api
    }
}

fn slice_name(i: usize) -> String {
    scale_api::endpoint_slice(i, false)["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Node `i`: the captured Node with its name, an address of its own (the agents' nodes, the
/// first few, have the bench node's: an agent outside a Pod writes its report only for a Node
/// with one of its host's addresses) and a kubelet's image list.
pub fn node(i: usize) -> Value {
    let mut node = fixtures::parse(fixtures::NODE);
    let name = node_name(i);
    let ip = if i < super::fleet::MAX_AGENTS {
        net::NODE_IP.to_string()
    } else {
        format!("10.{}.{}.{}", 16 + i / 65_536, (i / 256) % 256, i % 256)
    };
    node["metadata"]["name"] = json!(name);
    node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
    node["status"]["addresses"] = json!([
        { "type": "InternalIP", "address": ip },
        { "type": "Hostname", "address": name },
    ]);
    node["status"]["images"] = (0..NODE_IMAGES)
        .map(|k| {
            json!({
                "names": [
                    format!("registry.example.com/team-{k}/app@sha256:{:064x}", k * 7919 + 1),
                    format!("registry.example.com/team-{k}/app:v1.{k}.0"),
                ],
                "sizeBytes": 50_000_000 + k * 1_000_003,
            })
        })
        .collect();
    node
}

fn service_key(i: usize) -> String {
    format!("{}/svc-{i}", scale_api::NAMESPACE)
}

/// The two Services a looping node's loops name: the hot one and one of its own.
fn looped_services(i: usize, services: usize) -> [usize; 2] {
    [HOT_SERVICE, 1 + (i * 7) % services.saturating_sub(1).max(1)]
}

/// Node `i`'s LoopbackReport as its agent writes it: every node lists its capabilities;
/// every [`LOOP_EVERY`]th has two active loops, every [`RISK_EVERY`]th a risk.
pub fn report(i: usize, services: usize) -> Value {
    let name = node_name(i);
    let capabilities = ["tcx", "btf", "kfree_skb_reason", "conntrack", "api"]
        .into_iter()
        .map(|c| CapabilityStatus {
            name: c.into(),
            available: true,
            ..Default::default()
        })
        .collect();
    let active_loops: Vec<ActiveLoop> = if i.is_multiple_of(LOOP_EVERY) {
        looped_services(i, services)
            .into_iter()
            .map(|s| ActiveLoop {
                kind: "hairpin".into(),
                service: Some(service_key(s)),
                vip: format!("203.0.113.{}:80", 1 + s % 250),
                client_pods: vec![format!("{}/client-{i}", scale_api::NAMESPACE)],
                count: 12,
                first_seen: rfc3339(NOW - 600),
                last_seen: rfc3339(NOW - 5),
                first_fix: Some("etp-cluster: set externalTrafficPolicy Cluster".into()),
                ..Default::default()
            })
            .collect()
    } else {
        Vec::new()
    };
    let risks: Vec<RiskStatus> = if i.is_multiple_of(RISK_EVERY) {
        vec![RiskStatus {
            kind: "healthcheck_blackhole".into(),
            subject: "203.0.113.10".into(),
            service: Some(service_key(1 + i % services.max(1))),
            summary: "the LB's health check reaches no endpoint on this node".into(),
            ..Default::default()
        }]
    } else {
        Vec::new()
    };
    let status = ReportStatus {
        node: name.clone(),
        agent_version: "0.1.0".into(),
        kernel: "6.12.0".into(),
        kube_proxy_mode: "iptables".into(),
        capabilities,
        risk_count: risks.len() as u32,
        active_loop_count: active_loops.len() as u32,
        risks,
        active_loops,
        last_update: rfc3339(NOW),
        ..Default::default()
    };
    json!({
        "apiVersion": probe_contract::report::API_VERSION,
        "kind": probe_contract::report::KIND,
        "metadata": { "name": object_name(&name).unwrap_or(name) },
        "status": status,
    })
}

/// Node `i`'s Events in the agents' shape: a Warning per active loop (a repeat series), and
/// every [`RESOLVED_EVERY`]th node a `LoopbackResolved`.
pub fn events(i: usize, services: usize) -> Vec<Value> {
    let node = node_name(i);
    let mut out = Vec::new();
    if i.is_multiple_of(LOOP_EVERY) {
        for s in looped_services(i, services) {
            out.push(event(&node, s, "Warning", "Detected", "LoopbackHairpin"));
        }
    }
    if i.is_multiple_of(RESOLVED_EVERY) {
        let s = 1 + (i * 13) % services.saturating_sub(1).max(1);
        out.push(event(&node, s, "Normal", "Resolved", "LoopbackResolved"));
    }
    out
}

fn event(node: &str, service: usize, kind: &str, action: &str, reason: &str) -> Value {
    let ns = scale_api::NAMESPACE;
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": { "name": format!("clb-probe.{node}.{reason}.{service}"), "namespace": ns },
        "eventTime": "2026-11-27T01:00:00.000000Z",
        "series": { "count": 12, "lastObservedTime": "2026-11-27T01:09:55.000000Z" },
        "type": kind, "action": action, "reason": reason,
        "reportingController": "clb-probe",
        "reportingInstance": probe_contract::kube_event::reporting_instance(node),
        "note": "a pod reached its own Service's LB address and was sent back to itself \
                 (hairpin). Remedy: etp-cluster: set externalTrafficPolicy Cluster",
        "regarding": { "apiVersion": "v1", "kind": "Service", "namespace": ns,
                       "name": format!("svc-{service}") },
        "related": { "apiVersion": "v1", "kind": "Pod", "namespace": ns,
                     "name": format!("client-{service}") },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_objects_read_back_as_the_contract_says() {
        let r = report(LOOP_EVERY, 100);
        let status: ReportStatus = serde_json::from_value(r["status"].clone()).unwrap();
        assert_eq!(status.node, "node-50");
        assert_eq!(status.active_loop_count, 2);
        assert_eq!(
            status.active_loops[0].service.as_deref(),
            Some("scale/svc-0")
        );
        assert_eq!(status.risk_count, 1);
        let quiet: ReportStatus = serde_json::from_value(report(1, 100)["status"].clone()).unwrap();
        assert_eq!((quiet.active_loop_count, quiet.risk_count), (0, 0));
        // A looping node: its two Warnings and, every RESOLVED_EVERY, a resolution.
        assert_eq!(events(LOOP_EVERY, 100).len(), 2);
        assert_eq!(events(2 * LOOP_EVERY, 100).len(), 2 + 1);
        assert!(events(1, 100).is_empty());
        let e = &events(LOOP_EVERY, 100)[0];
        assert_eq!(e["regarding"]["name"], "svc-0");
        assert_eq!(e["reportingInstance"], "node-50");
        let n = node(7);
        assert_eq!(n["metadata"]["name"], "node-7");
        assert_eq!(
            n["status"]["addresses"][0]["address"],
            net::NODE_IP.to_string()
        );
        assert_eq!(n["status"]["images"].as_array().unwrap().len(), NODE_IMAGES);
        assert_eq!(
            node(70_000)["status"]["addresses"][0]["address"],
            "10.17.17.112"
        );
    }
}
