//! The service-table refresher: reads the table on change, not on a timer.
//!
//! What wakes it ([`crate::state::changes`]): an nf_tables commit (iptables-nft, nft, kube-proxy
//! in nftables mode); in IPVS mode a change of the virtual services' digest; with legacy tables
//! loaded a change of their entry counts and sizes (both polled every [`POLL`], each one
//! `getsockopt` or one netlink dump, no process); and `--services-every`, now a safety net for
//! what no signal covers (IPVS destination-only and ipset-only edits, a same-size legacy
//! rewrite, a lost subscription). Its default is long (600 s) because a full read of a large
//! table is what costs: a whole dump of 100,000 rules is a second of CPU, so one read per 10
//! minutes keeps even 10,000 Services under 1% of a core.
//!
//! Commits come in bursts (an `iptables-restore` is one commit, but kube-proxy syncs every
//! second and other writers commit too): a signal waits [`SETTLE`] for the burst to end, and
//! reads start at least [`MIN_GAP`] apart, so a writer committing every second costs at most one
//! read per second, and the reader's parse cache makes an unchanged dump cost the dump and a
//! hash. A commit during a read triggers one more read after it. A failed read keeps the last
//! good table and is retried after [`RETRY`].
//!
//! With API access ([`ApiFeed`]), once the API's lists are complete and the first dataplane
//! read has said kube-proxy's mode, the table is the API's (`kube::service_table`: what
//! kube-proxy should program, kept per watch event) and from then on a commit makes it read
//! only the chains [`state::dataplane::read_facts`] keeps (masquerade rules, NodePorts as
//! programmed, the access filter), never the whole rule set: at 30,000 Services that is the
//! difference between reading 210,000 rules per change and reading a few. An API change
//! makes a new table at most every [`API_EVERY`] (and [`API_DUTY`] times the last one's
//! making apart); a commit that leaves the dataplane's part unchanged makes none. Without API
//! access, or while its lists are incomplete, the dataplane is read whole as before (over
//! netlink).
//!
//! The first read starts with the agent and is not waited for: detection that needs no service
//! table (the correlator treats a missing table as unknown, as it does when the rules cannot be
//! read) starts at once and the table fills in behind.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::{info, warn};

use crate::{
    kube::{index::Index, service_table::NodeView, watcher::SharedApiTable},
    state::{self, ServiceSource, ServiceTable, addrs::Owners, changes},
};

/// How long a signal waits for the rest of its burst of commits.
pub const SETTLE: Duration = Duration::from_millis(200);
/// The least time between the starts of two reads.
pub const MIN_GAP: Duration = Duration::from_secs(1);
/// Reads start at least this many times their own duration apart (but at most [`MAX_GAP`]):
/// a full read of a large table (a dump of 100,000 rules takes a second) under a
/// writer that changes the rules every second then costs about 1/20 = 5% of a core, paid in
/// freshness. A change after a quiet spell is read after [`SETTLE`].
pub const READ_DUTY: u32 = 20;
/// The longest a change waits behind the previous read: freshness wins over the duty bound
/// when one read takes more than 1.5 s (10,000 Services: 5 s reads, 30 s apart, ~17% of a
/// core under continuous churn, against 100% for the old 5 s timer).
pub const MAX_GAP: Duration = Duration::from_secs(30);
/// The interval of the cheap IPVS and legacy change tests.
pub const POLL: Duration = Duration::from_secs(1);
/// A failed read is retried after this (or on the next signal).
pub const RETRY: Duration = Duration::from_secs(5);
/// How long a start that read only the dataplane's part waits for the API's lists before it
/// reads the rules whole (API access refused, an API server that never answers).
pub const API_WAIT: Duration = Duration::from_secs(15);

/// The least time between two tables made from the API (a relist or a rollout applies many
/// objects at once).
pub const API_EVERY: Duration = Duration::from_millis(200);
/// Tables from the API are made at least this many times their own making's duration apart:
/// at 30,000 Services one takes ~130 ms (60,000 entries), so under continuous API churn
/// (endpoints move every second on a large cluster) the agent spends at most ~1/10 of a core
/// on them, and a change waits at most ~1.3 s (the freshness target is 2 s).
pub const API_DUTY: u32 = 10;

