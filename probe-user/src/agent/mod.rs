//! `probe agent`: wires kernel -> events -> correlation -> sinks.
//!
//! Tasks: the ring-buffer reader (kernel events onto a bounded queue), the node sync (addresses
//! and attachments), the service-table refresher, and the correlation loop
//! ([`correlation`]), the only owner of the [`crate::correlate::Correlator`]; its queries are
//! answered beside it ([`queries`]). [`run`] starts them in an order where every failure that
//! user input can cause happens before anything is attached, and stops them in reverse.

pub mod checks;
mod correlation;
pub mod instance;
mod lookup_timers;
pub mod nodesync;
mod queries;
mod refresh_policy;
pub mod services;
pub mod startup;
pub mod verify;
mod verify_mark;

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use anyhow::Context as _;
use correlation::{CorrelateLoop, Signals};
use nodesync::NodeSync;
use probe_contract::NodeStatus;
pub use queries::CONNTRACK_FAIL_ENV;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::{
    hub::{
        self, Shared,
        capability::{Capabilities, Capability},
    },
    kernel::{
        self, KernelBtf, Probe, ProbeSettings,
        reader::{self, Decoder, IfNames, ReaderStats},
    },
    sink::json::JsonLines,
    state::{self, addrs::AddrConfig},
};

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
    pub tc_mode: Option<probe_contract::TcMode>,
    /// The service table's safety-net re-read interval (it is read on change).
    pub services_every: Duration,
    /// `--services-reader`: on change (default) or the old timer (the bench's baseline).
    pub services_reader: services::ReaderMode,
    /// `--service-table-from`: the API's Services (default) or the rules.
    pub service_table_from: services::TableFrom,
    /// `--resolve-after`: how long a loop stays unconfirmed, its traffic answered, before it
    /// is called resolved (`crate::resolution`).
    pub resolve_after: Duration,
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
    pub provider: Option<probe_core::fixes::Provider>,
    /// `--node-report`: where to write this node's `LoopbackReport` (None: off, or no API
    /// access).
    pub node_report: Option<crate::kube::KubeSource>,
    /// `--node-condition`: the Node condition `LoadBalancerLoopback` (with the node report).
    pub node_condition: bool,
    /// `--node-report-interval`: the least time between two writes of the node report.
    pub node_report_interval: Duration,
    /// `--otlp-endpoint`, `--otlp-interval`: OTLP export (None: off).
    pub otlp: Option<crate::sink::otlp::OtlpConfig>,
    /// `--capture-bytes`: bytes of each recorded packet the kernel copies (0: none).
    pub capture_bytes: u32,
    /// `--evidence`: what `GET /evidence` keeps and serves.
    pub evidence: crate::hub::evidence::EvidenceMode,
    /// `--evidence-token-file`: who may read `GET /evidence` (None: nobody, it is off).
    pub evidence_token_file: Option<PathBuf>,
    /// `--verify`: answer `LoopbackVerification` requests by testing (false: answer each
    /// `refused`). Needs API access (`kube`).
    pub verify: bool,
    /// `--canary-every`: the canary's period (None: off). Needs API access (`kube`).
    pub canary_every: Option<Duration>,
}

