//! Loading the programs and attaching them to interfaces.

use std::{collections::HashMap, net::IpAddr};

use aya::{
    Ebpf, EbpfLoader, include_bytes_aligned,
    maps::{HashMap as BpfHashMap, LpmTrie, MapData, RingBuf, lpm_trie::Key},
    programs::{
        BtfTracePoint, RawTracePoint, SchedClassifier, TcAttachType,
        links::LinkOrder,
        tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    },
    util::KernelVersion,
};
use probe_common::{AddrValue, ProbeConfig};
use tracing::{debug, info, warn};

use super::{
    KernelBtf, KernelError,
    counters::{Counters, EgressTable},
    tc::{self as tc_netlink, Hook},
};
use crate::state::addrs::Prefix;

static PROGRAMS: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe"));

const INGRESS: &str = "clb_ingress";
const EGRESS: &str = "clb_egress";
const KFREE_SKB_BTF: &str = "clb_kfree_skb";
const KFREE_SKB_RAW: &str = "clb_kfree_skb_raw";
/// The two-argument variants (skb, location) for kernels before 5.17.
const KFREE_SKB_SITE_BTF: &str = "clb_kfree_skb_site";
const KFREE_SKB_SITE_RAW: &str = "clb_kfree_skb_site_raw";

/// Load-time settings.
#[derive(Clone, Debug)]
pub struct ProbeSettings {
    pub config: ProbeConfig,
    /// Enable the programs' aya-log debug lines (off: the statements cost one global check).
    pub ebpf_log: bool,
    /// Force an attach mode; None = tcx on kernels >= 6.6, netlink clsact before.
    pub tc_mode: Option<TcMode>,
    /// Map capacities (the agent's flags).
    pub sizes: super::sizing::MapSizes,
}

use probe_contract::{DropHook, Features, TcMode};

/// The maps the node sync writes: host-address hashes, prefix tries, the IPv6 trie's size,
/// the IPv4 prefilter, and the monitored NIC set. Written only through its methods, so the
/// node sync (and anything above `kernel/`) never names an aya type.
pub struct AddressMaps {
    hosts_v4: BpfHashMap<MapData, [u8; 4], AddrValue>,
    hosts_v6: BpfHashMap<MapData, [u8; 16], AddrValue>,
    v4: LpmTrie<MapData, [u8; 4], AddrValue>,
    v6: LpmTrie<MapData, [u8; 16], AddrValue>,
    /// Number of prefixes in the IPv6 trie.
    trie_v6_size: aya::maps::Array<MapData, u32>,
    /// The IPv4 prefilter bitmap (see [`super::prefilter`]).
    prefilter_v4: aya::maps::Array<MapData, u64>,
    nics: BpfHashMap<MapData, u32, u32>,
}

impl AddressMaps {
    /// Writes `p` with `value`: host addresses go to the hash, shorter prefixes to the trie.
    pub fn insert_prefix(&mut self, p: Prefix, value: AddrValue) -> Result<(), KernelError> {
        match (p.addr, p.is_host()) {
            (IpAddr::V4(a), true) => self
                .hosts_v4
                .insert(a.octets(), value, 0)
                .map_err(map_err("HOSTS_V4")),
            (IpAddr::V6(a), true) => self
                .hosts_v6
                .insert(a.octets(), value, 0)
                .map_err(map_err("HOSTS_V6")),
            (IpAddr::V4(a), false) => self
                .v4
                .insert(&Key::new(p.len.into(), a.octets()), value, 0)
                .map_err(map_err("LOCAL_V4")),
            (IpAddr::V6(a), false) => self
                .v6
                .insert(&Key::new(p.len.into(), a.octets()), value, 0)
                .map_err(map_err("LOCAL_V6")),
        }
    }

    /// Removes `p` from the map [`Self::insert_prefix`] wrote it to.
    pub fn remove_prefix(&mut self, p: Prefix) -> Result<(), KernelError> {
        match (p.addr, p.is_host()) {
            (IpAddr::V4(a), true) => self
                .hosts_v4
                .remove(&a.octets())
                .map_err(map_err("HOSTS_V4")),
            (IpAddr::V6(a), true) => self
                .hosts_v6
                .remove(&a.octets())
                .map_err(map_err("HOSTS_V6")),
            (IpAddr::V4(a), false) => self
                .v4
                .remove(&Key::new(p.len.into(), a.octets()))
                .map_err(map_err("LOCAL_V4")),
            (IpAddr::V6(a), false) => self
                .v6
                .remove(&Key::new(p.len.into(), a.octets()))
                .map_err(map_err("LOCAL_V6")),
        }
    }

