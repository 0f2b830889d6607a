//! Watchers (kube-runtime) on this node's Pods (field selector `spec.nodeName`), all
//! Services and all EndpointSlices, kept in one store, the [`ApiServiceTable`], applied per
//! watch event, and turned into [`Index`] snapshots (and, with [`spawn_with_table`], shared as
//! kube-proxy's expected table).
//!
//! Objects are pruned as they arrive ([`prune_service`], [`prune_slice`], [`prune_pod`]): no
//! managedFields, and only the annotations and labels the agent reads. Pods are kept in a
//! reflector store (this node's only); Services and EndpointSlices are not kept as objects at
//! all: the store holds per Service the index's facts, kube-proxy's form derived from them
//! ([`super::service_table::StoredService`]), per slice one pruned form read by both, and the
//! index is built from the held facts by pointer. Until issue #52 the index's facts and the
//! slices' ready addresses were a second store beside the table's (`kube::kept`).
//!
//! kube-runtime's watcher relists on a 410 Gone and retries every failure with its default
//! backoff (exponential, up to about 30 s), so this task never ends on an API error: it marks
//! the connection down (one log line per transition) and keeps the last index. It is up again
//! when every source has a complete list and no error since, or its watch was restarted
//! after the error (which kube-runtime does not report: see `watches`).

use std::{
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::{StreamExt as _, stream::BoxStream};
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{
    KubeStatus,
    index::Index,
    service_table::{ApiServiceTable, NodeView, PrunedSlice, READ_LABELS, StoredService},
};

/// Whether a watcher event means the store holds a complete list (not a relist in progress).
fn listed<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_))
}

/// A Service as the store keeps it: no managedFields; of the annotations only those
/// `probe_core::service::facts` reads (LB controllers', loopback settings), of the
/// labels only those the service table reads.
pub fn prune_service(service: &mut Service) {
    service.metadata.managed_fields = None;
    if let Some(a) = &mut service.metadata.annotations {
        a.retain(|k, _| probe_core::service::is_read_annotation(k));
    }
    if let Some(l) = &mut service.metadata.labels {
        l.retain(|k, _| READ_LABELS.contains(&k.as_str()));
    }
}

/// An EndpointSlice as the store keeps it: no managedFields or annotations, of the labels only
/// the Service's name and kube-proxy's selector labels.
pub fn prune_slice(slice: &mut EndpointSlice) {
    slice.metadata.managed_fields = None;
    slice.metadata.annotations = None;
    if let Some(l) = &mut slice.metadata.labels {
        l.retain(|k, _| READ_LABELS.contains(&k.as_str()));
    }
}

/// A Pod as the store keeps it: the index reads its names, node, host-network flag, IPs and
/// its containers' images, ports and probes (`index::Index::build`); no labels, annotations
/// or managedFields, no containers' environment, commands, mounts or resources, no volumes.
pub fn prune_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    if let Some(spec) = &mut pod.spec {
        spec.volumes = None;
        spec.init_containers = None;
        for c in &mut spec.containers {
            c.env = None;
            c.env_from = None;
            c.command = None;
            c.args = None;
            c.volume_mounts = None;
            c.resources = None;
        }
    }
    if let Some(status) = &mut pod.status {
        status.conditions = None;
        status.container_statuses = None;
        status.init_container_statuses = None;
    }
}

/// The API service table as [`spawn_with_table`] shares it: read under the lock (never held
/// across an await); `changed` counts its updates (a receiver waits on it).
#[derive(Clone)]
pub struct SharedApiTable {
    pub table: Arc<RwLock<ApiServiceTable>>,
    pub changed: watch::Receiver<u64>,
}

fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// One watch event of a source, as the loop takes it.
enum Watched {
    /// A pod event (the pods' reflector store took it).
    Pod,
    Service(Box<watcher::Event<Service>>),
    Slice(Box<watcher::Event<EndpointSlice>>),
}

/// The store with the relist it is gathering (per source).
struct TableFeed {
    table: Arc<RwLock<ApiServiceTable>>,
    changed: watch::Sender<u64>,
    generation: u64,
    services: Option<Vec<(String, StoredService)>>,
    slices: Option<Vec<(String, PrunedSlice)>>,
}