/// The table from the API, when the agent has API access.
pub struct ApiFeed {
    pub table: SharedApiTable,
    /// Its `synced`: every list complete once (before that, a missing Service may only be not
    /// listed yet).
    pub index: watch::Receiver<Arc<Index>>,
    /// The node's addresses (IPVS mode makes each NodePort a virtual service on each).
    pub owners: watch::Receiver<Owners>,
}

impl ApiFeed {
    fn synced(&self) -> bool {
        self.index.borrow().synced
    }

    /// The node's own addresses: interface addresses no announcer holds.
    fn node_ips(&self) -> Vec<std::net::IpAddr> {
        use probe_contract::facts::AddressOwner;
        self.owners
            .borrow()
            .iter()
            .filter(|(p, o)| {
                p.is_host()
                    && matches!(o, AddressOwner::Interface { iface, announcer: None } if iface != "lo")
            })
            .map(|(p, _)| p.addr)
            .collect()
    }

    /// The table for `mode` from the API, with what only the node's rules say (`facts`), or
    /// None when it equals `last`. On the blocking pool: at 30,000 Services making the table
    /// (60,000 entries) and comparing it takes tens of ms, under the API table's lock, which
    /// must not hold a runtime thread.
    async fn compose(
        &self,
        mode: ServiceSource,
        facts: &Arc<ServiceTable>,
        last: Option<Arc<ServiceTable>>,
    ) -> Option<Arc<ServiceTable>> {
        let view = NodeView {
            mode,
            node_name: None,
            node_ips: self.node_ips(),
        };
        let api = self.table.table.clone();
        let facts = facts.clone();
        tokio::task::spawn_blocking(move || {
            let mut table = {
                let mut shared = api.write().ok()?;
                let node = shared.node().clone();
                shared.set_node(NodeView {
                    node_name: node.node_name,
                    ..view
                });
                shared.expected()
            };
            table.from_api = true;
            table.masquerade_rules = facts.masquerade_rules.clone();
            table.access_filter = facts.access_filter.clone();
            // NodePorts as the rules apply them (their policy is what the kernel did); IPVS
            // mode's are virtual services, the API's.
            if mode != ServiceSource::Ipvs && !facts.nodeports.is_empty() {
                table.nodeports = facts.nodeports.clone();
            }
            (last.as_deref() != Some(&table)).then(|| Arc::new(table))
        })
        .await
        .ok()
        .flatten()
    }
}

/// The dataplane's part of a whole read (everything but its Services), kept beside the API's
/// table.
fn facts_of(read: &ServiceTable) -> Arc<ServiceTable> {
    Arc::new(ServiceTable {
        source: read.source,
        from_api: false,
        services: Vec::new(),
        nodeports: read.nodeports.clone(),
        masquerade_rules: read.masquerade_rules.clone(),
        access_filter: read.access_filter.clone(),
        no_endpoint_drops: read.no_endpoint_drops.clone(),
        serves_index: Default::default(),
    })
}

/// Where the Services of the table come from (`--service-table-from`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFrom {
    /// The API's Services and EndpointSlices when the agent has API access (the rules are
    /// read only for what the API cannot say, and per question); the rules without it.
    #[default]
    Api,
    /// Always kube-proxy's rules (or IPVS), read whole on change: the reader before the API's.
    Rules,
}

/// How the refresher decides to read (`--services-reader`, hidden: the bench's baseline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReaderMode {
    /// On change (the default).
    #[default]
    Change,
    /// Every `--services-every`, re-parsing every dump, ready only after the first read: the
    /// reader as it was, kept for the bench to measure against.
    Timer,
}

