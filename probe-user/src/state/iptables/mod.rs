//! kube-proxy's nat rules: iptables-nft's over nf_tables netlink, iptables-legacy's from
//! `iptables-legacy-save -t nat`.
//!
//! [`parse_iptables_save`] is pure: it turns the text of `iptables-save -t nat` (or of
//! `iptables -t nat -S [-v]`, or a `grep` of either) into a [`ServiceTable`]:
//!
//! - `KUBE-SERVICES` rules with a `-d VIP/32 --dport P` match that jump to a service chain
//!   (`KUBE-SVC-*`, `KUBE-EXT-*`, `KUBE-FW-*`, `KUBE-XLB-*`, `KUBE-SVL-*`) become
//!   [`ServiceEntry`]s: cluster IPs, external IPs and load-balancer IPs alike;
//! - backends are the `DNAT --to-destination` targets of the `KUBE-SEP-*` chains reachable from
//!   that service chain;
//! - `KUBE-NODEPORTS` rules become [`NodePortEntry`]s. `local_only` (externalTrafficPolicy: Local)
//!   is recognised the way kube-proxy writes it: older releases (< 1.24) jump to a `KUBE-XLB-*`
//!   chain; newer ones jump to a `KUBE-EXT-*` chain which, for `Local`, masquerades only
//!   `--src-type LOCAL` traffic ("masquerade LOCAL traffic for ...") and ends in a jump to the
//!   service-local `KUBE-SVL-*` chain, while for `Cluster` it masquerades everything
//!   ("masquerade traffic for ...") and jumps to `KUBE-SVC-*`;
//! - every `-j MASQUERADE` rule of the nat table is kept, as text, in `masquerade_rules`.
//!
//! The parser ([`rules`]) never fails and never panics: lines it does not understand are
//! skipped.
//!
//! [`read`] reads both iptables backends. A node can hold rules in both (nft and legacy): the
//! default backend (`iptables --version`, asked once) is read, and the other is read too when
//! its nat table has `KUBE-` chains; the results are merged.
//!
//! The nf_tables backend (iptables-nft, the default of every current distribution) is read
//! over netlink ([`crate::state::nft_netlink`]), no `iptables-save` process and no text: its
//! nat table is the nf_tables table `nat` of family `ip` / `ip6`, each rule's expressions are
//! decoded back into the [`Rule`] the text parser makes (`nft_rules`), and [`NatChains`] builds
//! the same table from either. What is held between reads is keyed by the ruleset generation
//! (`NFT_MSG_GETGEN`): while no commit happened, a read costs one generation request and no
//! dump (the table is made again from the held chains: no copy of it is held beside them).
//! After a commit, only the chains it touched ([`super::changes::Touched`]) are dumped
//! again, one filtered dump each (kube-proxy >= 1.28 writes only the chains that changed,
//! plus `KUBE-SERVICES` and `KUBE-NODEPORTS`). A full restore touches every chain: more than
//! [`MAX_CHAIN_READS`] chains, or a chain count above 1/[`CHAIN_READ_SHARE`] of the table, is
//! one read of the table instead: one dump, or chain by chain above
//! [`nft_netlink::WHOLE_DUMP_MAX_CHAINS`] chains (the kernel's whole-table dump is
//! quadratic). What the messages cannot say (a renamed chain) waits for the next full read:
//! the `--services-every` safety net reads everything (a table patched chain by chain is not
//! trusted by generation). [`read_chain`] answers one question (one chain) the same way.
//!
//! The legacy backend (x_tables) has no netlink interface: its rules are one binary blob per
//! table behind `IPT_SO_GET_ENTRIES` (getsockopt), whose match and target structs are
//! per-extension and per-revision. Decoding that blob means reimplementing libiptc and every
//! extension's layout; `iptables-legacy-save` does exactly that, so the legacy backend (rare
//! on current nodes, and without change messages anyway) is still read with it.

mod firewall;
mod nft_rules;
mod rules;

use std::{
    path::Path,
    process::Command,
    sync::{Mutex, OnceLock},
};

