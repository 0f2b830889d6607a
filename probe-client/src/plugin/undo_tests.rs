//! The diff, the undo (healthCheckNodePort included), its annotation and `--undo`'s guard,
//! from Services shaped as the API server returns them.

use serde_json::{Value, json};

use super::*;

/// `shop/web` with ETP Local (and its healthCheckNodePort), as the API stores it.
fn local_service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "shop", "name": "web", "resourceVersion": "7",
                     "annotations": {"team": "shop"},
                     "managedFields": [{"manager": "kubectl"}]},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                 "healthCheckNodePort": 32000,
                 "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}},
    })
}

/// The server's answer to `{"spec":{"externalTrafficPolicy":"Cluster"}}`: the
/// healthCheckNodePort released, a new resourceVersion, status untouched.
fn cluster_answer() -> Value {
    let mut s = local_service();
    s["spec"]["externalTrafficPolicy"] = json!("Cluster");
    s["spec"]
        .as_object_mut()
        .unwrap()
        .remove("healthCheckNodePort");
    s["metadata"]["resourceVersion"] = json!("8");
    s["metadata"]["managedFields"] = json!([{"manager": "kubectl-clb_probe"}]);
    s
}

#[test]
fn the_diff_names_only_the_fields_that_change_including_what_the_server_moved() {
    let diff = changes(&local_service(), &cluster_answer());
    assert_eq!(
        render_changes(&diff),
        "  spec.externalTrafficPolicy: \"Local\" -> \"Cluster\"\n  \
         spec.healthCheckNodePort: 32000 -> (unset)\n"
    );
    // Annotations with dots and slashes are quoted; a port's field is named by index.
    let mut after = local_service();
    after["metadata"]["annotations"]["service.beta.kubernetes.io/x"] = json!("ip");
    after["spec"]["ports"][0]["nodePort"] = json!(30081);
    assert_eq!(
        render_changes(&changes(&local_service(), &after)),
        "  metadata.annotations[\"service.beta.kubernetes.io/x\"]: (unset) -> \"ip\"\n  \
         spec.ports[0].nodePort: 30080 -> 30081\n"
    );
    // The undo annotation itself is never part of the diff.
    let mut kept = local_service();
    kept["metadata"]["annotations"][UNDO_ANNOTATION] = json!("{}");
    assert!(changes(&local_service(), &kept).is_empty());
}

#[test]
fn the_undo_of_etp_cluster_sets_the_health_check_node_port_back() {
    let record = undo_of("etp-cluster", &local_service(), &cluster_answer());
    assert_eq!(
        record.restore,
        json!({"spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000}})
    );
    assert_eq!(
        record.left,
        json!({"spec": {"externalTrafficPolicy": "Cluster", "healthCheckNodePort": null}})
    );
    // Applied and then read back, the undo finds the Service as the fix left it.
    let guarded = json!({"metadata": {"resourceVersion": "7"},
                         "spec": {"externalTrafficPolicy": "Cluster"}});
    let sent = apply_patch(&guarded, &record);
    assert_eq!(sent["metadata"]["resourceVersion"], "7");
    assert_eq!(sent["spec"]["externalTrafficPolicy"], "Cluster");
    let mut stored = cluster_answer();
    stored["metadata"]["annotations"][UNDO_ANNOTATION] =
        sent["metadata"]["annotations"][UNDO_ANNOTATION].clone();
    let (back, patch) = undo_request(&stored).unwrap();
    assert_eq!(back, record);
    assert_eq!(
        patch,
        json!({"metadata": {"resourceVersion": "8", "annotations": {UNDO_ANNOTATION: null}},
               "spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000}})
    );
}

#[test]
fn an_annotation_fix_undoes_to_its_absence_and_stacked_fixes_restore_the_first_state() {
    let before = cluster_answer();
    let mut after = before.clone();
    after["metadata"]["annotations"]["service.beta.kubernetes.io/x"] = json!("ip");
    let second = undo_of("x-ip", &before, &after);
    assert_eq!(
        second.restore,
        json!({"metadata": {"annotations": {"service.beta.kubernetes.io/x": null}}})
    );
    let first = undo_of("etp-cluster", &local_service(), &cluster_answer());
    let both = second.on_top_of(Some(first));
    assert_eq!(both.fixes, ["etp-cluster", "x-ip"]);
    assert_eq!(
        both.restore,
        json!({"metadata": {"annotations": {"service.beta.kubernetes.io/x": null}},
               "spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000}})
    );
    assert_eq!(both.left["spec"]["externalTrafficPolicy"], "Cluster");
    assert_eq!(
        both.left["metadata"]["annotations"]["service.beta.kubernetes.io/x"],
        "ip"
    );
}

#[test]
fn undo_refuses_nothing_kept_a_moved_field_and_a_foreign_record() {
    let no = undo_request(&local_service()).unwrap_err().0;
    assert!(no.contains("no undo kept on Service shop/web"), "{no}");

    let record = undo_of("etp-cluster", &local_service(), &cluster_answer());
    // Someone set Local again since (a new healthCheckNodePort allocated): refused, named.
    let mut moved = local_service();
    moved["spec"]["healthCheckNodePort"] = json!(31500);
    moved["metadata"]["annotations"][UNDO_ANNOTATION] = json!(record.to_annotation());
    let refused = undo_request(&moved).unwrap_err().0;
    assert!(
        refused.contains("changed since etp-cluster was applied")
            && refused.contains("spec.externalTrafficPolicy: \"Cluster\" -> \"Local\"")
            && refused.contains("spec.healthCheckNodePort: (unset) -> 31500"),
        "{refused}"
    );

    // A record reaching beyond spec, annotations and labels is not clb-probe's.
    let mut forged = cluster_answer();
    forged["metadata"]["annotations"][UNDO_ANNOTATION] = json!(
        json!({"fixes": ["x"], "restore": {"metadata": {"ownerReferences": []}}, "left": {}})
            .to_string()
    );
    assert!(
        undo_request(&forged)
            .unwrap_err()
            .0
            .contains("not written by clb-probe")
    );
    let mut broken = cluster_answer();
    broken["metadata"]["annotations"][UNDO_ANNOTATION] = json!("{");
    assert!(kept(&broken).unwrap_err().0.contains("does not parse"));
}

/// A Service with no annotations at all (the plugin test's shop/web): the undo deletes the
/// added annotation by its key, and the diff names it, not `metadata` as a whole (it said
/// `metadata: (unset) -> {...}` and the undo lost the annotation's removal).
#[test]
fn an_annotation_added_where_there_were_none_undoes_by_its_key() {
    let mut before = cluster_answer();
    before["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    let mut after = before.clone();
    after["metadata"]["annotations"] = json!({"service.beta.kubernetes.io/x": "ip"});
    let undo = undo_of("x-ip", &before, &after);
    assert_eq!(
        undo.restore,
        json!({"metadata": {"annotations": {"service.beta.kubernetes.io/x": null}}})
    );
    let text = render_changes(&changes(&before, &after));
    assert_eq!(
        text,
        "  metadata.annotations[\"service.beta.kubernetes.io/x\"]: (unset) -> \"ip\"\n"
    );
}
