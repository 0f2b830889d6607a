//! The node's own addresses, from rtnetlink: what the datapath's tries hold.
//!
//! [`read`] dumps links, addresses and routes of the current network namespace into a
//! [`NodeState`]; [`classify`] (pure) turns that into tagged prefixes ([`AddressSets`]):
//! - every address on the VIP interface (`kube-ipvs0`) -> *vip*;
//! - every other interface address -> *node* (IPv6 link-local excluded: per-link, never routed);
//! - main-table routes through a pod-facing device (veth, bridge, netkit; no gateway) and every
//!   `--pod-cidr` -> *pod*.
//!
//! - every `local` route of table local (RTN_LOCAL, v4 and v6) with no interface address
//!   behind it -> *vip*: the kernel's local table, not `ip addr`, decides what is a martian
//!   source, and cloud guest agents (GCE: forwarding-rule IPs, route protocol 66) or AnyIP
//!   setups make LB IPs local that way. Loopback (127/8, ::1) and IPv6 link-local are left
//!   out: never a VIP, and martian on a NIC anyway.
//!
//! On overlap the more specific tag wins: vip over node over pod.
//!
//! Each local address also gets its [`AddressOwner`] (kube-ipvs0, a NIC, or a local route and its
//! protocol), for the evidence, the remedy, `probe check` and the metrics.
//!
//! Without `--nic`, the monitored NICs are every non-virtual interface (no link kind: a
//! physical or SR-IOV device; `lo` excluded) plus every interface that carries a default route
//! in *any* routing table: secondary ENIs (AWS VPC CNI, TKE VPC-CNI, Alibaba Terway) carry pod
//! traffic through per-ENI tables chosen by `ip rule`, and have no default route in main.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use futures::TryStreamExt as _;
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags, AddressHeaderFlags},
    link::{InfoKind, LinkAttribute, LinkInfo},
    route::{RouteAddress, RouteAttribute, RouteType},
};
use probe_contract::{
    Tag,
    facts::{AddressOwner, Announcer},
};
pub use probe_core::state::addrs::{Owners, Prefix};
use rtnetlink::{Handle, RouteMessageBuilder};
use serde::Serialize;

/// A link as rtnetlink reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `veth`, `bridge`, `dummy`, ... (IFLA_INFO_KIND); None for physical devices.
    pub kind: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddrEntry {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub prefix_len: u8,
    /// IFA_F_DEPRECATED: preferred_lft 0, never picked as a source (kube-vip's VIPs).
    pub deprecated: bool,
    /// IFA_PROTO (Linux >= 5.18): who added it; 0 unset, 1-3 the kernel's own (loopback, RA,
    /// link-local), keepalived tags its VIPs with its `rt_addrprotos` number.
    pub protocol: u8,
    /// A finite valid lifetime (IFA_F_PERMANENT unset): a DHCP or DHCPv6 lease, SLAAC.
    pub dynamic: bool,
}

impl AddrEntry {
    /// An address as `ip addr add` adds it (no marks).
    pub fn plain(ifindex: u32, addr: IpAddr, prefix_len: u8) -> Self {
        Self {
            ifindex,
            addr,
            prefix_len,
            deprecated: false,
            protocol: 0,
            dynamic: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteEntry {
    pub dst: Prefix,
    pub oif: Option<u32>,
    pub gateway: Option<IpAddr>,
    /// Unicast routes of every table are read; pods come from the main table (254) only.
    pub table: u32,
    /// RTN_LOCAL (a `local` route of table local) rather than unicast.
    pub local: bool,
    /// The route's protocol number (`proto kernel` = 2, `static` = 4, 66, ...).
    pub protocol: u8,
}

/// A raw dump of the namespace's links, addresses, unicast routes (all tables) and local
/// routes (table local).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    pub links: Vec<Link>,
    pub addrs: Vec<AddrEntry>,
    pub routes: Vec<RouteEntry>,
    /// The preferred source (RTA_PREFSRC) of every route: the node's own addresses are; a VIP
    /// an announcer holds never is (kube-vip deprecates it so it is not picked as a source).
    pub route_sources: Vec<IpAddr>,
}

/// What the operator told us.
#[derive(Clone, Debug, Default)]
pub struct AddrConfig {
    /// `--nic`; empty = every non-virtual interface plus every interface with a default route
    /// in any routing table (see the module docs).
    pub nics: Vec<String>,
    /// `--vip-iface`.
    pub vip_iface: String,
    /// `--pod-cidr`.
    pub pod_cidrs: Vec<Prefix>,
}

/// The classification the datapath enforces.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AddressSets {
    pub prefixes: BTreeMap<Prefix, Tag>,
    /// Monitored NICs: (name, ifindex). A configured NIC that does not exist is absent here.
    pub nics: Vec<(String, u32)>,
    /// The VIP interface, when it exists now.
    pub vip_iface: Option<(String, u32)>,
    /// Who made each `vip`/`node` prefix local.
    pub owners: BTreeMap<Prefix, AddressOwner>,
}

impl AddressSets {
    pub fn count(&self, tag: Tag) -> usize {
        self.prefixes.values().filter(|t| **t == tag).count()
    }

