//! The dataplane beside the table from the API: what only the node's rules can say, read over
//! netlink a chain, set or service at a time, never the whole rule set in steady state.
//!
//! With API access the agent takes the Services (VIP:port -> endpoints, the bulk of kube-proxy's
//! rules: `KUBE-SERVICES`, `KUBE-SVC-*`, `KUBE-SEP-*`, the `service-ips` map, the IPVS virtual
//! services) from the API (`kube::service_table`). From the dataplane it keeps:
//!
//! - [`read_facts`]: what the correlator reads as "what this node's kube-proxy applied" and
//!   the API cannot say: the masquerade rules (every chain `POSTROUTING` reaches: kube-proxy's
//!   `KUBE-POSTROUTING`, a CNI's or ip-masq-agent's chains), the NodePorts as programmed
//!   (`KUBE-NODEPORTS` and the chains it jumps to, so externalTrafficPolicy is the one the
//!   rules apply; its disagreement with the API's is evidence already, `Facts::etp_mismatch`),
//!   IPVS mode's access filter and Local-NodePort ipsets, the `loadBalancerSourceRanges`
//!   firewall (nftables' `firewall-ips`, iptables' `KUBE-PROXY-FIREWALL`, IPVS mode's
//!   `KUBE-LOAD-BALANCER-FW` ipsets). On a commit only
//!   the chains it names are read again; at 10,000 Services with 2,000 NodePorts that is a few thousand rules held
//!   instead of 70,000.
//! - [`programmed`]: per question, whether kube-proxy programmed one VIP:port (the
//!   correlator asks when the API says a Service serves a port the kernel refused).
//!
//! iptables' legacy backend (x_tables) has no netlink dump: on such a node both fall back to
//! the whole-table reader (`iptables-legacy-save`), which is what `state::iptables` does there.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    sync::Mutex,
};

use probe_contract::{Proto, sock};
pub use probe_core::state::dataplane::DataplaneRead;

use super::{
    ServiceSource, ServiceTable,
    changes::{FAMILY_IP, FAMILY_IP6, TableChange, Touched},
    iptables::{self, NatChains, Rule},
    nft_netlink, nftables,
};

/// The nat chains whose rules [`read_facts`] keeps, and those it follows from: every chain
/// `POSTROUTING` reaches (masquerading happens only there), `KUBE-NODEPORTS` and the chains
/// its rules jump to (one level: `KUBE-EXT-*` / `KUBE-XLB-*` decide externalTrafficPolicy).
const MASQUERADE_ROOT: &str = "POSTROUTING";
const NODEPORTS_ROOT: &str = "KUBE-NODEPORTS";
/// Chains followed at most (a hostile rule set must not make the walk unbounded).
const MAX_CHAINS: usize = 20_000;

/// The chains held per family between reads.
#[derive(Default)]
struct Held {
    netns: u64,
    chains: HashMap<u8, NatChains>,
}

static HELD: Mutex<Option<Held>> = Mutex::new(None);

fn family_ok(family: u8) -> bool {
    family == FAMILY_IP || family == FAMILY_IP6
}

