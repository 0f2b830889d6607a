//! The correlation loop: the only owner of the [`Correlator`]. It feeds it kernel events,
//! query answers, service tables, local-address owners and ticks, and sends what it confirms
//! to the sinks (through the Kubernetes hold when attribution is on). Queries go to
//! [`super::queries`], which answers off this loop.

use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use probe_contract::{Confirmation, Proto, clock::monotonic_ns, record::KernelRecord};
use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::{mpsc, watch},
};
use tracing::{debug, info};

use super::{
    AbortOnDrop,
    lookup_timers::{self, Lookup, LookupTimers},
    queries, services,
};
use crate::{
    correlate::{Answer, Correlator, CorrelatorConfig, Output},
    hub::Shared,
    kernel::{DropDestinations, counters::EgressTable, reader::IfNames},
    kube::{hold::Hold, index::Index},
    resolution::{Observed, ProofRequest, Tracker, proof, service_fields},
    state,
};

/// What the loop owns and reads.
pub(super) struct CorrelateLoop {
    pub events: mpsc::Receiver<KernelRecord>,
    pub egress: EgressTable,
    /// The drop program's watched destinations, kept from each service table.
    pub drop_destinations: DropDestinations,
    pub ifnames: IfNames,
    /// `--record`: every kernel event, as read, before correlation.
    pub record: Option<crate::sink::json::JsonLines>,
    pub shared: Shared,
    pub services_every: Duration,
    pub services_reader: services::ReaderMode,
    /// The service table from the API (None: no API access, or `--service-table-from rules`).
    pub api_table: Option<crate::kube::watcher::SharedApiTable>,
    pub services_first: services::Pending,
    pub services: state::ServiceTable,
    pub signals: Signals,
    /// Kubernetes attribution's latest index (None: attribution off).
    pub kube_index: Option<watch::Receiver<Arc<Index>>>,
    pub node_name: Option<String>,
    pub provider: Option<probe_core::fixes::Provider>,
    /// `--vip-iface`: the owner the events name for a VIP bound there.
    pub vip_iface: String,
    /// Who made each local address local (the node sync's latest).
    pub owners: watch::Receiver<crate::state::addrs::Owners>,
    /// Where each new service table is published for readers beside the loop.
    pub tables: watch::Sender<Option<Arc<state::ServiceTable>>>,
    /// The node status, for the dataplane named with each new table.
    pub status: watch::Sender<probe_contract::NodeStatus>,
    /// Each confirmed loop's life: active, quiet, resolved (`crate::resolution`).
    pub tracker: Tracker,
}

