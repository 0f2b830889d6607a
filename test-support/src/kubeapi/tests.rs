//! The fake server against the real kube client (kube 5, k8s-openapi v1_34).

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
    events::v1::Event,
};
use kube::{
    api::{Api, ListParams, Patch, PatchParams, PostParams, VersionMatch, WatchEvent, WatchParams},
    runtime::watcher,
};
use serde_json::json;

use super::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A server with the lab's fixtures and a client built from the kubeconfig it writes.
async fn setup() -> (FakeApiServer, kube::Client, tempdir::Dir) {
    let api = FakeApiServer::start().unwrap();
    for object in fixtures::lab() {
        api.apply(object);
    }
    let dir = tempdir::Dir::new();
    let path = dir.0.join("kubeconfig");
    api.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    (api, kube::Client::try_from(config).unwrap(), dir)
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path =
                std::env::temp_dir().join(format!("kubeapi-test-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The resourceVersion a list of everything in `api` is at.
async fn listed_version<K>(api: &Api<K>) -> String
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = api.list(&ListParams::default()).await.unwrap();
    listed.metadata.resource_version.unwrap()
}

fn error_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[test]
fn list_get_and_selectors_through_the_real_client() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        assert_eq!(client.apiserver_version().await.unwrap().minor, "34");

        let pods: Api<Pod> = Api::all(client.clone());
        let on_node = pods
            .list(&ListParams::default().fields("spec.nodeName=clb-node"))
            .await
            .unwrap();
        assert_eq!(on_node.items.len(), 2);
        assert!(on_node.metadata.resource_version.is_some());
        let elsewhere = pods
            .list(&ListParams::default().fields("spec.nodeName=other"))
            .await
            .unwrap();
        assert!(elsewhere.items.is_empty());
        let web = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap();
        assert_eq!(web.items.len(), 1);
        assert_eq!(
            web.items[0].metadata.name.as_deref(),
            Some(fixtures::WEB_POD)
        );
        assert_eq!(
            web.items[0].status.as_ref().unwrap().pod_ip.as_deref(),
            Some("198.19.1.11")
        );

        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let service = services.get("web").await.unwrap();
        let spec = service.spec.unwrap();
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(spec.ports.unwrap()[0].node_port, Some(30080));
        let ingress = &service
            .status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap()[0];
        assert_eq!(
            (ingress.ip.as_deref(), ingress.ip_mode.as_deref()),
            (Some("203.0.113.10"), Some("VIP"))
        );

        let slices: Api<EndpointSlice> = Api::all(client.clone());
        let slices = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .unwrap();
        assert_eq!(slices.items.len(), 1);

        let missing = services.get("nope").await.unwrap_err();
        assert_eq!(error_code(&missing), Some(404));
        let unknown = client
            .request_text(
                hyper::Request::get("/apis/nope.example/v1/things")
                    .body(vec![])
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(error_code(&unknown), Some(404));
        assert!(
            api.requests()
                .iter()
                .any(|r| r.method == "GET" && r.path.starts_with("/api/v1/pods?"))
        );
        api.stop();
    });
}

#[test]
fn watch_streams_changes_and_bookmarks() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let listed = pods.list(&ListParams::default()).await.unwrap();
        let version = listed.metadata.resource_version.unwrap();
        let mut stream = pods
            .watch(&WatchParams::default().timeout(30), &version)
            .await
            .unwrap()
            .boxed();

        let mut pod = fixtures::parse(fixtures::POD_CLIENT);
        pod["metadata"]["labels"]["tier"] = json!("front");
        api.apply(pod);
        api.delete("pods", "default", fixtures::WEB_POD);
        // A pod elsewhere: a namespaced watch does not see it.
        let mut other = fixtures::parse(fixtures::POD_WEB);
        other["metadata"]["namespace"] = json!("other");
        api.apply(other);

        let mut seen = Vec::new();
        let mut bookmark = false;
        while let Some(event) = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            match event {
                WatchEvent::Modified(pod) => seen.push(("MODIFIED", pod.metadata.name.unwrap())),
                WatchEvent::Deleted(pod) => seen.push(("DELETED", pod.metadata.name.unwrap())),
                WatchEvent::Added(pod) => seen.push(("ADDED", pod.metadata.name.unwrap())),
                WatchEvent::Bookmark(_) => {
                    bookmark = true;
                    break;
                }
                WatchEvent::Error(error) => panic!("watch error {error:?}"),
            }
        }
        assert_eq!(
            seen,
            [
                ("MODIFIED", fixtures::CLIENT_POD.to_owned()),
                ("DELETED", fixtures::WEB_POD.to_owned())
            ]
        );
        assert!(bookmark);
    });
}

