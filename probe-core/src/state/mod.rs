//! The plain data the node's state readers fill (probe-user's `state`: rtnetlink, ctnetlink,
//! kube-proxy's rules, IPVS) and the correlator reads: a service table, conntrack entries,
//! address prefixes, a pod's bridge port. No reader lives here: the types only, with their
//! pure look-ups, so the core builds and tests without a kernel.

pub mod addrs;
pub mod conntrack;
pub mod dataplane;
pub mod ipset;
pub mod iptables;

use std::net::IpAddr;

/// A reader of the node's state failed (a netlink error, a rule set that did not parse): the
/// correlator gets the reader's message as the answer to its question, and cites it in the
/// evidence. The readers' own errors are typed where they are raised (probe-user's `state`);
/// the core needs only what to say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{0}")]
pub struct ReadFailed(pub String);

impl From<String> for ReadFailed {
    fn from(s: String) -> Self {
        ReadFailed(s)
    }
}

impl From<&str> for ReadFailed {
    fn from(s: &str) -> Self {
        ReadFailed(s.to_owned())
    }
}

use probe_contract::Proto;
use serde::{Deserialize, Serialize};

/// Where a service table came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceSource {
    Ipvs,
    Iptables,
    /// kube-proxy's nftables mode (tables `ip kube-proxy` / `ip6 kube-proxy`).
    Nftables,
}

/// A VIP:port that something on the node serves (an IPVS virtual service, or a kube-proxy
/// `KUBE-SERVICES` rule for a ClusterIP / external / load-balancer IP).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEntry {
    pub vip: IpAddr,
    pub port: u16,
    pub proto: Proto,
    /// `namespace/name:port` when the rules say it (kube-proxy's rule comments), else None.
    pub service: Option<String>,
    /// Real servers (IPVS) or endpoints (KUBE-SEP DNAT targets), as `ip:port`.
    pub backends: Vec<String>,
}

impl ServiceEntry {
    /// `vip:port/proto`: how evidence and the dataplane read name a virtual service.
    pub fn endpoint(&self) -> String {
        format!(
            "{}/{}",
            probe_contract::sock(self.vip, self.port),
            self.proto.as_str()
        )
    }

    /// ` (namespace/name:port)` when the rules name the Service, else nothing.
    pub fn name_suffix(&self) -> String {
        self.service
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default()
    }
}

/// A NodePort, with whether `externalTrafficPolicy: Local` rules apply to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePortEntry {
    pub port: u16,
    pub proto: Proto,
    pub service: Option<String>,
    /// kube-proxy installed `externalTrafficPolicy: Local` handling for it (KUBE-XLB-* / KUBE-EXT
    /// chains without masquerade): traffic keeps its client source and goes only to local pods.
    pub local_only: bool,
}

/// The node's service table and masquerade configuration, from one reader.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceTable {
    /// The kube-proxy mode this table is for.
    pub source: Option<ServiceSource>,
    /// The services and NodePorts are what kube-proxy *should* program in that mode, from the
    /// API's Services and EndpointSlices (`kube::service_table`), not read from the rules; the
    /// masquerade rules and the access filter are still read from the dataplane.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_api: bool,
    pub services: Vec<ServiceEntry>,
    pub nodeports: Vec<NodePortEntry>,
    /// Masquerade rules found for traffic leaving the node (`-j MASQUERADE` / `KUBE-POSTROUTING`
    /// with a mark, CNI masquerade chains), as the rule text, for evidence.
    pub masquerade_rules: Vec<String>,
    /// kube-proxy's IPVS access filter (>= 1.25): the rules of chain `KUBE-IPVS-FILTER` in the
    /// filter table, as text; empty when the chain does not exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_filter: Vec<String>,
    /// kube-proxy's nftables mode: the elements of `no-endpoint-services` whose verdict is
    /// `drop` (see [`NoEndpointDrop`]); empty in other modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_endpoint_drops: Vec<NoEndpointDrop>,
    /// kube-proxy's iptables mode, read from the rules: the Service ports without any
    /// endpoint, which it REJECTs and writes no nat chain for (see [`NoEndpointReject`]);
    /// empty in other modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_endpoint_rejects: Vec<NoEndpointReject>,
    /// kube-proxy's iptables mode, read from the rules (not the API): the pod short circuits
    /// of externalTrafficPolicy Local Services' external chains (see [`PodShortCircuit`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_short_circuits: Vec<PodShortCircuit>,
    /// kube-proxy's `loadBalancerSourceRanges` firewall, one entry per firewalled LB IP:port
    /// with its allowed sources (see [`FirewallEntry`]): nftables' `firewall-ips` elements,
    /// iptables' `KUBE-PROXY-FIREWALL` drops, IPVS mode's `KUBE-LOAD-BALANCER-FW` members.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub firewall: Vec<FirewallEntry>,
    /// The healthCheckNodePorts of externalTrafficPolicy Local LoadBalancer Services (see
    /// [`HealthCheckPort`]): from the API only (kube-proxy writes no rule for them); empty
    /// without API access.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<HealthCheckPort>,
    /// [`ServiceTable::serves`]'s index (not data: never compared, never serialized).
    #[serde(skip)]
    pub serves_index: ServesIndex,
}