impl TableFeed {
    fn new(table: Arc<RwLock<ApiServiceTable>>, changed: watch::Sender<u64>) -> TableFeed {
        TableFeed {
            table,
            changed,
            generation: 0,
            services: None,
            slices: None,
        }
    }

    fn service(&mut self, event: &watcher::Event<Service>) {
        let changed = table_event(
            &self.table,
            &mut self.services,
            event,
            StoredService::from_api,
            ApiServiceTable::apply_stored,
            ApiServiceTable::replace_services,
        );
        self.bump(changed);
    }

    fn slice(&mut self, event: &watcher::Event<EndpointSlice>) {
        let changed = table_event(
            &self.table,
            &mut self.slices,
            event,
            PrunedSlice::held_from_api,
            ApiServiceTable::apply_slice,
            ApiServiceTable::replace_slices,
        );
        self.bump(changed);
    }

    /// A relist of Services or EndpointSlices is in progress. An index built now would share
    /// the facts that the slices' `InitDone` then changes, one copy each: the watcher waits
    /// (at 30,000 Services the first lists held two copies of every Service's facts, 11 MiB
    /// of the agent's peak; heaptrack, BENCHMARKS.md 9f).
    fn relisting(&self) -> bool {
        self.services.is_some() || self.slices.is_some()
    }

    /// A watch failed (a relist that fails starts again with `Init`): what it listed so far is
    /// dropped, the last complete list stays, and indexes are built again meanwhile.
    fn relist_failed(&mut self, source: usize) {
        match source {
            1 => self.services = None,
            2 => self.slices = None,
            _ => {}
        }
    }

    fn bump(&mut self, changed: bool) {
        if changed {
            self.generation += 1;
            self.changed.send_replace(self.generation);
        }
    }
}

/// Applies one event of a source to the table (the lock is held for that Service's
/// recomputation only; a relist is gathered in `relist` and replaces the source's part of the
/// table once, at its end). Whether the table changed.
fn table_event<K: kube::Resource, P>(
    table: &RwLock<ApiServiceTable>,
    relist: &mut Option<Vec<(String, P)>>,
    event: &watcher::Event<K>,
    prune: fn(&K) -> Option<P>,
    apply: fn(&mut ApiServiceTable, &str, Option<P>),
    replace: fn(&mut ApiServiceTable, Vec<(String, P)>),
) -> bool {
    match event {
        watcher::Event::Init => {
            *relist = Some(Vec::new());
            false
        }
        watcher::Event::InitApply(o) => {
            if let (Some(list), Some(p)) = (relist.as_mut(), prune(o)) {
                list.push((object_key(o.meta()), p));
            }
            false
        }
        watcher::Event::InitDone => match (relist.take(), table.write()) {
            (Some(list), Ok(mut t)) => {
                replace(&mut t, list);
                true
            }
            _ => false,
        },
        watcher::Event::Apply(o) => table
            .write()
            .map(|mut t| apply(&mut t, &object_key(o.meta()), prune(o)))
            .is_ok(),
        watcher::Event::Delete(o) => table
            .write()
            .map(|mut t| apply(&mut t, &object_key(o.meta()), None))
            .is_ok(),
    }
}

/// How long index rebuilds are batched (a relist applies every object at once).
const REBUILD_EVERY: Duration = Duration::from_millis(200);

/// The watched resources, in the order of the streams below (also `watches`' index).
pub(super) const SOURCES: [&str; 3] = ["pods", "services", "endpointslices"];

/// Starts the reflectors; the receiver always holds the latest index (empty until the first
/// lists arrive). The task runs until the handle is aborted or the receivers are dropped.
pub fn spawn(
    client: Client,
    node: Option<String>,
    status: Arc<KubeStatus>,
) -> (watch::Receiver<Arc<Index>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Arc::new(Index::default()));
    // The store for the index alone: nobody reads kube-proxy's view.
    let view = NodeView {
        mode: crate::state::ServiceSource::Iptables,
        node_name: node.clone(),
        node_ips: Vec::new(),
    };
    let table = Arc::new(RwLock::new(ApiServiceTable::store_only(view)));
    let feed = TableFeed::new(table, watch::channel(0).0);
    let task = tokio::spawn(run(client, node, status, tx, feed));
    (rx, task)
}