/// When to read next, from the signals seen. Pure: the times are given.
///
/// Two kinds of read are paced apart: a whole read (every dump parsed again: the first, the
/// safety net, a full restore) and a small one (only the chains a commit named). Each kind
/// starts at least [`READ_DUTY`] times its own last duration after the last read of that
/// kind (whole: at most [`MAX_GAP`]), and every read at least [`MIN_GAP`] after the last one:
/// each kind then costs at most ~5% of a core, and the 1.6 s dump kube-proxy's full restore
/// forced does not hold the next Service's 0.1 s read back by 30 s.
#[derive(Debug, Default)]
pub struct Pacer {
    /// When the first unanswered signal came.
    pending_since: Option<Instant>,
    last_start: Option<Instant>,
    last_whole_start: Option<Instant>,
    last_small_start: Option<Instant>,
    /// How long the last read of each kind took.
    whole_took: Duration,
    small_took: Duration,
}

impl Pacer {
    /// Something may have changed.
    pub fn signal(&mut self, now: Instant) {
        self.pending_since.get_or_insert(now);
    }

    /// When the pending read is due (None: nothing pending); `whole`: it will be a whole read.
    pub fn due(&self, whole: bool) -> Option<Instant> {
        let since = self.pending_since?;
        let Some(last) = self.last_start else {
            return Some(since);
        };
        let (kind_start, took) = if whole {
            (self.last_whole_start, self.whole_took)
        } else {
            (self.last_small_start, self.small_took)
        };
        let mut due = (since + SETTLE).max(last + MIN_GAP);
        if let Some(kind_start) = kind_start {
            due = due.max(kind_start + (took * READ_DUTY).min(MAX_GAP));
        }
        Some(due)
    }

    /// A read starts: every signal so far is answered by it.
    pub fn started(&mut self, now: Instant, whole: bool) {
        self.pending_since = None;
        self.last_start = Some(now);
        if whole {
            self.last_whole_start = Some(now);
        } else {
            self.last_small_start = Some(now);
        }
    }

    /// The read that started last took `took`.
    pub fn finished(&mut self, took: Duration, whole: bool) {
        if whole {
            self.whole_took = took;
        } else {
            self.small_took = took;
        }
    }
}

/// The refresher's inputs.
pub struct Refresher {
    pub mode: ReaderMode,
    /// `--services-every`.
    pub every: Duration,
    /// The first read and the commit subscription, both started with the agent.
    pub first: Pending,
    /// Where each new table goes (the correlation loop).
    /// The table is shared (`Arc`), never copied: at 30,000 Services it holds 60,000 entries.
    pub tx: mpsc::Sender<Arc<ServiceTable>>,
    /// The table from the API (None: no API access).
    pub api: Option<ApiFeed>,
}

/// What the agent's start left for the refresher.
#[derive(Default)]
pub struct Pending {
    /// The first read (change mode; None in timer mode, where the agent waited for it before
    /// ready).
    pub read: Option<JoinHandle<anyhow::Result<ServiceTable>>>,
    /// The nf_tables commit subscription (change mode), opened before the first read began so
    /// that no commit falls between that read's dump and the subscription.
    pub commits: Option<CommitFeed>,
}

/// Subscribes to nf_tables commits (change mode), then starts the first read (on the blocking
/// pool, now).
///
/// `facts_first` (the table will come from the API): the mode and the dataplane's part only
/// ([`state::dataplane::first_read`]), not the whole rule set: at 10,000 Services the whole
/// nat table held while the API's lists arrive was a third of the agent's peak memory. Should
/// the API not list everything within [`API_WAIT`], the rules are read whole after all.
pub fn start_first_read(mode: ReaderMode, facts_first: bool) -> Pending {
    let commits = (mode == ReaderMode::Change).then(watch_commits).flatten();
    let read = if facts_first && mode == ReaderMode::Change {
        tokio::task::spawn_blocking(state::dataplane::first_read)
    } else {
        tokio::task::spawn_blocking(state::read_services)
    };
    Pending {
        read: Some(read),
        commits,
    }
}

impl Refresher {
    pub async fn run(self) {
        match self.mode {
            ReaderMode::Timer => timer(self.every, self.tx).await,
            ReaderMode::Change => on_change(self).await,
        }
    }
}

