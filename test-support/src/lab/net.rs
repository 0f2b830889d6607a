//! Building, reading and tearing down the namespaces: the links, addresses and sysctls of
//! every namespace, the LB's rules, and the order of `up`'s steps.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{
    CLUSTER_IP, FAIL_AFTER_ENV, KUBE_IPVS0, KubeProxyMode, MODE_ENV, NAMESPACES, NODE_NIC,
    NS_CLIENT, NS_LB, NS_NODE, NS_PEER, NS_POD_A, NS_POD_B, POD_BRIDGE, POD_CIDR, SERVERS,
    UpOptions, Variants,
    cmd::{exec, ip, neigh_permanent, restore_rules, run, run_stdin, sysctl},
    kube_proxy::{
        CILIUM_HOST, ipvs_service, ipvs_udp_nodeport, kube_proxy_ipsets, kube_proxy_ipvs_rules,
        kube_proxy_rules, lab_masq_chain,
    },
    servers::{start_server, start_udp_server, wait_listening, wait_udp_bound},
    switch::set_variants_in,
};

/// The steps of `up`, in order (names accepted by [`UpOptions::fail_after`]).
pub const UP_STEPS: &[&str] = &[
    "namespaces",
    "links",
    "addresses",
    "sysctls",
    "kube-proxy",
    "lb",
    "variants",
    "servers",
];

/// Interface names the lab creates (only ever inside lab namespaces).
pub(crate) const LAB_LINKS: &[&str] =
    &["vnode", "vpeer", "vclient", "vpod-a", "vpod-b", POD_BRIDGE];

/// Interfaces of each namespace (besides `lo`), for per-interface sysctls and `status`.
const IFACES: &[(&str, &[&str])] = &[
    (NS_NODE, &[NODE_NIC, "vpod-a", "vpod-b", KUBE_IPVS0]),
    (NS_LB, &["vnode", "vpeer", "vclient"]),
    (NS_PEER, &["eth0"]),
    (NS_POD_A, &["eth0"]),
    (NS_POD_B, &["eth0"]),
    (NS_CLIENT, &["eth0"]),
];

