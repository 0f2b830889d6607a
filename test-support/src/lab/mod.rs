//! The network-namespace lab: a Kubernetes node, a cloud LB, another node, two pods and an
//! outside client, wired so that the three load-balancer loopback failures of DOMAIN.md (and
//! their healthy twins) happen for real.
//!
//! Two kube-proxy modes ([`KubeProxyMode`], chosen by [`MODE_ENV`]): `iptables` (the default,
//! works on any kernel: kube-ipvs0 is a bridge with no ports standing in for kube-proxy's dummy,
//! services are kube-proxy's iptables-mode nat rules) and `ipvs` (a real `dummy` kube-ipvs0
//! holding the ClusterIP and, vip-bound, the VIP; IPVS virtual services made with `ipvsadm` as
//! kube-proxy's IPVS mode makes them, plus its ipsets and nat rules; needs a kernel with IPVS
//! and `dummy`, i.e. the VM tier).
//!
//! Nothing touches the host's namespace: every veth is created inside a lab namespace, and all
//! addresses come from ranges reserved for tests and documentation. Deleting the namespaces (after
//! killing the servers in them) removes everything, which is what [`Lab::down`] and the rollback of
//! a failed [`Lab::up`] do.

mod client;
/// The commands the lab runs (`ip`, `iptables`, ...), also xtask's bench and chaos helpers.
pub mod cmd;
pub mod etp_local;
mod guard;
pub(crate) mod kube_proxy;
pub mod lb_probe;
mod mode;
pub mod net;
pub mod nft;
pub mod nft6;
pub mod proxy_protocol;
mod scenario;
pub mod servers;
pub mod source_ranges;
pub mod stale_udp;
pub mod stale_udp6;
mod status;
pub(crate) mod switch;
mod udp;
pub mod v6;
mod variant;

