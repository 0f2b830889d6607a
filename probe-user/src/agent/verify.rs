//! Verify on demand and the canary (#40), the I/O: the watch on `LoopbackVerification`
//! requests, the test connections, the answer written to the request's `/status` (this node's
//! entry only, a JSON merge patch), and the canary's timer. What a test comes to is
//! [`crate::verify`]'s (pure).
//!
//! Bounds: one request at a time on this node (a queue of [`QUEUE`]; a request that finds it
//! full is answered on its next watch event, or not at all once older than
//! `verify::MAX_AGE_S`); at most `MAX_TARGETS` LB IP:ports per request from the node and
//! `MAX_CLIENTS` pods, [`ATTEMPTS`] connections each with a [`CONNECT_TIMEOUT`], then a
//! [`GRACE`] wait; an answer carries at most `MAX_RESULTS` results. The agent connects only to
//! the LB ingress IPs and ports of the Service the request names, as its own API cache holds
//! that Service: a request carries no address (SECURITY.md).
//!
//! From where (issue #49): the node's targets from the node; a pod's loop from inside that
//! pod's network namespace (`state::netns`, a thread of its own per call), to the LB IP:port
//! it looped through. A request is marked as being tested before anything is planned (a file
//! on the node, [`super::verify_mark`]; `running` in this node's entry where no file can be
//! written), and an entry, once there, is never taken again: a request that crashed the agent
//! is not retaken by its restart, which answers it `refused`. An agent that is not the node it
//! was named (`--node-name`, E12) answers nothing.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams},
    runtime::{WatchStreamExt as _, watcher},
};
use probe_contract::{
    LoopbackEvent, LoopbackKind,
    verify::{self as contract, NodeVerification, Phase, VerificationSpec, VerifyOutcome},
};
use tokio::sync::{broadcast, mpsc, watch};
use tracing::{info, warn};

use super::verify_mark::TestingMark;
use crate::{
    hub::Shared,
    kube::index::Index,
    state::netns,
    verify::{
        ATTEMPTS, Attempt, CONNECT_TIMEOUT, Client, GRACE, PROBE_BYTES, PROXY_PROTOCOL_GRACE,
        Target, Test, decide, decide_healthcheck, kinds, targets,
    },
};

/// Requests waiting for this node's tester.
const QUEUE: usize = 8;
/// Request names remembered as taken (the watch sends the object again on every status
/// patch of ours).
const TAKEN_MAX: usize = 1024;
/// Targets one canary round tests at most.
pub const CANARY_TARGETS: usize = 4;

/// The API resource, for `kube::Api<DynamicObject>`.
pub fn api_resource() -> kube::core::ApiResource {
    contract::RESOURCE.api_resource()
}

/// What verify and the canary need from the agent.
#[derive(Clone)]
pub struct Tester {
    pub node: String,
    pub shared: Shared,
    pub index: watch::Receiver<Arc<Index>>,
    /// Where the request being tested is marked on the node (None: in the API instead).
    pub mark: Option<TestingMark>,
}

/// A request taken from the watch.
struct Request {
    name: String,
    spec: VerificationSpec,
    /// Its requester annotation (empty: none), at most [`REQUESTER_MAX`] bytes.
    requester: String,
}

/// How long a request waits for the agent's API cache to sync before it is planned.
const SYNC_WAIT: Duration = Duration::from_secs(15);
/// A requester name longer than this is cut (a Kubernetes user name is rarely over 100); a cut
/// one ends in its size, so two long names share a limit only when alike to that point.
const REQUESTER_MAX: usize = 256;

