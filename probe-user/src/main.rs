//! `probe`: clb-probe's command line. Exit codes: 0 ok, 1 runtime failure, 2 usage error.
#![allow(
    clippy::print_stdout,
    reason = "the probe binary's commands (check, version, watch) print their answer on stdout"
)]

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};
use clb_probe::{
    agent::{self, AgentConfig},
    kernel::sizing,
    state::addrs::{AddrConfig, Prefix},
};

#[derive(Parser, Debug)]
#[command(
    name = "probe",
    version,
    about = "Finds and proves load-balancer loopback on Kubernetes nodes (eBPF)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the node agent (the DaemonSet's command): attach, watch, correlate, report.
    Agent(Box<AgentArgs>),
    /// Live terminal view of the local agent (a plain snapshot when not on a terminal).
    Watch(WatchArgs),
    /// Follow the local agent's confirmed events as JSON lines.
    Events(EventsArgs),
    /// Print the service table the agent judges against (IPVS, or kube-proxy's nftables
    /// tables or iptables rules, of this network namespace) as JSON.
    Services,
    /// Judge this node's loopback risks before they fail (exit 0 none, 1 risks found).
    Check(CheckArgs),
}

/// The node's interfaces and pod CIDRs, as `probe agent` watches them and `probe check`
/// judges them.
#[derive(clap::Args, Debug)]
struct NodeArgs {
    /// NIC (repeatable): the agent watches it, `probe check` judges its source-validation
    /// settings. Default: every non-virtual interface plus every interface with a default route
    /// in any routing table.
    #[arg(long = "nic", env = "CLB_PROBE_NIC", value_delimiter = ',')]
    nics: Vec<String>,
    /// Interface holding bound ClusterIPs / LB VIPs (kube-proxy IPVS mode's dummy).
    #[arg(long, env = "CLB_PROBE_VIP_IFACE", default_value = "kube-ipvs0")]
    vip_iface: String,
    /// Local pod CIDR (repeatable), in addition to the pod routes learned from the node.
    #[arg(long = "pod-cidr", env = "CLB_PROBE_POD_CIDR", value_delimiter = ',', value_parser = parse_pod_cidr)]
    pod_cidrs: Vec<Prefix>,
}

impl NodeArgs {
    /// The interfaces checked (a usage error, exit 2, names a bad one), as the address config.
    fn checked(self) -> AddrConfig {
        if let Some(e) = agent::checks::interface_error(&self.nics, &self.vip_iface) {
            usage_error(clap::error::ErrorKind::ValueValidation, e);
        }
        AddrConfig {
            nics: self.nics,
            vip_iface: self.vip_iface,
            pod_cidrs: self.pod_cidrs,
        }
    }
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Print the report as JSON (schema: docs/checking-a-node.md) instead of a table.
    #[arg(long)]
    json: bool,
    /// Read the Services from the API this kubeconfig names (default: in-cluster when run in
    /// a pod, else the node alone).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Predict what moving kube-proxy to this mode changes (`nftables`, from IPVS or iptables
    /// mode): risks that disappear and appear, fixes to apply first, ipMode advice. Exit 0
    /// when no risk is predicted after the move, 1 when some is.
    #[arg(
        long = "as",
        value_name = "MODE",
        value_enum,
        hide_possible_values = true
    )]
    as_mode: Option<AsMode>,
}

/// The modes `probe check --as` predicts a move to.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum AsMode {
    Nftables,
}

#[derive(clap::Args, Debug)]
struct WatchArgs {
    /// The agent's live-view socket.
    #[arg(long, env = "CLB_PROBE_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print one plain snapshot and exit.
    #[arg(long)]
    once: bool,
}

#[derive(clap::Args, Debug)]
struct EventsArgs {
    /// The agent's live-view socket.
    #[arg(long, env = "CLB_PROBE_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print the aggregates confirmed before connecting first.
    #[arg(long)]
    all: bool,
}

