//! The service table from the API (pure, no I/O): what kube-proxy *should* program on this
//! node, as one function of the Services, the EndpointSlices and the node's proxy mode.
//!
//! - [`PrunedService`] and [`PrunedSlice`] hold only what kube-proxy reads to program a node
//!   (built by [`PrunedService::from_api`] / [`PrunedSlice::from_api`]; None for an object
//!   kube-proxy ignores);
//! - [`ApiServiceTable`] is the store, the agent's only one of the API's Services and
//!   EndpointSlices: per Service a [`StoredService`] (the address index's `ServiceFacts`, whose
//!   ready endpoints it keeps from the held slices, [`ApiServiceTable::facts`]; kube-proxy's
//!   pruned form is derived from them per recomputation), per slice one [`PrunedSlice`] both read
//!   ([`PrunedSlice::held_from_api`]). Applied per watch event
//!   ([`ApiServiceTable::apply_stored`], [`ApiServiceTable::apply_slice`]): each event
//!   recomputes the entries of the one Service it touches, never the whole table; a relist
//!   replaces the content once ([`ApiServiceTable::replace_services`], `replace_slices`);
//! - the look-ups the dataplane readers' [`ServiceTable`] offers ([`ApiServiceTable::serves`],
//!   [`ApiServiceTable::nodeport`], [`ApiServiceTable::no_endpoint_drop`]) answer from indexes
//!   kept with the entries; [`ApiServiceTable::expected`] copies the whole table out (tests,
//!   comparisons), in the shape the readers write.
//!
//! What cannot come from the API (masquerade rules, IPVS mode's access filter) stays empty:
//! the dataplane says it.
//!
//! kube-proxy's rules reproduced, each cited where it is implemented (kubernetes/kubernetes,
//! `pkg/proxy/...`): which Services and slices are read at all, the endpoints of a Service port
//! (ready ones, else serving-and-terminating ones: `topology.go` `CategorizeEndpoints`), the
//! Cluster / Local policy split, and per mode which frontends get rules (`iptables/proxier.go`,
//! `nftables/proxier.go`, `ipvs/proxier.go` `syncProxyRules`). Not reproduced: topology-aware
//! routing hints and trafficDistribution (they narrow the Cluster endpoints by zone),
//! `--nodeport-addresses` (IPVS NodePorts are taken on every node IP given), and
//! `--cluster-cidr`-less nodes (no pod short-circuit).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use probe_contract::Proto;
use probe_core::service::{LbIngress, ServiceFacts, ServicePort, bounded, facts, is_api_name};

use crate::state::{
    HealthCheckPort, NoEndpointDrop, NodePortEntry, ServiceEntry, ServiceSource, ServiceTable,
};

/// kube-proxy watches only Services (and EndpointSlices) without this label: another proxy
/// serves them (kubernetes/kubernetes `cmd/kube-proxy/app/server.go`, the informers' label
/// selector `noProxyName`; `pkg/proxy/apis/well_known_labels.go` `LabelServiceProxyName`).
pub const SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// EndpointSlices of headless Services carry it; kube-proxy's informer skips them (same
/// selector, `noHeadlessEndpoints`, `v1.IsHeadlessService`).
pub const HEADLESS: &str = "service.kubernetes.io/headless";
/// An EndpointSlice's Service (`discovery.k8s.io/v1` `LabelServiceName`).
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// The labels of Services and EndpointSlices that the table reads (the watcher keeps only
/// these and the index's).
pub const READ_LABELS: [&str; 3] = [SERVICE_PROXY_NAME, HEADLESS, SERVICE_NAME];

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// The port's name (`""` when unnamed: a one-port Service).
    pub name: Box<str>,
    pub proto: Proto,
    pub port: u16,
    /// 0: none.
    pub node_port: u16,
}

/// A Service, reduced to what kube-proxy programs from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrunedService {
    /// At most one per family (the API allows no more).
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<PortSpec>,
    pub external_ips: Vec<IpAddr>,
    /// LB ingress IPs kube-proxy programs: ipMode VIP or unset. An `ipMode: Proxy` IP is left
    /// out (kube-proxy >= 1.30, `pkg/proxy/serviceport.go` `newBaseServiceInfo`:
    /// `proxyutil.IsVIPMode(ing)`): calls to it go to the LB itself.
    pub lb_ips: Vec<IpAddr>,
    /// externalTrafficPolicy Local, which counts only on a NodePort or LoadBalancer Service
    /// (`pkg/apis/core/v1/helper` / `pkg/api/v1/service/util.go` `ExternalPolicyLocal`).
    pub external_policy_local: bool,
    /// internalTrafficPolicy Local (`InternalPolicyLocal`).
    pub internal_policy_local: bool,
    /// The LB's health check port (kube-proxy answers it; it programs no table entry).
    pub health_check_node_port: u16,
}

fn proto_of(protocol: Option<&str>) -> Option<Proto> {
    // The API defaults the protocol to TCP.
    match protocol.unwrap_or("TCP") {
        "TCP" => Some(Proto::Tcp),
        "UDP" => Some(Proto::Udp),
        "SCTP" => Some(Proto::Other(132)),
        _ => None,
    }
}

fn has_label(labels: Option<&BTreeMap<String, String>>, key: &str) -> bool {
    labels.is_some_and(|l| l.contains_key(key))
}

