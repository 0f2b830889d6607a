//! Switching the node's variants on and off in a running lab, and reading which are on.

use anyhow::{Context, Result, bail};

use super::{
    CLUSTER_IP, GUEST_AGENT_ROUTE_PROTO, KUBE_EXT_CHAIN, KUBE_IPVS0, KUBE_SEP_CHAIN, KubeProxyMode,
    MASQ_CHAIN, NODE_NIC, NODE_PORT, NS_LB, NS_NODE, NS_PEER, PEER_POD_CIDR, PEER_POD_IP, POD_B_IP,
    POD_CIDR, POD_GW_IP, POD_PORT, SERVICE_PORT, SocketAddrV4, VIP, VIP_ETP_CLUSTER_PORT,
    VIP_ETP_LOCAL_PORT, Variant, Variants,
    cmd::{
        exec, ip, iptables, iptables_ok, remove_chain, restore_rules, run_stdin, sysctl,
        sysctl_read,
    },
    kube_proxy::{LB_SET, ipvs_has_service, ipvs_service, node_mode},
};

/// The KUBE-SERVICES rule that sends `dst` (the LB IP as a /32 or /128), port 80, to `target`:
/// with the EXT chain it serves the LB IP locally (what binding the VIP to kube-ipvs0 gives IPVS
/// mode; kube-proxy's iptables mode writes it for a LB ingress IP), with the firewall chain it
/// checks the caller against `loadBalancerSourceRanges` first.
pub(super) fn lb_ip_rule<'a>(dst: &'a str, target: &'a str) -> [&'a str; 14] {
    [
        "-d",
        dst,
        "-p",
        "tcp",
        "-m",
        "comment",
        "--comment",
        "default/web:http loadbalancer IP",
        "-m",
        "tcp",
        "--dport",
        "80",
        "-j",
        target,
    ]
}

/// The IPv4 LB IP's [`lb_ip_rule`].
const VIP_CIDR: &str = "203.0.113.10/32";

const MASQ_RULE: &[&str] = &[
    "-s",
    POD_CIDR,
    "-o",
    NODE_NIC,
    "-m",
    "comment",
    "--comment",
    "clb-lab: pod egress masquerade",
    "-j",
    "MASQUERADE",
];

fn rule_args<'a>(op: &'a str, chain: &'a str, spec: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["-t", "nat", op, chain];
    a.extend_from_slice(spec);
    a
}

fn has_rule(chain: &str, spec: &[&str]) -> bool {
    iptables_ok(NS_NODE, &rule_args("-C", chain, spec))
}

fn ensure_rule(chain: &str, spec: &[&str], on: bool, insert_first: bool) -> Result<()> {
    let present = has_rule(chain, spec);
    if on && !present {
        let args = if insert_first {
            let mut a = vec!["-t", "nat", "-I", chain, "1"];
            a.extend_from_slice(spec);
            a
        } else {
            rule_args("-A", chain, spec)
        };
        iptables(NS_NODE, &args)?;
    }
    if !on {
        while has_rule(chain, spec) {
            iptables(NS_NODE, &rule_args("-D", chain, spec))?;
        }
    }
    Ok(())
}

pub(crate) fn set_variant(variant: Variant, on: bool) -> Result<()> {
    set_variant_in(node_mode()?, variant, on)
}