/// The baseline: a full read every `every`, each table sent.
async fn timer(every: Duration, tx: mpsc::Sender<Arc<ServiceTable>>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // immediate: the table was just read
    loop {
        tick.tick().await;
        let started = Instant::now();
        match tokio::task::spawn_blocking(state::read_services).await {
            Ok(Ok(table)) => {
                let line = TableLine::of(&table);
                if tx.send(Arc::new(table)).await.is_err() {
                    return;
                }
                line.log("timer", Some(started.elapsed()));
            }
            Ok(Err(e)) => warn!(error = %e, "reading the service table"),
            Err(e) => warn!(error = %e, "the service table reader failed"),
        }
    }
}

/// nf_tables commits as they come: a counter that wakes the refresher, and what they touched
/// since the last read took it.
pub struct CommitFeed {
    count: watch::Receiver<u64>,
    touched: Arc<Mutex<changes::Touched>>,
}

impl CommitFeed {
    /// What the commits touched since the last take.
    fn take(&self) -> changes::Touched {
        self.touched
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_else(|_| changes::Touched::everything())
    }

    fn is_empty(&self) -> bool {
        self.touched.lock().map(|t| t.is_empty()).unwrap_or(false)
    }

    /// Whether what was touched so far will be read whole (see `state::iptables`).
    fn reads_whole(&self) -> bool {
        self.touched
            .lock()
            .map(|t| t.is_everything() || t.named() > state::iptables::MAX_CHAIN_READS)
            .unwrap_or(true)
    }
}

/// Follows nf_tables commits on a thread of its own (a blocking netlink receive); None when
/// the subscription is refused (then the safety net and the polled tests are what is left,
/// said once).
fn watch_commits() -> Option<CommitFeed> {
    let mut nft = match changes::NftWatch::open() {
        Ok(w) => w,
        Err(e) => {
            warn!(error = %e, "cannot subscribe to nf_tables commits; the service table is re-read every --services-every");
            return None;
        }
    };
    let (tx, rx) = watch::channel(0u64);
    let touched = Arc::new(Mutex::new(changes::Touched::default()));
    let held = touched.clone();
    let spawned = std::thread::Builder::new()
        .name("nft-commits".into())
        .spawn(move || {
            loop {
                match nft.wait_commit() {
                    Ok(t) => {
                        if let Ok(mut held) = held.lock() {
                            held.merge(t);
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "nf_tables commit subscription failed; the service table is re-read every --services-every");
                        return;
                    }
                }
                tx.send_modify(|n| *n += 1);
                if tx.is_closed() {
                    return;
                }
            }
        });
    spawned.ok().map(|_| CommitFeed { count: rx, touched })
}

/// What the polled change tests last said.
#[derive(Default, PartialEq, Eq, Clone, Copy, Debug)]
struct Polled {
    ipvs: Option<u64>,
    legacy: Option<u64>,
}

fn poll(ipvs: bool) -> Polled {
    Polled {
        ipvs: if ipvs {
            state::ipvs::services_digest().ok().flatten()
        } else {
            None
        },
        legacy: changes::legacy_fingerprint(),
    }
}