/// The `spec.healthCheckNodePort` of an externalTrafficPolicy Local LoadBalancer Service: the
/// port the cloud LB probes on every node to learn whether it has a local endpoint. kube-proxy
/// serves it itself, an HTTP server per port (kubernetes `pkg/proxy/healthcheck/
/// service_health.go`), and programs no rule for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheckPort {
    pub port: u16,
    /// `namespace/name`.
    pub service: String,
}

/// `serves` by (VIP, port, protocol), built on the first look-up of a large table: the
/// correlator asks for every anomaly, and a table from the API at 30,000 Services holds
/// 60,000 entries. Tables are handed out whole; one whose services changed in number since
/// the index was built is scanned instead (its index is stale).
#[derive(Clone, Debug, Default)]
pub struct ServesIndex(std::sync::OnceLock<(usize, ServesMap)>);

type ServesMap = std::collections::HashMap<(IpAddr, u16, Proto), usize>;

impl PartialEq for ServesIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ServesIndex {}

/// Below this many entries a scan is as fast as a hash look-up.
const SERVES_INDEXED_FROM: usize = 64;

/// An element `addr . proto . port : drop` of kube-proxy's nftables verdict map
/// `no-endpoint-services`: an external or LB IP of an externalTrafficPolicy Local Service
/// whose node has no local endpoint (`!hasExternalEndpoints` in kubernetes/kubernetes
/// `pkg/proxy/nftables/proxier.go`). kube-proxy's filter chains drop every new connection to
/// it that was not DNATed first: calls from the node before kubernetes#132456 (filter chains
/// before DNAT), and pod calls that its external chain does not short-circuit
/// (kubernetes#131765). A Service without any endpoint gets `goto reject-chain` instead: that is
/// no drop, and not listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoEndpointDrop {
    pub addr: IpAddr,
    pub proto: Proto,
    pub port: u16,
    /// The element's comment: kube-proxy writes `namespace/name:port`.
    pub service: Option<String>,
}

/// kube-proxy's iptables mode: a Service port without any endpoint. kube-proxy writes no nat
/// chain for it, only a filter rule `-A KUBE-SERVICES -m comment --comment "<ns>/<svc>:<port>
/// has no endpoints" -m <proto> -p <proto> -d <ClusterIP> --dport <port> -j REJECT`
/// (kubernetes/kubernetes `pkg/proxy/iptables/proxier.go`, `syncProxyRules`: "the service has
/// no endpoints at all ... only rules in the "filter" table rejecting incoming packets"): the
/// one place the rules still name the Service and its IP:port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoEndpointReject {
    pub addr: IpAddr,
    pub proto: Proto,
    pub port: u16,
    /// `namespace/name:port`, from the comment.
    pub service: String,
}

