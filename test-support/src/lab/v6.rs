//! The dual-stack layer of the lab (iptables mode; IPVS mode without kube-proxy's ip6tables
//! nat rules, [`Lab::serve_vip6_by_ipvs`]; nftables mode with kube-proxy's `ip6 kube-proxy`
//! table, [`super::nft6`]): IPv6 addresses from the documentation
//! prefix 2001:db8::/32 on every namespace, the LB's and kube-proxy's rules in `ip6tables`,
//! IPv6 servers beside the IPv4 ones, and the three failures driven over IPv6
//! ([`Scenario6`]). Added to a lab that is up ([`Lab::add_ipv6`]); removed with it.
//!
//! What IPv6 changes (measured on 6.18): it has no martian-source check, so the LB's health
//! check from a VIP bound on kube-ipvs0 is accepted and answered, and the node's SYN-ACK to
//! the VIP is routed to the node itself and dropped for no socket: the check still times out.
//! The hairpin and the unserved port happen as over IPv4.

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    KUBE_EXT_CHAIN, KUBE_IPVS0, KUBE_SEP_CHAIN, KUBE_SVC_CHAIN, KubeProxyMode, Lab, NAMESPACES,
    NODE_NIC, NODE_PORT, NS_CLIENT, NS_LB, NS_NODE, NS_PEER, NS_POD_A, NS_POD_B, Outcome,
    PEER_TLS_PORT, POD_PORT, SERVICE_PORT, SETTLE, VIP_UNSERVED_PORT, Variants, client,
    cmd::{exec, ip, neigh_permanent, restore_rules, sysctl},
    in_netns,
    kube_proxy::{self, NAT_TABLE_HEAD},
    net, servers,
};

pub const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 2);
pub const LB_NODE_SIDE_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 1);
pub const PEER_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 1, 0, 0, 0, 2);
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x51, 0, 0, 0, 0, 0x10);
pub const POD_A_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 1, 0, 0, 0, 0x10);
pub const POD_B_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 1, 0, 0, 0, 0x11);
pub const POD_GW_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 1, 0, 0, 0, 1);
pub const POD_CIDR6: &str = "2001:db8:19::/48";
/// The LB's IPv6 VIP.
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x113, 0, 0, 0, 0, 0x10);

/// The IPv6 failures (the lab's [`Scenario`]s that exist over IPv6 here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario6 {
    /// VIP6 bound: the LB's check VIP6 -> [node6]:30080 is answered, the answer dies locally.
    HealthcheckBlackhole,
    /// Twin: VIP6 not bound, the check is answered through the LB.
    HealthcheckOk,
    /// VIP6 not bound: pod-a -> [VIP6]:80 comes back to the node keeping the pod source.
    Hairpin,
    /// VIP6 bound for port 80 only: pod-a -> [VIP6]:443 is refused by the node.
    VipPortUnserved,
    /// Twin: pod-a -> [VIP6]:80 while bound, DNATed on the node to pod-b.
    VipPortServed,
}

/// Pod A's IPv6 call to the LB IP's `port` ([`VIP6`]), waiting `timeout` at most.
pub fn pod_a_call6(port: u16, timeout: Duration) -> Result<client::Attempt> {
    let to = SocketAddr::new(IpAddr::V6(VIP6), port);
    in_netns(NS_POD_A, || client::connect_any(None, to, timeout))
}

impl Scenario6 {
    pub const ALL: [Scenario6; 5] = [
        Scenario6::HealthcheckBlackhole,
        Scenario6::HealthcheckOk,
        Scenario6::Hairpin,
        Scenario6::VipPortUnserved,
        Scenario6::VipPortServed,
    ];

    /// (VIP6 bound, client namespace, client source, destination, expected outcome).
    pub fn spec(self) -> (bool, &'static str, Option<IpAddr>, SocketAddr, Outcome) {
        let vip = |port| SocketAddr::new(IpAddr::V6(VIP6), port);
        let nodeport = SocketAddr::new(IpAddr::V6(NODE_IP6), NODE_PORT);
        match self {
            Scenario6::HealthcheckBlackhole => (
                true,
                NS_LB,
                Some(IpAddr::V6(VIP6)),
                nodeport,
                Outcome::Timeout,
            ),
            Scenario6::HealthcheckOk => {
                (false, NS_LB, Some(IpAddr::V6(VIP6)), nodeport, Outcome::Ok)
            }
            Scenario6::Hairpin => (false, NS_POD_A, None, vip(SERVICE_PORT), Outcome::Timeout),
            Scenario6::VipPortUnserved => (
                true,
                NS_POD_A,
                None,
                vip(VIP_UNSERVED_PORT),
                Outcome::Refused,
            ),
            Scenario6::VipPortServed => (true, NS_POD_A, None, vip(SERVICE_PORT), Outcome::Ok),
        }
    }
}