impl PrunedService {
    /// The Service as kube-proxy reads it; None when kube-proxy programs nothing for it: the
    /// `service-proxy-name` label (another proxy's), ExternalName, headless (`clusterIP:
    /// None`) or without a ClusterIP (`pkg/proxy/util/utils.go` `ShouldSkipService`).
    pub fn from_api(service: &Service) -> Option<PrunedService> {
        if has_label(service.metadata.labels.as_ref(), SERVICE_PROXY_NAME) {
            return None;
        }
        let spec = service.spec.as_ref()?;
        let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
        if kind == "ExternalName" {
            return None;
        }
        let primary = spec.cluster_ip.as_deref().unwrap_or("");
        if primary.is_empty() || primary == "None" {
            return None;
        }
        let parse = |list: Option<&Vec<String>>| -> Vec<IpAddr> {
            list.into_iter()
                .flatten()
                // kube-proxy trims (its tests' `" 203.0.113.0/25"`); the API validates.
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        };
        let mut cluster_ips = parse(spec.cluster_ips.as_ref());
        if let Ok(ip) = primary.parse()
            && !cluster_ips.contains(&ip)
        {
            cluster_ips.insert(0, ip);
        }
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(PortSpec {
                    name: p.name.as_deref().unwrap_or("").into(),
                    proto: proto_of(p.protocol.as_deref())?,
                    port: u16::try_from(p.port).ok()?,
                    node_port: p.node_port.and_then(|n| u16::try_from(n).ok()).unwrap_or(0),
                })
            })
            .collect();
        let lb_ips = probe_core::service::lb_ingress(service)
            .filter(|i| i.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
            .filter_map(|i| i.ip.as_deref()?.parse().ok())
            .collect();
        Some(PrunedService {
            cluster_ips: tight(cluster_ips),
            ports: tight(ports),
            external_ips: tight(parse(spec.external_ips.as_ref())),
            lb_ips: tight(lb_ips),
            external_policy_local: matches!(kind, "NodePort" | "LoadBalancer")
                && spec.external_traffic_policy.as_deref() == Some("Local"),
            internal_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            health_check_node_port: spec
                .health_check_node_port
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(0),
        })
    }
}

/// One endpoint of a slice (kube-proxy reads its first address only:
/// `pkg/proxy/endpointslicecache.go` `addEndpoints`, `endpoint.Addresses[0]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrunedEndpoint {
    pub addr: IpAddr,
    /// `conditions.ready`, unset = true (same file: `Ready == nil || *Ready`).
    pub ready: bool,
    /// `conditions.serving`, unset = true.
    pub serving: bool,
    /// `conditions.terminating`, unset = false.
    pub terminating: bool,
    /// Shared with the other endpoints on that node in the table.
    pub node: Option<Arc<str>>,
    /// A second or later address of its endpoint: kube-proxy reads only the first, the
    /// index names every ready one ([`PrunedSlice::held_from_api`]).
    pub alias: bool,
}

/// A port of a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: Box<str>,
    pub proto: Proto,
    pub port: u16,
}

/// An EndpointSlice, reduced to what kube-proxy reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrunedSlice {
    /// Its Service, `namespace/name` (label `kubernetes.io/service-name`); in the store, the
    /// Service's own key, shared.
    pub service: Arc<str>,
    /// addressType IPv6 (else IPv4; FQDN slices are not read).
    pub ipv6: bool,
    /// Boxed slices, not Vecs: held per slice for its life, and never grown in place.
    pub endpoints: Box<[PrunedEndpoint]>,
    pub ports: Box<[SlicePort]>,
    /// kube-proxy reads it (what [`PrunedSlice::from_api`] keeps); a slice it ignores is held
    /// only for the index's ready addresses ([`PrunedSlice::held_from_api`]).
    pub proxied: bool,
}

impl PrunedSlice {
    /// The slice as kube-proxy reads it; None when it reads nothing of it: no Service label,
    /// the `service-proxy-name` or `headless` label (its informer's selector), or an FQDN
    /// address type (kube-proxy programs one IP family per proxier:
    /// `endpointslicecache.go`, `addressType` checked by `EndpointSliceCache.updatePending`'s
    /// callers in `pkg/proxy/endpointschangetracker.go`).
    pub fn from_api(slice: &EndpointSlice) -> Option<PrunedSlice> {
        let labels = slice.metadata.labels.as_ref();
        if has_label(labels, SERVICE_PROXY_NAME) || has_label(labels, HEADLESS) {
            return None;
        }
        let namespace = slice.metadata.namespace.as_deref()?;
        let service = labels?.get(SERVICE_NAME)?;
        let ipv6 = match slice.address_type.as_str() {
            "IPv4" => false,
            "IPv6" => true,
            _ => return None,
        };
        let endpoints: Box<[PrunedEndpoint]> = slice
            .endpoints
            .iter()
            .filter_map(|e| {
                let addr: IpAddr = e.addresses.first()?.parse().ok()?;
                let c = e.conditions.as_ref();
                Some(PrunedEndpoint {
                    addr,
                    ready: c.and_then(|c| c.ready).unwrap_or(true),
                    serving: c.and_then(|c| c.serving).unwrap_or(true),
                    terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                    node: e.node_name.as_deref().map(Into::into),
                    alias: false,
                })
            })
            .collect();
        let ports: Box<[SlicePort]> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(SlicePort {
                    name: p.name.as_deref().unwrap_or("").into(),
                    proto: proto_of(p.protocol.as_deref())?,
                    port: u16::try_from(p.port?).ok()?,
                })
            })
            .collect();
        Some(PrunedSlice {
            service: format!("{namespace}/{service}").into(),
            ipv6,
            endpoints,
            ports,
            proxied: true,
        })
    }

    /// The slice as the store holds it for kube-proxy and the index at once: what
    /// [`Self::from_api`] reads, and for the index every address of an endpoint (the later
    /// ones as aliases kube-proxy skips) and the slices kube-proxy ignores (a headless
    /// Service's, another proxy's, FQDN: `proxied` false). None without a namespace or
    /// Service label (neither reads it).
    pub fn held_from_api(slice: &EndpointSlice) -> Option<PrunedSlice> {
        let namespace = slice.metadata.namespace.as_deref()?;
        let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME)?;
        let Some(mut held) = Self::from_api(slice) else {
            return Some(PrunedSlice {
                service: format!("{namespace}/{service}").into(),
                ipv6: slice.address_type == "IPv6",
                endpoints: addresses(slice, false).into_boxed_slice(),
                ports: Box::default(),
                proxied: false,
            });
        };
        if slice.endpoints.iter().any(|e| e.addresses.len() > 1) {
            held.endpoints = addresses(slice, true).into_boxed_slice();
        }
        Some(held)
    }
}