/// kube-proxy's iptables mode: the rule "pod traffic for <svc> external destinations" of an
/// externalTrafficPolicy Local Service's external chain (`KUBE-EXT-*`), which sends a pod's
/// call to an external or LB IP to the cluster-wide endpoints (`-j KUBE-SVC-*`) when
/// kube-proxy's local-traffic detector matches the pod (`proxier.localDetector.IfLocal()` in
/// kubernetes/kubernetes `pkg/proxy/iptables/proxier.go`, `syncProxyRules`). kube-proxy writes
/// none without a detector. A pod it does not match falls through to the local endpoints and,
/// without one on the node, to the `KUBE-EXTERNAL-SERVICES` drop ([`NoEndpointDrop`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodShortCircuit {
    pub addr: IpAddr,
    pub proto: Proto,
    pub port: u16,
    /// The external chain that holds the rule.
    pub chain: String,
    /// The detector's match as the rule has it (`IfLocal()` in kubernetes/kubernetes
    /// `pkg/proxy/util/localdetector.go`): `-s <CIDR>` (ClusterCIDR, NodeCIDR), `-i <prefix>+`
    /// (InterfaceNamePrefix), `-i <bridge>` (BridgeInterface).
    pub detector: String,
}

impl PodShortCircuit {
    /// Whether the detector matches a pod by source address (`-s <CIDR>`), and if so whether
    /// it matches `src`; None for an interface detector (the address does not decide).
    pub fn matches_source(&self, src: IpAddr) -> Option<bool> {
        let cidr = self.detector.strip_prefix("-s ")?.trim();
        let (net, bits) = cidr.split_once('/').unwrap_or((cidr, ""));
        let net: IpAddr = net.parse().ok()?;
        let width = if net.is_ipv4() { 32 } else { 128 };
        let bits: u32 = if bits.is_empty() {
            width
        } else {
            bits.parse().ok().filter(|b| *b <= width)?
        };
        let to_bits = |a: IpAddr| match a {
            IpAddr::V4(v) => u128::from(u32::from(v)) << 96,
            IpAddr::V6(v) => u128::from(v),
        };
        if net.is_ipv4() != src.is_ipv4() {
            return Some(false);
        }
        let mask = if bits == 0 {
            0
        } else {
            // Both families sit in the top bits (IPv4 shifted up): a prefix is the top `bits`.
            u128::MAX << (128 - bits)
        };
        Some(to_bits(net) & mask == to_bits(src) & mask)
    }
}

/// An element `addr . proto . port : goto firewall-<HASH>-<ns>/<name>/<proto>/<port>` of
/// kube-proxy's nftables verdict map `firewall-ips` (kubernetes PR #122614, 1.30): an LB IP of
/// a Service with `loadBalancerSourceRanges`. Its chain holds `ip saddr != { ranges } drop`,
/// and chain `firewall-check` (hooked in prerouting and output, before DNAT) sends every new
/// connection to the element's chain, so a pod's or the node's call from outside the ranges
/// dies on the node (kubernetes#109575). `ipMode: Proxy` and hostname LBs get no element.
///
/// iptables mode (PR #110289, 1.25) gives the same facts another shape: the filter chain
/// `KUBE-PROXY-FIREWALL`'s `-d <LB IP> --dport <port> -j DROP` rule ("<svc> traffic not
/// accepted by KUBE-FW-<HASH>"), and the `-s <range>` rules of that nat chain that send the
/// allowed sources on (DNATed, so the drop no longer matches them).
///
/// IPVS mode (PR #110628, 1.25) keeps them in ipsets: the LB IP,proto:port in
/// `KUBE-LOAD-BALANCER-FW`, its allowed sources in `KUBE-LOAD-BALANCER-SOURCE-CIDR` (and
/// `-SOURCE-IP`); the filter chain `KUBE-SOURCE-RANGES-FIREWALL` drops the rest. The sets name
/// no Service and no chain (`service` and `chain` stay empty).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirewallEntry {
    pub addr: IpAddr,
    pub proto: Proto,
    pub port: u16,
    /// `namespace/name:port`, from the element's comment or its chain's name.
    pub service: Option<String>,
    /// The chain that holds the ranges: nftables' `firewall-<HASH>-...`, iptables' nat
    /// `KUBE-FW-<HASH>` (named in the evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
    /// The chain's `saddr != { ... }` set: the sources that pass. Empty when the chain held no
    /// such rule (then nothing is dropped there).
    pub allowed: Vec<SourceRange>,
}