#[derive(clap::Args, Debug)]
struct AgentArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Write confirmed loopback events as JSON lines to PATH (`-` = stdout).
    #[arg(long, env = "CLB_PROBE_EVENTS", value_name = "PATH|-")]
    events: Option<PathBuf>,
    /// Record every kernel event as JSON lines to PATH, for replay through the correlator.
    #[arg(long, env = "CLB_PROBE_RECORD", value_name = "PATH")]
    record: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, env = "CLB_PROBE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// How to attach to interfaces: tcx links (kernel >= 6.6) or cls_bpf under a clsact qdisc.
    /// Default: tcx where the kernel has it.
    #[arg(long, env = "CLB_PROBE_TC_MODE", value_enum)]
    tc_mode: Option<probe_contract::TcMode>,
    /// Turn on the eBPF programs' debug log lines (aya-log).
    #[arg(long, env = "CLB_PROBE_EBPF_LOG")]
    ebpf_log: bool,
    /// Serve Prometheus metrics, /healthz and /readyz on ADDR:PORT.
    #[arg(long, env = "CLB_PROBE_METRICS_ADDR", value_name = "ADDR:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Live-view socket for `probe watch` and `probe events`.
    #[arg(long, env = "CLB_PROBE_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Seconds between safety-net re-reads of the service table (it is read when the rules
    /// change; this catches what no change signal covers).
    #[arg(long, env = "CLB_PROBE_SERVICES_EVERY", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    services_every: u64,
    /// Seconds a confirmed loop must stay unconfirmed, while its traffic is seen answered, to
    /// be called resolved (a Normal `LoopbackResolved` Event, `clbprobe_loopback_active` down).
    #[arg(long, env = "CLB_PROBE_RESOLVE_AFTER", default_value_t = 300, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    resolve_after: u64,
    /// How the service table is refreshed: `change` (default), or `timer`, the old full re-read
    /// every --services-every (kept for the bench's baseline).
    #[arg(
        long,
        env = "CLB_PROBE_SERVICES_READER",
        value_enum,
        default_value_t,
        hide = true
    )]
    services_reader: clb_probe::agent::services::ReaderMode,
    /// Where the service table's Services come from: `api` (default: the Kubernetes API's
    /// Services and EndpointSlices when the agent has API access, kube-proxy's rules read only
    /// for masquerade, NodePorts and per question) or `rules` (kube-proxy's rules read whole on
    /// every change, as without API access).
    #[arg(
        long,
        env = "CLB_PROBE_SERVICE_TABLE_FROM",
        value_enum,
        default_value_t
    )]
    service_table_from: clb_probe::agent::services::TableFrom,
    #[command(flatten)]
    kube: clb_probe::kube::KubeArgs,
    #[command(flatten)]
    map_sizes: MapSizeArgs,
    /// Write confirmed loopbacks as Kubernetes Events (events.k8s.io/v1, regarding the
    /// Service, else the Node) when API access exists (--kubeconfig or in-cluster).
    #[arg(long, env = "CLB_PROBE_KUBE_EVENTS", value_enum, default_value_t = OnOff::On)]
    kube_events: OnOff,
    /// Write this node's LoopbackReport (clb-probe.io/v1alpha1, named after the node: risks,
    /// active and resolved loops) when API access exists; needs the chart's CRD and RBAC.
    #[arg(long, env = "CLB_PROBE_NODE_REPORT", value_enum, default_value_t = OnOff::Off)]
    node_report: OnOff,
    /// Keep the Node condition LoadBalancerLoopback (True while a loop or a risk is active;
    /// reason: the kind; message: the Service and the first fix) with the node report; needs
    /// RBAC nodes/status patch (the chart's kube.nodeCondition).
    #[arg(long, env = "CLB_PROBE_NODE_CONDITION", value_enum, default_value_t = OnOff::Off)]
    node_condition: OnOff,
    /// Least seconds between two writes of the node report (changes in between are coalesced,
    /// the newest wins); also the first wait after a failed write, doubled per failure up to
    /// the 300 s heartbeat. Larger values cut API writes on big clusters.
    #[arg(long, env = "CLB_PROBE_NODE_REPORT_INTERVAL", default_value_t = 10, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=300))]
    node_report_interval: u64,
    /// The cloud whose LB fixes events carry (aws, azure, gce, alicloud, tencentcloud, hcloud,
    /// digitalocean, openstack, generic). Default: from the Service's LB class and
    /// annotations, else generic.
    #[arg(long, env = "CLB_PROBE_PROVIDER", value_name = "NAME")]
    provider: Option<probe_core::fixes::Provider>,
    /// Export the /metrics counters as OTLP metrics and every confirmed loopback as an OTLP
    /// log record, over gRPC to an OpenTelemetry collector (http://HOST:4317). Off by default.
    #[arg(long, env = "CLB_PROBE_OTLP_ENDPOINT", value_name = "URL", value_parser = clb_probe::sink::otlp::parse_endpoint)]
    otlp_endpoint: Option<String>,
    /// Bytes of each packet the kernel records (an anomaly only: a suspect, a matched drop, a
    /// SYN from a VIP) copied into its record, from the IP header on (0-128; 0 = none).
    /// Ordinary packets are never copied. The bytes feed `GET /evidence` (see --evidence).
    #[arg(long, env = "CLB_PROBE_CAPTURE_BYTES", default_value_t = 128, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(0..=128))]
    capture_bytes: u32,
    /// What `GET /evidence` on the --metrics-addr port keeps and serves of each confirmed
    /// loop's first packets: `headers` (default: IP and TCP/UDP headers, payload bytes
    /// zeroed), `full` (the captured bytes as they are) or `off` (nothing kept, nothing
    /// copied in the kernel). See SECURITY.md.
    #[arg(long, env = "CLB_PROBE_EVIDENCE", value_enum, default_value_t)]
    evidence: clb_probe::hub::evidence::EvidenceMode,
    /// The file holding the token `GET /evidence` requires in its x-clb-probe-evidence-token
    /// header (the chart mounts Secret clb-probe-evidence here, optional). Without it, or while
    /// the file is missing or empty, `GET /evidence` answers 403: it hands out every loop's
    /// clients and first packets, so any pod that reaches the metrics port must not read it
    /// (SECURITY.md, "Evidence"). Read on each request: a Secret created later turns it on.
    #[arg(long, env = "CLB_PROBE_EVIDENCE_TOKEN_FILE", value_name = "PATH")]
    evidence_token_file: Option<PathBuf>,
    /// Answer `kubectl clb-probe verify` (LoopbackVerification requests for this node) by
    /// connecting from the node to the named Service's LB IP:ports (bounded: a few
    /// connections, one request at a time). Needs API access; `off` answers each request
    /// refused, saying so.
    #[arg(long, env = "CLB_PROBE_VERIFY", value_enum, default_value_t = OnOff::On)]
    verify: OnOff,
    /// The canary: every DURATION (e.g. 10m, 1h), the same node-sourced test as verify on the
    /// next 4 LB IP:ports of the cluster's Services, so a risk turns into a confirmed loop or a
    /// clean bill without waiting for users (its loops carry facts.canary). Off by default;
    /// needs API access.
    #[arg(long, env = "CLB_PROBE_CANARY_EVERY", value_name = "DURATION", value_parser = parse_canary_every)]
    canary_every: Option<Duration>,
    /// Seconds between OTLP metric exports (with --otlp-endpoint).
    #[arg(long, env = "CLB_PROBE_OTLP_INTERVAL", default_value_t = clb_probe::sink::otlp::DEFAULT_INTERVAL_SECS, value_parser = clap::value_parser!(u64).range(1..=3600))]
    otlp_interval: u64,
}