/// Every parsed address of `slice`'s endpoints, the first of each as kube-proxy reads it and
/// the later ones as aliases (the index's reading: `index::Index::build`). Without `node`,
/// no node names (a slice kube-proxy ignores: the index reads only the ready addresses).
fn addresses(slice: &EndpointSlice, node: bool) -> Vec<PrunedEndpoint> {
    let mut out = Vec::new();
    for e in &slice.endpoints {
        let c = e.conditions.as_ref();
        for (i, a) in e.addresses.iter().enumerate() {
            let Ok(addr) = a.parse() else { continue };
            out.push(PrunedEndpoint {
                addr,
                ready: c.and_then(|c| c.ready).unwrap_or(true),
                serving: c.and_then(|c| c.serving).unwrap_or(true),
                terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                node: e.node_name.as_deref().filter(|_| node).map(Into::into),
                alias: i > 0,
            });
        }
    }
    out
}

/// One Service as the store holds it, once: its facts (the index's, `ServiceFacts` behind an
/// `Arc` an index shares by pointer), from which kube-proxy's [`PrunedService`] is derived when
/// the Service is recomputed ([`StoredService::proxy_view`]), with the two things kube-proxy
/// reads that the facts do not say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredService {
    /// Its `endpoints` are the held slices' ready addresses, kept by the store.
    pub facts: Arc<ServiceFacts>,
    /// The index names it: its namespace and name are API names (`is_api_name`).
    pub indexed: bool,
    /// kube-proxy programs it ([`PrunedService::from_api`] is Some): decided on the object,
    /// which holds the label and the `clusterIP` the facts do not keep.
    pub proxied: bool,
    /// internalTrafficPolicy Local (not in the facts).
    pub internal_policy_local: bool,
}

impl StoredService {
    /// What the store holds of `service`; None when neither kube-proxy nor the index reads it
    /// (or it has no namespace or name).
    pub fn from_api(service: &Service) -> Option<StoredService> {
        let proxy = PrunedService::from_api(service);
        let facts = facts(service, &mut HashMap::new())?;
        let indexed = is_api_name(&facts.namespace) && is_api_name(&facts.name);
        (indexed || proxy.is_some()).then(|| StoredService {
            facts: Arc::new(bounded(facts)),
            indexed,
            internal_policy_local: proxy.as_ref().is_some_and(|p| p.internal_policy_local),
            proxied: proxy.is_some(),
        })
    }

    /// kube-proxy's pruned form alone, as the store holds it (tests, `probe check`: no index
    /// reads it). [`Self::proxy_view`] gives `proxy` back.
    pub fn from_proxy(key: &str, proxy: PrunedService) -> StoredService {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let protocol = |proto: Proto| match proto {
            Proto::Udp => "UDP",
            Proto::Other(132) => "SCTP",
            _ => "TCP",
        };
        let service_type = if proxy.external_policy_local {
            "LoadBalancer"
        } else {
            "ClusterIP"
        };
        let facts = ServiceFacts {
            ports: proxy
                .ports
                .iter()
                .map(|p| ServicePort {
                    name: (!p.name.is_empty()).then(|| p.name.to_string()),
                    protocol: protocol(p.proto).into(),
                    port: p.port,
                    node_port: (p.node_port != 0).then_some(p.node_port),
                })
                .collect(),
            ingress: proxy
                .lb_ips
                .iter()
                .map(|&ip| LbIngress {
                    ip: Some(ip),
                    hostname: None,
                    ip_mode: None,
                })
                .collect(),
            cluster_ips: proxy.cluster_ips.into(),
            external_ips: proxy.external_ips.into(),
            external_traffic_policy: proxy.external_policy_local.then(|| "Local".into()),
            health_check_node_port: (proxy.health_check_node_port != 0)
                .then_some(proxy.health_check_node_port),
            // What kube-proxy's rules do not say (uid, endpoints, annotations, ...).
            ..ServiceFacts::named(namespace, name, service_type)
        };
        StoredService {
            facts: Arc::new(facts),
            indexed: false,
            proxied: true,
            internal_policy_local: proxy.internal_policy_local,
        }
    }