pub use firewall::{PROXY_FIREWALL_CHAIN, allowed_sources, firewall_drops, parse_firewall_drops};
pub use rules::{
    ACCESS_FILTER_CHAIN, EXTERNAL_SERVICES_CHAIN, FILTER_SERVICES_CHAIN, NatChains, Rule, digest,
    external_drops, merge, no_endpoint_rejects, parse_access_filter, parse_external_drops,
    parse_iptables_save, parse_no_endpoint_rejects,
};

use crate::state::{
    ParseCache, ServiceTable,
    changes::{FAMILY_IP, FAMILY_IP6, TableChange, Touched},
    nft_netlink::{self, NftNetlinkError},
};

/// Why the nat rules could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// The command could not be started (not installed, not in PATH, no permission).
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// The command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    /// The nf_tables backend could not be read over netlink.
    #[error(transparent)]
    Netlink(#[from] NftNetlinkError),
    /// The blocking reader task did not complete.
    #[error("iptables reader task failed: {0}")]
    Join(String),
}

/// Reads the nat table(s) of the current network namespace (see the module docs) on a blocking
/// thread.
pub async fn read() -> Result<ServiceTable, IptablesError> {
    tokio::task::spawn_blocking(read_blocking)
        .await
        .map_err(|e| IptablesError::Join(e.to_string()))?
}

/// Reads the nat table(s) of the calling thread's network namespace, all of them. Blocking.
pub fn read_blocking() -> Result<ServiceTable, IptablesError> {
    read_blocking_after(&Touched::everything())
}

