//! The pure half of the iptables reader: `iptables-save -t nat` / `iptables -t nat -S` text
//! -> rules -> chains -> [`ServiceTable`]. Never fails, never panics: lines it does not
//! understand are skipped.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

use probe_contract::Proto;

use crate::state::{
    NoEndpointDrop, NoEndpointReject, NodePortEntry, PodShortCircuit, ServiceEntry, ServiceSource,
    ServiceTable,
};

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

pub use probe_core::state::iptables::ACCESS_FILTER_CHAIN;

/// The rules of [`ACCESS_FILTER_CHAIN`] in `iptables -S` or `iptables-save` text.
pub fn parse_access_filter(text: &str) -> Vec<String> {
    let prefix = format!("-A {ACCESS_FILTER_CHAIN} ");
    text.lines()
        .map(|l| strip_counters(l.trim()))
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Merges `other` into `table`: services by VIP:port/proto (backends united), NodePorts by
/// port/proto (`local_only` if either says so), masquerade rules and nftables
/// `no-endpoint-services` drops deduplicated.
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
    for d in other.no_endpoint_drops {
        if !table.no_endpoint_drops.contains(&d) {
            table.no_endpoint_drops.push(d);
        }
    }
    for r in other.no_endpoint_rejects {
        if !table.no_endpoint_rejects.contains(&r) {
            table.no_endpoint_rejects.push(r);
        }
    }
    for p in other.pod_short_circuits {
        if !table.pod_short_circuits.contains(&p) {
            table.pod_short_circuits.push(p);
        }
    }
    // nftables `firewall-ips` entries (issue #51): one family's each, never the same.
    table.firewall.extend(other.firewall);
}

/// kube-proxy's filter chain for external and LB IPs (iptables mode): an externalTrafficPolicy
/// Local Service without a local endpoint gets, per external or LB IP:port,
/// `-m comment --comment "<ns>/<svc>:<port> has no local endpoints" -d <ip> --dport <port>
/// -j DROP` ("DROP anything that didn't get short-circuited by the EXT chain",
/// kubernetes/kubernetes `pkg/proxy/iptables/proxier.go`, `syncProxyRules`), jumped from
/// `INPUT` and `FORWARD` for new connections.
pub const EXTERNAL_SERVICES_CHAIN: &str = "KUBE-EXTERNAL-SERVICES";
/// The comment's tail on those drops (a Service without any endpoint gets "has no endpoints"
/// and `-j REJECT`: no drop).
const NO_LOCAL_ENDPOINTS: &str = " has no local endpoints";
/// The comment's head of an external chain's pod short circuit ([`PodShortCircuit`]).
const POD_SHORT_CIRCUIT: &str = "pod traffic for ";

/// The no-endpoint drops among `rules` (those of [`EXTERNAL_SERVICES_CHAIN`]): the `-j DROP`
/// rules with a host destination, protocol and port whose comment says "has no local
/// endpoints" (the NodePort ones match `--dst-type LOCAL`, no address: not ours).
pub fn external_drops(rules: &[Rule]) -> Vec<NoEndpointDrop> {
    let service = |c: &str| c.strip_suffix(NO_LOCAL_ENDPOINTS).map(str::to_string);
    commented_destinations(rules, EXTERNAL_SERVICES_CHAIN, "DROP", service)
        .into_iter()
        .map(|(addr, proto, port, service)| NoEndpointDrop {
            addr,
            proto,
            port,
            service: Some(service),
        })
        .collect()
}

/// kube-proxy's per-Service rules of one shape, each once, in rule order: in `chain`, jumping
/// to `target`, with a host destination (not negated), a protocol and a port, and a comment
/// `named` reads (what it names: the Service, and any chain the comment names).
pub(super) fn commented_destinations<T: PartialEq>(
    rules: &[Rule],
    chain: &str,
    target: &str,
    named: impl Fn(&str) -> Option<T>,
) -> Vec<(IpAddr, Proto, u16, T)> {
    let mut out = Vec::new();
    for r in rules {
        if r.chain != chain || r.target.as_deref() != Some(target) {
            continue;
        }
        let (Some(name), Some(addr), Some(port), Some(proto)) = (
            r.comment.as_deref().and_then(|c| named(c.trim())),
            r.dst
                .as_deref()
                .filter(|_| !r.dst_negated)
                .and_then(parse_host),
            r.dport,
            parse_proto(r.proto.as_deref()),
        ) else {
            continue;
        };
        let found = (addr, proto, port, name);
        if !out.contains(&found) {
            out.push(found);
        }
    }
    out
}