    /// What kube-proxy reads of the Service (what [`PrunedService::from_api`] made of the
    /// object, for a Service a real API server accepted: its `clusterIPs` lead with
    /// `clusterIP`, its addresses carry no spaces), with the index in the facts' ports of
    /// each of its ports; None when kube-proxy ignores it.
    fn proxy_view(&self) -> Option<(PrunedService, Vec<usize>)> {
        if !self.proxied {
            return None;
        }
        let f = &self.facts;
        let (at, ports): (Vec<usize>, Vec<PortSpec>) = f
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let spec = PortSpec {
                    name: p.name.as_deref().unwrap_or("").into(),
                    proto: proto_of(Some(p.protocol.as_str()))?,
                    port: p.port,
                    node_port: p.node_port.unwrap_or(0),
                };
                Some((i, spec))
            })
            .unzip();
        let view = PrunedService {
            cluster_ips: f.cluster_ips.to_vec(),
            ports,
            external_ips: f.external_ips.to_vec(),
            lb_ips: f
                .ingress
                .iter()
                .filter(|i| i.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
                .filter_map(|i| i.ip)
                .collect(),
            external_policy_local: matches!(f.service_type.as_str(), "NodePort" | "LoadBalancer")
                && f.is_etp_local(),
            internal_policy_local: self.internal_policy_local,
            health_check_node_port: f.health_check_node_port.unwrap_or(0),
        };
        Some((view, at))
    }
}

/// The node the table is computed for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// kube-proxy's mode on this node (`state::proxy_mode`, or the dataplane's table's source).
    pub mode: ServiceSource,
    /// This node's name: endpoints whose `nodeName` is it are local.
    pub node_name: Option<String>,
    /// The node's addresses: IPVS mode makes a NodePort a virtual service on each.
    pub node_ips: Vec<IpAddr>,
}

/// A frontend kube-proxy programs for one Service port: a ClusterIP (internal) or an external
/// IP, LB IP or (IPVS) node IP with the NodePort (external).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frontend {
    vip: IpAddr,
    port: u16,
    external: bool,
}

/// What kube-proxy programs for one port of a Service in one IP family, held compact (the
/// readers' entry shapes, with their strings, are made on a look-up).
#[derive(Clone, Debug, PartialEq, Eq)]
struct PortPlan {
    /// Index of the port in the Service's `ports` (its name).
    index: usize,
    proto: Proto,
    port: u16,
    frontends: Vec<Frontend>,
    internal: Box<[SocketAddr]>,
    /// None: the same as `internal`.
    external: Option<Box<[SocketAddr]>>,
    /// `Some((NodePort, local_only))` when a NodePort entry is programmed.
    node_port: Option<(u16, bool)>,
    /// nftables' `no-endpoint-services` drops, iptables' `KUBE-EXTERNAL-SERVICES` ones
    /// (external and LB IPs).
    drops: Box<[IpAddr]>,
}

/// The store: pruned Services and EndpointSlices, held once for the address index (the
/// Services' facts, `index::Index::from_facts`) and for kube-proxy's view, and per Service
/// what kube-proxy programs from them on this node, with the look-up indexes. Keys
/// (`namespace/name`) are shared between the maps.
#[derive(Clone, Debug)]
pub struct ApiServiceTable {
    node: NodeView,
    /// False: the store only (the index's facts), nothing programmed (`--service-table-from
    /// rules`: the dataplane's table is read whole instead).
    plans: bool,
    services: HashMap<Arc<str>, StoredService>,
    /// By slice key (`namespace/name` of the slice). Boxed: a map's buckets hold their
    /// values inline and run up to twice the slices' count, so an inline `PrunedSlice`
    /// (72 bytes) made the buckets 5.8 M at 30,000 slices (heaptrack, decisions.md "One
    /// store"); a pointer is 8.
    slices: HashMap<Arc<str>, Box<PrunedSlice>>,
    /// Service key -> its slices' keys, in name order (kube-proxy merges them in that order);
    /// a sorted boxed slice: a Service has a few slices, and a B-tree's node is ~200 bytes
    /// (boxed: 8 bytes less in each of the map's buckets, which run up to twice its count).
    slices_of: HashMap<Arc<str>, Box<[Arc<str>]>>,
    programmed: HashMap<Arc<str>, Box<[PortPlan]>>,
    frontends: HashMap<(IpAddr, u16, Proto), Arc<str>>,
    nodeports: HashMap<(u16, Proto), Arc<str>>,
    drops: HashMap<(IpAddr, u16, Proto), Arc<str>>,
    /// Node names, held once (every endpoint names one).
    nodes: HashSet<Arc<str>>,
    /// Services recomputed since the table was made (each event costs one or two).
    recomputed: u64,
}

impl ApiServiceTable {
    pub fn new(node: NodeView) -> ApiServiceTable {
        ApiServiceTable {
            node,
            plans: true,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            programmed: HashMap::new(),
            frontends: HashMap::new(),
            nodeports: HashMap::new(),
            drops: HashMap::new(),
            nodes: HashSet::new(),
            recomputed: 0,
        }
    }

    /// The store without kube-proxy's view: holds the Services and slices for the index's
    /// facts, computes no entries.
    pub fn store_only(node: NodeView) -> ApiServiceTable {
        ApiServiceTable {
            plans: false,
            ..ApiServiceTable::new(node)
        }
    }

    pub fn node(&self) -> &NodeView {
        &self.node
    }

    /// How many times a Service's entries were computed (an event: one or two; a relist or
    /// [`Self::set_node`]: one per Service).
    pub fn recomputed(&self) -> u64 {
        self.recomputed
    }

    /// Another mode, node name or node IPs: every Service is recomputed (rare: kube-proxy's
    /// mode changes with a restart, the node's IPs with its interfaces).
    pub fn set_node(&mut self, node: NodeView) {
        if node != self.node {
            self.node = node;
            self.recompute_all();
        }
    }

    /// The Services held that kube-proxy programs.
    pub fn service_count(&self) -> usize {
        self.services.values().filter(|s| s.proxied).count()
    }

