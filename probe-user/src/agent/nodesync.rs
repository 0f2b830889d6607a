//! Keeps the kernel in step with the node: address tries, the NIC set, and attachments.
//!
//! Any rtnetlink link/address/route notification triggers a full re-read (debounced), a pure
//! classification and a diff against what the maps hold: simpler and more robust than applying
//! individual notifications, and cheap (a node has hundreds of addresses, not millions).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use aya::maps::lpm_trie::Key;
use futures::StreamExt as _;
use probe_common::AddrValue;
use rtnetlink::{Handle, MulticastGroup};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::{
    event::Tag,
    kernel::{AddressMaps, Probe, prefilter, reader::IfNames},
    state::addrs::{self, AddrConfig, AddressSets, Prefix},
};

pub use probe_contract::status::NodeStatus;

pub struct NodeSync {
    probe: Probe,
    maps: AddressMaps,
    cfg: AddrConfig,
    in_maps: BTreeMap<Prefix, Tag>,
    /// The prefilter words last written.
    prefilter: Vec<u64>,
    nics_in_map: BTreeSet<u32>,
    ifnames: IfNames,
    status: watch::Sender<NodeStatus>,
    /// Whether `--vip-iface` existed at the last sync (None before the first): said on change.
    vip_iface_seen: Option<bool>,
    /// Configured NICs already said absent: one WARN per absence, not one per resync.
    nics_said_absent: BTreeSet<String>,
}

/// Debounce for bursts of notifications (kube-proxy adds hundreds of addresses at once).
const DEBOUNCE: Duration = Duration::from_millis(100);

impl NodeSync {
    pub fn new(
        probe: Probe,
        maps: AddressMaps,
        cfg: AddrConfig,
        ifnames: IfNames,
        status: watch::Sender<NodeStatus>,
    ) -> Self {
        Self {
            probe,
            maps,
            cfg,
            in_maps: BTreeMap::new(),
            // The map starts zeroed.
            prefilter: vec![0; probe_common::prefilter::WORDS as usize],
            nics_in_map: BTreeSet::new(),
            ifnames,
            status,
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
        self.apply_prefixes(&sets.prefixes)?;
        self.apply_attachments(&sets)?;
        self.publish(&sets);
        Ok(sets)
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
        for (p, tag) in want {
            if self.in_maps.get(p) == Some(tag) {
                continue;
            }
            let value = AddrValue {
                tag: tag.to_raw(),
                _pad: [0; 3],
            };
            self.insert_prefix(*p, value)?;
            self.in_maps.insert(*p, *tag);
        }
        // The programs skip the IPv6 trie when it is empty: keep its size current.
        let v6_prefixes = self
            .in_maps
            .keys()
            .filter(|p| p.addr.is_ipv6() && !p.is_host())
            .count() as u32;
        self.maps.trie_v6_size.set(0, v6_prefixes, 0)?;
        // The prefilter last: bits for new addresses are set once their entries exist, bits
        // of removed ones cleared after their entries went (a set bit only means "look up").
        let words = prefilter::words(self.in_maps.keys());
        for (i, (new, old)) in words.iter().zip(self.prefilter.iter_mut()).enumerate() {
            if new != old {
                self.maps.prefilter_v4.set(i as u32, *new, 0)?;
                *old = *new;
            }
        }
        Ok(())
    }

    /// Host addresses go to the hash, shorter prefixes to the trie.
    fn insert_prefix(&mut self, p: Prefix, value: AddrValue) -> Result<(), aya::maps::MapError> {
        match (p.addr, p.is_host()) {
            (IpAddr::V4(a), true) => self.maps.hosts_v4.insert(a.octets(), value, 0),
            (IpAddr::V6(a), true) => self.maps.hosts_v6.insert(a.octets(), value, 0),
            (IpAddr::V4(a), false) => {
                self.maps
                    .v4
                    .insert(&Key::new(p.len as u32, a.octets()), value, 0)
            }
            (IpAddr::V6(a), false) => {
                self.maps
                    .v6
                    .insert(&Key::new(p.len as u32, a.octets()), value, 0)
            }
        }
    }

    fn remove_prefix(&mut self, p: Prefix) -> Result<(), aya::maps::MapError> {
        match (p.addr, p.is_host()) {
            (IpAddr::V4(a), true) => self.maps.hosts_v4.remove(&a.octets()),
            (IpAddr::V6(a), true) => self.maps.hosts_v6.remove(&a.octets()),
            (IpAddr::V4(a), false) => self.maps.v4.remove(&Key::new(p.len as u32, a.octets())),
            (IpAddr::V6(a), false) => self.maps.v6.remove(&Key::new(p.len as u32, a.octets())),
        }
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
            let _ = self.maps.nics.remove(gone);
        }
        for new in nic_indexes.difference(&self.nics_in_map) {
            self.maps.nics.insert(new, 1, 0)?;
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

    fn publish(&self, sets: &AddressSets) {
        let set_sizes = Tag::ALL
            .iter()
            .map(|t| (t.as_str().to_string(), sets.count(*t)))
            .collect();
        let vips = sets
            .prefixes
            .iter()
            .filter(|(_, t)| **t == Tag::Vip)
            .map(|(p, _)| p.addr)
            .collect();
        self.status.send_modify(|s| {
            s.attached = self.probe.attached();
            s.nics = sets.nics.iter().map(|(n, _)| n.clone()).collect();
            s.vip_iface = self.cfg.vip_iface.clone();
            s.vip_iface_present = sets.vip_iface.is_some();
            s.vips = vips;
            s.set_sizes = set_sizes;
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
                Ok(sets) => debug!(prefixes = sets.prefixes.len(), "resynced"),
                Err(e) => warn!(error = %e, "resync failed; retrying on the next change"),
            }
            tokio::select! {
                msg = messages.next() => if msg.is_none() {
                    warn!("rtnetlink notifications ended; resyncing every second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                },
                _ = stop.changed() => break,
            }
        }
        conn_task.abort();
        self.probe.detach_all();
        info!("detached from all interfaces");
        Ok(())
    }
}