/// Runs until SIGINT, SIGTERM, SIGHUP or SIGQUIT. Every exit path detaches: the probe is owned
/// by the node-sync task, which detaches before it returns, and by Drop if anything unwinds.
/// The phases: the checks (everything user input can break), the kernel (load and attach),
/// the state readers, the hub, the writers and the surfaces; then the wait (the correlation
/// loop, until a signal); then the shutdown, in reverse.
pub async fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    let mut steps = startup::StartupSteps::default();
    // Signals first: a SIGTERM that lands while we load and attach must still end in an
    // orderly detach, not the default action.
    let signals = Signals::install()?;
    let Prepared {
        _instance,
        early,
        kbtf,
        rt_handle,
        mut surfaces,
        kube,
    } = prepare(&cfg, &mut steps).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let kernel = attach(
        &cfg,
        &kbtf,
        &rt_handle,
        early.services,
        &stop_rx,
        &mut steps,
    )
    .await?;
    let reader = StateReader::start(
        early.kallsyms,
        &kbtf,
        kernel.parts,
        &kernel.ifnames,
        &kernel.capabilities,
        &mut steps,
    );
    let shared = Shared::new(hub::HubInputs {
        status: kernel.status,
        counters: reader.counters,
        reader: reader.stats,
        drop_reasons: kbtf.drop_reasons.clone(),
        capabilities: kernel.capabilities,
        kube: kube.status.clone(),
        outputs: surfaces.output_stats(),
        otlp: surfaces.otlp_logs.as_ref().map(|o| o.stats()),
        evidence: cfg.evidence,
        node_name: cfg.node_name.clone(),
        stop: stop_rx.clone(),
    });
    // The correlator's latest service table, for readers beside it (the node report's checks).
    let (tables_tx, tables_rx) = watch::channel(None);
    let kallsyms_readable = reader.kallsyms_readable;
    let writers = Writers::start(
        &cfg,
        &shared,
        &mut surfaces,
        &kube,
        tables_rx,
        &kernel.owners,
        || crate::check::gather::kernel_view_of(Ok(&kbtf), kallsyms_readable),
    )
    .await;
    let serving = surfaces.serve(&shared, &stop_rx);
    steps.mark("serve");
    info!("{}", steps.line());
    // Parsing BTF twice and loading the object peak at several times the steady heap; glibc
    // keeps what was freed below the top of its heaps until asked. Once, after startup.
    // SAFETY: malloc_trim only releases free memory back to the kernel.
    unsafe { libc::malloc_trim(0) };

    let result = correlation::run(CorrelateLoop {
        events: reader.events,
        egress: reader.egress,
        drop_destinations: reader.drop_destinations,
        ifnames: kernel.ifnames,
        record: surfaces.record,
        shared,
        services_every: cfg.services_every,
        services_reader: cfg.services_reader,
        api_table: kube.api_table,
        services_first: kernel.services_first,
        services: kernel.services,
        signals,
        kube_index: kube.index,
        node_name: cfg.node_name.clone(),
        provider: cfg.provider,
        vip_iface: cfg.addr.vip_iface.clone(),
        owners: kernel.owners,
        tables: tables_tx,
        status: kernel.dataplane_status,
        tracker: crate::resolution::Tracker::new(crate::resolution::TrackerConfig {
            resolve_after_s: cfg.resolve_after.as_secs().max(1),
        }),
    })
    .await;
    shut_down(stop_tx, serving, kernel.sync_task).await;
    writers.drain().await;
    reader.task.abort();
    result
}

/// Everything that is ready before the kernel is touched: every failure that user input can
/// cause has happened here.
struct Prepared {
    /// Held until run() returns, after everything is detached.
    _instance: AbortOnDrop,
    early: EarlyReads,
    kbtf: KernelBtf,
    rt_handle: rtnetlink::Handle,
    surfaces: Surfaces,
    kube: Attribution,
}

/// The checks: the kernel and the capabilities, the one instance per namespace, the
/// interfaces, the surfaces' ports and paths, the API's configuration.
async fn prepare(cfg: &AgentConfig, steps: &mut startup::StartupSteps) -> anyhow::Result<Prepared> {
    kernel::check_kernel_version()?;
    kernel::check_capabilities()?;
    let instance = AbortOnDrop(tokio::spawn(
        instance::InstanceLock::acquire(u64::from(kernel::current_netns_inode()))?.serve(),
    ));
    steps.mark("checks");
    let early = EarlyReads::start(
        cfg.services_reader,
        cfg.kube.is_some() && cfg.service_table_from == services::TableFrom::Api,
    )?;
    let kbtf = KernelBtf::load()?;
    steps.mark("kernel-btf");
    let (rt_conn, rt_handle, _) =
        rtnetlink::new_connection().context("opening an rtnetlink socket")?;
    tokio::spawn(rt_conn);
    // Everything user input can break fails here, before anything is loaded or attached.
    check_interfaces(&rt_handle, &cfg.addr).await?;
    let surfaces = Surfaces::open(cfg)?;
    let kube = Attribution::connect(cfg).await?;
    steps.mark("interfaces");
    Ok(Prepared {
        _instance: instance,
        early,
        kbtf,
        rt_handle,
        surfaces,
        kube,
    })
}

