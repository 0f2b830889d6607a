//! The request log by client, verb and resource: what a fleet bench reads per agent.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde_json::json;

use super::*;

async fn client_as(api: &FakeApiServer, token: &str, dir: &Path) -> kube::Client {
    let path = dir.join(format!("kubeconfig-{token}"));
    api.write_kubeconfig_as(&path, token).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn key(client: &str, verb: &str, resource: &str) -> TrafficKey {
    TrafficKey {
        client: client.into(),
        verb: verb.into(),
        resource: resource.into(),
    }
}

#[test]
fn requests_and_bytes_are_counted_per_client_verb_and_resource() {
    let dir = std::env::temp_dir().join(format!("kubeapi-traffic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let api = FakeApiServer::start().unwrap();
    for object in fixtures::lab() {
        api.apply(object);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listed = runtime.block_on(async {
        let a: Api<Service> = Api::all(client_as(&api, "agent-a", &dir).await);
        let b: Api<Service> = Api::all(client_as(&api, "agent-b", &dir).await);
        let listed = a.list(&ListParams::default()).await.unwrap();
        b.list(&ListParams::default()).await.unwrap();
        let version = listed.metadata.resource_version.clone().unwrap();
        let mut stream = a
            .watch(&WatchParams::default(), &version)
            .await
            .unwrap()
            .boxed();
        api.apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "shop", "name": "counted"}}));
        let event = stream.next().await.unwrap().unwrap();
        assert!(matches!(event, WatchEvent::Added(_)), "{event:?}");
        serde_json::to_vec(&listed).unwrap().len() as u64
    });
    let traffic = api.traffic();
    let list_a = traffic[&key("agent-a", "list", "services")];
    assert_eq!(list_a.requests, 1);
    // The list's body as sent: within a few bytes of the client's own serialization of it
    // (items without kind/apiVersion, key order).
    assert!(
        list_a.bytes > listed / 2 && list_a.bytes < listed * 2,
        "{list_a:?} vs {listed}"
    );
    assert_eq!(traffic[&key("agent-b", "list", "services")].requests, 1);
    let watch = traffic[&key("agent-a", "watch", "services")];
    assert_eq!(watch.requests, 1);
    assert!(watch.bytes > 50, "the ADDED line was counted: {watch:?}");
    assert!(!traffic.contains_key(&key("agent-b", "watch", "services")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `list_metadata` gets each item's metadata alone, as the API server sends it: a client
/// that asks for names only is not charged for whole objects.
#[test]
fn a_metadata_list_sends_metadata_only() {
    use k8s_openapi::api::core::v1::Node;
    let dir = std::env::temp_dir().join(format!("kubeapi-meta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let api = FakeApiServer::start().unwrap();
    api.apply(fixtures::parse(fixtures::NODE));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let nodes: Api<Node> = Api::all(client_as(&api, "names", &dir).await);
        let meta = nodes.list_metadata(&ListParams::default()).await.unwrap();
        assert_eq!(meta.items.len(), 1);
        assert_eq!(meta.items[0].metadata.name.as_deref(), Some("clb-node"));
        nodes.list(&ListParams::default()).await.unwrap();
    });
    let traffic = api.traffic();
    let key = key("names", "list", "nodes");
    // Two lists under one key: the whole one is more than twice the metadata one.
    let whole = fixtures::NODE.len() as u64;
    assert!(traffic[&key].bytes < whole * 3 / 2, "{:?}", traffic[&key]);
    let _ = std::fs::remove_dir_all(&dir);
}