    /// The tag of an address by longest prefix (what the kernel's trie answers).
    pub fn lookup(&self, ip: IpAddr) -> Option<Tag> {
        self.prefixes
            .iter()
            .filter(|(p, _)| p.contains(ip))
            .max_by_key(|(p, _)| p.len)
            .map(|(_, t)| *t)
    }

    /// Who made `ip` local, by longest prefix.
    pub fn owner(&self, ip: IpAddr) -> Option<&AddressOwner> {
        self.owners
            .iter()
            .filter(|(p, _)| p.contains(ip))
            .max_by_key(|(p, _)| p.len)
            .map(|(_, o)| o)
    }
}

/// Which of the four kernel address maps a prefix goes to (each holds `--address-entries`):
/// host addresses to the IPv4/IPv6 hashes, shorter prefixes to the IPv4/IPv6 tries.
fn kernel_map_of(p: &Prefix) -> (bool, bool) {
    (p.addr.is_ipv6(), p.is_host())
}

/// What fits in maps of `capacity` entries each, and what is left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fitted {
    pub kept: BTreeMap<Prefix, Tag>,
    /// Prefixes that did not fit, by tag.
    pub left_out: BTreeMap<Tag, usize>,
}

/// The order a full map is filled in: node addresses, then pod routes, then VIPs. The node's
/// own addresses are a handful and every kind needs them; pods are bounded by the kubelet's
/// max-pods; VIPs grow with the cluster's LoadBalancer Services, which tenants create, so they
/// go last: a flood of Services can only crowd out other VIPs, never the node.
fn fill_rank(tag: Tag) -> u8 {
    match tag {
        Tag::Node => 0,
        Tag::Pod => 1,
        Tag::Vip => 2,
    }
}

/// The subset of `want` the kernel maps hold when one of them would overflow (pure,
/// deterministic): per map, prefixes in [`fill_rank`] order, then by address, the first
/// `capacity`. The same input always keeps the same subset, so a resync changes nothing.
pub fn fit(want: &BTreeMap<Prefix, Tag>, capacity: u32) -> Fitted {
    let mut order: Vec<(&Prefix, &Tag)> = want.iter().collect();
    order.sort_by_key(|(p, t)| (fill_rank(**t), **p));
    let mut used: BTreeMap<(bool, bool), u32> = BTreeMap::new();
    let mut out = Fitted::default();
    for (p, t) in order {
        let n = used.entry(kernel_map_of(p)).or_insert(0);
        if *n < capacity {
            *n += 1;
            out.kept.insert(*p, *t);
        } else {
            *out.left_out.entry(*t).or_insert(0) += 1;
        }
    }
    out
}
/// The local routing table's id (RT_TABLE_LOCAL).
const LOCAL_TABLE: u32 = 255;

/// The main routing table's id.
const MAIN_TABLE: u32 = 254;

/// Link kinds that face pods or containers on this node.
const POD_LINK_KINDS: &[&str] = &["veth", "bridge", "netkit"];