/// The programs loaded and attached, the node sync running (it owns the probe), the first
/// service table.
struct Attached {
    /// What the loaded object leaves for the state readers.
    parts: LoadedParts,
    capabilities: Arc<Capabilities>,
    ifnames: IfNames,
    status: watch::Receiver<NodeStatus>,
    /// The correlation loop's sender of the node's status (the dataplane's part).
    dataplane_status: watch::Sender<NodeStatus>,
    owners: watch::Receiver<crate::state::addrs::Owners>,
    services: state::ServiceTable,
    services_first: services::Pending,
    sync_task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// What of the loaded object the node sync does not own.
struct LoadedParts {
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    counters: kernel::counters::Counters,
    egress: kernel::counters::EgressTable,
    drop_destinations: kernel::DropDestinations,
    logger: Option<kernel::probe::EbpfLogger>,
}

/// The kernel phase: load the programs, attach them (the node sync), read the first service
/// table; the node sync then runs until `stop`.
async fn attach(
    cfg: &AgentConfig,
    kbtf: &KernelBtf,
    rt_handle: &rtnetlink::Handle,
    first_services: services::Pending,
    stop: &watch::Receiver<bool>,
    steps: &mut startup::StartupSteps,
) -> anyhow::Result<Attached> {
    let loaded = Probe::load(&probe_settings(cfg, kbtf), kbtf)?;
    steps.mark("load");
    info!(features = %loaded.probe.features(), "programs loaded");
    let capabilities = Arc::new(Capabilities::default());
    if loaded.probe.features().drop_hook == probe_contract::DropHook::None {
        capabilities.set(
            Capability::DropHook,
            false,
            "tp_btf and raw tracepoint refused",
        );
    }
    let ifnames: IfNames = Arc::new(RwLock::new(Default::default()));
    let (status_tx, status_rx) = watch::channel(NodeStatus::default());
    let dataplane_status = status_tx.clone();
    let (owners_tx, owners_rx) = watch::channel(crate::state::addrs::Owners::default());
    let mut sync = NodeSync::new(
        loaded.probe,
        loaded.addresses,
        cfg.addr.clone(),
        cfg.map_sizes.addresses,
        ifnames.clone(),
        status_tx,
        owners_tx,
    );
    let sets = sync.sync(rt_handle).await?;
    steps.mark("attach");
    // Not waited for (the table fills in behind; see services.rs), except by the timer baseline.
    let (services, services_first) = services::initial(cfg.services_reader, first_services).await;
    steps.mark("services");
    info!(
        nics = ?sets.nics,
        vip_iface = ?sets.vip_iface,
        prefixes = sets.prefixes.len(),
        "attached and address sets loaded"
    );
    let sync_task = tokio::spawn(sync.run(rt_handle.clone(), stop.clone()));
    Ok(Attached {
        parts: LoadedParts {
            ring: loaded.ring,
            counters: loaded.counters,
            egress: loaded.egress,
            drop_destinations: loaded.drop_destinations,
            logger: loaded.logger,
        },
        capabilities,
        ifnames,
        status: status_rx,
        dataplane_status,
        owners: owners_rx,
        services,
        services_first,
        sync_task,
    })
}

/// The state readers: the ring-buffer reader (kernel events onto a bounded queue, decoded
/// with the symbol table) and the programs' log; what the correlation loop and the hub read.
struct StateReader {
    events: mpsc::Receiver<probe_contract::record::KernelRecord>,
    stats: Arc<ReaderStats>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    kallsyms_readable: bool,
    counters: kernel::counters::Counters,
    egress: kernel::counters::EgressTable,
    drop_destinations: kernel::DropDestinations,
}

impl StateReader {
    fn start(
        kallsyms: std::thread::JoinHandle<kernel::kallsyms::Kallsyms>,
        kbtf: &KernelBtf,
        parts: LoadedParts,
        ifnames: &IfNames,
        capabilities: &Capabilities,
        steps: &mut startup::StartupSteps,
    ) -> StateReader {
        let kallsyms = kallsyms.join().unwrap_or_default();
        let kallsyms_readable = note_kallsyms(&kallsyms, capabilities);
        steps.mark("kallsyms");
        if let Some(logger) = parts.logger {
            tokio::spawn(kernel::probe::run_logger(logger));
        }
        let (ev_tx, events) = mpsc::channel::<probe_contract::record::KernelRecord>(4096);
        let stats = Arc::new(ReaderStats::default());
        let decoder = Decoder {
            reasons: kbtf.drop_reasons.clone(),
            kallsyms,
            ifnames: ifnames.clone(),
            netns: kernel::current_netns_inode(),
        };
        let task = tokio::spawn(reader::run(parts.ring, decoder, ev_tx, stats.clone()));
        StateReader {
            events,
            stats,
            task,
            kallsyms_readable,
            counters: parts.counters,
            egress: parts.egress,
            drop_destinations: parts.drop_destinations,
        }
    }
}

/// The writers of the hub's reports, and the verify tasks beside them: subscribed before the
/// first report; they run beside the correlation loop, never in it.
struct Writers {
    /// `--events` and OTLP's log records: drained at the shutdown.
    drained: Vec<tokio::task::JoinHandle<()>>,
    /// The Kubernetes ones (Events, node report, verify): aborted when run() returns.
    _kube_events: Option<AbortOnDrop>,
    _node_report: Option<AbortOnDrop>,
    _verify: Vec<AbortOnDrop>,
}

impl Writers {
    async fn start(
        cfg: &AgentConfig,
        shared: &Shared,
        surfaces: &mut Surfaces,
        kube: &Attribution,
        tables: watch::Receiver<Option<Arc<state::ServiceTable>>>,
        owners: &watch::Receiver<crate::state::addrs::Owners>,
        kernel: impl FnOnce() -> crate::check::KernelView,
    ) -> Writers {
        let subscription = || crate::sink::Subscription::to(shared);
        let mut drained = Vec::new();
        if let Some(events) = surfaces.events.take() {
            drained.push(subscription().run(crate::sink::json::EventLines(events)));
        }
        if let Some(otlp) = surfaces.otlp_logs.take() {
            drained.push(subscription().run(otlp));
        }
        let kube_events = spawn_kube_events(cfg, shared);
        let node_report = spawn_node_report(cfg, shared, kube, tables, owners, kernel);
        let verify = spawn_verify(cfg, shared, kube, owners).await;
        Writers {
            drained,
            _kube_events: kube_events,
            _node_report: node_report,
            _verify: verify,
        }
    }

