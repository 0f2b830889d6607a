//! `probe agent`: wires kernel -> events -> correlation -> sinks.
//!
//! Tasks: the ring-buffer reader (kernel events onto a bounded queue), the node sync (addresses
//! and attachments), the service-table refresher, and the correlation loop, which is the only
//! owner of the [`Correlator`] and answers its queries (egress map, conntrack).

pub mod checks;
pub mod instance;
pub mod nodesync;
pub mod services;
pub mod startup;

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use anyhow::Context as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{broadcast, mpsc, watch},
};
use tracing::{debug, info, warn};

use crate::{
    correlate::{Answer, Correlator, CorrelatorConfig, Output, Query},
    event::KernelEvent,
    hub::{
        self, Shared,
        capability::{Capabilities, Capability},
    },
    kernel::{
        self, KernelBtf, Probe, ProbeSettings,
        counters::EgressTable,
        reader::{self, Decoder, IfNames, ReaderStats},
    },
    sink::{Sinks, json::JsonLines},
    state::{self, addrs::AddrConfig},
};
use nodesync::{NodeStatus, NodeSync};

/// Everything `probe agent` was told.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub addr: AddrConfig,
    /// `--events`: where confirmed events go as JSON lines (`-` = stdout).
    pub events: Option<PathBuf>,
    /// `--record`: every kernel event as JSON lines, for replaying through the correlator.
    pub record: Option<PathBuf>,
    pub ebpf_log: bool,
    /// `--tc-mode`: None = by kernel version.
    pub tc_mode: Option<kernel::probe::TcMode>,
    /// The service table's safety-net re-read interval (it is read on change).
    pub services_every: Duration,
    /// `--services-reader`: on change (default) or the old timer (the bench's baseline).
    pub services_reader: services::ReaderMode,
    /// `--metrics-addr`: Prometheus `/metrics`, `/healthz`, `/readyz`.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `--socket`: the live-view socket `probe watch` and `probe events` connect to.
    pub socket: Option<PathBuf>,
    /// `--egress-flows`, `--address-entries`, ...: the kernel maps' capacities.
    pub map_sizes: kernel::sizing::MapSizes,
    /// Kubernetes attribution: where the API is (None: off).
    pub kube: Option<crate::kube::KubeSource>,
    /// `--node-name`: this node's Kubernetes name (events' `node`, the pod watch's selector).
    pub node_name: Option<String>,
    /// `--kube-events`: where to write Kubernetes Events (None: off, or no API access).
    pub kube_events: Option<crate::kube::KubeSource>,
    /// `--provider`: the provider profile of the events' fixes (None: from each Service).
    pub provider: Option<crate::fixes::Provider>,
    /// `--node-report`: where to write this node's `LoopbackReport` (None: off, or no API
    /// access).
    pub node_report: Option<crate::kube::KubeSource>,
    /// `--node-condition`: the Node condition `LoadBalancerLoopback` (with the node report).
    pub node_condition: bool,
}