async fn on_change(r: Refresher) {
    let mut commits = r.first.commits;
    let mut api = r.api;
    let mut pacer = Pacer::default();
    let mut last: Option<Arc<ServiceTable>> = None;
    let mut first = r.first.read;
    // What no commit message says (the first read, the safety net, a failed read, a signal
    // from the polled tests) is read whole.
    let mut read_whole = true;
    let mut polled = Polled::default();
    let mut ipvs_mode = false;
    // kube-proxy's mode, from the last whole dataplane read (the API cannot say it).
    let mut mode: Option<ServiceSource> = None;
    // The table is the API's (see the module docs); `facts`: the dataplane's part of it.
    let mut api_on = false;
    let mut facts = Arc::new(ServiceTable::default());
    let mut api_dirty = false;
    let mut api_next = tokio::time::Instant::now();
    // A facts-first start (see `start_first_read`): the whole rules are read if the API's
    // lists are not complete by then.
    let mut whole_unless_api = api.as_ref().map(|_| tokio::time::Instant::now() + API_WAIT);
    let mut safety = tokio::time::Instant::now() + r.every;
    let mut poll_tick = tokio::time::interval(POLL);
    poll_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pacer.signal(Instant::now());
    loop {
        // The API's lists are complete and the rules said the mode: its table from now on,
        // with the last whole read's masquerade rules and NodePorts as the dataplane's part.
        if !api_on
            && let (Some(feed), Some(m), Some(read)) = (&api, mode, &last)
            && feed.synced()
        {
            api_on = true;
            api_dirty = true;
            ipvs_mode = false;
            facts = facts_of(read);
            info!(
                mode = ?m,
                "service table: from the API from now on; the rules are read only for masquerade, NodePorts and per question"
            );
            // The whole nat table held for chain re-reads is not needed now.
            tokio::task::spawn_blocking(state::iptables::release_held);
        }
        // The API's table, when it changed (at most every API_EVERY).
        if api_dirty && api_on && tokio::time::Instant::now() >= api_next {
            api_dirty = false;
            let started = tokio::time::Instant::now();
            if let (Some(feed), Some(m)) = (&api, mode)
                && !send_from_api(feed, m, &facts, &mut last, &r.tx, "API change").await
            {
                return;
            }
            api_next = started + API_EVERY.max(started.elapsed() * API_DUTY);
            continue;
        }
        let whole =
            read_whole || first.is_some() || commits.as_ref().is_none_or(CommitFeed::reads_whole);
        if let Some(due) = pacer.due(whole)
            && due <= Instant::now()
        {
            pacer.started(Instant::now(), whole);
            if let Some(feed) = &mut commits {
                feed.count.borrow_and_update();
            }
            // The first read began with the agent: what was touched since is left for the next.
            let mut touched = match (&commits, first.is_some()) {
                (_, true) => changes::Touched::everything(),
                (Some(feed), false) => feed.take(),
                (None, false) => changes::Touched::everything(),
            };
            if std::mem::take(&mut read_whole) {
                touched = changes::Touched::everything();
            }
            tracing::debug!(
                whole,
                api_on,
                everything = touched.is_everything(),
                named = touched.named(),
                "service table read starts"
            );
            // The change tests' state before the read: a change during it is seen next poll.
            let before = {
                let ipvs = ipvs_mode;
                tokio::task::spawn_blocking(move || poll(ipvs))
                    .await
                    .unwrap_or_default()
            };
            let started = Instant::now();
            let facts_mode = mode.filter(|_| api_on);
            let read = match first.take() {
                Some(handle) => {
                    let read = handle.await;
                    if commits.as_ref().is_some_and(|f| !f.is_empty()) {
                        pacer.signal(Instant::now());
                    }
                    read
                }
                None => {
                    tokio::task::spawn_blocking(move || match facts_mode {
                        Some(m) => state::dataplane::read_facts(&touched, m),
                        None => state::read_services_after(&touched),
                    })
                    .await
                }
            };
            let took = started.elapsed();
            pacer.finished(took, whole);
            safety = tokio::time::Instant::now() + r.every;
            match read {
                Ok(Ok(table)) => {
                    if facts_mode.is_none() {
                        mode = table.source;
                    }
                    polled = before;
                    if let (Some(feed), Some(m)) = (&api, facts_mode) {
                        let read = facts_of(&table);
                        drop(table);
                        // A commit that left the dataplane's part as it was (a kube-proxy
                        // sync rewriting a Service's chains) makes no new table: making one
                        // is the API table's whole size (130 ms at 30,000 Services).
                        if read == facts {
                            continue;
                        }
                        facts = read;
                        if !send_from_api(feed, m, &facts, &mut last, &r.tx, "rules changed").await
                        {
                            return;
                        }
                        continue;
                    }
                    ipvs_mode = table.source == Some(state::ServiceSource::Ipvs);
                    if ipvs_mode && polled.ipvs.is_none() {
                        polled.ipvs = tokio::task::spawn_blocking(|| poll(true))
                            .await
                            .unwrap_or_default()
                            .ipvs;
                    }
                    if last.as_deref() != Some(&table) {
                        let line = TableLine::of(&table);
                        let table = Arc::new(table);
                        last = Some(table.clone());
                        if r.tx.send(table).await.is_err() {
                            return;
                        }
                        line.log("change", Some(took));
                    }
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "reading the service table; keeping the last one, retrying in {RETRY:?}");
                    safety = tokio::time::Instant::now() + RETRY;
                    read_whole = true;
                }
                Err(e) => {
                    warn!(error = %e, "the service table reader failed; keeping the last one");
                    safety = tokio::time::Instant::now() + RETRY;
                    read_whole = true;
                }
            }
            continue;
        }
        let mut wake = pacer
            .due(whole)
            .map(|d| tokio::time::Instant::from_std(d).min(safety))
            .unwrap_or(safety);
        if api_dirty && api_on {
            wake = wake.min(api_next);
        }
        if api_on {
            whole_unless_api = None;
        }
        if let Some(at) = whole_unless_api {
            if tokio::time::Instant::now() >= at {
                whole_unless_api = None;
                if last.as_ref().is_some_and(|t| t.services.is_empty()) {
                    warn!(
                        "the API's lists are not complete after {API_WAIT:?}: reading kube-proxy's rules whole meanwhile"
                    );
                    read_whole = true;
                    pacer.signal(Instant::now());
                    continue;
                }
            } else {
                wake = wake.min(at);
            }
        }
        tokio::select! {
            changed = async {
                match &mut commits {
                    Some(feed) => feed.count.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if changed.is_err() {
                    commits = None;
                } else {
                    pacer.signal(Instant::now());
                }
            }
            // The API's table changed (true), or its lists' state (false).
            event = async {
                match &mut api {
                    Some(feed) if api_on => feed.table.changed.changed().await.map(|_| true),
                    Some(feed) => tokio::select! {
                        r = feed.table.changed.changed() => r.map(|_| true),
                        r = feed.index.changed() => r.map(|_| false),
                    },
                    None => std::future::pending().await,
                }
            } => {
                match event {
                    // The watcher ended: the last table stays.
                    Err(_) => api = None,
                    Ok(table_changed) => api_dirty |= table_changed,
                }
            }
            _ = poll_tick.tick() => {
                let ipvs = ipvs_mode;
                let now = tokio::task::spawn_blocking(move || poll(ipvs)).await.unwrap_or_default();
                if now != polled {
                    polled = now;
                    pacer.signal(Instant::now());
                }
            }
            _ = tokio::time::sleep_until(wake) => {
                if tokio::time::Instant::now() >= safety {
                    pacer.signal(Instant::now());
                    read_whole = true;
                    safety = tokio::time::Instant::now() + r.every;
                }
            }
        }
    }
}

