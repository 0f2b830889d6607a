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
    // Every column, in order, and nothing else in the header.
    let header = lines[0].split_whitespace().collect::<Vec<_>>().join(" ");
    let columns = "LAST SEEN NODE KIND SERVICE CLIENT POD COUNT";
    assert_eq!(header, columns, "{t}");
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
        "metadata": {"name": name, "namespace": ns, "labels": labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "clb-probe", "uid": "u1", "controller": true}]},
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
        agent_pod(&pods, "clb-probe", "node-a"),
        Ok(("clb-probe".into(), "clb-probe-x1".into()))
    );
    let none = agent_pod(&pods, "clb-probe", "node-z").unwrap_err();
    assert!(
        none.to_string()
            .contains("no clb-probe agent pod on node node-z"),
        "{none}"
    );
    let not_running = agent_pod(&pods[..1], "clb-probe", "node-a").unwrap_err();
    assert!(
        not_running.to_string().contains("not Running"),
        "{not_running}"
    );
    let two = [
        pods[1].clone(),
        pod("clb-probe", "clb-probe-z", "node-a", "Running", true),
    ];
    assert!(
        agent_pod(&two, "clb-probe", "node-a")
            .unwrap_err()
            .to_string()
            .contains("2 clb-probe pods")
    );
}

/// A tenant's pod labelled as the agent (in its own namespace, or a bare pod in the agent's
/// namespace) is never the one exec'd into, whether the agent runs or not.
#[test]
fn a_labelled_tenant_pod_is_never_chosen() {
    let agent = pod("clb-probe", "clb-probe-x1", "node-a", "Running", true);
    let tenant = pod("shop", "fake-agent", "node-a", "Running", true);
    let mut bare = pod("clb-probe", "bare", "node-a", "Running", true);
    bare.metadata.owner_references = None;
    let mut replica = pod("clb-probe", "rs-pod", "node-a", "Running", true);
    replica.metadata.owner_references.as_mut().unwrap()[0].kind = "ReplicaSet".into();
    for others in [
        vec![tenant.clone()],
        vec![bare.clone()],
        vec![replica.clone()],
    ] {
        assert!(agent_pod(&others, "clb-probe", "node-a").is_err());
        let mut with_agent = others.clone();
        with_agent.push(agent.clone());
        assert_eq!(
            agent_pod(&with_agent, "clb-probe", "node-a"),
            Ok(("clb-probe".into(), "clb-probe-x1".into()))
        );
    }
}

/// A forged Event: control characters come out escaped in the table, and an Event not in the
/// agent's shape is marked; the JSON rows keep the bytes (serde escapes them).
#[test]
fn forged_events_are_escaped_and_marked() {
    let forged = event(serde_json::json!({
        "metadata": {"name": "x", "namespace": "shop"},
        "eventTime": "2026-11-23T02:00:00.000000Z",
        "reportingController": "clb-probe",
        "reportingInstance": "\x1b[2J\x1b[H\x1b[32mALL CLEAR\x07",
        "reason": "Loopback\u{9b}31m", "type": "Warning", "action": "Detected",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }));
    let good = hairpin("a", "node-a", "2026-11-23T01:30:00.000000Z", 7);
    assert_eq!(forged_because(&good), None);
    assert!(forged_because(&forged).is_some());
    // Each rule on its own, from the agent's shape.
    let tweak = |f: &dyn Fn(&mut Event)| {
        let mut e = hairpin("a", "node-a", "2026-11-23T01:30:00.000000Z", 7);
        f(&mut e);
        forged_because(&e)
    };
    assert!(tweak(&|e| e.type_ = Some("Normal".into())).is_some());
    // A resolution is Normal with action Resolved; a Warning may not borrow its reason.
    assert_eq!(
        tweak(&|e| {
            e.type_ = Some("Normal".into());
            e.action = Some("Resolved".into());
            e.reason = Some("LoopbackResolved".into());
        }),
        None
    );
    assert!(tweak(&|e| e.reason = Some("LoopbackResolved".into())).is_some());
    assert!(tweak(&|e| e.reason = Some("AllClear".into())).is_some());
    assert!(tweak(&|e| e.reporting_instance = Some("Node A".into())).is_some());
    assert!(tweak(&|e| e.metadata.namespace = Some("other".into())).is_some());
    assert!(
        tweak(&|e| e.regarding.as_mut().unwrap().kind = Some("Node".into())).is_some(),
        "a Node Event outside default"
    );

    let rows = rows([&forged, &good]);
    let t = table(&rows, "2026-11-23T03:00:00Z".parse().unwrap());
    assert!(
        !t.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters in {t:?}"
    );
    assert!(t.contains("\\x1b[2J\\x1b[H\\x1b[32mALL CLEAR\\x07"), "{t}");
    assert!(t.contains("Loopback\\u{9b}31m*"), "{t}");
    assert!(t.trim_end().ends_with(FORGED_FOOTER), "{t}");
    let json = serde_json::to_string(&rows).unwrap();
    let back: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        back[0]["node"], "\u{1b}[2J\u{1b}[H\u{1b}[32mALL CLEAR\u{7}",
        "JSON keeps the bytes"
    );
    assert!(back[0].get("forged_because").is_none(), "-o json unchanged");
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

/// Issue #49: a LoopbackResolved Event was listed as if it were a kind of its own, untied to
/// the loop it resolved: it reads `<kind> resolved` now.
#[test]
fn a_resolution_is_listed_as_its_loops_kind_resolved() {
    let mut e = hairpin("r", "node-a", "2026-11-23T01:30:00.000000Z", 1);
    e.type_ = Some("Normal".into());
    e.action = Some("Resolved".into());
    e.reason = Some("LoopbackResolved".into());
    e.note =
        Some("Resolved: hairpin at 203.0.113.10:80 is no longer confirmed; it lasted 21 s".into());
    assert_eq!(row(&e).unwrap().kind, "hairpin resolved");
    e.note = Some("something else".into());
    assert_eq!(row(&e).unwrap().kind, "resolved");
    assert_eq!(
        row(&hairpin("h", "node-a", "2026-11-23T01:30:00.000000Z", 1))
            .unwrap()
            .kind,
        "hairpin"
    );
}