    /// The shared key for `key` (the Service's, when it is held).
    fn key(&self, key: &str) -> Arc<str> {
        match self.services.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => match self.slices_of.get_key_value(key) {
                Some((k, _)) => k.clone(),
                None => key.into(),
            },
        }
    }

    /// A watch event on Service `key` (`namespace/name`): its new pruned form, or None when it
    /// was deleted (or kube-proxy ignores it). Recomputes that Service only.
    pub fn apply_service(&mut self, key: &str, service: Option<PrunedService>) {
        let held = service.map(|proxy| StoredService::from_proxy(key, proxy));
        self.apply_stored(key, held);
    }

    /// A watch event on Service `key`: what the store holds of it now ([`StoredService`]), or
    /// None when it was deleted (or nothing reads it). Recomputes that Service only.
    pub fn apply_stored(&mut self, key: &str, service: Option<StoredService>) {
        let key = self.key(key);
        match service {
            Some(s) => {
                self.services.insert(key.clone(), s);
                self.refresh_facts(&key);
            }
            None => {
                self.services.remove(&key);
            }
        }
        self.recompute(&key);
    }

    /// A watch event on EndpointSlice `key` (`namespace/name` of the slice). Recomputes the
    /// Service it belonged to and the one it belongs to (the same but for a relabel).
    pub fn apply_slice(&mut self, key: &str, slice: Option<PrunedSlice>) {
        let old = self.slices.remove_entry(key);
        if let Some((slice_key, old)) = &old
            && let Some(keys) = self.slices_of.get_mut(&*old.service)
        {
            let kept: Box<[Arc<str>]> = keys.iter().filter(|k| *k != slice_key).cloned().collect();
            if kept.is_empty() {
                self.slices_of.remove(&*old.service);
            } else {
                *keys = kept;
            }
        }
        let old_service = old.as_ref().map(|(_, s)| self.key(&s.service));
        let new_service = slice.map(|s| self.insert_slice(key, s));
        if let Some(old) = &old_service {
            self.refresh_facts(old);
            self.recompute(old);
        }
        if let Some(new) = new_service
            && old_service.as_ref() != Some(&new)
        {
            self.refresh_facts(&new);
            self.recompute(&new);
        }
    }

    /// Holds `slice` under `key` (its node names interned); its Service's key.
    fn insert_slice(&mut self, key: &str, mut slice: PrunedSlice) -> Arc<str> {
        for e in &mut slice.endpoints {
            if let Some(n) = &mut e.node {
                match self.nodes.get(&**n) {
                    Some(held) => *n = held.clone(),
                    None => {
                        self.nodes.insert(n.clone());
                    }
                }
            }
        }
        let service = self.key(&slice.service);
        slice.service = service.clone();
        let slice_key: Arc<str> = key.into();
        let keys = self.slices_of.entry(service.clone()).or_default();
        if let Err(at) = keys.binary_search(&slice_key) {
            let mut grown = std::mem::take(keys).into_vec();
            grown.insert(at, slice_key.clone());
            *keys = grown.into_boxed_slice();
        }
        self.slices.insert(slice_key, Box::new(slice));
        service
    }

    /// A relist's content, replacing everything (once per relist, not per object).
    pub fn replace(
        &mut self,
        services: impl IntoIterator<Item = (String, PrunedService)>,
        slices: impl IntoIterator<Item = (String, PrunedSlice)>,
    ) {
        self.slices.clear();
        self.slices_of.clear();
        for (key, s) in slices {
            self.insert_slice(&key, s);
        }
        self.replace_services(services.into_iter().map(|(k, proxy)| {
            let held = StoredService::from_proxy(&k, proxy);
            (k, held)
        }));
    }

    /// A Services relist's content, replacing the Services (the slices stay).
    pub fn replace_services(
        &mut self,
        services: impl IntoIterator<Item = (String, StoredService)>,
    ) {
        // The slices' keys of a Service are shared with it.
        self.services = services
            .into_iter()
            .map(|(k, s)| (self.key(&k), s))
            .collect();
        self.refresh_all_facts();
        self.recompute_all();
    }

    /// An EndpointSlices relist's content, replacing the slices (the Services stay).
    pub fn replace_slices(&mut self, slices: impl IntoIterator<Item = (String, PrunedSlice)>) {
        self.slices.clear();
        self.slices_of.clear();
        for (key, s) in slices {
            self.insert_slice(&key, s);
        }
        self.refresh_all_facts();
        self.recompute_all();
    }

    fn recompute_all(&mut self) {
        self.programmed.clear();
        self.frontends.clear();
        self.nodeports.clear();
        self.drops.clear();
        let keys: Vec<Arc<str>> = self.services.keys().cloned().collect();
        for key in keys {
            self.recompute(&key);
        }
    }

    fn recompute(&mut self, key: &Arc<str>) {
        self.recomputed += 1;
        if let Some(old) = self.programmed.remove(key) {
            for p in &old {
                for f in &p.frontends {
                    let k = (f.vip, f.port, p.proto);
                    if self.frontends.get(&k) == Some(key) {
                        self.frontends.remove(&k);
                    }
                }
                if let Some((node_port, _)) = p.node_port {
                    let k = (node_port, p.proto);
                    if self.nodeports.get(&k) == Some(key) {
                        self.nodeports.remove(&k);
                    }
                }
                for &ip in &p.drops {
                    let k = (ip, p.port, p.proto);
                    if self.drops.get(&k) == Some(key) {
                        self.drops.remove(&k);
                    }
                }
            }
        }
        if !self.plans {
            return;
        }
        let Some((service, at)) = self.services.get(key).and_then(StoredService::proxy_view) else {
            return;
        };
        let slices = self
            .slices_of
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k).map(|s| &**s));
        let mut plans = program(&service, slices, &self.node);
        // Named by the facts' ports, which the table keeps.
        for p in &mut plans {
            p.index = at[p.index];
        }
        for p in &plans {
            for f in &p.frontends {
                self.frontends.insert((f.vip, f.port, p.proto), key.clone());
            }
            if let Some((node_port, _)) = p.node_port {
                self.nodeports.insert((node_port, p.proto), key.clone());
            }
            for &ip in &p.drops {
                self.drops.insert((ip, p.port, p.proto), key.clone());
            }
        }
        if !plans.is_empty() {
            self.programmed
                .insert(key.clone(), plans.into_boxed_slice());
        }
    }

    /// `ns/name:port`, `ns/name` for an unnamed port (`pkg/proxy/types.go`
    /// `ServicePortName.String`), as kube-proxy's rule comments say it; `p`'s port of
    /// `service`.
    fn port_name(key: &str, service: &ServiceFacts, p: &PortPlan) -> String {
        match service.ports[p.index].name.as_deref() {
            None | Some("") => key.to_string(),
            Some(name) => format!("{key}:{name}"),
        }
    }

    fn entry(key: &str, service: &ServiceFacts, p: &PortPlan, f: &Frontend) -> ServiceEntry {
        let backends = match (&p.external, f.external) {
            (Some(external), true) => external,
            _ => &p.internal,
        };
        ServiceEntry {
            vip: f.vip,
            port: f.port,
            proto: p.proto,
            service: Some(Self::port_name(key, service, p)),
            backends: backends.iter().map(SocketAddr::to_string).collect(),
        }
    }

    /// The entry kube-proxy programs for `vip:port/proto`, if any.
    pub fn serves(&self, vip: IpAddr, port: u16, proto: Proto) -> Option<ServiceEntry> {
        let (key, service) = self.owner(self.frontends.get(&(vip, port, proto))?)?;
        self.programmed[key].iter().find_map(|p| {
            let f = p
                .frontends
                .iter()
                .find(|f| f.vip == vip && f.port == port && p.proto == proto)?;
            Some(Self::entry(key, service, p, f))
        })
    }

    /// The NodePort kube-proxy programs for `port/proto`, if any.
    pub fn nodeport(&self, port: u16, proto: Proto) -> Option<NodePortEntry> {
        let (key, service) = self.owner(self.nodeports.get(&(port, proto))?)?;
        self.programmed[key].iter().find_map(|p| {
            let (_, local_only) = p
                .node_port
                .filter(|(n, _)| *n == port && p.proto == proto)?;
            Some(NodePortEntry {
                port,
                proto,
                service: Some(Self::port_name(key, service, p)),
                local_only,
            })
        })
    }

    /// The no-endpoint drop kube-proxy programs for `addr:port/proto` (nftables mode's
    /// `no-endpoint-services` element, iptables mode's `KUBE-EXTERNAL-SERVICES` rule), if any.
    pub fn no_endpoint_drop(
        &self,
        addr: IpAddr,
        port: u16,
        proto: Proto,
    ) -> Option<NoEndpointDrop> {
        let (key, service) = self.owner(self.drops.get(&(addr, port, proto))?)?;
        self.programmed[key].iter().find_map(|p| {
            (p.port == port && p.proto == proto && p.drops.contains(&addr)).then(|| {
                NoEndpointDrop {
                    addr,
                    proto,
                    port,
                    service: Some(Self::port_name(key, service, p)),
                }
            })
        })
    }

    /// Every healthCheckNodePort, in Service key order: kube-proxy serves one for each
    /// externalTrafficPolicy Local Service whether or not it has endpoints (it answers 503
    /// without a local one), so the programmed ports do not limit them.
    fn health_checks(&self) -> Vec<HealthCheckPort> {
        let mut out: Vec<HealthCheckPort> = self
            .services
            .iter()
            .filter(|(_, s)| s.proxied)
            .filter_map(|(key, s)| {
                let f = &s.facts;
                let local = matches!(f.service_type.as_str(), "NodePort" | "LoadBalancer")
                    && f.is_etp_local();
                let port = f.health_check_node_port.filter(|p| local && *p != 0)?;
                Some(HealthCheckPort {
                    port,
                    service: key.to_string(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.service.cmp(&b.service));
        out
    }

    fn owner(&self, key: &Arc<str>) -> Option<(&Arc<str>, &ServiceFacts)> {
        let (key, service) = self.services.get_key_value(key)?;
        (service.proxied && self.programmed.contains_key(key)).then_some((key, &*service.facts))
    }

    /// The whole table, as the dataplane readers write it (Services in key order); the
    /// masquerade rules and the access filter are the dataplane's, left empty.
    pub fn expected(&self) -> ServiceTable {
        let mut keys: Vec<&Arc<str>> = self.programmed.keys().collect();
        keys.sort();
        let mut table = ServiceTable {
            source: Some(self.node.mode),
            ..ServiceTable::default()
        };
        // Sized once: grown by doubling, the entries' Vec held up to twice its room, and the
        // correlator holds the table until the next (BENCHMARKS.md 9f).
        table.services.reserve_exact(self.frontends.len());
        for key in keys {
            let Some((key, service)) = self.owner(key) else {
                continue;
            };
            let mut nodeports = HashSet::new();
            for p in &self.programmed[key] {
                for f in &p.frontends {
                    table.services.push(Self::entry(key, service, p, f));
                }
                // A dual-stack Service's NodePort is one entry (the readers merge the
                // families).
                if let Some((node_port, local_only)) = p.node_port
                    && nodeports.insert((node_port, p.proto))
                {
                    table.nodeports.push(NodePortEntry {
                        port: node_port,
                        proto: p.proto,
                        service: Some(Self::port_name(key, service, p)),
                        local_only,
                    });
                }
                for &addr in &p.drops {
                    table.no_endpoint_drops.push(NoEndpointDrop {
                        addr,
                        proto: p.proto,
                        port: p.port,
                        service: Some(Self::port_name(key, service, p)),
                    });
                }
            }
        }
        table.health_checks = self.health_checks();
        table.services.shrink_to_fit();
        table.nodeports.shrink_to_fit();
        table.no_endpoint_drops.shrink_to_fit();
        table
    }
}

/// An endpoint of one Service port, as kube-proxy's endpoint cache holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    addr: SocketAddr,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
}

/// The endpoints of port `name`/`proto` of the family of `ipv6`, over the Service's slices in
/// name order; an `ip:port` is taken once, from the first slice naming it (kube-proxy keys its
/// endpoints by `ip:port` in `endpointslicecache.go` `endpointInfoByServicePort`; slices of
/// one Service rarely overlap, outside a rollover).
fn endpoints_of<'a>(
    slices: impl Iterator<Item = &'a PrunedSlice>,
    ipv6: bool,
    name: &str,
    proto: Proto,
    node: Option<&str>,
) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = Vec::new();
    for slice in slices.filter(|s| s.proxied && s.ipv6 == ipv6) {
        let Some(port) = slice
            .ports
            .iter()
            .find(|p| &*p.name == name && p.proto == proto)
        else {
            continue;
        };
        for e in slice.endpoints.iter().filter(|e| !e.alias) {
            let addr = SocketAddr::new(e.addr, port.port);
            if out.iter().any(|o| o.addr == addr) {
                continue;
            }
            out.push(Endpoint {
                addr,
                ready: e.ready,
                serving: e.serving,
                terminating: e.terminating,
                local: node.is_some_and(|n| e.node.as_deref() == Some(n)),
            });
        }
    }
    out
}