impl FirewallEntry {
    /// The chain drops `src`: it has a range rule and `src` is in none of its ranges.
    pub fn drops(&self, src: IpAddr) -> bool {
        !self.allowed.is_empty() && !self.allowed.iter().any(|r| r.contains(src))
    }

    /// The allowed ranges as kube-proxy wrote them, comma-separated.
    pub fn allowed_text(&self) -> String {
        let ranges: Vec<String> = self.allowed.iter().map(|r| r.to_string()).collect();
        ranges.join(", ")
    }
}

/// An inclusive address interval of an nftables interval set (a prefix, a range or one
/// address, as `nft` prints them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRange {
    pub first: IpAddr,
    pub last: IpAddr,
}

impl SourceRange {
    /// The interval of `a.b.c.d/n`, `x::/n` or one address; None when it does not parse.
    pub fn parse(s: &str) -> Option<SourceRange> {
        let p = addrs::Prefix::parse(s).ok()?;
        let (first, last) = match p.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - p.len as u32).unwrap_or(0);
                let first = u32::from(a) & mask;
                (
                    IpAddr::from(std::net::Ipv4Addr::from(first)),
                    IpAddr::from(std::net::Ipv4Addr::from(first | !mask)),
                )
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - p.len as u32).unwrap_or(0);
                let first = u128::from(a) & mask;
                (
                    IpAddr::from(std::net::Ipv6Addr::from(first)),
                    IpAddr::from(std::net::Ipv6Addr::from(first | !mask)),
                )
            }
        };
        Some(SourceRange { first, last })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.first.is_ipv4() && self.first <= ip && ip <= self.last
    }

    /// The prefix length when the interval is exactly one prefix.
    fn prefix_len(&self) -> Option<u32> {
        let (first, last, bits) = match (self.first, self.last) {
            (IpAddr::V4(f), IpAddr::V4(l)) => (u32::from(f) as u128, u32::from(l) as u128, 32),
            (IpAddr::V6(f), IpAddr::V6(l)) => (u128::from(f), u128::from(l), 128),
            _ => return None,
        };
        let span = last.checked_sub(first)?;
        let host_bits = 128 - span.leading_zeros();
        let aligned = span.checked_add(1).is_none_or(|n| n.is_power_of_two())
            && first.trailing_zeros() >= host_bits;
        (aligned && host_bits <= bits).then_some(bits - host_bits)
    }
}

impl std::fmt::Display for SourceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            return write!(f, "{}", self.first);
        }
        match self.prefix_len() {
            Some(len) => write!(f, "{}/{len}", self.first),
            None => write!(f, "{}-{}", self.first, self.last),
        }
    }
}

impl ServiceTable {
    /// The pod short circuit of the external chain kube-proxy's iptables mode sends
    /// `addr:port/proto` to, if the rules read have one.
    pub fn pod_short_circuit(
        &self,
        addr: IpAddr,
        port: u16,
        proto: Proto,
    ) -> Option<&PodShortCircuit> {
        self.pod_short_circuits
            .iter()
            .find(|s| s.addr == addr && s.port == port && s.proto == proto)
    }

    /// kube-proxy's `firewall-ips` entry for `addr:port/proto`, if any.
    pub fn firewall_entry(&self, addr: IpAddr, port: u16, proto: Proto) -> Option<&FirewallEntry> {
        self.firewall
            .iter()
            .find(|f| f.addr == addr && f.port == port && f.proto == proto)
    }