#[test]
fn expired_history_is_410_for_watch_and_list() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        let services: Api<Service> = Api::all(client);
        let version = listed_version(&services).await;
        api.expire_history();

        let mut stream = services
            .watch(&WatchParams::default(), &version)
            .await
            .unwrap()
            .boxed();
        match stream.try_next().await.unwrap() {
            Some(WatchEvent::Error(status)) => {
                assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            }
            other => panic!("expected a 410 ERROR event, got {other:?}"),
        }
        assert!(
            stream.try_next().await.unwrap().is_none(),
            "the stream ends after the 410"
        );

        let old = ListParams::default()
            .at(&version)
            .matching(VersionMatch::NotOlderThan);
        assert_eq!(
            error_code(&services.list(&old).await.unwrap_err()),
            Some(410)
        );
        // A relist gets a version that watches again.
        let fresh = listed_version(&services).await;
        api.delete("Service", "default", "dns");
        let mut stream = services
            .watch(&WatchParams::default(), &fresh)
            .await
            .unwrap()
            .boxed();
        assert!(matches!(
            stream.try_next().await.unwrap(),
            Some(WatchEvent::Deleted(_))
        ));
    });
}

#[test]
fn the_runtime_watcher_relists_after_410_and_sees_later_objects() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        let services: Api<Service> = Api::all(client);
        let mut events = watcher(services, watcher::Config::default()).boxed();
        let mut names = std::collections::BTreeSet::new();
        let mut step = 0;
        loop {
            let event = tokio::time::timeout(Duration::from_secs(20), events.next())
                .await
                .unwrap()
                .unwrap();
            match event {
                Ok(watcher::Event::InitDone) if step == 0 => {
                    step = 1;
                    api.expire_history();
                    let mut late = fixtures::parse(fixtures::SERVICE_WEB);
                    late["metadata"]["name"] = json!("late");
                    api.apply(late);
                }
                Ok(watcher::Event::InitApply(service) | watcher::Event::Apply(service)) => {
                    names.insert(service.metadata.name.unwrap());
                    if names.contains("late") {
                        break;
                    }
                }
                Ok(_) => {}
                // The 410 surfaces as an error item before the watcher relists.
                Err(error) => assert!(
                    error.to_string().contains("410") || error.to_string().contains("Expired"),
                    "{error}"
                ),
            }
        }
        let lists = api
            .requests()
            .iter()
            .filter(|r| r.path.starts_with("/api/v1/services?") && !r.path.contains("watch="))
            .count();
        assert!(lists >= 2, "a relist after the 410");
    });
}

