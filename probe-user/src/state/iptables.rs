//! kube-proxy's nat rules, read from `iptables-save -t nat` (and `ip6tables-save -t nat`).
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
//! The parser never fails and never panics: lines it does not understand are skipped.
//!
//! [`read`] runs the commands. A node can hold rules in both iptables backends (nft and legacy):
//! the default `iptables-save` is read, and the other backend is read too when it holds a nat
//! table with `KUBE-` chains; the results are merged.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::event::Proto;
use crate::state::{NodePortEntry, ParseCache, ServiceEntry, ServiceSource, ServiceTable};

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

/// Reads the nat table(s) of the calling thread's network namespace. Blocking.
///
/// `iptables-save -t nat` must work (its failure is the error). `ip6tables-save` and the other
/// backend are best effort: their failures are logged and skipped. The legacy backend is only
/// asked when the kernel already has a legacy nat table (`/proc/thread-self/net/ip_tables_names`), because
/// `iptables-legacy-save -t nat` would otherwise load the legacy nat module as a side effect.
pub fn read_blocking() -> Result<ServiceTable, IptablesError> {
    static PARSED: ParseCache<ServiceTable> = ParseCache::new();
    static DEFAULT_IS_NFT: OnceLock<bool> = OnceLock::new();
    let v4 = run("iptables-save", &["-t", "nat"])?;
    let mut table = PARSED.parse("iptables-save", &v4, digest, parse_iptables_save);

    // The backend of the installed iptables does not change while we run: asked once.
    let default_is_nft = *DEFAULT_IS_NFT.get_or_init(|| {
        run("iptables-save", &["--version"])
            .map(|v| v.contains("nf_tables"))
            .unwrap_or(false)
    });

    let mut extra: Vec<(&str, Option<&str>)> = vec![("ip6tables-save", None)];
    if default_is_nft {
        extra.push((
            "iptables-legacy-save",
            Some("/proc/thread-self/net/ip_tables_names"),
        ));
        extra.push((
            "ip6tables-legacy-save",
            Some("/proc/thread-self/net/ip6_tables_names"),
        ));
    } else {
        extra.push(("iptables-nft-save", None));
        extra.push(("ip6tables-nft-save", None));
    }
    for (cmd, needs_proc_table) in extra {
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
                // The second backend only matters when kube-proxy (or a stale kube-proxy) wrote
                // into it; ip6tables-save is always merged.
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
    table.access_filter = read_access_filter();
    Ok(table)
}

/// What of an `iptables-save` dump is the rules: its `#` lines (the date of the dump) and the
/// chains' counters (`:PREROUTING ACCEPT [12:3456]`, moving with traffic) are left out.
pub fn digest(text: &str, h: &mut std::hash::DefaultHasher) {
    use std::hash::Hash;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let line = match line.strip_prefix(':') {
            Some(chain) => chain.split_once(" [").map_or(chain, |(head, _)| head),
            None => strip_counters(line),
        };
        line.hash(h);
    }
}

/// kube-proxy's IPVS access filter chain (filter table, jumped from INPUT; kube-proxy >= 1.25
/// in IPVS mode): REJECTs new connections to kube-ipvs0 addresses on ports no service uses.
pub const ACCESS_FILTER_CHAIN: &str = "KUBE-IPVS-FILTER";

