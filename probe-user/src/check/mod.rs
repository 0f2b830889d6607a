//! `probe check`: the risk before the failure. Reads this node (its network namespace) once,
//! judges what it read with pure rules, and prints one line per finding.
//!
//! - [`gather`] reads the node through the same state readers the agent uses (addresses,
//!   the service table, kube-proxy's ipsets, sysctls, the kernel's BTF and kallsyms);
//! - [`rules`] turns those [`Inputs`] into [`Finding`]s (pure: no I/O, unit-tested);
//! - [`render`] prints them as an aligned table or as JSON;
//! - [`dataplane`] names what serves the node's Services (kube-proxy's mode, or none);
//! - [`readiness`] predicts `--as nftables`: the rules run on the node as read and as
//!   kube-proxy's nftables mode would leave it, and the difference.
//!
//! Exit codes: 0 no finding of severity `risk`; 1 at least one `risk` (the report is printed);
//! 1 also when the node cannot be read, with one `probe: error: ...` line on stderr and nothing
//! on stdout (a script tells the two apart by the empty stdout / the `error:` prefix); 2 usage.
//!
//! JSON (`--json`): the types and their schema are the contract's, `probe_contract::check`.

use std::net::IpAddr;

use probe_contract::{
    Proto,
    check::{CheckReport, Finding},
};

use crate::state::ServiceTable;

pub mod dataplane;
pub mod gather;
pub mod kube;
#[cfg(test)]
mod mode_leftover_tests;
#[cfg(test)]
mod proxy_protocol_tests;
pub mod readiness;
#[cfg(test)]
mod readiness_tests;
pub mod render;
pub mod rules;
pub mod services;
#[cfg(test)]
mod test_nodes;
#[cfg(test)]
mod tests;

/// A NIC's source-validation sysctls, as the kernel applies them (all/ and the NIC's own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicSysctls {
    pub name: String,
    /// Effective `rp_filter`: max(all, nic); 0 off, 1 strict, 2 loose.
    pub rp_filter: u8,
    /// Effective `accept_local`: all OR nic.
    pub accept_local: bool,
    /// Effective `route_localnet`: all OR nic.
    pub route_localnet: bool,
    /// Effective `log_martians`: all OR nic.
    pub log_martians: bool,
}

/// An LB ingress IP (and port, when known) as the node's or the API's state names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbTarget {
    pub ip: IpAddr,
    /// None: the IP is known, its ports are not.
    pub port: Option<u16>,
    pub proto: Proto,
    /// `namespace/name` when known.
    pub service: Option<String>,
    /// externalTrafficPolicy Local (kube-proxy's `-LOCAL` sets, or the Service spec);
    /// None: unknown.
    pub etp_local: Option<bool>,
    /// `status.loadBalancer.ingress[].ipMode: Proxy`: kube-proxy neither binds nor
    /// short-circuits the IP; in-cluster calls really go to the LB.
    pub ip_mode_proxy: bool,
    /// The Service's `healthCheckNodePort` (ETP Local), when known.
    pub health_check_node_port: Option<u16>,
    /// A provider annotation that keeps the LB from looping back (names of the annotations).
    pub prevent_loopback: Vec<String>,
    /// kube-proxy marks pod traffic to it for masquerade (IPVS mode: in `KUBE-LOAD-BALANCER`
    /// and not in `KUBE-LOAD-BALANCER-LOCAL`).
    pub kube_proxy_masquerades: bool,
    /// The annotation (`key: value`) that has the LB send a PROXY protocol header to the
    /// backends (`probe_core::service::PROXY_PROTOCOL_ANNOTATIONS`); None: none read.
    pub proxy_protocol: Option<String>,
    /// The Service's `loadBalancerSourceRanges`, as written (empty: none, or not known).
    pub source_ranges: Vec<String>,
    /// Where it came from: `ipset KUBE-LOAD-BALANCER`, `service default/web`, ...
    pub source: String,
}

impl LbTarget {
    /// A finding's subject for it: `IP:port/proto` (`[IPv6]:port/proto`), or the IP alone
    /// when its ports are not known.
    pub fn subject(&self) -> String {
        match self.port {
            Some(p) => format!(
                "{}/{}",
                std::net::SocketAddr::new(self.ip, p),
                self.proto.as_str()
            ),
            None => self.ip.to_string(),
        }
    }
}

