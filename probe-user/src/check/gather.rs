//! Reads this node (the calling thread's network namespace) into [`Inputs`], through the
//! agent's own state readers: rtnetlink addresses and routes ([`addrs`]), the service table
//! ([`state::read_services`]: IPVS, else kube-proxy's nftables tables, else its iptables
//! rules), kube-proxy's ipsets ([`ipset::parse_save`]), the source-validation sysctls, and the
//! kernel's BTF and kallsyms ([`kernel`]).

use std::{collections::BTreeMap, net::IpAddr, process::Command};

use anyhow::Context as _;
use probe_contract::{Proto, check::Dataplane};

use super::{Inputs, KernelView, LbTarget, NicSysctls};
use crate::{
    kernel,
    kernel::{KernelBtf, kallsyms::Kallsyms},
    state,
    state::{addrs, addrs::AddrConfig, ipset},
};

/// kube-proxy's IPVS-mode sets: every LB ingress IP:port, the Local ones, the ClusterIPs.
pub const LB_SET: &str = "KUBE-LOAD-BALANCER";
pub const LB_LOCAL_SET: &str = "KUBE-LOAD-BALANCER-LOCAL";
pub const CLUSTER_IP_SET: &str = "KUBE-CLUSTER-IP";

/// Reads everything; an error means the node could not be read (addresses, service table).
pub fn gather(cfg: &AddrConfig) -> anyhow::Result<Inputs> {
    gather_with(cfg, None, None)
}

/// [`gather`], with what the caller already holds (the agent's node report, every minute):
/// the service table (its reader keeps it current on change; reading it again would cost a
/// full iptables-save on a 10,000-Service node) and the kernel view (the agent parsed the
/// BTF and kallsyms at start; parsing them again costs most of a second each time).
pub fn gather_with(
    cfg: &AddrConfig,
    services: Option<state::ServiceTable>,
    kernel_known: Option<KernelView>,
) -> anyhow::Result<Inputs> {
    let node = read_node(cfg)?;
    let sets = addrs::classify(&node, cfg);
    let bound = bound_addresses(&node, &sets);
    let owners = bound
        .iter()
        .filter_map(|ip| Some((*ip, sets.owner(*ip)?.clone())))
        .collect();
    let pod_prefixes = sets
        .prefixes
        .iter()
        .filter(|(_, t)| **t == probe_contract::Tag::Pod)
        .map(|(p, _)| *p)
        .collect();
    // The agent passes its table: no text dump of the rules on its steady path (`mode_state`).
    let agent_held = services.is_some();
    let services = match services {
        Some(table) => table,
        None => state::read_services().context("reading the service table")?,
    };
    let ipsets = Command::new("ipset")
        .arg("save")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| ipset::parse_save(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default();
    let (lb_targets, cluster_ips) = ipset_targets(&ipsets);
    let self_loop = self_loop_node(&ipsets);
    let dataplane = dataplane_of(&services, &ipsets, &node);
    let nics = sets
        .nics
        .iter()
        .map(|(name, _)| nic_sysctls(name))
        .collect();
    let leftovers = mode_state(&services, sets.vip_iface.is_some(), !agent_held);
    Ok(Inputs {
        vip_iface: cfg.vip_iface.clone(),
        bound,
        owners,
        cluster_ips,
        lb_targets,
        pod_prefixes,
        services,
        nics,
        kernel: kernel_known.unwrap_or_else(kernel_view),
        api: super::ApiState::NotUsed,
        api_table: None,
        api_table_error: None,
        self_loop,
        dataplane: Some(dataplane),
        leftovers,
        tcp_listeners: crate::state::sockets::tcp_listeners()
            .map_err(|e| tracing::debug!(error = %e, "reading the node's TCP listeners"))
            .ok(),
    })
}

/// The node's links, addresses and routes over rtnetlink; every interface the config names
/// must exist.
fn read_node(cfg: &AddrConfig) -> anyhow::Result<addrs::NodeState> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let node = rt
        .block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            addrs::read(&handle).await.map_err(anyhow::Error::from)
        })
        .context("reading interfaces over rtnetlink")?;
    for nic in &cfg.nics {
        if !node.links.iter().any(|l| &l.name == nic) {
            return Err(kernel::KernelError::UnknownInterface { name: nic.clone() }.into());
        }
    }
    Ok(node)
}