/// [`external_drops`] of `iptables -S KUBE-EXTERNAL-SERVICES` text (the legacy backend) or
/// of an `iptables-save` dump (its filter table's rules of that chain).
pub fn parse_external_drops(text: &str) -> Vec<NoEndpointDrop> {
    external_drops(&chain_rules(text, EXTERNAL_SERVICES_CHAIN))
}

/// The rules of `chain` in `iptables -S` or `iptables-save` text (counters stripped).
pub(super) fn chain_rules(text: &str, chain: &str) -> Vec<Rule> {
    let prefix = format!("-A {chain} ");
    text.lines()
        .map(|l| strip_counters(l.trim()))
        .filter(|l| l.starts_with(&prefix))
        .filter_map(parse_rule)
        .collect()
}

/// kube-proxy's filter chain `KUBE-SERVICES` (iptables mode), jumped from `OUTPUT` and
/// `FORWARD` for new connections: a Service port without any endpoint gets
/// `-m comment --comment "<ns>/<svc>:<port> has no endpoints" -m <proto> -p <proto> -d
/// <ClusterIP> --dport <port> -j REJECT` and no nat chain (kubernetes/kubernetes
/// `pkg/proxy/iptables/proxier.go`, `syncProxyRules`, `internalTrafficFilterTarget`).
pub const FILTER_SERVICES_CHAIN: &str = "KUBE-SERVICES";
/// The comment's tail on those rejects.
const NO_ENDPOINTS: &str = " has no endpoints";

/// The Service ports without endpoints among `rules` (those of [`FILTER_SERVICES_CHAIN`] in
/// the filter table): the `-j REJECT` rules with a host destination, protocol and port whose
/// comment says "has no endpoints".
pub fn no_endpoint_rejects(rules: &[Rule]) -> Vec<NoEndpointReject> {
    let service = |c: &str| c.strip_suffix(NO_ENDPOINTS).map(str::to_string);
    commented_destinations(rules, FILTER_SERVICES_CHAIN, "REJECT", service)
        .into_iter()
        .map(|(addr, proto, port, service)| NoEndpointReject {
            addr,
            proto,
            port,
            service,
        })
        .collect()
}

/// [`no_endpoint_rejects`] of `iptables -t filter -S KUBE-SERVICES` text (the legacy backend).
pub fn parse_no_endpoint_rejects(text: &str) -> Vec<NoEndpointReject> {
    let prefix = format!("-A {FILTER_SERVICES_CHAIN} ");
    let rules: Vec<Rule> = text
        .lines()
        .map(|l| strip_counters(l.trim()))
        .filter(|l| l.starts_with(&prefix))
        .filter_map(parse_rule)
        .collect();
    no_endpoint_rejects(&rules)
}

/// Whether a rule's text is kept when it is read: `MASQUERADE` rules and pod short circuits
/// are quoted or read again (the detector's match); the other rules' text would be most of
/// the held chains' memory for nothing.
pub(super) fn keeps_text(rule: &Rule) -> bool {
    rule.target.as_deref() == Some("MASQUERADE")
        || rule
            .comment
            .as_deref()
            .is_some_and(|c| c.starts_with(POD_SHORT_CIRCUIT))
}

/// The local-traffic detector's match of a pod short circuit's text: `-s <CIDR>` or
/// `-i <interface>` (not negated: `IfLocal()` writes them plain).
fn detector_of(text: &str) -> Option<String> {
    let tokens = tokenize(text);
    tokens.windows(2).enumerate().find_map(|(i, w)| {
        let negated = i > 0 && tokens[i - 1] == "!";
        match w[0].as_str() {
            "-s" | "--source" | "--src" if !negated => Some(format!("-s {}", w[1])),
            "-i" | "--in-interface" if !negated => Some(format!("-i {}", w[1])),
            _ => None,
        }
    })
}

