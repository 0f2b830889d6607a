//! The correlator's questions to the node's state, answered beside the correlation loop: the
//! egress map synchronously (a bounded map read), everything that talks netlink or reads
//! sysfs on the blocking pool, each answer sent back on the loop's answer channel.

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::debug;

use crate::{
    correlate::{Answer, Query},
    hub::capability::{Capabilities, Capability},
    kernel::{
        counters::EgressTable,
        reader::{self, IfNames},
    },
    state,
};

/// Answers a correlator query: the egress map synchronously (a bounded map read), conntrack
/// on the blocking pool (a netlink round trip). A failed conntrack look-up is answered as a
/// failure (not as "no entry") and flips the conntrack capability (one WARN).
pub(super) fn answer_query(
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
        Query::Listener {
            id,
            addr,
            port,
            proto,
        } => answer_blocking(tx, move || Answer::Listener {
            id,
            listener: state::sockets::listener(addr, port, proto)
                .map_err(|e| read_failed("listener look-up", e)),
        }),
        Query::SelfLoop {
            id,
            tuple,
            iface,
            reply_dropped,
        } => {
            let caps = caps.clone();
            answer_blocking(tx, move || {
                answer_self_loop(id, &tuple, reply_dropped, iface.as_deref(), &caps)
            });
        }
        Query::Programmed {
            id,
            mode,
            addr,
            port,
            proto,
        } => answer_blocking(tx, move || Answer::Programmed {
            id,
            read: state::dataplane::programmed(mode, addr, port, proto)
                .map_err(|e| read_failed("dataplane read for a refused VIP port", e)),
        }),
        Query::Conntrack { id, tuple } => {
            let caps = caps.clone();
            answer_blocking(tx, move || match lookup_conntrack(&tuple) {
                Ok(entry) => {
                    caps.set(Capability::Conntrack, true, "");
                    Answer::Conntrack { id, entry }
                }
                Err(error) => {
                    debug!(%error, "conntrack lookup");
                    caps.set(Capability::Conntrack, false, &error.0);
                    Answer::ConntrackFailed { id, error: error.0 }
                }
            });
        }
    }
}

/// Runs `answer` (a netlink or sysfs read) on the blocking pool and sends what it answers.
fn answer_blocking(tx: &mpsc::Sender<Answer>, answer: impl FnOnce() -> Answer + Send + 'static) {
    let tx = tx.clone();
    tokio::task::spawn_blocking(move || {
        let _ = tx.blocking_send(answer());
    });
}

/// A read that failed, as the correlator is answered (logged at debug as `what`).
fn read_failed(what: &str, error: impl std::fmt::Display) -> state::ReadFailed {
    debug!(error = %error, "{what}");
    state::ReadFailed(error.to_string())
}

/// A pod's call to its own Service looped: conntrack by the reply tuple (the call reversed:
/// the answer it would get without SNAT), and the node's pieces of the hairpin. When the
/// packet dropped was the call's answer, the call was masqueraded and the entry's reply tuple
/// holds the node's address: then the caller's entries from its port are searched (a dump
/// the kernel filters) for the call's connection
/// ([`state::conntrack::is_self_call`]; one dump per confirmed connect, retransmits fold).
/// Blocking (netlink, `ipset`, sysfs).
fn answer_self_loop(
    id: u64,
    call: &state::Tuple,
    reply_dropped: bool,
    iface: Option<&str>,
    caps: &Capabilities,
) -> Answer {
    let conntrack = if let Some(injected) = std::env::var_os(CONNTRACK_FAIL_ENV) {
        Err(state::ReadFailed(injected.to_string_lossy().into_owned()))
    } else {
        state::conntrack::lookup_reply(&call.reversed())
            .and_then(|found| match found {
                // Only the caller's entries from its port cross netlink (the kernel filters
                // on Linux >= 5.8), not the whole table per question.
                None if reply_dropped => Ok(state::conntrack::dump_filtered(
                    &state::conntrack::OrigFilter {
                        src: Some(call.src),
                        proto: Some(call.proto),
                        sport: Some(call.sport),
                        ..Default::default()
                    },
                )?
                .into_iter()
                .find(|e| state::conntrack::is_self_call(e, call))),
                found => Ok(found),
            })
            .map_err(|e| state::ReadFailed(e.to_string()))
    };
    match &conntrack {
        Ok(_) => caps.set(Capability::Conntrack, true, ""),
        Err(error) => caps.set(Capability::Conntrack, false, &error.0),
    };
    let (bridge_port, br_netfilter) = state::bridge::read(call.src, iface);
    let facts = state::SelfLoopFacts {
        loop_back_entry: state::ipset::read_loop_back_entry(call.src, call.proto, call.dport),
        bridge_port,
        br_netfilter,
    };
    debug!(?facts, "self-loop: the node's hairpin pieces");
    Answer::SelfLoop {
        id,
        conntrack,
        facts,
    }
}

/// Environment hook for tests: conntrack look-ups fail with this error instead of running
/// (a conntrack failure cannot be provoked reliably in a lab namespace).
pub const CONNTRACK_FAIL_ENV: &str = "CLB_PROBE_TEST_CONNTRACK_ERROR";

/// One conntrack look-up; errors as text (the correlator only reports them).
fn lookup_conntrack(
    tuple: &state::Tuple,
) -> Result<Option<state::ConntrackEntry>, state::ReadFailed> {
    if let Some(injected) = std::env::var_os(CONNTRACK_FAIL_ENV) {
        return Err(state::ReadFailed(injected.to_string_lossy().into_owned()));
    }
    state::conntrack::lookup(tuple).map_err(|e| state::ReadFailed(e.to_string()))
}