/// The addresses an LB IP is local as: the VIP interface's, and host routes or announcers'.
fn bound_addresses(node: &addrs::NodeState, sets: &addrs::AddressSets) -> Vec<IpAddr> {
    let mut bound: Vec<std::net::IpAddr> = match &sets.vip_iface {
        Some((_, index)) => node
            .addrs
            .iter()
            .filter(|a| a.ifindex == *index)
            .map(|a| a.addr)
            .collect(),
        None => Vec::new(),
    };
    // Local routes without an address, and VIPs an announcer holds on a NIC or lo (kube-vip,
    // keepalived), make an LB IP as local as kube-ipvs0 does.
    let route_owned: Vec<(std::net::IpAddr, probe_contract::facts::AddressOwner)> = sets
        .owners
        .iter()
        .filter(|(p, o)| {
            p.is_host()
                && (matches!(o, probe_contract::facts::AddressOwner::LocalRoute { .. })
                    || o.announcer().is_some())
        })
        .map(|(p, o)| (p.addr, o.clone()))
        .collect();
    bound.extend(route_owned.iter().map(|(ip, _)| *ip));
    bound
}

/// kube-proxy's loop-back entries (IPVS mode) and the bridges' hairpin state.
fn self_loop_node(ipsets: &BTreeMap<String, Vec<String>>) -> super::SelfLoopNode {
    let loop_back: Vec<String> = [ipset::loop_back_set(false), ipset::loop_back_set(true)]
        .iter()
        .filter_map(|s| ipsets.get(*s))
        .flatten()
        .cloned()
        .collect();
    let has_loop_back = [ipset::loop_back_set(false), ipset::loop_back_set(true)]
        .iter()
        .any(|s| ipsets.contains_key(*s));
    super::SelfLoopNode {
        loop_back: has_loop_back.then_some(loop_back),
        bridge_ports: state::bridge::ports(std::path::Path::new("/sys/class/net")),
        br_netfilter: state::bridge::br_netfilter(false),
    }
}

/// Which dataplane serves Services, from kube-proxy's traces and this namespace's links.
fn dataplane_of(
    services: &state::ServiceTable,
    ipsets: &BTreeMap<String, Vec<String>>,
    node: &addrs::NodeState,
) -> Dataplane {
    let names: Vec<String> = ipsets.keys().cloned().collect();
    let mut traces = super::dataplane::read_traces(
        super::dataplane::Traces::of_table(services, &names),
        std::path::Path::new("/sys/class/net"),
        std::path::Path::new(super::dataplane::CILIUM_PIN_DIR),
    );
    // The namespace's own interfaces (sysfs may be another namespace's).
    traces.links = node.links.iter().map(|l| l.name.clone()).collect();
    super::dataplane::detect(&traces)
}

/// The other kube-proxy modes' state beside the service table's own source, and what
/// kube-proxy says it runs (see `rules::mode_leftover`). Unreadable counts as none. IPVS is a
/// netlink dump and `/proxyMode` one local request; kube-proxy's nftables table is read only
/// when `read_nft` (`probe check`: one more netlink read, which the agent's steady path does
/// not need when its own source is another mode).
fn mode_state(
    services: &state::ServiceTable,
    vip_iface_present: bool,
    read_nft: bool,
) -> super::ModeState {
    use state::ServiceSource;
    let ipvs_services = match services.source {
        Some(ServiceSource::Ipvs) => 0,
        _ => state::ipvs::read()
            .ok()
            .flatten()
            .map_or(0, |t| t.services.len()),
    };
    let nft_services = match services.source {
        Some(ServiceSource::Nftables) => 0,
        _ if !read_nft => 0,
        _ => state::nftables::read_blocking()
            .ok()
            .flatten()
            .map_or(0, |t| t.services.len()),
    };
    super::ModeState {
        vip_iface_present,
        ipvs_services,
        nft_services,
        proxy_mode: state::proxy_mode::DEFAULT_ADDR
            .parse()
            .ok()
            .and_then(state::proxy_mode::ask),
    }
}