fn set_variant_in(mode: KubeProxyMode, variant: Variant, on: bool) -> Result<()> {
    match variant {
        Variant::IpvsFilter => set_ipvs_filter(mode, on),
        Variant::PeerNode => set_peer_node(on),
        Variant::VipLocalRoute => set_vip_local_route(on),
        Variant::VipAnnounced => set_vip_announced(on),
        Variant::VipBound if mode == KubeProxyMode::Cilium => {
            if on {
                bail!(
                    "vip-bound: no kube-proxy binds LB IPs in the lab's cilium mode (use \
                     vip-local-route for an LB IP made local)"
                );
            }
            Ok(())
        }
        Variant::VipBound if mode == KubeProxyMode::Nftables => {
            super::nft::set_lb_ip_short_circuited(on)
        }
        Variant::VipBound if mode == KubeProxyMode::Ipvs => {
            let bound = vip_address_bound()?;
            let cidr = format!("{VIP}/32");
            if on && !bound {
                ip(NS_NODE, &["addr", "add", &cidr, "dev", KUBE_IPVS0])?;
            } else if !on && bound {
                ip(NS_NODE, &["addr", "del", &cidr, "dev", KUBE_IPVS0])?;
            }
            // The LB ingress stays in KUBE-LOAD-BALANCER either way (kube-proxy lists it
            // whether or not it binds it).
            let vs = SocketAddrV4::new(VIP, SERVICE_PORT);
            if on != ipvs_has_service(vs) {
                ipvs_service(vs, on)?;
            }
            Ok(())
        }
        Variant::VipBound => {
            let bound = vip_address_bound()?;
            if on && !bound {
                ip(
                    NS_NODE,
                    &["addr", "add", "203.0.113.10/32", "dev", KUBE_IPVS0],
                )?;
            } else if !on && bound {
                ip(
                    NS_NODE,
                    &["addr", "del", "203.0.113.10/32", "dev", KUBE_IPVS0],
                )?;
            }
            ensure_rule(
                "KUBE-SERVICES",
                &lb_ip_rule(VIP_CIDR, KUBE_EXT_CHAIN),
                on,
                true,
            )
        }
        Variant::RpFilter => {
            let v = u8::from(on);
            sysctl(
                NS_NODE,
                &[
                    format!("net.ipv4.conf.all.rp_filter={v}"),
                    format!("net.ipv4.conf.{NODE_NIC}.rp_filter={v}"),
                ],
            )
        }
        Variant::Masquerade => ensure_rule(MASQ_CHAIN, MASQ_RULE, on, false),
        Variant::SelfSnatMissing => set_self_snat(mode, !on),
        Variant::BridgePod => set_bridge_pod(on),
    }
}

pub(crate) fn set_variants(v: &Variants) -> Result<()> {
    set_variants_in(node_mode()?, v)
}

pub(super) fn set_variants_in(mode: KubeProxyMode, v: &Variants) -> Result<()> {
    set_variant_in(mode, Variant::VipBound, v.vip_bound)?;
    set_variant_in(mode, Variant::RpFilter, v.rp_filter)?;
    set_variant_in(mode, Variant::Masquerade, v.masquerade)?;
    set_variant_in(mode, Variant::IpvsFilter, v.ipvs_filter)?;
    set_variant_in(mode, Variant::PeerNode, v.peer_node)?;
    set_variant_in(mode, Variant::VipLocalRoute, v.vip_local_route)?;
    set_variant_in(mode, Variant::VipAnnounced, v.vip_announced)?;
    set_variant_in(mode, Variant::SelfSnatMissing, v.self_snat_missing)?;
    set_variant_in(mode, Variant::BridgePod, v.bridge_pod)
}

/// `local <VIP> dev eth0 proto 66 table local`: the variant `vip-local-route`.
fn vip_local_route_args(op: &str) -> Vec<String> {
    let proto = GUEST_AGENT_ROUTE_PROTO.to_string();
    [
        "route",
        op,
        "local",
        "203.0.113.10",
        "dev",
        NODE_NIC,
        "proto",
        &proto,
        "table",
        "local",
    ]
    .map(String::from)
    .to_vec()
}

fn vip_local_route() -> Result<bool> {
    let out = ip(
        NS_NODE,
        &["route", "show", "table", "local", "203.0.113.10/32"],
    )?;
    Ok(out.contains(&format!("proto {GUEST_AGENT_ROUTE_PROTO}")))
}

fn set_vip_local_route(on: bool) -> Result<()> {
    let have = vip_local_route()?;
    let op = match (on, have) {
        (true, false) => "append", // beside a kube-ipvs0 address's own local route, as the kernel itself adds routes
        (false, true) => "del",
        _ => return Ok(()),
    };
    let args = vip_local_route_args(op);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ip(NS_NODE, &args).map(|_| ())
}