#[test]
fn ended_watches_are_rewatched_from_their_version_without_a_relist() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        let services: Api<Service> = Api::all(client);
        let mut events = watcher(services, watcher::Config::default()).boxed();
        let watches = |api: &FakeApiServer| {
            api.requests()
                .iter()
                .filter(|r| r.path.starts_with("/api/v1/services?") && r.path.contains("watch="))
                .count()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let (mut ended, mut changed) = (false, false);
        loop {
            assert!(tokio::time::Instant::now() < deadline, "no late Service");
            // The watcher opens its watch only while polled: poll; once the watch is open, end
            // it; once it is open again, change something (seen through the new watch only).
            match tokio::time::timeout(Duration::from_millis(50), events.next()).await {
                Err(_) if !ended && watches(&api) == 1 => {
                    ended = true;
                    api.end_watches();
                }
                Err(_) if ended && !changed && watches(&api) == 2 => {
                    changed = true;
                    let mut late = fixtures::parse(fixtures::SERVICE_WEB);
                    late["metadata"]["name"] = json!("late");
                    api.apply(late);
                }
                Err(_) => {}
                Ok(event) => {
                    if let watcher::Event::Apply(service) = event.unwrap().unwrap()
                        && service.metadata.name.as_deref() == Some("late")
                    {
                        break;
                    }
                }
            }
        }
        let lists = api
            .requests()
            .iter()
            .filter(|r| r.path.starts_with("/api/v1/services?") && !r.path.contains("watch="))
            .count();
        assert_eq!(
            lists, 1,
            "no relist: re-watched from the version after the end"
        );
    });
}

#[test]
fn forbidden_is_a_real_shaped_403() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        api.forbid("pods", "list");
        let pods: Api<Pod> = Api::all(client.clone());
        match pods.list(&ListParams::default()).await.unwrap_err() {
            kube::Error::Api(status) => {
                assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
                assert!(
                    status.message.contains("cannot list resource \"pods\""),
                    "{}",
                    status.message
                );
            }
            other => panic!("expected a 403, got {other}"),
        }
        // Other verbs and resources still work.
        Api::<Pod>::namespaced(client.clone(), "default")
            .get(fixtures::CLIENT_POD)
            .await
            .unwrap();
        Api::<Service>::all(client)
            .list(&ListParams::default())
            .await
            .unwrap();
        api.allow_all();
    });
}

#[test]
fn events_create_patch_and_list() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let event: Event = serde_json::from_value(json!({
            "metadata": { "generateName": "web.", "namespace": "default" },
            "eventTime": "2026-01-01T00:00:10.000000Z",
            "reportingController": "clb-probe",
            "reportingInstance": "clb-node",
            "action": "Detected",
            "reason": "LoopbackHairpin",
            "type": "Warning",
            "note": "a hairpin",
            "regarding": { "kind": "Service", "namespace": "default", "name": "web", "apiVersion": "v1" },
        }))
        .unwrap();
        let created = events.create(&PostParams::default(), &event).await.unwrap();
        let name = created.metadata.name.unwrap();
        assert!(name.starts_with("web."));
        assert_eq!(error_code(&events.create(&PostParams::default(), &{
            let mut again = event.clone();
            again.metadata.generate_name = None;
            again.metadata.name = Some(name.clone());
            again
        }).await.unwrap_err()), Some(409));

        let series = json!({ "series": { "count": 2, "lastObservedTime": "2026-01-01T00:01:10.000000Z" } });
        let patched = events.patch(&name, &PatchParams::default(), &Patch::Merge(&series)).await.unwrap();
        assert_eq!(patched.series.unwrap().count, 2);
        let strategic = json!({ "note": "still a hairpin" });
        let patched = events.patch(&name, &PatchParams::default(), &Patch::Strategic(&strategic)).await.unwrap();
        assert_eq!((patched.note.as_deref(), patched.reason.as_deref()), (Some("still a hairpin"), Some("LoopbackHairpin")));

        let all: Api<Event> = Api::all(client);
        let mine = all.list(&ListParams::default().fields("reportingController=clb-probe")).await.unwrap();
        assert_eq!(mine.items.len(), 1);
        assert_eq!(api.objects("Event").len(), 1);
        let writes: Vec<_> = api.requests().into_iter().filter(|r| r.method != "GET").collect();
        assert_eq!(writes.len(), 4);
        assert_eq!(writes[2].content_type.as_deref(), Some("application/merge-patch+json"));
        api.forbid("events", "create");
        assert_eq!(error_code(&events.create(&PostParams::default(), &event).await.unwrap_err()), Some(403));
    });
}

