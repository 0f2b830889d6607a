//! Conntrack facts, the pure half: how long ago an entry's latest packet passed, and what a
//! pod's call to itself looks like in an entry. The ctnetlink reader is probe-user's
//! `state::conntrack`.

use probe_contract::Proto;

use super::{ConntrackEntry, Tuple};

/// The node's conntrack timeouts per state (`net.netfilter.nf_conntrack_*timeout*`, per
/// network namespace): what a packet resets an entry's timeout to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateTimeouts {
    /// By TCP state name as conntrack spells it (probe-user's `state::conntrack::tcp_state_name`).
    pub tcp: std::collections::BTreeMap<String, u32>,
    /// `nf_conntrack_udp_timeout_stream` (an answered UDP flow is a stream once assured; the
    /// longer of the two is taken, so an age is never underestimated).
    pub udp: u32,
}

impl StateTimeouts {
    /// The kernel's defaults (6.x), for a namespace whose sysctls cannot be read.
    pub fn kernel_defaults() -> Self {
        let tcp = [
            ("SYN_SENT", 120),
            ("SYN_RECV", 60),
            ("ESTABLISHED", 432_000),
            ("FIN_WAIT", 120),
            ("CLOSE_WAIT", 60),
            ("LAST_ACK", 30),
            ("TIME_WAIT", 120),
            ("CLOSE", 10),
        ]
        .into_iter()
        .map(|(s, t)| (s.to_string(), t))
        .collect();
        Self { tcp, udp: 120 }
    }

    /// How long ago the entry's latest packet passed, in seconds: its state's timeout minus
    /// what is left. None without a timeout or a known state. An entry whose timeout was
    /// lowered (unacknowledged data, retransmits) looks older than it is, never younger: an
    /// upper bound. Pure.
    pub fn idle_s(&self, e: &ConntrackEntry) -> Option<u32> {
        let left = e.timeout_s?;
        let full = match e.orig.proto {
            Proto::Tcp => *self.tcp.get(e.tcp_state.as_deref()?)?,
            Proto::Udp => self.udp,
            _ => return None,
        };
        Some(full.saturating_sub(left))
    }
}

/// Whether `e` is the connection of a pod's call to itself, `call` as it reached the pod
/// (pod:client port -> pod:endpoint port, after DNAT): sent from the call's source, answered
/// from the call's destination, masqueraded or not (the reply's destination is the pod, or
/// the node's address when the call was SNATed). Pure.
pub fn is_self_call(e: &ConntrackEntry, call: &Tuple) -> bool {
    e.orig.proto == call.proto
        && e.orig.src == call.src
        && e.orig.sport == call.sport
        && e.reply.src == call.dst
        && e.reply.sport == call.dport
}