/// The endpoints kube-proxy uses for one Service port: kubernetes/kubernetes
/// `pkg/proxy/topology.go` `CategorizeEndpoints` (without topology hints).
#[derive(Debug, Default)]
struct Categorized {
    /// "Cluster" policy: every ready endpoint, or when none is ready anywhere, every
    /// serving-and-terminating one (ProxyTerminatingEndpoints, GA in 1.28).
    cluster: Vec<SocketAddr>,
    /// "Local" policy: the ready local endpoints, else the serving-and-terminating local ones.
    local: Vec<SocketAddr>,
    /// Any usable endpoint anywhere (`hasAnyEndpoints`).
    any: bool,
}

fn categorize(endpoints: &[Endpoint], uses_cluster: bool, uses_local: bool) -> Categorized {
    let pick = |f: &dyn Fn(&Endpoint) -> bool| -> Vec<SocketAddr> {
        endpoints.iter().filter(|e| f(e)).map(|e| e.addr).collect()
    };
    let mut c = Categorized::default();
    if uses_cluster {
        c.cluster = pick(&|e| e.ready);
        if c.cluster.is_empty() {
            c.cluster = pick(&|e| e.serving && e.terminating);
        }
        c.any = !c.cluster.is_empty();
    }
    if !uses_local {
        return c;
    }
    c.any |= endpoints
        .iter()
        .any(|e| e.ready || (e.serving && e.terminating));
    c.local = pick(&|e| e.local && e.ready);
    if c.local.is_empty() {
        c.local = pick(&|e| e.local && e.serving && e.terminating);
    }
    c
}