/// Reads the chains below the roots of one family, re-reading only what `touched` names when
/// the held chains are there. Blocking.
fn read_family_chains(
    family: u8,
    held: Option<NatChains>,
    touched: &Touched,
) -> Result<NatChains, iptables::IptablesError> {
    debug_assert!(family_ok(family));
    let (mut chains, reread): (NatChains, Option<BTreeSet<String>>) =
        match (held, touched.table(family, "nat")) {
            (Some(h), TableChange::Untouched) => return Ok(h),
            (Some(h), TableChange::Named(names)) => (h, Some(names.clone())),
            _ => (NatChains::default(), None),
        };
    // Which chains to (re-)read: all below the roots, or the touched ones and whatever new
    // chain their rules now jump to.
    let mut queue: Vec<(String, bool)> = Vec::new();
    match &reread {
        None => {
            queue.push((MASQUERADE_ROOT.to_string(), true));
            queue.push((NODEPORTS_ROOT.to_string(), true));
        }
        Some(names) => {
            let held: BTreeSet<String> = chains.order().map(str::to_string).collect();
            for n in names {
                if held.contains(n) || n == MASQUERADE_ROOT || n == NODEPORTS_ROOT {
                    queue.push((n.clone(), follows(n)));
                }
            }
        }
    }
    let mut seen: BTreeSet<String> = BTreeSet::new();
    while let Some((chain, follow)) = queue.pop() {
        if !seen.insert(chain.clone()) || seen.len() > MAX_CHAINS {
            continue;
        }
        let rules: Vec<Rule> = iptables::read_chain(family, "nat", &chain)?;
        if follow {
            for t in rules.iter().filter_map(|r| r.target.as_deref()) {
                if is_user_chain(t) && (reread.is_none() || !chains.holds(t)) {
                    // Below POSTROUTING every chain is followed; below KUBE-NODEPORTS one level.
                    queue.push((t.to_string(), chain != NODEPORTS_ROOT && follows(t)));
                }
            }
        }
        if rules.is_empty() {
            chains.remove(&chain);
        } else {
            chains.replace_rules(&chain, rules);
        }
    }
    chains.sort_like_iptables_save();
    Ok(chains)
}

/// Whether the chains a chain jumps to are read too: all but kube-proxy's per-Service chains
/// (reached from `KUBE-NODEPORTS`; what they jump to is the API's part).
fn follows(chain: &str) -> bool {
    !(chain.starts_with("KUBE-EXT-")
        || chain.starts_with("KUBE-XLB-")
        || chain.starts_with("KUBE-SVC-")
        || chain.starts_with("KUBE-SVL-")
        || chain.starts_with("KUBE-FW-")
        || chain.starts_with("KUBE-SEP-"))
}

/// A jump target that is a chain (not a built-in target).
fn is_user_chain(target: &str) -> bool {
    !matches!(
        target,
        "ACCEPT"
            | "DROP"
            | "RETURN"
            | "REJECT"
            | "MASQUERADE"
            | "SNAT"
            | "DNAT"
            | "MARK"
            | "CONNMARK"
            | "LOG"
            | "NOTRACK"
            | "CT"
            | "REDIRECT"
            | "TPROXY"
            | "NFLOG"
            | "ULOG"
    ) && !target.is_empty()
}

/// iptables-nft holds a nat table (the legacy backend, or no iptables at all, does not).
fn nft_nat() -> bool {
    nft_netlink::table_exists(FAMILY_IP, "nat").unwrap_or(false)
}

/// What the correlator needs from the node's own rules beside the table from the API (see
/// the module docs): masquerade rules, NodePorts as programmed, the access filter, for
/// kube-proxy's `mode`. The services are left empty. Blocking.
pub fn read_facts(touched: &Touched, mode: ServiceSource) -> anyhow::Result<ServiceTable> {
    let mut table = match mode {
        ServiceSource::Nftables => read_nft_facts(touched)?,
        ServiceSource::Iptables | ServiceSource::Ipvs if nft_nat() => {
            let netns = nft_netlink::netns_id();
            let mut guard = HELD.lock().map_err(|_| anyhow::anyhow!("dataplane lock"))?;
            let held = guard.get_or_insert_with(Held::default);
            if held.netns != netns {
                *held = Held {
                    netns,
                    ..Held::default()
                };
            }
            let mut table = ServiceTable::default();
            for family in [FAMILY_IP, FAMILY_IP6] {
                let chains = read_family_chains(family, held.chains.remove(&family), touched)?;
                iptables::merge(&mut table, chains.table());
                held.chains.insert(family, chains);
            }
            if mode == ServiceSource::Ipvs {
                table.access_filter = iptables::read_access_filter_now();
                // Its loadBalancerSourceRanges firewall is in ipsets (issue #51).
                table.firewall = super::ipset::read_firewall();
            } else {
                // kube-proxy's loadBalancerSourceRanges firewall: only the rules say what
                // it drops (issue #51).
                table.firewall = iptables::read_firewall_now(touched);
            }
            table
        }
        // The legacy backend: no per-chain reads there.
        _ => {
            let mut t = iptables::read_blocking_after(touched)?;
            t.services.clear();
            if mode == ServiceSource::Ipvs {
                t.firewall = super::ipset::read_firewall();
            }
            t
        }
    };
    table.services.clear();
    table.source = Some(mode);
    Ok(table)
}