/// Kernel map capacities (docs/agent.md, "Map sizing"); each range-checked, exit 2 outside it.
#[derive(clap::Args, Debug)]
struct MapSizeArgs {
    /// Pod connections leaving without SNAT kept as evidence (EGRESS_FLOWS, LRU).
    #[arg(long, env = "CLB_PROBE_EGRESS_FLOWS", default_value = "65536", value_parser = |s: &str| sizing::parse_count(s, sizing::EGRESS_FLOWS_RANGE))]
    egress_flows: u32,
    /// Entries of each address set: node addresses, bound VIPs, pod routes
    /// (HOSTS_V4/V6 hashes, LOCAL_V4/V6 tries).
    #[arg(long, env = "CLB_PROBE_ADDRESS_ENTRIES", default_value = "16384", value_parser = |s: &str| sizing::parse_count(s, sizing::ADDRESSES_RANGE))]
    address_entries: u32,
    /// Flows the kernel remembers for event deduplication (RECENT, LRU).
    #[arg(long, env = "CLB_PROBE_DEDUP_FLOWS", default_value = "16384", value_parser = |s: &str| sizing::parse_count(s, sizing::DEDUP_FLOWS_RANGE))]
    dedup_flows: u32,
    /// Keys of each exact counter map (SUSPECTS, DROPS).
    #[arg(long, env = "CLB_PROBE_COUNTER_KEYS", default_value = "1024", value_parser = |s: &str| sizing::parse_count(s, sizing::COUNTER_KEYS_RANGE))]
    counter_keys: u32,
    /// Kernel event ring buffer in KiB, a power of two (EVENTS).
    #[arg(long = "ringbuf-kib", env = "CLB_PROBE_RINGBUF_KIB", default_value = "256", value_parser = sizing::parse_ringbuf_kib)]
    ringbuf_bytes: u32,
}