/// Puts kube-proxy's drop destinations (the addresses of its no-endpoint drops and of its
/// loadBalancerSourceRanges firewall entries) into the drop program's watched destinations,
/// and the LB's node-probe ports into its probe ports: a local pod's call to one of them,
/// dropped by kube-proxy's filter chains, then reaches the correlator.
/// A map write that fails is said and retried with the next table.
/// How many did not fit is published in the node status (`/readyz`'s detail and
/// `clbprobe_drop_destinations_left_out`), and said once per change.
fn watch_drop_destinations(
    maps: &mut DropDestinations,
    table: &state::ServiceTable,
    lb_ips: &std::collections::HashSet<std::net::IpAddr>,
    status: &watch::Sender<probe_contract::NodeStatus>,
) {
    let want = drop_destinations_in_order(table, lb_ips);
    match maps.sync(&want) {
        Ok(left_out) => {
            let changed = status.send_if_modified(|s| {
                let changed = s.drop_destinations_left_out != left_out.len();
                s.drop_destinations_left_out = left_out.len();
                changed
            });
            if changed && !left_out.is_empty() {
                tracing::warn!(
                    left_out = left_out.len(),
                    first = %left_out[0],
                    "kube-proxy's drop destinations (no-endpoint drops and loadBalancerSourceRanges firewall entries): {} of {} addresses do not fit the drop program's watched destinations (--address-entries): a pod's call dropped at them is not confirmed (LB IPs were kept first)",
                    left_out.len(),
                    want.len()
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "writing the drop program's watched destinations"),
    }
    // The LB's node-probe ports: kube-proxy's healthz and the API's healthCheckNodePorts
    // (`lb_probe_refused`); a bit each, never full.
    let ports = crate::correlate::lb_probe_refused::watched_probe_ports(table);
    if let Err(e) = maps.sync_probe_ports(&ports) {
        tracing::warn!(error = %e, "writing the drop program's probe ports");
    }
}

/// The LB ingress IPs the API lists (empty without API access).
fn lb_ips_of(
    index: &Option<watch::Receiver<Arc<Index>>>,
) -> std::collections::HashSet<std::net::IpAddr> {
    index
        .as_ref()
        .map(|rx| {
            rx.borrow()
                .services()
                .flat_map(|s| s.ingress.iter().filter_map(|i| i.ip))
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses of kube-proxy's no-endpoint drops and firewall entries, once each, LB ingress IPs (as the API lists them)
/// first, then the others (external IPs), each group in address order. Pure.
pub(super) fn drop_destinations_in_order(
    table: &state::ServiceTable,
    lb_ips: &std::collections::HashSet<std::net::IpAddr>,
) -> Vec<std::net::IpAddr> {
    let mut addrs: Vec<std::net::IpAddr> = table.no_endpoint_drops.iter().map(|d| d.addr).collect();
    // kube-proxy's `firewall-ips` addresses too: a call dropped there is `source_ranges_drop`.
    addrs.extend(table.firewall.iter().map(|f| f.addr));
    addrs.sort_by_key(|a| (!lb_ips.contains(a), *a));
    addrs.dedup();
    addrs
}

/// How often the conntrack table is read for PROXY-protocol resets.
const PROXY_PROTOCOL_EVERY: Duration = crate::correlate::proxy_protocol::DUMP_EVERY;

/// One dump for the PROXY-protocol proof: the entries, and the targets they were read for.
type ProxyProtocolDump = (
    Vec<state::ConntrackEntry>,
    Vec<crate::correlate::proxy_protocol::ProxyProtocolTarget>,
);

/// Starts a conntrack dump when the API names LBs with PROXY protocol on (none: nothing to
/// read); returns whether one is out. A failed dump proves nothing and is said at debug level.
fn look_for_proxy_protocol(l: &CorrelateLoop, tx: &mpsc::Sender<ProxyProtocolDump>) -> bool {
    let Some(rx) = &l.kube_index else {
        return false;
    };
    let targets = crate::correlate::proxy_protocol::targets(rx.borrow().services());
    if targets.is_empty() {
        return false;
    }
    let tx = tx.clone();
    tokio::task::spawn_blocking(move || {
        // One kernel-filtered dump per LB IP, not the whole table every 3 s (on a node with
        // 500,000 entries that would be ~100 MB/s of netlink copies, see
        // `state::conntrack::dump_filtered`), nor one per IP:port (a tenant's 5,000 ports
        // were 5,000 dumps a round). Once per IP: two Services may name the same one, and an
        // entry read twice would be counted twice.
        let (ips, wanted) = crate::correlate::proxy_protocol::dump_plan(&targets);
        let mut entries = dump_per_ip(ips, Proto::Tcp, "PROXY-protocol resets");
        entries.retain(|e| wanted.contains(&(e.orig.dst, e.orig.dport)));
        let _ = tx.blocking_send((entries, targets));
    });
    true
}

/// How often the Service IPs' UDP entries are read for stale translations.
const STALE_UDP_EVERY: Duration = crate::correlate::stale_udp::DUMP_EVERY;

/// One dump for the stale UDP proof: the entries, and CLOCK_MONOTONIC when it was read.
type StaleUdpDump = (Vec<state::ConntrackEntry>, u64);

/// Starts a dump of the UDP entries of the service table's UDP Service IPs (one
/// kernel-filtered dump each, as for PROXY protocol; none: nothing to read); returns whether
/// one is out. A failed dump proves nothing and is said at debug level.
fn look_for_stale_udp(correlator: &Correlator, tx: &mpsc::Sender<StaleUdpDump>) -> bool {
    let ips = correlator.stale_udp_dump_ips();
    if ips.is_empty() {
        return false;
    }
    let tx = tx.clone();
    tokio::task::spawn_blocking(move || {
        let at_ns = monotonic_ns();
        let entries = dump_per_ip(ips, Proto::Udp, "stale UDP entries");
        let _ = tx.blocking_send((entries, at_ns));
    });
    true
}

/// The `proto` entries whose original destination is one of `ips`, one kernel-filtered dump
/// per IP (blocking). A failed dump proves nothing: it is said at debug level, naming
/// `looking_for`, and the other IPs' entries stand.
fn dump_per_ip(ips: Vec<IpAddr>, proto: Proto, looking_for: &str) -> Vec<state::ConntrackEntry> {
    let mut entries = Vec::new();
    for ip in ips {
        let filter = state::conntrack::OrigFilter {
            dst: Some(ip),
            proto: Some(proto),
            ..Default::default()
        };
        match state::conntrack::dump_filtered(&filter) {
            Ok(e) => entries.extend(e),
            Err(error) => debug!(%error, "conntrack dump for {looking_for}"),
        }
    }
    entries
}

/// A stale UDP dump's entries, to the correlator.
fn stale_udp_read(
    lookups: &mut LookupTimers,
    correlator: &mut Correlator,
    (entries, at_ns): StaleUdpDump,
) -> Vec<Output> {
    lookups.step(
        lookup_timers::Signal::Answered(Lookup::StaleUdp),
        Instant::now(),
    );
    correlator.stale_udp(&entries, at_ns)
}

/// One proof look-up's results: (loop key, what it found or None).
type ProofResults = Vec<(String, Option<proof::Found>)>;

/// The signals that end the agent. SIGHUP and SIGQUIT too: their default actions (exit, core
/// dump) would leave cls_bpf filters attached and the socket file behind.
pub(super) struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// Resolves with the name of the first of them to arrive.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.hup.recv() => "SIGHUP",
            _ = self.quit.recv() => "SIGQUIT",
        }
    }
}

/// Runs until a signal (Ok) or the kernel event reader stops (Err).
pub(super) async fn run(mut l: CorrelateLoop) -> anyhow::Result<()> {
    let mut correlator = Correlator::new(CorrelatorConfig {
        vip_iface: l.vip_iface.clone(),
        ..CorrelatorConfig::default()
    });
    let lb_ips = lb_ips_of(&l.kube_index);
    watch_drop_destinations(&mut l.drop_destinations, &l.services, &lb_ips, &l.status);
    correlator.set_services(std::mem::take(&mut l.services));
    correlator.set_owners(l.owners.borrow_and_update().clone());
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    // The service table is re-read off this loop: a whole nat table or IPVS dump can take a
    // second on a busy node, and events must not wait behind them (the egress map moves on).
    let (services_tx, mut services_rx) = mpsc::channel::<Arc<state::ServiceTable>>(1);
    let _services_task = AbortOnDrop(tokio::spawn(refresher(&mut l, services_tx).run()));
    let (answer_tx, mut answer_rx) = mpsc::channel::<Answer>(1024);
    // Confirmed reports waiting (at most 2 s) for the API cache to name them.
    let mut hold = Hold::default();
    // Quiet loops' proof look-ups (a conntrack dump each) run off this loop, one batch at a
    // time, every `check_every`; PROXY-protocol resets (`correlate::proxy_protocol`) likewise,
    // a conntrack dump every PROXY_PROTOCOL_EVERY while the API names an LB with PROXY
    // protocol on (its reset entries stay 10 s in CLOSE, so none is missed between dumps);
    // stale UDP entries (`correlate::stale_udp`) every STALE_UDP_EVERY.
    let (proof_tx, mut proof_rx) = mpsc::channel::<ProofResults>(4);
    let (pp_tx, mut pp_rx) = mpsc::channel::<ProxyProtocolDump>(1);
    let (udp_tx, mut udp_rx) = mpsc::channel::<StaleUdpDump>(1);
    let mut lookups = LookupTimers::new(
        Instant::now(),
        Duration::from_secs(l.tracker.config().check_every_s()),
        PROXY_PROTOCOL_EVERY,
        STALE_UDP_EVERY,
    );
    // Every kind's gauges and counters from the start, at 0.
    l.shared.publish_loops(l.tracker.lifecycle(), None);
    loop {
        let waiting = !hold.is_empty();
        let deadline = hold
            .next_deadline()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(tokio::time::Instant::now);
        let outputs = tokio::select! {
            ev = l.events.recv() => {
                let Some(rec) = ev else { anyhow::bail!("the kernel event reader stopped") };
                if let Some(out) = &mut l.record {
                    out.write(&rec.event);
                }
                if !rec.packet_bytes.is_empty() {
                    l.shared.evidence_packet(&rec);
                }
                correlator.ingest(rec.event)
            }
            Some(answer) = answer_rx.recv() => correlator.answer(answer),
            _ = tick.tick() => {
                on_tick(&mut l, &mut correlator);
                start_lookups(&mut l, &correlator, &mut lookups, (&proof_tx, &pp_tx, &udp_tx));
                correlator.tick(monotonic_ns())
            }
            Some((entries, targets)) = pp_rx.recv() => {
                lookups.step(lookup_timers::Signal::Answered(Lookup::ProxyProtocol), Instant::now());
                correlator.proxy_protocol(&entries, &targets, monotonic_ns())
            }
            Some(dump) = udp_rx.recv() => stale_udp_read(&mut lookups, &mut correlator, dump),
            Some(results) = proof_rx.recv() => {
                lookups.step(lookup_timers::Signal::Answered(Lookup::Proof), Instant::now());
                proved(&mut l, results);
                Vec::new()
            }
            Some(table) = services_rx.recv() => {
                new_table(&mut l, &mut correlator, table);
                Vec::new()
            }
            _ = index_changed(&mut l.kube_index), if waiting => {
                release(&mut hold, &mut l, Instant::now());
                Vec::new()
            }
            _ = tokio::time::sleep_until(deadline), if waiting => {
                release(&mut hold, &mut l, Instant::now());
                Vec::new()
            }
            name = l.signals.recv() => {
                info!("{name}: shutting down");
                // Held reports go out as they are.
                release(&mut hold, &mut l, Instant::now() + crate::kube::hold::HOLD_MAX);
                return Ok(());
            }
        };
        for out in outputs {
            match out {
                Output::Report(report) => confirmed(&mut l, &mut hold, report),
                Output::Query(query) => queries::answer_query(
                    query,
                    &l.egress,
                    &l.ifnames,
                    l.shared.capabilities(),
                    &answer_tx,
                ),
            }
        }
    }
}

/// The service-table refresher, fed by the API's table when the agent has one.
fn refresher(
    l: &mut CorrelateLoop,
    tx: mpsc::Sender<Arc<state::ServiceTable>>,
) -> services::Refresher {
    services::Refresher {
        mode: l.services_reader,
        every: l.services_every,
        first: std::mem::take(&mut l.services_first),
        tx,
        api: match (l.api_table.take(), &l.kube_index) {
            (Some(table), Some(index)) => Some(services::ApiFeed {
                table,
                index: index.clone(),
                owners: l.owners.clone(),
            }),
            _ => None,
        },
    }
}

/// The tick's bookkeeping: the correlator's stats out, the NICs and local-address owners in.
fn on_tick(l: &mut CorrelateLoop, correlator: &mut Correlator) {
    l.shared.set_correlator_stats(correlator.stats());
    correlator.set_nics(l.shared.status().nics);
    if l.owners.has_changed().unwrap_or(false) {
        correlator.set_owners(l.owners.borrow_and_update().clone());
    }
}

/// Starts the look-ups the timers say are due.
fn start_lookups(
    l: &mut CorrelateLoop,
    correlator: &Correlator,
    lookups: &mut LookupTimers,
    (proof_tx, pp_tx, udp_tx): (
        &mpsc::Sender<ProofResults>,
        &mpsc::Sender<ProxyProtocolDump>,
        &mpsc::Sender<StaleUdpDump>,
    ),
) {
    let now = Instant::now();
    for lookup in lookups.step(lookup_timers::Signal::Tick, now) {
        let out = match lookup {
            Lookup::Proof => {
                let out = look_for_proof(&mut l.tracker, proof_tx);
                // Loops gone quiet: the gauges follow.
                if l.tracker.take_changed() {
                    l.shared.publish_loops(l.tracker.lifecycle(), None);
                }
                out
            }
            Lookup::ProxyProtocol => look_for_proxy_protocol(l, pp_tx),
            Lookup::StaleUdp => look_for_stale_udp(correlator, udp_tx),
        };
        lookups.step(lookup_timers::Signal::Started { lookup, out }, now);
    }
}

/// A new service table (on change): published beside the loop, its dataplane named in the
/// node status, its no-endpoint drops watched, and the correlator's.
fn new_table(l: &mut CorrelateLoop, correlator: &mut Correlator, table: Arc<state::ServiceTable>) {
    if l.tables.receiver_count() > 0 {
        l.tables.send_replace(Some(table.clone()));
    }
    // A new table only (on change): two sysfs/bpffs listings, microseconds.
    let dataplane = crate::check::dataplane::of_node(&table).name();
    l.status.send_if_modified(|s| {
        let changed = s.dataplane != dataplane;
        s.dataplane = dataplane;
        changed
    });
    let lb_ips = lb_ips_of(&l.kube_index);
    watch_drop_destinations(&mut l.drop_destinations, &table, &lb_ips, &l.status);
    correlator.set_services(table);
}

/// A confirmed report: out now without attribution; with it, when the API cache can name it
/// (or in 2 s).
fn confirmed(l: &mut CorrelateLoop, hold: &mut Hold, mut report: Confirmation) {
    let Some(rx) = &l.kube_index else {
        crate::kube::enrich::enrich(&mut report.event, &Index::default(), l.node_name.as_deref());
        emit(l, report);
        return;
    };
    let index = rx.borrow().clone();
    let (kind, key) = (report.event.kind, report.event.key.clone());
    match hold.offer(
        report,
        &index,
        l.node_name.as_deref(),
        std::time::Instant::now(),
    ) {
        Some(report) => emit(l, report),
        None => debug!(
            kind = kind.as_str(),
            %key,
            synced = index.synced,
            "confirmed; held (at most 2 s) until the Kubernetes API cache names it"
        ),
    }
}

/// A confirmed report, published to the hub: every writer of confirmed events subscribes there.
fn emit(l: &mut CorrelateLoop, mut report: Confirmation) {
    // The fixes come last: they read the names and facts attribution added.
    let index = l
        .kube_index
        .as_ref()
        .map(|rx| rx.borrow().clone())
        .unwrap_or_default();
    crate::kube::enrich::attach_fixes(&mut report.event, &index, l.provider);
    let e = &report.event;
    let service = e
        .service
        .as_deref()
        .filter(|_| l.tracker.needs_service(e))
        .and_then(|name| index.services().find(|s| s.key() == name))
        .map(service_fields);
    // The latest occurrence's kernel time on the wall clock (the report may have been held).
    let age_ms = monotonic_ns().saturating_sub(e.last_seen_ns) / 1_000_000;
    let seen = unix_now_ms() - i64::try_from(age_ms).unwrap_or(0);
    if let Observed::Regression { episode } = l.tracker.observe(e, service, seen) {
        info!(
            kind = e.kind.as_str(),
            key = %e.key,
            episode,
            "loop confirmed again after its resolution (a regression)"
        );
    }
    if l.tracker.take_changed() {
        l.shared.publish_loops(l.tracker.lifecycle(), None);
    }
    if report.is_new {
        info!(
            kind = report.event.kind.as_str(),
            src = %report.event.src,
            dst = %report.event.dst,
            "confirmed loopback"
        );
    }
    l.shared.evidence_confirmed(&report.event);
    l.shared.publish(report);
}

fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Starts a look-up for the loops due one; returns whether one is out.
fn look_for_proof(tracker: &mut Tracker, tx: &mpsc::Sender<ProofResults>) -> bool {
    let due = tracker.due(unix_now_ms());
    if due.is_empty() {
        return false;
    }
    let tx = tx.clone();
    tokio::task::spawn_blocking(move || {
        let _ = tx.blocking_send(read_proofs(&due));
    });
    true
}

/// One conntrack dump per address family the requests need, the node's timeouts once.
/// Blocking. A failed dump proves nothing (the loops stay quiet) and is said at debug level.
fn read_proofs(due: &[ProofRequest]) -> ProofResults {
    let timeouts = state::conntrack::read_state_timeouts();
    let mut tables: [Option<Vec<state::ConntrackEntry>>; 2] = [None, None];
    due.iter()
        .map(|r| {
            let v6 = r.shape.is_v6();
            let table = tables[usize::from(v6)].get_or_insert_with(|| {
                state::conntrack::dump_family(v6).unwrap_or_else(|error| {
                    debug!(%error, "conntrack dump for a loop's proof");
                    Vec::new()
                })
            });
            // Read now, in the agent's namespace: whether a local user could bind it.
            let local = proof::is_local_address(r.shape.addr());
            let found = proof::find_on_node(&r.shape, table, r.quiet_for_ms, &timeouts, local);
            debug!(
                key = %r.key,
                shape = ?r.shape,
                quiet_for_ms = r.quiet_for_ms,
                entries = table.len(),
                proved = found.is_some(),
                "a quiet loop's proof look-up"
            );
            (r.key.clone(), found)
        })
        .collect()
}

/// The look-up's results: resolutions out to the log and the hub (metrics, Events).
fn proved(l: &mut CorrelateLoop, results: ProofResults) {
    let index = l
        .kube_index
        .as_ref()
        .map(|rx| rx.borrow().clone())
        .unwrap_or_default();
    let now = unix_now_ms();
    let mut resolutions = Vec::new();
    for (key, found) in results {
        let service = l.tracker.service_of(&key).and_then(|name| {
            index
                .services()
                .find(|s| s.key() == name)
                .map(service_fields)
        });
        if let Some(r) = l.tracker.proved(&key, found, service, now) {
            info!(
                kind = r.kind.as_str(),
                key = %r.key,
                service = r.service.as_deref().unwrap_or("-"),
                lasted_s = r.lasted_s,
                proof = %r.proof.join("; "),
                changed = %r.changed.join("; "),
                "loop resolved"
            );
            resolutions.push(r);
        }
    }
    if l.tracker.take_changed() {
        l.shared.publish_loops(l.tracker.lifecycle(), None);
    }
    for r in resolutions {
        l.shared.publish_loops(l.tracker.lifecycle(), Some(r));
    }
}

/// Sends the held reports that can go now.
fn release(hold: &mut Hold, l: &mut CorrelateLoop, now: std::time::Instant) {
    let Some(rx) = &l.kube_index else { return };
    let index = rx.borrow().clone();
    for report in hold.release(&index, l.node_name.as_deref(), now) {
        emit(l, report);
    }
}

/// Resolves when attribution publishes a new index (never when it is off or gone).
async fn index_changed(rx: &mut Option<watch::Receiver<Arc<Index>>>) {
    if let Some(rx) = rx
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

#[cfg(test)]
mod drop_destination_tests {
    use super::*;

    /// Hostile round 4: past the map's capacity the addresses left out were the highest-sorting,
    /// so a tenant with low external IPs chose whose loops were missed. LB IPs go first.
    #[test]
    fn lb_ips_come_before_external_ips_whatever_they_sort_as() {
        let mut table = state::ServiceTable::default();
        for a in ["203.0.113.50", "10.0.0.1", "10.0.0.2", "203.0.113.50"] {
            table.no_endpoint_drops.push(state::NoEndpointDrop {
                addr: a.parse().unwrap(),
                proto: probe_contract::Proto::Tcp,
                port: 80,
                service: None,
            });
        }
        let lb: std::collections::HashSet<std::net::IpAddr> =
            ["203.0.113.50".parse().unwrap()].into();
        let order: Vec<String> = drop_destinations_in_order(&table, &lb)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(order, ["203.0.113.50", "10.0.0.1", "10.0.0.2"]);
    }
}
