//! Part 9's API-backed row (`--scale-api`): test-support's fake Kubernetes API in the bench
//! node namespace, holding the bench's `n` Services (the ones [`super::scale_rules`] writes
//! kube-proxy's rules for: ClusterIP, a NodePort for the first 2,000) and their
//! EndpointSlices, shaped as a real API server returns them: `managedFields` and, on the
//! Services, kubectl's `last-applied-configuration` annotation (a whole copy of the manifest),
//! so an agent that keeps the objects unpruned pays for it in RSS as it would on a cluster.
//!
//! The shapes follow test-support's captured fixtures (`test-support/src/kubeapi/fixtures/`:
//! `service-web.json`, `endpointslice-web.json`); `managedFields` as the API server records an
//! Update by `kubectl apply` (client-side apply: manager `kubectl-client-side-apply`) and by
//! the EndpointSlice controller (manager `kube-controller-manager`), FieldsV1 as documented in
//! <https://kubernetes.io/docs/reference/using-api/server-side-apply/#field-management>.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::{Value, json};
use test_support::kubeapi::{FakeApiServer, fixtures};

use super::{
    net,
    scale_rules::{NODEPORTS, backend, cluster_ip},
};

/// The namespace of the bench's Services.
pub const NAMESPACE: &str = "scale";
/// The node the agent is told it runs on (the fixtures' node).
pub const NODE_NAME: &str = "clb-node";
const TIME: &str = "2026-01-01T00:00:00Z";

/// The fake API with the Services of one start; stopped on drop.
pub struct ScaleApi {
    api: FakeApiServer,
    kubeconfig: PathBuf,
}

impl ScaleApi {
    /// The fake API in the bench node namespace with the node and `n` Services and their
    /// EndpointSlices; its kubeconfig written to `work`.
    pub fn start(work: &Path, n: usize) -> Result<ScaleApi> {
        let t = std::time::Instant::now();
        let api = FakeApiServer::start_in_netns(net::NS_NODE)?;
        api.apply(fixtures::parse(fixtures::NODE));
        for i in 0..n {
            api.apply(service(i));
            api.apply(endpoint_slice(i, false));
        }
        // Nobody watches yet: the history of the load (two copies of every object) is
        // dropped. The agent lists from resourceVersion 0 and watches from the list's version,
        // which stays valid.
        api.expire_history();
        let kubeconfig = work.join("scale-kubeconfig");
        api.write_kubeconfig(&kubeconfig)?;
        eprintln!(
            "bench: scale   fake API with {n} Services and EndpointSlices in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        Ok(ScaleApi { api, kubeconfig })
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Service `i` and its EndpointSlice created (or replaced).
    pub fn add(&self, i: usize) {
        self.api.apply(service(i));
        self.api.apply(endpoint_slice(i, false));
    }

    /// Service `i`'s endpoint moved (`moved`) or back.
    pub fn move_endpoint(&self, i: usize, moved: bool) {
        self.api.apply(endpoint_slice(i, moved));
    }

    /// Service `i` and its EndpointSlice deleted.
    pub fn remove(&self, i: usize) {
        self.api.delete("EndpointSlice", NAMESPACE, &slice_name(i));
        self.api.delete("Service", NAMESPACE, &service_name(i));
    }

    /// Services the API holds (a check that the load is what the rules say).
    pub fn services(&self) -> usize {
        self.api.objects("services").len()
    }
}

fn service_name(i: usize) -> String {
    format!("svc-{i}")
}

/// The EndpointSlice controller names slices `<service>-<5 random characters>`.
fn slice_name(i: usize) -> String {
    format!("svc-{i}-{:05x}", i % 0x10_0000)
}

fn uid(kind: u8, i: usize) -> String {
    format!("00000000-0000-4{kind:03x}-8000-{i:012x}")
}

/// Service `i` as the API returns it after `kubectl apply` of its manifest.
pub fn service(i: usize) -> Value {
    let name = service_name(i);
    let node_port = i < NODEPORTS;
    let mut port = json!({ "name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080 });
    if node_port {
        port["nodePort"] = json!(30_000 + i);
    }
    let kind = if node_port { "NodePort" } else { "ClusterIP" };
    // What `kubectl apply` was given, kept whole in the annotation (compact JSON and a newline,
    // as kubectl writes it).
    let mut applied_port = json!({ "name": "http", "port": 80, "targetPort": 8080 });
    if node_port {
        applied_port["nodePort"] = json!(30_000 + i);
    }
    let applied = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "annotations": {},
            "labels": { "app": name, "app.kubernetes.io/part-of": "scale" },
            "name": name,
            "namespace": NAMESPACE,
        },
        "spec": { "ports": [applied_port], "selector": { "app": name }, "type": kind },
    });
    let mut port_fields = json!({
        ".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}
    });
    if node_port {
        port_fields["f:nodePort"] = json!({});
    }
    let mut spec_fields = json!({
        "f:internalTrafficPolicy": {},
        "f:ports": { ".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}": port_fields },
        "f:selector": {},
        "f:sessionAffinity": {},
        "f:type": {},
    });
    let mut spec = json!({
        "type": kind,
        "selector": { "app": name },
        "clusterIP": cluster_ip(i),
        "clusterIPs": [cluster_ip(i)],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "ports": [port],
        "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster",
    });
    if node_port {
        spec["externalTrafficPolicy"] = json!("Cluster");
        spec_fields["f:externalTrafficPolicy"] = json!({});
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid(1, i),
            "labels": { "app": name, "app.kubernetes.io/part-of": "scale" },
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration":
                    format!("{}\n", applied),
            },
            "managedFields": [{
                "manager": "kubectl-client-side-apply",
                "operation": "Update",
                "apiVersion": "v1",
                "time": TIME,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {
                        "f:annotations": {
                            ".": {},
                            "f:kubectl.kubernetes.io/last-applied-configuration": {}
                        },
                        "f:labels": { ".": {}, "f:app": {}, "f:app.kubernetes.io/part-of": {} }
                    },
                    "f:spec": spec_fields,
                },
            }],
        },
        "spec": spec,
        "status": { "loadBalancer": {} },
    })
}