use std::{
    fmt,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{Context, Result, bail};
pub(crate) use client::http_get_over;
pub use client::{
    Attempt, connect_any, connect_here, connect_in, http_get_bytes_in, http_get_in,
    http_get_with_in, in_netns,
};
pub use guard::{LOCK_PATH, LabGuard, LabLock};
pub use mode::KubeProxyMode;
pub use net::UP_STEPS;
pub use scenario::{Outcome, Scenario, ScenarioRun, ScenarioSpec};
pub use servers::SERVERS;
pub use status::{Status, leftovers};
pub use switch::POD_BRIDGE;
pub use udp::{UDP_SERVERS, udp_exchange_in};
pub use variant::{Variant, Variants};

/// Every lab namespace's name starts with this.
pub const PREFIX: &str = "clb-";
/// The Kubernetes node.
pub const NS_NODE: &str = "clb-node";
/// The cloud load balancer.
pub const NS_LB: &str = "clb-lb";
/// Another node (the LB's other backend; also hosts the outside backend of VIP:443).
pub const NS_PEER: &str = "clb-peer";
/// Pod A on the node: the in-cluster client.
pub const NS_POD_A: &str = "clb-pod-a";
/// Pod B on the node: the endpoint of `default/web`.
pub const NS_POD_B: &str = "clb-pod-b";
/// A client outside the cluster, behind the LB.
pub const NS_CLIENT: &str = "clb-client";
/// All lab namespaces, in creation order.
pub const NAMESPACES: [&str; 6] = [NS_NODE, NS_LB, NS_PEER, NS_POD_A, NS_POD_B, NS_CLIENT];

/// The node's NIC (inside `clb-node`).
pub const NODE_NIC: &str = "eth0";
/// kube-ipvs0 inside `clb-node`: a bridge with no ports in iptables mode, a real `dummy` (left
/// down, like kube-proxy leaves it) in IPVS mode.
pub const KUBE_IPVS0: &str = "kube-ipvs0";
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const LB_NODE_SIDE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
pub const POD_A_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 10);
pub const POD_B_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 11);
/// The node-side address of the pod veths (the pods' onlink gateway).
pub const POD_GW_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 1);
pub const POD_CIDR: &str = "198.19.1.0/24";
/// kube-proxy's `--cluster-cidr`.
pub const CLUSTER_CIDR: &str = "198.19.0.0/16";
/// ClusterIP of `default/web`.
pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 10);
/// The LB VIP (LoadBalancer ingress IP of `default/web`).
pub const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
pub const SERVICE_PORT: u16 = 80;
/// A listener of the same LB that belongs to something outside the cluster.
pub const VIP_UNSERVED_PORT: u16 = 443;
pub const NODE_PORT: u16 = 30080;
pub const POD_PORT: u16 = 8080;
/// Where the LB sends VIP:443 (a server on the peer).
pub const PEER_TLS_PORT: u16 = 30443;
/// Variant `peer-node`: a pod on the peer, the only endpoint of the node's VIP:8443 / :8444.
pub const PEER_POD_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 10);
pub const PEER_POD_CIDR: &str = "198.19.2.0/24";
/// Variant `peer-node`: VIP port of an externalTrafficPolicy Local service without a local
/// endpoint (forwarded to [`PEER_POD_IP`] unSNATed).
pub const VIP_ETP_LOCAL_PORT: u16 = 8443;
/// Variant `peer-node`: the same with externalTrafficPolicy Cluster (masqueraded).
pub const VIP_ETP_CLUSTER_PORT: u16 = 8444;
/// nftables mode, [`Lab::set_nft_web_local`]: the port of `default/web-local`, an
/// externalTrafficPolicy Local Service on the LB IP (kube-proxy's `no-endpoint-services`
/// drop when the node has no local endpoint).
pub const VIP_NFT_ETP_LOCAL_PORT: u16 = 8445;
/// A listener of the LB without its guard against sending a request back to the node it came
/// from (-> node:30080, client address kept): the node-sourced loop.
pub const VIP_NO_GUARD_PORT: u16 = 8081;
/// A listener of the LB that targets the pod directly (VPC-CNI style, -> pod-b:8080).
pub const VIP_TO_POD_PORT: u16 = 8082;
/// A listener of the LB whose instance target is a host-network process on the node's own
/// address (-> node:6443, the API server's port; no NodePort, client address kept, no
/// source-node guard): the host-listener hairpin, from a pod or from the node.
pub const VIP_HOST_LISTENER_PORT: u16 = 6443;
/// The node's host-network listener (a plain TCP server on the node, no Service).
pub const HOST_LISTENER_PORT: u16 = 6443;
/// Variant `vip-local-route`: the route protocol the GCE guest agent gives forwarding-rule IPs.
pub const GUEST_AGENT_ROUTE_PROTO: u8 = 66;
/// The LB's UDP listener (-> node's UDP NodePort, client address kept).
pub const VIP_UDP_PORT: u16 = 53;
/// `default/dns`'s UDP NodePort on the node.
pub const NODE_PORT_UDP: u16 = 30053;
/// pod-b's UDP server (the endpoint of `default/dns`).
pub const POD_UDP_PORT: u16 = 5353;
/// kube-proxy's chains for `default/web:http` (real kube-proxy hashes).
pub const KUBE_SVC_CHAIN: &str = "KUBE-SVC-CDGGSHYLG3RE2FKL";
pub const KUBE_EXT_CHAIN: &str = "KUBE-EXT-CDGGSHYLG3RE2FKL";
pub const KUBE_SEP_CHAIN: &str = "KUBE-SEP-4DRJRB6QQEGQJZEC";
/// The lab's pod-egress masquerade chain (nat POSTROUTING jumps to it; variant `masquerade`).
pub const MASQ_CHAIN: &str = "CLB-LAB-MASQ";
/// Environment: the kube-proxy mode of [`Lab::up`] / [`LabGuard::up`], `iptables` (default) or
/// `ipvs`.
pub const MODE_ENV: &str = "CLB_LAB_MODE";
/// IPVS mode: the scheduler of every virtual service (kube-proxy's default).
pub const IPVS_SCHEDULER: &str = "rr";
/// Environment hook: make `up` fail right after the named step (see [`UP_STEPS`]).
pub const FAIL_AFTER_ENV: &str = "CLB_LAB_FAIL_AFTER";
/// Default client connect (and answer) timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Options of [`Lab::up_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpOptions {
    /// Fail (and roll back) right after this step of [`UP_STEPS`]; for tests.
    pub fail_after: Option<String>,
}

