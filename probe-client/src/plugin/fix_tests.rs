//! `fix`'s plan, refusals and Service naming, from Services shaped as the API returns them.

use serde_json::json;

use super::*;

fn service(etp: &str, annotations: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "web", "resourceVersion": "7",
                     "annotations": annotations},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": etp,
                 "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}},
    }))
    .unwrap()
}

#[test]
fn apply_refuses_a_moved_service_another_provider_s_fix_and_advice() {
    let kinds = [(LoopbackKind::Hairpin, true)];
    let plan = plan(
        &service("Local", json!({})),
        ["gce://p/z/vm"],
        None,
        &kinds,
        &[],
    )
    .unwrap();
    assert_eq!(
        (plan.provider.as_str(), plan.provider_from.as_str()),
        ("gce", "node providerID")
    );
    // The plugin does not see the nodes' kube-proxy: etp-cluster says it assumes it.
    let etp = plan.fixes.iter().find(|f| f.id == "etp-cluster").unwrap();
    assert!(
        etp.preconditions.iter().any(|p| p.contains("kube-proxy")),
        "{etp:?}"
    );
    assert!(select(&plan, "etp-cluster", Some("7")).is_ok());
    let moved = select(&plan, "etp-cluster", Some("6")).unwrap_err().0;
    assert!(
        moved.contains("changed since the fix was computed"),
        "{moved}"
    );
    let other = select(&plan, "aws-nlb-target-type-ip", None).unwrap_err().0;
    assert!(
        other.contains("is for provider aws") && other.contains("provider is gce"),
        "{other}"
    );
    let advice = select(&plan, "call-by-service-name", None).unwrap_err().0;
    assert!(advice.contains("has no patch"), "{advice}");
    assert!(
        select(&plan, "nope", None)
            .unwrap_err()
            .0
            .contains("no fix \"nope\"")
    );
    let fix = select(&plan, "etp-cluster", None).unwrap();
    assert_eq!(
        guarded_patch(fix, Some("7")),
        json!({"metadata": {"resourceVersion": "7"}, "spec": {"externalTrafficPolicy": "Cluster"}})
    );
    assert_eq!(
        patch_command(fix.undo.as_ref().unwrap(), "shop", "web"),
        r#"kubectl patch service -n shop web --type merge -p '{"spec":{"externalTrafficPolicy":"Local"}}'"#
    );
    // Cluster already: "set Cluster" is not offered, so not applied.
    let cluster = plan_of("Cluster");
    assert!(
        select(&cluster, "etp-cluster", None)
            .unwrap_err()
            .0
            .contains("already in place")
    );
}

#[test]
fn a_service_is_named_as_report_prints_it_or_by_name_and_namespace() {
    let ok = |a: &str, n: Option<&str>| service_ref(a, n).map_err(|e| e.0);
    let pair = |ns: &str, name: &str| Ok((ns.to_string(), name.to_string()));
    assert_eq!(ok("web", None), pair("default", "web"));
    assert_eq!(ok("web", Some("shop")), pair("shop", "web"));
    assert_eq!(ok("shop/web", None), pair("shop", "web"));
    assert_eq!(ok("shop/web", Some("shop")), pair("shop", "web"));
    assert!(ok("shop/web", Some("other")).is_err());
    assert!(ok("/web", None).is_err());
    assert!(ok("a/b/c", None).is_err());
}

fn plan_of(etp: &str) -> Plan {
    plan(
        &service(etp, json!({})),
        [],
        None,
        &[(LoopbackKind::Hairpin, true)],
        &[],
    )
    .unwrap()
}