/// The VIP held on the NIC as kube-vip holds it (ARP mode): a /32 with preferred_lft 0.
fn vip_announced() -> Result<bool> {
    let out = ip(NS_NODE, &["-4", "-o", "addr", "show", "dev", NODE_NIC])?;
    Ok(out.contains("203.0.113.10/32"))
}

fn set_vip_announced(on: bool) -> Result<()> {
    let have = vip_announced()?;
    let cidr = "203.0.113.10/32";
    match (on, have) {
        (true, false) => ip(
            NS_NODE,
            &["addr", "add", cidr, "dev", NODE_NIC, "preferred_lft", "0"],
        )
        .map(|_| ()),
        (false, true) => ip(NS_NODE, &["addr", "del", cidr, "dev", NODE_NIC]).map(|_| ()),
        _ => Ok(()),
    }
}

fn vip_address_bound() -> Result<bool> {
    let out = ip(NS_NODE, &["-4", "-o", "addr", "show", "dev", KUBE_IPVS0])?;
    Ok(out.contains("203.0.113.10/32"))
}

pub(crate) fn read_variants() -> Result<Variants> {
    let all = sysctl_read(NS_NODE, "net.ipv4.conf.all.rp_filter")?;
    let nic = sysctl_read(NS_NODE, &format!("net.ipv4.conf.{NODE_NIC}.rp_filter"))?;
    let vip_bound = if super::nft::present() {
        super::nft::lb_ip_short_circuited()
    } else {
        vip_address_bound()?
    };
    Ok(Variants {
        vip_bound,
        // Linux uses max(all, iface): 1 is strict, 2 loose.
        rp_filter: all.max(nic) == 1,
        masquerade: has_rule(MASQ_CHAIN, MASQ_RULE),
        ipvs_filter: ipvs_filter_present(),
        peer_node: peer_node()?,
        vip_local_route: vip_local_route()?,
        vip_announced: vip_announced()?,
        self_snat_missing: !self_snat(node_mode()?),
        bridge_pod: bridge_pod(),
    })
}

/// kube-proxy's masquerade of pod-b's calls to its own Service (`default/web`'s endpoint
/// calling itself), per mode.
const SEP_SELF_MASQ_RULE: &[&str] = &[
    "-s",
    "198.19.1.11/32",
    "-m",
    "comment",
    "--comment",
    "default/web:http",
    "-j",
    "KUBE-MARK-MASQ",
];

/// IPVS mode's hairpin set entry of pod-b's endpoint.
fn loop_back_entry() -> String {
    format!("{POD_B_IP},tcp:{POD_PORT},{POD_B_IP}")
}

/// The nftables endpoint chain's hairpin rule, as `nft list` prints it.
fn nft_self_masq() -> String {
    format!("ip saddr {POD_B_IP} jump mark-for-masquerade")
}

fn self_snat(mode: KubeProxyMode) -> bool {
    match mode {
        KubeProxyMode::Iptables => has_rule(KUBE_SEP_CHAIN, SEP_SELF_MASQ_RULE),
        KubeProxyMode::Ipvs => super::cmd::succeeds(&[
            "ip",
            "netns",
            "exec",
            NS_NODE,
            "ipset",
            "test",
            "KUBE-LOOP-BACK",
            &loop_back_entry(),
        ]),
        KubeProxyMode::Nftables => exec(
            NS_NODE,
            &[
                "nft",
                "list",
                "chain",
                "ip",
                super::nft::NFT_TABLE,
                super::nft::NFT_ENDPOINT_CHAIN,
            ],
        )
        .is_ok_and(|out| out.contains(&nft_self_masq())),
        // No kube-proxy: no hairpin masquerade of its own.
        KubeProxyMode::Cilium => false,
    }
}