/// `dryRun=All` answers with the patched Service and stores nothing; a resourceVersion in a
/// merge patch is a precondition (409 once the Service moved on), as on a real API server.
#[test]
fn patch_dry_run_stores_nothing_and_a_stale_resource_version_conflicts() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        api.apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "shop", "name": "web"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local"}}));
        let services: Api<Service> = Api::namespaced(client, "shop");
        let before = services.get("web").await.unwrap();
        let rv = before.metadata.resource_version.clone().unwrap();
        let patch = json!({"metadata": {"resourceVersion": rv},
                           "spec": {"externalTrafficPolicy": "Cluster"}});
        let dry = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let answered = services
            .patch("web", &dry, &Patch::Merge(&patch))
            .await
            .unwrap();
        assert_eq!(
            answered.spec.unwrap().external_traffic_policy.as_deref(),
            Some("Cluster")
        );
        let stored = services.get("web").await.unwrap();
        assert_eq!(
            stored.metadata.resource_version.as_deref(),
            Some(rv.as_str())
        );
        assert_eq!(
            stored.spec.unwrap().external_traffic_policy.as_deref(),
            Some("Local")
        );

        let done = services
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        assert_eq!(
            done.spec.unwrap().external_traffic_policy.as_deref(),
            Some("Cluster")
        );
        assert_ne!(done.metadata.resource_version.as_deref(), Some(rv.as_str()));
        // The same patch again: its resourceVersion is stale now.
        let err = services
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err();
        assert_eq!(error_code(&err), Some(409));
        assert!(api.requests().iter().any(|r| r.path.contains("dryRun=All")));
    });
}

/// `kubectl describe service` lists a Service's Events through core/v1 with
/// `involvedObject.{name,namespace,kind,uid}=`: an Event regarding the Service by name and uid
/// is listed; one regarding `web:http` (no such Service) or without the uid is not.
#[test]
fn kubectl_describe_lists_the_events_regarding_the_service_by_uid() {
    if std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("skipping: no kubectl");
        return;
    }
    let api = FakeApiServer::start().unwrap();
    for object in fixtures::lab() {
        api.apply(object);
    }
    let web = api
        .objects("services")
        .into_iter()
        .find(|s| s["metadata"]["name"] == "web")
        .unwrap();
    let uid = web["metadata"]["uid"].as_str().unwrap().to_owned();
    let event = |name: &str, reason: &str, regarding: serde_json::Value| {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "eventTime": "2026-11-24T19:00:00.000000Z",
            "type": "Warning", "action": "Detected", "reason": reason,
            "reportingController": "clb-probe", "reportingInstance": "clb-node",
            "note": format!("{reason} note"),
            "regarding": regarding,
        })
    };
    api.apply(event(
        "right",
        "LoopbackHairpin",
        json!({"apiVersion": "v1", "kind": "Service", "namespace": "default", "name": "web", "uid": uid}),
    ));
    api.apply(event(
        "port-in-name",
        "PortInName",
        json!({"apiVersion": "v1", "kind": "Service", "namespace": "default", "name": "web:http"}),
    ));
    api.apply(event(
        "no-uid",
        "NoUid",
        json!({"apiVersion": "v1", "kind": "Service", "namespace": "default", "name": "web"}),
    ));
    let dir = tempdir::Dir::new();
    let kubeconfig = dir.0.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let out = crate::run_ok(
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["describe", "service", "web"])
            .env_remove("KUBECONFIG"),
        "kubectl describe service web",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let events = text.split("Events:").nth(1).unwrap_or_default();
    assert!(events.contains("LoopbackHairpin"), "{text}");
    assert!(events.contains("LoopbackHairpin note"), "{text}");
    assert!(!events.contains("PortInName"), "{text}");
    assert!(!events.contains("NoUid"), "{text}");
}

