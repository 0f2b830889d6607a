//! A fake Kubernetes API server, in process, for tests and the demo.
//!
//! No kube-apiserver can be installed on these machines, so the tests run the **real** kube
//! client (and kube-runtime's reflectors) against this HTTP server that speaks the API's wire
//! protocol. It is a fake: no admission, no defaulting, no validation, no auth, one
//! resourceVersion counter for everything (as etcd has), JSON only. What it does implement is
//! what a client can observe:
//!
//! - `GET /version`; `POST .../selfsubjectreviews` (everyone is [`FAKE_USER`]); `404` (a Status, reason `NotFound`) for any path or object it does not know.
//! - Resources: core/v1 `pods`, `services`, `secrets`, `nodes` (cluster-scoped), discovery.k8s.io/v1
//!   `endpointslices`, events.k8s.io/v1 `events`, clb-probe.io/v1alpha1 `loopbackreports` and
//!   `loopbackverifications` (cluster-scoped, with a `/status` subresource: writes to the object ignore `status`,
//!   `PATCH .../NAME/status` changes only `status` and never creates the object); `nodes`
//!   have the same `/status` subresource, where a strategic merge patch merges
//!   `status.conditions` by `type` (as node-problem-detector's patches rely on).
//! - list (`GET .../pods`, across namespaces or in one), get (`GET .../pods/NAME`), with
//!   `fieldSelector` (any dotted JSON path: `spec.nodeName=`, `metadata.name=`,
//!   `reportingController=`; `=`, `==`, `!=`) and `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`,
//!   `!k`). A list's `metadata.resourceVersion` is the current one; items carry theirs; as the
//!   real API does, list items have no `kind`/`apiVersion`.
//! - watch (`?watch=1` or `?watch=true`): HTTP 200, a stream of WatchEvent JSON lines
//!   (`{"type":"ADDED|MODIFIED|DELETED|BOOKMARK|ERROR","object":...}`). With a
//!   `resourceVersion` it replays the history after it; without one (or `"0"`) it first sends
//!   the current objects as ADDED. `allowWatchBookmarks=true` adds a BOOKMARK (object with only
//!   `kind`, `apiVersion`, `metadata.resourceVersion`) every [`BOOKMARK_INTERVAL`].
//!   `timeoutSeconds` ends the stream, and so does [`FakeApiServer::end_watches`];
//!   after [`FakeApiServer::end_watches_at_once`] every watch ends as soon as it has sent what
//!   it had (a misbehaving server or proxy).
//! - 410 Gone: after [`FakeApiServer::expire_history`], a watch from a resourceVersion older than
//!   the expiry gets one ERROR event whose object is the Status (code 410, reason `Expired`) and
//!   the stream ends; a list with such a resourceVersion (not `""`/`"0"`) gets a 410 response.
//!   kube-runtime's watcher answers both with a relist.
//! - core/v1 `events`: the events.k8s.io/v1 Events, read-only (get, list), converted as the
//!   API server converts them (`regarding` -> `involvedObject`, `note` -> `message`, ...), so
//!   `kubectl describe` (which lists `involvedObject.{kind,name,namespace,uid}=`) finds them.
//! - create (`POST`, 201; 409 AlreadyExists; `metadata.generateName` honoured), patch (`PATCH`;
//!   `application/merge-patch+json`, `application/strategic-merge-patch+json` and
//!   `application/apply-patch+yaml` are all applied as a JSON merge patch (RFC 7386), apply
//!   creates a missing object; `application/json-patch+json` is 415), replace (`PUT`), delete
//!   (`DELETE`).
//! - 403 Forbidden, a real-shaped Status, for a (resource, verb) a test denies with
//!   [`FakeApiServer::forbid`]. Verbs as RBAC names them: `get`, `list`, `watch`, `create`,
//!   `patch`, `update`, `delete`.
//!
//! Test-control API (all blocking, callable from any thread; the server runs on its own thread
//! with its own tokio runtime):
//!
//! ```no_run
//! use test_support::kubeapi::{FakeApiServer, fixtures};
//! let api = FakeApiServer::start()?;              // 127.0.0.1, an ephemeral port
//! // or FakeApiServer::start_in_netns(test_support::lab::NS_NODE)?: 127.0.0.1 inside the lab's node
//! let _url: String = api.url();                   // "http://127.0.0.1:PORT"
//! api.write_kubeconfig("/tmp/kubeconfig".as_ref())?; // context "fake", namespace default
//! for object in fixtures::lab() { api.apply(object); } // the lab's node, pods, services, slices
//! api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Service",
//!     "metadata": {"namespace": "shop", "name": "web"}}));        // create or replace
//! api.delete("Service", "shop", "web");           // kind or plural resource name
//! api.forbid("pods", "watch");                     // 403 from now on
//! api.expire_history();                            // old resourceVersions -> 410
//! api.hold_lists();                                // lists wait (a slow first sync)...
//! api.release_lists();                             // ...until released
//! api.end_watches();                               // open watches end; clients re-watch
//! api.end_watches_at_once(true);                   // every watch ends right after its backlog
//! let _services: Vec<serde_json::Value> = api.objects("services");
//! let _writes = api.requests().iter().filter(|r| r.method == "POST").count();
//! let _sent = api.watch_sent("loopbackverifications"); // events and bytes the watches sent
//! api.stop();                                      // also on drop
//! # anyhow::Ok(())
//! ```

