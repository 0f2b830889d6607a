//! What the agent says about itself: the node's status, the kernel's features, and the
//! counters of the kernel programs and the correlator, as plain data (the live view's
//! snapshot and the metrics read these).

use std::{collections::BTreeMap, fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::event::{Proto, Tag};

/// What the node looks like to the probe now; published to the metrics and the live view.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeStatus {
    pub attached: Vec<(String, u32)>,
    pub nics: Vec<String>,
    pub vip_iface: String,
    pub vip_iface_present: bool,
    pub vips: Vec<IpAddr>,
    /// Prefixes the kernel maps hold, by tag (not what the node has: see `left_out`).
    pub set_sizes: BTreeMap<String, usize>,
    /// Prefixes of the node that did not fit in the kernel maps (`--address-entries`), by tag.
    pub left_out: BTreeMap<String, usize>,
    /// `--address-entries`: the capacity of each kernel address map.
    pub address_capacity: u32,
    /// kube-proxy's drop destinations (addresses of its no-endpoint drops and its
    /// loadBalancerSourceRanges firewall entries) that did not fit the drop program's watched
    /// destinations (`--address-entries`; LB IPs are kept first): a pod's call dropped at one
    /// of them is not confirmed (issue #49, H5).
    pub drop_destinations_left_out: usize,
    /// Local (`vip` and `node`) addresses by owner label (`kube-ipvs0`, `nic:eth0`,
    /// `route:66`): the metrics' `clbprobe_local_address_owners`.
    pub owner_counts: BTreeMap<String, usize>,
    pub features: Option<Features>,
    /// True once programs are attached and the address sets are loaded.
    pub ready: bool,
    /// What serves the node's Services, as `probe check` names it: `kube-proxy iptables`,
    /// `kube-proxy ipvs`, `kube-proxy nftables`, or without kube-proxy's rules `none (cilium)`
    /// / `none (unknown)`; empty until the first service table is read.
    pub dataplane: String,
}

/// How programs are attached on this kernel; shown in the live view and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum TcMode {
    /// tcx links (kernel >= 6.6): detach when the agent's fds close, even on SIGKILL.
    Tcx,
    /// cls_bpf under a clsact qdisc (older kernels): ours (by name and handle) removed on start
    /// and exit, the qdisc only when the agent added it and nothing else uses it.
    Netlink,
}

impl TcMode {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TcMode::Tcx => "tcx",
            TcMode::Netlink => "netlink",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropHook {
    TpBtf,
    RawTracepoint,
    /// No drop visibility (the kernel refused both hooks): suspects are still counted.
    None,
}

impl DropHook {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DropHook::TpBtf => "tp_btf",
            DropHook::RawTracepoint => "raw_tracepoint",
            DropHook::None => "none",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    pub tc_mode: TcMode,
    pub drop_hook: DropHook,
    /// Whether the drop hook gets the kernel's reason (>= 5.17); without it drops are
    /// classified by their site.
    pub drop_reason_arg: bool,
    pub kernel: String,
    pub drop_reasons: usize,
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel {}, tc via {:?}, drops via {:?} ({}), {} drop reasons",
            self.kernel,
            self.tc_mode,
            self.drop_hook,
            if self.drop_reason_arg {
                "with the reason"
            } else {
                "no reason argument: classified by drop site"
            },
            self.drop_reasons
        )
    }
}

/// One summed read of every counter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CounterSnapshot {
    /// (ifindex, tag, protocol) -> packets.
    pub suspects: Vec<(u32, Tag, Proto, u64)>,
    /// (reason code, source tag, destination tag) -> drops.
    pub drops: Vec<(u32, Option<Tag>, Option<Tag>, u64)>,
    pub budget_suppressed: u64,
    /// The same by budget class: (record kind, source tag or `other`) -> events; every class
    /// the kernel can emit, zeros included (`probe_common::budget`).
    pub budget_suppressed_by_class: Vec<(String, String, u64)>,
    pub ringbuf_full: u64,
    pub dedup_suppressed: u64,
    pub emitted: u64,
    pub egress_recorded: u64,
    pub drops_matched: u64,
    /// Immediate reader wake-ups by confirming records, and those the wake-up budget refused.
    pub wakeups: u64,
    pub wakeup_budget_suppressed: u64,
}

impl CounterSnapshot {
    /// Suspect packets of one tag, all interfaces and protocols.
    pub fn suspects_of(&self, tag: Tag) -> u64 {
        self.suspects
            .iter()
            .filter(|(_, t, _, _)| *t == tag)
            .map(|(.., n)| n)
            .sum()
    }
}

/// Suspects seen, by source tag.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TagCounts {
    pub node: u64,
    pub vip: u64,
    pub pod: u64,
    pub untagged: u64,
}

impl TagCounts {
    pub fn total(&self) -> u64 {
        self.node + self.vip + self.pod + self.untagged
    }
}

pub use crate::event::KindCounts;

/// Counters. Invariants (checked by the tests):
/// `suspects_seen.total() == suspects_confirmed + suspects_unconfirmed + pending_suspects`,
/// `drops_seen == drops_confirming + drops_unmatched + pending_drops`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CorrelatorStats {
    pub suspects_seen: TagCounts,
    /// Suspects that are part of a confirmed event.
    pub suspects_confirmed: u64,
    /// Suspects that were not confirmed (window passed, no egress record, SNAT seen, no
    /// rule for their tag, or no room).
    pub suspects_unconfirmed: u64,
    pub drops_seen: u64,
    /// Drops that are part of a confirmed event.
    pub drops_confirming: u64,
    /// Drops that confirmed nothing.
    pub drops_unmatched: u64,
    pub confirmed: KindCounts,
    /// Suspects currently waiting (for a drop, an answer, or the settle time).
    pub pending_suspects: u64,
    /// Drops currently waiting for their suspect.
    pub pending_drops: u64,
    /// Pending entries (suspects, drops, hairpin candidates); never above `max_pending`.
    pub pending: u64,
    /// Suspects or drops turned away because `max_pending` was reached.
    pub pending_overflow: u64,
    /// Hairpin candidates dismissed because conntrack showed the egress flow SNATed.
    pub hairpin_snat_seen: u64,
    /// Hairpin candidates dismissed because no egress record matched (or no answer came).
    pub hairpin_no_egress: u64,
    /// Hairpin candidates dismissed because the suspect went to neither a NodePort of a
    /// node address nor a local pod (no LB backend).
    pub hairpin_not_a_backend: u64,
    /// Hairpin candidates dismissed because conntrack showed the connection answered
    /// (layer-4 egress flow with a reply, or the looping flow established): no failure.
    pub hairpin_answered: u64,
    /// Suspects and drops of an already confirmed connect attempt (SYN retransmits), folded
    /// into its confirmation instead of counting it again.
    pub hairpin_retries_folded: u64,
    /// Conntrack look-ups that failed (not "no entry"): SNAT or outcome reported unknown.
    pub conntrack_failures: u64,
    pub queries_issued: u64,
    pub queries_expired: u64,
    /// Answers to unknown (expired or already answered) queries.
    pub answers_stale: u64,
    pub aggregates: u64,
    pub aggregates_evicted: u64,
    /// TCP SYNs seen leaving a NIC with a bound VIP as source (each confirms `vip_as_source`).
    pub vip_egress_seen: u64,
    /// Self-loop drops dismissed because conntrack showed the call SNATed after all.
    pub self_loop_snat_seen: u64,
    /// Drops of an already confirmed (or pending) self-loop connect (SYN retransmits), folded
    /// into its confirmation.
    pub self_loop_retransmits: u64,
}
