//! Readers of kernel state, one module per source. Each returns plain data (the types below),
//! so the correlator can be fed recorded snapshots in tests.
//!
//! - `changes`: cheap signals that the service table may have changed (nf_tables commits,
//!   the legacy tables' sizes, an IPVS service digest), so it is read on change;
//! - `addrs`: interface addresses and routes (rtnetlink), shared with the datapath's sync;
//! - `conntrack`: ctnetlink lookups: was a flow SNATed, what happened to it;
//! - `dataplane`: beside the API's table, what only the rules say (masquerade, NodePorts as
//!   programmed, the access filter), and what kube-proxy programmed for one VIP:port;
//! - `iptables`: kube-proxy's nat rules (the nf_tables backend over netlink, the legacy one
//!   from `iptables-legacy-save`);
//! - `ipset`: kube-proxy's IPVS-mode ipsets naming externalTrafficPolicy Local NodePorts;
//! - `ipvs`: IPVS virtual services over generic netlink (absent on kernels without IPVS);
//! - `nftables`: kube-proxy's nftables-mode tables `ip|ip6 kube-proxy`, over netlink;
//! - `nft_netlink`: the nf_tables netlink client of those two (generation, rules, maps);
//! - `sockets`: which socket (and process) serves a port, over sock_diag;
//! - `bridge`: a pod's bridge port and its `hairpin_mode`, and br_netfilter's sysctl (sysfs and
//!   procfs), for a pod that called its own Service (`service_self_loop`).