    /// The service serving `vip:port/proto`, if any.
    pub fn serves(&self, vip: IpAddr, port: u16, proto: Proto) -> Option<&ServiceEntry> {
        let scan = || {
            self.services
                .iter()
                .find(|s| s.vip == vip && s.port == port && s.proto == proto)
        };
        if self.services.len() < SERVES_INDEXED_FROM {
            return scan();
        }
        let (len, index) = self.serves_index.0.get_or_init(|| {
            let mut index = std::collections::HashMap::with_capacity(self.services.len());
            for (i, s) in self.services.iter().enumerate() {
                // The first entry wins, as the scan's.
                index.entry((s.vip, s.port, s.proto)).or_insert(i);
            }
            (self.services.len(), index)
        });
        if *len != self.services.len() {
            return scan();
        }
        index
            .get(&(vip, port, proto))
            .and_then(|i| self.services.get(*i))
            .filter(|s| s.vip == vip && s.port == port && s.proto == proto)
    }

    /// kube-proxy's `no-endpoint-services` drop element for `addr:port/proto`, if any.
    pub fn no_endpoint_drop(
        &self,
        addr: IpAddr,
        port: u16,
        proto: Proto,
    ) -> Option<&NoEndpointDrop> {
        self.no_endpoint_drops
            .iter()
            .find(|d| d.addr == addr && d.port == port && d.proto == proto)
    }

    /// kube-proxy's REJECT of `addr:port/proto` as a Service port without endpoints, if any.
    pub fn no_endpoint_reject(
        &self,
        addr: IpAddr,
        port: u16,
        proto: Proto,
    ) -> Option<&NoEndpointReject> {
        self.no_endpoint_rejects
            .iter()
            .find(|r| r.addr == addr && r.port == port && r.proto == proto)
    }

    pub fn nodeport(&self, port: u16, proto: Proto) -> Option<&NodePortEntry> {
        self.nodeports
            .iter()
            .find(|n| n.port == port && n.proto == proto)
    }
}

/// One direction of a conntrack tuple.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub proto: Proto,
}

impl Tuple {
    /// The other direction: how the answer to this packet travels.
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

/// A conntrack entry, reduced to what proves or disproves a loopback.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackEntry {
    pub orig: Tuple,
    pub reply: Tuple,
    /// IPS_SRC_NAT: the connection's source was rewritten (SNAT / masquerade).
    pub snat: bool,
    /// IPS_DST_NAT: the destination was rewritten (DNAT: NodePort, ClusterIP).
    pub dnat: bool,
    /// IPS_SEEN_REPLY: a packet came back in the reply direction.
    pub seen_reply: bool,
    /// IPS_ASSURED: TCP: the handshake completed (conntrack sets it on the way to
    /// ESTABLISHED), so a later `CLOSE` is a reset of an established connection.
    #[serde(default)]
    pub assured: bool,
    /// TCP state name as conntrack reports it (`SYN_SENT`, `ESTABLISHED`, `CLOSE`, ...).
    pub tcp_state: Option<String>,
    /// Seconds left before the entry expires (CTA_TIMEOUT); each packet resets it to its
    /// state's timeout, so the two tell how long ago the latest packet passed
    /// ([`crate::state::conntrack::StateTimeouts::idle_s`]).
    #[serde(default)]
    pub timeout_s: Option<u32>,
}

/// A pod's port on a Linux bridge (kubenet's `cbr0`, the bridge CNI's `cni0`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgePort {
    pub bridge: String,
    pub port: String,
    /// `/sys/class/net/<bridge>/brif/<port>/hairpin_mode`: the bridge may send a frame back
    /// out the port it came in on (the kubelet's `--hairpin-mode=hairpin-veth` sets it).
    pub hairpin_mode: bool,
}

/// The node's pieces a pod's call to its own Service needs, read when such a call looped
/// (`service_self_loop`): each is `None` when it does not apply or could not be read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelfLoopFacts {
    /// kube-proxy IPVS mode's hairpin set `KUBE-LOOP-BACK` holds `pod,proto:port,pod` (its
    /// POSTROUTING rule masquerades those); `None`: no such set (not IPVS mode) or unreadable.
    #[serde(default)]
    pub loop_back_entry: Option<bool>,
    /// The pod's bridge port; `None` when the pod is not behind a bridge (a routed veth) or
    /// its port could not be found.
    #[serde(default)]
    pub bridge_port: Option<BridgePort>,
    /// `net.bridge.bridge-nf-call-iptables` (`-ip6tables` for IPv6): bridged traffic passes
    /// iptables/nftables (br_netfilter); `None` when br_netfilter is not loaded here.
    #[serde(default)]
    pub br_netfilter: Option<bool>,
}