/// One `-A` rule, reduced to the matches and targets kube-proxy uses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The rule as written (without `[pkts:bytes]` counters), kept for `MASQUERADE` rules
    /// only: they are quoted as evidence; the other rules' text would be most of the held
    /// chains' memory (66,000 rules at 10,000 Services) for nothing.
    pub text: String,
    pub chain: String,
    /// `-d` address/prefix, when not negated.
    pub dst: Option<String>,
    pub dst_negated: bool,
    pub proto: Option<String>,
    pub dport: Option<u16>,
    pub comment: Option<String>,
    /// `-j` or `-g` target.
    pub target: Option<String>,
    pub to_destination: Option<String>,
    /// `-m addrtype --src-type LOCAL`.
    pub src_type_local: bool,
}

impl Rule {
    /// This rule sends `vip:port/proto` somewhere (`-d VIP/32 -p PROTO --dport PORT`, not
    /// negated): how a `KUBE-SERVICES` rule for a Service port is recognised.
    pub fn is_for(&self, vip: IpAddr, port: u16, proto: Proto) -> bool {
        !self.dst_negated
            && self.dst.as_deref().and_then(parse_host) == Some(vip)
            && self.dport == Some(port)
            && parse_proto(self.proto.as_deref()) == Some(proto)
    }
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
    NatChains::parse(text).table()
}

/// The nat rules of a dump or listing, in its order (see [`parse_iptables_save`]).
fn nat_rules(text: &str) -> impl Iterator<Item = Rule> + '_ {
    // Rules outside a table header (`-S` output, grep excerpts) count as nat.
    let mut in_nat = true;
    text.lines().filter_map(move |raw| {
        let line = strip_counters(raw.trim());
        if let Some(table) = line.strip_prefix('*') {
            in_nat = table.trim() == "nat";
            return None;
        }
        if !in_nat || !line.starts_with("-A ") {
            return None;
        }
        parse_rule(line)
    })
}

/// A nat table's rules, chain by chain, so that one chain can be replaced by a re-read of that
/// chain alone (one netlink dump of that chain, or `iptables -t nat -S CHAIN` text) and the table
/// rebuilt without re-reading the rest.
///
/// Held as [`HeldRule`]s: 164,000 rules at 30,000 Services, where a [`Rule`] with its own
/// chain name, comment and target was ~29 MiB of `Vec<Rule>` and most of the rest of the
/// heap (BENCHMARKS 9g, 9k). Chain names are one `Arc<str>` each, shared by the map, the order
/// and the rules that jump to the chain.
#[derive(Debug, Default, Clone)]
pub struct NatChains {
    chains: HashMap<Arc<str>, Vec<HeldRule>>,
    /// Chains in the order first seen: masquerade rules keep the dump's order.
    pub(super) order: Vec<Arc<str>>,
    /// Targets that are no chain held (yet): `KUBE-MARK-MASQ`, `DNAT`, a chain whose rules
    /// come later. Dropped when a read is complete ([`NatChains::finish`]).
    names: HashSet<Arc<str>>,
}

/// A held nat rule: what the service table reads of it ([`build_table`], [`Chains`]), each
/// part only on the rules that read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRule {
    /// `-j` or `-g` target.
    pub target: Option<Arc<str>>,
    detail: Detail,
    /// `-d` as a host address, when not negated: a VIP.
    pub dst_host: Option<IpAddr>,
    pub dport: Option<u16>,
    pub proto: Option<Proto>,
    /// `-m addrtype --src-type LOCAL`.
    pub src_type_local: bool,
    comment: CommentKind,
}

/// The one string a held rule keeps, by its kind (a rule is at most one of these).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Detail {
    None,
    /// `--to-destination` of a `DNAT` rule: a backend.
    Destination(Box<str>),
    /// The rule's text ([`keeps_text`]): a masquerade rule's evidence, a pod short circuit's
    /// detector.
    Text(Box<str>),
    /// The Service its comment names, on `KUBE-SERVICES` and `KUBE-NODEPORTS` rules.
    Service(Box<str>),
}