/// What the kernel lets the probe see.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelView {
    pub release: String,
    /// Kernel >= 6.6: tcx links; else clsact qdiscs.
    pub tcx: bool,
    /// Why `/sys/kernel/btf/vmlinux` could not be used; None when it was.
    pub btf_error: Option<String>,
    /// The `kfree_skb` tracepoint passes a drop reason (>= 5.17).
    pub drop_reason_arg: bool,
    /// Number of `enum skb_drop_reason` names.
    pub drop_reasons: usize,
    /// `kernel.kptr_restrict`, when readable.
    pub kptr_restrict: Option<u8>,
    /// /proc/kallsyms shows addresses to us.
    pub kallsyms_readable: bool,
}

/// Everything the rules judge, read once from the node (and, with API access, the Services).
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// `--vip-iface`.
    pub vip_iface: String,
    /// Addresses bound on the VIP interface, and addresses made local by a `local` route of
    /// table local with no interface address (a cloud guest agent's LB IPs).
    pub bound: Vec<IpAddr>,
    /// Who made each of `bound` local (absent: the VIP interface).
    pub owners: std::collections::BTreeMap<IpAddr, probe_contract::facts::AddressOwner>,
    /// Addresses kube-proxy names as ClusterIPs (ipset `KUBE-CLUSTER-IP`, the API).
    pub cluster_ips: Vec<IpAddr>,
    /// LB ingress IPs known from kube-proxy's sets or the API.
    pub lb_targets: Vec<LbTarget>,
    /// Pod prefixes of this node (pod routes, `--pod-cidr`).
    pub pod_prefixes: Vec<crate::state::addrs::Prefix>,
    pub services: ServiceTable,
    pub nics: Vec<NicSysctls>,
    pub kernel: KernelView,
    /// Whether Services were read from the API (the Service side of the rules).
    pub api: ApiState,
    /// What kube-proxy should program on this node, from the API's Services and
    /// EndpointSlices (`kube::service_table`): a second source beside the dataplane's table,
    /// compared with it by the `kube_api` rule. None: not read (no API access, or the
    /// EndpointSlices could not be listed: `api_table_error`).
    pub api_table: Option<crate::kube::service_table::ApiServiceTable>,
    /// Why the API's table could not be made, when the Services were read but not the slices.
    pub api_table_error: Option<String>,
    /// What lets a pod reach itself through its Service.
    pub self_loop: SelfLoopNode,
    /// What serves the node's Services ([`dataplane::detect`]); None: not read.
    pub dataplane: Option<probe_contract::check::Dataplane>,
    /// The state of kube-proxy's modes other than the one the service table came from.
    pub leftovers: ModeState,
    /// The node's listening TCP sockets (sock_diag), for the LB's probe ports
    /// (`lb_probe_refused`); None: not read.
    pub tcp_listeners: Option<Vec<crate::state::sockets::DiagSocket>>,
}

/// What another kube-proxy mode left, beside the service table's own source (`mode_leftover`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModeState {
    /// The `--vip-iface` interface exists (kube-ipvs0: only IPVS mode makes it).
    pub vip_iface_present: bool,
    /// IPVS virtual services, when the service table came from elsewhere.
    pub ipvs_services: usize,
    /// Services in kube-proxy's nftables table, when the service table came from elsewhere.
    pub nft_services: usize,
    /// What kube-proxy itself says it runs (`GET /proxyMode` on its metrics port); None:
    /// not answered (another bind address, or no kube-proxy).
    pub proxy_mode: Option<String>,
}

impl Inputs {
    /// Whether kube-proxy's rules are on this node (None: the dataplane was not read); the
    /// fixes that change kube-proxy's rules for an LB IP are gated on it.
    pub fn kube_proxy_runs(&self) -> Option<bool> {
        self.dataplane
            .as_ref()
            .map(|d| d.mode != probe_contract::check::Mode::None)
    }
}

/// The node's pieces of a pod's call to its own Service (`service_self_loop`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelfLoopNode {
    /// Members of kube-proxy's `KUBE-LOOP-BACK` (and `KUBE-6-LOOP-BACK`) ipset; `None`: no
    /// such set.
    pub loop_back: Option<Vec<String>>,
    /// Every port of every bridge that has ports.
    pub bridge_ports: Vec<crate::state::BridgePort>,
    /// `net.bridge.bridge-nf-call-iptables`; `None`: br_netfilter not loaded.
    pub br_netfilter: Option<bool>,
}

/// What became of the API side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ApiState {
    /// No API access configured: the node alone.
    #[default]
    NotUsed,
    /// Services listed: (Services, LB ingress IPs among them).
    Read { services: usize, lb_ips: usize },
    /// Configured but failed: why.
    Failed(String),
}

/// Reads the node (an error: it cannot be read) and, with API access, the Services (a
/// failure there is a warning in the report), and judges them.
pub fn run(
    cfg: &crate::state::addrs::AddrConfig,
    api: &kube::ApiAccess,
) -> anyhow::Result<CheckReport> {
    let (inputs, listed) = read(cfg, api)?;
    let mut findings = rules::judge(&inputs);
    attach_fixes(&mut findings, &listed, inputs.kube_proxy_runs());
    Ok(CheckReport::new(findings).with_dataplane(inputs.dataplane))
}

