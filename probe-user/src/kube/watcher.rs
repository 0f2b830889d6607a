//! Reflectors (kube-runtime) on this node's Pods (field selector `spec.nodeName`), all
//! Services and all EndpointSlices, turned into [`Index`] snapshots.
//!
//! kube-runtime's watcher relists on a 410 Gone and retries every failure with its default
//! backoff (exponential, up to about 30 s), so this task never ends on an API error: it marks
//! the connection down (one log line per transition) and keeps the last index. It is up again
//! when every source has a complete list and no error since, or its watch was restarted
//! after the error (which kube-runtime does not report: see `watches`).

use std::{sync::Arc, time::Duration};

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

use super::{KubeStatus, index::Index};

/// Whether a watcher event means the store holds a complete list (not a relist in progress).
fn listed<K>(event: watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_))
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
    let task = tokio::spawn(run(client, node, status, tx));
    (rx, task)
}

async fn run(
    client: Client,
    node: Option<String>,
    status: Arc<KubeStatus>,
    tx: watch::Sender<Arc<Index>>,
) {
    let mut pod_config = watcher::Config::default();
    match &node {
        Some(node) => pod_config = pod_config.fields(&format!("spec.nodeName={node}")),
        None => info!("no --node-name / NODE_NAME: watching the pods of every node"),
    }
    let (pods, pods_writer) = reflector::store::<Pod>();
    let (services, services_writer) = reflector::store::<Service>();
    let (slices, slices_writer) = reflector::store::<EndpointSlice>();
    let streams: Vec<BoxStream<'static, (usize, Result<bool, watcher::Error>)>> = vec![
        watcher(Api::<Pod>::all(client.clone()), pod_config)
            .default_backoff()
            .reflect(pods_writer)
            .map(|r| (0, r.map(listed)))
            .boxed(),
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(services_writer)
        .map(|r| (1, r.map(listed)))
        .boxed(),
        watcher(
            Api::<EndpointSlice>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(slices_writer)
        .map(|r| (2, r.map(listed)))
        .boxed(),
    ];
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
                Some((source, Ok(listed))) => {
                    // Healthy once a (re)list is complete: the store holds all of it then.
                    healthy[source] |= listed;
                    dirty = true;
                }
                Some((source, Err(error))) => {
                    healthy[source] = false;
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
                if dirty {
                    dirty = false;
                    synced |= healthy.iter().all(|h| *h);
                    let mut index = Index::build(
                        pods.state().iter().map(|p| &**p),
                        services.state().iter().map(|s| &**s),
                        slices.state().iter().map(|s| &**s),
                    );
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
