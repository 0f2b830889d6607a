//! The agent's `/metrics` families (and their OTLP twins): one table, [`FAMILIES`], that the
//! agent renders from and every reader names a family by (`metrics::LOOPBACK_EVENTS.name()`),
//! so a family's name, type, labels and help exist once.
//!
//! Names are the contract: a family is only ever added. Exposition adds `_total` to counter
//! samples (`clbprobe_loopback_events_total`); [`Family::sample`] gives that spelling. The
//! standard `process_*` families are not listed: their names are Prometheus'.

/// Every family's name starts with this and `_`.
pub const PREFIX: &str = "clbprobe";

/// A counter only goes up (sampled with `_total`); a gauge is a level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
}

/// One metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// Without [`PREFIX`] (`loopback_events`).
    pub short: &'static str,
    pub kind: Type,
    /// Label names, in the order the agent's rows give their values.
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

impl Family {
    /// `clbprobe_loopback_events`.
    pub fn name(&self) -> String {
        format!("{PREFIX}_{}", self.short)
    }

    /// The sample's name as scraped: counters end in `_total`.
    pub fn sample(&self) -> String {
        match self.kind {
            Type::Counter => format!("{PREFIX}_{}_total", self.short),
            Type::Gauge => self.name(),
        }
    }
}

macro_rules! families {
    ($($id:ident: $kind:ident $short:literal [$($label:literal),*] $help:literal;)*) => {
        $(
            #[doc = $help]
            pub const $id: Family = Family {
                short: $short,
                kind: Type::$kind,
                labels: &[$($label),*],
                help: $help,
            };
        )*
        /// Every family, in exposition order.
        pub const FAMILIES: &[Family] = &[$($id),*];
    };
}