/// [`spawn`], also keeping the [`ApiServiceTable`] for `view` (its `node_name` is `node`'s)
/// from the same reflectors, per watch event. `view`'s mode and node IPs can change later
/// (`table.write().set_node(..)`).
pub fn spawn_with_table(
    client: Client,
    node: Option<String>,
    status: Arc<KubeStatus>,
    mut view: NodeView,
) -> (
    watch::Receiver<Arc<Index>>,
    SharedApiTable,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(Arc::new(Index::default()));
    view.node_name = node.clone();
    let table = Arc::new(RwLock::new(ApiServiceTable::new(view)));
    let (changed_tx, changed) = watch::channel(0);
    let feed = TableFeed::new(table.clone(), changed_tx);
    let task = tokio::spawn(run(client, node, status, tx, feed));
    (rx, SharedApiTable { table, changed }, task)
}

/// One watch event: its source (0 pods, 1 Services, 2 EndpointSlices) and whether it
/// completes a list.
type WatchItem = (usize, Result<(bool, Watched), watcher::Error>);

/// The three watches (this node's pods, into a store; every Service and EndpointSlice).
fn watch_streams(
    client: Client,
    node: Option<&str>,
) -> (Vec<BoxStream<'static, WatchItem>>, reflector::Store<Pod>) {
    let mut pod_config = watcher::Config::default();
    match node {
        Some(node) => pod_config = pod_config.fields(&format!("spec.nodeName={node}")),
        None => info!("no --node-name / NODE_NAME: watching the pods of every node"),
    }
    let (pods, pods_writer) = reflector::store::<Pod>();
    // Services and EndpointSlices are not stored as objects: the store (`TableFeed`) keeps
    // what the index and kube-proxy's view read.
    let streams: Vec<BoxStream<'static, WatchItem>> = vec![
        watcher(Api::<Pod>::all(client.clone()), pod_config)
            .default_backoff()
            .modify(prune_pod)
            .reflect(pods_writer)
            .map(|r| (0, r.map(|e| (listed(&e), Watched::Pod))))
            .boxed(),
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(prune_service)
        .map(|r| (1, r.map(|e| (listed(&e), Watched::Service(Box::new(e))))))
        .boxed(),
        watcher(
            Api::<EndpointSlice>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(prune_slice)
        .map(|r| (2, r.map(|e| (listed(&e), Watched::Slice(Box::new(e))))))
        .boxed(),
    ];
    (streams, pods)
}

/// Keeps what the index and the API table read of a Service or EndpointSlice event.
fn keep_watched(table: &mut TableFeed, watched: &Watched) {
    match watched {
        Watched::Pod => {}
        Watched::Service(e) => table.service(e),
        Watched::Slice(e) => table.slice(e),
    }
}

