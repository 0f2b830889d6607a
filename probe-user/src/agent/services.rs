//! The service-table refresher: reads the table on change, not on a timer.
//!
//! What wakes it ([`crate::state::changes`]): an nf_tables commit (iptables-nft, nft, kube-proxy
//! in nftables mode); in IPVS mode without the API's table a change of the virtual services'
//! digest (polled at most every [`POLL`] and at least [`READ_DUTY`] times its own duration
//! apart, [`DigestPacer`]; with the API's table not at all: the API says what is served, and a
//! question about one VIP:port asks the kernel for that virtual service alone); with legacy
//! tables loaded a change of their entry counts and sizes (polled every [`POLL`], each one
//! `getsockopt`, no process); and `--services-every`, now a safety net for
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

// The pacing rules, named here as the module docs name them; the decisions are
// `refresh_policy`'s.
pub use super::refresh_policy::{
    API_DUTY, API_EVERY, API_WAIT, MAX_GAP, MIN_GAP, READ_DUTY, RETRY, SETTLE,
};
use super::refresh_policy::{Action, DigestPacer, RefreshPolicy, Seen, Signal};
use crate::{
    kube::{index::Index, service_table::NodeView, watcher::SharedApiTable},
    state::{self, ServiceSource, ServiceTable, addrs::Owners, changes},
};

/// The interval of the cheap IPVS and legacy change tests.
pub const POLL: Duration = Duration::from_secs(1);

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
            // kube-proxy's firewall as programmed: only the rules say what it drops.
            table.firewall = facts.firewall.clone();
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
        no_endpoint_rejects: read.no_endpoint_rejects.clone(),
        pod_short_circuits: read.pod_short_circuits.clone(),
        firewall: read.firewall.clone(),
        // The API's alone (the rules do not name them).
        health_checks: Vec::new(),
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

/// The change tests now; the IPVS one only with `ipvs` (else its last answer is kept), with
/// how long it took, for [`DigestPacer`].
fn poll(ipvs: bool, last: Polled) -> (Polled, Option<Duration>) {
    let started = Instant::now();
    let digest = ipvs.then(|| state::ipvs::services_digest().ok().flatten());
    let took = digest.is_some().then(|| started.elapsed());
    let polled = Polled {
        ipvs: digest.unwrap_or(last.ipvs),
        legacy: changes::legacy_fingerprint(),
    };
    (polled, took)
}

/// The change-mode refresher's state: what it read and what it follows. When to do what is
/// [`RefreshPolicy`]'s to say.
struct OnChange {
    policy: RefreshPolicy,
    commits: Option<CommitFeed>,
    api: Option<ApiFeed>,
    first: Option<JoinHandle<anyhow::Result<ServiceTable>>>,
    tx: mpsc::Sender<Arc<ServiceTable>>,
    last: Option<Arc<ServiceTable>>,
    poll_tick: tokio::time::Interval,
    polled: Polled,
    ipvs_mode: bool,
    /// Paces the IPVS change test without the API (with it the test is not run).
    ipvs_pacer: DigestPacer,
    /// kube-proxy's mode, from the last whole dataplane read (the API cannot say it).
    mode: Option<ServiceSource>,
    /// The dataplane's part of the API's table (see the module docs).
    facts: Arc<ServiceTable>,
}

async fn on_change(r: Refresher) {
    let mut poll_tick = tokio::time::interval(POLL);
    poll_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut s = OnChange {
        policy: RefreshPolicy::new(Instant::now(), r.every, r.api.is_some()),
        commits: r.first.commits,
        api: r.api,
        first: r.first.read,
        tx: r.tx,
        last: None,
        poll_tick,
        polled: Polled::default(),
        ipvs_pacer: DigestPacer::default(),
        ipvs_mode: false,
        mode: None,
        facts: Arc::new(ServiceTable::default()),
    };
    loop {
        let going_on = match s.policy.next(s.seen(), Instant::now()) {
            Action::ApiOn => {
                s.api_on();
                true
            }
            Action::MakeFromApi => s.make_from_api().await,
            Action::Read { whole, everything } => s.read(whole, everything).await,
            Action::ApiLate => {
                warn!(
                    "the API's lists are not complete after {API_WAIT:?}: reading kube-proxy's rules whole meanwhile"
                );
                true
            }
            Action::Wait { until } => {
                s.wait(until).await;
                true
            }
        };
        if !going_on {
            return;
        }
    }
}