use std::{
    hash::{DefaultHasher, Hasher},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use probe_contract::Proto;
// The plain data the readers fill lives in the pure core (the correlator reads it); the
// readers below fill it.
pub use probe_core::state::{
    BridgePort, ConntrackEntry, HealthCheckPort, NODEPORT_RANGE, NoEndpointDrop, NoEndpointReject,
    NodePortEntry, PodShortCircuit, ReadFailed, SelfLoopFacts, ServesIndex, ServiceEntry,
    ServiceSource, ServiceTable, Tuple,
};

pub mod addrs;
pub mod bridge;
pub mod changes;
pub mod conntrack;
pub mod dataplane;
pub mod ipset;
pub mod iptables;
pub mod ipvs;
pub mod ipvs_firewall;
pub mod netns;
pub mod nft_firewall;
pub mod nft_json;
pub mod nft_netlink;
pub mod nftables;
pub mod proxy_mode;
pub mod sockets;

/// Skip re-parsing a dump identical to the last one (on by default; off only for the bench's
/// timer-driven baseline, the reader as it was before).
static REUSE_PARSES: AtomicBool = AtomicBool::new(true);

pub fn set_reuse_parses(on: bool) {
    REUSE_PARSES.store(on, Ordering::Relaxed);
}

/// Whether earlier reads may be reused (see [`set_reuse_parses`]); off, every read is whole.
pub fn reuse_parses() -> bool {
    REUSE_PARSES.load(Ordering::Relaxed)
}

/// The last parse of each dump (by the command that printed it), reused while the dump is
/// the same: kube-proxy re-syncing with unchanged content costs the dump and a hash, not a
/// parse. The whole text is hashed (SipHash, ~1 GB/s; no sampling that could miss a
/// one-character change) but for what changes without the rules changing (see `digest`).
pub(crate) struct ParseCache<T> {
    last: Mutex<Vec<(String, u64, T)>>,
}

impl<T: Clone> ParseCache<T> {
    pub(crate) const fn new() -> Self {
        Self {
            last: Mutex::new(Vec::new()),
        }
    }

    /// `digest` feeds the hasher with what of `text` matters: dumps carry things that change
    /// while the rules do not (iptables-save's date line and chain counters, nft's handles).
    pub(crate) fn parse(
        &self,
        key: &str,
        text: &str,
        digest: impl FnOnce(&str, &mut DefaultHasher),
        parse: impl FnOnce(&str) -> T,
    ) -> T {
        if !REUSE_PARSES.load(Ordering::Relaxed) {
            return parse(text);
        }
        let mut h = DefaultHasher::new();
        digest(text, &mut h);
        let hash = h.finish();
        if let Ok(last) = self.last.lock()
            && let Some((_, _, parsed)) = last.iter().find(|(k, h, _)| k == key && *h == hash)
        {
            return parsed.clone();
        }
        let parsed = parse(text);
        if let Ok(mut last) = self.last.lock() {
            last.retain(|(k, _, _)| k != key);
            last.push((key.to_string(), hash, parsed.clone()));
        }
        parsed
    }
}

/// The node's service table: IPVS when the kernel has it and it holds services (IPVS mode),
/// else kube-proxy's nftables tables when they hold services (nftables mode), else
/// kube-proxy's iptables rules. The iptables masquerade rules and NodePorts are kept in
/// both cases: IPVS mode still programs them in the nat table. Blocking (runs commands).
pub fn read_services() -> anyhow::Result<ServiceTable> {
    read_services_after(&changes::Touched::everything())
}

/// [`read_services`], re-reading of the nf_tables-backed iptables rules and of kube-proxy's
/// nftables tables only the chains and maps `touched` names (see [`iptables`]'s and
/// [`nftables`]'s docs).
pub fn read_services_after(touched: &changes::Touched) -> anyhow::Result<ServiceTable> {
    let iptables = iptables::read_blocking_after(touched);
    let ipvs = ipvs::read()?;
    match (ipvs, iptables) {
        (Some(mut table), Ok(ipt)) if !table.services.is_empty() => {
            // Names come from kube-proxy's rule comments when iptables knows the same VIP:port.
            for svc in &mut table.services {
                if let Some(named) = ipt.serves(svc.vip, svc.port, svc.proto) {
                    svc.service = named.service.clone();
                }
            }
            table.nodeports = ipt.nodeports;
            table.masquerade_rules = ipt.masquerade_rules;
            table.access_filter = ipt.access_filter;
            add_ipvs_nodeports(&mut table);
            ipset::read_ipvs_sets(&mut table);
            Ok(table)
        }
        (Some(mut table), Err(e)) if !table.services.is_empty() => {
            tracing::debug!(error = %e, "iptables unreadable; IPVS only");
            add_ipvs_nodeports(&mut table);
            ipset::read_ipvs_sets(&mut table);
            Ok(table)
        }
        (_, iptables) => match nftables::read_blocking_after(touched) {
            // nftables mode: its services and NodePorts; masquerade rules from both (a CNI's
            // masquerade chain may still live in iptables).
            Ok(Some(mut nft)) if !nft.services.is_empty() || !nft.nodeports.is_empty() => {
                if let Ok(ipt) = iptables {
                    for m in ipt.masquerade_rules {
                        if !nft.masquerade_rules.contains(&m) {
                            nft.masquerade_rules.push(m);
                        }
                    }
                }
                Ok(nft)
            }
            Err(e) if iptables.is_err() => Err(e.into()),
            other => {
                if let Err(e) = other {
                    tracing::debug!(error = %e, "kube-proxy's nftables tables unreadable");
                }
                Ok(iptables?)
            }
        },
    }
}

/// IPVS mode has no per-Service NodePort rules in the nat table (one ipset,
/// `KUBE-NODE-PORT-TCP`, marks them all): a NodePort is a virtual service on a port of the
/// NodePort range. Each one the iptables rules did not name is added (unnamed, Cluster policy).
pub fn add_ipvs_nodeports(table: &mut ServiceTable) {
    let found: Vec<(u16, Proto)> = table
        .services
        .iter()
        .filter(|s| NODEPORT_RANGE.contains(&s.port))
        .map(|s| (s.port, s.proto))
        .collect();
    for (port, proto) in found {
        if table.nodeport(port, proto).is_none() {
            table.nodeports.push(NodePortEntry {
                port,
                proto,
                service: None,
                local_only: false,
            });
        }
    }
}

#[cfg(test)]
pub(crate) mod test_data;
#[cfg(test)]
pub(crate) mod test_netns;
