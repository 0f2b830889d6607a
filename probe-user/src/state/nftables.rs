//! kube-proxy's nftables mode: the tables `ip kube-proxy` and `ip6 kube-proxy`, read over
//! nf_tables netlink ([`read_blocking`], no `nft` process), or from libnftables JSON
//! (`nft -j list table <family> kube-proxy`: [`parse_nft_json`], for saved files and fixtures).
//! Both make the same table (`build_table`) of what kube-proxy (>= 1.29, GA in 1.33) writes:
//!
//! - the verdict map `service-ips` (`addr . proto . port : goto <chain>`): one [`ServiceEntry`]
//!   per element; the target is `service-<HASH>-<ns>/<name>/<proto>/<port>` for a ClusterIP,
//!   `external-<HASH>-...` for an external or load-balancer IP. kube-proxy leaves a LB IP out
//!   of this map when its Service says `ipMode: Proxy` (or the LB is published as a hostname):
//!   then in-cluster calls to it really go to the LB;
//! - backends: the `dnat to` targets of the `endpoint-...` chains reachable from that chain
//!   (through the `numgen ... vmap` and `goto`s);
//! - the verdict map `service-nodeports` (`proto . port : goto external-...`): one
//!   [`NodePortEntry`] each. `local_only` (externalTrafficPolicy: Local) is read from the
//!   `external-` chain the way kube-proxy writes it: `Cluster` masquerades everything
//!   (an unconditional `jump mark-for-masquerade`) then goes to `service-...`; `Local`
//!   short-circuits pod and local traffic ("short-circuit pod traffic", "masquerade local
//!   traffic": `fib saddr type local jump mark-for-masquerade`) and goes to `local-...`;
//! - the verdict map `no-endpoint-services` (`addr . proto . port : drop | goto reject-chain`):
//!   its `drop` elements as [`NoEndpointDrop`]s (an ETP Local external or LB IP on a node
//!   without a local endpoint; kubernetes#131765);
//! - the verdict map `firewall-ips` and each element's `firewall-` chain's
//!   `saddr != { ranges } drop` rule: `loadBalancerSourceRanges` as kube-proxy enforces it
//!   (`super::nft_firewall`);
//! - every rule with a `masquerade` statement (kube-proxy's `masquerading` chain), as
//!   `nftables <family> kube-proxy chain <chain>: masquerade <flags>`, for evidence.
//!
//! Service names come from the chain names (`default/web/tcp/http` -> `default/web:http`).
//!
//! [`read_blocking`] asks the kernel (per family one rule dump, four map dumps, and a dump of
//! a service chain's anonymous endpoint map only where the chain names leave a doubt), folds
//! each rule into what the table needs of its chain as it arrives, and keeps that with the
//! ruleset generation (`NFT_MSG_GETGEN`): while nothing was committed, a read costs one
//! generation request; after a commit, [`read_blocking_after`] reads again only the chains
//! and maps the commit's messages named. A node without kube-proxy's tables has no nftables
//! service table (`Ok(None)`): kube-proxy is then in another mode.

use std::{
    borrow::Cow,
    collections::{BTreeSet, HashMap, HashSet},
    net::IpAddr,
    sync::Mutex,
};

use probe_contract::Proto;

use super::{
    NoEndpointDrop, NodePortEntry, ServiceEntry, ServiceSource, ServiceTable,
    changes::{FAMILY_IP, FAMILY_IP6, TableChange, Touched},
    iptables,
    nft_firewall::{self, FIREWALL_IPS, FirewallElem},
    nft_json::{self, ExprFacts, Scalar},
    nft_netlink::{
        self, NftNetlinkError,
        wire::{self, Data, Expr, NftRule, SetElem},
    },
};

/// kube-proxy's table name (in both the `ip` and the `ip6` family).
pub const TABLE: &str = "kube-proxy";
/// The families kube-proxy writes a table in.
pub const FAMILIES: [&str; 2] = ["ip", "ip6"];
/// The verdict map of ClusterIPs, external IPs and LB IPs.
pub const SERVICE_IPS: &str = "service-ips";
/// The verdict map of NodePorts.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// The verdict map of destinations without (usable) endpoints: `drop` or `goto reject-chain`.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// The chain every masquerade decision jumps to.
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";

/// Why kube-proxy's tables could not be read (they exist, the kernel's answer failed).
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(transparent)]
    Netlink(#[from] NftNetlinkError),
    #[error("the nftables reader's cache lock is poisoned (a reader panicked)")]
    Poisoned,
}

/// kube-proxy's nftables tables of the calling thread's network namespace, merged over both
/// families, or None when neither table exists: [`read_blocking_after`] with everything
/// touched (a whole read, unless the ruleset generation is the one last read at). Blocking.
pub fn read_blocking() -> Result<Option<ServiceTable>, NftError> {
    read_blocking_after(&Touched::everything())
}

/// kube-proxy's nftables tables, merged over both families, or None when neither table
/// exists. What is held of each family from the last read (its maps' elements and what the
/// table needs of each chain, [`ChainFacts`]; not its rules, not the table they make) is
/// used again: whole while the ruleset generation is the one it was read at or `touched`
/// says nothing of the family's table, and with the chains and maps `touched` names read
/// again (one filtered dump each) while they are few ([`iptables::MAX_CHAIN_READS`],
/// [`iptables::CHAIN_READ_SHARE`]); else the family is read whole ([`read_family`]). A
/// kube-proxy partial sync names the Services' chains and the maps it wrote: at 30,000
/// Services a re-read of the whole table took seconds and ~250 MiB (BENCHMARKS 9m), the
/// chains of one Service a few dumps. Blocking.
pub fn read_blocking_after(touched: &Touched) -> Result<Option<ServiceTable>, NftError> {
    let reuse = super::reuse_parses();
    let netns = nft_netlink::netns_id();
    let generation = nft_netlink::generation()?;
    let mut table: Option<ServiceTable> = None;
    for family in [FAMILY_IP, FAMILY_IP6] {
        let last = if reuse {
            take_held(family, netns)?
        } else {
            None
        };
        let Some(held) = HeldFamily::refresh(family, netns, generation, last, touched)? else {
            continue;
        };
        let parsed = held.table();
        if reuse {
            put_held(held)?;
        }
        match &mut table {
            Some(t) => iptables::merge(t, parsed),
            None => table = Some(parsed),
        }
    }
    Ok(table)
}

/// kube-proxy's table of one family over netlink, read whole, None when there is none: one
/// rule dump of the table (chain by chain when large), each rule folded into its chain's
/// [`ChainFacts`] as it arrives, one element dump of each of `service-ips`,
/// `service-nodeports`, `no-endpoint-services` and `firewall-ips`, and the endpoint chains of
/// each service chain's `numgen` map (by name where that is certain, else dumped), made into
/// what [`parse_nft_json`] makes of JSON (`build_table`: the same table by construction).
pub fn read_family(family: u8) -> Result<Option<ServiceTable>, NftError> {
    let generation = nft_netlink::generation()?;
    Ok(HeldFamily::read_whole(family, nft_netlink::netns_id(), generation)?.map(|h| h.table()))
}

/// What is held of one family's table between reads: its maps' elements, its firewall and
/// what the table needs of each chain. The ruleset generation is the one of the whole read
/// it is (None once patched name by name: then only the commit messages say it is current).
struct HeldFamily {
    family: u8,
    /// The network namespace read ([`nft_netlink::netns_id`]): a process may read several.
    netns: u64,
    generation: Option<u32>,
    service_ips: Vec<Elem<'static>>,
    nodeports: Vec<Elem<'static>>,
    no_endpoint: Vec<Elem<'static>>,
    firewall: Vec<probe_core::state::FirewallEntry>,
    chains: Chains,
}

/// Per family and network namespace; a whole read replaces it.
static HELD: Mutex<Vec<HeldFamily>> = Mutex::new(Vec::new());

fn take_held(family: u8, netns: u64) -> Result<Option<HeldFamily>, NftError> {
    let mut held = HELD.lock().map_err(|_| NftError::Poisoned)?;
    Ok(held
        .iter()
        .position(|h| h.family == family && h.netns == netns)
        .map(|i| held.swap_remove(i)))
}