impl OnChange {
    fn seen(&self) -> Seen {
        Seen {
            api_ready: self.api.as_ref().is_some_and(ApiFeed::synced)
                && self.mode.is_some()
                && self.last.is_some(),
            touched_whole: self.first.is_some()
                || self.commits.as_ref().is_none_or(CommitFeed::reads_whole),
            no_services: self.last.as_ref().is_some_and(|t| t.services.is_empty()),
        }
    }

    /// The API's lists are complete and the rules said the mode: its table from now on, with
    /// the last whole read's masquerade rules and NodePorts as the dataplane's part.
    fn api_on(&mut self) {
        let (Some(mode), Some(read)) = (self.mode, &self.last) else {
            return;
        };
        self.ipvs_mode = false;
        self.facts = facts_of(read);
        info!(
            ?mode,
            "service table: from the API from now on; the rules are read only for masquerade, NodePorts and per question"
        );
        // The whole nat table held for chain re-reads is not needed now.
        tokio::task::spawn_blocking(state::iptables::release_held);
    }

    /// The API's table changed: a new one, when it differs; false when the correlation loop
    /// is gone.
    async fn make_from_api(&mut self) -> bool {
        let started = Instant::now();
        if let (Some(feed), Some(m)) = (&self.api, self.mode)
            && !send_from_api(feed, m, &self.facts, &mut self.last, &self.tx, "API change").await
        {
            return false;
        }
        let took = started.elapsed();
        self.policy
            .step(Signal::MadeFromApi { started, took }, Instant::now());
        true
    }

