//! API objects as the agent and the chart write them, for the tests that run the kubectl plugin
//! the way operators do (`tests/tests/kubectl_mechanism.rs`, through kubectl's plugin
//! mechanism; `tests/tests/mcp.rs`, through an MCP client), and where they find the plugin.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};

use crate::kube_fixture::plugin_bin;

/// The kubectl the tests run (`$KUBECTL`, else `kubectl` on the PATH).
pub fn kubectl() -> OsString {
    std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into())
}

/// A directory in `scratch` holding only the plugin, as `kubectl-clb_probe` (a symlink to the
/// build's binary), and a PATH with it first: what kubectl's plugin mechanism searches.
pub fn plugin_path(scratch: &Path) -> (PathBuf, OsString) {
    let dir = scratch.join("plugins");
    std::fs::create_dir_all(&dir).expect("the plugin directory");
    let link = dir.join("kubectl-clb_probe");
    if !link.exists() {
        std::os::unix::fs::symlink(plugin_bin(), &link).expect("link the plugin");
    }
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let path =
        std::env::join_paths(std::iter::once(dir.clone()).chain(std::env::split_paths(&rest)))
            .expect("a PATH");
    (dir, path)
}

/// `kubectl ARGS` with `path` as PATH and `KUBECONFIG` unset (unless `env` sets it).
pub fn kubectl_with(path: &OsString, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(kubectl())
        .args(args)
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        .envs(env.iter().copied())
        .output()
        .expect("run kubectl")
}

/// An Event as the agent writes it (and as the API stores it): about Service `web` in `ns`,
/// or about the Node when `ns` is `default`.
pub fn clb_event(name: &str, ns: &str, node: &str, reason: &str, last: &str, count: i64) -> Value {
    let regarding = if ns == "default" {
        json!({"apiVersion": "v1", "kind": "Node", "name": node})
    } else {
        json!({"apiVersion": "v1", "kind": "Service", "namespace": ns, "name": "web"})
    };
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": "2026-11-23T01:00:00.000000Z",
        "series": {"count": count, "lastObservedTime": last},
        "type": "Warning", "action": "Detected", "reason": reason,
        "reportingController": "clb-probe", "reportingInstance": node,
        "note": "cause. Remedy: fix",
        "regarding": regarding,
        "related": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "client-0"},
    })
}

/// node-a's Event of its confirmed hairpin of `shop/web`: 4 times, last at 01:10.
pub fn node_a_hairpin_event() -> Value {
    clb_event(
        "clb-probe.node-a.hairpin.1",
        "shop",
        "node-a",
        "LoopbackHairpin",
        "2026-11-23T01:10:00.000000Z",
        4,
    )
}

/// node-b's Event of a health-check black hole, about the Node: 9 times, last at 02:10.
pub fn node_b_blackhole_event() -> Value {
    clb_event(
        "clb-probe.node-b.healthcheck-blackhole.2",
        "default",
        "node-b",
        "HealthCheckBlackhole",
        "2026-11-23T02:10:00.000000Z",
        9,
    )
}

/// A LoadBalancer Service `shop/web` (port 80, LB IP 203.0.113.10).
pub fn lb_service(etp: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "shop", "name": "web", "annotations": {}},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": etp,
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10", "ipMode": "VIP"}]}},
    })
}

/// Now, RFC 3339 (seconds), for a fresh report's `lastUpdate`.
pub fn rfc3339_now() -> String {
    format!("{:.0}", k8s_openapi::jiff::Timestamp::now())
}

/// A LoopbackReport as the agent's writer stores it (clb-probe.io/v1alpha1), updated now.
pub fn node_report(node: &str, loops: Value, risks: Value) -> Value {
    let count = |v: &Value| v.as_array().map_or(0, Vec::len);
    json!({
        "apiVersion": "clb-probe.io/v1alpha1", "kind": "LoopbackReport",
        "metadata": {"name": node, "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": "u"}]},
        "status": {
            "node": node, "agentVersion": "0.1.0", "kernel": "6.12.48+deb13-amd64",
            "kubeProxyMode": "ipvs", "capabilities": [],
            "riskCount": count(&risks), "activeLoopCount": count(&loops),
            "risks": risks, "activeLoops": loops, "resolvedLoops": [],
            "lastUpdate": rfc3339_now(),
        },
    })
}

/// An active loop of a report.
pub fn active(kind: &str, service: &str, vip: &str) -> Value {
    json!({"kind": kind, "service": service, "vip": vip, "clientPods": ["shop/client-0"],
           "count": 12, "firstSeen": "2026-11-24T20:00:00Z", "lastSeen": "2026-11-24T20:05:00Z",
           "firstFix": "etp-cluster: set externalTrafficPolicy: Cluster"})
}

/// The ids of a fix plan's fixes (`fix -o json`, MCP's `fixes`), in its order.
pub fn fix_ids(plan: &Value) -> Vec<&str> {
    plan["fixes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect()
}