/// `ip,proto:port` (an `ipset save` member of a hash:ip,port set).
fn ip_port(member: &str) -> Option<(IpAddr, Proto, u16)> {
    let (ip, rest) = member.split_once(',')?;
    let (proto, port) = rest.split_once(':')?;
    let proto = match proto {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        _ => return None,
    };
    Some((ip.parse().ok()?, proto, port.parse().ok()?))
}

/// LB targets and ClusterIPs from kube-proxy's IPVS-mode sets (pure).
pub fn ipset_targets(
    sets: &std::collections::BTreeMap<String, Vec<String>>,
) -> (Vec<LbTarget>, Vec<IpAddr>) {
    let members = |name: &str| {
        sets.get(name)
            .into_iter()
            .flatten()
            .filter_map(|m| ip_port(m))
            .collect::<Vec<_>>()
    };
    let local = members(LB_LOCAL_SET);
    let targets = members(LB_SET)
        .into_iter()
        .chain(local.iter().copied())
        .map(|(ip, proto, port)| {
            let is_local = local.contains(&(ip, proto, port));
            LbTarget {
                ip,
                port: Some(port),
                proto,
                service: None,
                etp_local: Some(is_local),
                ip_mode_proxy: false,
                health_check_node_port: None,
                prevent_loopback: Vec::new(),
                kube_proxy_masquerades: !is_local,
                proxy_protocol: None,
                source_ranges: Vec::new(),
                source: format!("ipset {}", if is_local { LB_LOCAL_SET } else { LB_SET }),
            }
        })
        .fold(Vec::<LbTarget>::new(), |mut acc, t| {
            if !acc
                .iter()
                .any(|a| (a.ip, a.port, a.proto) == (t.ip, t.port, t.proto))
            {
                acc.push(t);
            }
            acc
        });
    let mut cluster_ips: Vec<IpAddr> = members(CLUSTER_IP_SET)
        .into_iter()
        .map(|(ip, _, _)| ip)
        .collect();
    cluster_ips.sort();
    cluster_ips.dedup();
    (targets, cluster_ips)
}

fn sysctl(path: &str) -> Option<u8> {
    std::fs::read_to_string(format!("/proc/sys/{path}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A NIC's sysctls combined with `all` the way the kernel combines them: `rp_filter` takes
/// the max, `accept_local`, `route_localnet` and `log_martians` are on when either is.
fn nic_sysctls(name: &str) -> NicSysctls {
    let get = |iface: &str, key: &str| sysctl(&format!("net/ipv4/conf/{iface}/{key}")).unwrap_or(0);
    let either = |key: &str| get("all", key) != 0 || get(name, key) != 0;
    NicSysctls {
        name: name.to_string(),
        rp_filter: get("all", "rp_filter").max(get(name, "rp_filter")),
        accept_local: either("accept_local"),
        route_localnet: either("route_localnet"),
        log_martians: either("log_martians"),
    }
}

fn kernel_view() -> KernelView {
    kernel_view_of(KernelBtf::load().as_ref(), !Kallsyms::load().is_empty())
}

/// The kernel view from a BTF parse and a kallsyms read already done (the agent's own).
pub fn kernel_view_of(
    btf: Result<&KernelBtf, &kernel::KernelError>,
    kallsyms_readable: bool,
) -> KernelView {
    let (release, tcx) = kernel::release_and_tcx();
    KernelView {
        release,
        tcx,
        drop_reason_arg: btf.is_ok_and(KernelBtf::kfree_skb_has_reason),
        drop_reasons: btf.map_or(0, |b| b.drop_reasons.len()),
        btf_error: btf.err().map(|e| e.to_string()),
        kptr_restrict: sysctl("kernel/kptr_restrict"),
        kallsyms_readable,
    }
}