/// The `/status` subresource (loopbackreports, nodes): the object's writes ignore `status`,
/// `/status` writes change only `status` and never create; a strategic merge patch of a
/// Node's conditions merges by `type`.
#[test]
fn status_subresource_and_conditions_merged_by_type() {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::DynamicObject;
    runtime().block_on(async {
        let (server, client, _dir) = setup().await;
        let ar = kube::core::ApiResource {
            group: "clb-probe.io".into(),
            version: "v1alpha1".into(),
            api_version: "clb-probe.io/v1alpha1".into(),
            kind: "LoopbackReport".into(),
            plural: "loopbackreports".into(),
        };
        let reports: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let apply = PatchParams::apply("test").force();
        let body = |extra: serde_json::Value| {
            let mut b = json!({"apiVersion": "clb-probe.io/v1alpha1", "kind": "LoopbackReport"});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            b
        };
        // Status of an object that does not exist: 404, nothing created.
        let e = reports
            .patch_status(
                "n1",
                &apply,
                &Patch::Apply(body(json!({"status": {"riskCount": 1}}))),
            )
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), Some(404), "{e}");
        assert!(server.objects("loopbackreports").is_empty());
        // The object's apply ignores status.
        let create = body(json!({"metadata": {"name": "n1"}, "status": {"riskCount": 9}}));
        reports
            .patch("n1", &apply, &Patch::Apply(create))
            .await
            .unwrap();
        assert!(server.objects("loopbackreports")[0]["status"].is_null());
        let status = body(json!({"metadata": {"labels": {"x": "y"}}, "status": {"riskCount": 1}}));
        reports
            .patch_status("n1", &apply, &Patch::Apply(status))
            .await
            .unwrap();
        let stored = &server.objects("loopbackreports")[0];
        assert_eq!(stored["status"]["riskCount"], 1);
        assert!(
            stored["metadata"]["labels"].is_null(),
            "/status changes status only"
        );

        server.apply(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        let nodes: Api<Node> = Api::all(client);
        for status in ["True", "False"] {
            let cond = json!({"status": {"conditions": [
                {"type": "LoadBalancerLoopback", "status": status}]}});
            nodes
                .patch_status("n1", &PatchParams::default(), &Patch::Strategic(cond))
                .await
                .unwrap();
        }
        let n1 = server
            .objects("nodes")
            .into_iter()
            .find(|n| n["metadata"]["name"] == "n1")
            .unwrap();
        assert_eq!(
            n1["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"},
                   {"type": "LoadBalancerLoopback", "status": "False"}])
        );
    });
}

/// `limit` and `continue` page a list as the real API does (the plugin's E15 test counts the
/// pages it asked for): every matching object once, in order, no page over the limit, the
/// last page without a token.
#[test]
fn lists_page_with_limit_and_continue() {
    runtime().block_on(async {
        let (api, client, _dir) = setup().await;
        for i in 0..7 {
            api.apply(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": "paged", "name": format!("s{i}"),
                             "labels": {"odd": (i % 2 == 1).to_string()}}}));
        }
        let services: Api<Service> = Api::namespaced(client, "paged");
        let mut params = ListParams::default().labels("odd=false").limit(2);
        let mut names = Vec::new();
        let mut pages = 0;
        loop {
            let page = services.list(&params).await.unwrap();
            pages += 1;
            assert!(page.items.len() <= 2);
            names.extend(page.items.into_iter().filter_map(|s| s.metadata.name));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        assert_eq!(names, ["s0", "s2", "s4", "s6"]);
        assert_eq!(pages, 2);
    });
}

#[test]
fn creation_times_are_rfc3339_and_read_back() {
    for t in [0, 951_782_400, 1_795_700_000, 4_102_444_799] {
        let text = super::table::rfc3339_of_unix(t);
        assert_eq!(super::table::unix_of_rfc3339(&text), Some(t), "{text}");
    }
    assert_eq!(
        super::table::rfc3339_of_unix(951_782_400),
        "2000-02-29T00:00:00Z"
    );
}