/// `--verify`: watches the requests and answers those for this node (`allowed`: false answers
/// each with `refused`, saying why). Runs until aborted.
pub async fn serve(
    client: kube::Client,
    tester: Tester,
    allowed: bool,
    local: watch::Receiver<crate::state::addrs::Owners>,
) {
    // E12: an agent told another node's name answers nothing as that node (the real node's
    // agent would skip the request as answered).
    if !crate::sink::node_report::this_node::is_this_node(
        &client,
        &tester.node,
        Some(local),
        None,
        1000,
    )
    .await
    {
        tracing::error!(node = %tester.node, "verify: this agent is not node {:?} (--node-name / NODE_NAME): it answers no verify request", tester.node);
        return;
    }
    info!(node = %tester.node, "verify: answering requests as this node");
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource());
    let mut taken: HashSet<String> = HashSet::new();
    if let Some(name) = tester.mark.as_ref().and_then(TestingMark::take_left_over) {
        answer_left_over(&api, &tester.node, &name).await;
        taken.insert(name);
    }
    let (tx, rx) = mpsc::channel::<Request>(QUEUE);
    let worker = tokio::spawn(answer_requests(api.clone(), tester.clone(), allowed, rx));
    let mut failing = false;
    let mut events = std::pin::pin!(
        // This node's request objects only (H3): not every node's answers to every request.
        watcher(
            api,
            watcher::Config::default().labels(&format!(
                "{}={}",
                contract::NODE_LABEL,
                contract::node_label_value(&tester.node)
            ))
        )
        .default_backoff()
        .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None)
    );
    while let Some(event) = events.next().await {
        let object = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
            Ok(_) => continue,
            Err(e) => {
                if !failing {
                    warn!(error = %e, "verify: cannot watch loopbackverifications (CRD not installed, or no RBAC list/watch); retrying");
                }
                failing = true;
                continue;
            }
        };
        if failing {
            info!("verify: watching loopbackverifications");
            failing = false;
        }
        let Some(request) = take(&object, &tester, &taken) else {
            continue;
        };
        if taken.len() >= TAKEN_MAX {
            taken.clear();
        }
        match tx.try_send(request) {
            Ok(()) => {
                taken.insert(object.metadata.name.clone().unwrap_or_default());
            }
            // Full: taken on a later watch event, or not at all once too old.
            Err(mpsc::error::TrySendError::Full(r)) => {
                warn!(request = %r.name, "verify: {QUEUE} requests waiting; this one later")
            }
            Err(mpsc::error::TrySendError::Closed(_)) => break,
        }
    }
    worker.abort();
}

/// The request in `object` when this node should answer it: not answered yet here, not too
/// old, and for this node.
fn take(object: &DynamicObject, tester: &Tester, taken: &HashSet<String>) -> Option<Request> {
    let name = object.metadata.name.clone()?;
    if taken.contains(&name) || object.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let answered = contract::VerificationStatus::has_entry(&object.data, &tester.node);
    let created = object.metadata.creation_timestamp.as_ref()?.0.as_second();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    if answered || now.saturating_sub(created) > contract::MAX_AGE_S {
        return None;
    }
    let spec = VerificationSpec::of_object(&object.data)?;
    let key = spec.service.key();
    let has_loop = tester
        .shared
        .confirmed()
        .iter()
        .any(|e| crate::verify::names_service(e, &key));
    let requester = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(contract::REQUESTER_ANNOTATION))
        .map(|r| probe_core::untrusted::cut(r, REQUESTER_MAX))
        .unwrap_or_default();
    crate::verify::is_for(&spec.nodes, &tester.node, has_loop).then_some(Request {
        name,
        spec,
        requester,
    })
}

/// The request a previous agent of this node marked and never answered: it stopped (crashed,
/// was killed or restarted) while testing it. Answered `refused`, one write, and not taken
/// again, so a request that crashes the agent cannot crash it again.
async fn answer_left_over(api: &Api<DynamicObject>, node: &str, name: &str) {
    let now = now_rfc3339();
    let entry = NodeVerification {
        phase: Phase::Refused,
        started_at: now.clone(),
        finished_at: now,
        message: "this node's agent stopped while testing this request (it crashed, was killed or restarted); the request is not tested again".to_owned(),
        ..Default::default()
    };
    warn!(request = %name, "verify: the agent stopped while testing this request; answered refused, not taken again");
    write(api, name, node, &entry).await;
}

/// Marks `request` as being tested before anything is planned (the crash guard): on the node
/// when it can, else `running` in the API (one more write).
async fn mark_testing(
    api: &Api<DynamicObject>,
    tester: &Tester,
    request: &str,
    entry: &NodeVerification,
) {
    if let Some(mark) = &tester.mark {
        match mark.set(request) {
            Ok(()) => return,
            Err(e) => {
                warn!(request = %request, error = %e, "verify: cannot mark the request on the node; marking it in the API")
            }
        }
    }
    write(api, request, &tester.node, entry).await;
}