    /// The stop is sent: the drained writers write what was published before it, then end.
    async fn drain(self) {
        for writer in self.drained {
            if tokio::time::timeout(Duration::from_secs(2), writer)
                .await
                .is_err()
            {
                warn!("an output did not drain in 2 s");
            }
        }
    }
}

/// Whether kallsyms was readable; when not, drop sites are an unavailable capability, with
/// the `kptr_restrict` that explains it.
fn note_kallsyms(kallsyms: &kernel::kallsyms::Kallsyms, capabilities: &Capabilities) -> bool {
    let readable = !kallsyms.is_empty();
    if !readable {
        let restrict = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict")
            .map(|s| format!("kernel.kptr_restrict={}", s.trim()))
            .unwrap_or_else(|e| format!("kptr_restrict unreadable: {e}"));
        capabilities.set(Capability::DropSites, false, &restrict);
    }
    readable
}

/// Orderly shutdown: stop the surfaces and the sync task (it detaches); the caller then drains
/// the writers and stops the reader.
async fn shut_down(
    stop_tx: watch::Sender<bool>,
    serving: Serving,
    sync_task: tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let _ = stop_tx.send(true);
    serving.stop().await;
    match tokio::time::timeout(Duration::from_secs(5), sync_task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "node sync ended with an error"),
        Ok(Err(e)) => warn!(error = %e, "node sync task failed"),
        Err(_) => warn!("node sync did not stop in 5 s"),
    }
}

/// Reads started first and run beside BTF parsing and program loading (both CPU-bound on
/// this thread), off the path to ready: the symbol table (awaited when the reader starts) and
/// the first service table (a whole dump of the rules; `iptables-legacy-save` on legacy
/// nodes). aya's BTF parses are not among them: see `Probe::load`.
struct EarlyReads {
    kallsyms: std::thread::JoinHandle<kernel::kallsyms::Kallsyms>,
    services: services::Pending,
}

impl EarlyReads {
    fn start(reader: services::ReaderMode, facts_first: bool) -> anyhow::Result<EarlyReads> {
        let kallsyms = std::thread::Builder::new()
            .name("kallsyms".into())
            .spawn(kernel::kallsyms::Kallsyms::load)
            .context("starting the kallsyms reader")?;
        state::set_reuse_parses(reader == services::ReaderMode::Change);
        let services = services::start_first_read(reader, facts_first);
        Ok(EarlyReads { kallsyms, services })
    }
}