/// What is read of a comment besides a Service's name: which of kube-proxy's rules it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommentKind {
    Other,
    PodShortCircuit,
    MasqueradeLocal,
    RouteLocal,
}

impl CommentKind {
    fn of(comment: Option<&str>) -> CommentKind {
        match comment {
            Some(c) if c.starts_with(POD_SHORT_CIRCUIT) => CommentKind::PodShortCircuit,
            Some(c) if c.starts_with(MASQUERADE_LOCAL) => CommentKind::MasqueradeLocal,
            Some(c) if c.starts_with(ROUTE_LOCAL) => CommentKind::RouteLocal,
            _ => CommentKind::Other,
        }
    }
}

/// The comments' heads of an external chain's rules for local traffic (externalTrafficPolicy
/// Local: `Chains::local_only`).
const MASQUERADE_LOCAL: &str = "masquerade LOCAL traffic";
const ROUTE_LOCAL: &str = "route LOCAL traffic";

impl HeldRule {
    /// The held part of `rule`, a rule of `chain`; `name` shares the target's string.
    fn of(mut rule: Rule, chain: &str, name: impl FnOnce(&str) -> Arc<str>) -> HeldRule {
        let dnat = rule.target.as_deref() == Some("DNAT");
        let detail = match rule.to_destination.take() {
            Some(to) if dnat => Detail::Destination(to.into_boxed_str()),
            _ if keeps_text(&rule) => Detail::Text(std::mem::take(&mut rule.text).into_boxed_str()),
            _ if chain == "KUBE-SERVICES" || chain == "KUBE-NODEPORTS" => {
                service_name(rule.comment.as_deref())
                    .map_or(Detail::None, |s| Detail::Service(s.into_boxed_str()))
            }
            _ => Detail::None,
        };
        HeldRule {
            target: rule.target.as_deref().map(name),
            detail,
            dst_host: rule
                .dst
                .as_deref()
                .filter(|_| !rule.dst_negated)
                .and_then(parse_host),
            dport: rule.dport,
            proto: parse_proto(rule.proto.as_deref()),
            src_type_local: rule.src_type_local,
            comment: CommentKind::of(rule.comment.as_deref()),
        }
    }

    /// `--to-destination` of a `DNAT` rule.
    pub fn destination(&self) -> Option<&str> {
        match &self.detail {
            Detail::Destination(d) => Some(d),
            _ => None,
        }
    }

    /// The rule's text, kept for masquerade rules and pod short circuits ("" for the others).
    pub fn text(&self) -> &str {
        match &self.detail {
            Detail::Text(t) => t,
            _ => "",
        }
    }

    /// The Service a `KUBE-SERVICES` or `KUBE-NODEPORTS` rule's comment names.
    pub fn service(&self) -> Option<&str> {
        match &self.detail {
            Detail::Service(s) => Some(s),
            _ => None,
        }
    }
}

impl NatChains {
    /// The nat rules of a dump or listing (see [`parse_iptables_save`]).
    pub fn parse(text: &str) -> NatChains {
        NatChains::from_rules(nat_rules(text))
    }

    /// The chains of `rules` (decoded from nf_tables expressions, or parsed), in their order:
    /// the text and the netlink readers build their table with the same [`NatChains::table`].
    pub fn from_rules(rules: impl IntoIterator<Item = Rule>) -> NatChains {
        let mut held = NatChains::default();
        for r in rules {
            held.push(r);
        }
        held.finish();
        held
    }

    /// Puts the chains in the order `iptables-save` prints them (the built-in chains in hook
    /// order, then the others by name; see `tests/data/iptables/lab-capture-v4.txt`), which
    /// is the order of the masquerade rules: a table read over netlink (the kernel lists
    /// chains in creation order) then equals the table of the same rules' `iptables-save`.
    pub fn sort_like_iptables_save(&mut self) {
        const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
        let rank = |c: &str| {
            BUILTIN
                .iter()
                .position(|x| *x == c)
                .unwrap_or(BUILTIN.len())
        };
        self.order
            .sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    }