pub mod fixtures;
mod http;
mod selector;
mod store;
mod table;

use std::{
    collections::HashSet,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result};
use serde_json::Value;
use store::Store;

/// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK (the real API: about a
/// minute; short here so tests see them).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, `PATCH`, ...
    pub method: String,
    /// Path and query, as sent.
    pub path: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// Who sent it ([`TrafficKey::client`]).
    pub client: String,
}

/// The user the fake authenticates every caller as (a SelfSubjectReview's answer, the name in
/// its Forbidden messages).
pub const FAKE_USER: &str = "fake-user";

/// State shared between the server thread and the test's handle.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    pub(crate) forbidden: Mutex<HashSet<(String, String)>>,
    pub(crate) requests: Mutex<Vec<Request>>,
    /// Wakes watches on every change.
    pub(crate) changed: tokio::sync::broadcast::Sender<()>,
    /// Ends every open watch ([`FakeApiServer::end_watches`]).
    pub(crate) end_watches: tokio::sync::broadcast::Sender<()>,
    /// Lists wait while this is true ([`FakeApiServer::hold_lists`]).
    pub(crate) lists_held: tokio::sync::watch::Sender<bool>,
    /// Every watch ends once it sent its backlog ([`FakeApiServer::end_watches_at_once`]).
    pub(crate) end_at_once: std::sync::atomic::AtomicBool,
    /// Where `pods/proxy` connects from ([`FakeApiServer::proxy_pods_in`]; None: here).
    pub(crate) proxy_netns: Mutex<Option<String>>,
    /// What the watches sent, by resource ([`FakeApiServer::watch_sent`]).
    pub(crate) watch_sent: Mutex<std::collections::HashMap<String, WatchSent>>,
    /// Requests and bytes sent, by client, verb and resource ([`FakeApiServer::traffic`]).
    pub(crate) traffic: Mutex<std::collections::HashMap<TrafficKey, Arc<TrafficCell>>>,
}

impl Shared {
    /// The counters of `key`, created at zero.
    pub(crate) fn traffic_cell(&self, key: TrafficKey) -> Arc<TrafficCell> {
        self.traffic.lock().unwrap().entry(key).or_default().clone()
    }
}

/// Whose requests of which kind: the client (its bearer token, [`FakeApiServer::write_kubeconfig_as`];
/// `anonymous` without one), the RBAC verb (`list`, `watch`, `get`, `create`, `patch`, `update`,
/// `delete`; the method in lower case for a path that is no resource) and the resource
/// (`services`, `endpointslices.discovery.k8s.io`, `loopbackreports.clb-probe.io/status`,
/// `pods/proxy`; the path for a path that is no resource).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrafficKey {
    pub client: String,
    pub verb: String,
    pub resource: String,
}

/// What the server sent for one [`TrafficKey`]: requests, and the bytes of their response
/// bodies (a watch's as its lines leave, BOOKMARKs included: what the client receives).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub requests: u64,
    pub bytes: u64,
}

/// [`Traffic`]'s live counters.
#[derive(Debug, Default)]
pub(crate) struct TrafficCell {
    pub(crate) requests: std::sync::atomic::AtomicU64,
    pub(crate) bytes: std::sync::atomic::AtomicU64,
}