/// Makes the table from the API and sends it when it differs from the last; false when the
/// correlation loop is gone.
async fn send_from_api(
    feed: &ApiFeed,
    mode: ServiceSource,
    facts: &Arc<ServiceTable>,
    last: &mut Option<Arc<ServiceTable>>,
    tx: &mpsc::Sender<Arc<ServiceTable>>,
    why: &str,
) -> bool {
    let started = Instant::now();
    let Some(table) = feed.compose(mode, facts, last.clone()).await else {
        return true;
    };
    let line = TableLine::of(&table);
    // The last table is dropped before the next is sent: two copies at most (this one and the
    // correlator's until it takes it), never three.
    *last = Some(table.clone());
    if tx.send(table).await.is_err() {
        return false;
    }
    info!(
        source = ?line.source,
        services = line.services,
        nodeports = line.nodeports,
        made_ms = started.elapsed().as_millis() as u64,
        "service table from the API ({why})"
    );
    true
}

/// One INFO line per new table: what a change did, visible on any node. Logged only once the
/// table is handed to the correlator, so the line means "the correlator has (or is about to
/// take) this table" — tests and operators may act on it.
struct TableLine {
    source: Option<state::ServiceSource>,
    services: usize,
    nodeports: usize,
}

impl TableLine {
    fn of(table: &ServiceTable) -> TableLine {
        TableLine {
            source: table.source,
            services: table.services.len(),
            nodeports: table.nodeports.len(),
        }
    }