    /// Whether any chain is kube-proxy's (`KUBE-*`): a second backend matters only then.
    pub fn has_kube_chains(&self) -> bool {
        self.order.iter().any(|c| c.starts_with("KUBE-"))
    }

    /// The one string of `name`: the held chain's, else one of [`NatChains::names`].
    fn name(
        chains: &HashMap<Arc<str>, Vec<HeldRule>>,
        names: &mut HashSet<Arc<str>>,
        name: &str,
    ) -> Arc<str> {
        if let Some((held, _)) = chains.get_key_value(name) {
            return held.clone();
        }
        if let Some(held) = names.get(name) {
            return held.clone();
        }
        let new: Arc<str> = Arc::from(name);
        names.insert(new.clone());
        new
    }

    pub(super) fn push(&mut self, mut rule: Rule) {
        let chain = std::mem::take(&mut rule.chain);
        if !self.chains.contains_key(chain.as_str()) {
            let name = NatChains::name(&self.chains, &mut self.names, &chain);
            self.names.remove(&*name);
            self.order.push(name.clone());
            self.chains.insert(name, Vec::new());
        }
        let held = HeldRule::of(rule, &chain, |t| {
            NatChains::name(&self.chains, &mut self.names, t)
        });
        if let Some(rules) = self.chains.get_mut(chain.as_str()) {
            rules.push(held);
        }
    }

    /// A read is complete: each chain's rules take the room they need, no more (a chain of
    /// 2-3 rules held room for 4), and the names' set is let go.
    pub fn finish(&mut self) {
        for rules in self.chains.values_mut() {
            rules.shrink_to_fit();
        }
        self.names = HashSet::new();
    }

    /// Replaces `chain` with the rules of `listing` (`iptables -t nat -S chain`: only that
    /// chain's `-A` lines are taken).
    pub fn replace(&mut self, chain: &str, listing: &str) {
        let rules: Vec<Rule> = nat_rules(listing).filter(|r| r.chain == chain).collect();
        self.replace_rules(chain, rules);
    }

    /// Replaces `chain` with `rules` (a re-read of that chain alone).
    pub fn replace_rules(&mut self, chain: &str, rules: Vec<Rule>) {
        let mut held: Vec<HeldRule> = Vec::with_capacity(rules.len());
        for r in rules {
            held.push(HeldRule::of(r, chain, |t| {
                NatChains::name(&self.chains, &mut self.names, t)
            }));
        }
        match self.chains.get_mut(chain) {
            Some(old) => *old = held,
            None => {
                let name = NatChains::name(&self.chains, &mut self.names, chain);
                self.order.push(name.clone());
                self.chains.insert(name, held);
            }
        }
        self.names = HashSet::new();
    }

    /// The chain is gone.
    pub fn remove(&mut self, chain: &str) {
        if self.chains.remove(chain).is_some() {
            self.order.retain(|c| &**c != chain);
        }
    }