fn put_held(h: HeldFamily) -> Result<(), NftError> {
    let mut held = HELD.lock().map_err(|_| NftError::Poisoned)?;
    held.retain(|o| !(o.family == h.family && o.netns == h.netns));
    held.push(h);
    Ok(())
}

impl HeldFamily {
    /// `last` brought up to date (see [`read_blocking_after`]), or the family read whole;
    /// None: the family has no kube-proxy table.
    fn refresh(
        family: u8,
        netns: u64,
        generation: u32,
        last: Option<HeldFamily>,
        touched: &Touched,
    ) -> Result<Option<HeldFamily>, NftError> {
        if let Some(mut last) = last {
            if last.generation == Some(generation) {
                return Ok(Some(last));
            }
            match touched.table(family, TABLE) {
                TableChange::Untouched => return Ok(Some(last)),
                TableChange::Named(names)
                    if names.len() <= iptables::MAX_CHAIN_READS
                        && names.len() * iptables::CHAIN_READ_SHARE
                            <= last.chains.len().max(iptables::CHAIN_READ_SHARE) =>
                {
                    last.generation = None;
                    match last.reread(names) {
                        Ok(()) => return Ok(Some(last)),
                        // Half patched: dropped (before the whole read: two copies of the
                        // chains are never alive together), and the family read whole.
                        Err(e) => tracing::debug!(
                            error = %e,
                            "re-reading kube-proxy's nftables chains; reading the table whole"
                        ),
                    }
                }
                _ => {}
            }
        }
        Self::read_whole(family, netns, generation)
    }

    fn read_whole(family: u8, netns: u64, generation: u32) -> Result<Option<HeldFamily>, NftError> {
        // A rule dump of a missing table is empty, not an error: asked first.
        if !nft_netlink::table_exists(family, TABLE)? {
            return Ok(None);
        }
        let fam = family_name(family);
        let chains = std::cell::RefCell::new(Chains::default());
        match nft_netlink::table_rules(
            family,
            TABLE,
            nft_netlink::WHOLE_DUMP_MAX_CHAINS,
            &mut || *chains.borrow_mut() = Chains::default(),
            &mut |r| chains.borrow_mut().fold_netlink(fam, r),
        ) {
            Ok(()) => {}
            Err(e) if e.is_absent() => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let mut chains = chains.into_inner();
        chains.resolve_maps(family, |_, _| true)?;
        Ok(Some(HeldFamily {
            family,
            netns,
            generation: Some(generation),
            service_ips: map_elems(family, SERVICE_IPS, 3)?,
            nodeports: map_elems(family, SERVICE_NODEPORTS, 2)?,
            no_endpoint: map_elems(family, NO_ENDPOINT_SERVICES, 3)?,
            firewall: read_firewall(family)?,
            chains,
        }))
    }

    /// Reads again what `names` (a commit's messages) name: a map's elements, a chain's rules
    /// (gone when it has none), the firewall when its map or one of its chains is named; then
    /// the anonymous maps of every chain whose endpoint chains or map may have changed.
    fn reread(&mut self, names: &BTreeSet<String>) -> Result<(), NftError> {
        let family = self.family;
        let mut firewall = false;
        // Port names (`ns/svc/proto/port`) whose endpoint chains came or went, anonymous maps
        // named, and the chains read again: whose anonymous maps are resolved again.
        let mut ports: HashSet<&str> = HashSet::new();
        let mut sets: HashSet<&str> = HashSet::new();
        let mut reread: HashSet<&str> = HashSet::new();
        for name in names {
            match name.as_str() {
                SERVICE_IPS => self.service_ips = map_elems(family, SERVICE_IPS, 3)?,
                SERVICE_NODEPORTS => self.nodeports = map_elems(family, SERVICE_NODEPORTS, 2)?,
                NO_ENDPOINT_SERVICES => {
                    self.no_endpoint = map_elems(family, NO_ENDPOINT_SERVICES, 3)?;
                }
                FIREWALL_IPS => firewall = true,
                // nft's names of anonymous sets and maps (`__map%d`, `__set%d`); no chain's.
                set if set.starts_with("__") => {
                    sets.insert(set);
                }
                chain => {
                    firewall |= nft_firewall::is_firewall_chain(chain);
                    if let Some(port) = endpoint_port_name(chain) {
                        ports.insert(port);
                    }
                    self.chains.reread(family, chain)?;
                    reread.insert(chain);
                }
            }
        }
        if firewall {
            self.firewall = read_firewall(family)?;
        }
        self.chains.resolve_maps(family, |chain, facts| {
            reread.contains(chain)
                || port_name(chain).is_some_and(|p| ports.contains(p))
                || facts.maps.iter().any(|m| sets.contains(m.set.as_str()))
        })
    }

    fn table(&self) -> ServiceTable {
        let mut table = build_table(
            &self.service_ips,
            &self.nodeports,
            &self.no_endpoint,
            &self.chains,
        );
        table.firewall = self.firewall.clone();
        table
    }
}

/// nft's name of a family this reader reads.
fn family_name(family: u8) -> &'static str {
    if family == FAMILY_IP6 { "ip6" } else { "ip" }
}

/// The elements of one of kube-proxy's verdict maps (`width` 3: `addr . proto . port`, 2:
/// `proto . port`), in key order as `nft` lists them (the kernel's is its hash table's); a
/// missing map has none.
fn map_elems(family: u8, set: &str, width: usize) -> Result<Vec<Elem<'static>>, NftError> {
    match nft_netlink::set_elems(family, TABLE, set) {
        Ok(mut v) => {
            v.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(v.iter()
                .filter_map(|e| elem_from_netlink(e, family, width))
                .collect())
        }
        Err(e) if e.is_absent() => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The `firewall-ips` elements that parsed whole.
fn firewall_elems(elems: &[Elem<'_>]) -> Vec<FirewallElem> {
    elems
        .iter()
        .filter_map(|e| {
            Some(FirewallElem {
                addr: e.addr?,
                proto: e.proto?,
                port: e.port?,
                chain: e.target.as_deref()?.to_string(),
                comment: e.comment.as_deref().map(str::to_string),
            })
        })
        .collect()
}

/// The port name (`ns/svc/proto/port`) of a service, `local-` or `external-` chain
/// (`service-<hash>-<port name>`), or of an endpoint chain with the endpoint after it.
fn port_name(chain: &str) -> Option<&str> {
    chain
        .split_once('-')
        .and_then(|(_, rest)| rest.split_once('-'))
        .map(|(_, name)| name)
}

/// The port name of an endpoint chain
/// (`endpoint-<hash>-<ns>/<name>/<proto>/<port>__<ip>/<port>`).
fn endpoint_port_name(chain: &str) -> Option<&str> {
    chain
        .strip_prefix("endpoint-")
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(_, name)| name.split_once("__"))
        .map(|(port_name, _)| port_name)
}

/// A map element's key (`addr . proto . port`, or `proto . port` with `width` 2), each field
/// in a 4-byte register: the address (4 or 16 bytes), the protocol in the first byte, the
/// port big-endian in the first two.
fn elem_from_netlink(e: &SetElem, family: u8, width: usize) -> Option<Elem<'static>> {
    let addr_len = if width == 3 {
        if family == FAMILY_IP6 { 16 } else { 4 }
    } else {
        0
    };
    if e.key.len() != addr_len + 8 {
        return None;
    }
    let addr = match addr_len {
        4 => <[u8; 4]>::try_from(&e.key[..4]).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(&e.key[..16]).ok().map(IpAddr::from),
        _ => None,
    };
    let (target, drop) = match &e.data {
        Some(Data::Verdict(v)) => (
            v.target().map(|t| Cow::Owned(t.to_string())),
            v.code == wire::NF_DROP,
        ),
        _ => (None, false),
    };
    Some(Elem {
        addr,
        proto: Some(Proto::from_raw(e.key[addr_len])),
        port: Some(u16::from_be_bytes([
            e.key[addr_len + 4],
            e.key[addr_len + 5],
        ])),
        target,
        drop,
        comment: e.comment.clone().map(Cow::Owned),
    })
}

