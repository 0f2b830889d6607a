//! Rows, order, table and pod choice from Events and Pods shaped as the API returns them.

use k8s_openapi::{
    api::{core::v1::Pod, events::v1::Event},
    jiff::Timestamp,
};

use super::*;

fn event(v: serde_json::Value) -> Event {
    serde_json::from_value(v).expect("an Event")
}

fn hairpin(name: &str, node: &str, last: &str, count: i32) -> Event {
    event(serde_json::json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "shop", "creationTimestamp": "2026-11-23T01:00:00Z"},
        "eventTime": "2026-11-23T01:00:00.000000Z",
        "series": {"count": count, "lastObservedTime": last},
        "reportingController": "clb-probe", "reportingInstance": node,
        "action": "Detected", "reason": "LoopbackHairpin", "type": "Warning",
        "note": "Pod 10.244.1.7 called the load balancer ...",
        "regarding": {"apiVersion": "v1", "kind": "Service", "namespace": "shop", "name": "web"},
        "related": {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "client-0"},
    }))
}

#[test]
fn rows_are_clb_probes_events_newest_first_with_every_column() {
    let node_event = event(serde_json::json!({
        "metadata": {"name": "clb-probe.node-b.healthcheck-blackhole.1", "namespace": "default"},
        "eventTime": "2026-11-23T02:00:00.000000Z",
        "reportingController": "clb-probe", "reportingInstance": "node-b",
        "reason": "HealthCheckBlackhole", "type": "Warning", "action": "Detected",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": "node-b"},
    }));
    let other = event(serde_json::json!({
        "metadata": {"name": "x", "namespace": "default"},
        "eventTime": "2026-11-23T03:00:00.000000Z",
        "reportingController": "kubelet", "reportingInstance": "node-a", "reason": "Pulled",
    }));
    let old = hairpin("a", "node-a", "2026-11-23T01:30:00.000000Z", 7);
    let new = hairpin("b", "node-c", "2026-11-23T02:30:00.000000Z", 2);
    let rows = rows([&old, &other, &node_event, &new]);
    assert_eq!(
        rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["b", "clb-probe.node-b.healthcheck-blackhole.1", "a"]
    );
    assert_eq!(rows[0].kind, "hairpin");
    assert_eq!(rows[0].service.as_deref(), Some("shop/web"));
    assert_eq!(rows[0].client_pod.as_deref(), Some("shop/client-0"));
    assert_eq!(rows[0].count, 2);
    assert_eq!(rows[1].kind, "healthcheck_blackhole");
    assert_eq!(rows[1].service, None, "a Node event has no Service");
    assert_eq!(rows[1].count, 1, "no series: seen once");
    assert_eq!(rows[2].count, 7);

    let now: Timestamp = "2026-11-23T03:00:00Z".parse().unwrap();
    let t = table(&rows, now);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 4, "{t}");
    for col in [
        "LAST SEEN",
        "NODE",
        "KIND",
        "SERVICE",
        "CLIENT POD",
        "COUNT",
    ] {
        assert!(lines[0].contains(col), "{t}");
    }
    assert!(
        lines[1].starts_with("30m ") && lines[1].contains("node-c"),
        "{t}"
    );
    assert!(
        lines[1].contains("shop/web") && lines[1].contains("shop/client-0"),
        "{t}"
    );
    assert!(
        lines[2].contains("node-b") && lines[2].contains(" - "),
        "{t}"
    );
    assert!(
        lines[3].starts_with("90m") && lines[3].trim_end().ends_with('7'),
        "{t}"
    );

    let json = serde_json::to_value(&rows).unwrap();
    assert_eq!(json[0]["last_seen"], "2026-11-23T02:30:00Z");
    assert_eq!(json[0]["client_pod"], "shop/client-0");
}

#[test]
fn ages_read_like_kubectl() {
    let t = |s: i64| Timestamp::from_second(s).unwrap();
    assert_eq!(age(t(1000), t(1000)), "0s");
    assert_eq!(age(t(1000), t(955)), "45s");
    assert_eq!(age(t(10_000), t(10_000 - 720)), "12m");
    assert_eq!(age(t(100_000), t(100_000 - 5 * 3600)), "5h");
    assert_eq!(age(t(1_000_000), t(1_000_000 - 3 * 86_400)), "3d");
    assert_eq!(
        age(t(0), t(50)),
        "0s",
        "a clock skewed ahead is not negative"
    );
}

fn pod(ns: &str, name: &str, node: &str, phase: &str, agent: bool) -> Pod {
    let labels = if agent {
        serde_json::json!({"app.kubernetes.io/name": "clb-probe"})
    } else {
        serde_json::json!({"app": "web"})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "agent"}]},
        "status": {"phase": phase},
    }))
    .unwrap()
}

#[test]
fn the_agent_pod_is_the_running_one_on_the_node() {
    let pods = [
        pod("clb-probe", "clb-probe-old", "node-a", "Failed", true),
        pod("clb-probe", "clb-probe-x1", "node-a", "Running", true),
        pod("clb-probe", "clb-probe-y2", "node-b", "Running", true),
        pod("shop", "web-1", "node-a", "Running", false),
    ];
    assert_eq!(
        agent_pod(&pods, "node-a"),
        Ok(("clb-probe".into(), "clb-probe-x1".into()))
    );
    let none = agent_pod(&pods, "node-z").unwrap_err();
    assert!(
        none.contains("no clb-probe agent pod on node node-z"),
        "{none}"
    );
    let not_running = agent_pod(&pods[..1], "node-a").unwrap_err();
    assert!(not_running.contains("not Running"), "{not_running}");
    let two = [
        pods[1].clone(),
        pod("other", "clb-probe-z", "node-a", "Running", true),
    ];
    assert!(
        agent_pod(&two, "node-a")
            .unwrap_err()
            .contains("-n NAMESPACE")
    );
}

#[test]
fn the_exec_command_carries_kubeconfig_and_context() {
    let cmd = exec_command(
        &KubeArgs {
            kubeconfig: Some("/tmp/my config".into()),
            context: Some("prod".into()),
        },
        "clb-probe",
        "clb-probe-x1",
    );
    assert_eq!(
        shell_words(&cmd),
        "kubectl --kubeconfig '/tmp/my config' --context prod exec -it -n clb-probe clb-probe-x1 -c agent -- probe watch"
    );
    let plain = exec_command(&KubeArgs::default(), "ns", "p");
    assert_eq!(plain[1], "exec");
}