/// Fails on a mistyped interface, or a node with no NIC to watch, before anything is loaded;
/// warns about pod CIDRs that do not match the node.
async fn check_interfaces(rt: &rtnetlink::Handle, addr: &AddrConfig) -> anyhow::Result<()> {
    let node = state::addrs::read(rt)
        .await
        .context("reading interfaces over rtnetlink")?;
    for nic in &addr.nics {
        if !node.links.iter().any(|l| &l.name == nic) {
            return Err(kernel::KernelError::UnknownInterface { name: nic.clone() }.into());
        }
    }
    let sets = state::addrs::classify(&node, addr);
    if sets.nics.is_empty() {
        anyhow::bail!(
            "no NIC to watch: no physical interface and none with a default route in any routing table here; name one with --nic"
        );
    }
    for warning in checks::pod_cidr_warnings(&addr.pod_cidrs, &node, &sets.nics) {
        warn!("{warning}");
    }
    Ok(())
}

/// The agent's surfaces and outputs, bound and opened before the kernel is touched: a port in
/// use or a path that cannot be written fails with nothing attached.
struct Surfaces {
    metrics: Option<std::net::TcpListener>,
    evidence_access: crate::sink::evidence_http::EvidenceAccess,
    live: Option<(tokio::net::UnixListener, crate::sink::live::SocketFile)>,
    /// `--events`: confirmed events as JSON lines (a writer of the hub's reports).
    events: Option<JsonLines>,
    /// `--record`: every kernel event, written by the correlation loop.
    record: Option<JsonLines>,
    /// `--otlp-endpoint`'s log records (a writer of the hub's reports).
    otlp_logs: Option<crate::sink::otlp::OtlpLogs>,
    /// `--otlp-endpoint`'s metric exporter, started once the hub exists.
    otlp_metrics: Option<crate::sink::otlp::PendingMetrics>,
}

impl Surfaces {
    fn open(cfg: &AgentConfig) -> anyhow::Result<Surfaces> {
        let metrics = match cfg.metrics_addr {
            Some(addr) => Some(std::net::TcpListener::bind(addr).with_context(|| {
                format!(
                    "--metrics-addr {addr}: cannot listen (in use, or not an address of this namespace)"
                )
            })?),
            None => None,
        };
        let live = match &cfg.socket {
            Some(path) => Some(crate::sink::live::bind(path)?),
            None => None,
        };
        let events = match &cfg.events {
            Some(path) => Some(
                JsonLines::open(path, "events", crate::sink::json::EVENTS_QUEUE_LINES)
                    .context("--events")?,
            ),
            None => None,
        };
        let record = match &cfg.record {
            Some(path) => Some(
                JsonLines::open(path, "record", crate::sink::json::RECORD_QUEUE_LINES)
                    .context("--record")?,
            ),
            None => None,
        };
        let (mut otlp_logs, mut otlp_metrics) = (None, None);
        if let Some(otlp) = &cfg.otlp {
            let node = cfg.node_name.clone().unwrap_or_else(hub::node_name);
            otlp_logs = Some(crate::sink::otlp::OtlpLogs::start(
                otlp,
                node.clone(),
                Default::default(),
            )?);
            otlp_metrics = Some(crate::sink::otlp::OtlpMetrics::exporter(otlp, node)?);
        }
        Ok(Surfaces {
            metrics,
            evidence_access: crate::sink::evidence_http::EvidenceAccess {
                token_file: cfg.evidence_token_file.clone(),
            },
            live,
            events,
            record,
            otlp_logs,
            otlp_metrics,
        })
    }

    /// Each JSON-lines output's counters, by name (the surfaces show a stalled or lossy one).
    fn output_stats(&self) -> Vec<(&'static str, Arc<crate::hub::outputs::OutputStats>)> {
        [("events", &self.events), ("record", &self.record)]
            .into_iter()
            .filter_map(|(name, out)| Some((name, out.as_ref()?.stats())))
            .collect()
    }