    /// How many chains are held (with rules, or emptied by a re-read).
    pub fn len(&self) -> usize {
        self.chains.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    pub(super) fn rules(&self, chain: &str) -> &[HeldRule] {
        self.chains.get(chain).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The service table these rules make.
    pub fn table(&self) -> ServiceTable {
        build_table(self)
    }
}

/// Drops the `[pkts:bytes] ` prefix `iptables-save -c` writes.
pub(super) fn strip_counters(line: &str) -> &str {
    if line.starts_with('[')
        && let Some(end) = line.find(']')
    {
        return line[end + 1..].trim_start();
    }
    line
}

/// Splits a rule line like a shell would for iptables-save's quoting: double quotes group,
/// backslash escapes the next character inside quotes.
pub(super) fn tokenize(line: &str) -> Vec<String> {
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

pub(super) fn parse_rule(line: &str) -> Option<Rule> {
    let tokens = tokenize(line);
    let mut it = tokens.iter().peekable();
    if it.next().map(String::as_str) != Some("-A") {
        return None;
    }
    let mut rule = Rule {
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
    if keeps_text(&rule) {
        rule.text = line.to_string();
    }
    Some(rule)
}

pub(super) fn parse_proto(p: Option<&str>) -> Option<Proto> {
    match p? {
        "tcp" | "6" => Some(Proto::Tcp),
        "udp" | "17" => Some(Proto::Udp),
        "sctp" | "132" => Some(Proto::Other(132)),
        other => other.parse::<u8>().ok().map(Proto::from_raw),
    }
}

/// `10.96.0.10/32` -> 10.96.0.10; a non-host prefix is not a VIP.
pub(super) fn parse_host(addr: &str) -> Option<IpAddr> {
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

pub(super) struct Chains<'a> {
    pub(super) held: &'a NatChains,
}

impl<'a> Chains<'a> {
    fn rules(&self, chain: &str) -> &'a [HeldRule] {
        self.held.rules(chain)
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
            if let Some(dest) = r.destination()
                && r.target.as_deref() == Some("DNAT")
            {
                out.push(dest.to_string());
            }
            if let Some(t) = &r.target
                && (is_service_chain(t) || t.starts_with("KUBE-SEP-"))
            {
                self.collect(t, seen, out);
            }
        }
    }

    /// The external chain `target` is or leads to (an LB IP with source ranges goes through
    /// `KUBE-FW-*` first) and its pod short circuit's detector match, if it has one.
    fn pod_short_circuit(&self, target: &str) -> Option<(String, String)> {
        let external = if target.starts_with("KUBE-FW-") {
            self.rules(target)
                .iter()
                .filter_map(|r| r.target.as_deref())
                .find(|t| t.starts_with("KUBE-EXT-"))?
        } else {
            target
        };
        if !external.starts_with("KUBE-EXT-") {
            return None;
        }
        self.rules(external).iter().find_map(|r| {
            let pod = r.comment == CommentKind::PodShortCircuit;
            let to_cluster = r
                .target
                .as_deref()
                .is_some_and(|t| t.starts_with("KUBE-SVC-"));
            (pod && to_cluster)
                .then(|| detector_of(r.text()))
                .flatten()
                .map(|d| (external.to_string(), d))
        })
    }

    /// Whether a NodePort whose rule jumps to `target` has externalTrafficPolicy: Local.
    pub(super) fn local_only(&self, target: &str) -> bool {
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
                && r.comment != CommentKind::MasqueradeLocal
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
            matches!(
                r.comment,
                CommentKind::MasqueradeLocal | CommentKind::RouteLocal
            )
        });
        jumps_local || local_comments
    }
}

fn build_table(held: &NatChains) -> ServiceTable {
    let chains = Chains { held };
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
        if !is_service_chain(target) {
            continue;
        }
        let (Some(vip), Some(port), Some(proto)) = (r.dst_host, r.dport, r.proto) else {
            continue;
        };
        let entry = ServiceEntry {
            vip,
            port,
            proto,
            service: r.service().map(str::to_string),
            backends: chains.backends(target),
        };
        if let Some(detector) = chains.pod_short_circuit(target) {
            let short = PodShortCircuit {
                addr: vip,
                proto,
                port,
                chain: detector.0,
                detector: detector.1,
            };
            if !table.pod_short_circuits.contains(&short) {
                table.pod_short_circuits.push(short);
            }
        }
        merge_service(&mut table.services, &mut index, entry);
    }

    for r in chains.rules("KUBE-NODEPORTS") {
        let Some(target) = r.target.as_deref() else {
            continue;
        };
        if !is_service_chain(target) {
            continue;
        }
        let (Some(port), Some(proto)) = (r.dport, r.proto) else {
            continue;
        };
        let entry = NodePortEntry {
            port,
            proto,
            service: r.service().map(str::to_string),
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

    for r in held.order.iter().flat_map(|c| held.rules(c)) {
        if r.target.as_deref() == Some("MASQUERADE")
            && !table.masquerade_rules.iter().any(|m| m == r.text())
        {
            table.masquerade_rules.push(r.text().to_string());
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

impl NatChains {
    /// The chains held, in the order first seen.
    pub fn order(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|c| &**c)
    }

    /// Whether `chain` is held.
    pub fn holds(&self, chain: &str) -> bool {
        self.chains.contains_key(chain)
    }
}