/// Puts kube-proxy's hairpin masquerade of pod-b in place (`on`) or removes it.
fn set_self_snat(mode: KubeProxyMode, on: bool) -> Result<()> {
    if self_snat(mode) == on {
        return Ok(());
    }
    match mode {
        // No kube-proxy hairpin rule to add or remove (Cilium handles it in eBPF).
        KubeProxyMode::Cilium => Ok(()),
        KubeProxyMode::Iptables => ensure_rule(KUBE_SEP_CHAIN, SEP_SELF_MASQ_RULE, on, true),
        KubeProxyMode::Ipvs => exec(
            NS_NODE,
            &[
                "ipset",
                if on { "add" } else { "del" },
                "KUBE-LOOP-BACK",
                &loop_back_entry(),
            ],
        )
        .map(drop),
        KubeProxyMode::Nftables => {
            // The chain's rules in kube-proxy's order, with or without the hairpin mark.
            let chain = super::nft::NFT_ENDPOINT_CHAIN;
            let table = super::nft::NFT_TABLE;
            let mut script = format!("flush chain ip {table} {chain}\n");
            if on {
                script += &format!("add rule ip {table} {chain} {}\n", nft_self_masq());
            }
            script += &format!(
                "add rule ip {table} {chain} meta l4proto tcp dnat to {POD_B_IP}:{POD_PORT}\n"
            );
            run_stdin(&["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"], &script)
                .context("rewriting the endpoint chain")
                .map(drop)
        }
    }
}

/// The bridge of variant `bridge-pod`.
pub const POD_BRIDGE: &str = "cbr0";

fn bridge_pod() -> bool {
    ip(NS_NODE, &["-o", "link", "show", "dev", "vpod-b"])
        .is_ok_and(|out| out.contains(&format!("master {POD_BRIDGE}")))
}