    /// Starts the metrics server (until `stop`), the live view and the OTLP metric exporter;
    /// the sinks stay behind for the correlation loop.
    fn serve(&mut self, shared: &Shared, stop: &watch::Receiver<bool>) -> Serving {
        let metrics = self.metrics.take().map(|listener| {
            info!(addr = ?listener.local_addr().ok(), "serving /metrics, /healthz, /readyz");
            let mut stop = stop.clone();
            tokio::spawn(crate::sink::metrics::serve(
                listener,
                shared.view(),
                self.evidence_access.clone(),
                async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                },
            ))
        });
        let (live, socket_file) = match self.live.take() {
            Some((listener, file)) => {
                let hub = shared.view();
                let task = AbortOnDrop(tokio::spawn(async move {
                    let _ = crate::sink::live::serve(listener, hub).await;
                }));
                (Some(task), Some(file))
            }
            None => (None, None),
        };
        let otlp_metrics =
            self.otlp_metrics
                .take()
                .zip(shared.otlp_stats())
                .map(|(pending, stats)| {
                    crate::sink::otlp::OtlpMetrics::start(pending, &shared.view(), stats)
                });
        Serving {
            metrics,
            live,
            socket_file,
            otlp_metrics,
        }
    }
}

/// The running surfaces, stopped in [`Serving::stop`].
struct Serving {
    metrics: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    live: Option<AbortOnDrop>,
    socket_file: Option<crate::sink::live::SocketFile>,
    /// `--otlp-endpoint`'s metric exporter.
    otlp_metrics: Option<crate::sink::otlp::OtlpMetrics>,
}

impl Serving {
    async fn stop(self) {
        drop(self.live);
        if let Some(task) = self.metrics
            && tokio::time::timeout(Duration::from_secs(1), task)
                .await
                .is_err()
        {
            warn!("the metrics server did not stop in 1 s");
        }
        if let Some(file) = self.socket_file {
            file.remove();
        }
        if let Some(otlp) = self.otlp_metrics {
            // A last export, bounded (otlp::metrics::SHUTDOWN_WAIT): a receiver that hangs does
            // not hold the exit.
            tokio::task::block_in_place(|| otlp.shutdown());
        }
    }
}

/// Kubernetes attribution: the client connected before anything is attached (a broken
/// kubeconfig fails here), the watcher's index, and its status for the surfaces.
struct Attribution {
    status: Arc<crate::kube::KubeStatus>,
    index: Option<watch::Receiver<Arc<crate::kube::index::Index>>>,
    /// The service table from the API (`--service-table-from api`).
    api_table: Option<crate::kube::watcher::SharedApiTable>,
    _task: Option<AbortOnDrop>,
}

impl Attribution {
    async fn connect(cfg: &AgentConfig) -> anyhow::Result<Attribution> {
        let status = Arc::new(crate::kube::KubeStatus::default());
        let Some(source) = &cfg.kube else {
            info!(
                "Kubernetes attribution off (no --kubeconfig, no in-cluster service account, or --kube-attribution off): events name addresses only"
            );
            return Ok(Attribution {
                status,
                index: None,
                api_table: None,
                _task: None,
            });
        };
        let client = crate::kube::connect_watched(source, &status).await?;
        // The timer reader is the bench's old baseline: it reads the rules only.
        let from_api = cfg.service_table_from == services::TableFrom::Api
            && cfg.services_reader == services::ReaderMode::Change;
        let (index, api_table, task) = if from_api {
            let (index, table, task) = crate::kube::watcher::spawn_with_table(
                client,
                cfg.node_name.clone(),
                status.clone(),
                crate::kube::service_table::NodeView {
                    // Set from the rules' mode before the first table is made.
                    mode: crate::state::ServiceSource::Iptables,
                    node_name: None,
                    node_ips: Vec::new(),
                },
            );
            (index, Some(table), task)
        } else {
            let (index, task) =
                crate::kube::watcher::spawn(client, cfg.node_name.clone(), status.clone());
            (index, None, task)
        };
        Ok(Attribution {
            status,
            index: Some(index),
            api_table,
            _task: Some(AbortOnDrop(task)),
        })
    }
}

/// The Kubernetes Events writer, subscribed to the reports (None: off).
fn spawn_kube_events(cfg: &AgentConfig, shared: &Shared) -> Option<AbortOnDrop> {
    let Some(source) = &cfg.kube_events else {
        info!(
            "Kubernetes Events off (--kube-events off, or no --kubeconfig / in-cluster service account)"
        );
        return None;
    };
    Some(AbortOnDrop(tokio::spawn(crate::sink::kube_events::start(
        source.clone(),
        cfg.node_name.clone().unwrap_or_else(hub::node_name),
        crate::sink::Subscription::to(shared),
        shared.kube_event_stats(),
    ))))
}