impl MapSizeArgs {
    fn sizes(&self) -> sizing::MapSizes {
        sizing::MapSizes {
            egress_flows: self.egress_flows,
            addresses: self.address_entries,
            dedup_flows: self.dedup_flows,
            counter_keys: self.counter_keys,
            ringbuf_bytes: self.ringbuf_bytes,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// Where the agent listens for `probe watch` / `probe events` by default.
const DEFAULT_SOCKET: &str = clb_probe::sink::live::DEFAULT_SOCKET;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn parse_pod_cidr(s: &str) -> Result<Prefix, agent::checks::PodCidrError> {
    let p = Prefix::parse(s)?;
    match agent::checks::pod_cidr_error(&p) {
        Some(e) => Err(e),
        None => Ok(p),
    }
}

/// `info`, without the kube client's ERROR line per failed request: while the API is
/// unreachable the reflectors retry with backoff and each retry would log; the agent's watcher
/// says it once (`Kubernetes API not usable`) and `clbprobe_kube_connected` shows the state.
const DEFAULT_LOG_FILTER: &str = "info,kube_client::client::builder=off";

fn init_logging(format: LogFormat, ebpf_log: bool) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("CLB_PROBE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    if ebpf_log {
        // The programs' aya-log lines carry the eBPF crate's target (`probe`).
        filter = filter.add_directive("probe=debug".parse().expect("static directive"));
    }
    // Colour only on a terminal: logs collected by the kubelet or a test stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// A small runtime for the socket clients.
fn client(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::anyhow!("starting the runtime: {e}")),
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// glibc malloc tuned for a long-lived agent whose heap is mostly the service table (before
/// any thread starts; `MALLOC_ARENA_MAX` and `MALLOC_MMAP_THRESHOLD_` in the environment still
/// win, glibc reads them first):
///
/// - one arena: glibc gives each thread that allocates under contention an arena of its own,
///   up to 8 per core, and memory freed in one is never reused by another. The kernel's BTF is
///   parsed on the main thread, the API's lists are kept on runtime threads, the table is made
///   on the blocking pool: each left its freed memory where the others could not use it.
///   The agent allocates little per packet, so one arena's lock costs nothing measurable.
/// - allocations from 256 KiB up in their own mappings, returned when freed: glibc's default
///   threshold moves up to the largest block freed (the BTF's 5.5 MiB read), after which a
///   hash table's old buckets, left behind when it grows, stay in the heap.
///
/// Peak RSS with the API, 10,000 Services and 500,000 conntrack entries (`cargo xtask bench
/// --only scale`, BENCHMARKS.md 9f): 72 MiB with two arenas, 65 with one, 60 with one and the
/// threshold (30,000 Services: 235 MiB with glibc's defaults, 193 with two arenas, before
/// the other changes of 9f).
fn tune_malloc() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets allocator parameters; no thread has started yet.
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: as above.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024) };
        }
    }
}