/// What a rule's expressions say, as [`nft_json::exprs`] gathers it from JSON: one entry per
/// statement-like expression (counters left out), so an unconditional `jump` is a rule of one.
/// An anonymous verdict map's targets are not among them: [`Chains::fold_netlink`] notes the
/// map, and [`Chains::resolve_maps`] finds its chains once the table's chain names are known.
fn facts_from_netlink(r: &NftRule) -> Vec<ExprFacts<'static>> {
    let mut regs: HashMap<u32, &[u8]> = HashMap::new();
    let mut out = Vec::with_capacity(r.exprs.len());
    for e in &r.exprs {
        let mut f = ExprFacts::default();
        match e {
            Expr::Counter { .. } => continue,
            Expr::Immediate {
                dreg: 0,
                data: Data::Verdict(v),
            } => {
                if let Some(t) = v.target() {
                    f.verdict = Some(Cow::Owned(t.to_string()));
                    f.targets.push(Cow::Owned(t.to_string()));
                }
            }
            Expr::Immediate {
                dreg,
                data: Data::Value(v),
            } => {
                regs.insert(*dreg, v);
            }
            Expr::Nat {
                kind: wire::NFT_NAT_DNAT,
                reg_addr_min: Some(ra),
                reg_proto_min,
                ..
            } => {
                let addr = regs.get(ra).and_then(|b| match b.len() {
                    4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                    _ => None,
                });
                let port = reg_proto_min
                    .and_then(|r| regs.get(&r))
                    .and_then(|b| Some(u16::from_be_bytes([*b.first()?, *b.get(1)?])));
                if let Some(addr) = addr {
                    f.dnats.push((Cow::Owned(addr.to_string()), port));
                }
            }
            Expr::Masq { flags, .. } => f.masquerade = Some(masquerade_flags(*flags)),
            _ => {}
        }
        out.push(f);
    }
    out
}

/// nft's names of `NF_NAT_RANGE_*` flags, in the order nft prints them (`nat_stmt_print`).
fn masquerade_flags(flags: u32) -> Vec<Cow<'static, str>> {
    [(4, "random"), (16, "fully-random"), (8, "persistent")]
        .into_iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| Cow::Borrowed(name))
        .collect()
}

/// What of `nft -j` output is the rules: the objects' `"handle": N` (new ones on every
/// re-add of the same rules) are left out.
pub fn digest(text: &str, h: &mut std::hash::DefaultHasher) {
    use std::hash::Hash;
    const HANDLE: &str = "\"handle\":";
    let mut rest = text;
    while let Some(at) = rest.find(HANDLE) {
        rest[..at].hash(h);
        rest =
            rest[at + HANDLE.len()..].trim_start_matches(|c: char| c == ' ' || c.is_ascii_digit());
    }
    rest.hash(h);
}

/// Why `nft -j` text was not read.
#[derive(Debug, thiserror::Error)]
pub enum NftJsonError {
    #[error("{0}")]
    Doc(serde_json::Error),
    #[error("rule of chain {chain}: {source}")]
    Rule {
        chain: String,
        source: serde_json::Error,
    },
    #[error("map {name}: {source}")]
    Map {
        name: String,
        source: serde_json::Error,
    },
}

/// Parses `nft -j list table <family> kube-proxy` (or `nft -j list ruleset`: objects of other
/// tables are skipped unread). Fails only when the text is not libnftables JSON (or a
/// kube-proxy rule or map is not shaped as libnftables writes one); anything inside that is not
/// shaped as kube-proxy writes it is skipped. Typed and borrowed ([`nft_json`]): no JSON tree.
pub fn parse_nft_json(text: &str) -> Result<ServiceTable, NftJsonError> {
    let doc: nft_json::Doc<'_> = serde_json::from_str(text).map_err(NftJsonError::Doc)?;
    let mut chains = Chains::default();
    let mut maps: HashMap<&str, Vec<(nft_json::ElemKey<'_>, nft_json::Verdict<'_>)>> =
        HashMap::new();
    let mut ranges = HashMap::new();
    for o in &doc.nftables {
        if let Some(r) = &o.rule {
            if r.table != TABLE {
                continue;
            }
            let Some(raw) = r.expr else { continue };
            if nft_firewall::is_firewall_chain(&r.chain)
                && let Some(allowed) = nft_firewall::ranges_from_json(raw.get())
            {
                ranges.insert(r.chain.to_string(), allowed);
            }
            let expr = nft_json::exprs(raw).map_err(|source| NftJsonError::Rule {
                chain: r.chain.to_string(),
                source,
            })?;
            chains.fold(
                r.family.as_deref().unwrap_or("ip"),
                &r.chain,
                &expr,
                r.comment.as_deref(),
            );
        } else if let Some(m) = &o.map {
            if m.table != TABLE
                || !matches!(
                    m.name.as_ref(),
                    SERVICE_IPS | SERVICE_NODEPORTS | NO_ENDPOINT_SERVICES | FIREWALL_IPS
                )
            {
                continue;
            }
            if let Some(raw) = m.elem {
                let elems = nft_json::elements(raw).map_err(|source| NftJsonError::Map {
                    name: m.name.to_string(),
                    source,
                })?;
                maps.insert(m.name.as_ref(), elems);
            }
        }
    }
    let elems = |name: &str, width: usize| -> Vec<Elem<'_>> {
        maps.get(name)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|(key, verdict)| {
                let parts = key.parts().filter(|p| p.len() == width)?;
                let (addr, proto, port) = match parts {
                    [addr, proto, port] => (
                        addr.as_str().and_then(|a| a.parse::<IpAddr>().ok()),
                        parse_proto(proto),
                        parse_port(port),
                    ),
                    [proto, port] => (None, parse_proto(proto), parse_port(port)),
                    _ => return None,
                };
                Some(Elem {
                    addr,
                    proto,
                    port,
                    target: verdict.target().map(Cow::Borrowed),
                    drop: verdict.drop,
                    comment: key.comment().map(Cow::Borrowed),
                })
            })
            .collect()
    };
    let mut table = build_table(
        &elems(SERVICE_IPS, 3),
        &elems(SERVICE_NODEPORTS, 2),
        &elems(NO_ENDPOINT_SERVICES, 3),
        &chains,
    );
    table.firewall = nft_firewall::entries(&firewall_elems(&elems(FIREWALL_IPS, 3)), &ranges);
    Ok(table)
}

/// An element of one of kube-proxy's verdict maps, typed: what both readers (JSON and
/// netlink) make of `addr . proto . port : verdict` (a NodePort's has no address). A field that
/// did not parse is None, and the element is skipped where it is needed.
struct Elem<'a> {
    addr: Option<IpAddr>,
    proto: Option<Proto>,
    port: Option<u16>,
    /// A `goto`/`jump` verdict's chain.
    target: Option<Cow<'a, str>>,
    drop: bool,
    comment: Option<Cow<'a, str>>,
}