    fn log(&self, why: &str, took: Option<Duration>) {
        info!(
            source = ?self.source,
            services = self.services,
            nodeports = self.nodeports,
            read_ms = took.map(|d| d.as_millis() as u64),
            "service table read ({why})"
        );
    }
}

/// The table for the correlator at start: in timer mode the first read, awaited (the old
/// behaviour); in change mode nothing yet (the refresher sends it when it lands).
pub async fn initial(mode: ReaderMode, mut first: Pending) -> (ServiceTable, Pending) {
    match (mode, first.read.take()) {
        (ReaderMode::Timer, Some(read)) => {
            let table = match read.await {
                Ok(Ok(table)) => table,
                Ok(Err(e)) => {
                    warn!(error = %e, "reading the service table");
                    ServiceTable::default()
                }
                Err(e) => {
                    warn!(error = %e, "the service table reader failed");
                    ServiceTable::default()
                }
            };
            (table, first)
        }
        (_, read) => {
            first.read = read;
            (ServiceTable::default(), first)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_signals_is_one_read_and_reads_are_a_gap_apart() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        assert_eq!(p.due(true), None);
        // The first signal (start) is due at once.
        p.signal(t0);
        assert_eq!(p.due(true), Some(t0));
        p.started(t0, true);
        assert_eq!(p.due(true), None);
        // A burst during the next 100 ms: one read, MIN_GAP after the last start.
        for ms in [10, 50, 100] {
            p.signal(t0 + Duration::from_millis(ms));
        }
        assert_eq!(p.due(true), Some(t0 + MIN_GAP));
        p.started(t0 + MIN_GAP, true);
        // Long after: due SETTLE after the signal.
        let later = t0 + Duration::from_secs(10);
        p.signal(later);
        p.signal(later + Duration::from_millis(150));
        assert_eq!(p.due(true), Some(later + SETTLE));
        // A read that took 1 s: the next one 20 s after its start, however soon it is asked.
        p.started(later + SETTLE, true);
        p.finished(Duration::from_secs(1), true);
        p.signal(later + Duration::from_secs(5));
        assert_eq!(
            p.due(true),
            Some(later + SETTLE + Duration::from_secs(READ_DUTY.into()))
        );
        // One that took 10 s: MAX_GAP, not 200 s.
        p.started(later + Duration::from_secs(30), true);
        p.finished(Duration::from_secs(10), true);
        p.signal(later + Duration::from_secs(41));
        assert_eq!(p.due(true), Some(later + Duration::from_secs(30) + MAX_GAP));
    }
}

#[test]
fn a_small_read_is_not_held_back_by_a_long_whole_one() {
    let t0 = Instant::now();
    let mut p = Pacer::default();
    // A full restore: a whole read of 1.6 s.
    p.signal(t0);
    p.started(t0, true);
    p.finished(Duration::from_millis(1600), true);
    // A Service added 2 s later names three chains: read once MIN_GAP and SETTLE allow,
    // not 30 s after the whole read.
    let added = t0 + Duration::from_secs(2);
    p.signal(added);
    assert_eq!(p.due(false), Some(added + SETTLE));
    // Another full restore then waits for the whole read's duty gap.
    assert_eq!(p.due(true), Some(t0 + MAX_GAP));
    p.started(added + SETTLE, false);
    p.finished(Duration::from_millis(100), false);
    // Small reads of 0.1 s each: 2 s apart (20 x 0.1 s), at least MIN_GAP.
    let next = added + Duration::from_secs(1);
    p.signal(next);
    assert_eq!(
        p.due(false),
        Some(added + SETTLE + Duration::from_millis(100) * READ_DUTY)
    );
}