impl Lab {
    /// Adds the dual-stack layer to the lab that is up, VIP6 not bound. In iptables mode with
    /// kube-proxy's ip6tables rules for `default/web`; in IPVS mode without them (IPVS serves
    /// VIP6: [`Lab::serve_vip6_by_ipvs`]); in nftables mode with its `ip6 kube-proxy` table
    /// ([VIP6]:80 short-circuited to pod-b, as `ipMode: VIP` has it; a test adds its own
    /// Service's chains and elements to it, as [`super::stale_udp6`] does).
    pub fn add_ipv6(&self) -> Result<()> {
        net::require_up()?;
        let mode = kube_proxy::node_mode()?;
        if mode == KubeProxyMode::Cilium {
            bail!(
                "the dual-stack lab variant is built for kube-proxy's iptables, IPVS and \
                 nftables modes"
            );
        }
        for ns in NAMESPACES {
            sysctl(
                ns,
                &[
                    "net.ipv6.conf.all.disable_ipv6=0".into(),
                    "net.ipv6.conf.default.accept_dad=0".into(),
                    "net.ipv6.conf.all.accept_dad=0".into(),
                    format!(
                        "net.ipv6.conf.all.forwarding={}",
                        u8::from(matches!(ns, NS_NODE | NS_LB))
                    ),
                ],
            )?;
        }
        let addr = |ns: &str, dev: &str, cidr: &str| {
            ip(ns, &["-6", "addr", "add", cidr, "dev", dev, "nodad"]).map(drop)
        };
        let route = |ns: &str, args: &[&str]| {
            let mut a = vec!["-6", "route", "add"];
            a.extend_from_slice(args);
            ip(ns, &a).map(drop)
        };
        addr(NS_LB, "vnode", "2001:db8:18::1/64")?;
        addr(NS_LB, "vpeer", "2001:db8:18:1::1/64")?;
        addr(NS_LB, "vclient", "2001:db8:51::1/64")?;
        addr(NS_LB, "lo", &format!("{VIP6}/128"))?;
        route(NS_LB, &[POD_CIDR6, "via", "2001:db8:18::2"])?;
        addr(NS_NODE, NODE_NIC, "2001:db8:18::2/64")?;
        route(NS_NODE, &["default", "via", "2001:db8:18::1"])?;
        for (dev, pod_ns, pod_ip) in [
            ("vpod-a", NS_POD_A, POD_A_IP6),
            ("vpod-b", NS_POD_B, POD_B_IP6),
        ] {
            addr(NS_NODE, dev, &format!("{POD_GW_IP6}/128"))?;
            route(NS_NODE, &[&pod_ip.to_string(), "dev", dev])?;
            addr(pod_ns, "eth0", &format!("{pod_ip}/128"))?;
            route(pod_ns, &[&POD_GW_IP6.to_string(), "dev", "eth0"])?;
            route(
                pod_ns,
                &["default", "via", &POD_GW_IP6.to_string(), "dev", "eth0"],
            )?;
        }
        addr(NS_PEER, "eth0", "2001:db8:18:1::2/64")?;
        route(NS_PEER, &["default", "via", "2001:db8:18:1::1"])?;
        addr(NS_CLIENT, "eth0", "2001:db8:51::10/64")?;
        route(NS_CLIENT, &["default", "via", "2001:db8:51::1"])?;
        // As over IPv4, the LB knows the node's MAC statically (its checks come from VIP6).
        let mac = exec(NS_NODE, &["cat", "/sys/class/net/eth0/address"])?;
        neigh_permanent(NS_LB, "2001:db8:18::2", mac.trim(), "vnode")?;
        match mode {
            KubeProxyMode::Iptables => {
                restore_rules(NS_NODE, "ip6tables-restore", &kube_proxy_rules6())
                    .context("loading kube-proxy's ip6tables rules into clb-node")?;
            }
            KubeProxyMode::Nftables => super::nft6::load6()?,
            KubeProxyMode::Ipvs | KubeProxyMode::Cilium => {}
        }
        restore_rules(NS_LB, "ip6tables-restore", &lb_rules6())
            .context("loading the LB's ip6tables rules into clb-lb")?;
        for (ns, port) in [
            (NS_POD_B, POD_PORT),
            (NS_PEER, NODE_PORT),
            (NS_PEER, PEER_TLS_PORT),
        ] {
            start_server6(ns, port)?;
        }
        for (ns, port) in [
            (NS_POD_B, POD_PORT),
            (NS_PEER, NODE_PORT),
            (NS_PEER, PEER_TLS_PORT),
        ] {
            wait_listening6(ns, port)?;
        }
        Ok(())
    }

