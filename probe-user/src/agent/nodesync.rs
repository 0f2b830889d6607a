//! Keeps the kernel in step with the node: address tries, the NIC set, and attachments.
//!
//! Any rtnetlink link/address/route notification triggers a full re-read (debounced), a pure
//! classification and a diff against what the maps hold: simpler and more robust than applying
//! individual notifications, and cheap (a node has hundreds of addresses, not millions).
//!
//! A set larger than `--address-entries` is not an error: the maps hold the deterministic subset
//! [`addrs::fit`] chooses (node addresses, then pods, then VIPs, each by address), the status
//! and `clbprobe_local_addresses` say what the maps hold (not what the node has),
//! `clbprobe_local_addresses_left_out` and a WARN say what is missing and which flag to raise.
//! A resync that fails (a map write refused) is retried with backoff (1 s doubling to 30 s),
//! not only on the next address change.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt as _;
use probe_common::AddrValue;
use probe_contract::{NodeStatus, Tag};
use rtnetlink::{Handle, MulticastGroup};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::{
    kernel::{AddressMaps, KernelError, Probe, prefilter, reader::IfNames},
    state::{
        addrs,
        addrs::{AddrConfig, AddressSets, Owners, Prefix},
    },
};

pub struct NodeSync {
    probe: Probe,
    maps: AddressMaps,
    cfg: AddrConfig,
    /// `--address-entries`: entries of each of the four address maps.
    capacity: u32,
    in_maps: BTreeMap<Prefix, Tag>,
    /// What the last sync left out, by tag (said on change).
    left_out: BTreeMap<Tag, usize>,
    /// The prefilter words last written.
    prefilter: Vec<u64>,
    nics_in_map: BTreeSet<u32>,
    ifnames: IfNames,
    status: watch::Sender<NodeStatus>,
    owners: watch::Sender<Owners>,
    /// Whether `--vip-iface` existed at the last sync (None before the first): said on change.
    vip_iface_seen: Option<bool>,
    /// Configured NICs already said absent: one WARN per absence, not one per resync.
    nics_said_absent: BTreeSet<String>,
}

/// Debounce for bursts of notifications (kube-proxy adds hundreds of addresses at once).
const DEBOUNCE: Duration = Duration::from_millis(100);
/// A failed resync is retried after this, doubling up to [`RETRY_MAX`], until one succeeds.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

impl NodeSync {
    pub fn new(
        probe: Probe,
        maps: AddressMaps,
        cfg: AddrConfig,
        capacity: u32,
        ifnames: IfNames,
        status: watch::Sender<NodeStatus>,
        owners: watch::Sender<Owners>,
    ) -> Self {
        Self {
            probe,
            maps,
            cfg,
            capacity,
            in_maps: BTreeMap::new(),
            left_out: BTreeMap::new(),
            // The map starts zeroed.
            prefilter: vec![0; probe_common::prefilter::WORDS as usize],
            nics_in_map: BTreeSet::new(),
            ifnames,
            status,
            owners,
            vip_iface_seen: None,
            nics_said_absent: BTreeSet::new(),
        }
    }

    /// One full sync: read, classify, write maps, attach.
    pub async fn sync(&mut self, handle: &Handle) -> anyhow::Result<AddressSets> {
        let state = addrs::read(handle).await?;
        if let Ok(mut names) = self.ifnames.write() {
            *names = state
                .links
                .iter()
                .map(|l| (l.index, l.name.clone()))
                .collect();
        }
        let sets = addrs::classify(&state, &self.cfg);
        self.say_vip_iface(sets.vip_iface.is_some());
        let fitted = addrs::fit(&sets.prefixes, self.capacity);
        self.say_left_out(&fitted.left_out);
        // What the maps hold is published even when a write below fails.
        let applied = self.apply_prefixes(&fitted.kept);
        self.apply_attachments(&sets)?;
        self.publish(&sets);
        applied?;
        Ok(sets)
    }