fn main() -> ExitCode {
    tune_malloc();
    let cli = Cli::try_parse().unwrap_or_else(|e| parse_error(e));
    match cli.command {
        Command::Watch(args) => client(clb_probe_client::watch::watch(&args.socket, args.once)),
        Command::Events(args) => client(clb_probe_client::watch::events(&args.socket, args.all)),
        Command::Services => services(),
        Command::Check(args) => check(args),
        Command::Agent(args) => agent(*args),
    }
}

/// clap's usage error (exit 2), except for a mode `--as` does not predict: the one line
/// `probe check` has always said it with (`--as` without a mode stays clap's error).
fn parse_error(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::InvalidValue
        && let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg)
        && arg.starts_with("--as ")
        && let Some(ContextValue::String(mode)) = e.get(ContextKind::InvalidValue)
        && !mode.is_empty()
    {
        let why = clb_probe::check::readiness::AsUsage::NotPredicted(mode.clone());
        eprintln!("probe: error: {why}");
        std::process::exit(2);
    }
    e.exit()
}

/// A usage error the way clap prints its own (exit 2).
fn usage_error(kind: clap::error::ErrorKind, message: impl std::fmt::Display) -> ! {
    use clap::CommandFactory as _;
    Cli::command().error(kind, message).exit()
}

/// `probe services`: the service table as read now, as JSON.
fn services() -> ExitCode {
    match clb_probe::state::read_services() {
        Ok(table) => match serde_json::to_string_pretty(&table) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.into()),
        },
        Err(e) => fail(&e),
    }
}

/// `probe check` (and `--as MODE`): exit 0 clean, 1 a risk (or the node unreadable), 2 usage.
fn check(args: CheckArgs) -> ExitCode {
    let cfg = args.node.checked();
    let api = clb_probe::check::kube::ApiAccess::choose(args.kubeconfig);
    if let Some(target) = args.as_mode {
        use clb_probe::check::{AsError, readiness};
        let target = match target {
            AsMode::Nftables => probe_contract::check::Mode::Nftables,
        };
        return match clb_probe::check::run_as(&cfg, &api, target) {
            Ok(p) => {
                if args.json {
                    // Plain data: serializing cannot fail.
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&p).expect("prediction serializes")
                    );
                } else {
                    print!("{}", readiness::table(&p));
                }
                ExitCode::from(u8::from(p.risks_after > 0))
            }
            Err(AsError::Usage(e)) => {
                eprintln!("probe: error: {e}");
                ExitCode::from(2)
            }
            Err(AsError::Node(e)) => fail(&e),
        };
    }
    match clb_probe::check::run(&cfg, &api) {
        Ok(report) => {
            if args.json {
                println!("{}", clb_probe::check::render::json(&report));
            } else {
                print!("{}", clb_probe::check::render::table(&report));
            }
            ExitCode::from(report.exit_code())
        }
        Err(e) => fail(&e),
    }
}