families! {
    LOOPBACK_EVENTS: Counter "loopback_events" ["kind", "vip", "port"]
        "Confirmed load-balancer loopback events, by kind, VIP and VIP port";
    SUSPECT_PACKETS: Counter "suspect_packets" ["nic", "source"]
        "Packets arriving on a NIC with one of the node's own addresses as source (exact kernel counts)";
    KERNEL_DROPS: Counter "kernel_drops" ["reason"]
        "Kernel drops of suspect packets and of packets to bound VIPs, by kernel drop reason";
    EVENTS_SUPPRESSED: Counter "events_suppressed" ["stage"]
        "Events not delivered: kernel budget, full ring buffer, kernel per-flow dedup, userspace queue";
    EVENTS_BUDGET_SUPPRESSED: Counter "events_budget_suppressed" ["record", "source"]
        "Kernel records the per-CPU budget suppressed, by record kind and source (each pair has its own budget)";
    LOCAL_ADDRESSES: Gauge "local_addresses" ["set"]
        "Prefixes of the node's address sets held in the kernel maps the datapath matches against";
    LOCAL_ADDRESSES_LEFT_OUT: Gauge "local_addresses_left_out" ["set"]
        "Prefixes of the node not in the kernel maps because they are full (--address-entries): their traffic is not seen";
    LOCAL_ADDRESSES_CAPACITY: Gauge "local_addresses_capacity" []
        "Entries each kernel address map holds (--address-entries; IPv4 and IPv6 hosts and prefixes each have a map)";
    DROP_DESTINATIONS_LEFT_OUT: Gauge "drop_destinations_left_out" []
        "kube-proxy drop destinations (addresses of its no-endpoint drops and loadBalancerSourceRanges firewall entries) over --address-entries: a pod's call dropped at one of them is not confirmed; LB IPs are kept first";
    LOCAL_ADDRESS_OWNERS: Gauge "local_address_owners" ["owner"]
        "Local addresses (node and VIP sets) by what made them local: the VIP interface (kube-ipvs0), an address on a NIC (nic:NAME), a local route of table local (route:PROTOCOL, 66 = cloud guest agent)";
    LOOPBACK_EVENTS_BY_OWNER: Counter "loopback_events_by_owner" ["kind", "owner"]
        "Confirmed loopback events whose local address has a known owner, by kind and owner (see local_address_owners)";
    BUILD_INFO: Gauge "build_info" ["version", "kernel"]
        "Build and kernel of this agent";
    CAPABILITY: Gauge "capability" ["name"]
        "1 when the agent can confirm what this needs (drop_hook, drop_sites, conntrack), 0 when it cannot (said once in the log)";
    KUBE_EVENT_WRITES: Counter "kube_event_writes" ["result"]
        "Kubernetes Event writes by result: created, patched, failed (403, unreachable), rate_limited (held by the token bucket), dropped (reports missed by the writer)";
    KUBE_WRITES_FAILED: Counter "kube_writes_failed" ["object"]
        "Failed writes of the node report's objects: report (the LoopbackReport), condition (the Node condition); retried with a backoff up to the heartbeat";
    NODE_REPORT_REFUSED: Gauge "node_report_refused" ["reason"]
        "1 while the agent writes no node report or condition, by reason: pod_on_other_node (its Pod is scheduled on another node than --node-name), own_pod_unreadable (cannot read its Pod yet)";
    ATTACHED_INTERFACES: Gauge "attached_interfaces" []
        "Interfaces with the tc programs attached";
    READY: Gauge "ready" []
        "1 when programs are attached and the address sets loaded";
    KUBE_CONNECTED: Gauge "kube_connected" []
        "1 when Kubernetes attribution lists and watches pods, Services and EndpointSlices; 0 without API access (events are then not named)";
    VIP_INTERFACE_PRESENT: Gauge "vip_interface_present" []
        "1 when the --vip-iface interface exists (health-check blackholes are detected only then)";
    CORRELATOR_PENDING: Gauge "correlator_pending" []
        "Suspects, drops and hairpin candidates awaiting confirmation";
    UNCONFIRMED_SUSPECTS: Counter "unconfirmed_suspects" []
        "Suspects that no rule confirmed (counted, never reported as loopback)";
    KERNEL_EVENTS_READ: Counter "kernel_events_read" []
        "Records read from the kernel ring buffer";
    KERNEL_READER_WAKEUPS: Counter "kernel_reader_wakeups" []
        "Immediate ring buffer reader wake-ups by records that can confirm an event";
    KERNEL_READER_WAKEUPS_SUPPRESSED: Counter "kernel_reader_wakeups_suppressed" []
        "Confirming records left to the reader's timer: the per-CPU wake-up budget was spent";
    OUTPUT_LINES_LOST: Counter "output_lines_lost" ["output"]
        "JSON lines --events / --record did not write: its writer fell behind (a reader that stops reading, a stalled disk) or the write failed; detection is never held back";
    OUTPUT_STALLED: Gauge "output_stalled" ["output"]
        "1 while a write to --events / --record has been blocked for more than a second";
    OTLP_EXPORTED: Counter "otlp_exported" ["signal"]
        "--otlp-endpoint: log records (signal=logs, one per confirmed event) and metric exports (signal=metrics) the receiver accepted";
    OTLP_DROPPED: Counter "otlp_dropped" ["signal"]
        "--otlp-endpoint: log records lost (queue full: the receiver is slow or down; export failed or timed out) and metric exports that failed; detection is never held back";
    LOOPBACK_ACTIVE: Gauge "loopback_active" ["kind"]
        "Confirmed loops still recurring (confirmed within --resolve-after), by kind";
    LOOPBACK_QUIET: Gauge "loopback_quiet" ["kind"]
        "Loops no longer confirmed but not proven gone: no answered traffic of their shape seen since, by kind";
    LOOPBACK_RESOLUTIONS: Counter "loopback_resolutions" ["kind"]
        "Loops resolved: unconfirmed for --resolve-after while their traffic was seen answered, by kind";
    LOOPBACK_REGRESSIONS: Counter "loopback_regressions" ["kind"]
        "Resolved loops confirmed again (each opens a new Warning Event), by kind";
    CANARY_TESTS: Counter "canary_tests" ["outcome"]
        "--canary-every: the canary's node-sourced tests of LB IP:ports, by outcome (confirmed, not_proven, clean, not_testable); its confirmations carry facts.canary and are not user traffic";
    VERIFY_REQUESTS: Counter "verify_requests" ["phase"]
        "LoopbackVerification requests this agent answered, by phase (done, refused)";
    VERIFY_RATE_LIMITED: Counter "verify_rate_limited" ["limit"]
        "LoopbackVerification requests refused by a rate limit, by limit: node (6 a minute) or requester (3 a minute from one requester annotation)";
}