/// The node (and, with API access, the Services merged into it, and as listed).
fn read(
    cfg: &crate::state::addrs::AddrConfig,
    api: &kube::ApiAccess,
) -> anyhow::Result<(Inputs, Vec<probe_core::service::ServiceFacts>)> {
    let mut inputs = gather::gather(cfg)?;
    let mut listed = Vec::new();
    if *api != kube::ApiAccess::None {
        match kube::list(api) {
            Ok((list, slices)) => {
                let facts: Vec<_> = list
                    .iter()
                    .filter_map(probe_core::service::ServiceFacts::from_service)
                    .collect();
                services::merge(&mut inputs, &facts);
                match slices {
                    Ok(slices) => inputs.api_table = services::api_table(&inputs, &list, &slices),
                    Err(e) => inputs.api_table_error = Some(format!("{e:#}")),
                }
                listed = facts;
            }
            Err(e) => inputs.api = ApiState::Failed(format!("{e:#}")),
        }
    }
    Ok((inputs, listed))
}

/// Why `--as` cannot run: a usage error (exit 2) or the node could not be read (exit 1).
#[derive(Debug)]
pub enum AsError {
    Usage(readiness::AsUsage),
    Node(anyhow::Error),
}

/// `probe check --as MODE`: reads the node as [`run`] does and predicts the move
/// ([`readiness`]); `--as` is checked against the node's mode once it is read.
pub fn run_as(
    cfg: &crate::state::addrs::AddrConfig,
    api: &kube::ApiAccess,
    target: probe_contract::check::Mode,
) -> Result<probe_contract::readiness::Prediction, AsError> {
    // A mode --as never predicts fails before the node is read.
    readiness::validate(target, None).map_err(AsError::Usage)?;
    let (inputs, listed) = read(cfg, api).map_err(AsError::Node)?;
    let current = inputs.dataplane.as_ref().map(|d| d.mode);
    let to = readiness::validate(target, current).map_err(AsError::Usage)?;
    Ok(readiness::predict(&inputs, &listed, None, to))
}

/// The fixes of each loopback risk for every listed Service on its LB IP (its subject): a
/// shared LB IP loops for all of them. Each Service's profile comes from its own settings;
/// the port and protocol from the subject (`ip:port/proto`) when it names them; `kube_proxy`:
/// whether kube-proxy's rules were read on this node ([`Inputs::kube_proxy_runs`]).
pub fn attach_fixes(
    findings: &mut [Finding],
    services: &[probe_core::service::ServiceFacts],
    kube_proxy: Option<bool>,
) {
    for f in findings {
        let Some(kind) = f.kind.predicted() else {
            continue;
        };
        // `ip` or `ip:port/proto` (`[v6]:port/proto`).
        let (ip, port) = match f.subject.parse::<std::net::IpAddr>() {
            Ok(ip) => (ip, None),
            Err(_) => {
                let Some((addr, proto)) = f.subject.rsplit_once('/') else {
                    continue;
                };
                let Ok(sa) = addr.parse::<std::net::SocketAddr>() else {
                    continue;
                };
                let proto = if proto.eq_ignore_ascii_case("udp") {
                    probe_contract::Proto::Udp
                } else {
                    probe_contract::Proto::Tcp
                };
                (sa.ip(), Some((sa.port(), proto)))
            }
        };
        let mut fixes: Vec<probe_contract::Fix> = Vec::new();
        for service in services
            .iter()
            .filter(|s| s.ingress.iter().any(|i| i.ip == Some(ip)))
        {
            // A port the Service does not serve is another Service's on the shared IP.
            if let Some((p, proto)) = port
                && kind != probe_contract::LoopbackKind::VipPortUnserved
                && service.port(p, proto).is_none()
            {
                continue;
            }
            let provider = probe_core::fixes::service_provider(service)
                .unwrap_or(probe_core::fixes::Provider::Generic);
            let mut facts = probe_core::fixes::Facts::of_risk(kind, ip, service, provider);
            facts.kube_proxy = kube_proxy;
            if let Some((p, proto)) = port {
                facts = facts.with_port(p, proto);
            }
            for fix in probe_core::fixes::fixes(&facts) {
                // A fix without a patch reads the same for every Service: once.
                if !fixes
                    .iter()
                    .any(|x| x.id == fix.id && x.service == fix.service)
                {
                    fixes.push(fix);
                }
            }
        }
        f.fixes = fixes;
    }
}