/// The rules of [`ACCESS_FILTER_CHAIN`] in `iptables -S` or `iptables-save` text.
pub fn parse_access_filter(text: &str) -> Vec<String> {
    let prefix = format!("-A {ACCESS_FILTER_CHAIN} ");
    text.lines()
        .map(|l| strip_counters(l.trim()))
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Reads [`ACCESS_FILTER_CHAIN`] (one chain, not the whole filter table). A missing chain or
/// a failing command is no filter.
fn read_access_filter() -> Vec<String> {
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
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Merges `other` into `table`: services by VIP:port/proto (backends united), NodePorts by
/// port/proto (`local_only` if either says so), masquerade rules deduplicated.
pub fn merge(table: &mut ServiceTable, other: ServiceTable) {
    use std::collections::HashMap;
    if table.source.is_none() {
        table.source = other.source;
    }
    // Indexed once per merge: a 10,000-Service table merged entry by entry with a linear
    // search was quadratic.
    let mut services: HashMap<_, usize> = table
        .services
        .iter()
        .enumerate()
        .map(|(i, t)| ((t.vip, t.port, t.proto), i))
        .collect();
    for s in other.services {
        match services.get(&(s.vip, s.port, s.proto)) {
            Some(&i) => {
                let t = &mut table.services[i];
                if t.service.is_none() {
                    t.service = s.service;
                }
                for b in s.backends {
                    if !t.backends.contains(&b) {
                        t.backends.push(b);
                    }
                }
                t.backends.sort();
            }
            None => {
                services.insert((s.vip, s.port, s.proto), table.services.len());
                table.services.push(s);
            }
        }
    }
    let mut nodeports: HashMap<_, usize> = table
        .nodeports
        .iter()
        .enumerate()
        .map(|(i, t)| ((t.port, t.proto), i))
        .collect();
    for n in other.nodeports {
        match nodeports.get(&(n.port, n.proto)) {
            Some(&i) => {
                let t = &mut table.nodeports[i];
                t.local_only |= n.local_only;
                if t.service.is_none() {
                    t.service = n.service;
                }
            }
            None => {
                nodeports.insert((n.port, n.proto), table.nodeports.len());
                table.nodeports.push(n);
            }
        }
    }
    for m in other.masquerade_rules {
        if !table.masquerade_rules.contains(&m) {
            table.masquerade_rules.push(m);
        }
    }
}

/// One `-A` rule, reduced to the matches and targets kube-proxy uses.
#[derive(Debug, Default, Clone)]
struct Rule {
    /// The rule as written (without `[pkts:bytes]` counters).
    text: String,
    chain: String,
    /// `-d` address/prefix, when not negated.
    dst: Option<String>,
    dst_negated: bool,
    proto: Option<String>,
    dport: Option<u16>,
    comment: Option<String>,
    /// `-j` or `-g` target.
    target: Option<String>,
    to_destination: Option<String>,
    /// `-m addrtype --src-type LOCAL`.
    src_type_local: bool,
}

const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-XLB-",
];

fn is_service_chain(name: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The hash part of a kube-proxy chain name (`KUBE-EXT-ABC` -> `ABC`).
fn chain_hash(name: &str) -> Option<&str> {
    SERVICE_CHAIN_PREFIXES
        .iter()
        .chain(["KUBE-SEP-"].iter())
        .find_map(|p| name.strip_prefix(p))
}

/// Parses `iptables-save -t nat` output (also `iptables -t nat -S [-v]` output and grep
/// excerpts of either). Pure and total: unknown or malformed lines are ignored.
pub fn parse_iptables_save(text: &str) -> ServiceTable {
    let mut rules: Vec<Rule> = Vec::new();
    // Rules outside a table header (`-S` output, grep excerpts) count as nat.
    let mut in_nat = true;
    for raw in text.lines() {
        let line = strip_counters(raw.trim());
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(table) = line.strip_prefix('*') {
            in_nat = table.trim() == "nat";
            continue;
        }
        if !in_nat || !line.starts_with("-A ") {
            continue;
        }
        if let Some(rule) = parse_rule(line) {
            rules.push(rule);
        }
    }
    build_table(&rules)
}

/// Drops the `[pkts:bytes] ` prefix `iptables-save -c` writes.
fn strip_counters(line: &str) -> &str {
    if line.starts_with('[')
        && let Some(end) = line.find(']')
    {
        return line[end + 1..].trim_start();
    }
    line
}

/// Splits a rule line like a shell would for iptables-save's quoting: double quotes group,
/// backslash escapes the next character inside quotes.
fn tokenize(line: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut in_token = false;
    let mut in_quotes = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                in_token = true;
            }
            '\\' if in_quotes => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() && !in_quotes => {
                if in_token {
                    tokens.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            c => {
                cur.push(c);
                in_token = true;
            }
        }
    }
    if in_token {
        tokens.push(cur);
    }
    tokens
}

fn parse_rule(line: &str) -> Option<Rule> {
    let tokens = tokenize(line);
    let mut it = tokens.iter().peekable();
    if it.next().map(String::as_str) != Some("-A") {
        return None;
    }
    let mut rule = Rule {
        text: line.to_string(),
        chain: it.next()?.clone(),
        ..Rule::default()
    };
    let mut negate = false;
    while let Some(tok) = it.next() {
        let tok = tok.as_str();
        let neg = std::mem::take(&mut negate);
        match tok {
            "!" => negate = true,
            "-d" | "--destination" | "--dst" => {
                let v = it.next()?;
                rule.dst = Some(v.clone());
                rule.dst_negated = neg;
            }
            "-p" | "--protocol" => {
                let v = it.next()?;
                if !neg {
                    rule.proto = Some(v.to_ascii_lowercase());
                }
            }
            "--dport" | "--destination-port" => {
                let v = it.next()?;
                if !neg {
                    rule.dport = v.parse().ok();
                }
            }
            "--comment" => rule.comment = Some(it.next()?.clone()),
            "-j" | "--jump" | "-g" | "--goto" => rule.target = Some(it.next()?.clone()),
            "--to-destination" => rule.to_destination = Some(it.next()?.clone()),
            "--src-type" => {
                let v = it.next()?;
                rule.src_type_local = !neg && v.split(',').any(|t| t == "LOCAL");
            }
            // `iptables -S -v` writes `-c PKTS BYTES`.
            "-c" | "--set-counters" => {
                it.next();
                it.next();
            }
            _ => {
                // An option we do not interpret: skip its arguments (tokens that are not options).
                if tok.starts_with('-') {
                    while let Some(next) = it.peek() {
                        if next.starts_with('-') || next.as_str() == "!" {
                            break;
                        }
                        it.next();
                    }
                }
            }
        }
    }
    Some(rule)
}

fn parse_proto(p: Option<&str>) -> Option<Proto> {
    match p? {
        "tcp" | "6" => Some(Proto::Tcp),
        "udp" | "17" => Some(Proto::Udp),
        "sctp" | "132" => Some(Proto::Other(132)),
        other => other.parse::<u8>().ok().map(Proto::from_raw),
    }
}

/// `10.96.0.10/32` -> 10.96.0.10; a non-host prefix is not a VIP.
fn parse_host(addr: &str) -> Option<IpAddr> {
    let (ip, prefix) = match addr.split_once('/') {
        Some((ip, p)) => (ip, Some(p)),
        None => (addr, None),
    };
    let ip: IpAddr = ip.parse().ok()?;
    let host_prefix = if ip.is_ipv4() { "32" } else { "128" };
    match prefix {
        None => Some(ip),
        Some(p) if p == host_prefix || p == "255.255.255.255" => Some(ip),
        Some(_) => None,
    }
}

/// The `namespace/name:port` part of a kube-proxy comment: drops the kind suffix (`cluster IP`,
/// `external IP`, `loadbalancer IP`, ...) and a trailing `:` (older releases wrote
/// `default/web:` for an unnamed port).
fn service_name(comment: Option<&str>) -> Option<String> {
    let c = comment?.trim();
    let name = c.split_whitespace().next()?;
    if !name.contains('/') {
        return None;
    }
    let name = name.strip_suffix(':').unwrap_or(name);
    Some(name.to_string())
}

struct Chains<'a> {
    by_name: HashMap<&'a str, Vec<&'a Rule>>,
}