    /// One read of the dataplane (the first, or the one now due); false when the correlation
    /// loop is gone.
    async fn read(&mut self, whole: bool, everything: bool) -> bool {
        if let Some(feed) = &mut self.commits {
            feed.count.borrow_and_update();
        }
        // The first read began with the agent: what was touched since is left for the next.
        let mut touched = match (&self.commits, self.first.is_some()) {
            (_, true) => changes::Touched::everything(),
            (Some(feed), false) => feed.take(),
            (None, false) => changes::Touched::everything(),
        };
        if everything {
            touched = changes::Touched::everything();
        }
        let api_on = self.policy.api_on();
        tracing::debug!(
            whole,
            api_on,
            everything = touched.is_everything(),
            named = touched.named(),
            "service table read starts"
        );
        // The change tests' state before the read: a change during it is seen next poll.
        let before = self.poll(self.polls_ipvs()).await;
        let started = Instant::now();
        let facts_mode = self.mode.filter(|_| api_on);
        let read = match self.first.take() {
            Some(handle) => {
                let read = handle.await;
                if self.commits.as_ref().is_some_and(|f| !f.is_empty()) {
                    self.policy.step(Signal::Changed, Instant::now());
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
        let ok = matches!(read, Ok(Ok(_)));
        self.policy
            .step(Signal::ReadDone { took, whole, ok }, Instant::now());
        match read {
            Ok(Ok(table)) => self.took_in(table, facts_mode, before, took).await,
            Ok(Err(e)) => {
                warn!(error = %e, "reading the service table; keeping the last one, retrying in {RETRY:?}");
                true
            }
            Err(e) => {
                warn!(error = %e, "the service table reader failed; keeping the last one");
                true
            }
        }
    }

    /// A read's table: the API's made again with its dataplane's part (`facts_mode`: the API's
    /// table is on), or itself sent; false when the correlation loop is gone.
    async fn took_in(
        &mut self,
        table: ServiceTable,
        facts_mode: Option<ServiceSource>,
        before: Polled,
        took: Duration,
    ) -> bool {
        if facts_mode.is_none() {
            self.mode = table.source;
        }
        self.polled = before;
        if let (Some(feed), Some(m)) = (&self.api, facts_mode) {
            let read = facts_of(&table);
            drop(table);
            // A commit that left the dataplane's part as it was (a kube-proxy sync rewriting a
            // Service's chains) makes no new table: making one is the API table's whole size
            // (130 ms at 30,000 Services).
            if read == self.facts {
                return true;
            }
            self.facts = read;
            return send_from_api(
                feed,
                m,
                &self.facts,
                &mut self.last,
                &self.tx,
                "rules changed",
            )
            .await;
        }
        self.ipvs_mode = table.source == Some(state::ServiceSource::Ipvs);
        if self.polls_ipvs() && self.polled.ipvs.is_none() {
            self.polled = self.poll(true).await;
        }
        if self.last.as_deref() != Some(&table) {
            let line = TableLine::of(&table);
            let table = Arc::new(table);
            self.last = Some(table.clone());
            if self.tx.send(table).await.is_err() {
                return false;
            }
            line.log("change", Some(took));
        }
        true
    }

    /// Whether the IPVS change test runs: in IPVS mode without the API's table. With it the
    /// virtual services are the API's Services, and a question about one is asked of the
    /// kernel alone (`dataplane::programmed`): a dump of 10,000 every second was half the VM
    /// tier's core with nothing changing (issue #52, BENCHMARKS 9d).
    fn polls_ipvs(&self) -> bool {
        self.ipvs_mode && !self.policy.api_on()
    }

    /// The change tests now (the IPVS one only with `ipvs`), its cost told to the pacer.
    async fn poll(&mut self, ipvs: bool) -> Polled {
        let last = self.polled;
        let started = Instant::now();
        let (now, took) = tokio::task::spawn_blocking(move || poll(ipvs, last))
            .await
            .unwrap_or((last, None));
        if let Some(took) = took {
            self.ipvs_pacer.ran(started, took);
        }
        now
    }

    /// Waits until `until` or the next commit, API change or polled test, and tells the policy.
    async fn wait(&mut self, until: Instant) {
        let OnChange {
            policy,
            commits,
            api,
            poll_tick,
            ..
        } = self;
        let api_on = policy.api_on();
        let woken = tokio::select! {
            changed = async {
                match commits {
                    Some(feed) => feed.count.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if changed.is_err() {
                    *commits = None;
                    Woken::By(None)
                } else {
                    Woken::By(Some(Signal::Changed))
                }
            }
            // The API's table changed (true), or its lists' state (false).
            event = async {
                match api {
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
                    Err(_) => {
                        *api = None;
                        Woken::By(None)
                    }
                    Ok(table_changed) => Woken::By(table_changed.then_some(Signal::ApiChanged)),
                }
            }
            _ = poll_tick.tick() => Woken::PollTick,
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(until)) => Woken::By(Some(Signal::Woke)),
        };
        let signal = match woken {
            Woken::By(signal) => signal,
            // The polled tests run here, once the borrows the select took are over.
            Woken::PollTick => {
                let ipvs = self.polls_ipvs() && self.ipvs_pacer.due(Instant::now());
                let now = self.poll(ipvs).await;
                (now != self.polled).then(|| {
                    self.polled = now;
                    Signal::Changed
                })
            }
        };
        if let Some(signal) = signal {
            self.policy.step(signal, Instant::now());
        }
    }
}

/// What ended [`OnChange::wait`]'s select.
enum Woken {
    /// A signal for the policy (None: a feed ended, nothing to tell).
    By(Option<Signal>),
    /// Time for the polled change tests.
    PollTick,
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