/// kube-proxy's default `--service-node-port-range`.
pub const NODEPORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

#[cfg(test)]
mod firewall_tests {
    use super::*;

    #[test]
    fn source_ranges_parse_print_and_contain() {
        let r = SourceRange::parse("198.19.0.0/16").unwrap();
        assert_eq!(r.to_string(), "198.19.0.0/16");
        assert!(r.contains("198.19.1.10".parse().unwrap()));
        assert!(!r.contains("198.20.0.1".parse().unwrap()));
        assert!(!r.contains("::1".parse().unwrap()));
        assert_eq!(
            SourceRange::parse("10.0.0.7").unwrap().to_string(),
            "10.0.0.7"
        );
        assert_eq!(
            SourceRange::parse("0.0.0.0/0").unwrap().to_string(),
            "0.0.0.0/0"
        );
        assert_eq!(
            SourceRange::parse("2001:db8::/32").unwrap().to_string(),
            "2001:db8::/32"
        );
        let odd = SourceRange {
            first: "10.0.0.1".parse().unwrap(),
            last: "10.0.0.4".parse().unwrap(),
        };
        assert_eq!(odd.to_string(), "10.0.0.1-10.0.0.4");
        let entry = FirewallEntry {
            addr: "203.0.113.10".parse().unwrap(),
            proto: Proto::Tcp,
            port: 80,
            service: None,
            chain: None,
            allowed: vec![SourceRange::parse("192.0.2.0/24").unwrap(), odd],
        };
        assert!(entry.drops("198.19.1.10".parse().unwrap()));
        assert!(!entry.drops("10.0.0.3".parse().unwrap()));
        assert_eq!(entry.allowed_text(), "192.0.2.0/24, 10.0.0.1-10.0.0.4");
        assert!(
            !FirewallEntry {
                allowed: vec![],
                ..entry
            }
            .drops("198.19.1.10".parse().unwrap())
        );
    }
}

#[cfg(test)]
mod serves_tests {
    use super::*;

    fn entry(i: u32, service: &str) -> ServiceEntry {
        ServiceEntry {
            vip: IpAddr::from([10, 0, (i >> 8) as u8, i as u8]),
            port: 80,
            proto: Proto::Tcp,
            service: Some(service.into()),
            backends: Vec::new(),
        }
    }

    /// A large table answers from its index as a scan would (the first entry of a key wins),
    /// and one edited in number after the index was built is scanned, not misread.
    #[test]
    fn serves_is_indexed_and_never_stale() {
        let mut table = ServiceTable {
            services: (0..1000).map(|i| entry(i, "a")).collect(),
            ..ServiceTable::default()
        };
        table.services.push(entry(7, "duplicate"));
        let vip7 = IpAddr::from([10, 0, 0, 7]);
        assert_eq!(
            table
                .serves(vip7, 80, Proto::Tcp)
                .and_then(|s| s.service.as_deref()),
            Some("a")
        );
        assert!(table.serves(vip7, 81, Proto::Tcp).is_none());
        assert!(table.serves(vip7, 80, Proto::Udp).is_none());
        // Edited after the index was built: the new entry is found, the removed one is not.
        table.services.retain(|s| s.vip != vip7);
        table.services.push(entry(5000, "late"));
        assert!(table.serves(vip7, 80, Proto::Tcp).is_none());
        let late = IpAddr::from([10, 0, (5000u32 >> 8) as u8, 5000u32 as u8]);
        assert_eq!(
            table
                .serves(late, 80, Proto::Tcp)
                .and_then(|s| s.service.as_deref()),
            Some("late")
        );
    }
}