impl UpOptions {
    /// Reads [`FAIL_AFTER_ENV`].
    pub fn from_env() -> Self {
        UpOptions {
            fail_after: std::env::var(FAIL_AFTER_ENV).ok().filter(|s| !s.is_empty()),
        }
    }
}

/// Whether this process runs as root (the lab needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid never fails.
    unsafe { libc::geteuid() == 0 }
}

/// True when running as root; otherwise prints a skip line for the calling test.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    eprintln!("skipping {test}: needs root (network namespaces, eBPF)");
    false
}

/// True inside `cargo xtask vm-test` (`CLB_VM` set: real IPVS and `dummy`) as root; otherwise
/// prints a skip line for the calling test.
pub fn require_vm(test: &str) -> bool {
    if std::env::var_os("CLB_VM").is_none() {
        eprintln!("skipping {test}: VM tier only (real IPVS and dummy); run `cargo xtask vm-test`");
        return false;
    }
    require_root(test)
}

/// A handle on the lab (the lab itself lives in the namespaces; this holds client settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lab {
    /// Client connect timeout (and answer timeout).
    pub timeout: Duration,
}

impl Default for Lab {
    fn default() -> Self {
        Lab {
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Lab {
    /// A handle on a lab that is (or will be) up, without touching anything.
    pub fn attach() -> Lab {
        Lab::default()
    }

    /// Builds the lab with the given variants (honours [`FAIL_AFTER_ENV`] and [`MODE_ENV`]).
    /// On failure everything it made is removed and the error returned.
    pub fn up(variants: &Variants) -> Result<Lab> {
        Lab::up_with(variants, &UpOptions::from_env())
    }

    /// [`Lab::up`] with explicit options (the mode from [`MODE_ENV`]).
    pub fn up_with(variants: &Variants, opts: &UpOptions) -> Result<Lab> {
        Lab::up_in(KubeProxyMode::from_env()?, variants, opts)
    }

    /// [`Lab::up_with`] in an explicit kube-proxy mode. IPVS mode fails before creating
    /// anything when the kernel lacks IPVS or `dummy` (or `ipvsadm`/`ipset` are missing).
    pub fn up_in(mode: KubeProxyMode, variants: &Variants, opts: &UpOptions) -> Result<Lab> {
        if !is_root() {
            bail!("the lab needs root (network namespaces, iptables)");
        }
        if mode == KubeProxyMode::Ipvs {
            net::require_ipvs_support()?;
        }
        let mut created = Vec::new();
        match net::build(mode, variants, opts, &mut created) {
            Ok(()) => Ok(Lab::default()),
            Err(e) => match net::remove_namespaces(&created) {
                Ok(()) => Err(e.context("lab up failed; everything it made was removed")),
                Err(rb) => {
                    Err(e.context(format!("lab up failed, and so did the rollback: {rb:#}")))
                }
            },
        }
    }

    /// Kills the lab's processes and deletes its namespaces (and with them every veth, address
    /// and rule). Idempotent; works on a partial lab.
    pub fn down() -> Result<()> {
        net::remove_namespaces(&NAMESPACES)
    }

    /// What exists now.
    pub fn status() -> Result<Status> {
        let have = net::existing_namespaces()?;
        let present = |ns: &str| have.iter().any(|h| h == ns);
        let mut st = Status {
            namespaces: NAMESPACES
                .iter()
                .map(|n| (n.to_string(), present(n)))
                .collect(),
            addresses: Vec::new(),
            mode: None,
            variants: None,
            vip_rule: None,
            servers: Vec::new(),
        };
        for ns in NAMESPACES.iter().filter(|n| present(n)) {
            st.addresses.push((ns.to_string(), net::addresses(ns)?));
        }
        if present(NS_NODE) {
            st.mode = kube_proxy::node_mode().ok();
            st.variants = switch::read_variants().ok();
            st.vip_rule = Some(switch::vip_rule_present());
        }
        for (ns, port, _) in SERVERS {
            let up = present(ns) && servers::listening(ns, *port)?;
            st.servers.push((ns.to_string(), *port, up));
        }
        Ok(st)
    }

    /// The kube-proxy mode of the lab that is up (from kube-ipvs0's link type).
    pub fn mode(&self) -> Result<KubeProxyMode> {
        net::require_up()?;
        kube_proxy::node_mode()
    }

    /// The variants as the node has them now.
    pub fn variants(&self) -> Result<Variants> {
        net::require_up()?;
        switch::read_variants()
    }

    /// Turns one variant on or off.
    pub fn set(&self, variant: Variant, on: bool) -> Result<()> {
        net::require_up()?;
        switch::set_variant(variant, on).with_context(|| format!("setting {variant} {on}"))
    }

    /// Sets every variant.
    pub fn set_all(&self, variants: &Variants) -> Result<()> {
        net::require_up()?;
        switch::set_variants(variants)
    }

    /// Hairpin mode on pod-b's bridge port (variant `bridge-pod`), as the kubelet's
    /// `--hairpin-mode=hairpin-veth` sets it.
    pub fn set_pod_b_hairpin_mode(&self, on: bool) -> Result<()> {
        net::require_up()?;
        switch::set_pod_b_hairpin_mode(on)
    }

    /// nftables mode: writes kube-proxy's rules of `default/web-local` (LB IP
    /// [`VIP`]:[`VIP_NFT_ETP_LOCAL_PORT`], externalTrafficPolicy Local), replacing what was
    /// there: with `local_endpoint` its endpoint is pod-b (the healthy twin), without it the
    /// only endpoint is on another node and the LB IP:port is a `drop` element of
    /// `no-endpoint-services` (kubernetes#131765). See [`nft::set_web_local`].
    pub fn set_nft_web_local(&self, local_endpoint: bool) -> Result<()> {
        net::require_up()?;
        anyhow::ensure!(
            nft::present(),
            "default/web-local is written in kube-proxy's nftables table: the lab is not in \
             nftables mode"
        );
        nft::set_web_local(local_endpoint)
    }

    /// One TCP attempt from inside `ns` (bound to `src` if given), with this lab's timeout.
    pub fn connect(&self, ns: &str, src: Option<Ipv4Addr>, dst: SocketAddrV4) -> Result<Attempt> {
        connect_in(ns, src, dst, self.timeout)
    }

    /// Sets the scenario's variants, drives its traffic once, reports.
    pub fn run(&self, scenario: Scenario) -> Result<ScenarioRun> {
        let spec = scenario.spec();
        let before = self.variants()?;
        self.set_all(&spec.variants)?;
        if before != spec.variants {
            // A node changes its addresses and rules long before traffic uses them; give
            // observers (the agent's address sync debounces 100 ms) the same head start.
            std::thread::sleep(SETTLE);
        }
        let expected = scenario.expected_in(kube_proxy::node_mode()?);
        let attempt = if scenario.udp() {
            udp_exchange_in(spec.from_ns, spec.src, spec.dst, self.timeout)
        } else {
            self.connect(spec.from_ns, spec.src, spec.dst)
        }
        .with_context(|| format!("scenario {scenario}"))?;
        Ok(ScenarioRun {
            scenario,
            expected,
            attempt,
        })
    }

    /// [`Lab::run`], the outcome only.
    pub fn traffic(&self, scenario: Scenario) -> Result<Outcome> {
        Ok(self.run(scenario)?.outcome())
    }
}

/// How long [`Lab::run`] waits after changing variants before it drives traffic.
pub const SETTLE: Duration = Duration::from_millis(400);