/// The service table of kube-proxy's maps and chains, however they were read: the JSON and
/// the netlink reader make the same table by construction.
fn build_table(
    service_ips: &[Elem<'_>],
    nodeports: &[Elem<'_>],
    no_endpoint: &[Elem<'_>],
    chains: &Chains,
) -> ServiceTable {
    let mut table = ServiceTable {
        source: Some(ServiceSource::Nftables),
        ..ServiceTable::default()
    };
    // Every element first, merged once (a Service's IP may appear under several elements).
    let mut found = ServiceTable::default();
    // (address, proto, port) that `service-ips` sends to an `external-` chain: LB and external
    // IPs. A `drop` element of `no-endpoint-services` counts only for those: kube-proxy also
    // writes `drop` for a ClusterIP of an internalTrafficPolicy Local Service without a local
    // endpoint (`internalTrafficFilterVerdict`), which is that policy doing what it says.
    let mut external: HashSet<(IpAddr, Proto, u16)> = HashSet::new();

    for e in service_ips {
        let (Some(vip), Some(proto), Some(port), Some(target)) =
            (e.addr, e.proto, e.port, e.target.as_deref())
        else {
            continue;
        };
        if target.starts_with("external-") {
            external.insert((vip, proto, port));
        }
        found.services.push(ServiceEntry {
            vip,
            port,
            proto,
            service: service_name(target),
            backends: chains.backends(target),
        });
    }

    for e in nodeports {
        let (Some(proto), Some(port), Some(target)) = (e.proto, e.port, e.target.as_deref()) else {
            continue;
        };
        found.nodeports.push(NodePortEntry {
            port,
            proto,
            service: service_name(target),
            local_only: chains.local_only(target),
        });
    }
    iptables::merge(&mut table, found);

    for e in no_endpoint {
        let (true, Some(addr), Some(proto), Some(port)) = (e.drop, e.addr, e.proto, e.port) else {
            continue;
        };
        if !external.contains(&(addr, proto, port)) {
            continue;
        }
        table.no_endpoint_drops.push(NoEndpointDrop {
            addr,
            proto,
            port,
            service: e.comment.as_deref().map(str::to_owned),
        });
    }

    for text in chains.masquerade_rules() {
        if !table.masquerade_rules.contains(&text) {
            table.masquerade_rules.push(text);
        }
    }
    table
}

fn parse_proto(v: &Scalar<'_>) -> Option<Proto> {
    match v {
        Scalar::Str(s) => match s.as_ref() {
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            "sctp" => Some(Proto::Other(132)),
            other => other.parse::<u8>().ok().map(Proto::from_raw),
        },
        Scalar::Num(n) => u8::try_from(*n).ok().map(Proto::from_raw),
        Scalar::Other => None,
    }
}

fn parse_port(v: &Scalar<'_>) -> Option<u16> {
    match v {
        Scalar::Num(n) => u16::try_from(*n).ok(),
        Scalar::Str(s) => s.parse().ok(),
        Scalar::Other => None,
    }
}

/// `service-SUSTUHLJ-default/web/tcp/http` (or `external-`, `local-`) -> `default/web:http`.
pub(super) fn service_name(chain: &str) -> Option<String> {
    let (_kind, rest) = chain.split_once('-')?;
    let (_hash, name) = rest.split_once('-')?;
    let name = name.split("__").next()?;
    let [ns, svc, _proto, port] = name.split('/').collect::<Vec<_>>()[..] else {
        return None;
    };
    Some(format!("{ns}/{svc}:{port}"))
}

/// What the service table needs of one chain's rules, folded as each rule arrives (from JSON
/// or netlink): the rules themselves are not kept. Holding them decoded cost ~1.5 KB a rule,
/// ~250 MiB for the ~100,000 rules of 30,000 Services (BENCHMARKS 9m).
#[derive(Debug, Default, Clone)]
struct ChainFacts {
    /// `dnat to` targets (`ip:port`, IPv6 `[ip]:port`).
    dnats: Vec<String>,
    /// The chains its rules `jump`/`goto`, directly or through an inline map, but
    /// `mark-for-masquerade` (never a way to a backend).
    targets: Vec<String>,
    /// The anonymous verdict maps the netlink reader met (JSON lists their targets inline).
    maps: Vec<AnonymousMap>,
    /// A rule that is only `jump mark-for-masquerade`: an `external-` chain of
    /// externalTrafficPolicy Cluster masquerades everything.
    masquerades_all: bool,
    /// A rule of the Local shape: a `local-` verdict, or kube-proxy's "masquerade local
    /// traffic" or "short-circuit" comment.
    local_rules: bool,
    /// Its masquerade rules, as evidence text.
    masquerades: Vec<String>,
}

/// `numgen random mod N vmap __mapK`: the anonymous map, N, and the endpoint chains it goes
/// to once [`Chains::resolve_maps`] has found them.
#[derive(Debug, Clone)]
struct AnonymousMap {
    set: String,
    modulus: Option<usize>,
    targets: Vec<String>,
}

impl ChainFacts {
    /// One rule of `chain` in `family` (`ip`, `ip6`): what its expressions say, its comment.
    fn fold(&mut self, family: &str, chain: &str, expr: &[ExprFacts<'_>], comment: Option<&str>) {
        if expr.len() == 1 && expr[0].verdict.as_deref() == Some(MARK_FOR_MASQUERADE) {
            self.masquerades_all = true;
        }
        let local_comment = comment.is_some_and(|c| {
            c.starts_with("masquerade local traffic") || c.starts_with("short-circuit")
        });
        let local_verdict = expr
            .iter()
            .filter_map(|e| e.verdict.as_deref())
            .any(|t| t.starts_with("local-"));
        self.local_rules |= local_comment || local_verdict;
        for e in expr {
            for (addr, port) in &e.dnats {
                let dnat = match (addr.parse::<IpAddr>(), port) {
                    (Ok(IpAddr::V6(a)), Some(p)) => format!("[{a}]:{p}"),
                    (_, Some(p)) => format!("{addr}:{p}"),
                    (_, None) => addr.to_string(),
                };
                if !self.dnats.contains(&dnat) {
                    self.dnats.push(dnat);
                }
            }
            for t in &e.targets {
                if t != MARK_FOR_MASQUERADE && !self.targets.iter().any(|have| have == t) {
                    self.targets.push(t.to_string());
                }
            }
        }
        if let Some(flags) = expr.iter().find_map(|e| e.masquerade.as_ref()) {
            let flags: String = flags.iter().map(|f| format!(" {f}")).collect();
            let comment = comment
                .map(|c| format!(" comment \"{c}\""))
                .unwrap_or_default();
            self.masquerades.push(format!(
                "nftables {family} {TABLE} chain {chain}: masquerade{flags}{comment}"
            ));
        }
    }
}

/// The chains of one table (or of two families' JSON), by name.
#[derive(Debug, Default)]
struct Chains {
    by_name: HashMap<String, ChainFacts>,
}

impl Chains {
    fn len(&self) -> usize {
        self.by_name.len()
    }

    fn get(&self, chain: &str) -> Option<&ChainFacts> {
        self.by_name.get(chain)
    }

    /// The facts of `chain`, made when it is new (a chain with no rule is never one here).
    fn entry(&mut self, chain: &str) -> &mut ChainFacts {
        self.by_name.entry(chain.to_owned()).or_default()
    }

    fn fold(&mut self, family: &str, chain: &str, expr: &[ExprFacts<'_>], comment: Option<&str>) {
        self.entry(chain).fold(family, chain, expr, comment);
    }

    /// A rule as the netlink reader decodes it: its facts, and the anonymous verdict maps it
    /// looks up with the `numgen` modulus before each.
    fn fold_netlink(&mut self, family: &str, r: NftRule) {
        let facts = self.entry(&r.chain);
        facts.fold(
            family,
            &r.chain,
            &facts_from_netlink(&r),
            r.comment.as_deref(),
        );
        let mut modulus = None;
        for e in &r.exprs {
            match e {
                Expr::Numgen { modulus: m, .. } => modulus = Some(*m as usize),
                Expr::Lookup {
                    set, dreg: Some(0), ..
                } if set.starts_with("__") && !facts.maps.iter().any(|m| m.set == *set) => {
                    facts.maps.push(AnonymousMap {
                        set: set.clone(),
                        modulus,
                        targets: Vec::new(),
                    });
                }
                _ => {}
            }
        }
    }

    /// Reads `chain` of `family`'s table again (one filtered dump), folded as its rules
    /// arrive; gone when it has none. Its anonymous maps wait for [`Chains::resolve_maps`].
    fn reread(&mut self, family: u8, chain: &str) -> Result<(), NftError> {
        let fam = family_name(family);
        let read = std::cell::RefCell::new(Chains::default());
        nft_netlink::rules(
            family,
            TABLE,
            Some(chain),
            &mut || *read.borrow_mut() = Chains::default(),
            &mut |r| read.borrow_mut().fold_netlink(fam, r),
        )?;
        match read.into_inner().by_name.remove(chain) {
            Some(facts) => self.by_name.insert(chain.to_string(), facts),
            None => self.by_name.remove(chain),
        };
        Ok(())
    }

    /// The endpoint chains of the anonymous maps of each chain `which` picks. kube-proxy
    /// names an endpoint's chain after its Service port
    /// (`endpoint-<hash>-<ns>/<name>/<proto>/<port>__<ip>/<port>` beside
    /// `service-<hash>-<ns>/<name>/<proto>/<port>`; kubernetes `pkg/proxy/nftables/proxier.go`,
    /// `servicePortEndpointChainNameBase`), and a map's N elements are N distinct endpoint
    /// chains of that port: when the port has exactly N such chains, they are the map's.
    /// Otherwise (a `local-` chain's subset, an endpoint's chain kept while it is out of the
    /// maps, a truncated name) the map is dumped. Dumping every map is not an option: the
    /// kernel finds a set by name in a list, so 10,000 of them took 5-7 s (measured here,
    /// 10,000 Services).
    fn resolve_maps(
        &mut self,
        family: u8,
        which: impl Fn(&str, &ChainFacts) -> bool,
    ) -> Result<(), NftError> {
        let picked: Vec<String> = self
            .by_name
            .iter()
            .filter(|(name, facts)| !facts.maps.is_empty() && which(name, facts))
            .map(|(name, _)| name.clone())
            .collect();
        if picked.is_empty() {
            return Ok(());
        }
        let ports: HashSet<&str> = picked.iter().filter_map(|c| port_name(c)).collect();
        let mut by_port: HashMap<&str, Vec<&str>> = HashMap::new();
        for name in self.by_name.keys() {
            if let Some(port) = endpoint_port_name(name).filter(|p| ports.contains(p)) {
                by_port.entry(port).or_default().push(name);
            }
        }
        let mut resolved: Vec<(&String, usize, Vec<String>)> = Vec::new();
        for chain in &picked {
            let Some(facts) = self.by_name.get(chain) else {
                continue;
            };
            for (i, map) in facts.maps.iter().enumerate() {
                let named = port_name(chain)
                    .and_then(|p| by_port.get(p))
                    .filter(|chains| Some(chains.len()) == map.modulus);
                let targets = match named {
                    Some(chains) => chains.iter().map(|c| c.to_string()).collect(),
                    None => nft_netlink::set_elems(family, TABLE, &map.set)?
                        .iter()
                        .filter_map(|e| match &e.data {
                            Some(Data::Verdict(v)) => v.target().map(str::to_string),
                            _ => None,
                        })
                        .collect(),
                };
                resolved.push((chain, i, targets));
            }
        }
        // `picked` is the chains' names apart from the map: no copy of them is needed here.
        for (chain, i, targets) in resolved {
            if let Some(map) = self.by_name.get_mut(chain).and_then(|f| f.maps.get_mut(i)) {
                map.targets = targets;
            }
        }
        Ok(())
    }

    /// `dnat to` targets reachable from `chain` (as `ip:port`, IPv6 as `[ip]:port`).
    fn backends(&self, chain: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        self.collect(chain, &mut seen, &mut out);
        out.sort();
        out.dedup();
        out
    }

    fn collect<'s>(&'s self, chain: &'s str, seen: &mut HashSet<&'s str>, out: &mut Vec<String>) {
        if chain == MARK_FOR_MASQUERADE || !seen.insert(chain) {
            return;
        }
        let Some(facts) = self.get(chain) else {
            return;
        };
        out.extend(facts.dnats.iter().cloned());
        let mapped = facts.maps.iter().flat_map(|m| &m.targets);
        for t in facts.targets.iter().chain(mapped) {
            self.collect(t, seen, out);
        }
    }

    /// The `external-` chain `chain` has kube-proxy's `externalTrafficPolicy: Local` shape:
    /// no unconditional masquerade, and the Local rules (a `local-` chain, or the
    /// "masquerade local traffic" short-circuit).
    fn local_only(&self, chain: &str) -> bool {
        chain.starts_with("external-")
            && self
                .get(chain)
                .is_some_and(|f| !f.masquerades_all && f.local_rules)
    }

    /// Every masquerade rule's text, chain by chain in name order: the same chains give the
    /// same list, read whole or in parts, from JSON or netlink.
    fn masquerade_rules(&self) -> Vec<String> {
        let mut with: Vec<(&String, &ChainFacts)> = self
            .by_name
            .iter()
            .filter(|(_, f)| !f.masquerades.is_empty())
            .collect();
        with.sort_by(|a, b| a.0.cmp(b.0));
        with.into_iter()
            .flat_map(|(_, f)| f.masquerades.iter().cloned())
            .collect()
    }

    /// Keeps the chains `keep` says.
    fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_name.retain(|name, _| keep(name));
    }

    fn contains(&self, chain: &str) -> bool {
        self.by_name.contains_key(chain)
    }
}

/// kube-proxy's chain that masquerades what `mark-for-masquerade` marked
/// (kubernetes `pkg/proxy/nftables/proxier.go`, `masqueradingChain`).
pub const MASQUERADING: &str = "masquerading";

/// Beside the table from the API (`state::dataplane`): the NodePorts as programmed (the
/// `service-nodeports` map and the `external-` chains its elements go to, which say
/// externalTrafficPolicy) and the masquerade rules (chain `masquerading`), of both families;
/// no `service-ips`, no service or endpoint chain. None: kube-proxy has no nftables table
/// here. Blocking.
///
/// Incremental: what `touched` does not name is taken from the last read (per network
/// namespace). A kube-proxy partial sync names only the changed Services' chains and the
/// maps it wrote, so at 10,000 Services (2,000 NodePorts) it costs the NodePort map and the
/// few `external-` chains it rewrote, not 2,000 chain dumps.
pub fn read_facts_after(touched: &Touched) -> Result<Option<ServiceTable>, NftError> {
    static HELD: Mutex<Option<(u64, HashMap<u8, FamilyFacts>)>> = Mutex::new(None);
    let netns = nft_netlink::netns_id();
    let mut guard = HELD.lock().map_err(|_| NftError::Poisoned)?;
    if guard.as_ref().is_none_or(|(n, _)| *n != netns) {
        *guard = Some((netns, HashMap::new()));
    }
    let Some((_, held)) = guard.as_mut() else {
        return Ok(None);
    };
    let mut table: Option<ServiceTable> = None;
    for family in [FAMILY_IP, FAMILY_IP6] {
        if !nft_netlink::table_exists(family, TABLE)? {
            held.remove(&family);
            continue;
        }
        let last = held.remove(&family);
        let change = match &last {
            None => TableChange::Whole,
            Some(_) => touched.table(family, TABLE),
        };
        let facts = FamilyFacts::read(family, last, change)?;
        let parsed = facts.table();
        held.insert(family, facts);
        match &mut table {
            Some(t) => iptables::merge(t, parsed),
            None => table = Some(parsed),
        }
    }
    Ok(table)
}

/// One family's NodePort map and the chains [`read_facts_after`] reads, as last read.
struct FamilyFacts {
    nodeports: Vec<Elem<'static>>,
    /// kube-proxy's firewall (`firewall-ips` and its chains' ranges), read whole when the map
    /// or a `firewall-` chain was touched: only the rules say what it drops (issue #51).
    firewall: Vec<probe_core::state::FirewallEntry>,
    /// The `external-` chains the map's elements go to, and `masquerading`.
    chains: Chains,
}

impl FamilyFacts {
    /// Reads what `change` names (everything without `last`, or when the table was replaced).
    fn read(
        family: u8,
        last: Option<FamilyFacts>,
        change: TableChange<'_>,
    ) -> Result<FamilyFacts, NftError> {
        let (mut facts, named) = match (last, change) {
            (Some(last), TableChange::Untouched) => return Ok(last),
            (Some(last), TableChange::Named(names)) => (last, Some(names)),
            _ => (
                FamilyFacts {
                    nodeports: Vec::new(),
                    firewall: Vec::new(),
                    chains: Chains::default(),
                },
                None,
            ),
        };
        let stale = |name: &str| named.is_none_or(|n| n.contains(name));
        if stale(SERVICE_NODEPORTS) {
            facts.nodeports = map_elems(family, SERVICE_NODEPORTS, 2)?;
        }
        let firewall_touched = named.is_none_or(|n| {
            n.iter()
                .any(|c| c == FIREWALL_IPS || nft_firewall::is_firewall_chain(c))
        });
        if firewall_touched {
            facts.firewall = read_firewall(family)?;
        }
        let mut wanted: HashSet<String> = facts
            .nodeports
            .iter()
            .filter_map(|e| e.target.as_deref().map(str::to_string))
            .collect();
        wanted.insert(MASQUERADING.to_string());
        facts.chains.retain(|name| wanted.contains(name));
        // The external- and masquerading chains hold no endpoint map.
        for chain in wanted {
            if facts.chains.contains(&chain) && !stale(&chain) {
                continue;
            }
            match facts.chains.reread(family, &chain) {
                Ok(()) => {}
                Err(NftError::Netlink(e)) if e.is_absent() => {
                    facts.chains.retain(|name| name != chain);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(facts)
    }

    fn table(&self) -> ServiceTable {
        let mut table = build_table(&[], &self.nodeports, &[], &self.chains);
        table.firewall = self.firewall.clone();
        table
    }
}

/// One family's firewall: the `firewall-ips` elements and the rules of each element's chain.
fn read_firewall(family: u8) -> Result<Vec<probe_core::state::FirewallEntry>, NftError> {
    let elems = firewall_elems(&map_elems(family, FIREWALL_IPS, 3)?);
    let mut rules = Vec::new();
    let chains: HashSet<&str> = elems.iter().map(|e| e.chain.as_str()).collect();
    for chain in chains {
        match nft_netlink::rules_vec(family, TABLE, Some(chain)) {
            Ok(r) => rules.extend(r),
            Err(e) if e.is_absent() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let ranges = nft_firewall::ranges_from_netlink(family, TABLE, &rules)?;
    Ok(nft_firewall::entries(&elems, &ranges))
}

/// The `service-ips` element for `addr . proto . port`, as `nft` would print it, or None:
/// what kube-proxy's nftables mode programmed for one VIP:port (`state::dataplane`). One
/// element dump of the family's map. Blocking.
pub fn service_ip_element(
    addr: IpAddr,
    port: u16,
    proto: Proto,
) -> Result<Option<String>, NftError> {
    let family = if addr.is_ipv6() {
        FAMILY_IP6
    } else {
        FAMILY_IP
    };
    let elems = match nft_netlink::set_elems(family, TABLE, SERVICE_IPS) {
        Ok(v) => v,
        Err(e) if e.is_absent() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(elems
        .iter()
        .filter_map(|e| elem_from_netlink(e, family, 3))
        .find(|e| e.addr == Some(addr) && e.port == Some(port) && e.proto == Some(proto))
        .map(|e| {
            format!(
                "{addr} . {} . {port} : {}",
                proto.as_str(),
                e.target
                    .as_deref()
                    .map(|t| format!("goto {t}"))
                    .unwrap_or_else(|| "(no verdict)".into())
            )
        }))
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::state::test_netns::{Netns, root_with, scratch_with};

    const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/nftables/");

    fn fixture(name: &str) -> ServiceTable {
        let text = std::fs::read_to_string(format!("{DATA}{name}")).expect("fixture");
        parse_nft_json(&text).expect("parses")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The lab's `ip kube-proxy` table (the lab's nftables mode, test-support), captured with nft 1.0.6.
    #[test]
    fn lab_capture() {
        let t = fixture("lab-ip.json");
        assert_eq!(t.source, Some(ServiceSource::Nftables));
        assert_eq!(t.services.len(), 1, "{t:#?}");
        let web = t.serves(ip("198.18.100.10"), 80, Proto::Tcp).unwrap();
        assert_eq!(web.service.as_deref(), Some("default/web:http"));
        assert_eq!(web.backends, ["198.19.1.11:8080"]);
        // The LB IP is not in service-ips (ipMode: Proxy): not served on the node.
        assert!(t.serves(ip("203.0.113.10"), 80, Proto::Tcp).is_none());
        let np = t.nodeport(30080, Proto::Tcp).unwrap();
        assert_eq!(np.service.as_deref(), Some("default/web:http"));
        assert!(
            !np.local_only,
            "Cluster policy: unconditional mark-for-masquerade"
        );
        assert_eq!(
            t.masquerade_rules,
            ["nftables ip kube-proxy chain masquerading: masquerade fully-random"]
        );
    }

    /// externalTrafficPolicy: Local, a LB IP, UDP, two endpoints, the older `fib daddr type
    /// local` NodePort rule.
    #[test]
    fn etp_local_capture() {
        let t = fixture("etp-local-ip.json");
        assert_eq!(t.services.len(), 3);
        let cip = t.serves(ip("10.96.40.7"), 443, Proto::Tcp).unwrap();
        assert_eq!(cip.service.as_deref(), Some("shop/api:https"));
        assert_eq!(cip.backends, ["10.244.1.5:8443", "10.244.2.9:8443"]);
        let lb = t.serves(ip("192.0.2.44"), 443, Proto::Tcp).unwrap();
        assert_eq!(lb.service.as_deref(), Some("shop/api:https"));
        // external -> service (pod / local traffic) and local (the rest): every endpoint.
        assert_eq!(lb.backends, ["10.244.1.5:8443", "10.244.2.9:8443"]);
        let dns = t.serves(ip("10.96.0.10"), 53, Proto::Udp).unwrap();
        assert_eq!(dns.service.as_deref(), Some("kube-system/kube-dns:dns"));
        assert_eq!(dns.backends, ["10.244.1.3:53"]);
        assert!(t.serves(ip("10.96.0.10"), 53, Proto::Tcp).is_none());
        let np = t.nodeport(31443, Proto::Tcp).unwrap();
        assert!(np.local_only);
        assert_eq!(np.service.as_deref(), Some("shop/api:https"));
    }

    #[test]
    fn ipv6_table_and_merge() {
        let v6 = fixture("dualstack-ip6.json");
        let web = v6.serves(ip("2001:db8:96::10"), 80, Proto::Tcp).unwrap();
        assert_eq!(web.service.as_deref(), Some("default/web:http"));
        assert_eq!(web.backends, ["[2001:db8:19:1::11]:8080"]);
        assert_eq!(
            v6.masquerade_rules,
            ["nftables ip6 kube-proxy chain masquerading: masquerade fully-random"]
        );
        let mut t = fixture("lab-ip.json");
        iptables::merge(&mut t, v6);
        assert_eq!(t.services.len(), 2);
        assert_eq!(t.nodeports.len(), 1, "one NodePort for both families");
        assert_eq!(t.masquerade_rules.len(), 2);
        assert_eq!(t.source, Some(ServiceSource::Nftables));
    }

    #[test]
    fn names_from_chains() {
        assert_eq!(
            service_name("external-SUSTUHLJ-default/web/tcp/http").as_deref(),
            Some("default/web:http")
        );
        assert_eq!(
            service_name("endpoint-3BP42DYS-default/web/tcp/http__2001.db8.19.1..11/8080")
                .as_deref(),
            Some("default/web:http")
        );
        assert_eq!(service_name("masquerading"), None);
        assert_eq!(service_name("service-TRUNCATED-a/b..."), None);
    }

    #[test]
    fn other_json_is_skipped_and_garbage_is_an_error() {
        assert!(parse_nft_json("not json").is_err());
        assert!(parse_nft_json("{}").is_err());
        let t = parse_nft_json(r#"{"nftables": [{"map": {"table": "other", "name": "service-ips", "elem": [[{"concat": ["10.0.0.1", "tcp", 80]}, {"goto": {"target": "x"}}]]}}]}"#).unwrap();
        assert!(t.services.is_empty());
        let odd = r#"{"nftables": [
            {"map": {"table": "kube-proxy", "name": "service-ips", "elem": [
                [{"concat": ["10.0.0.1", "tcp"]}, {"goto": {"target": "x"}}],
                [{"concat": ["nope", "tcp", 80]}, {"goto": {"target": "x"}}],
                [{"concat": ["10.0.0.2", "tcp", 99999]}, {"goto": {"target": "x"}}],
                [{"concat": ["10.0.0.3", "tcp", 80]}, {"drop": null}],
                [{"elem": {"val": {"concat": ["10.0.0.4", 6, 80]}, "comment": "a/b:c"}}, {"goto": {"target": "service-AAAAAAAA-a/b/tcp/c"}}],
                "junk", 7, null]}},
            {"rule": {"table": "kube-proxy", "chain": "service-AAAAAAAA-a/b/tcp/c", "expr": [{"goto": {"target": "service-AAAAAAAA-a/b/tcp/c"}}]}},
            {"rule": {"table": "kube-proxy", "chain": "y"}}
        ]}"#;
        let t = parse_nft_json(odd).unwrap();
        assert_eq!(t.services.len(), 1, "{t:#?}");
        assert_eq!(t.services[0].vip, ip("10.0.0.4"));
        assert_eq!(t.services[0].service.as_deref(), Some("a/b:c"));
        assert!(t.services[0].backends.is_empty(), "a goto loop ends");
        // Every prefix of a real capture: an error or a table, never a panic.
        let text = std::fs::read_to_string(format!("{DATA}lab-ip.json")).unwrap();
        for cut in (0..text.len()).step_by(11) {
            let _ = parse_nft_json(&text[..cut]);
        }
    }

    /// `no-endpoint-services` as `nft -j` prints it (kube-proxy's shapes, kubernetes#131765):
    /// only `drop` elements of LB/external IPs (sent to an `external-` chain by
    /// `service-ips`) are kept, with their comment; `goto reject-chain` (a Service with no
    /// endpoints at all), a ClusterIP's `drop` (internalTrafficPolicy Local) and other tables
    /// are not.
    #[test]
    fn no_endpoint_services_drop_elements_are_read() {
        let text = r#"{"nftables": [
            {"map": {"family": "ip", "table": "kube-proxy", "name": "service-ips", "map": "verdict", "elem": [
                [{"concat": ["203.0.113.10", "tcp", 8445]}, {"goto": {"target": "external-MW3VTDQO-default/web-local/tcp/http"}}],
                [{"concat": ["203.0.113.11", "udp", 53]}, {"goto": {"target": "external-AAAAAAAA-default/dns/udp/dns"}}]]}},
            {"map": {"family": "ip", "table": "kube-proxy", "name": "no-endpoint-services", "map": "verdict", "elem": [
                [{"elem": {"val": {"concat": ["198.18.100.13", "tcp", 80]}, "comment": "default/itp-local:http"}}, {"drop": null}],
                [{"elem": {"val": {"concat": ["203.0.113.10", "tcp", 8445]}, "comment": "default/web-local:http"}}, {"drop": null}],
                [{"concat": ["203.0.113.11", "udp", 53]}, {"drop": null}],
                [{"elem": {"val": {"concat": ["198.18.100.12", "tcp", 80]}, "comment": "default/none:http"}}, {"goto": {"target": "reject-chain"}}],
                [{"concat": ["nope", "tcp", 80]}, {"drop": null}]]}},
            {"map": {"family": "ip", "table": "other", "name": "no-endpoint-services", "elem": [
                [{"concat": ["192.0.2.1", "tcp", 80]}, {"drop": null}]]}}
        ]}"#;
        let t = parse_nft_json(text).unwrap();
        assert_eq!(
            t.no_endpoint_drops,
            vec![
                NoEndpointDrop {
                    addr: ip("203.0.113.10"),
                    proto: Proto::Tcp,
                    port: 8445,
                    service: Some("default/web-local:http".into()),
                },
                NoEndpointDrop {
                    addr: ip("203.0.113.11"),
                    proto: Proto::Udp,
                    port: 53,
                    service: None,
                },
            ]
        );
        assert!(
            t.no_endpoint_drop(ip("203.0.113.10"), 8445, Proto::Tcp)
                .is_some()
        );
        assert!(
            t.no_endpoint_drop(ip("203.0.113.10"), 80, Proto::Tcp)
                .is_none()
        );
        assert_eq!(t.services.len(), 2, "no-endpoint elements are no services");
        // The lab capture (all endpoints local) has none.
        assert!(fixture("lab-ip.json").no_endpoint_drops.is_empty());
    }

    /// A scratch namespace holding the dual-stack fixture ruleset (root and `nft` only).
    fn etp_local_scratch(group: &str) -> Option<Netns> {
        let ns = scratch_with("nft", group)?;
        ns.exec(0, &["nft", "-f", &format!("{DATA}etp-local.nft")]);
        Some(ns)
    }

    /// `read_blocking` in a scratch namespace holding the dual-stack fixture ruleset (root and
    /// `nft` only): both families, merged.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn read_in_namespace() {
        let Some(ns) = scratch_with("nft", "nft") else {
            return;
        };
        assert!(
            ns.run_in(0, read_blocking).unwrap().is_none(),
            "no tables: no table"
        );
        assert!(
            Command::new("ip")
                .args(["netns", "exec", ns.name(0), "nft", "-f"])
                .arg(format!("{DATA}etp-local.nft"))
                .status()
                .unwrap()
                .success()
        );
        let mut want = fixture("etp-local-ip.json");
        iptables::merge(&mut want, fixture("dualstack-ip6.json"));
        assert_eq!(ns.run_in(0, read_blocking).unwrap().unwrap(), want);
    }

    /// Every JSON fixture, loaded with `nft -j -f` into a fresh namespace and read back over
    /// netlink, makes the table [`parse_nft_json`] makes of it.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn netlink_table_equals_the_json_table_of_every_fixture() {
        if !root_with("nft") {
            return;
        }
        let mut checked = 0;
        for (name, family) in [
            ("lab-ip.json", FAMILY_IP),
            ("etp-local-ip.json", FAMILY_IP),
            ("dualstack-ip6.json", FAMILY_IP6),
        ] {
            let ns = Netns::new("nftnl", &[""]);
            // As input, a rule's `handle` is a position (an existing rule to add after): the
            // listing's handles are left out.
            let mut doc: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(format!("{DATA}{name}")).unwrap())
                    .unwrap();
            let objects = doc["nftables"].as_array_mut().unwrap();
            for o in objects.iter_mut() {
                for v in o.as_object_mut().unwrap().values_mut() {
                    if let Some(obj) = v.as_object_mut() {
                        obj.remove("handle");
                    }
                }
            }
            // A map's `goto` elements need their chains: chains before maps, rules last.
            let rank = |o: &serde_json::Value| {
                ["metainfo", "table", "set", "chain", "map", "rule"]
                    .iter()
                    .position(|k| o.get(k).is_some())
                    .unwrap_or(6)
            };
            objects.sort_by_key(rank);
            let input =
                std::env::temp_dir().join(format!("clb-nftnl-{}-{name}", std::process::id()));
            std::fs::write(&input, doc.to_string()).unwrap();
            ns.exec(0, &["nft", "-j", "-f", input.to_str().unwrap()]);
            let _ = std::fs::remove_file(&input);
            let got = ns.run_in(0, move || read_family(family)).unwrap();
            let want = fixture(name);
            assert!(!want.services.is_empty() && !want.masquerade_rules.is_empty());
            assert_eq!(got, Some(want), "{name}");
            checked += 1;
        }
        assert_eq!(checked, 3);
    }

    /// The generation cache: an unchanged ruleset is not read again, a commit is.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn a_read_follows_the_generation() {
        let Some(ns) = etp_local_scratch("nftgen") else {
            return;
        };
        let first = ns.run_in(0, read_blocking).unwrap().unwrap();
        ns.exec(
            0,
            &[
                "nft",
                "add",
                "element",
                "ip",
                "kube-proxy",
                "service-ips",
                "{ 10.96.9.9 . tcp . 8080 : goto service-DZ3B7L2Q-shop/api/tcp/https }",
            ],
        );
        let second = ns.run_in(0, read_blocking).unwrap().unwrap();
        assert_eq!(second.services.len(), first.services.len() + 1);
        let added = second.serves(ip("10.96.9.9"), 8080, Proto::Tcp).unwrap();
        assert_eq!(added.backends, ["10.244.1.5:8443", "10.244.2.9:8443"]);
    }

    /// An endpoint chain out of the maps (kube-proxy keeps it a while; the lab's `web-local`
    /// without its local endpoint) is no backend: the netlink read equals the JSON of the same
    /// table, and the stray address is in neither.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn an_endpoint_chain_out_of_the_maps_is_no_backend() {
        let Some(ns) = etp_local_scratch("nftstray") else {
            return;
        };
        let stray = "endpoint-ZZZZZZZZ-shop/api/tcp/https__10.244.9.9/8443";
        ns.exec(0, &["nft", "add", "chain", "ip", TABLE, stray]);
        ns.exec(
            0,
            &[
                "nft",
                "add",
                "rule",
                "ip",
                TABLE,
                stray,
                "meta",
                "l4proto",
                "tcp",
                "dnat",
                "to",
                "10.244.9.9:8443",
            ],
        );
        let json = ns.nft_list_table(0, "ip", TABLE);
        assert!(json.status.success());
        let want = parse_nft_json(&String::from_utf8(json.stdout).unwrap()).unwrap();
        let got = ns.run_in(0, || read_family(FAMILY_IP)).unwrap().unwrap();
        assert_eq!(got, want);
        for s in &got.services {
            assert!(
                !s.backends.iter().any(|b| b.starts_with("10.244.9.9")),
                "{s:?}"
            );
        }
        assert_eq!(
            got.serves(ip("10.96.40.7"), 443, Proto::Tcp)
                .unwrap()
                .backends,
            ["10.244.1.5:8443", "10.244.2.9:8443"]
        );
    }

    /// Both families read whole, merged as `read_blocking` merges them (no held read).
    fn whole_read() -> Option<ServiceTable> {
        let mut table: Option<ServiceTable> = None;
        for family in [FAMILY_IP, FAMILY_IP6] {
            if let Some(parsed) = read_family(family).unwrap() {
                match &mut table {
                    Some(t) => iptables::merge(t, parsed),
                    None => table = Some(parsed),
                }
            }
        }
        table
    }

    /// kube-proxy's partial syncs, each one `nft -f` transaction in a scratch namespace: the
    /// chains and maps its commit's messages name (read off a real `NftWatch`) are read again
    /// and the held rest kept, and the table equals a whole read after every kind of change: a
    /// Service added, its endpoint moved, a stray endpoint chain beside a Service's own, an
    /// `external-` chain rewritten from Local to Cluster, the Service removed (root, `nft`).
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn a_partial_sync_is_read_in_parts_and_equals_a_whole_read() {
        use crate::state::changes::NftWatch;
        let Some(ns) = etp_local_scratch("nftpart") else {
            return;
        };
        // Chains are read one by one only while few against the table
        // (`iptables::CHAIN_READ_SHARE`): 200 more, as a large table has.
        let pad: String = (0..200)
            .map(|i| {
                format!("add chain ip kube-proxy pad-{i}\nadd rule ip kube-proxy pad-{i} counter\n")
            })
            .collect();
        ns.restore(0, &["nft", "-f", "-"], &pad);
        let first = ns.run_in(0, read_blocking).unwrap().unwrap();
        let mut watch = ns.run_in(0, NftWatch::open).unwrap();
        let vip = ip("10.96.77.77");
        let svc = "service-NEWSVC01-t/new/tcp/http";
        let ep = |n: u8| format!("endpoint-NEWEP00{n}-t/new/tcp/http__10.244.9.{n}/80");
        let endpoint = |n: u8| {
            format!(
                "add chain ip kube-proxy {e}\n\
                 add rule ip kube-proxy {e} ip saddr 10.244.9.{n} jump mark-for-masquerade\n\
                 add rule ip kube-proxy {e} meta l4proto tcp dnat to 10.244.9.{n}:80\n",
                e = ep(n)
            )
        };
        let syncs: Vec<(&str, String)> = vec![
            (
                "a Service added",
                format!(
                    "{}add chain ip kube-proxy {svc}\n\
                     add rule ip kube-proxy {svc} numgen random mod 1 vmap {{ 0 : goto {} }}\n\
                     add element ip kube-proxy service-ips {{ 10.96.77.77 . tcp . 80 : goto {svc} }}\n",
                    endpoint(1),
                    ep(1)
                ),
            ),
            (
                "its endpoint moved",
                format!(
                    "{}flush chain ip kube-proxy {svc}\n\
                     add rule ip kube-proxy {svc} numgen random mod 1 vmap {{ 0 : goto {} }}\n\
                     flush chain ip kube-proxy {e1}\ndelete chain ip kube-proxy {e1}\n",
                    endpoint(2),
                    ep(2),
                    e1 = ep(1)
                ),
            ),
            (
                "a stray endpoint chain of another Service's port",
                "add chain ip kube-proxy endpoint-ZZZZZZZZ-shop/api/tcp/https__10.244.7.7/8443\n\
                 add rule ip kube-proxy endpoint-ZZZZZZZZ-shop/api/tcp/https__10.244.7.7/8443 \
                 meta l4proto tcp dnat to 10.244.7.7:8443\n"
                    .to_string(),
            ),
            (
                "externalTrafficPolicy Local to Cluster",
                "flush chain ip kube-proxy external-DZ3B7L2Q-shop/api/tcp/https\n\
                 add rule ip kube-proxy external-DZ3B7L2Q-shop/api/tcp/https jump mark-for-masquerade\n\
                 add rule ip kube-proxy external-DZ3B7L2Q-shop/api/tcp/https goto service-DZ3B7L2Q-shop/api/tcp/https\n"
                    .to_string(),
            ),
            (
                "the Service removed",
                format!(
                    "delete element ip kube-proxy service-ips {{ 10.96.77.77 . tcp . 80 }}\n\
                     flush chain ip kube-proxy {svc}\ndelete chain ip kube-proxy {svc}\n\
                     flush chain ip kube-proxy {e2}\ndelete chain ip kube-proxy {e2}\n",
                    e2 = ep(2)
                ),
            ),
        ];
        let mut tables = Vec::new();
        for (what, script) in &syncs {
            ns.restore(0, &["nft", "-f", "-"], script);
            let touched = watch.wait_commit().unwrap();
            assert!(
                !touched.is_everything() && touched.named() > 0,
                "{what}: {touched:?}"
            );
            let held = ns
                .run_in(0, move || read_blocking_after(&touched))
                .unwrap()
                .unwrap();
            let whole = ns.run_in(0, whole_read);
            assert_eq!(Some(&held), whole.as_ref(), "{what}");
            tables.push(held);
        }
        let added = tables[0]
            .serves(vip, 80, Proto::Tcp)
            .expect("the new Service");
        assert_eq!(added.service.as_deref(), Some("t/new:http"));
        assert_eq!(added.backends, ["10.244.9.1:80"]);
        let moved = tables[1].serves(vip, 80, Proto::Tcp).unwrap();
        assert_eq!(moved.backends, ["10.244.9.2:80"]);
        let api = |t: &ServiceTable| {
            t.serves(ip("10.96.40.7"), 443, Proto::Tcp)
                .unwrap()
                .backends
                .clone()
        };
        assert_eq!(api(&tables[2]), api(&first), "a stray chain is no backend");
        let nodeport = |t: &ServiceTable| t.nodeport(31443, Proto::Tcp).unwrap().local_only;
        assert!(nodeport(&tables[2]) && !nodeport(&tables[3]));
        assert!(tables[4].serves(vip, 80, Proto::Tcp).is_none());
    }

    /// What no commit message named is not read again: a rule added to `masquerading` is not
    /// seen while the read is told nothing, or told of another chain, and is seen once the read
    /// is whole (root, `nft`).
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn what_no_commit_named_is_not_read_again() {
        let Some(ns) = etp_local_scratch("nftuntold") else {
            return;
        };
        let before = ns.run_in(0, read_blocking).unwrap().unwrap();
        ns.exec(
            0,
            &[
                "nft",
                "add",
                "rule",
                "ip",
                TABLE,
                MASQUERADING,
                "masquerade",
                "random",
            ],
        );
        let seen = |t: &ServiceTable| {
            t.masquerade_rules
                .iter()
                .any(|r| r.ends_with("masquerade random"))
        };
        let untold = ns
            .run_in(0, || read_blocking_after(&Touched::default()))
            .unwrap()
            .unwrap();
        assert_eq!(untold, before, "nothing touched: the held table, no read");
        let other = ns
            .run_in(0, || {
                read_blocking_after(&Touched::naming(FAMILY_IP, TABLE, ["services"]))
            })
            .unwrap()
            .unwrap();
        assert!(!seen(&other), "{:?}", other.masquerade_rules);
        let told = ns
            .run_in(0, || {
                read_blocking_after(&Touched::naming(FAMILY_IP, TABLE, [MASQUERADING]))
            })
            .unwrap()
            .unwrap();
        assert!(seen(&told), "{:?}", told.masquerade_rules);
        assert_eq!(Some(told), ns.run_in(0, whole_read));
    }
}