    /// The number of prefixes in the IPv6 trie (the programs skip the trie when it is 0).
    pub fn set_v6_trie_size(&mut self, prefixes: u32) -> Result<(), KernelError> {
        self.trie_v6_size
            .set(0, prefixes, 0)
            .map_err(map_err("TRIE_V6_SIZE"))
    }

    /// Word `index` of the IPv4 prefilter bitmap.
    pub fn set_prefilter_word(&mut self, index: u32, word: u64) -> Result<(), KernelError> {
        self.prefilter_v4
            .set(index, word, 0)
            .map_err(map_err("PREFILTER_V4"))
    }

    /// Adds `ifindex` to the monitored NICs.
    pub fn add_nic(&mut self, ifindex: u32) -> Result<(), KernelError> {
        self.nics.insert(ifindex, 1, 0).map_err(map_err("NICS"))
    }

    /// Removes `ifindex` from the monitored NICs.
    pub fn remove_nic(&mut self, ifindex: u32) -> Result<(), KernelError> {
        self.nics.remove(&ifindex).map_err(map_err("NICS"))
    }
}

/// `DROP_DESTINATIONS`: non-local destinations (or VIPs bound on kube-ipvs0) whose drops of a
/// local pod's packets the drop program reports (see `probe-ebpf/src/drops.rs`,
/// `watched_destination`). The agent keeps in it the addresses of kube-proxy's no-endpoint
/// drops (nftables `no-endpoint-services` drop elements, iptables `KUBE-EXTERNAL-SERVICES`
/// drops) and of its loadBalancerSourceRanges firewall entries (every mode), from each new
/// service table ([`Self::sync`]).
///
/// It also keeps `PROBE_PORTS`, the LB's node-probe ports whose refused or dropped probes the
/// drop program reports ([`Self::sync_probe_ports`]).
pub struct DropDestinations {
    map: BpfHashMap<MapData, probe_common::DropDestinationKey, u32>,
    held: std::collections::BTreeSet<IpAddr>,
    probe_ports: aya::maps::Array<MapData, u64>,
    /// `PROBE_PORTS`' words as written (all zero at load).
    probe_words: Vec<u64>,
}

/// The `PROBE_PORTS` bitmap of `ports` (see `probe_common::probe_ports`). Pure.
pub fn probe_port_words(ports: &[u16]) -> Vec<u64> {
    let mut words = vec![0u64; probe_common::probe_ports::WORDS as usize];
    for &port in ports {
        let (word, bit) = probe_common::probe_ports::slot(port);
        words[word as usize] |= bit;
    }
    words
}

impl DropDestinations {
    /// Makes `PROBE_PORTS` hold exactly `ports` (a bit each: never full), writing only the
    /// words that change.
    pub fn sync_probe_ports(&mut self, ports: &[u16]) -> Result<(), KernelError> {
        let want = probe_port_words(ports);
        for (index, (&new, old)) in want.iter().zip(self.probe_words.iter_mut()).enumerate() {
            if new != *old {
                self.probe_ports
                    .set(index as u32, new, 0)
                    .map_err(map_err("PROBE_PORTS"))?;
                *old = new;
            }
        }
        Ok(())
    }