async fn run(
    client: Client,
    node: Option<String>,
    status: Arc<KubeStatus>,
    tx: watch::Sender<Arc<Index>>,
    mut table: TableFeed,
) {
    let (streams, pods) = watch_streams(client, node.as_deref());
    let mut events = futures::stream::select_all(streams);
    let mut healthy = [false; 3];
    // Per source, the accepted-watch count at its last error: a higher count means the
    // watcher restarted that watch since (see `watches`; the store kept its complete list).
    let mut accepted_at_error: [Option<u64>; 3] = [None; 3];
    let mut dirty = false;
    let mut reported_down = false;
    // Every source completed a list once: the first cache sync (reports wait for it).
    let mut synced = false;
    let mut rebuild = tokio::time::interval(REBUILD_EVERY);
    loop {
        tokio::select! {
            item = events.next() => match item {
                Some((source, Ok((listed, watched)))) => {
                    // Healthy once a (re)list is complete: all of it is kept then.
                    healthy[source] |= listed;
                    dirty = true;
                    keep_watched(&mut table, &watched);
                }
                Some((source, Err(error))) => {
                    healthy[source] = false;
                    table.relist_failed(source);
                    accepted_at_error[source] = Some(status.watches.count(source));
                    if status.set_connected(false) || !reported_down {
                        warn!(
                            %error,
                            source = SOURCES[source],
                            "Kubernetes API not usable: events are not attributed to pods and Services until it is (retrying with backoff)"
                        );
                        reported_down = true;
                    }
                }
                None => return,
            },
            _ = rebuild.tick() => {
                for (source, at_error) in accepted_at_error.iter_mut().enumerate() {
                    if at_error.is_some_and(|n| status.watches.count(source) > n) {
                        *at_error = None;
                        healthy[source] = true;
                        // No index change, but the connection is reported below.
                        dirty = true;
                    }
                }
                // During a relist the last index stays (it is complete; see
                // `TableFeed::relisting`).
                if dirty && !table.relisting() {
                    dirty = false;
                    synced |= healthy.iter().all(|h| *h);
                    let facts = match table.table.read() {
                        Ok(t) => t.facts(),
                        Err(_) => return,
                    };
                    let mut index = Index::from_facts(pods.state().iter().map(|p| &**p), facts);
                    index.synced = synced;
                    let (pod_count, service_count) = (index.pod_count(), index.service_count());
                    if tx.send(Arc::new(index)).is_err() {
                        return;
                    }
                    if healthy.iter().all(|h| *h) && !status.set_connected(true) {
                        reported_down = false;
                        info!(pods = pod_count, services = service_count, "Kubernetes attribution connected");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// kube-proxy's overall fixtures (`tests/data/kube-proxy/overall/`) as API objects.
    fn overall(file: &str) -> Vec<serde_json::Value> {
        let path = format!(
            "{}/tests/data/kube-proxy/overall/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let list: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        list["items"].as_array().unwrap().clone()
    }

    /// Waits (20 s at most) until the shared table satisfies `done`.
    async fn until(
        shared: &mut SharedApiTable,
        what: &str,
        done: impl Fn(&ApiServiceTable) -> bool,
    ) {
        let wait = async {
            loop {
                if done(&shared.table.read().unwrap()) {
                    return;
                }
                shared.changed.changed().await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .unwrap_or_else(|_| panic!("{what}: not within 20 s"));
    }

    /// The real reflectors against the fake API: the table fills from the lists, then each
    /// event recomputes one Service (not the table); a relist replaces it once.
    #[tokio::test]
    async fn the_table_follows_the_watch_events() {
        use probe_contract::Proto;

        use crate::state::ServiceSource;
        let api = test_support::kubeapi::FakeApiServer::start().unwrap();
        let kubeconfig =
            std::env::temp_dir().join(format!("clb-apitable-{}.kubeconfig", std::process::id()));
        api.write_kubeconfig(&kubeconfig).unwrap();
        for o in overall("services.json")
            .into_iter()
            .chain(overall("endpointslices.json"))
        {
            api.apply(o);
        }
        let client = crate::kube::connect(&crate::kube::KubeSource::Kubeconfig(kubeconfig.clone()))
            .await
            .unwrap();
        std::fs::remove_file(&kubeconfig).unwrap();
        let view = NodeView {
            mode: ServiceSource::Nftables,
            node_name: None,
            node_ips: vec![],
        };
        let (_index, mut shared, task) = spawn_with_table(
            client,
            Some("test-node".into()),
            Arc::new(KubeStatus::default()),
            view,
        );
        until(&mut shared, "the listed table", |t| {
            let e = t.expected();
            e.services.len() == 9 && e.no_endpoint_drops.len() == 2
        })
        .await;
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let listed = shared.table.read().unwrap().recomputed();

        // ns6/svc6 gets an endpoint: its ClusterIP is served, one Service recomputed.
        api.apply(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "ns6", "name": "svc6-1",
                         "labels": {"kubernetes.io/service-name": "svc6"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.180.0.6"]}],
            "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}]
        }));
        until(&mut shared, "svc6's endpoint", |t| {
            t.serves(ip("172.30.0.46"), 80, Proto::Tcp)
                .is_some_and(|s| s.backends == ["10.180.0.6:80"])
        })
        .await;
        assert_eq!(shared.table.read().unwrap().recomputed(), listed + 1);

        // ns2/svc2 deleted: its entries and drops go, one Service recomputed.
        api.delete("Service", "ns2", "svc2");
        until(&mut shared, "svc2 gone", |t| {
            t.serves(ip("1.2.3.4"), 80, Proto::Tcp).is_none()
        })
        .await;
        {
            let t = shared.table.read().unwrap();
            assert_eq!(t.recomputed(), listed + 2);
            assert!(t.expected().no_endpoint_drops.is_empty());
            assert!(t.nodeport(3001, Proto::Tcp).is_none());
        }

        // A relist (410 Gone on the re-watch): the table is taken whole from the new list.
        let before = shared.table.read().unwrap().recomputed();
        api.expire_history();
        api.end_watches();
        until(&mut shared, "the relisted table", |t| {
            t.recomputed() > before + 2
        })
        .await;
        let t = shared.table.read().unwrap().expected();
        assert_eq!(t.services.len(), 7, "svc1, svc3, svc4 (2), svc5 (2), svc6");
        task.abort();
    }

    /// A relist that fails is dropped (indexes are built again meanwhile) and the store keeps
    /// the last complete list, as `kube::kept` did before the one store.
    #[test]
    fn a_failed_relist_is_dropped_and_the_last_list_kept() {
        let view = NodeView {
            mode: crate::state::ServiceSource::Iptables,
            node_name: None,
            node_ips: vec![],
        };
        let table = Arc::new(RwLock::new(ApiServiceTable::new(view)));
        let mut feed = TableFeed::new(table.clone(), watch::channel(0).0);
        let service = |name: &str| -> Service {
            serde_json::from_value(json!({
                "metadata": {"namespace": "shop", "name": name},
                "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}
            }))
            .unwrap()
        };
        feed.service(&watcher::Event::Init);
        feed.service(&watcher::Event::InitApply(service("web")));
        assert!(feed.relisting());
        feed.service(&watcher::Event::InitDone);
        assert!(!feed.relisting());
        feed.service(&watcher::Event::Init);
        feed.service(&watcher::Event::InitApply(service("api")));
        feed.relist_failed(1);
        assert!(!feed.relisting());
        let names: Vec<String> = table
            .read()
            .unwrap()
            .facts()
            .iter()
            .map(|f| f.name.clone())
            .collect();
        assert_eq!(names, ["web"]);
        assert_eq!(table.read().unwrap().service_count(), 1);
    }

    /// What the stores keep of a Service: no managedFields, no kubectl copy, no tenant
    /// annotation or label; the annotations `facts` reads and kube-proxy's label stay.
    #[test]
    fn stores_keep_only_what_is_read() {
        let last_applied = "kubectl.kubernetes.io/last-applied-configuration";
        let aws = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
        let tencent = "service.cloud.tencent.com/prevent-loopback";
        let mut service: Service = serde_json::from_value(json!({
            "metadata": {
                "namespace": "shop", "name": "web",
                "annotations": {last_applied: "{\"big\": \"copy\"}", aws: "*", tencent: "true",
                                "tenant.example.com/notes": "x"},
                "labels": {"app": "web", "service.kubernetes.io/service-proxy-name": "other"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}
        }))
        .unwrap();
        prune_service(&mut service);
        let meta = &service.metadata;
        assert_eq!(meta.managed_fields, None);
        let annotations: Vec<&str> = meta
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(annotations, [aws, tencent]);
        let labels: Vec<&str> = meta
            .labels
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(labels, ["service.kubernetes.io/service-proxy-name"]);
        // What the index makes of it is unchanged by the pruning.
        assert!(service.spec.is_some());

        let mut slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {
                "namespace": "shop", "name": "web-abc",
                "labels": {"kubernetes.io/service-name": "web",
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
                "managedFields": [{"manager": "kube-controller-manager"}]
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.5"], "nodeName": "n1"}]
        }))
        .unwrap();
        prune_slice(&mut slice);
        assert_eq!(slice.metadata.managed_fields, None);
        assert_eq!(slice.metadata.annotations, None);
        assert_eq!(
            slice.metadata.labels.unwrap().keys().collect::<Vec<_>>(),
            ["kubernetes.io/service-name"]
        );

        let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "web-1",
                         "annotations": {last_applied: "{}"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx",
                     "env": [{"name": "SECRET", "value": "x"}],
                     "ports": [{"containerPort": 80}]}]},
            "status": {"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}
        }))
        .unwrap();
        prune_pod(&mut pod);
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.metadata.annotations, None);
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.containers[0].env, None);
        // The index still names the pod by its IP.
        let index = Index::build([&pod], [], []);
        assert_eq!(
            index.pod_by_ip("10.0.0.5".parse().unwrap()).unwrap().key(),
            "shop/web-1"
        );
    }
}