/// One backend set, as the readers write it: sorted by its `ip:port` text, once each.
fn backends(lists: &[&[SocketAddr]]) -> Box<[SocketAddr]> {
    let mut out: Vec<SocketAddr> = lists.iter().flat_map(|l| l.iter().copied()).collect();
    out.sort_by_cached_key(SocketAddr::to_string);
    out.dedup();
    out.into_boxed_slice()
}

/// What kube-proxy in `node.mode` programs on `node` for one Service. Per IP family of its
/// ClusterIPs (kube-proxy runs one proxier per family, each reading the Service's IPs and the
/// slices of its family), per port.
fn program<'a>(
    svc: &PrunedService,
    slices: impl Iterator<Item = &'a PrunedSlice> + Clone,
    node: &NodeView,
) -> Vec<PortPlan> {
    let mut out = Vec::new();
    for &cluster_ip in &svc.cluster_ips {
        let ipv6 = cluster_ip.is_ipv6();
        let same_family = |ip: &&IpAddr| ip.is_ipv6() == ipv6;
        let external: Vec<IpAddr> = svc
            .external_ips
            .iter()
            .chain(&svc.lb_ips)
            .filter(same_family)
            .copied()
            .collect();
        for (index, port) in svc.ports.iter().enumerate() {
            let eps = endpoints_of(
                slices.clone(),
                ipv6,
                &port.name,
                port.proto,
                node.node_name.as_deref(),
            );
            // `pkg/proxy/serviceport.go`: ExternallyAccessible, UsesClusterEndpoints,
            // UsesLocalEndpoints.
            let externally_accessible = port.node_port != 0 || !external.is_empty();
            let etp_local = svc.external_policy_local;
            let itp_local = svc.internal_policy_local;
            let uses_cluster = !itp_local || (externally_accessible && !etp_local);
            let uses_local = itp_local || (externally_accessible && etp_local);
            let c = categorize(&eps, uses_cluster, uses_local);
            let mut plan = PortPlan {
                index,
                proto: port.proto,
                port: port.port,
                frontends: Vec::new(),
                internal: Box::new([]),
                external: None,
                node_port: None,
                drops: Box::new([]),
            };
            let view = PortView {
                cluster_ip,
                port,
                external: &external,
                etp_local,
                itp_local,
                uses_cluster,
            };
            match node.mode {
                ServiceSource::Iptables | ServiceSource::Nftables => {
                    rules_plan(&mut plan, &view, &c)
                }
                ServiceSource::Ipvs => ipvs_plan(&mut plan, &view, &c, node),
            }
            if !plan.frontends.is_empty() || plan.node_port.is_some() || !plan.drops.is_empty() {
                plan.frontends.shrink_to_fit();
                out.push(plan);
            }
        }
    }
    tight(out)
}