    /// Makes the map hold `want`, in its order (a diff against what it holds), as far as the
    /// map's capacity (`--address-entries`) goes: returns the addresses left out (their drops
    /// stay unreported). The caller orders `want` by priority (LB IPs first), so a tenant with
    /// many low external IPs cannot choose whose loops are missed.
    pub fn sync(&mut self, want: &[IpAddr]) -> Result<Vec<IpAddr>, KernelError> {
        let wanted: std::collections::BTreeSet<IpAddr> = want.iter().copied().collect();
        let key = |a: IpAddr| probe_common::DropDestinationKey {
            addr: super::codec::addr_bytes(a),
            family: super::codec::family_of(a),
            _pad: [0; 3],
        };
        let gone: Vec<IpAddr> = self.held.difference(&wanted).copied().collect();
        for a in gone {
            self.map
                .remove(&key(a))
                .map_err(map_err("DROP_DESTINATIONS"))?;
            self.held.remove(&a);
        }
        let mut left_out = Vec::new();
        for a in want {
            if self.held.contains(a) {
                continue;
            }
            if !left_out.is_empty() {
                left_out.push(*a);
                continue;
            }
            match self.map.insert(key(*a), 1, 0) {
                Ok(()) => {
                    self.held.insert(*a);
                }
                // Full (E2BIG): the rest is left out, said by the caller.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::E2BIG) =>
                {
                    left_out.push(*a);
                }
                Err(e) => return Err(map_err("DROP_DESTINATIONS")(e)),
            }
        }
        Ok(left_out)
    }
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> KernelError {
    move |source| KernelError::Map { map, source }
}

/// Links of one interface; dropping them detaches.
struct IfaceLinks {
    ifindex: u32,
    _ingress: SchedClassifierLink,
    _egress: SchedClassifierLink,
}

/// The loaded programs and their attachments.
pub struct Probe {
    ebpf: Ebpf,
    features: Features,
    links: HashMap<String, IfaceLinks>,
    /// clsact qdiscs this agent added (netlink mode), by interface name, with their ifindex:
    /// removed again on exit when no filter is left on them. One that existed before (another
    /// tool's) is left alone; a SIGKILLed agent's is adopted.
    created_clsact: std::collections::BTreeMap<String, u32>,
}

/// Everything taken out of the loaded object, for the tasks that own it.
pub struct Loaded {
    pub probe: Probe,
    pub ring: RingBuf<MapData>,
    pub addresses: AddressMaps,
    pub counters: Counters,
    pub egress: EgressTable,
    pub drop_destinations: DropDestinations,
    /// The programs' aya-log records (`--ebpf-log`), forwarded to `tracing` by [`run_logger`].
    pub logger: Option<EbpfLogger>,
}

pub type EbpfLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// Forwards the programs' log records to the `log` facade (bridged into `tracing`).
pub async fn run_logger(logger: EbpfLogger) -> std::io::Result<()> {
    // SAFETY: the logger owns its ring buffer's fd for as long as the AsyncFd owns the logger.
    let mut fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    }?;
    loop {
        let mut guard = fd.readable_mut().await?;
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, KernelError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(KernelError::MissingMap { map: name })?;
    T::try_from(map).map_err(|source| KernelError::Map { map: name, source })
}

/// The eBPF object with this kernel's offsets and the settings' tunables written into it.
fn load_object(settings: &ProbeSettings, kbtf: &KernelBtf) -> Result<Ebpf, KernelError> {
    // aya-log's kernel side defaults to every level on: turn it off unless asked.
    let level: u8 = if settings.ebpf_log {
        aya_log::Level::Debug as u8
    } else {
        0
    };
    let mut loader = EbpfLoader::new();
    loader
        .override_global("CONFIG", &settings.config, true)
        .override_global("OFFSETS", &kbtf.offsets, true)
        .override_global(aya_log::LEVEL, &level, false);
    settings.sizes.apply(&mut loader);
    Ok(loader.load(PROGRAMS)?)
}

/// How the tc programs attach: as configured, else through tcx where the kernel has it (6.6).
fn attach_mode(configured: Option<TcMode>, kernel: &str) -> TcMode {
    let tc_mode = configured.unwrap_or(
        if KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0)) {
            TcMode::Tcx
        } else {
            TcMode::Netlink
        },
    );
    if tc_mode == TcMode::Netlink {
        let why = if configured.is_some() {
            "as configured (--tc-mode netlink)"
        } else {
            "this kernel has no tcx (needs 6.6)"
        };
        info!("kernel {kernel}: attaching through a clsact qdisc: {why}");
    }
    tc_mode
}