/// One request at a time: marked first (an entry, once written, is never taken again, and a
/// marked request is answered `refused` by a restart: a request that crashes the agent is not
/// retaken), then planned, tested and answered.
async fn answer_requests(
    api: Api<DynamicObject>,
    tester: Tester,
    allowed: bool,
    mut requests: mpsc::Receiver<Request>,
) {
    let mut limits = crate::verify::rate::RateLimits::default();
    while let Some(r) = requests.recv().await {
        let started_at = now_rfc3339();
        let mut entry = NodeVerification {
            phase: Phase::Running,
            started_at: started_at.clone(),
            ..Default::default()
        };
        let service = r.spec.service.key();
        mark_testing(&api, &tester, &r.name, &entry).await;
        let planned = if !allowed {
            Err(Refusal::Off)
        } else if let Err(limit) = limits.admit(&r.requester, Instant::now()) {
            tester.shared.test_traffic().count_rate_limited(limit);
            Err(Refusal::RateLimited {
                limit,
                requester: r.requester.clone(),
            })
        } else {
            // A request that arrives while the agent starts is planned once its API cache is
            // synced (within SYNC_WAIT), not refused for a Service it has not read yet.
            let mut index = tester.index.clone();
            let _ = tokio::time::timeout(SYNC_WAIT, index.wait_for(|i| i.synced)).await;
            plan(&tester, &r.spec)
        };
        match planned {
            Err(why) => {
                entry.phase = Phase::Refused;
                entry.message = why.to_string();
            }
            Ok(p) => {
                info!(request = %r.name, %service, tests = p.tests.len(), "verify: testing");
                let mut results = run_test(&tester, &p, false).await;
                results.extend(p.untestable);
                let (results, note) = crate::verify::bounded(results);
                entry.results = results;
                entry.message = note.unwrap_or_default();
                entry.phase = Phase::Done;
            }
        }
        entry.finished_at = now_rfc3339();
        tester.shared.test_traffic().count_request(entry.phase);
        info!(request = %r.name, %service, phase = entry.phase.as_str(), "verify: answered");
        write(&api, &r.name, &tester.node, &entry).await;
        if let Some(mark) = &tester.mark {
            mark.clear();
        }
    }
}

/// What a request tests here: the tests (the node's, then the pods' that looped), the
/// results known without a test (not testable), whether the health checks are asked for,
/// and the LB IP:ports with PROXY protocol on (their test connections send bytes).
pub struct Plan {
    pub tests: Vec<Test>,
    pub untestable: Vec<probe_contract::verify::VerifyResult>,
    pub healthchecks: bool,
    pub proxy_protocol: HashSet<(IpAddr, u16)>,
}

/// Why this node answers a request `refused` (its entry's message).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("this agent runs with --verify off")]
    Off,
    #[error("{}", .limit.message(.requester))]
    RateLimited {
        limit: crate::verify::rate::Limit,
        requester: String,
    },
    #[error(transparent)]
    Kinds(#[from] crate::verify::KindsError),
    #[error(
        "Service {key} is not in this agent's API cache (it does not exist, or the agent cannot list Services{})",
        if *.synced { "" } else { "; its cache is not synced yet" }
    )]
    NotInCache { key: String, synced: bool },
}

/// The Service's targets, this node's loops of it and the kinds asked for, or why this node
/// will not test.
fn plan(tester: &Tester, spec: &VerificationSpec) -> Result<Plan, Refusal> {
    let kinds = kinds(&spec.kinds)?;
    let index = tester.index.borrow().clone();
    let key = spec.service.key();
    let Some(svc) = index.services().find(|s| s.key() == key) else {
        return Err(Refusal::NotInCache {
            key,
            synced: index.synced,
        });
    };
    let service_targets = targets(svc);
    let loops = crate::verify::loops_of(&tester.shared.confirmed(), &key, &service_targets.0);
    let (tests, untestable) =
        crate::verify::plan(service_targets, &kinds, spec.kinds.is_empty(), &loops);
    let proxy_protocol = crate::correlate::proxy_protocol::targets(std::iter::once(svc))
        .into_iter()
        .map(|t| (t.ip, t.port))
        .collect();
    Ok(Plan {
        tests,
        untestable,
        healthchecks: kinds.contains(&LoopbackKind::HealthcheckBlackhole),
        proxy_protocol,
    })
}