/// One Service port's frontends and policies, as kube-proxy's proxier of its family sees
/// them.
struct PortView<'a> {
    cluster_ip: IpAddr,
    port: &'a PortSpec,
    /// External IPs and LB IPs of the ClusterIP's family.
    external: &'a [IpAddr],
    etp_local: bool,
    itp_local: bool,
    uses_cluster: bool,
}

fn frontend(vip: IpAddr, port: u16, external: bool) -> Frontend {
    Frontend {
        vip,
        port,
        external,
    }
}

/// What kube-proxy in iptables or nftables mode programs for one port.
fn rules_plan(plan: &mut PortPlan, v: &PortView, c: &Categorized) {
    // iptables/proxier.go and nftables/proxier.go `syncProxyRules`, same in
    // both: `hasEndpoints` (any usable endpoint), `hasInternalEndpoints`
    // (ITP Local: a local one), `hasExternalEndpoints` (ETP Local: a local
    // one). A Service port without endpoints gets a REJECT (filter table /
    // `no-endpoint-services : goto reject-chain`), no service entry.
    let has_internal = if v.itp_local {
        !c.local.is_empty()
    } else {
        c.any
    };
    let has_external = if v.etp_local {
        !c.local.is_empty()
    } else {
        c.any
    };
    let cluster_chain: &[SocketAddr] = if v.uses_cluster { &c.cluster } else { &[] };
    if has_internal {
        plan.internal = backends(&[if v.itp_local { &c.local } else { &c.cluster }]);
        plan.frontends
            .push(frontend(v.cluster_ip, v.port.port, false));
    }
    // External IPs and LB IPs jump to the EXT / external- chain when the
    // Service has any endpoint (`usesExternalTrafficChain`). With ETP Local
    // that chain sends pod and node-local traffic to the Cluster chain
    // ("short-circuit") and the rest to the local endpoints: the readers
    // follow both, so the backends are both.
    let ext = if v.etp_local {
        let local: &[SocketAddr] = if has_external { &c.local } else { &[] };
        backends(&[cluster_chain, local])
    } else {
        backends(&[cluster_chain])
    };
    if c.any {
        for &ip in v.external {
            plan.frontends.push(frontend(ip, v.port.port, true));
        }
        if v.port.node_port != 0 {
            plan.node_port = Some((v.port.node_port, v.etp_local));
        }
    }
    // nftables: `no-endpoint-services` gets `drop` for an external / LB IP
    // whose Service has endpoints but none for external traffic
    // (`externalTrafficFilterVerdict`), `goto reject-chain` when it has none
    // at all (not a drop, not listed: see `state::NoEndpointDrop`); iptables:
    // `KUBE-EXTERNAL-SERVICES` gets `-j DROP` ("has no local endpoints") and
    // `-j REJECT` the same way (`externalTrafficFilterTarget`).
    if c.any && !has_external {
        plan.drops = v.external.to_vec().into_boxed_slice();
    }
    if ext != plan.internal {
        plan.external = Some(ext);
    }
}

/// What kube-proxy in IPVS mode programs for one port.
fn ipvs_plan(plan: &mut PortPlan, v: &PortView, c: &Categorized, node: &NodeView) {
    // ipvs/proxier.go `syncProxyRules`: a virtual server for every ClusterIP,
    // external IP, LB IP and (node IP, NodePort), endpoints or not; its real
    // servers from `syncEndpoint(svcPortName, onlyNodeLocalEndpoints, vs)`:
    // when the frontend's policy is Local (ITP for the ClusterIP, ETP for the
    // rest) the Local endpoints, or the Cluster ones when there is no local
    // one ("Allow access from local PODs even if no local endpoints exist",
    // kubernetes/kubernetes#97081); else the Cluster ones.
    let real = |local_policy: bool| {
        if local_policy && !c.local.is_empty() {
            backends(&[&c.local])
        } else {
            backends(&[&c.cluster])
        }
    };
    plan.internal = real(v.itp_local);
    plan.frontends
        .push(frontend(v.cluster_ip, v.port.port, false));
    for &ip in v.external {
        plan.frontends.push(frontend(ip, v.port.port, true));
    }
    if v.port.node_port != 0 {
        for &ip in node
            .node_ips
            .iter()
            .filter(|ip| ip.is_ipv6() == v.cluster_ip.is_ipv6())
        {
            plan.frontends.push(frontend(ip, v.port.node_port, true));
        }
        plan.node_port = Some((v.port.node_port, v.etp_local));
    }
    let ext = real(v.etp_local);
    if ext != plan.internal {
        plan.external = Some(ext);
    }
}

/// `v` without spare capacity. A Vec collected from a filtering iterator, or pushed to once,
/// holds room for 4: kept per Service, at 30,000 Services that slack was ~20 MiB of the
/// agent's heap (heaptrack, BENCHMARKS.md 9f).
pub fn tight<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

#[path = "service_table_facts.rs"]
mod held_facts;

#[cfg(test)]
#[path = "service_table_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "one_store_tests.rs"]
mod one_store_tests;