impl Probe {
    /// Loads the programs with this kernel's offsets and tunables, and hooks `kfree_skb`.
    ///
    /// aya parses the kernel's BTF twice here, one parse after the other, never both held:
    /// `EbpfLoader::new` parses it for the relocations (aya 0.14 has no loader without that
    /// parse, and keeps it private), and the `tp_btf` hook needs a parse of its own once the
    /// loader is gone. A parse of 6.18's BTF is ~13 MiB of heap; the agent used to parse its
    /// own copy on a thread beside the loader's, and the two together were its peak RSS with
    /// 1,000 Services (heaptrack, BENCHMARKS.md 9f).
    pub fn load(settings: &ProbeSettings, kbtf: &KernelBtf) -> Result<Loaded, KernelError> {
        if PROGRAMS.is_empty() {
            return Err(KernelError::NoPrograms);
        }
        raise_memlock();
        let mut ebpf = load_object(settings, kbtf)?;
        let logger = if settings.ebpf_log {
            aya_log::EbpfLogger::init(&mut ebpf)
                .map_err(|e| warn!(error = %e, "eBPF logging unavailable"))
                .ok()
        } else {
            None
        };
        for name in [INGRESS, EGRESS] {
            let prog: &mut SchedClassifier = program(&mut ebpf, name)?;
            prog.load().map_err(|source| KernelError::Program {
                program: name,
                source,
            })?;
        }
        let drop_reason_arg = kbtf.kfree_skb_has_reason();
        // The test hook stands in for a kernel that refuses both (tests/tests/capability.rs).
        let drop_hook = if std::env::var_os(NO_DROP_HOOK_ENV).is_some() {
            DropHook::None
        } else {
            hook_kfree_skb(&mut ebpf, &parse_btf_for_aya()?, drop_reason_arg)
        };
        let kernel = KernelVersion::current()
            .map(|v| v.to_string())
            .unwrap_or_else(|_| "unknown".into());
        let tc_mode = attach_mode(settings.tc_mode, &kernel);
        let features = Features {
            tc_mode,
            drop_hook,
            drop_reason_arg,
            kernel,
            drop_reasons: kbtf.drop_reasons.len(),
        };
        let ring = take(&mut ebpf, "EVENTS")?;
        let addresses = AddressMaps {
            hosts_v4: take(&mut ebpf, "HOSTS_V4")?,
            hosts_v6: take(&mut ebpf, "HOSTS_V6")?,
            trie_v6_size: take(&mut ebpf, "TRIE_V6_SIZE")?,
            prefilter_v4: take(&mut ebpf, "PREFILTER_V4")?,
            v4: take(&mut ebpf, "LOCAL_V4")?,
            v6: take(&mut ebpf, "LOCAL_V6")?,
            nics: take(&mut ebpf, "NICS")?,
        };
        let counters = Counters {
            suspects: take(&mut ebpf, "SUSPECTS")?,
            drops: take(&mut ebpf, "DROPS")?,
            stats: take(&mut ebpf, "STATS")?,
        };
        let egress = EgressTable {
            map: take(&mut ebpf, "EGRESS_FLOWS")?,
            sources: take(&mut ebpf, "EGRESS_SOURCES")?,
        };
        let drop_destinations = DropDestinations {
            map: take(&mut ebpf, "DROP_DESTINATIONS")?,
            held: std::collections::BTreeSet::new(),
            probe_ports: take(&mut ebpf, "PROBE_PORTS")?,
            probe_words: vec![0; probe_common::probe_ports::WORDS as usize],
        };
        Ok(Loaded {
            probe: Probe {
                ebpf,
                features,
                links: HashMap::new(),
                created_clsact: Default::default(),
            },
            ring,
            addresses,
            counters,
            egress,
            drop_destinations,
            logger,
        })
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    /// Interfaces with programs attached, and their ifindex.
    pub fn attached(&self) -> Vec<(String, u32)> {
        let mut v: Vec<_> = self
            .links
            .iter()
            .map(|(n, l)| (n.clone(), l.ifindex))
            .collect();
        v.sort();
        v
    }

    /// Attaches ingress and egress programs to `iface` (whose current index is `ifindex`).
    /// Re-attaches when the interface was recreated under the same name.
    pub fn attach(&mut self, iface: &str, ifindex: u32) -> Result<(), KernelError> {
        if self.links.get(iface).is_some_and(|l| l.ifindex == ifindex) {
            return Ok(());
        }
        // A stale entry (the interface was deleted and recreated) detaches on drop.
        self.links.remove(iface);
        let mode = self.features.tc_mode;
        if mode == TcMode::Netlink {
            let created = add_clsact(iface)?;
            // A previous agent killed with SIGKILL leaves its cls_bpf filters (and the qdisc
            // it added): remove ours, and adopt the qdisc when nothing else uses it.
            let stale = remove_our_filters(iface, ifindex);
            if created || (stale && !has_tc_filters(iface, ifindex)) {
                self.created_clsact.insert(iface.to_string(), ifindex);
            } else {
                self.created_clsact.remove(iface);
            }
        }
        let ingress = attach_one(&mut self.ebpf, INGRESS, iface, TcAttachType::Ingress, mode)?;
        let egress = attach_one(&mut self.ebpf, EGRESS, iface, TcAttachType::Egress, mode)?;
        info!(iface, ifindex, ?mode, "attached");
        self.links.insert(
            iface.to_string(),
            IfaceLinks {
                ifindex,
                _ingress: ingress,
                _egress: egress,
            },
        );
        Ok(())
    }

    /// Drops the links of an interface that went away (detach errors are expected then).
    pub fn forget(&mut self, iface: &str) {
        if self.links.remove(iface).is_some() {
            info!(iface, "interface gone: links dropped");
        }
        // Its qdisc went with it.
        self.created_clsact.remove(iface);
    }

    /// Detaches everything. Also done by Drop; explicit for ordered shutdown.
    pub fn detach_all(&mut self) {
        let attached: Vec<(String, u32)> = self
            .links
            .iter()
            .map(|(n, l)| (n.clone(), l.ifindex))
            .collect();
        // Dropping a netlink link deletes exactly its filter (priority and handle).
        self.links.clear();
        if self.features.tc_mode == TcMode::Netlink {
            // A drop that failed (aya does not say) leaves a filter: remove it by identity.
            for (name, ifindex) in attached {
                remove_our_filters(&name, ifindex);
            }
            for (iface, ifindex) in std::mem::take(&mut self.created_clsact) {
                remove_clsact_if_unused(&iface, ifindex);
            }
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.detach_all();
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, KernelError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or(KernelError::MissingProgram { program: name })?;
    prog.try_into().map_err(|source| KernelError::Program {
        program: name,
        source,
    })
}

fn attach_one(
    ebpf: &mut Ebpf,
    name: &'static str,
    iface: &str,
    direction: TcAttachType,
    mode: TcMode,
) -> Result<SchedClassifierLink, KernelError> {
    let dir = match direction {
        TcAttachType::Ingress => "ingress",
        _ => "egress",
    };
    let prog: &mut SchedClassifier = program(ebpf, name)?;
    let options = match mode {
        // First in the chain, so a later program's verdict cannot hide packets from us.
        TcMode::Tcx => TcAttachOptions::TcxOrder(LinkOrder::first()),
        // Our handle marks the filter as ours (see kernel::tc); the kernel picks a priority
        // before every filter already on the hook.
        TcMode::Netlink => TcAttachOptions::Netlink(NlOptions {
            handle: TcHandle::from(tc_netlink::OUR_HANDLE),
            ..NlOptions::default()
        }),
    };
    let id = prog
        .attach_with_options(iface, direction, options)
        .map_err(|source| KernelError::Attach {
            iface: iface.into(),
            direction: dir,
            source,
        })?;
    prog.take_link(id).map_err(|source| KernelError::Attach {
        iface: iface.into(),
        direction: dir,
        source,
    })
}

/// Adds a clsact qdisc; true when we created it, false when one was there already.
fn add_clsact(iface: &str) -> Result<bool, KernelError> {
    match tc::qdisc_add_clsact(iface) {
        Ok(()) => Ok(true),
        Err(tc::TcError::AlreadyAttached) => Ok(false),
        Err(e) if is_already_exists(&e) => Ok(false),
        Err(e) => Err(KernelError::Attach {
            iface: iface.into(),
            direction: "clsact qdisc",
            source: e.into(),
        }),
    }
}

/// EEXIST, wherever aya wrapped it (a netlink error carries it as its source).
fn is_already_exists(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && (io.kind() == std::io::ErrorKind::AlreadyExists
                || io.raw_os_error() == Some(libc::EEXIST))
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Removes the clsact qdisc we added to `iface`, unless a filter (anyone's) is left on it.
fn remove_clsact_if_unused(iface: &str, ifindex: u32) {
    if has_tc_filters(iface, ifindex) {
        info!(iface, "clsact qdisc kept: other filters use it");
        return;
    }
    match tc_netlink::delete_clsact(ifindex) {
        Ok(()) => debug!(iface, "removed our clsact qdisc"),
        Err(e) => warn!(iface, error = %e, "removing our clsact qdisc"),
    }
}

/// Removes our cls_bpf filters (our program name and handle) from `iface`, this agent's or a
/// SIGKILLed one's; true when any was found. Anyone else's filters stay.
fn remove_our_filters(iface: &str, ifindex: u32) -> bool {
    let mut found = false;
    for (hook, name) in [(Hook::Ingress, INGRESS), (Hook::Egress, EGRESS)] {
        let filters = match tc_netlink::filters(ifindex, hook) {
            Ok(f) => f,
            Err(e) => {
                debug!(iface, ?hook, error = %e, "listing tc filters");
                continue;
            }
        };
        for f in filters.iter().filter(|f| f.is_ours(name)) {
            found = true;
            match tc_netlink::delete_filter(ifindex, f) {
                Ok(()) => debug!(iface, name, priority = f.priority(), "removed our filter"),
                Err(e) => warn!(iface, name, error = %e, "removing our tc filter"),
            }
        }
    }
    found
}

/// Whether any tc filter (anyone's) is left on the clsact hooks of `iface`.
fn has_tc_filters(iface: &str, ifindex: u32) -> bool {
    Hook::BOTH.iter().any(|&hook| {
        tc_netlink::filters(ifindex, hook).map_or_else(
            |e| {
                // Unknown state: assume someone else's filters, keep the qdisc.
                debug!(iface, ?hook, error = %e, "listing tc filters");
                true
            },
            |f| !f.is_empty(),
        )
    })
}

/// Environment hook for tests: do not hook `kfree_skb` at all, as on a kernel that refuses
/// both the tp_btf and the raw tracepoint.
pub const NO_DROP_HOOK_ENV: &str = "CLB_PROBE_TEST_NO_DROP_HOOK";

/// tp_btf first (needs BTF only: works where tracefs is not mounted, e.g. under
/// `ip netns exec`), then a raw tracepoint, then none. `with_reason` picks the variants that
/// read the reason argument (the tracepoint has it, >= 5.17) or the two-argument ones.
fn hook_kfree_skb(ebpf: &mut Ebpf, btf: &aya::Btf, with_reason: bool) -> DropHook {
    let (btf_name, raw_name) = if with_reason {
        (KFREE_SKB_BTF, KFREE_SKB_RAW)
    } else {
        (KFREE_SKB_SITE_BTF, KFREE_SKB_SITE_RAW)
    };
    let tp_btf = (|| -> Result<(), KernelError> {
        let prog: &mut BtfTracePoint = program(ebpf, btf_name)?;
        prog.load("kfree_skb", btf)
            .and_then(|()| prog.attach().map(|_| ()))
            .map_err(|source| KernelError::Program {
                program: btf_name,
                source,
            })
    })();
    match tp_btf {
        Ok(()) => return DropHook::TpBtf,
        Err(e) => warn!(error = %e, "tp_btf/kfree_skb unavailable; trying a raw tracepoint"),
    }
    let raw = (|| -> Result<(), KernelError> {
        let prog: &mut RawTracePoint = program(ebpf, raw_name)?;
        prog.load()
            .and_then(|()| prog.attach("kfree_skb").map(|_| ()))
            .map_err(|source| KernelError::Program {
                program: raw_name,
                source,
            })
    })();
    match raw {
        Ok(()) => DropHook::RawTracepoint,
        Err(e) => {
            // The agent says what this costs, once (capability drop_hook).
            debug!(error = %e, "no kfree_skb hook");
            DropHook::None
        }
    }
}

/// aya's parse of the kernel's BTF, for the `tp_btf` hook.
fn parse_btf_for_aya() -> Result<aya::Btf, KernelError> {
    aya::Btf::from_sys_fs().map_err(|e| KernelError::Btf {
        what: "loading /sys/kernel/btf/vmlinux for aya".into(),
        source: e.into(),
    })
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        debug!("could not raise RLIMIT_MEMLOCK (fine on kernels with memcg accounting)");
    }
}