/// kube-proxy's nftables part: read again only when a commit touched the NodePort map, an
/// `external-` chain or the masquerading chain (kube-proxy's syncs rewrite Services' chains
/// and `service-ips` far more often).
fn read_nft_facts(touched: &Touched) -> anyhow::Result<ServiceTable> {
    static HELD_NFT: Mutex<Option<(u64, ServiceTable)>> = Mutex::new(None);
    let netns = nft_netlink::netns_id();
    let relevant = |name: &str| {
        name == nftables::SERVICE_NODEPORTS
            || name == nftables::MASQUERADING
            || name.starts_with("external-")
            || name.starts_with("firewall-")
    };
    let untouched =
        [FAMILY_IP, FAMILY_IP6]
            .iter()
            .all(|f| match touched.table(*f, nftables::TABLE) {
                TableChange::Untouched => true,
                TableChange::Named(names) => !names.iter().any(|n| relevant(n)),
                TableChange::Whole => false,
            });
    if untouched
        && let Ok(held) = HELD_NFT.lock()
        && let Some((n, table)) = held.as_ref()
        && *n == netns
    {
        return Ok(table.clone());
    }
    let table = nftables::read_facts_after(touched)?.unwrap_or_default();
    if let Ok(mut held) = HELD_NFT.lock() {
        *held = Some((netns, table.clone()));
    }
    Ok(table)
}

/// kube-proxy's mode from the rules, cheaply: IPVS virtual services, an `ip kube-proxy`
/// nf_tables table, or kube-proxy's `KUBE-SERVICES` nat chain (iptables-nft). None: none of
/// them (no kube-proxy, or the legacy backend, which only a whole read sees). Blocking.
pub fn detect_mode() -> Option<ServiceSource> {
    if super::ipvs::services_digest()
        .ok()
        .flatten()
        .is_some_and(|d| d != super::ipvs::empty_digest())
    {
        return Some(ServiceSource::Ipvs);
    }
    if nft_netlink::table_exists(FAMILY_IP, nftables::TABLE).unwrap_or(false)
        || nft_netlink::table_exists(FAMILY_IP6, nftables::TABLE).unwrap_or(false)
    {
        return Some(ServiceSource::Nftables);
    }
    // The chain's existence, not its rules: at 30,000 Services `KUBE-SERVICES` holds 30,000
    // rules, and reading them (with their text, cached) to learn the mode was most of an
    // API agent's peak memory.
    [FAMILY_IP, FAMILY_IP6]
        .into_iter()
        .any(|f| nft_netlink::chain_exists(f, "nat", "KUBE-SERVICES").unwrap_or(false))
        .then_some(ServiceSource::Iptables)
}

/// The first read of an agent whose table will be the API's: the mode and the dataplane's
/// part ([`read_facts`]), or the whole rules when no mode shows that way. Blocking.
pub fn first_read() -> anyhow::Result<ServiceTable> {
    match detect_mode() {
        Some(mode) => read_facts(&Touched::everything(), mode),
        None => super::read_services(),
    }
}