/// What the watches of one resource sent in all: events other than BOOKMARKs, and their bytes
/// (what a watcher pays to receive; the fleet's cost per agent, issue #49 H3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchSent {
    pub events: u64,
    pub bytes: u64,
}

/// The fake API server; see the module documentation.
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts the server on 127.0.0.1 at an ephemeral port, with no objects.
    pub fn start() -> Result<Self> {
        Self::serve(std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?)
    }

    /// [`start`](Self::start), listening on 127.0.0.1 of network namespace `netns`
    /// (`/run/netns/<netns>`, e.g. the lab's node, where the agent under test runs).
    pub fn start_in_netns(netns: &str) -> Result<Self> {
        let listener = crate::lab::in_netns(netns, || {
            std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")
        })?;
        Self::serve(listener)
    }

    /// [`start_in_netns`](Self::start_in_netns), listening on every address of `netns`: the
    /// lab's other namespaces reach it at their route to the node (`http://NODE_IP:PORT`,
    /// [`write_kubeconfig_via`](Self::write_kubeconfig_via)), as agents on other nodes reach
    /// the API server.
    pub fn start_in_netns_for_all(netns: &str) -> Result<Self> {
        let listener = crate::lab::in_netns(netns, || {
            std::net::TcpListener::bind("0.0.0.0:0").context("bind 0.0.0.0:0")
        })?;
        let mut server = Self::serve(listener)?;
        server.addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        Ok(server)
    }

    fn serve(listener: std::net::TcpListener) -> Result<Self> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (changed, _) = tokio::sync::broadcast::channel(1024);
        let (end_watches, _) = tokio::sync::broadcast::channel(16);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            forbidden: Mutex::new(HashSet::new()),
            requests: Mutex::new(Vec::new()),
            changed,
            end_watches,
            lists_held: tokio::sync::watch::Sender::new(false),
            end_at_once: std::sync::atomic::AtomicBool::new(false),
            proxy_netns: Mutex::new(None),
            watch_sent: Mutex::new(std::collections::HashMap::new()),
            traffic: Mutex::new(std::collections::HashMap::new()),
        });
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("tokio runtime for the fake API server")?;
        let server_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fake-kube-api".into())
            .spawn(move || {
                runtime.block_on(http::serve(listener, server_shared, shutdown_rx));
            })
            .context("spawn the fake API server thread")?;
        Ok(Self {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Writes a kubeconfig (context `fake`, namespace `default`, a static bearer token) that
    /// points at this server.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        self.write_kubeconfig_via(path, self.addr.ip())
    }

    /// [`write_kubeconfig`](Self::write_kubeconfig) for a client that reaches the server at
    /// `host` (a server started with [`start_in_netns_for_all`](Self::start_in_netns_for_all)).
    pub fn write_kubeconfig_via(&self, path: &Path, host: std::net::IpAddr) -> Result<()> {
        self.kubeconfig(path, host, "fake-token")
    }

    /// [`write_kubeconfig`](Self::write_kubeconfig) with bearer token `token`: the
    /// [`traffic`](Self::traffic) of this kubeconfig's user is counted under that name.
    pub fn write_kubeconfig_as(&self, path: &Path, token: &str) -> Result<()> {
        self.kubeconfig(path, self.addr.ip(), token)
    }

    /// [`write_kubeconfig_as`](Self::write_kubeconfig_as) reaching the server at `host`
    /// ([`write_kubeconfig_via`](Self::write_kubeconfig_via)).
    pub fn write_kubeconfig_as_via(
        &self,
        path: &Path,
        token: &str,
        host: std::net::IpAddr,
    ) -> Result<()> {
        self.kubeconfig(path, host, token)
    }

    fn kubeconfig(&self, path: &Path, host: std::net::IpAddr, token: &str) -> Result<()> {
        let url = format!("http://{}", SocketAddr::new(host, self.addr.port()));
        let config = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters:\n- name: fake\n  cluster:\n    server: {url}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             users:\n- name: fake\n  user:\n    token: {token}\n",
        );
        std::fs::write(path, config).with_context(|| format!("write {}", path.display()))
    }

    /// Creates or replaces an object (its `kind` picks the resource; cluster-scoped kinds need
    /// no namespace, namespaced ones default to `default`). Returns it as stored, with its
    /// new resourceVersion.
    pub fn apply(&self, object: Value) -> Value {
        let stored = self
            .shared
            .store
            .lock()
            .unwrap()
            .apply(object)
            .expect("apply: unknown kind");
        let _ = self.shared.changed.send(());
        stored
    }

    /// Deletes an object; `kind` is a kind (`Pod`) or a resource (`pods`). Returns whether it
    /// existed.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let resource = store::resource_of(kind).expect("delete: unknown kind");
        let existed = self
            .shared
            .store
            .lock()
            .unwrap()
            .delete(resource, namespace, name)
            .is_some();
        let _ = self.shared.changed.send(());
        existed
    }

    /// `pods/proxy` requests connect to the pod's `status.podIP` from network namespace
    /// `netns` (the lab's node, where a hostNetwork agent listens) from now on.
    pub fn proxy_pods_in(&self, netns: &str) {
        *self.shared.proxy_netns.lock().unwrap() = Some(netns.to_owned());
    }

    /// Answers `verb` on `resource` (e.g. `("pods", "watch")`, `("pods/proxy", "get")`) with
    /// 403 Forbidden from now on.
    pub fn forbid(&self, resource: &str, verb: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap()
            .insert((resource.to_owned(), verb.to_owned()));
    }

    /// Ends every open watch stream (as an API server restart, or a proxy in front of it,
    /// does): the clients re-watch from their resourceVersion, no relist.
    pub fn end_watches(&self) {
        let _ = self.shared.end_watches.send(());
    }

    /// Holds every list request (a slow first sync: an API server under load) until
    /// [`release_lists`](Self::release_lists).
    pub fn hold_lists(&self) {
        self.shared.lists_held.send_replace(true);
    }

    /// Answers the held lists and every list from now on.
    pub fn release_lists(&self) {
        self.shared.lists_held.send_replace(false);
    }

    /// From now on (`true`), every watch ends as soon as it has sent its backlog (the initial
    /// objects or the changes since its resourceVersion), HTTP 200 and a clean end, as a
    /// misbehaving server or a proxy with a tiny idle timeout does; open watches end too.
    pub fn end_watches_at_once(&self, on: bool) {
        self.shared
            .end_at_once
            .store(on, std::sync::atomic::Ordering::Relaxed);
        if on {
            self.end_watches();
        }
    }

    /// Lifts every [`forbid`](Self::forbid).
    pub fn allow_all(&self) {
        self.shared.forbidden.lock().unwrap().clear();
    }

    /// Forgets the watch history: a watch or list from any resourceVersion issued so far gets
    /// 410 Gone. Open watches end with the 410 ERROR event too (as when etcd compacts under a
    /// lagging watcher).
    pub fn expire_history(&self) {
        self.shared.store.lock().unwrap().expire_history();
        let _ = self.shared.changed.send(());
    }

    /// The stored objects of a kind or resource, sorted by namespace and name.
    pub fn objects(&self, kind: &str) -> Vec<Value> {
        let resource = store::resource_of(kind).expect("objects: unknown kind");
        self.shared.store.lock().unwrap().objects(resource)
    }

    /// Node `node`'s condition of type `condition` (`status.conditions[]`), if it has one.
    pub fn node_condition(&self, node: &str, condition: &str) -> Option<Value> {
        self.objects("nodes")
            .into_iter()
            .find(|n| n["metadata"]["name"] == node)?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == condition)
            .cloned()
    }

    /// What every watch of `resource` (plural, e.g. `loopbackverifications`) sent so far.
    pub fn watch_sent(&self, resource: &str) -> WatchSent {
        self.shared
            .watch_sent
            .lock()
            .unwrap()
            .get(resource)
            .copied()
            .unwrap_or_default()
    }

    /// Requests and response bytes so far by client, verb and resource (a request log for
    /// what a fleet of clients costs the API server; [`TrafficKey`] says what each part is).
    /// A watch still open counts the bytes it has sent so far.
    pub fn traffic(&self) -> std::collections::BTreeMap<TrafficKey, Traffic> {
        use std::sync::atomic::Ordering::Relaxed;
        self.shared
            .traffic
            .lock()
            .unwrap()
            .iter()
            .map(|(key, cell)| {
                let traffic = Traffic {
                    requests: cell.requests.load(Relaxed),
                    bytes: cell.bytes.load(Relaxed),
                };
                (key.clone(), traffic)
            })
            .collect()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Stops the server and waits for its thread (open watches are cut).
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod traffic_tests;