/// The verify requests' watch and tester, and the canary (empty: no API access, or the
/// index is off).
async fn spawn_verify(
    cfg: &AgentConfig,
    shared: &Shared,
    kube: &Attribution,
    owners: &watch::Receiver<crate::state::addrs::Owners>,
) -> Vec<AbortOnDrop> {
    let (Some(source), Some(index)) = (&cfg.kube, &kube.index) else {
        if cfg.canary_every.is_some() {
            warn!("--canary-every needs Kubernetes API access (the Services' LB IPs): canary off");
        }
        return Vec::new();
    };
    let node = cfg.node_name.clone().unwrap_or_else(hub::node_name);
    let mark = cfg
        .socket
        .as_deref()
        .and_then(|socket| verify_mark::path_beside(socket, &node))
        .map(verify_mark::TestingMark::at);
    let tester = verify::Tester {
        node,
        shared: shared.clone(),
        index: index.clone(),
        mark,
    };
    let mut tasks = Vec::new();
    match crate::kube::connect(source).await {
        Ok(client) => tasks.push(AbortOnDrop(tokio::spawn(verify::serve(
            client,
            tester.clone(),
            cfg.verify,
            owners.clone(),
        )))),
        Err(e) => warn!(error = %e, "verify: no API client: requests are not answered"),
    }
    if let Some(every) = cfg.canary_every {
        tasks.push(AbortOnDrop(tokio::spawn(verify::canary(tester, every))));
    }
    tasks
}

/// The node report's writer (and the Node condition), subscribed to the reports (None: off).
fn spawn_node_report(
    cfg: &AgentConfig,
    shared: &Shared,
    kube: &Attribution,
    tables: watch::Receiver<Option<Arc<state::ServiceTable>>>,
    owners: &watch::Receiver<crate::state::addrs::Owners>,
    kernel: impl FnOnce() -> crate::check::KernelView,
) -> Option<AbortOnDrop> {
    let source = cfg.node_report.as_ref()?;
    let node = cfg.node_name.clone().unwrap_or_else(hub::node_name);
    let checks = crate::sink::node_report::checks::spawn_checks(
        cfg.addr.clone(),
        kube.index.clone(),
        tables,
        owners.clone(),
        kernel(),
    );
    // The evidence bundles show the same risks for a loop's Service.
    let mut risks_rx = checks.clone();
    let hub = shared.clone();
    tokio::spawn(async move {
        while risks_rx.changed().await.is_ok() {
            let latest = risks_rx.borrow_and_update().risks.clone();
            hub.set_check_risks(latest);
        }
    });
    Some(AbortOnDrop(tokio::spawn(
        crate::sink::node_report::writer::start(
            source.clone(),
            crate::sink::node_report::writer::WriterSettings {
                node_condition: cfg.node_condition,
                // The tracker's window: "active" means the same in the report and the gauge.
                active_window_s: i64::try_from(cfg.resolve_after.as_secs().max(1))
                    .unwrap_or(i64::MAX),
                write_interval_ms: u64::try_from(cfg.node_report_interval.as_millis())
                    .unwrap_or(u64::MAX),
                stats: shared.node_report_stats(),
                local: Some(owners.clone()),
            },
            crate::sink::node_report::status::NodeFacts::of_this_node(&node),
            shared.capabilities().clone(),
            crate::sink::Subscription::to(shared),
            checks,
        ),
    )))
}

/// What the programs are loaded with: the configuration the kernel side reads, from the
/// command line and the running kernel's BTF.
fn probe_settings(cfg: &AgentConfig, kbtf: &KernelBtf) -> ProbeSettings {
    let mut settings = ProbeSettings {
        config: probe_common::ProbeConfig::default(),
        ebpf_log: cfg.ebpf_log,
        tc_mode: cfg.tc_mode,
        sizes: cfg.map_sizes,
    };
    settings.config.netns_ino = kernel::current_netns_inode();
    settings.config.reason_consumed = kbtf.drop_reasons.code("SKB_CONSUMED").unwrap_or(u32::MAX);
    // Nothing would keep the bytes with the evidence off: the kernel copies none then.
    settings.config.capture_bytes = match cfg.evidence {
        crate::hub::evidence::EvidenceMode::Off => 0,
        _ => cfg.capture_bytes.min(probe_common::CAPTURE_MAX as u32),
    };
    settings
}

/// Aborts a background task when the loop that owns it returns, however it returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