fn is_v6_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80)
}

fn tag_rank(tag: Tag) -> u8 {
    match tag {
        Tag::Vip => 3,
        Tag::Node => 2,
        Tag::Pod => 1,
    }
}

/// IFA_PROTO values the kernel sets itself (IFAPROT_KERNEL_LO, _RA, _LL).
const KERNEL_ADDR_PROTOCOLS: [u8; 3] = [1, 2, 3];

/// The announcer holding `a` on a NIC or `lo`, when it is held like a VIP: a host prefix
/// (/32, /128: kube-vip's default `vip_cidr`, keepalived's default for a virtual_ipaddress) or
/// any address on `lo` (kube-vip's BGP mode, or a BGP speaker's anycast VIP), that is no
/// route's preferred source (the node's own address is, also a GCE-style /32 on the NIC).
/// Loopback addresses are the kernel's. Named from the address's marks: preferred_lft 0
/// is kube-vip's (kube-vip/kube-vip pkg/vip/address.go: "set address as deprecated so it isn't
/// used as source address"), an address protocol outside the kernel's is keepalived's
/// (acassen/keepalived keepalived/vrrp/vrrp_ipaddress.c, IFA_PROTO); else unknown, until
/// the node's pods name it (`kube::enrich`).
fn announced(a: &AddrEntry, iface: &str, route_sources: &[IpAddr]) -> Option<Announcer> {
    let host = a.prefix_len == if a.addr.is_ipv4() { 32 } else { 128 };
    // Announcers add their VIPs for good (kube-vip: ValidLft MaxInt, keepalived:
    // INFINITY_LIFE_TIME); a leased address (a DHCPv6 /128, a DHCP /32) is the node's own.
    if a.addr.is_loopback()
        || a.dynamic
        || !(host || iface == "lo")
        || route_sources.contains(&a.addr)
    {
        return None;
    }
    let len = a.prefix_len;
    let (name, why) = if a.deprecated {
        (
            Announcer::KUBE_VIP,
            format!(
                "/{len} on {iface} with preferred_lft 0 (deprecated), as kube-vip adds its VIPs"
            ),
        )
    } else if a.protocol != 0 && !KERNEL_ADDR_PROTOCOLS.contains(&a.protocol) {
        (
            Announcer::KEEPALIVED,
            format!(
                "/{len} on {iface} with address protocol {} (keepalived tags its VIPs with its \
                 rt_addrprotos entry)",
                a.protocol
            ),
        )
    } else {
        (
            Announcer::UNKNOWN,
            format!("/{len} on {iface}, the preferred source of no route: held like a VIP"),
        )
    };
    Some(Announcer {
        name: name.to_string(),
        why,
        pod: None,
    })
}