/// `probe agent`: the flags checked (usage errors exit 2 before anything is attached), then
/// the agent until SIGTERM.
fn agent(args: AgentArgs) -> ExitCode {
    use clap::error::ErrorKind;
    let addr = args.node.checked();
    let kube = args
        .kube
        .source()
        .unwrap_or_else(|e| usage_error(ErrorKind::ValueValidation, e));
    // Two writers on one file would interleave partial lines (and one would truncate the
    // other's): a usage error like any other conflicting flags.
    if let (Some(events), Some(record)) = (&args.events, &args.record)
        && clb_probe::sink::json::same_output(events, record)
    {
        usage_error(
            ErrorKind::ArgumentConflict,
            format!(
                "--events {} and --record {} name the same output: give each its own file",
                events.display(),
                record.display()
            ),
        );
    }
    if args.node_condition == OnOff::On && args.node_report == OnOff::Off {
        usage_error(
            ErrorKind::ArgumentConflict,
            "--node-condition on needs --node-report on: the condition is written with the node's report",
        );
    }
    // Events and the node report use the same API access as attribution, whether or not
    // attribution is on.
    let api_when = |on: OnOff| match on {
        OnOff::Off => None,
        OnOff::On => clb_probe::kube::KubeArgs {
            kube_attribution: clb_probe::kube::Attribution::Auto,
            ..args.kube.clone()
        }
        .source()
        .ok()
        .flatten(),
    };
    let kube_events = api_when(args.kube_events);
    let node_report = api_when(args.node_report);
    init_logging(args.log_format, args.ebpf_log);
    let cfg = AgentConfig {
        addr,
        events: args.events,
        record: args.record,
        ebpf_log: args.ebpf_log,
        tc_mode: args.tc_mode,
        services_every: Duration::from_secs(args.services_every),
        services_reader: args.services_reader,
        service_table_from: args.service_table_from,
        resolve_after: Duration::from_secs(args.resolve_after),
        metrics_addr: args.metrics_addr,
        socket: Some(args.socket),
        map_sizes: args.map_sizes.sizes(),
        kube,
        node_name: args.kube.node_name,
        kube_events,
        provider: args.provider,
        node_report,
        node_condition: args.node_condition == OnOff::On,
        node_report_interval: Duration::from_secs(args.node_report_interval),
        verify: args.verify == OnOff::On,
        canary_every: args.canary_every,
        otlp: args
            .otlp_endpoint
            .map(|endpoint| clb_probe::sink::otlp::OtlpConfig {
                endpoint,
                interval: Duration::from_secs(args.otlp_interval),
            }),
        capture_bytes: args.capture_bytes,
        evidence: args.evidence,
        evidence_token_file: args.evidence_token_file,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::anyhow!("starting the runtime: {e}")),
    };
    let result = rt.block_on(agent::run(cfg));
    // Blocking work still running (a conntrack look-up, a service-table read) must not hold
    // the exit: everything attached is already detached.
    rt.shutdown_timeout(Duration::from_millis(500));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// Why `--canary-every` was refused.
#[derive(Debug, thiserror::Error)]
enum CanaryEveryError {
    #[error("{0:?}: give a number with s, m or h (90s, 10m, 1h)")]
    NotANumber(String),
    #[error("{0:?}: the unit is s, m or h (90s, 10m, 1h)")]
    Unit(String),
    #[error("{0:?}: between 10s and 24h")]
    Range(String),
}

/// `--canary-every`: `90s`, `10m`, `1h` (or plain seconds), at least 10 s and at most a day.
fn parse_canary_every(s: &str) -> Result<Duration, CanaryEveryError> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| CanaryEveryError::NotANumber(s.to_owned()))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(CanaryEveryError::Unit(s.to_owned())),
    };
    if !(10..=86_400).contains(&secs) {
        return Err(CanaryEveryError::Range(s.to_owned()));
    }
    Ok(Duration::from_secs(secs))
}

/// One clear line on stderr, exit 1.
fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("probe: error: {e:#}");
    ExitCode::from(1)
}