pub(crate) fn existing_namespaces() -> Result<Vec<String>> {
    Ok(run(&["ip", "netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

pub(crate) fn require_up() -> Result<()> {
    let have = existing_namespaces()?;
    let missing: Vec<_> = NAMESPACES
        .iter()
        .filter(|n| !have.iter().any(|h| h == *n))
        .collect();
    if !missing.is_empty() {
        bail!("the lab is not up (missing namespaces {missing:?}); run `cargo xtask lab up`");
    }
    Ok(())
}

fn pids_in(ns: &str) -> Result<Vec<i32>> {
    Ok(run(&["ip", "netns", "pids", ns])?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

/// Kills every process in `ns`, waits until they are gone, deletes the namespace.
fn remove_namespace(ns: &str) -> Result<()> {
    let me = std::process::id() as i32;
    let deadline = Instant::now() + crate::patient(Duration::from_secs(3));
    loop {
        let pids: Vec<i32> = pids_in(ns)?.into_iter().filter(|p| *p != me).collect();
        if pids.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("processes {pids:?} in netns {ns} survive SIGKILL");
        }
        for pid in pids {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        sleep(Duration::from_millis(50));
    }
    run(&["ip", "netns", "del", ns]).map(drop)
}

/// Removes the given namespaces (those that exist), reporting every failure.
pub fn remove_namespaces(names: &[&str]) -> Result<()> {
    let have = existing_namespaces()?;
    let mut errors = Vec::new();
    for ns in names.iter().rev() {
        if have.iter().any(|h| h == ns)
            && let Err(e) = remove_namespace(ns)
        {
            errors.push(format!("{e:#}"));
        }
    }
    if !errors.is_empty() {
        bail!("lab teardown incomplete: {}", errors.join("; "));
    }
    Ok(())
}

fn checkpoint(step: &str, opts: &UpOptions) -> Result<()> {
    if opts.fail_after.as_deref() == Some(step) {
        bail!("injected failure after step `{step}` ({FAIL_AFTER_ENV})");
    }
    Ok(())
}

/// IPVS mode's kernel and tool requirements, checked before anything is made: loads `ip_vs`,
/// `ip_vs_rr`, `dummy`, `ip_set` and `xt_set` when `modprobe` can, then fails with one message
/// naming everything that is missing.
pub(crate) fn require_ipvs_support() -> Result<()> {
    let _ = std::process::Command::new("modprobe")
        .args(["-a", "-q", "ip_vs", "ip_vs_rr", "dummy", "ip_set", "xt_set"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    let mut missing = Vec::new();
    // Once ip_vs is loaded (or built in), every namespace has /proc/net/ip_vs.
    if !std::path::Path::new("/proc/net/ip_vs").exists() {
        missing.push("the kernel's IPVS (ip_vs: no /proc/net/ip_vs)");
    }
    if !std::path::Path::new("/sys/module/dummy").exists() {
        missing.push("the kernel's `dummy` link driver");
    }
    for tool in ["ipvsadm", "ipset"] {
        if !super::cmd::succeeds(&["sh", "-c", &format!("command -v {tool}")]) {
            missing.push(if tool == "ipvsadm" {
                "the `ipvsadm` command"
            } else {
                "the `ipset` command"
            });
        }
    }
    if !missing.is_empty() {
        let release = run(&["uname", "-r"]).unwrap_or_default();
        bail!(
            "{MODE_ENV}=ipvs: this machine lacks {} (kernel {}). The IPVS-mode lab runs in the \
             VM tier (`cargo xtask vm-test`, Debian's kernel with IPVS and dummy); use the \
             iptables mode here",
            missing.join(", "),
            release.trim()
        );
    }
    Ok(())
}

/// Builds the lab; every namespace it creates is pushed to `created` (for the rollback).
pub(crate) fn build(
    mode: KubeProxyMode,
    v: &Variants,
    opts: &UpOptions,
    created: &mut Vec<&'static str>,
) -> Result<()> {
    if let Some(step) = &opts.fail_after
        && !UP_STEPS.contains(&step.as_str())
    {
        bail!("{FAIL_AFTER_ENV}={step}: unknown step; steps are {UP_STEPS:?}");
    }
    // namespaces
    for ns in NAMESPACES {
        run(&["ip", "netns", "add", ns]).with_context(|| format!("creating namespace {ns}"))?;
        created.push(ns);
        // Defaults first, so interfaces made later inherit them (IPv4 devconf is otherwise
        // inherited from the host's).
        sysctl(
            ns,
            &[
                "net.ipv4.conf.default.rp_filter=0".into(),
                "net.ipv4.conf.all.rp_filter=0".into(),
                "net.ipv4.conf.default.send_redirects=0".into(),
                "net.ipv4.conf.all.send_redirects=0".into(),
                "net.ipv4.conf.lo.rp_filter=0".into(),
                "net.ipv4.ip_forward=0".into(),
            ],
        )?;
        ip(ns, &["link", "set", "lo", "up"])?;
    }
    checkpoint("namespaces", opts)?;

    // links: every veth is created inside a lab namespace with its peer put straight into the
    // other one, so nothing ever appears in the host's namespace.
    let veth = |a: &str, a_if: &str, b: &str, b_if: &str| {
        ip(
            a,
            &[
                "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b,
            ],
        )
    };
    veth(NS_LB, "vnode", NS_NODE, NODE_NIC)?;
    veth(NS_LB, "vpeer", NS_PEER, "eth0")?;
    veth(NS_LB, "vclient", NS_CLIENT, "eth0")?;
    veth(NS_NODE, "vpod-a", NS_POD_A, "eth0")?;
    veth(NS_NODE, "vpod-b", NS_POD_B, "eth0")?;
    // kube-ipvs0: in iptables mode a stand-in, a bridge with no ports, left DOWN like
    // kube-proxy leaves its dummy (addresses on it still get their `local` routes in table
    // local); in IPVS mode the real thing, a dummy, also left down.
    // kube-proxy's nftables mode makes no such interface.
    let kind = match mode {
        KubeProxyMode::Iptables => Some("bridge"),
        KubeProxyMode::Ipvs => Some("dummy"),
        KubeProxyMode::Nftables | KubeProxyMode::Cilium => None,
    };
    if let Some(kind) = kind {
        ip(NS_NODE, &["link", "add", KUBE_IPVS0, "type", kind])?;
    }
    if mode == KubeProxyMode::Cilium {
        // Cilium's host veth pair (cilium_host carries the node's router IP on real nodes).
        ip(
            NS_NODE,
            &[
                "link",
                "add",
                CILIUM_HOST,
                "type",
                "veth",
                "peer",
                "name",
                "cilium_net",
            ],
        )?;
    }
    checkpoint("links", opts)?;

    // addresses and routes
    let addr = |ns: &str, dev: &str, cidr: &str| -> Result<()> {
        ip(ns, &["addr", "add", cidr, "dev", dev])?;
        ip(ns, &["link", "set", dev, "up"]).map(drop)
    };
    addr(NS_LB, "vnode", "198.18.0.1/24")?;
    addr(NS_LB, "vpeer", "198.18.1.1/24")?;
    addr(NS_LB, "vclient", "198.51.100.1/24")?;
    addr(NS_LB, "lo", "203.0.113.10/32")?;
    // Pod IPs are routable in the "VPC" (that is what lets the hairpin happen at all).
    ip(NS_LB, &["route", "add", POD_CIDR, "via", "198.18.0.2"])?;
    addr(NS_NODE, NODE_NIC, "198.18.0.2/24")?;
    if mode == KubeProxyMode::Ipvs {
        // kube-proxy binds every ClusterIP to kube-ipvs0 (and leaves the link down).
        ip(
            NS_NODE,
            &[
                "addr",
                "add",
                &format!("{CLUSTER_IP}/32"),
                "dev",
                KUBE_IPVS0,
            ],
        )?;
    }
    ip(NS_NODE, &["route", "add", "default", "via", "198.18.0.1"])?;
    for (dev, pod_ns, pod_ip) in [
        ("vpod-a", NS_POD_A, "198.19.1.10"),
        ("vpod-b", NS_POD_B, "198.19.1.11"),
    ] {
        addr(NS_NODE, dev, "198.19.1.1/32")?;
        ip(NS_NODE, &["route", "add", pod_ip, "dev", dev])?;
        addr(pod_ns, "eth0", &format!("{pod_ip}/32"))?;
        ip(
            pod_ns,
            &[
                "route",
                "add",
                "default",
                "via",
                "198.19.1.1",
                "dev",
                "eth0",
                "onlink",
            ],
        )?;
    }
    addr(NS_PEER, "eth0", "198.18.1.2/24")?;
    ip(NS_PEER, &["route", "add", "default", "via", "198.18.1.1"])?;
    addr(NS_CLIENT, "eth0", "198.51.100.10/24")?;
    ip(
        NS_CLIENT,
        &["route", "add", "default", "via", "198.51.100.1"],
    )?;
    // The LB's health checks come from the VIP; its ARP for the node would be martian on a node
    // that binds the VIP, so the LB knows the node's MAC statically.
    let mac = exec(NS_NODE, &["cat", "/sys/class/net/eth0/address"])?;
    neigh_permanent(NS_LB, "198.18.0.2", mac.trim(), "vnode")?;
    checkpoint("addresses", opts)?;

    // sysctls
    for (ns, ifaces) in IFACES {
        let forward = matches!(*ns, NS_NODE | NS_LB);
        let mut s = vec![format!("net.ipv4.ip_forward={}", u8::from(forward))];
        for i in ifaces
            .iter()
            .filter(|i| {
                !(matches!(mode, KubeProxyMode::Nftables | KubeProxyMode::Cilium)
                    && **i == KUBE_IPVS0)
            })
            .chain(&["all", "lo"])
        {
            s.push(format!("net.ipv4.conf.{i}.rp_filter=0"));
            s.push(format!("net.ipv4.conf.{i}.send_redirects=0"));
        }
        if *ns == NS_NODE {
            s.push("net.ipv4.conf.all.log_martians=1".into());
            if mode == KubeProxyMode::Ipvs {
                // What kube-proxy's IPVS mode sets: conntrack for IPVS connections (iptables
                // masquerade of IPVS-NATed packets needs it), and ARP only for addresses of the
                // asking interface (so kube-ipvs0's addresses are never announced).
                for k in [
                    "net.ipv4.vs.conntrack=1",
                    "net.ipv4.vs.conn_reuse_mode=0",
                    "net.ipv4.vs.expire_nodest_conn=1",
                    "net.ipv4.vs.expire_quiescent_template=1",
                    "net.ipv4.conf.all.arp_ignore=1",
                    "net.ipv4.conf.all.arp_announce=2",
                ] {
                    s.push(k.into());
                }
            }
        }
        sysctl(ns, &s)?;
    }
    checkpoint("sysctls", opts)?;

    // kube-proxy's nat rules for the mode (IPVS mode's rules match on its ipsets: those first).
    let rules = match mode {
        KubeProxyMode::Iptables => kube_proxy_rules(),
        KubeProxyMode::Nftables => {
            super::nft::load()?;
            // The lab's own pod-egress masquerade chain stays in iptables (as a CNI's would).
            lab_masq_chain()
        }
        // No kube-proxy: only the lab's (a CNI's) masquerade chain.
        KubeProxyMode::Cilium => lab_masq_chain(),
        KubeProxyMode::Ipvs => {
            run_stdin(
                &["ip", "netns", "exec", NS_NODE, "ipset", "restore"],
                &kube_proxy_ipsets(),
            )
            .context("loading kube-proxy's ipsets into clb-node")?;
            kube_proxy_ipvs_rules()
        }
    };
    restore_rules(NS_NODE, "iptables-restore", &rules)
        .with_context(|| format!("loading kube-proxy's {mode:?}-mode rules into clb-node"))?;
    if mode == KubeProxyMode::Ipvs {
        for vs in KubeProxyMode::Ipvs.virtual_services(false) {
            ipvs_service(vs, true)?;
        }
        ipvs_udp_nodeport()?;
    }
    checkpoint("kube-proxy", opts)?;

    restore_rules(NS_LB, "iptables-restore", &lb_rules())
        .context("loading the LB's rules into clb-lb")?;
    checkpoint("lb", opts)?;

    set_variants_in(mode, v)?;
    checkpoint("variants", opts)?;

    for (ns, port, name) in SERVERS {
        start_server(ns, *port, name)?;
    }
    for (ns, port, _) in SERVERS {
        wait_listening(ns, *port)?;
    }
    // After the TCP servers are up: on a slow machine (the VM tier's emulated CPU) another
    // interpreter starting alongside them delays them past their wait.
    for (ns, port, name) in super::UDP_SERVERS {
        start_udp_server(ns, *port, name)?;
    }
    for (ns, port, _) in super::UDP_SERVERS {
        wait_udp_bound(ns, *port)?;
    }
    checkpoint("servers", opts)?;
    Ok(())
}

/// The cloud LB: DNAT without SNAT, with the guard that never sends a request back to the node
/// that is its source.
fn lb_rules() -> String {
    r#"*nat
:CLB-LB-VIP - [0:0]
-A PREROUTING -d 203.0.113.10/32 -m comment --comment "clb-lab: LB listeners on the VIP" -j CLB-LB-VIP
-A CLB-LB-VIP -s 198.18.0.2/32 -p tcp -m tcp --dport 80 -m comment --comment "listener 80: never back to the source node" -j DNAT --to-destination 198.18.1.2:30080
-A CLB-LB-VIP -p tcp -m tcp --dport 80 -m comment --comment "listener 80 -> node NodePort, client IP kept" -j DNAT --to-destination 198.18.0.2:30080
-A CLB-LB-VIP -p tcp -m tcp --dport 443 -m comment --comment "listener 443 -> outside backend" -j DNAT --to-destination 198.18.1.2:30443
-A CLB-LB-VIP -p tcp -m tcp --dport 8081 -m comment --comment "listener 8081 -> node NodePort, client IP kept, no source-node guard" -j DNAT --to-destination 198.18.0.2:30080
-A CLB-LB-VIP -p tcp -m tcp --dport 8082 -m comment --comment "listener 8082 -> pod-b directly (LB to pod), client IP kept" -j DNAT --to-destination 198.19.1.11:8080
-A CLB-LB-VIP -p tcp -m tcp --dport 6443 -m comment --comment "listener 6443 -> the node's own host listener (instance target), client IP kept, no source-node guard" -j DNAT --to-destination 198.18.0.2:6443
-A CLB-LB-VIP -p udp -m udp --dport 53 -m comment --comment "listener 53/udp -> node UDP NodePort, client IP kept" -j DNAT --to-destination 198.18.0.2:30053
COMMIT
"#
    .to_string()
}

pub(crate) fn addresses(ns: &str) -> Result<Vec<String>> {
    Ok(ip(ns, &["-4", "-br", "addr", "show"])?
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect())
}