/// Pure classification of a dump; see the module docs for the rules.
pub fn classify(state: &NodeState, cfg: &AddrConfig) -> AddressSets {
    let by_index: BTreeMap<u32, &Link> = state.links.iter().map(|l| (l.index, l)).collect();
    let vip_iface = state
        .links
        .iter()
        .find(|l| l.name == cfg.vip_iface)
        .map(|l| (l.name.clone(), l.index));
    let nics = node_nics(state, cfg, &by_index, vip_iface.as_ref());
    let mut prefixes: BTreeMap<Prefix, Tag> = BTreeMap::new();
    let mut owners: BTreeMap<Prefix, AddressOwner> = BTreeMap::new();
    let name_of = |i: u32| by_index.get(&i).map(|l| l.name.clone());
    let mut put = |p: Prefix, tag: Tag| {
        let e = prefixes.entry(p).or_insert(tag);
        if tag_rank(tag) > tag_rank(*e) {
            *e = tag;
        }
    };
    for a in &state.addrs {
        if is_v6_link_local(a.addr) {
            continue;
        }
        let on_vip_iface = vip_iface.as_ref().is_some_and(|(_, i)| *i == a.ifindex);
        let tag = if on_vip_iface { Tag::Vip } else { Tag::Node };
        put(Prefix::host(a.addr), tag);
        let iface = name_of(a.ifindex).unwrap_or_else(|| format!("if{}", a.ifindex));
        let on_nic_or_lo = iface == "lo" || nics.iter().any(|(_, i)| *i == a.ifindex);
        let announcer = if on_vip_iface || !on_nic_or_lo {
            None
        } else {
            announced(a, &iface, &state.route_sources)
        };
        // A VIP an announcer holds is the LB's address, not the node's: its checks and the
        // calls that loop through it are judged as for kube-ipvs0.
        if announcer.is_some() {
            put(Prefix::host(a.addr), Tag::Vip);
        }
        let owner = if on_vip_iface {
            AddressOwner::VipInterface { iface }
        } else {
            AddressOwner::Interface { iface, announcer }
        };
        // The VIP interface names the owner when the same address is on both.
        let e = owners.entry(Prefix::host(a.addr)).or_insert(owner.clone());
        if on_vip_iface {
            *e = owner;
        }
    }
    for r in state
        .routes
        .iter()
        .filter(|r| r.local && r.table == LOCAL_TABLE)
    {
        if r.dst.addr.is_loopback() || is_v6_link_local(r.dst.addr) || owners.contains_key(&r.dst) {
            continue;
        }
        put(r.dst, Tag::Vip);
        owners.insert(
            r.dst,
            AddressOwner::local_route(r.oif.and_then(name_of), r.protocol),
        );
    }
    let skip: Vec<u32> = nics
        .iter()
        .map(|(_, i)| *i)
        .chain(vip_iface.iter().map(|(_, i)| *i))
        .collect();
    for p in pod_routes(state, &by_index, &skip) {
        put(p, Tag::Pod);
    }
    for p in &cfg.pod_cidrs {
        put(*p, Tag::Pod);
    }
    AddressSets {
        prefixes,
        nics,
        vip_iface,
        owners,
    }
}

/// The node's NICs: the configured ones, else the physical links and those of default
/// routes (never the VIP interface).
fn node_nics(
    state: &NodeState,
    cfg: &AddrConfig,
    by_index: &BTreeMap<u32, &Link>,
    vip_iface: Option<&(String, u32)>,
) -> Vec<(String, u32)> {
    if cfg.nics.is_empty() {
        let physical = state
            .links
            .iter()
            .filter(|l| l.kind.is_none() && l.name != "lo");
        let default_route = state
            .routes
            .iter()
            .filter(|r| r.dst.len == 0)
            .filter_map(|r| by_index.get(&r.oif?).copied());
        let mut v: Vec<(String, u32)> = physical
            .chain(default_route)
            .filter(|l| Some(l.index) != vip_iface.map(|(_, i)| *i))
            .map(|l| (l.name.clone(), l.index))
            .collect();
        v.sort();
        v.dedup();
        v
    } else {
        cfg.nics
            .iter()
            .filter_map(|n| state.links.iter().find(|l| &l.name == n))
            .map(|l| (l.name.clone(), l.index))
            .collect()
    }
}

/// Routes of the main table to pod-facing links (veth and the like) that no NIC or VIP
/// interface (`skip`) carries: the node's pods.
fn pod_routes<'a>(
    state: &'a NodeState,
    by_index: &'a BTreeMap<u32, &Link>,
    skip: &'a [u32],
) -> impl Iterator<Item = Prefix> + 'a {
    state
        .routes
        .iter()
        .filter(|r| r.table == MAIN_TABLE && !r.local)
        .filter_map(move |r| {
            let oif = r.oif?;
            if r.gateway.is_some() || r.dst.len == 0 || skip.contains(&oif) {
                return None;
            }
            let pod_facing = by_index
                .get(&oif)
                .and_then(|l| l.kind.as_deref())
                .is_some_and(|k| POD_LINK_KINDS.contains(&k));
            (pod_facing && !is_v6_link_local(r.dst.addr)).then_some(r.dst)
        })
}

/// Dumps links, addresses, unicast routes (every table) and local routes of the current network
/// namespace.
pub async fn read(handle: &Handle) -> Result<NodeState, rtnetlink::Error> {
    let mut state = NodeState {
        links: read_links(handle).await?,
        addrs: read_addrs(handle).await?,
        ..NodeState::default()
    };
    read_routes(handle, &mut state).await?;
    Ok(state)
}