/// Reads the nat table(s) of the calling thread's network namespace, re-reading of the
/// nf_tables backend only what `touched` names (see the module docs). Blocking.
///
/// `iptables-save -t nat` must work (its failure is the error). `ip6tables-save` and the other
/// backend are best effort: their failures are logged and skipped. The legacy backend is only
/// asked when the kernel already has a legacy nat table (`/proc/thread-self/net/ip_tables_names`), because
/// `iptables-legacy-save -t nat` would otherwise load the legacy nat module as a side effect.
pub fn read_blocking_after(touched: &Touched) -> Result<ServiceTable, IptablesError> {
    static PARSED: ParseCache<ServiceTable> = ParseCache::new();
    static DEFAULT_IS_NFT: OnceLock<bool> = OnceLock::new();

    // The backend of the installed iptables does not change while we run: asked once.
    let default_is_nft = *DEFAULT_IS_NFT.get_or_init(|| {
        run("iptables-save", &["--version"])
            .map(|v| v.contains("nf_tables"))
            .unwrap_or(false)
    });
    let mut table = if default_is_nft {
        read_nft_family(FAMILY_IP, touched)?.table
    } else {
        let v4 = run("iptables-save", &["-t", "nat"])?;
        PARSED.parse("iptables-save", &v4, digest, parse_iptables_save)
    };

    if default_is_nft {
        match read_nft_family(FAMILY_IP6, touched) {
            Ok(v6) => merge(&mut table, v6.table),
            Err(e) => tracing::debug!(error = %e, "skipping the ip6 nat table"),
        }
    } else {
        // The nf_tables backend beside a legacy default: only when kube-proxy (or a stale
        // kube-proxy) wrote into it.
        for family in [FAMILY_IP, FAMILY_IP6] {
            match read_nft_family(family, touched) {
                Ok(read) if read.kube => merge(&mut table, read.table),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "skipping the nf_tables nat table"),
            }
        }
    }
    let mut legacy: Vec<(&str, Option<&str>)> = Vec::new();
    if default_is_nft {
        legacy.push((
            "iptables-legacy-save",
            Some("/proc/thread-self/net/ip_tables_names"),
        ));
        legacy.push((
            "ip6tables-legacy-save",
            Some("/proc/thread-self/net/ip6_tables_names"),
        ));
    } else {
        legacy.push(("ip6tables-save", None));
    }
    for (cmd, needs_proc_table) in legacy {
        if let Some(names) = needs_proc_table {
            let loaded = std::fs::read_to_string(names)
                .map(|t| t.lines().any(|l| l.trim() == "nat"))
                .unwrap_or(false);
            if !loaded {
                continue;
            }
        }
        if !command_exists(cmd) {
            continue;
        }
        match run(cmd, &["-t", "nat"]) {
            Ok(text) => {
                // The legacy backend beside an nft default only matters when kube-proxy (or
                // a stale kube-proxy) wrote into it; ip6tables-save is always merged.
                if cmd == "ip6tables-save" || text.contains("KUBE-") {
                    merge(
                        &mut table,
                        PARSED.parse(cmd, &text, digest, parse_iptables_save),
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "skipping {cmd}"),
        }
    }
    table.access_filter = read_access_filter(default_is_nft);
    for drop in read_external_drops(default_is_nft) {
        if !table.no_endpoint_drops.contains(&drop) {
            table.no_endpoint_drops.push(drop);
        }
    }
    table.firewall = read_firewall_after(touched, default_is_nft);
    table.no_endpoint_rejects = read_no_endpoint_rejects(default_is_nft);
    Ok(table)
}

/// A chain count above which one full dump is cheaper than one dump per chain.
pub const MAX_CHAIN_READS: usize = 64;
/// Chains are read one by one only while they are at most 1/this of the held chains.
pub const CHAIN_READ_SHARE: usize = 16;

/// The nat table of one nf_tables family as read, and whether kube-proxy wrote in it.
struct NftRead {
    table: ServiceTable,
    kube: bool,
}

/// What is held of one family between reads: its chains and the ruleset generation of the
/// whole dump they are (None once patched chain by chain: then only the commit messages say
/// they are current, and a full read reads again). Not the table they make: a copy of it
/// held here was alive beside the one being made and the agent's own (BENCHMARKS 9k); a
/// read that finds the chains current makes it again from them.
struct Held {
    family: u8,
    /// The network namespace read (its inode): a process may read several (tests do).
    netns: u64,
    generation: Option<u32>,
    chains: NatChains,
}

/// Per family and network namespace; a full read (every `probe check`, the safety net)
/// replaces it unless the generation says nothing changed.
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

thread_local! {
    /// Rule dumps this thread asked the kernel for (whole tables and single chains).
    static DUMPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many rule dumps (a whole nat table, or one chain) the calling thread has asked the
/// kernel for: what the generation cache saves is visible in tests and measurements.
pub fn rule_dumps() -> u64 {
    DUMPS.with(|d| d.get())
}

fn count_dump() {
    DUMPS.with(|d| d.set(d.get() + 1));
}

fn take_held(family: u8, netns: u64) -> Option<Held> {
    let mut held = HELD.lock().ok()?;
    let i = held
        .iter()
        .position(|h| h.family == family && h.netns == netns)?;
    Some(held.swap_remove(i))
}

fn put_held(h: Held) {
    if let Ok(mut held) = HELD.lock() {
        held.retain(|o| !(o.family == h.family && o.netns == h.netns));
        held.push(h);
    }
}

/// The nat table of one nf_tables family, over netlink: the held table when the generation
/// is the one it was read at or `touched` says nothing of the table, the touched chains
/// re-read (one filtered dump each) when they are few, else one dump of the table.
fn read_nft_family(family: u8, touched: &Touched) -> Result<NftRead, IptablesError> {
    let reuse = crate::state::reuse_parses();
    let netns = nft_netlink::netns_id();
    let generation = nft_netlink::generation()?;
    if let Some(mut h) = reuse.then(|| take_held(family, netns)).flatten() {
        let fresh = h.generation == Some(generation)
            || match touched.table(family, "nat") {
                TableChange::Untouched => true,
                TableChange::Named(names)
                    if names.len() <= MAX_CHAIN_READS
                        && names.len() * CHAIN_READ_SHARE
                            <= h.chains.len().max(CHAIN_READ_SHARE) =>
                {
                    h.generation = None;
                    match reread_chains(family, &mut h.chains, names) {
                        Ok(()) => true,
                        // The held chains may be half patched: dropped, and the table read whole.
                        Err(e) => {
                            tracing::debug!(error = %e, "re-reading chains; reading the whole nat table");
                            false
                        }
                    }
                }
                _ => false,
            };
        if fresh {
            let read = NftRead {
                table: h.chains.table(),
                kube: h.chains.has_kube_chains(),
            };
            put_held(h);
            return Ok(read);
        }
        // Dropped before the whole read: two copies of the chains are never alive together.
        // A failed read leaves the caller's last table in use (the agent keeps it).
    }
    let chains = read_nat_chains(family)?;
    let table = chains.table();
    let kube = chains.has_kube_chains();
    if reuse {
        put_held(Held {
            family,
            netns,
            generation: Some(generation),
            chains,
        });
    }
    Ok(NftRead { table, kube })
}

/// Every rule of the `nat` table of `family`, decoded as they arrive (one dump, or chain by
/// chain when the table is large: [`nft_netlink::WHOLE_DUMP_MAX_CHAINS`]). No table: no rules.
fn read_nat_chains(family: u8) -> Result<NatChains, IptablesError> {
    read_nat_chains_with(family, nft_netlink::WHOLE_DUMP_MAX_CHAINS)
}

/// [`read_nat_chains`] with the chain count above which the table is read chain by chain.
fn read_nat_chains_with(family: u8, max_whole_chains: usize) -> Result<NatChains, IptablesError> {
    let chains = std::cell::RefCell::new(NatChains::default());
    count_dump();
    match nft_netlink::table_rules(
        family,
        "nat",
        max_whole_chains,
        &mut || *chains.borrow_mut() = NatChains::default(),
        &mut |r| {
            let mut rule = nft_rules::rule_from_nft(&r, false);
            name_ipsets(&mut rule.text);
            chains.borrow_mut().push(rule)
        },
    ) {
        Ok(()) => {
            let mut chains = chains.into_inner();
            chains.sort_like_iptables_save();
            chains.finish();
            Ok(chains)
        }
        Err(e) if e.is_absent() => Ok(NatChains::default()),
        Err(e) => Err(e.into()),
    }
}

/// The chains iptables-nft `rules` (a dump of one `nat` table) make, in `iptables-save`'s
/// order: what the netlink reader builds its table from (and what the fuzz tests feed).
pub fn rules_from_netlink(rules: &[nft_netlink::NftRule]) -> NatChains {
    let mut chains =
        NatChains::from_rules(rules.iter().map(|r| nft_rules::rule_from_nft(r, false)));
    chains.sort_like_iptables_save();
    chains
}

/// Writes the ipsets of `-m set` matches by name (`set#7` -> `KUBE-LOOP-BACK`), as
/// `iptables-save` does: the kernel's rule holds the set's index (`nft_rules`), the name is
/// one ipset request away. An index no set has stays as it is.
fn name_ipsets(text: &mut String) {
    const MARK: &str = "--match-set set#";
    while let Some(at) = text.find(MARK) {
        let start = at + "--match-set ".len();
        let digits_at = at + MARK.len();
        let end = text[digits_at..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(text.len(), |e| digits_at + e);
        let name = text[digits_at..end]
            .parse::<u16>()
            .ok()
            .and_then(|i| nft_netlink::ipset_name(i).ok().flatten());
        match name {
            Some(name) => text.replace_range(start..end, &name),
            None => break,
        }
    }
}

/// The rules of one chain (one filtered dump), decoded as they arrive, with their ipsets
/// named; `keep_text`: each keeps its `iptables -S` text. Collecting the dump's own rules
/// first cost ~1.5 KB a rule, 44 MB for the 30,000 of `KUBE-SERVICES` at 30,000 Services
/// (BENCHMARKS 9k), at each partial sync and, with the API, at each question about a VIP:port.
fn decoded_chain(
    family: u8,
    table: &str,
    chain: &str,
    keep_text: bool,
) -> Result<Vec<Rule>, nft_netlink::NftNetlinkError> {
    let rules = std::cell::RefCell::new(Vec::new());
    nft_netlink::rules(
        family,
        table,
        Some(chain),
        &mut || rules.borrow_mut().clear(),
        &mut |r| {
            let mut rule = nft_rules::rule_from_nft(&r, keep_text);
            name_ipsets(&mut rule.text);
            rules.borrow_mut().push(rule);
        },
    )?;
    Ok(rules.into_inner())
}

/// Re-reads each named chain (one filtered dump each); a chain without rules (or gone) is
/// removed.
fn reread_chains(
    family: u8,
    chains: &mut NatChains,
    names: &std::collections::BTreeSet<String>,
) -> Result<(), IptablesError> {
    for chain in names {
        count_dump();
        let rules = decoded_chain(family, "nat", chain, false)?;
        if rules.is_empty() {
            chains.remove(chain);
        } else {
            chains.replace_rules(chain, rules);
        }
    }
    chains.sort_like_iptables_save();
    Ok(())
}

/// The rules of one chain of an iptables-nft table (`table` `nat`, `filter`, ...; `family`
/// [`FAMILY_IP`] or [`FAMILY_IP6`]), read over netlink (one filtered dump) and kept with the
/// ruleset generation: asked again while nothing was committed, it costs one generation
/// request. Each rule carries its `iptables -S` text (`Rule::text`) for evidence. A missing
/// table or chain has no rules. For the lead's per-question reads: "kube-proxy programmed
/// the `KUBE-SERVICES` rule for VIP:port" is `read_chain(FAMILY_IP, "nat", "KUBE-SERVICES")`
/// and [`Rule::is_for`]; `KUBE-POSTROUTING`'s MASQUERADE is a rule whose `target` says so.
/// Blocking; works in the calling thread's network namespace.
pub fn read_chain(family: u8, table: &str, chain: &str) -> Result<Vec<Rule>, IptablesError> {
    /// (netns, family, table, chain, generation, rules); a few entries, the oldest dropped.
    type Cached = (u64, u8, String, String, u32, Vec<Rule>);
    static CACHE: Mutex<Vec<Cached>> = Mutex::new(Vec::new());
    const KEPT: usize = 32;
    let generation = nft_netlink::generation()?;
    let netns = nft_netlink::netns_id();
    let same = |c: &Cached| c.0 == netns && c.1 == family && c.2 == table && c.3 == chain;
    if let Ok(cache) = CACHE.lock()
        && let Some(hit) = cache.iter().find(|c| same(c) && c.4 == generation)
    {
        return Ok(hit.5.clone());
    }
    count_dump();
    let rules: Vec<Rule> = match decoded_chain(family, table, chain, true) {
        Ok(rules) => rules,
        Err(e) if e.is_absent() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    if let Ok(mut cache) = CACHE.lock() {
        cache.retain(|c| !same(c));
        if cache.len() >= KEPT {
            cache.remove(0);
        }
        cache.push((
            netns,
            family,
            table.to_string(),
            chain.to_string(),
            generation,
            rules.clone(),
        ));
    }
    Ok(rules)
}

/// How many rules chain `chain` of an iptables-nft table has, and the `iptables -S` text of
/// the first one `wanted` picks: one filtered dump, each rule decoded as it arrives and
/// dropped (only the picked one is written out as text). For the per-question read of
/// `KUBE-SERVICES`: [`read_chain`] would hold the whole chain with its text in its cache
/// (~16 MB at 30,000 Services by the rules' sizes; an estimate, not measured) and clone it at
/// each question. A missing table or chain has no
/// rules. Blocking; works in the calling thread's network namespace.
pub fn find_in_chain(
    family: u8,
    table: &str,
    chain: &str,
    wanted: impl Fn(&Rule) -> bool,
) -> Result<(usize, Option<String>), IptablesError> {
    // (rules seen, the picked one's text), started again when the dump is.
    let seen = std::cell::RefCell::new((0usize, None::<String>));
    count_dump();
    let read = nft_netlink::rules(
        family,
        table,
        Some(chain),
        &mut || *seen.borrow_mut() = (0, None),
        &mut |r| {
            let mut seen = seen.borrow_mut();
            seen.0 += 1;
            if seen.1.is_none() && wanted(&nft_rules::rule_from_nft(&r, false)) {
                let mut rule = nft_rules::rule_from_nft(&r, true);
                name_ipsets(&mut rule.text);
                seen.1 = Some(rule.text);
            }
        },
    );
    match read {
        Ok(()) => Ok(seen.into_inner()),
        Err(e) if e.is_absent() => Ok((0, None)),
        Err(e) => Err(e.into()),
    }
}

/// Reads [`ACCESS_FILTER_CHAIN`] (one chain, not the whole filter table): over netlink on the
/// nf_tables backend (generation-cached, [`read_chain`]), with `iptables -S` on the legacy
/// one. A missing chain or a failed read is no filter.
fn read_access_filter(default_is_nft: bool) -> Vec<String> {
    if default_is_nft {
        return match read_chain(FAMILY_IP, "filter", ACCESS_FILTER_CHAIN) {
            Ok(rules) => rules.into_iter().map(|r| r.text).collect(),
            Err(e) => {
                tracing::trace!(error = %e, "no {ACCESS_FILTER_CHAIN}");
                Vec::new()
            }
        };
    }
    match run(
        "iptables",
        &["-w", "-t", "filter", "-S", ACCESS_FILTER_CHAIN],
    ) {
        Ok(text) => parse_access_filter(&text),
        Err(e) => {
            tracing::trace!(error = %e, "no {ACCESS_FILTER_CHAIN}");
            Vec::new()
        }
    }
}

/// kube-proxy's no-endpoint drops of external and LB IPs ([`EXTERNAL_SERVICES_CHAIN`] of the
/// filter table, both families; one chain each, not the whole table): over netlink on the
/// nf_tables backend (generation-cached, [`read_chain`]), with `iptables -S` on the legacy
/// one. A missing chain or a failed read is no drop.
fn read_external_drops(default_is_nft: bool) -> Vec<crate::state::NoEndpointDrop> {
    read_filter_chain(
        default_is_nft,
        EXTERNAL_SERVICES_CHAIN,
        external_drops,
        parse_external_drops,
    )
}

/// kube-proxy's REJECTs of Service ports without endpoints ([`FILTER_SERVICES_CHAIN`] of the
/// filter table, both families; one chain each): over netlink on the nf_tables backend
/// (generation-cached, [`read_chain`]), with `iptables -S` on the legacy one. A missing chain
/// or a failed read is no reject: such a Service is then not named.
fn read_no_endpoint_rejects(default_is_nft: bool) -> Vec<crate::state::NoEndpointReject> {
    read_filter_chain(
        default_is_nft,
        FILTER_SERVICES_CHAIN,
        no_endpoint_rejects,
        parse_no_endpoint_rejects,
    )
}

/// One chain of the filter table in both families, decoded: over netlink on the nf_tables
/// backend (generation-cached, [`read_chain`]) by `from_rules`, with `iptables -S` on the
/// legacy one by `from_text`. A missing chain or a failed read contributes nothing.
fn read_filter_chain<T>(
    default_is_nft: bool,
    chain: &str,
    from_rules: fn(&[Rule]) -> Vec<T>,
    from_text: fn(&str) -> Vec<T>,
) -> Vec<T> {
    let mut out = Vec::new();
    if default_is_nft {
        for family in [FAMILY_IP, FAMILY_IP6] {
            match read_chain(family, "filter", chain) {
                Ok(rules) => out.extend(from_rules(&rules)),
                Err(e) => tracing::trace!(error = %e, "no filter {chain}"),
            }
        }
        return out;
    }
    for cmd in ["iptables", "ip6tables"] {
        match run(cmd, &["-w", "-t", "filter", "-S", chain]) {
            Ok(text) => out.extend(from_text(&text)),
            Err(e) => tracing::trace!(error = %e, "no filter {chain}"),
        }
    }
    out
}

/// kube-proxy's `loadBalancerSourceRanges` firewall (`firewall`'s module docs), both families,
/// as held since the last read unless `touched` names the filter table or a `KUBE-FW-*` nat
/// chain (kube-proxy's syncs rewrite Services' nat chains far more often). A failed read is
/// no firewall: nothing is confirmed from it.
fn read_firewall_after(
    touched: &Touched,
    default_is_nft: bool,
) -> Vec<probe_core::state::FirewallEntry> {
    type HeldFirewall = (u64, Vec<probe_core::state::FirewallEntry>);
    static HELD_FIREWALL: Mutex<Option<HeldFirewall>> = Mutex::new(None);
    let netns = nft_netlink::netns_id();
    let touches = |family: u8| {
        touched.table(family, "filter") != TableChange::Untouched
            || match touched.table(family, "nat") {
                TableChange::Untouched => false,
                TableChange::Named(names) => names.iter().any(|c| c.starts_with("KUBE-FW-")),
                TableChange::Whole => true,
            }
    };
    // The legacy backend sends no change messages: read every time.
    if default_is_nft
        && !touches(FAMILY_IP)
        && !touches(FAMILY_IP6)
        && let Ok(held) = HELD_FIREWALL.lock()
        && let Some((n, entries)) = held.as_ref()
        && *n == netns
    {
        return entries.clone();
    }
    let entries: Vec<probe_core::state::FirewallEntry> = if default_is_nft {
        [FAMILY_IP, FAMILY_IP6]
            .into_iter()
            .flat_map(read_nft_firewall)
            .collect()
    } else {
        ["iptables", "ip6tables"]
            .into_iter()
            .flat_map(read_legacy_firewall)
            .collect()
    };
    if let Ok(mut held) = HELD_FIREWALL.lock() {
        *held = Some((netns, entries.clone()));
    }
    entries
}

/// One family's firewall over netlink: `KUBE-PROXY-FIREWALL` of the filter table, then each
/// drop's `KUBE-FW-*` chain of the nat table (one filtered dump each, generation-cached).
fn read_nft_firewall(family: u8) -> Vec<probe_core::state::FirewallEntry> {
    firewall_of(
        read_chain(family, "filter", PROXY_FIREWALL_CHAIN).map(|rules| firewall_drops(&rules)),
        |chain| {
            read_chain(family, "nat", chain)
                .map(|rules| allowed_sources(rules.iter().map(|r| r.text.as_str())))
        },
    )
}

/// One family's firewall on the legacy backend, with `iptables -S` (`cmd`: `iptables` or
/// `ip6tables`): the filter chain, then each drop's nat chain.
fn read_legacy_firewall(cmd: &str) -> Vec<probe_core::state::FirewallEntry> {
    firewall_of(
        run(cmd, &["-w", "-t", "filter", "-S", PROXY_FIREWALL_CHAIN])
            .map(|text| parse_firewall_drops(&text)),
        |chain| {
            run(cmd, &["-w", "-t", "nat", "-S", chain]).map(|text| allowed_sources(text.lines()))
        },
    )
}

/// The firewall entries of `drops` (none when the filter chain is absent), each with the
/// sources its nat chain sends on (none when that chain cannot be read: logged, the entry
/// kept, since the filter rule alone says the address is firewalled).
fn firewall_of(
    drops: Result<Vec<firewall::FirewallDrop>, IptablesError>,
    allowed: impl Fn(&str) -> Result<Vec<probe_core::state::SourceRange>, IptablesError>,
) -> Vec<probe_core::state::FirewallEntry> {
    let drops = match drops {
        Ok(drops) => drops,
        Err(e) => {
            tracing::trace!(error = %e, "no {PROXY_FIREWALL_CHAIN}");
            return Vec::new();
        }
    };
    drops
        .into_iter()
        .map(|d| {
            let sources = allowed(&d.chain).unwrap_or_else(|e| {
                tracing::debug!(error = %e, chain = %d.chain, "firewall chain unread");
                Vec::new()
            });
            firewall::entry(d, sources)
        })
        .collect()
}

/// [`read_firewall_after`] everything, on the installed backend (the dataplane reader beside
/// the API's table), held between reads while `touched` names none of its chains.
pub fn read_firewall_now(touched: &Touched) -> Vec<probe_core::state::FirewallEntry> {
    read_firewall_after(
        touched,
        nft_netlink::table_exists(FAMILY_IP, "filter").unwrap_or(false),
    )
}

fn command_exists(cmd: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| Path::new(&dir).join(cmd).is_file())
}

fn run(cmd: &str, args: &[&str]) -> Result<String, IptablesError> {
    let command = format!("{cmd} {}", args.join(" "));
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|source| IptablesError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(IptablesError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    // A whole dump is ~10 MB at 10,000 Services: taken as it is, not copied.
    Ok(String::from_utf8(out.stdout)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

#[cfg(test)]
mod chain_dump_tests;
#[cfg(test)]
mod rejects_tests;
#[cfg(test)]
mod tests;

/// [`ACCESS_FILTER_CHAIN`] of the installed backend, read now (one chain).
pub fn read_access_filter_now() -> Vec<String> {
    read_access_filter(nft_netlink::table_exists(FAMILY_IP, "filter").unwrap_or(false))
}

/// Lets go of the nat chains held for the next read (the agent takes its table from the API
/// and reads only `state::dataplane`'s chains: the whole table would be held for nothing).
pub fn release_held() {
    if let Ok(mut held) = HELD.lock() {
        held.clear();
        held.shrink_to_fit();
    }
}