/// Reads what the node's kube-proxy (in `mode`) programmed for `addr:port/proto`: one chain
/// (`KUBE-SERVICES`), one map (`service-ips`) or the IPVS virtual services. Blocking.
pub fn programmed(
    mode: Option<ServiceSource>,
    addr: IpAddr,
    port: u16,
    proto: Proto,
) -> anyhow::Result<DataplaneRead> {
    let what = format!("{}/{}", sock(addr, port), proto.as_str());
    match mode {
        Some(ServiceSource::Iptables) if nft_nat() => {
            let family = if addr.is_ipv6() { FAMILY_IP6 } else { FAMILY_IP };
            let (rules, found) = iptables::find_in_chain(family, "nat", "KUBE-SERVICES", |r| {
                r.is_for(addr, port, proto)
            })?;
            Ok(DataplaneRead {
                read: format!(
                    "kube-proxy's iptables chain KUBE-SERVICES ({rules} rules, read over netlink)"
                ),
                found,
            })
        }
        Some(ServiceSource::Nftables) => {
            let found = nftables::service_ip_element(addr, port, proto)?;
            Ok(DataplaneRead {
                read: format!(
                    "kube-proxy's nftables map service-ips (table {} kube-proxy, read over netlink)",
                    if addr.is_ipv6() { "ip6" } else { "ip" }
                ),
                found,
            })
        }
        // One virtual service asked for by its key (issue #52: the poll and the whole dump
        // cost a core's half at 10,000 Services in the VM tier); the whole list of virtual
        // services only when that finds none, so the disagreement the correlator reports is
        // the table's, not one keyed answer's.
        Some(ServiceSource::Ipvs) => programmed_ipvs(addr, port, proto),
        // The legacy backend, or no mode known: the whole table, once per question.
        _ => {
            let table = super::read_services()?;
            Ok(lookup(&table, addr, port, proto))
        }
    }
    .map(|mut r: DataplaneRead| {
        if r.found.is_none() {
            tracing::debug!(%what, read = %r.read, "not programmed");
        }
        r.read = r.read.trim().to_string();
        r
    })
}

/// [`programmed`] in IPVS mode: one `IPVS_CMD_GET_SERVICE` request; the virtual services'
/// dump (no real servers) only when it finds none.
fn programmed_ipvs(addr: IpAddr, port: u16, proto: Proto) -> anyhow::Result<DataplaneRead> {
    let name = || {
        format!(
            "IPVS virtual service {}/{}",
            sock(addr, port),
            proto.as_str()
        )
    };
    if let super::ipvs::Lookup::Found(_) = super::ipvs::virtual_service(addr, port, proto)? {
        return Ok(DataplaneRead {
            read: "the IPVS virtual service asked for by its address, port and protocol \
                   (one IPVS_CMD_GET_SERVICE over generic netlink)"
                .to_string(),
            found: Some(name()),
        });
    }
    // Counted and matched as the dump arrives: not held (30,000 virtual services at scale).
    let (mut count, mut found) = (0usize, false);
    super::ipvs::for_each_virtual_service(|s| {
        count += 1;
        found |=
            s.addr == Some(addr) && s.port == port && Proto::from_raw(s.protocol as u8) == proto;
    })?;
    Ok(DataplaneRead {
        read: format!("the IPVS virtual services ({count} read over generic netlink)"),
        found: found.then(name),
    })
}