async fn read_links(handle: &Handle) -> Result<Vec<Link>, rtnetlink::Error> {
    let mut out = Vec::new();
    let mut links = handle.link().get().execute();
    while let Some(msg) = links.try_next().await? {
        let mut name = None;
        let mut kind = None;
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => name = Some(n.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(k) = info {
                            kind = Some(info_kind_name(k));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(name) = name {
            out.push(Link {
                index: msg.header.index,
                name,
                kind,
            });
        }
    }
    Ok(out)
}

async fn read_addrs(handle: &Handle) -> Result<Vec<AddrEntry>, rtnetlink::Error> {
    let mut out = Vec::new();
    let mut addrs = handle.address().get().execute();
    while let Some(msg) = addrs.try_next().await? {
        // IFA_LOCAL is the interface's own address (differs from IFA_ADDRESS on p2p links).
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        // IFA_FLAGS (32 bits) supersedes the header's 8-bit flags when present.
        let deprecated = msg.attributes.iter().any(
            |a| matches!(a, AddressAttribute::Flags(f) if f.contains(AddressFlags::Deprecated)),
        ) || msg.header.flags.contains(AddressHeaderFlags::Deprecated);
        let permanent = msg.attributes.iter().any(
            |a| matches!(a, AddressAttribute::Flags(f) if f.contains(AddressFlags::Permanent)),
        ) || msg.header.flags.contains(AddressHeaderFlags::Permanent);
        let protocol = msg
            .attributes
            .iter()
            .find_map(|a| match a {
                AddressAttribute::Protocol(p) => Some(u8::from(*p)),
                _ => None,
            })
            .unwrap_or(0);
        if let Some(addr) = local.or(address) {
            out.push(AddrEntry {
                ifindex: msg.header.index,
                addr,
                prefix_len: msg.header.prefix_len,
                deprecated,
                protocol,
                dynamic: !permanent,
            });
        }
    }
    Ok(out)
}

/// The unicast and local routes of every table, and the source addresses unicast routes
/// name (`route_sources`).
async fn read_routes(handle: &Handle, state: &mut NodeState) -> Result<(), rtnetlink::Error> {
    for request in [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ] {
        let mut routes = handle.route().get(request).execute();
        while let Some(msg) = routes.try_next().await? {
            let mut table = msg.header.table as u32;
            let mut dst = None;
            let mut oif = None;
            let mut gateway = None;
            let mut pref_source = None;
            for attr in &msg.attributes {
                match attr {
                    RouteAttribute::Table(t) => table = *t,
                    RouteAttribute::Destination(a) => dst = route_ip(a),
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Gateway(a) => gateway = route_ip(a),
                    RouteAttribute::PrefSource(a) => pref_source = route_ip(a),
                    _ => {}
                }
            }
            let local = match msg.header.kind {
                RouteType::Unicast => false,
                RouteType::Local => true,
                _ => continue,
            };
            // A local route's source is its own address (a VIP's too): only unicast routes say
            // which addresses the node sends from.
            if !local {
                state.route_sources.extend(pref_source);
            }
            let v4 = msg.header.address_family == netlink_packet_route::AddressFamily::Inet;
            let addr = dst.unwrap_or(if v4 {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            });
            state.routes.push(RouteEntry {
                dst: Prefix {
                    addr,
                    len: msg.header.destination_prefix_length,
                },
                oif,
                gateway,
                table,
                local,
                protocol: msg.header.protocol.into(),
            });
        }
    }
    Ok(())
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn info_kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::Veth => "veth".into(),
        InfoKind::Bridge => "bridge".into(),
        InfoKind::Dummy => "dummy".into(),
        InfoKind::Ifb => "ifb".into(),
        InfoKind::Other(s) => s.clone(),
        other => format!("{other:?}").to_lowercase(),
    }
}

#[cfg(test)]
#[path = "addrs_tests.rs"]
mod tests;