/// Reports as the agents write them: a hairpin on shop/web with the fixes computed on the node,
/// and a risk on the LB IP shared with shop/api.
fn reports() -> Vec<(String, probe_contract::report::ReportStatus)> {
    use probe_contract::report::{ActiveLoop, ReportStatus, RiskStatus};
    let status = ReportStatus {
        active_loops: vec![ActiveLoop {
            kind: "hairpin".into(),
            service: Some("shop/web:http".into()),
            fixes: vec![
                "tencent-prevent-loopback".into(),
                "etp-cluster".into(),
                "call-by-service-name".into(),
            ],
            ..Default::default()
        }],
        risks: vec![
            RiskStatus {
                kind: "healthcheck_blackhole".into(),
                service: Some("shop/api".into()),
                services: vec!["shop/api".into(), "shop/web".into()],
                fixes: vec![
                    "etp-cluster".into(),
                    "tencent-clb-healthcheck-source".into(),
                ],
                ..Default::default()
            },
            // An older agent: no ids, skipped.
            RiskStatus {
                kind: "hairpin".into(),
                service: Some("shop/web".into()),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    vec![("node-a".into(), status)]
}

#[test]
fn the_agents_fixes_are_listed_in_their_order_without_those_in_place() {
    let agent = agent_fixes(&reports(), "shop/web");
    assert_eq!(
        agent,
        [
            AgentFixes {
                kind: LoopbackKind::Hairpin,
                ids: vec![
                    "tencent-prevent-loopback".into(),
                    "etp-cluster".into(),
                    "call-by-service-name".into()
                ],
            },
            AgentFixes {
                kind: LoopbackKind::HealthcheckBlackhole,
                ids: vec![
                    "etp-cluster".into(),
                    "tencent-clb-healthcheck-source".into()
                ],
            },
        ]
    );
    assert!(agent_fixes(&reports(), "shop/other").is_empty());
    let kinds = [(LoopbackKind::Hairpin, true)];
    let svc = service("Local", json!({}));
    let listed = plan(&svc, ["qcloud://ap-guangzhou/ins-1"], None, &kinds, &agent).unwrap();
    assert_eq!(listed.fixes_from, "agents");
    let ids: Vec<&str> = listed.fixes.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "tencent-prevent-loopback",
            "etp-cluster",
            "call-by-service-name",
            "tencent-clb-healthcheck-source"
        ]
    );
    // The node saw kube-proxy program the LB IP: etp-cluster assumes nothing.
    let etp = &listed.fixes[1];
    assert!(
        !etp.preconditions
            .iter()
            .any(|p| p.contains("not all of it was read")),
        "{etp:?}"
    );
    // In place since the agent computed them: dropped.
    let svc = service(
        "Cluster",
        json!({"service.cloud.tencent.com/prevent-loopback": "true"}),
    );
    let now = plan(&svc, ["qcloud://ap-guangzhou/ins-1"], None, &kinds, &agent).unwrap();
    let ids: Vec<&str> = now.fixes.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(
        ids,
        ["call-by-service-name", "tencent-clb-healthcheck-source"]
    );
    // No agent list: recomputed from the Service.
    assert_eq!(plan_of("Local").fixes_from, "service");
    assert!(render(&listed).contains("as the agents computed them"));
}

/// An agent without `--provider` (it reads no Nodes) listed the generic fixes only; the plugin
/// sees a TKE node: Tencent's own fix comes first, then the agent's list.
#[test]
fn the_nodes_provider_s_own_fixes_come_before_an_agent_s_generic_list() {
    let agent = [AgentFixes {
        kind: LoopbackKind::Hairpin,
        ids: vec!["etp-cluster".into(), "call-by-service-name".into()],
    }];
    let kinds = [(LoopbackKind::Hairpin, true)];
    let svc = service("Local", json!({}));
    let listed = plan(&svc, ["qcloud://ap-guangzhou/ins-1"], None, &kinds, &agent).unwrap();
    let ids: Vec<&str> = listed.fixes.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids.first(), Some(&"tencent-prevent-loopback"), "{ids:?}");
    assert_eq!(
        ids[ids.len() - 2..],
        ["etp-cluster", "call-by-service-name"],
        "{ids:?}"
    );
    // A generic cluster: the agent's list as it is.
    let generic = plan(&svc, [], None, &kinds, &agent).unwrap();
    let ids: Vec<&str> = generic.fixes.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids, ["etp-cluster", "call-by-service-name"]);
}

/// Issue #49: Events from a reportingInstance that is no listed Node were dropped without a
/// word; they are counted so the plugin can say so.
#[test]
fn events_from_unknown_nodes_are_counted() {
    let ev = |instance: &str| -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("e-{instance}"), "namespace": "shop"},
            "eventTime": "2026-11-23T01:00:00.000000Z",
            "type": "Warning", "action": "Detected", "reason": "LoopbackHairpin",
            "reportingController": "clb-probe", "reportingInstance": instance,
            "regarding": {"kind": "Service", "namespace": "shop", "name": "web"},
        }))
        .unwrap()
    };
    let events = [ev("node-a"), ev("node-gone")];
    let nodes = vec!["node-a".to_string()];
    assert_eq!(
        events_from_unknown_nodes(&events, "shop", "web", Some(&nodes)),
        1
    );
    assert_eq!(events_from_unknown_nodes(&events, "shop", "web", None), 0);
    assert_eq!(
        confirmed_kinds(&events, "shop", "web", Some(&nodes)).len(),
        1
    );
}