/// Service `i`'s EndpointSlice (one ready endpoint, `moved`: the other address) as the
/// EndpointSlice controller writes it.
pub fn endpoint_slice(i: usize, moved: bool) -> Value {
    let service = service_name(i);
    let owner = uid(1, i);
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(i),
            "generateName": format!("{service}-"),
            "namespace": NAMESPACE,
            "uid": uid(2, i),
            "labels": {
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": service,
                "app": service,
                "app.kubernetes.io/part-of": "scale",
            },
            "annotations": { "endpoints.kubernetes.io/last-change-trigger-time": TIME },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Service",
                "name": service,
                "uid": owner,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
            "managedFields": [{
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "discovery.k8s.io/v1",
                "time": TIME,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:addressType": {},
                    "f:endpoints": {},
                    "f:metadata": {
                        "f:annotations": {
                            ".": {},
                            "f:endpoints.kubernetes.io/last-change-trigger-time": {}
                        },
                        "f:generateName": {},
                        "f:labels": {
                            ".": {},
                            "f:app": {},
                            "f:app.kubernetes.io/part-of": {},
                            "f:endpointslice.kubernetes.io/managed-by": {},
                            "f:kubernetes.io/service-name": {}
                        },
                        "f:ownerReferences": {
                            ".": {},
                            format!("k:{{\"uid\":\"{owner}\"}}"): {}
                        }
                    },
                    "f:ports": {},
                },
            }],
        },
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": [backend(i, moved)],
            "conditions": { "ready": true, "serving": true, "terminating": false },
            "nodeName": NODE_NAME,
            "targetRef": {
                "kind": "Pod",
                "namespace": NAMESPACE,
                "name": format!("{service}-7c4b9d8f5-{:05x}", i % 0x10_0000),
                "uid": uid(3, i),
            },
            "zone": "eu-west-1a",
        }],
        "ports": [{ "name": "http", "protocol": "TCP", "port": 8080 }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_carry_what_a_real_api_adds_and_match_the_rules() {
        let svc = service(3);
        assert_eq!(svc["spec"]["clusterIP"], cluster_ip(3));
        assert_eq!(svc["spec"]["ports"][0]["nodePort"], 30_003);
        assert!(service(NODEPORTS)["spec"]["ports"][0]["nodePort"].is_null());
        let applied =
            svc["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
                .as_str()
                .unwrap();
        let applied: Value = serde_json::from_str(applied).unwrap();
        assert_eq!(applied["metadata"]["name"], "svc-3");
        assert!(svc["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"].is_object());
        let slice = endpoint_slice(3, true);
        assert_eq!(slice["endpoints"][0]["addresses"][0], backend(3, true));
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "svc-3"
        );
        assert_eq!(
            slice["metadata"]["ownerReferences"][0]["uid"],
            svc["metadata"]["uid"]
        );
    }
}