/// The answer from a whole dataplane table (pure).
pub fn lookup(table: &ServiceTable, addr: IpAddr, port: u16, proto: Proto) -> DataplaneRead {
    let read = match table.source {
        Some(ServiceSource::Ipvs) => "the IPVS virtual services".to_string(),
        Some(ServiceSource::Nftables) => "kube-proxy's nftables map service-ips".to_string(),
        Some(ServiceSource::Iptables) => "kube-proxy's iptables chain KUBE-SERVICES".to_string(),
        None => "the node's rules (no kube-proxy rules found)".to_string(),
    };
    let found = table
        .serves(addr, port, proto)
        .map(|s| format!("{}{}", s.endpoint(), s.name_suffix()));
    DataplaneRead { read, found }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{
        ServiceEntry,
        iptables::parse_iptables_save,
        test_netns::{Netns, root_with, scratch_with},
    };

    const RULES: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/iptables/lab-kube-proxy.rules"
    );

    /// [`programmed`] for `s`'s VIP, port and protocol, read in `ns`'s first namespace.
    fn programmed_in(ns: &Netns, source: ServiceSource, s: &ServiceEntry) -> DataplaneRead {
        let (vip, port, proto) = (s.vip, s.port, s.proto);
        ns.run_in(0, move || programmed(Some(source), vip, port, proto))
            .unwrap()
    }

    /// [`read_facts`] of `touched` in `ns`'s first namespace.
    fn facts_in(ns: &Netns, touched: Touched, source: ServiceSource) -> ServiceTable {
        ns.run_in(0, move || read_facts(&touched, source)).unwrap()
    }

    /// [`programmed`] in `ns` finds `served`: its read names `read_names`, its rule or element
    /// holds `found_holds`; the same VIP on an unserved port (4/TCP) finds nothing.
    #[track_caller]
    fn assert_programmed(
        ns: &Netns,
        source: ServiceSource,
        served: ServiceEntry,
        read_names: &str,
        found_holds: &str,
    ) {
        let found = programmed_in(ns, source, &served);
        assert!(found.read.contains(read_names), "{found:?}");
        assert!(
            found
                .found
                .as_deref()
                .is_some_and(|r| r.contains(found_holds)),
            "{found:?}"
        );
        let unserved = ServiceEntry {
            port: 4,
            proto: Proto::Tcp,
            ..served
        };
        let missing = programmed_in(ns, source, &unserved);
        assert_eq!(missing.found, None);
    }

    /// The dataplane's part beside the API's table, from the lab's kube-proxy rules in a
    /// scratch namespace: the same NodePorts and masquerade rules the whole-table reader finds,
    /// no Services; a Service's own chains are never read; `programmed` finds the
    /// `KUBE-SERVICES` rule of a served VIP:port and none for an unserved one.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn the_facts_and_one_port_are_read_without_the_services() {
        if !root_with("iptables-nft-restore") {
            return;
        }
        let text = std::fs::read_to_string(RULES).unwrap();
        let whole = parse_iptables_save(&text);
        let ns = Netns::new("dataplane", &["", "empty"]);
        assert_eq!(
            ns.run_in(1, detect_mode),
            None,
            "no kube-proxy rules: no mode"
        );
        ns.restore(0, &["iptables-nft-restore"], &text);
        assert_eq!(ns.run_in(0, detect_mode), Some(ServiceSource::Iptables));
        let first = ns.run_in(0, first_read).unwrap();
        assert!(first.services.is_empty() && !first.nodeports.is_empty());

        let facts = facts_in(&ns, Touched::everything(), ServiceSource::Iptables);
        assert!(facts.services.is_empty());
        assert_eq!(facts.source, Some(ServiceSource::Iptables));
        assert_eq!(facts.nodeports, whole.nodeports);
        assert!(!facts.nodeports.is_empty());
        assert_eq!(facts.masquerade_rules, whole.masquerade_rules);
        assert_eq!(facts.masquerade_rules.len(), 2, "{facts:#?}");

        // A commit naming only a Service's own chain changes nothing held.
        let again = facts_in(
            &ns,
            Touched::naming(FAMILY_IP, "nat", ["KUBE-SVC-WEB"]),
            ServiceSource::Iptables,
        );
        assert_eq!(again, facts);
        assert!(facts.firewall.is_empty());

        // kube-proxy's loadBalancerSourceRanges firewall (issue #51): read when a commit names
        // the filter table, then held while commits name other chains.
        ns.restore(
            0,
            &["iptables-nft-restore", "--noflush"],
            "*nat\n:KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]\n:KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]\n\
             -A KUBE-FW-NUKIZ6OKUXPJNT4C -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C\n\
             COMMIT\n*filter\n:KUBE-PROXY-FIREWALL - [0:0]\n\
             -A KUBE-PROXY-FIREWALL -m comment --comment \"ns5/svc5:p80 traffic not accepted by \
             KUBE-FW-NUKIZ6OKUXPJNT4C\" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP\nCOMMIT\n",
        );
        let fw = facts_in(
            &ns,
            Touched::naming(FAMILY_IP, "filter", ["KUBE-PROXY-FIREWALL"]),
            ServiceSource::Iptables,
        );
        assert_eq!(fw.firewall.len(), 1, "{:?}", fw.firewall);
        assert_eq!(fw.firewall[0].allowed_text(), "203.0.113.0/25");
        let held = facts_in(
            &ns,
            Touched::naming(FAMILY_IP, "nat", ["KUBE-SVC-WEB"]),
            ServiceSource::Iptables,
        );
        assert_eq!(held.firewall, fw.firewall);

        let served = whole.services.first().expect("a served VIP:port").clone();
        assert_programmed(
            &ns,
            ServiceSource::Iptables,
            served,
            "KUBE-SERVICES",
            "-A KUBE-SERVICES",
        );
    }

    /// kube-proxy's nftables mode: the NodePorts and masquerade rules the whole reader finds,
    /// no Services; a commit naming only a Service's chain re-reads nothing; `programmed`
    /// finds a `service-ips` element and none for an unserved port.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn nftables_facts_and_one_port() {
        let Some(ns) = scratch_with("nft", "dataplane-nft") else {
            return;
        };
        ns.exec(
            0,
            &[
                "nft",
                "-f",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/data/nftables/etp-local.nft"
                ),
            ],
        );
        // kube-proxy's firewall for loadBalancerSourceRanges (issue #51): a two-range set.
        let firewall = std::env::temp_dir().join(format!("fw-{}.nft", std::process::id()));
        std::fs::write(
            &firewall,
            "add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
             add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80\n\
             add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25, 192.0.2.7 } drop\n\
             add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }\n",
        )
        .unwrap();
        ns.exec(0, &["nft", "-f", firewall.to_str().unwrap()]);
        std::fs::remove_file(&firewall).unwrap();
        let whole = ns.run_in(0, nftables::read_blocking).unwrap().unwrap();
        assert_eq!(whole.firewall.len(), 1, "{:?}", whole.firewall);
        assert_eq!(
            whole.firewall[0].allowed_text(),
            "192.0.2.7, 203.0.113.0/25"
        );
        assert_eq!(whole.firewall[0].service.as_deref(), Some("ns5/svc5:p80"));
        assert_eq!(ns.run_in(0, detect_mode), Some(ServiceSource::Nftables));
        let facts = facts_in(&ns, Touched::everything(), ServiceSource::Nftables);
        assert!(facts.services.is_empty());
        assert!(!facts.nodeports.is_empty());
        assert_eq!(facts.nodeports, whole.nodeports);
        assert_eq!(facts.masquerade_rules, whole.masquerade_rules);
        assert!(!facts.masquerade_rules.is_empty());
        assert_eq!(
            facts.firewall, whole.firewall,
            "the firewall beside the API's table"
        );
        let again = facts_in(
            &ns,
            Touched::naming(FAMILY_IP, nftables::TABLE, ["service-ips"]),
            ServiceSource::Nftables,
        );
        assert_eq!(again, facts);

        // Incremental: a commit re-reads the chains it names, the rest comes from the last
        // read. The Local Service's external chain gains an unconditional masquerade (now
        // Cluster's shape); a commit naming another relevant chain leaves the NodePort Local,
        // one naming this chain makes it Cluster, as a whole read does.
        const EXT: &str = "external-DZ3B7L2Q-shop/api/tcp/https";
        let local_31443 = |t: &ServiceTable| {
            t.nodeports
                .iter()
                .find(|n| n.port == 31443)
                .map(|n| n.local_only)
        };
        assert_eq!(local_31443(&facts), Some(true));
        ns.exec(
            0,
            &[
                "nft",
                "insert",
                "rule",
                "ip",
                "kube-proxy",
                EXT,
                "jump",
                "mark-for-masquerade",
            ],
        );
        let read_naming = |name: &'static str| {
            facts_in(
                &ns,
                Touched::naming(FAMILY_IP, nftables::TABLE, [name]),
                ServiceSource::Nftables,
            )
        };
        assert_eq!(
            local_31443(&read_naming(nftables::MASQUERADING)),
            Some(true)
        );
        let named = read_naming(EXT);
        assert_eq!(local_31443(&named), Some(false));
        let whole_again = facts_in(&ns, Touched::everything(), ServiceSource::Nftables);
        assert_eq!(named, whole_again);

        let served = whole
            .services
            .iter()
            .find(|s| s.vip.is_ipv4())
            .expect("a served IPv4 VIP:port")
            .clone();
        assert_programmed(&ns, ServiceSource::Nftables, served, "service-ips", "goto ");
    }
}