/// Runs until SIGINT, SIGTERM, SIGHUP or SIGQUIT. Every exit path detaches: the probe is owned by the node-sync
/// task, which detaches before it returns, and by Drop if anything unwinds.
pub async fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    let mut steps = startup::StartupSteps::default();
    // Signals first: a SIGTERM that lands while we load and attach must still end in an
    // orderly detach, not the default action.
    // SIGHUP and SIGQUIT too: their default actions (exit, core dump) would leave cls_bpf
    // filters attached and the socket file behind.
    let signals = Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
        hup: signal(SignalKind::hangup())?,
        quit: signal(SignalKind::quit())?,
    };
    kernel::check_kernel_version()?;
    kernel::check_capabilities()?;
    // Held until run() returns, after everything is detached.
    let _instance = AbortOnDrop(tokio::spawn(
        instance::InstanceLock::acquire(u64::from(kernel::current_netns_inode()))?.serve(),
    ));
    steps.mark("checks");
    // Off the path to ready, in parallel with BTF parsing and program loading (both CPU-bound
    // on this thread): the symbol table, awaited when the reader starts, and the service
    // table, awaited before ready (it shells out to iptables-save/nft on some nodes).
    let kallsyms_thread = std::thread::Builder::new()
        .name("kallsyms".into())
        .spawn(kernel::kallsyms::Kallsyms::load)
        .context("starting the kallsyms reader")?;
    state::set_reuse_parses(cfg.services_reader == services::ReaderMode::Change);
    let services_read = services::start_first_read();
    let aya_btf = std::thread::Builder::new()
        .name("btf".into())
        .spawn(kernel::probe::parse_btf_for_aya)
        .context("starting the BTF reader")?;
    let kbtf = KernelBtf::load()?;
    steps.mark("kernel-btf");
    let (rt_conn, rt_handle, _) =
        rtnetlink::new_connection().context("opening an rtnetlink socket")?;
    tokio::spawn(rt_conn);

    // Fail on a mistyped interface before anything is loaded or attached.
    let node = state::addrs::read(&rt_handle)
        .await
        .context("reading interfaces over rtnetlink")?;
    for nic in &cfg.addr.nics {
        if !node.links.iter().any(|l| &l.name == nic) {
            return Err(kernel::KernelError::UnknownInterface { name: nic.clone() }.into());
        }
    }
    let sets = state::addrs::classify(&node, &cfg.addr);
    if sets.nics.is_empty() {
        anyhow::bail!(
            "no NIC to watch: no physical interface and none with a default route in any routing table here; name one with --nic"
        );
    }
    for warning in checks::pod_cidr_warnings(&cfg.addr.pod_cidrs, &node, &sets.nics) {
        warn!("{warning}");
    }
    // Bind the surfaces before touching the kernel: a port in use fails with nothing attached.
    let metrics_listener = match cfg.metrics_addr {
        Some(addr) => Some(std::net::TcpListener::bind(addr).with_context(|| {
            format!(
                "--metrics-addr {addr}: cannot listen (in use, or not an address of this namespace)"
            )
        })?),
        None => None,
    };
    let (live_listener, socket_file) = match &cfg.socket {
        Some(path) => {
            let (listener, file) = crate::sink::live::bind(path)?;
            (Some(listener), Some(file))
        }
        None => (None, None),
    };
    // Outputs too: a path that cannot be written fails here, with nothing attached.
    let mut sinks = Sinks::default();
    if let Some(path) = &cfg.events {
        sinks.json = Some(
            JsonLines::open(path, "events", crate::sink::json::EVENTS_QUEUE_LINES)
                .context("--events")?,
        );
    }
    if let Some(path) = &cfg.record {
        sinks.record = Some(
            JsonLines::open(path, "record", crate::sink::json::RECORD_QUEUE_LINES)
                .context("--record")?,
        );
    }

    // The Kubernetes client before anything is attached: a broken kubeconfig fails here.
    let kube_status = Arc::new(crate::kube::KubeStatus::default());
    let (kube_index, _kube_task) = match &cfg.kube {
        Some(source) => {
            let client = crate::kube::connect_watched(source, &kube_status).await?;
            let (index, task) =
                crate::kube::watcher::spawn(client, cfg.node_name.clone(), kube_status.clone());
            (Some(index), Some(AbortOnDrop(task)))
        }
        None => {
            info!(
                "Kubernetes attribution off (no --kubeconfig, no in-cluster service account, or --kube-attribution off): events name addresses only"
            );
            (None, None)
        }
    };

    let mut settings = ProbeSettings {
        config: probe_common::ProbeConfig::default(),
        ebpf_log: cfg.ebpf_log,
        tc_mode: cfg.tc_mode,
        sizes: cfg.map_sizes,
    };
    settings.config.netns_ino = kernel::current_netns_inode();
    settings.config.reason_consumed = kbtf.drop_reasons.code("SKB_CONSUMED").unwrap_or(u32::MAX);
    steps.mark("interfaces");
    let aya_btf = aya_btf.join().unwrap_or_else(|_| {
        Err(kernel::KernelError::Btf {
            what: "parsing /sys/kernel/btf/vmlinux for aya".into(),
            source: "the parsing thread panicked".into(),
        })
    });
    steps.mark("btf-wait");
    let loaded = Probe::load_with_btf(&settings, &kbtf, aya_btf)?;
    steps.mark("load");
    info!(features = %loaded.probe.features(), "programs loaded");
    let capabilities = Arc::new(Capabilities::default());
    if loaded.probe.features().drop_hook == kernel::probe::DropHook::None {
        capabilities.set(
            Capability::DropHook,
            false,
            "tp_btf and raw tracepoint refused",
        );
    }

    let ifnames: IfNames = Arc::new(RwLock::new(Default::default()));
    let (status_tx, status_rx) = watch::channel(NodeStatus::default());
    let mut sync = NodeSync::new(
        loaded.probe,
        loaded.addresses,
        cfg.addr.clone(),
        cfg.map_sizes.addresses,
        ifnames.clone(),
        status_tx,
    );
    let sets = sync.sync(&rt_handle).await?;
    steps.mark("attach");
    // Not waited for (the table fills in behind; see services.rs), except by the timer baseline.
    let (services, services_first) = services::initial(cfg.services_reader, services_read).await;
    steps.mark("services");
    info!(
        nics = ?sets.nics,
        vip_iface = ?sets.vip_iface,
        prefixes = sets.prefixes.len(),
        "attached and address sets loaded"
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let sync_task = tokio::spawn(sync.run(rt_handle.clone(), stop_rx.clone()));

    let (ev_tx, ev_rx) = mpsc::channel::<KernelEvent>(4096);
    let reader_stats = Arc::new(ReaderStats::default());
    let kallsyms = kallsyms_thread.join().unwrap_or_default();
    if kallsyms.is_empty() {
        let restrict = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict")
            .map(|s| format!("kernel.kptr_restrict={}", s.trim()))
            .unwrap_or_else(|e| format!("kptr_restrict unreadable: {e}"));
        capabilities.set(Capability::DropSites, false, &restrict);
    }
    steps.mark("kallsyms");
    let decoder = Decoder {
        reasons: kbtf.drop_reasons.clone(),
        kallsyms,
        ifnames: ifnames.clone(),
    };
    if let Some(logger) = loaded.logger {
        tokio::spawn(kernel::probe::run_logger(logger));
    }
    let reader_task = tokio::spawn(reader::run(
        loaded.ring,
        decoder,
        ev_tx,
        reader_stats.clone(),
    ));

    let shared = Shared {
        status: status_rx,
        counters: Arc::new(loaded.counters),
        reader: reader_stats,
        drop_reasons: Arc::new(kbtf.drop_reasons.clone()),
        reports: broadcast::channel(1024).0,
        confirmed: Default::default(),
        correlator: Default::default(),
        capabilities,
        kube: kube_status,
        version: env!("CARGO_PKG_VERSION"),
        kube_events: Default::default(),
        outputs: Arc::new(
            [("events", &sinks.json), ("record", &sinks.record)]
                .into_iter()
                .filter_map(|(name, out)| Some((name, out.as_ref()?.stats())))
                .collect(),
        ),
    };
    // Subscribed before the first report; the writer runs beside the loop, never in it.
    let _kube_events_task = match &cfg.kube_events {
        Some(source) => Some(AbortOnDrop(tokio::spawn(crate::sink::kube_events::start(
            source.clone(),
            cfg.node_name.clone().unwrap_or_else(hub::node_name),
            shared.subscribe(),
            shared.kube_events.clone(),
        )))),
        None => {
            info!(
                "Kubernetes Events off (--kube-events off, or no --kubeconfig / in-cluster service account)"
            );
            None
        }
    };
    // The node report: subscribed before the first report, beside the loop like the Events.
    let _node_report_task = match &cfg.node_report {
        Some(source) => {
            let node = cfg.node_name.clone().unwrap_or_else(hub::node_name);
            let checks = crate::report::writer::spawn_checks(cfg.addr.clone(), kube_index.clone());
            Some(AbortOnDrop(tokio::spawn(crate::report::writer::start(
                source.clone(),
                cfg.node_condition,
                crate::report::writer::NodeFacts::of_this_node(&node),
                shared.capabilities.clone(),
                shared.subscribe(),
                checks,
            ))))
        }
        None => None,
    };
    let metrics_task = metrics_listener.map(|listener| {
        info!(addr = ?listener.local_addr().ok(), "serving /metrics, /healthz, /readyz");
        let mut stop = stop_rx.clone();
        tokio::spawn(crate::sink::metrics::serve(
            listener,
            shared.clone(),
            async move {
                let _ = stop.wait_for(|stop| *stop).await;
            },
        ))
    });
    steps.mark("serve");
    info!("{}", steps.line());
    // Parsing BTF twice and loading the object peak at several times the steady heap; glibc
    // keeps what was freed below the top of its heaps until asked. Once, after startup.
    // SAFETY: malloc_trim only releases free memory back to the kernel.
    unsafe { libc::malloc_trim(0) };
    let live_task = live_listener.map(|listener| {
        let shared = shared.clone();
        AbortOnDrop(tokio::spawn(async move {
            let _ = crate::sink::live::serve(listener, shared).await;
        }))
    });

    let result = correlate_loop(CorrelateLoop {
        events: ev_rx,
        egress: loaded.egress,
        ifnames,
        sinks,
        shared,
        services_every: cfg.services_every,
        services_reader: cfg.services_reader,
        services_first,
        services,
        signals,
        kube_index,
        node_name: cfg.node_name.clone(),
        provider: cfg.provider,
        vip_iface: cfg.addr.vip_iface.clone(),
    })
    .await;
    // Orderly shutdown: stop the surfaces and the sync task (it detaches), then the reader.
    let _ = stop_tx.send(true);
    drop(live_task);
    if let Some(task) = metrics_task
        && tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .is_err()
    {
        warn!("the metrics server did not stop in 1 s");
    }
    if let Some(file) = socket_file {
        file.remove();
    }
    match tokio::time::timeout(Duration::from_secs(5), sync_task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "node sync ended with an error"),
        Ok(Err(e)) => warn!(error = %e, "node sync task failed"),
        Err(_) => warn!("node sync did not stop in 5 s"),
    }
    reader_task.abort();
    result
}

