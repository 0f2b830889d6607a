//! Legacy API discovery documents.

use serde_json::{Value, json};

use crate::kubeapi::{store, store::ResourceInfo};

/// Legacy discovery (`/api`, `/apis`, `/api/v1`, `/apis/GROUP/VERSION`), which kubectl reads
/// to map `service` to a resource: the resources of [`store::RESOURCES`], nothing else.
pub(super) fn discovery(path: &str) -> Option<Value> {
    let group_version = |r: &ResourceInfo| r.api_version.to_string();
    let resources = |gv: &str| -> Vec<Value> {
        store::RESOURCES
            .iter()
            .filter(|r| group_version(r) == gv)
            .map(|r| {
                let verbs: &[&str] = if store::is_core_event(r) {
                    &["get", "list"]
                } else {
                    &[
                        "create", "delete", "get", "list", "patch", "update", "watch",
                    ]
                };
                json!({
                    "name": r.resource,
                    "singularName": r.kind.to_ascii_lowercase(),
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": verbs,
                    "shortNames": match r.resource {
                        "pods" => json!(["po"]),
                        "services" => json!(["svc"]),
                        "nodes" => json!(["no"]),
                        "events" => json!(["ev"]),
                        // The chart's CRDs declare `lbr` and `lbv`.
                        "loopbackreports" => json!(["lbr"]),
                        "loopbackverifications" => json!(["lbv"]),
                        _ => json!([]),
                    },
                })
            })
            .collect()
    };
    let trimmed = path.trim_end_matches('/');
    match trimmed {
        "/api" => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        "/apis" => {
            let mut groups: Vec<&str> = store::RESOURCES
                .iter()
                .filter(|r| !r.group.is_empty())
                .map(|r| r.group)
                .collect();
            groups.dedup();
            Some(json!({
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": groups.iter().map(|g| {
                    let version = store::RESOURCES
                        .iter()
                        .find(|r| r.group == *g)
                        .and_then(|r| r.api_version.rsplit_once('/'))
                        .map_or("v1", |(_, v)| v);
                    let gv = json!({"groupVersion": format!("{g}/{version}"), "version": version});
                    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
                }).collect::<Vec<_>>(),
            }))
        }
        "/api/v1" => Some(json!({
            "kind": "APIResourceList", "groupVersion": "v1", "resources": resources("v1"),
        })),
        _ => {
            let gv = trimmed.strip_prefix("/apis/")?;
            let list = resources(gv);
            (gv.matches('/').count() == 1 && !list.is_empty()).then(|| {
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list})
            })
        }
    }
}