    /// A WARN when the sets stop fitting, a line when they fit again (changes in between are
    /// for the gauge): the datapath does not see the addresses left out.
    fn say_left_out(&mut self, left_out: &BTreeMap<Tag, usize>) {
        if *left_out == self.left_out {
            return;
        }
        let total: usize = left_out.values().sum();
        let before: usize = self.left_out.values().sum();
        if total > 0 && before > 0 {
            // Still short, by another count: the gauge follows, the WARN was said.
            debug!(
                left_out = total,
                "address sets still exceed --address-entries"
            );
        } else if total == 0 {
            info!(
                capacity = self.capacity,
                "address sets fit in the kernel maps again"
            );
        } else {
            let by_set = left_out
                .iter()
                .map(|(t, n)| format!("{} {n}", t.as_str()))
                .collect::<Vec<_>>()
                .join(", ");
            warn!(
                left_out = total,
                by_set = %by_set,
                capacity = self.capacity,
                "address sets exceed --address-entries: {total} addresses are not in the kernel \
                 maps ({by_set}) and their traffic is not seen; raise --address-entries \
                 (now {}) above the node's count",
                self.capacity
            );
        }
        self.left_out = left_out.clone();
    }

    fn apply_prefixes(&mut self, want: &BTreeMap<Prefix, Tag>) -> anyhow::Result<()> {
        let stale: Vec<Prefix> = self
            .in_maps
            .iter()
            .filter(|(p, t)| want.get(p) != Some(t))
            .map(|(p, _)| *p)
            .collect();
        for p in stale {
            if let Err(e) = self.remove_prefix(p) {
                debug!(prefix = %p, error = %e, "remove");
            }
            self.in_maps.remove(&p);
        }
        // A refused write leaves that prefix out (the maps and `in_maps` agree) and the others
        // still go in; the sync then fails and is retried.
        let mut refused = None;
        for (p, tag) in want {
            if self.in_maps.get(p) == Some(tag) {
                continue;
            }
            let value = AddrValue {
                tag: tag.to_raw(),
                _pad: [0; 3],
            };
            match self.insert_prefix(*p, value) {
                Ok(()) => {
                    self.in_maps.insert(*p, *tag);
                }
                Err(e) => {
                    // An update over an entry of another tag may have failed: not held.
                    self.in_maps.remove(p);
                    refused.get_or_insert_with(|| anyhow::anyhow!("writing {p}: {e}"));
                }
            }
        }
        // The programs skip the IPv6 trie when it is empty: keep its size current.
        let v6_prefixes = self
            .in_maps
            .keys()
            .filter(|p| p.addr.is_ipv6() && !p.is_host())
            .count() as u32;
        self.maps.set_v6_trie_size(v6_prefixes)?;
        // The prefilter last: bits for new addresses are set once their entries exist, bits
        // of removed ones cleared after their entries went (a set bit only means "look up").
        let words = prefilter::words(self.in_maps.keys());
        for (i, (new, old)) in words.iter().zip(self.prefilter.iter_mut()).enumerate() {
            if new != old {
                self.maps.set_prefilter_word(i as u32, *new)?;
                *old = *new;
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// Host addresses go to the hash, shorter prefixes to the trie.
    fn insert_prefix(&mut self, p: Prefix, value: AddrValue) -> Result<(), KernelError> {
        self.maps.insert_prefix(p, value)
    }

    fn remove_prefix(&mut self, p: Prefix) -> Result<(), KernelError> {
        self.maps.remove_prefix(p)
    }

    fn apply_attachments(&mut self, sets: &AddressSets) -> anyhow::Result<()> {
        let want: BTreeMap<String, u32> = sets
            .nics
            .iter()
            .cloned()
            .chain(sets.vip_iface.iter().cloned())
            .collect();
        for (name, _) in self.probe.attached() {
            if !want.contains_key(&name) {
                self.probe.forget(&name);
            }
        }
        for (name, ifindex) in &want {
            self.probe.attach(name, *ifindex)?;
        }
        let nic_indexes: BTreeSet<u32> = sets.nics.iter().map(|(_, i)| *i).collect();
        for gone in self.nics_in_map.difference(&nic_indexes) {
            let _ = self.maps.remove_nic(*gone);
        }
        for new in nic_indexes.difference(&self.nics_in_map) {
            self.maps.add_nic(*new)?;
        }
        self.nics_in_map = nic_indexes;
        for configured in &self.cfg.nics {
            if sets.nics.iter().any(|(n, _)| n == configured) {
                self.nics_said_absent.remove(configured);
            } else if self.nics_said_absent.insert(configured.clone()) {
                warn!(
                    iface = configured,
                    "configured NIC is absent; will attach when it appears"
                );
            }
        }
        Ok(())
    }

    /// An absent VIP interface turns health-check detection off until it appears: a WARN
    /// when it is (or goes) missing, a line when it comes back (`clbprobe_vip_interface_present`
    /// follows it too).
    fn say_vip_iface(&mut self, present: bool) {
        let iface = self.cfg.vip_iface.as_str();
        match (self.vip_iface_seen, present) {
            (Some(before), now) if before == now => {}
            (_, false) => warn!(
                iface,
                "VIP interface absent: health-check blackholes cannot be detected until it \
                 appears (normal with kube-proxy in iptables mode); waiting for it"
            ),
            (Some(false), true) => info!(iface, "VIP interface appeared; its VIPs are watched"),
            (_, true) => {}
        }
        self.vip_iface_seen = Some(present);
    }

    /// Publishes what the kernel maps hold (`in_maps`), not what the node has.
    fn publish(&self, sets: &AddressSets) {
        let set_sizes = Tag::ALL
            .iter()
            .map(|t| {
                let n = self.in_maps.values().filter(|v| *v == t).count();
                (t.as_str().to_string(), n)
            })
            .collect();
        let left_out = Tag::ALL
            .iter()
            .map(|t| {
                let n = self.left_out.get(t).copied().unwrap_or(0);
                (t.as_str().to_string(), n)
            })
            .collect();
        let vips = self
            .in_maps
            .iter()
            .filter(|(_, t)| **t == Tag::Vip)
            .map(|(p, _)| p.addr)
            .collect();
        self.owners.send_if_modified(|o| {
            let changed = **o != sets.owners;
            if changed {
                *o = Arc::new(sets.owners.clone());
            }
            changed
        });
        let mut owner_counts = BTreeMap::new();
        for owner in sets.owners.values() {
            *owner_counts.entry(owner.label()).or_insert(0) += 1;
        }
        self.status.send_modify(|s| {
            s.owner_counts = owner_counts;
            s.attached = self.probe.attached();
            s.nics = sets.nics.iter().map(|(n, _)| n.clone()).collect();
            s.vip_iface = self.cfg.vip_iface.clone();
            s.vip_iface_present = sets.vip_iface.is_some();
            s.vips = vips;
            s.set_sizes = set_sizes;
            s.left_out = left_out;
            s.address_capacity = self.capacity;
            s.features = Some(self.probe.features().clone());
            s.ready = !sets.nics.is_empty();
        });
    }

    /// Follows rtnetlink notifications until `stop` fires; then detaches everything.
    pub async fn run(
        mut self,
        handle: Handle,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let (conn, _mc_handle, mut messages) = rtnetlink::new_multicast_connection(&[
            MulticastGroup::Link,
            MulticastGroup::Ipv4Ifaddr,
            MulticastGroup::Ipv6Ifaddr,
            MulticastGroup::Ipv4Route,
            MulticastGroup::Ipv6Route,
        ])?;
        let conn_task = tokio::spawn(conn);
        // Anything may have changed between the first sync and the subscription, so the loop
        // starts with a sync.
        let mut retry: Option<Duration> = None;
        loop {
            tokio::select! {
                () = tokio::time::sleep(DEBOUNCE) => {}
                _ = stop.changed() => break,
            }
            // Swallow the rest of the burst.
            while let Ok(Some(_)) =
                tokio::time::timeout(Duration::from_millis(1), messages.next()).await
            {}
            match self.sync(&handle).await {
                Ok(sets) => {
                    debug!(prefixes = sets.prefixes.len(), "resynced");
                    retry = None;
                }
                Err(e) => {
                    let after = retry.map_or(RETRY_FIRST, |d| (d * 2).min(RETRY_MAX));
                    warn!(error = %e, "resync failed; retrying in {after:?} or on the next change");
                    retry = Some(after);
                }
            }
            let retry_at = retry.map(|d| tokio::time::Instant::now() + d);
            tokio::select! {
                msg = messages.next() => if msg.is_none() {
                    warn!("rtnetlink notifications ended; resyncing every second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                },
                () = async {
                    match retry_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
                _ = stop.changed() => break,
            }
        }
        conn_task.abort();
        self.probe.detach_all();
        info!("detached from all interfaces");
        Ok(())
    }
}