struct CorrelateLoop {
    events: mpsc::Receiver<KernelEvent>,
    egress: EgressTable,
    ifnames: IfNames,
    sinks: Sinks,
    shared: Shared,
    services_every: Duration,
    services_reader: services::ReaderMode,
    services_first: Option<tokio::task::JoinHandle<anyhow::Result<state::ServiceTable>>>,
    services: state::ServiceTable,
    signals: Signals,
    /// Kubernetes attribution's latest index (None: attribution off).
    kube_index: Option<watch::Receiver<Arc<crate::kube::index::Index>>>,
    node_name: Option<String>,
    provider: Option<crate::fixes::Provider>,
    /// `--vip-iface`: the owner the events name for a VIP bound there.
    vip_iface: String,
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

async fn correlate_loop(mut l: CorrelateLoop) -> anyhow::Result<()> {
    let mut correlator = Correlator::new(CorrelatorConfig {
        vip_iface: l.vip_iface.clone(),
        ..CorrelatorConfig::default()
    });
    correlator.set_services(std::mem::take(&mut l.services));
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    // The service table is re-read off this loop: iptables-save and the IPVS dump can take a
    // second on a busy node, and events must not wait behind them (the egress map moves on).
    let (services_tx, mut services_rx) = mpsc::channel::<state::ServiceTable>(1);
    let _services_task = AbortOnDrop(tokio::spawn(
        services::Refresher {
            mode: l.services_reader,
            every: l.services_every,
            first: l.services_first.take(),
            tx: services_tx,
        }
        .run(),
    ));
    let (answer_tx, mut answer_rx) = mpsc::channel::<Answer>(1024);
    // Confirmed reports waiting (at most 2 s) for the API cache to name them.
    let mut hold = crate::kube::hold::Hold::default();
    loop {
        let waiting = !hold.is_empty();
        let deadline = hold
            .next_deadline()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(tokio::time::Instant::now);
        let outputs = tokio::select! {
            ev = l.events.recv() => {
                let Some(ev) = ev else { anyhow::bail!("the kernel event reader stopped") };
                l.sinks.record(&ev);
                correlator.ingest(ev)
            }
            Some(answer) = answer_rx.recv() => correlator.answer(answer),
            _ = tick.tick() => {
                if let Ok(mut stats) = l.shared.correlator.lock() {
                    stats.clone_from(correlator.stats());
                }
                correlator.set_nics(l.shared.status.borrow().nics.clone());
                correlator.tick(monotonic_ns())
            }
            Some(table) = services_rx.recv() => {
                correlator.set_services(table);
                Vec::new()
            }
            _ = index_changed(&mut l.kube_index), if waiting => {
                release(&mut hold, &mut l, std::time::Instant::now());
                Vec::new()
            }
            _ = tokio::time::sleep_until(deadline), if waiting => {
                release(&mut hold, &mut l, std::time::Instant::now());
                Vec::new()
            }
            _ = l.signals.term.recv() => {
                info!("SIGTERM: shutting down");
                // Held reports go out as they are.
                release(&mut hold, &mut l, std::time::Instant::now() + crate::kube::hold::HOLD_MAX);
                return Ok(());
            }
            _ = l.signals.int.recv() => {
                info!("SIGINT: shutting down");
                // Held reports go out as they are.
                release(&mut hold, &mut l, std::time::Instant::now() + crate::kube::hold::HOLD_MAX);
                return Ok(());
            }
            _ = l.signals.hup.recv() => {
                info!("SIGHUP: shutting down");
                // Held reports go out as they are.
                release(&mut hold, &mut l, std::time::Instant::now() + crate::kube::hold::HOLD_MAX);
                return Ok(());
            }
            _ = l.signals.quit.recv() => {
                info!("SIGQUIT: shutting down");
                // Held reports go out as they are.
                release(&mut hold, &mut l, std::time::Instant::now() + crate::kube::hold::HOLD_MAX);
                return Ok(());
            }
        };
        for out in outputs {
            match out {
                Output::Report(report) => match &l.kube_index {
                    // Attribution on: the report goes when the cache can name it (or in 2 s).
                    Some(rx) => {
                        let index = rx.borrow().clone();
                        let now = std::time::Instant::now();
                        let (kind, key) = (report.event.kind, report.event.key.clone());
                        match hold.offer(report, &index, l.node_name.as_deref(), now) {
                            Some(report) => emit(&mut l, report),
                            None => debug!(
                                kind = kind.as_str(),
                                %key,
                                synced = index.synced,
                                "confirmed; held (at most 2 s) until the Kubernetes API cache names it"
                            ),
                        }
                    }
                    None => {
                        let mut report = report;
                        attribute(&mut report, None, l.node_name.as_deref());
                        emit(&mut l, report);
                    }
                },
                Output::Query(query) => answer_query(
                    query,
                    &l.egress,
                    &l.ifnames,
                    &l.shared.capabilities,
                    &answer_tx,
                ),
            }
        }
    }
}

/// A confirmed report to the sinks and the live view.
fn emit(l: &mut CorrelateLoop, mut report: crate::correlate::Report) {
    // The fixes come last: they read the names and facts attribution added.
    let index = l
        .kube_index
        .as_ref()
        .map(|rx| rx.borrow().clone())
        .unwrap_or_default();
    crate::fixes::attach(&mut report.event, &index, l.provider);
    l.sinks.report(&report);
    l.shared.publish(report);
}

/// Sends the held reports that can go now.
fn release(hold: &mut crate::kube::hold::Hold, l: &mut CorrelateLoop, now: std::time::Instant) {
    let Some(rx) = &l.kube_index else { return };
    let index = rx.borrow().clone();
    for report in hold.release(&index, l.node_name.as_deref(), now) {
        emit(l, report);
    }
}

/// Resolves when attribution publishes a new index (never when it is off or gone).
async fn index_changed(rx: &mut Option<watch::Receiver<Arc<crate::kube::index::Index>>>) {
    if let Some(rx) = rx
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Names the report's pod, Service and node (the enrichment after the pure correlator).
fn attribute(
    report: &mut crate::correlate::Report,
    index: Option<&watch::Receiver<Arc<crate::kube::index::Index>>>,
    node: Option<&str>,
) {
    let index = index.map(|rx| rx.borrow().clone()).unwrap_or_default();
    crate::kube::enrich::enrich(&mut report.event, &index, node);
}

/// Aborts a background task when the loop that owns it returns, however it returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Answers a correlator query: the egress map synchronously (a bounded map read), conntrack
/// on the blocking pool (a netlink round trip). A failed conntrack look-up is answered as a
/// failure (not as "no entry") and flips the conntrack capability (one WARN).
fn answer_query(
    query: Query,
    egress: &EgressTable,
    ifnames: &IfNames,
    caps: &Arc<Capabilities>,
    tx: &mpsc::Sender<Answer>,
) {
    match query {
        Query::Egress { id, src, keys } => {
            let keys = keys.iter().map(|k| (k.sport, k.proto));
            let records = egress.by_source_and_keys(src, keys, |i| reader::ifname(ifnames, i));
            debug!(%src, records = records.len(), "egress records of a pod suspect");
            let _ = tx.try_send(Answer::Egress { id, records });
        }
        Query::Conntrack { id, tuple } => {
            let tx = tx.clone();
            let caps = caps.clone();
            tokio::task::spawn_blocking(move || {
                let answer = match lookup_conntrack(&tuple) {
                    Ok(entry) => {
                        caps.set(Capability::Conntrack, true, "");
                        Answer::Conntrack { id, entry }
                    }
                    Err(error) => {
                        debug!(%error, "conntrack lookup");
                        caps.set(Capability::Conntrack, false, &error);
                        Answer::ConntrackFailed { id, error }
                    }
                };
                let _ = tx.blocking_send(answer);
            });
        }
    }
}

/// Environment hook for tests: conntrack look-ups fail with this error instead of running
/// (a conntrack failure cannot be provoked reliably in a lab namespace).
pub const CONNTRACK_FAIL_ENV: &str = "CLB_PROBE_TEST_CONNTRACK_ERROR";

/// One conntrack look-up; errors as text (the correlator only reports them).
fn lookup_conntrack(tuple: &state::Tuple) -> Result<Option<state::ConntrackEntry>, String> {
    if let Some(injected) = std::env::var_os(CONNTRACK_FAIL_ENV) {
        return Err(injected.to_string_lossy().into_owned());
    }
    state::conntrack::lookup(tuple).map_err(|e| e.to_string())
}

/// Defined with the events whose clock it is (the sinks read it too, below the agent).
pub use crate::event::monotonic_ns;