    /// Binds VIP6 to kube-ipvs0 and serves [VIP6]:80 on the node (or undoes both).
    pub fn set_vip6_bound(&self, on: bool) -> Result<()> {
        let cidr = format!("{VIP6}/128");
        let bound = ip(NS_NODE, &["-6", "-o", "addr", "show", "dev", KUBE_IPVS0])?.contains(&cidr);
        if on && !bound {
            ip(
                NS_NODE,
                &["-6", "addr", "add", &cidr, "dev", KUBE_IPVS0, "nodad"],
            )?;
        } else if !on && bound {
            ip(NS_NODE, &["-6", "addr", "del", &cidr, "dev", KUBE_IPVS0])?;
        }
        let rule = super::switch::lb_ip_rule(&cidr, KUBE_EXT_CHAIN);
        let mut check = vec!["ip6tables", "-w", "-t", "nat", "-C", "KUBE-SERVICES"];
        check.extend(rule);
        let present =
            super::cmd::succeeds(&[&["ip", "netns", "exec", NS_NODE][..], &check[..]].concat());
        if on != present {
            let mut a = vec![
                "ip6tables",
                "-w",
                "-t",
                "nat",
                if on { "-I" } else { "-D" },
                "KUBE-SERVICES",
            ];
            if on {
                a.push("1");
            }
            a.extend(rule);
            exec(NS_NODE, &a)?;
        }
        Ok(())
    }

    /// IPVS mode: VIP6 bound on kube-ipvs0 and `default/web`'s IPv6 virtual service [VIP6]:80
    /// with pod-b's [IPv6]:8080 as its masqueraded real server, as kube-proxy's IPv6 proxier
    /// makes them (`pkg/proxy/ipvs/proxier.go`, `syncService`).
    pub fn serve_vip6_by_ipvs(&self) -> Result<()> {
        if kube_proxy::node_mode()? != KubeProxyMode::Ipvs {
            bail!("an IPVS virtual service for VIP6 needs the lab in IPVS mode");
        }
        let vs = SocketAddr::new(IpAddr::V6(VIP6), SERVICE_PORT).to_string();
        let rs = SocketAddr::new(IpAddr::V6(POD_B_IP6), POD_PORT).to_string();
        exec(
            NS_NODE,
            &["ipvsadm", "-A", "-t", &vs, "-s", super::IPVS_SCHEDULER],
        )?;
        exec(
            NS_NODE,
            &["ipvsadm", "-a", "-t", &vs, "-r", &rs, "-m", "-w", "1"],
        )?;
        let cidr = format!("{VIP6}/128");
        ip(
            NS_NODE,
            &["-6", "addr", "add", &cidr, "dev", KUBE_IPVS0, "nodad"],
        )
        .map(drop)
    }

    /// Sets VIP6 for `scenario`, drives its traffic once over IPv6.
    pub fn run6(&self, scenario: Scenario6) -> Result<(Outcome, Outcome)> {
        let (bound, ns, src, dst, expected) = scenario.spec();
        self.set_all(&Variants {
            vip_bound: false,
            ..Variants::default()
        })?;
        self.set_vip6_bound(bound)?;
        std::thread::sleep(SETTLE);
        let timeout = self.timeout;
        let attempt = in_netns(ns, move || client::connect_any(src, dst, timeout))
            .with_context(|| format!("IPv6 scenario {scenario:?}"))?;
        Ok((attempt.outcome, expected))
    }
}

/// kube-proxy's iptables-mode rules for `default/web`'s IPv6 side (NodePort 30080 to pod-b's
/// IPv6 address; [VIP6]:80 while bound is added by [`Lab::set_vip6_bound`]).
fn kube_proxy_rules6() -> String {
    format!(
        r#"{NAT_TABLE_HEAD}
:{svc} - [0:0]
:{ext} - [0:0]
:{sep} - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j {ext}
-A {ext} -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ
-A {ext} -j {svc}
-A {svc} -m comment --comment "default/web:http -> [{pod_b}]:8080" -j {sep}
-A {sep} -s {pod_b}/128 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
-A {sep} -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination [{pod_b}]:8080
COMMIT
"#,
        svc = KUBE_SVC_CHAIN,
        ext = KUBE_EXT_CHAIN,
        sep = KUBE_SEP_CHAIN,
        pod_b = POD_B_IP6,
    )
}

/// The LB over IPv6: DNAT without SNAT, never back to the source node.
fn lb_rules6() -> String {
    format!(
        r#"*nat
:CLB-LB-VIP - [0:0]
-A PREROUTING -d {vip}/128 -m comment --comment "clb-lab: LB listeners on the VIP" -j CLB-LB-VIP
-A CLB-LB-VIP -s {node}/128 -p tcp -m tcp --dport 80 -j DNAT --to-destination [{peer}]:30080
-A CLB-LB-VIP -p tcp -m tcp --dport 80 -j DNAT --to-destination [{node}]:30080
-A CLB-LB-VIP -p tcp -m tcp --dport 443 -j DNAT --to-destination [{peer}]:30443
COMMIT
"#,
        vip = VIP6,
        node = NODE_IP6,
        peer = PEER_IP6,
    )
}

fn start_server6(ns: &str, port: u16) -> Result<()> {
    let name = format!("{ns} ipv6 :{port}");
    servers::start_tcp_server(ns, port, &name, true)
        .with_context(|| format!("starting the IPv6 server {name}"))
}

fn wait_listening6(ns: &str, port: u16) -> Result<()> {
    servers::wait_listed(ns, "-H6ltn", port, "IPv6 server listens on")
}