/// pod-b's veth becomes a port of `cbr0` (which takes the pods' gateway address), routed
/// through the bridge, with br_netfilter on and hairpin mode off on the port; off: the
/// routed veth again.
fn set_bridge_pod(on: bool) -> Result<()> {
    if bridge_pod() == on {
        return Ok(());
    }
    let gw = format!("{POD_GW_IP}/32");
    let pod = POD_B_IP.to_string();
    if on {
        // Where br_netfilter is a module (Debian's kernels in the VM tier); built in here.
        let _ = std::process::Command::new("modprobe")
            .args(["-q", "br_netfilter"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        ip(NS_NODE, &["link", "add", POD_BRIDGE, "type", "bridge"])?;
        ip(NS_NODE, &["addr", "add", &gw, "dev", POD_BRIDGE])?;
        ip(NS_NODE, &["link", "set", POD_BRIDGE, "up"])?;
        ip(NS_NODE, &["link", "set", "vpod-b", "master", POD_BRIDGE])?;
        set_port_hairpin(false)?;
        ip(NS_NODE, &["route", "replace", &pod, "dev", POD_BRIDGE])?;
        sysctl(
            NS_NODE,
            &[
                format!("net.ipv4.conf.{POD_BRIDGE}.rp_filter=0"),
                "net.bridge.bridge-nf-call-iptables=1".into(),
            ],
        )
        .context("br_netfilter (net.bridge.bridge-nf-call-iptables) in clb-node")?;
    } else {
        ip(NS_NODE, &["link", "set", "vpod-b", "nomaster"])?;
        ip(NS_NODE, &["route", "replace", &pod, "dev", "vpod-b"])?;
        ip(NS_NODE, &["link", "del", POD_BRIDGE])?;
        // The sysctl exists only where br_netfilter is loaded; it was when the bridge came up.
        let _ = sysctl(NS_NODE, &["net.bridge.bridge-nf-call-iptables=0".into()]);
    }
    Ok(())
}

/// Turns hairpin mode on pod-b's bridge port on or off (variant `bridge-pod` must be on): what
/// the kubelet's `--hairpin-mode=hairpin-veth` does.
pub fn set_pod_b_hairpin_mode(on: bool) -> Result<()> {
    if !bridge_pod() {
        bail!("pod-b is not on a bridge (variant bridge-pod is off)");
    }
    set_port_hairpin(on)
}

/// Hairpin mode on pod-b's bridge port, on or off.
fn set_port_hairpin(on: bool) -> Result<()> {
    let mode = if on { "on" } else { "off" };
    let args = [
        "link",
        "set",
        "vpod-b",
        "type",
        "bridge_slave",
        "hairpin",
        mode,
    ];
    ip(NS_NODE, &args).map(drop)
}

/// kube-proxy's IPVS access filter chain (filter table).
pub const IPVS_FILTER_CHAIN: &str = "KUBE-IPVS-FILTER";
/// The comment on INPUT's jump to [`IPVS_FILTER_CHAIN`], as kube-proxy writes it.
const IPVS_FILTER_JUMP: &str = "kubernetes ipvs access filter";

/// The ipsets of the access filter that IPVS mode does not already have (destroyed when the
/// variant goes off).
const IPVS_FILTER_SETS: &[&str] = &[
    "KUBE-IPVS-IPS",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-HEALTH-CHECK-NODE-PORT",
];

/// The ipsets of the access filter that the iptables mode lacks and IPVS mode has (made with
/// the lab's services when the variant goes on in iptables mode).
const IPVS_MODE_SETS: &[&str] = &[LB_SET, "KUBE-CLUSTER-IP"];

fn ipvs_filter_present() -> bool {
    iptables_ok(NS_NODE, &["-t", "filter", "-S", IPVS_FILTER_CHAIN])
}

/// The ipsets and rules kube-proxy (>= 1.25, IPVS mode) writes for its access filter: every
/// kube-ipvs0 address in KUBE-IPVS-IPS; RETURN for a service ip,port (LB, ClusterIP,
/// external IPs) or a healthCheckNodePort; REJECT any other new connection to those
/// addresses. In iptables mode the service sets are made here with the lab's services.
fn set_ipvs_filter(mode: KubeProxyMode, on: bool) -> Result<()> {
    let present = ipvs_filter_present();
    if on && !present {
        let mut sets = String::new();
        if mode == KubeProxyMode::Iptables {
            sets += &format!(
                "create {LB_SET} hash:ip,port family inet hashsize 1024 maxelem 65536\n\
                 add {LB_SET} {VIP},tcp:{SERVICE_PORT}\n\
                 create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
                 add KUBE-CLUSTER-IP {CLUSTER_IP},tcp:{SERVICE_PORT}\n"
            );
        }
        sets += &format!(
            "create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
             create KUBE-EXTERNAL-IP-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536\n\
             create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535\n\
             create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536\n\
             add KUBE-IPVS-IPS {CLUSTER_IP}\n\
             add KUBE-IPVS-IPS {VIP}\n"
        );
        run_stdin(
            &["ip", "netns", "exec", NS_NODE, "ipset", "-exist", "restore"],
            &sets,
        )
        .context("loading the IPVS access filter's ipsets")?;
        let rules = format!(
            r#"*filter
:{chain} - [0:0]
-A INPUT -m comment --comment "{IPVS_FILTER_JUMP}" -j {chain}
-A {chain} -m set --match-set {LB_SET} dst,dst -j RETURN
-A {chain} -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A {chain} -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A {chain} -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A {chain} -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A {chain} -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
COMMIT
"#,
            chain = IPVS_FILTER_CHAIN
        );
        restore_rules(NS_NODE, "iptables-restore", &rules)
            .context("loading the IPVS access filter rules")?;
    }
    if !on && present {
        remove_chain(
            NS_NODE,
            "filter",
            "INPUT",
            IPVS_FILTER_JUMP,
            IPVS_FILTER_CHAIN,
        )?;
        let mut sets = IPVS_FILTER_SETS.to_vec();
        if mode == KubeProxyMode::Iptables {
            sets.extend_from_slice(IPVS_MODE_SETS);
        }
        for set in sets {
            exec(NS_NODE, &["ipset", "destroy", set])?;
        }
    }
    Ok(())
}

/// The lab's chain (nat OUTPUT) standing in for IPVS's virtual services VIP:8443 (ETP Local,
/// no local endpoint: forwarded unSNATed) and VIP:8444 (ETP Cluster: marked for kube-proxy's
/// masquerade) to the pod on the peer.
pub const ETP_CHAIN: &str = "CLB-LAB-ETP";
/// The comment on nat OUTPUT's jump to [`ETP_CHAIN`].
const ETP_JUMP: &str = "clb-lab: ETP services with their endpoint on the peer (variant peer-node)";

/// The peer is a second node: it binds the VIP (on its `lo`) and hosts a pod
/// ([`PEER_POD_IP`], answered by its NodePort server) that is the only endpoint of the node's
/// VIP:8443 / VIP:8444 ([`ETP_CHAIN`]); the LB routes the peer's pods and accepts
/// local-source packets from both nodes (a VPC does not validate sources the way a Linux
/// router does).
fn set_peer_node(on: bool) -> Result<()> {
    let bound = peer_node()?;
    let vip = format!("{VIP}/32");
    let pod = format!("{PEER_POD_IP}/32");
    if on && !bound {
        ip(NS_PEER, &["addr", "add", &vip, "dev", "lo"])?;
        ip(NS_PEER, &["addr", "add", &pod, "dev", "lo"])?;
        ip(
            NS_LB,
            &["route", "replace", PEER_POD_CIDR, "via", "198.18.1.2"],
        )?;
        let to = format!("{PEER_POD_IP}:{NODE_PORT}");
        let rules = format!(
            r#"*nat
:{ETP_CHAIN} - [0:0]
-A OUTPUT -m comment --comment "{ETP_JUMP}" -j {ETP_CHAIN}
-A {ETP_CHAIN} -d {VIP}/32 -p tcp -m tcp --dport {VIP_ETP_CLUSTER_PORT} -m comment --comment "ETP Cluster: masquerade" -j KUBE-MARK-MASQ
-A {ETP_CHAIN} -d {VIP}/32 -p tcp -m tcp --dport {VIP_ETP_LOCAL_PORT} -m comment --comment "ETP Local, no local endpoint" -j DNAT --to-destination {to}
-A {ETP_CHAIN} -d {VIP}/32 -p tcp -m tcp --dport {VIP_ETP_CLUSTER_PORT} -m comment --comment "ETP Cluster" -j DNAT --to-destination {to}
COMMIT
"#
        );
        restore_rules(NS_NODE, "iptables-restore", &rules)
            .context("loading the peer-node rules into clb-node")?;
    } else if !on && bound {
        ip(NS_PEER, &["addr", "del", &vip, "dev", "lo"])?;
        ip(NS_PEER, &["addr", "del", &pod, "dev", "lo"])?;
        ip(NS_LB, &["route", "del", PEER_POD_CIDR])?;
        remove_chain(NS_NODE, "nat", "OUTPUT", ETP_JUMP, ETP_CHAIN)?;
    }
    let v = u8::from(on);
    sysctl(
        NS_LB,
        &[
            format!("net.ipv4.conf.vpeer.accept_local={v}"),
            format!("net.ipv4.conf.vnode.accept_local={v}"),
        ],
    )
}

fn peer_node() -> Result<bool> {
    let out = ip(NS_PEER, &["-4", "-o", "addr", "show", "dev", "lo"])?;
    Ok(out.contains(&format!("{VIP}/32")))
}

/// VIP:80 served locally: the KUBE-SERVICES rule (iptables mode) or the IPVS virtual
/// service (IPVS mode).
pub(crate) fn vip_rule_present() -> bool {
    match node_mode() {
        Ok(KubeProxyMode::Ipvs) => ipvs_has_service(SocketAddrV4::new(VIP, SERVICE_PORT)),
        Ok(KubeProxyMode::Nftables) => super::nft::lb_ip_short_circuited(),
        _ => has_rule("KUBE-SERVICES", &lb_ip_rule(VIP_CIDR, KUBE_EXT_CHAIN)),
    }
}