impl<'a> Chains<'a> {
    fn new(rules: &'a [Rule]) -> Self {
        let mut by_name: HashMap<&str, Vec<&Rule>> = HashMap::new();
        for r in rules {
            by_name.entry(r.chain.as_str()).or_default().push(r);
        }
        Chains { by_name }
    }

    fn rules(&self, chain: &str) -> &[&'a Rule] {
        self.by_name.get(chain).map(Vec::as_slice).unwrap_or(&[])
    }

    /// DNAT targets reachable from `chain` through service and endpoint chains.
    fn backends(&self, chain: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        self.collect(chain, &mut seen, &mut out);
        if out.is_empty() {
            // A grep excerpt may lack the unconditional `-j KUBE-SVC-...` line of an EXT / FW /
            // XLB chain; the service chain shares the hash.
            if let Some(hash) = chain_hash(chain) {
                let svc = format!("KUBE-SVC-{hash}");
                if svc != chain {
                    self.collect(&svc, &mut seen, &mut out);
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn collect(&self, chain: &str, seen: &mut HashSet<String>, out: &mut Vec<String>) {
        if seen.len() > 10_000 || !seen.insert(chain.to_string()) {
            return;
        }
        for r in self.rules(chain) {
            if let Some(dest) = &r.to_destination
                && r.target.as_deref() == Some("DNAT")
            {
                out.push(dest.clone());
            }
            if let Some(t) = &r.target
                && (is_service_chain(t) || t.starts_with("KUBE-SEP-"))
            {
                self.collect(t, seen, out);
            }
        }
    }

    /// Whether a NodePort whose rule jumps to `target` has externalTrafficPolicy: Local.
    fn local_only(&self, target: &str) -> bool {
        if target.starts_with("KUBE-XLB-") || target.starts_with("KUBE-SVL-") {
            return true;
        }
        if !target.starts_with("KUBE-EXT-") {
            return false;
        }
        let rules = self.rules(target);
        let unconditional_masq = rules.iter().any(|r| {
            r.target.as_deref() == Some("KUBE-MARK-MASQ")
                && !r.src_type_local
                && !r
                    .comment
                    .as_deref()
                    .is_some_and(|c| c.starts_with("masquerade LOCAL traffic"))
        });
        if unconditional_masq {
            return false;
        }
        let jumps_local = rules.iter().any(|r| {
            r.target
                .as_deref()
                .is_some_and(|t| t.starts_with("KUBE-SVL-"))
        });
        let local_comments = rules.iter().any(|r| {
            r.comment.as_deref().is_some_and(|c| {
                c.starts_with("masquerade LOCAL traffic") || c.starts_with("route LOCAL traffic")
            })
        });
        jumps_local || local_comments
    }
}

fn build_table(rules: &[Rule]) -> ServiceTable {
    let chains = Chains::new(rules);
    let mut table = ServiceTable {
        source: Some(ServiceSource::Iptables),
        ..ServiceTable::default()
    };
    // Services by VIP:port/proto: a linear search per rule was quadratic (10,000 Services:
    // 50 million comparisons per parse).
    let mut index: HashMap<(IpAddr, u16, Proto), usize> = HashMap::new();

    for r in chains.rules("KUBE-SERVICES") {
        let Some(target) = r.target.as_deref() else {
            continue;
        };
        if !is_service_chain(target) || r.dst_negated {
            continue;
        }
        let (Some(vip), Some(port), Some(proto)) = (
            r.dst.as_deref().and_then(parse_host),
            r.dport,
            parse_proto(r.proto.as_deref()),
        ) else {
            continue;
        };
        let entry = ServiceEntry {
            vip,
            port,
            proto,
            service: service_name(r.comment.as_deref()),
            backends: chains.backends(target),
        };
        merge_service(&mut table.services, &mut index, entry);
    }

    for r in chains.rules("KUBE-NODEPORTS") {
        let Some(target) = r.target.as_deref() else {
            continue;
        };
        if !is_service_chain(target) {
            continue;
        }
        let (Some(port), Some(proto)) = (r.dport, parse_proto(r.proto.as_deref())) else {
            continue;
        };
        let entry = NodePortEntry {
            port,
            proto,
            service: service_name(r.comment.as_deref()),
            local_only: chains.local_only(target),
        };
        match table
            .nodeports
            .iter_mut()
            .find(|n| n.port == port && n.proto == proto)
        {
            Some(n) => {
                n.local_only |= entry.local_only;
                if n.service.is_none() {
                    n.service = entry.service;
                }
            }
            None => table.nodeports.push(entry),
        }
    }

    for r in rules {
        if r.target.as_deref() == Some("MASQUERADE") && !table.masquerade_rules.contains(&r.text) {
            table.masquerade_rules.push(r.text.clone());
        }
    }
    table
}

fn merge_service(
    services: &mut Vec<ServiceEntry>,
    index: &mut HashMap<(IpAddr, u16, Proto), usize>,
    entry: ServiceEntry,
) {
    let key = (entry.vip, entry.port, entry.proto);
    match index.get(&key).map(|&i| &mut services[i]) {
        Some(s) => {
            if s.service.is_none() {
                s.service = entry.service;
            }
            for b in entry.backends {
                if !s.backends.contains(&b) {
                    s.backends.push(b);
                }
            }
            s.backends.sort();
        }
        None => {
            index.insert(key, services.len());
            services.push(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{DefaultHasher, Hasher};

    fn hashed(digest: fn(&str, &mut DefaultHasher), text: &str) -> u64 {
        let mut h = DefaultHasher::new();
        digest(text, &mut h);
        h.finish()
    }

    #[test]
    fn the_digest_is_the_rules_not_the_date_or_the_counters() {
        let a = "# Generated by iptables-save v1.8.9 on Tue Nov 24 19:31:41 2026\n*nat\n:PREROUTING ACCEPT [1:60]\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j KUBE-SVC-A\nCOMMIT\n";
        let b = a
            .replace("19:31:41", "19:31:42")
            .replace("[1:60]", "[7:420]");
        assert_eq!(hashed(digest, a), hashed(digest, &b));
        let c = a.replace("10.96.0.1", "10.96.0.2");
        assert_ne!(hashed(digest, a), hashed(digest, &c));
        let d = a.replace("KUBE-SERVICES - [0:0]", "KUBE-NODEPORTS - [0:0]");
        assert_ne!(hashed(digest, a), hashed(digest, &d));
        let nft_a = r#"{"rule": {"family": "ip", "handle": 12, "expr": [{"dnat": {"addr": "10.244.0.1"}}]}}"#;
        let nft_b = nft_a.replace("\"handle\": 12", "\"handle\": 4031");
        let nft_c = nft_a.replace("10.244.0.1", "10.244.0.2");
        let nft = crate::state::nftables::digest;
        assert_eq!(hashed(nft, nft_a), hashed(nft, &nft_b));
        assert_ne!(hashed(nft, nft_a), hashed(nft, &nft_c));
    }

    use super::*;
    use crate::state::test_netns::Netns;

    const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/iptables/");

    fn fixture(name: &str) -> ServiceTable {
        let text = std::fs::read_to_string(format!("{DATA}{name}")).expect("fixture");
        parse_iptables_save(&text)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn np(t: &ServiceTable, port: u16) -> &NodePortEntry {
        t.nodeport(port, Proto::Tcp).expect("nodeport")
    }

    #[test]
    fn lab_capture_v4() {
        let t = fixture("lab-capture-v4.txt");
        assert_eq!(t.source, Some(ServiceSource::Iptables));
        let web = t.serves(ip("198.18.96.10"), 80, Proto::Tcp).unwrap();
        assert_eq!(web.service.as_deref(), Some("default/web:http"));
        assert_eq!(web.backends, ["198.19.1.5:8080", "198.19.2.7:8080"]);
        let lb = t.serves(ip("203.0.113.10"), 80, Proto::Tcp).unwrap();
        assert_eq!(lb.service.as_deref(), Some("default/web:http"));
        // EXT -> SVC (pod / local traffic) and SVL (external traffic): all endpoints.
        assert_eq!(lb.backends, ["198.19.1.5:8080", "198.19.2.7:8080"]);
        let ext = t.serves(ip("198.51.100.20"), 443, Proto::Tcp).unwrap();
        assert_eq!(ext.service.as_deref(), Some("default/api:https"));
        assert_eq!(ext.backends, ["198.19.2.9:8443"]);
        let dns = t.serves(ip("198.18.96.53"), 53, Proto::Udp).unwrap();
        assert_eq!(dns.backends, ["198.19.1.3:53"]);
        assert!(t.serves(ip("198.18.96.53"), 53, Proto::Tcp).is_none());
        assert!(t.serves(ip("203.0.113.10"), 443, Proto::Tcp).is_none());
        assert_eq!(t.services.len(), 5);

        assert_eq!(t.nodeports.len(), 2);
        let web_np = np(&t, 30080);
        assert!(web_np.local_only);
        assert_eq!(web_np.service.as_deref(), Some("default/web:http"));
        assert!(!np(&t, 30443).local_only);

        assert_eq!(
            t.masquerade_rules,
            [
                "-A CNI-MASQ ! -d 224.0.0.0/4 -j MASQUERADE --random-fully",
                "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
            ]
        );
    }

    #[test]
    fn access_filter_rules_from_either_listing() {
        for text in [
            "-N KUBE-IPVS-FILTER\n-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN\n-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable\n",
            "*filter\n:KUBE-IPVS-FILTER - [0:0]\n-A INPUT -j KUBE-IPVS-FILTER\n[3:180] -A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN\n-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable\nCOMMIT\n",
        ] {
            let rules = parse_access_filter(text);
            assert_eq!(rules.len(), 2, "{rules:?}");
            assert!(rules[1].ends_with("icmp-port-unreachable"), "{rules:?}");
        }
        assert!(parse_access_filter("-A INPUT -j ACCEPT\n").is_empty());
    }

    #[test]
    fn lab_capture_v6() {
        let t = fixture("lab-capture-v6.txt");
        let web = t.serves(ip("2001:db8:96::10"), 80, Proto::Tcp).unwrap();
        assert_eq!(web.service.as_deref(), Some("default/web6:http"));
        assert_eq!(web.backends, ["[2001:db8:244:1::5]:8080"]);
        assert!(!np(&t, 30081).local_only);
        assert_eq!(t.masquerade_rules.len(), 1);
    }

    #[test]
    fn merged_v4_and_v6() {
        let mut t = fixture("lab-capture-v4.txt");
        merge(&mut t, fixture("lab-capture-v6.txt"));
        merge(&mut t, fixture("lab-capture-v4.txt"));
        assert_eq!(t.services.len(), 6);
        assert_eq!(t.nodeports.len(), 3);
        assert_eq!(t.masquerade_rules.len(), 2);
    }

    #[test]
    fn aks_etp_cluster() {
        let t = fixture("aks-etp-cluster-grep.txt");
        let cip = t.serves(ip("10.0.11.45"), 80, Proto::Tcp).unwrap();
        assert_eq!(cip.service.as_deref(), Some("default/nginx"));
        assert_eq!(cip.backends, ["10.244.2.5:80"]);
        let lb = t.serves(ip("20.91.172.24"), 80, Proto::Tcp).unwrap();
        assert_eq!(lb.service.as_deref(), Some("default/nginx"));
        // The grep lost `-A KUBE-EXT-... -j KUBE-SVC-...`; the hash still finds the endpoints.
        assert_eq!(lb.backends, ["10.244.2.5:80"]);
        let n = np(&t, 32643);
        assert!(!n.local_only);
        assert_eq!(n.service.as_deref(), Some("default/nginx"));
        assert!(t.masquerade_rules.is_empty());
    }

    #[test]
    fn kind_etp_local_lb() {
        let t = fixture("kind-etp-local-lb-grep.txt");
        assert_eq!(t.services.len(), 1, "the duplicated LB line is one service");
        let lb = t.serves(ip("172.17.0.241"), 80, Proto::Tcp).unwrap();
        assert_eq!(lb.service.as_deref(), Some("default/nginx"));
        // Only the SVL chain's SEP targets are in the excerpt, and SEP chains are not: no DNAT.
        assert!(lb.backends.is_empty());
        assert_eq!(t.nodeports.len(), 1);
        let n = np(&t, 30655);
        assert!(n.local_only);
        assert_eq!(n.service.as_deref(), Some("default/nginx"));
    }

    #[test]
    fn metallb_etp_local_with_counters() {
        let t = fixture("metallb-etp-local-S-v.txt");
        let rules: Vec<Rule> = std::fs::read_to_string(format!("{DATA}metallb-etp-local-S-v.txt"))
            .unwrap()
            .lines()
            .filter_map(|l| l.starts_with("-A ").then(|| parse_rule(l)).flatten())
            .collect();
        let chains = Chains::new(&rules);
        assert!(chains.local_only("KUBE-EXT-W47NQ5DDJKUWFTVY"));
        assert!(!chains.local_only("KUBE-SVC-W47NQ5DDJKUWFTVY"));
        let masq = rules
            .iter()
            .find(|r| {
                r.target.as_deref() == Some("KUBE-MARK-MASQ") && r.chain.starts_with("KUBE-EXT")
            })
            .unwrap();
        assert!(
            masq.src_type_local,
            "`-c 0 0` must not hide the addrtype match"
        );
        // No KUBE-SERVICES / KUBE-NODEPORTS lines in this excerpt.
        assert!(t.services.is_empty() && t.nodeports.is_empty());
    }

    #[test]
    fn weave_old_xlb() {
        let t = fixture("weave-3568-xlb-grep.txt");
        assert_eq!(t.services.len(), 1);
        let cip = t.serves(ip("10.108.2.154"), 80, Proto::Tcp).unwrap();
        assert_eq!(cip.service.as_deref(), Some("default/nginx-ext"));
        assert_eq!(cip.backends, ["10.44.0.56:80"]);
        let n = np(&t, 32204);
        assert!(n.local_only);
        assert_eq!(n.service.as_deref(), Some("default/nginx-ext"));
    }

    #[test]
    fn kind_full_nat() {
        let t = fixture("kind-nat-S-excerpt.txt");
        let web = t.serves(ip("10.96.86.215"), 80, Proto::Tcp).unwrap();
        assert_eq!(web.service.as_deref(), Some("default/my-nginx"));
        assert_eq!(web.backends, ["10.244.2.3:80", "10.244.3.3:80"]);
        let dns = t.serves(ip("10.96.0.10"), 53, Proto::Udp).unwrap();
        assert_eq!(dns.service.as_deref(), Some("kube-system/kube-dns:dns"));
        assert_eq!(dns.backends, ["10.244.0.2:53", "10.244.0.3:53"]);
        assert_eq!(t.services.len(), 2, "DOCKER_OUTPUT DNAT is not a service");
        assert!(t.nodeports.is_empty());
        assert_eq!(t.masquerade_rules.len(), 2);
        assert!(t.masquerade_rules[0].starts_with("-A KIND-MASQ-AGENT"));
        assert!(
            t.masquerade_rules[1].contains("--mark")
                || t.masquerade_rules[1].contains("KUBE-POSTROUTING")
        );
    }

    #[test]
    fn other_tables_and_counters() {
        let text = "*filter\n-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp --dport 1 -j KUBE-SVC-A\nCOMMIT\n\
                    *nat\n[5:300] -A KUBE-SERVICES -d 10.0.0.2/32 -p tcp -m comment --comment \"a/b:c cluster IP\" -m tcp --dport 2 -j KUBE-SVC-B\n\
                    [0:0] -A KUBE-SVC-B -j KUBE-SEP-B\n-A KUBE-SEP-B -p tcp -j DNAT --to-destination 10.1.0.2:2\n\
                    -A KUBE-SERVICES -d 10.0.0.0/24 -p tcp --dport 3 -j KUBE-SVC-C\nCOMMIT\n";
        let t = parse_iptables_save(text);
        assert_eq!(t.services.len(), 1);
        assert_eq!(t.services[0].vip, ip("10.0.0.2"));
        assert_eq!(t.services[0].service.as_deref(), Some("a/b:c"));
        assert_eq!(t.services[0].backends, ["10.1.0.2:2"]);
    }

    #[test]
    fn quoted_comments() {
        let r =
            parse_rule(r#"-A X -m comment --comment "say \"hi\" -j NOPE" -j MASQUERADE"#).unwrap();
        assert_eq!(r.comment.as_deref(), Some(r#"say "hi" -j NOPE"#));
        assert_eq!(r.target.as_deref(), Some("MASQUERADE"));
    }

    /// `read_blocking` in a scratch namespace holding the lab ruleset (root only).
    #[test]
    fn read_in_namespace() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: needs root");
            return;
        }
        if !command_exists("iptables-restore") || !command_exists("ip") {
            eprintln!("skipping: needs ip and iptables-restore");
            return;
        }
        let ns = Netns::new("ipt", &[""]);
        let rules = std::fs::read_to_string(format!("{DATA}lab-kube-proxy.rules")).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns.name(0), "iptables-restore"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());

        let table = ns.run_in(0, read_blocking).unwrap();
        assert_eq!(table, fixture("lab-capture-v4.txt"));
    }

    #[test]
    fn garbage_never_panics() {
        let inputs = [
            "",
            "-A",
            "-A KUBE-SERVICES",
            "-A KUBE-SERVICES -d",
            "-A KUBE-SERVICES -d 10.0.0.1/32 -p",
            "-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp --dport",
            "-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp --dport 99999 -j KUBE-SVC-X",
            "-A KUBE-SERVICES -d not-an-ip -p tcp --dport 80 -j KUBE-SVC-X",
            "-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp --dport 80 -j",
            "-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp --dport 80 -m comment --comment \"unterminated -j KUBE-SVC-X",
            "-A KUBE-NODEPORTS -p tcp --dport 30000 -j KUBE-EXT-LOOP",
            "-A KUBE-EXT-LOOP -j KUBE-SVC-LOOP",
            "-A KUBE-SVC-LOOP -j KUBE-EXT-LOOP",
            "[1:2",
            "[]",
            "*",
            ":KUBE-SVC-X - [0:0]",
            "COMMIT",
            "\u{0}\u{ffff} ☃ -A ! ! ! -j",
            "-A KUBE-SEP-X -j DNAT --to-destination",
            "-A X -c 1",
        ];
        let all = inputs.join("\n");
        let t = parse_iptables_save(&all);
        assert_eq!(t.nodeports.len(), 1);
        assert!(!t.nodeports[0].local_only);
        for i in &inputs {
            let _ = parse_iptables_save(i);
        }
        // Every prefix of a real capture (truncated output).
        let text = std::fs::read_to_string(format!("{DATA}lab-capture-v4.txt")).unwrap();
        for cut in (0..text.len()).step_by(7) {
            if text.is_char_boundary(cut) {
                let _ = parse_iptables_save(&text[..cut]);
            }
        }
    }
}