/// Writes this node's entry (a merge patch of `/status`: other nodes' entries stay).
async fn write(api: &Api<DynamicObject>, name: &str, node: &str, entry: &NodeVerification) {
    let patch = contract::status_patch(node, entry);
    if let Err(e) = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        warn!(request = %name, error = %e, "verify: cannot write the answer (RBAC patch loopbackverifications/status?)");
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Runs `plan`'s tests: [`ATTEMPTS`] connections each from its client (fewer once its
/// loop is confirmed), then the grace wait ([`PROXY_PROTOCOL_GRACE`] when a PROXY-protocol
/// target was tested); the results per test and kind, and per LB IP for the health checks
/// when asked. A pod whose namespace cannot be found or entered is `not_testable`, with why.
/// `canary`: the connections are noted as the canary's, so the confirmations they cause are
/// marked.
pub async fn run_test(
    tester: &Tester,
    plan: &Plan,
    canary: bool,
) -> Vec<probe_contract::verify::VerifyResult> {
    // Subscribed before the first connection: nothing it causes is missed.
    let mut reports = tester.shared.subscribe();
    let started = Instant::now();
    let mut seen: Vec<LoopbackEvent> = Vec::new();
    let mut made_per_test: Vec<Result<Vec<Attempt>, Arc<netns::NetnsError>>> = Vec::new();
    let mut namespaces: HashMap<IpAddr, Result<netns::Netns, Arc<netns::NetnsError>>> =
        HashMap::new();
    let mut sent_bytes = false;
    for test in &plan.tests {
        let send = plan
            .proxy_protocol
            .contains(&(test.target.ip, test.target.port));
        sent_bytes |= send;
        let ns = match &test.client {
            Client::Node => None,
            Client::Pod { ip, .. } => match namespace_of(&mut namespaces, *ip).await {
                Ok(ns) => Some((ns, *ip)),
                Err(why) => {
                    made_per_test.push(Err(why));
                    continue;
                }
            },
        };
        let mut made = Vec::new();
        for _ in 0..ATTEMPTS {
            drain(&mut reports, &mut seen);
            if seen
                .iter()
                .any(|e| test.target.is_of(e) && test.client.sent(e))
            {
                break;
            }
            let attempt = match &ns {
                None => connect(tester, &test.target, canary, send).await,
                Some((ns, ip)) => {
                    let (ns, ip, target) = (ns.clone(), *ip, test.target);
                    tokio::task::spawn_blocking(move || {
                        netns::run_in(&ns, ip, move || connect_blocking(&target, send))
                    })
                    .await
                    .map_err(|_| netns::NetnsError::Panicked)
                    .and_then(|r| r)
                    .unwrap_or_else(|e| Attempt::Failed(e.to_string()))
                }
            };
            made.push(attempt);
        }
        made_per_test.push(Ok(made));
    }
    let grace = if sent_bytes {
        PROXY_PROTOCOL_GRACE
    } else {
        GRACE
    };
    let deadline = tokio::time::Instant::now() + grace;
    while let Ok(received) = tokio::time::timeout_at(deadline, reports.recv()).await {
        match received {
            Ok(c) => seen.push(c.event.clone()),
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
    let waited = started.elapsed();
    let mut results = Vec::new();
    for (test, made) in plan.tests.iter().zip(&made_per_test) {
        match made {
            Ok(made) => results.extend(decide(test, made, &seen)),
            Err(why) => results.extend(crate::verify::untestable_client(
                test,
                &format!("cannot call from the pod's own network namespace: {why}"),
            )),
        }
    }
    if plan.healthchecks {
        let mut ips: Vec<IpAddr> = plan.tests.iter().map(|t| t.target.ip).collect();
        ips.sort();
        ips.dedup();
        for ip in ips {
            results.push(decide_healthcheck(ip, waited, &seen));
        }
    }
    results
}

/// The network namespace holding `ip`, searched once per request (`cache`) off the runtime.
async fn namespace_of(
    cache: &mut HashMap<IpAddr, Result<netns::Netns, Arc<netns::NetnsError>>>,
    ip: IpAddr,
) -> Result<netns::Netns, Arc<netns::NetnsError>> {
    if let Some(found) = cache.get(&ip) {
        return found.clone();
    }
    let found = tokio::task::spawn_blocking(move || netns::find_by_addr(ip))
        .await
        .unwrap_or(Err(netns::NetnsError::Panicked))
        .map_err(Arc::new);
    cache.insert(ip, found.clone());
    found
}

fn drain(
    reports: &mut broadcast::Receiver<Arc<probe_contract::Confirmation>>,
    seen: &mut Vec<LoopbackEvent>,
) {
    loop {
        match reports.try_recv() {
            Ok(c) => seen.push(c.event.clone()),
            Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(_) => return,
        }
    }
}

/// One TCP connection from the calling thread's namespace (a pod's: `netns::run_in`) to
/// `target`, blocking; `send`: [`PROBE_BYTES`] written once connected, and an answer (bytes,
/// the close or a reset) awaited for a [`CONNECT_TIMEOUT`].
fn connect_blocking(target: &Target, send: bool) -> Attempt {
    use std::io::{Read as _, Write as _};
    let remote = SocketAddr::new(target.ip, target.port);
    let started = Instant::now();
    match std::net::TcpStream::connect_timeout(&remote, CONNECT_TIMEOUT) {
        Ok(mut stream) => {
            let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            if send {
                let _ = stream.set_read_timeout(Some(CONNECT_TIMEOUT));
                let _ = stream.write_all(PROBE_BYTES);
                let _ = stream.read(&mut [0u8; 64]);
            }
            Attempt::Connected(ms)
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Attempt::Refused,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            Attempt::TimedOut
        }
        Err(e) => Attempt::Failed(e.to_string()),
    }
}

/// One TCP connection from this node's namespace to `target`, closed at once (`send`: after
/// [`PROBE_BYTES`] and an answer, as [`connect_blocking`]).
async fn connect(tester: &Tester, target: &Target, canary: bool, send: bool) -> Attempt {
    let remote = SocketAddr::new(target.ip, target.port);
    let socket = match remote {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    };
    let socket = match socket {
        Ok(s) => s,
        Err(e) => return Attempt::Failed(e.to_string()),
    };
    // Bound first, so the canary's source port is known before its SYN leaves.
    let any: SocketAddr = match remote {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    if let Err(e) = socket.bind(any) {
        return Attempt::Failed(e.to_string());
    }
    if canary && let Ok(local) = socket.local_addr() {
        tester.shared.test_traffic().note_canary_flow(
            local,
            remote,
            probe_contract::clock::monotonic_ns(),
        );
    }
    let started = Instant::now();
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(remote)).await {
        Ok(Ok(mut stream)) => {
            let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            if send {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                let _ = stream.write_all(PROBE_BYTES).await;
                let mut buf = [0u8; 64];
                let _ = tokio::time::timeout(CONNECT_TIMEOUT, stream.read(&mut buf)).await;
            }
            drop(stream);
            Attempt::Connected(ms)
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Attempt::Refused,
        Ok(Err(e)) => Attempt::Failed(e.to_string()),
        Err(_) => Attempt::TimedOut,
    }
}

/// `--canary-every`: every `every` (jittered by up to a quarter), one TCP LB IP:port of each
/// of the next [`CANARY_TARGETS`] Services in the API cache (risks first, in turn:
/// `verify::canary_round`), tested like a verify request; each target's worst outcome counted in
/// `clbprobe_canary_tests_total{outcome}`. Runs until aborted.
pub async fn canary(tester: Tester, every: Duration) {
    info!(
        every_s = every.as_secs(),
        "canary on: node-sourced tests of LB IP:ports"
    );
    let mut cursor = 0usize;
    let mut next = HashMap::new();
    let kinds = crate::verify::node_testable();
    loop {
        let jitter = every.mul_f64(jitter_fraction() * 0.25);
        tokio::time::sleep(every + jitter).await;
        let index = tester.index.borrow().clone();
        let risks = tester.shared.check_risks();
        let services: Vec<(String, Vec<Target>, bool)> = index
            .services()
            .map(|s| {
                let key = s.key();
                let risky = risks.iter().any(|r| {
                    r.service.as_deref() == Some(key.as_str()) || r.services.contains(&key)
                });
                (key, targets(s).0, risky)
            })
            .collect();
        let mut round =
            crate::verify::canary_round(&services, &mut cursor, &mut next, CANARY_TARGETS);
        round.sort_by_key(|t| (t.ip, t.port));
        round.dedup();
        if round.is_empty() {
            continue;
        }
        let plan = Plan {
            tests: round
                .iter()
                .map(|t| Test {
                    client: Client::Node,
                    target: *t,
                    kinds: kinds.clone(),
                    looped: Vec::new(),
                })
                .collect(),
            untestable: Vec::new(),
            healthchecks: false,
            proxy_protocol: HashSet::new(),
        };
        let results = run_test(&tester, &plan, true).await;
        for target in &round {
            let text = target.text();
            let mine: Vec<_> = results
                .iter()
                .filter(|r| r.target == text)
                .cloned()
                .collect();
            let outcome = crate::verify::worst(&mine).unwrap_or(VerifyOutcome::NotTestable);
            tester.shared.test_traffic().count_canary(outcome);
            if outcome == VerifyOutcome::Confirmed {
                info!(target = %text, "canary: a loop confirmed");
            }
        }
    }
}

/// A fraction in [0, 1) from the clock's nanoseconds: jitter, not randomness.
fn jitter_fraction() -> f64 {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(ns % 1000) / 1000.0
}
