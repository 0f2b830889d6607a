//! Building, reading and tearing down the namespaces.

use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::cmd::{
    exec, ip, iptables, iptables_ok, run, run_detached, run_stdin, sysctl, sysctl_read,
};
use super::*;

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

/// A server the lab runs: (namespace, port, name it answers with).
pub const SERVERS: &[(&str, u16, &str)] = &[
    (NS_POD_B, POD_PORT, "pod-b web 198.19.1.11:8080"),
    (NS_PEER, NODE_PORT, "peer node 198.18.1.2:30080"),
    (NS_PEER, PEER_TLS_PORT, "outside backend 198.18.1.2:30443"),
    (
        NS_NODE,
        HOST_LISTENER_PORT,
        "node host listener 198.18.0.2:6443",
    ),
];

/// The argument that marks a lab server's command line.
pub(crate) const SERVER_TAG: &str = "clb-lab-server";

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

// A tiny threaded TCP server: reads one line, answers with its name, closes.
const SERVER_PY: &str = r#"
import socket, sys, threading
name, port = sys.argv[2], int(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen(128)
def serve(c):
    try:
        c.settimeout(3)
        c.recv(256)
        c.sendall(("ok from %s\n" % name).encode())
    except Exception:
        pass
    finally:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

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
    let deadline = Instant::now() + Duration::from_secs(3);
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
pub(crate) fn remove_namespaces(names: &[&str]) -> Result<()> {
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

/// Cilium's host interface (mode `cilium`).
pub const CILIUM_HOST: &str = "cilium_host";

/// The node's kube-proxy mode, from its nat table (`cilium`: from Cilium's interface): only the IPVS mode's rules have the
/// `KUBE-NODE-PORT` chain (kube-ipvs0's link type is no proof: tests recreate it).
pub(crate) fn node_mode() -> Result<KubeProxyMode> {
    Ok(
        if super::cmd::succeeds(&["ip", "-n", NS_NODE, "link", "show", CILIUM_HOST]) {
            KubeProxyMode::Cilium
        } else if super::nft::present() {
            KubeProxyMode::Nftables
        } else if iptables_ok(NS_NODE, &["-t", "nat", "-S", "KUBE-NODE-PORT"]) {
            KubeProxyMode::Ipvs
        } else {
            KubeProxyMode::Iptables
        },
    )
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
    ip(
        NS_LB,
        &[
            "neigh",
            "replace",
            "198.18.0.2",
            "lladdr",
            mac.trim(),
            "dev",
            "vnode",
            "nud",
            "permanent",
        ],
    )?;
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
    run_stdin(
        &[
            "ip",
            "netns",
            "exec",
            NS_NODE,
            "iptables-restore",
            "-w",
            "--noflush",
        ],
        &rules,
    )
    .with_context(|| format!("loading kube-proxy's {mode:?}-mode rules into clb-node"))?;
    if mode == KubeProxyMode::Ipvs {
        for vs in KubeProxyMode::Ipvs.virtual_services(false) {
            ipvs_service(vs, true)?;
        }
        ipvs_udp_nodeport()?;
    }
    checkpoint("kube-proxy", opts)?;

    run_stdin(
        &[
            "ip",
            "netns",
            "exec",
            NS_LB,
            "iptables-restore",
            "-w",
            "--noflush",
        ],
        &lb_rules(),
    )
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

/// kube-proxy (iptables mode) nat rules for `default/web` port `http`, as kube-proxy writes them.
/// The chain hashes are kube-proxy's own: base32(sha256("default/web:http" + "tcp"))[:16], and
/// for the endpoint chain the same with "198.19.1.11:8080" appended.
fn kube_proxy_rules() -> String {
    format!(
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:{svc} - [0:0]
:{ext} - [0:0]
:{sep} - [0:0]
:{masq} - [0:0]
:KUBE-EXT-CLBLABDNSUDP0001 - [0:0]
:KUBE-SVC-CLBLABDNSUDP0001 - [0:0]
:KUBE-SEP-CLBLABDNSUDP0001 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -m comment --comment "clb-lab: pod egress masquerade (variant masquerade)" -j {masq}
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 198.18.100.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j {svc}
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j {ext}
-A {ext} -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ
-A {ext} -j {svc}
-A {svc} ! -s {cluster_cidr} -d 198.18.100.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A {svc} -m comment --comment "default/web:http -> 198.19.1.11:8080" -j {sep}
-A {sep} -s 198.19.1.11/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
-A {sep} -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 198.19.1.11:8080
-A KUBE-NODEPORTS -p udp -m comment --comment "default/dns:dns" -m udp --dport 30053 -j KUBE-EXT-CLBLABDNSUDP0001
-A KUBE-EXT-CLBLABDNSUDP0001 -m comment --comment "masquerade traffic for default/dns:dns external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-CLBLABDNSUDP0001 -j KUBE-SVC-CLBLABDNSUDP0001
-A KUBE-SVC-CLBLABDNSUDP0001 -m comment --comment "default/dns:dns -> 198.19.1.11:5353" -j KUBE-SEP-CLBLABDNSUDP0001
-A KUBE-SEP-CLBLABDNSUDP0001 -p udp -m comment --comment "default/dns:dns" -m udp -j DNAT --to-destination 198.19.1.11:5353
COMMIT
"#,
        svc = KUBE_SVC_CHAIN,
        ext = KUBE_EXT_CHAIN,
        sep = KUBE_SEP_CHAIN,
        masq = MASQ_CHAIN,
        cluster_cidr = CLUSTER_CIDR,
    )
}

/// The lab's pod-egress masquerade chain alone (nftables mode: kube-proxy's rules are in
/// nftables, a CNI's masquerade often still in iptables).
fn lab_masq_chain() -> String {
    format!(
        "*nat\n:{masq} - [0:0]\n-A POSTROUTING -m comment --comment \"clb-lab: pod egress \
         masquerade (variant masquerade)\" -j {masq}\nCOMMIT\n",
        masq = MASQ_CHAIN
    )
}

/// kube-proxy's IPVS-mode ipsets for `default/web` (what `ipset save` shows on such a node):
/// ClusterIP,proto:port; LB ingress IPs (kube-proxy lists every one, bound or not); NodePorts;
/// the endpoint-to-itself hairpin set (an entry per local endpoint: pod-b's TCP web port and
/// its UDP DNS port, the UDP NodePort's real server); and, `default/web` having externalTrafficPolicy Local,
/// its NodePort and LB ingress in the `-LOCAL` sets (whose rules RETURN before
/// KUBE-MARK-MASQ: pod traffic to the LB IP leaves unmasqueraded, reference 002).
fn kube_proxy_ipsets() -> String {
    format!(
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
         add KUBE-CLUSTER-IP {CLUSTER_IP},tcp:{SERVICE_PORT}\n\
         create {LB_SET} hash:ip,port family inet hashsize 1024 maxelem 65536\n\
         add {LB_SET} {VIP},tcp:{SERVICE_PORT}\n\
         create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n\
         add KUBE-NODE-PORT-TCP {NODE_PORT}\n\
         create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536\n\
         add KUBE-LOOP-BACK {POD_B_IP},tcp:{POD_PORT},{POD_B_IP}\n\
         add KUBE-LOOP-BACK {POD_B_IP},udp:{POD_UDP_PORT},{POD_B_IP}\n\
         create {LB_LOCAL_SET} hash:ip,port family inet hashsize 1024 maxelem 65536\n\
         add {LB_LOCAL_SET} {VIP},tcp:{SERVICE_PORT}\n\
         create {NODE_PORT_LOCAL_SET} bitmap:port range 0-65535\n\
         add {NODE_PORT_LOCAL_SET} {NODE_PORT}\n"
    )
}

/// IPVS mode's sets of LB ingress IP:ports and NodePorts with externalTrafficPolicy Local.
pub const LB_LOCAL_SET: &str = "KUBE-LOAD-BALANCER-LOCAL";
pub const NODE_PORT_LOCAL_SET: &str = "KUBE-NODE-PORT-LOCAL-TCP";

/// The ipset of LB ingress IPs (kube-proxy IPVS mode).
const LB_SET: &str = "KUBE-LOAD-BALANCER";

/// kube-proxy (IPVS mode) nat rules, as kube-proxy 1.30 writes them (`iptables-save -t nat`
/// of such a node, trimmed to what `default/web` uses), plus the lab's masquerade chain. No
/// DNAT: IPVS rewrites the destination at LOCAL_IN; these rules only mark what must be
/// masqueraded on the way out.
fn kube_proxy_ipvs_rules() -> String {
    format!(
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:{masq} - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -m comment --comment "clb-lab: pod egress masquerade (variant masquerade)" -j {masq}
-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set {lb_local} dst,dst -j RETURN
-A KUBE-LOAD-BALANCER -m comment --comment "mark MASQ for external traffic policy not local" -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set {np_local} dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES ! -s {cluster_cidr} -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set {lb} dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set {lb} dst,dst -j ACCEPT
COMMIT
"#,
        masq = MASQ_CHAIN,
        lb = LB_SET,
        lb_local = LB_LOCAL_SET,
        np_local = NODE_PORT_LOCAL_SET,
        cluster_cidr = CLUSTER_CIDR,
    )
}

/// Adds (or deletes) the IPVS virtual service `vs` (scheduler rr) with pod-b:8080 as its one
/// masqueraded real server, as kube-proxy does (`ipvsadm -A -t ... -s rr; -a ... -m`).
fn ipvs_service(vs: SocketAddrV4, on: bool) -> Result<()> {
    let vs = vs.to_string();
    if on {
        exec(NS_NODE, &["ipvsadm", "-A", "-t", &vs, "-s", IPVS_SCHEDULER])?;
        let rs = format!("{POD_B_IP}:{POD_PORT}");
        exec(
            NS_NODE,
            &["ipvsadm", "-a", "-t", &vs, "-r", &rs, "-m", "-w", "1"],
        )
        .map(drop)
    } else {
        exec(NS_NODE, &["ipvsadm", "-D", "-t", &vs]).map(drop)
    }
}

/// IPVS mode: `default/dns`'s UDP NodePort, a UDP virtual service on the node IP with
/// pod-b:5353 as its masqueraded real server.
fn ipvs_udp_nodeport() -> Result<()> {
    let vs = SocketAddrV4::new(NODE_IP, NODE_PORT_UDP).to_string();
    let rs = format!("{POD_B_IP}:{POD_UDP_PORT}");
    exec(NS_NODE, &["ipvsadm", "-A", "-u", &vs, "-s", IPVS_SCHEDULER])?;
    exec(
        NS_NODE,
        &["ipvsadm", "-a", "-u", &vs, "-r", &rs, "-m", "-w", "1"],
    )
    .map(drop)
}

fn ipvs_has_service(vs: SocketAddrV4) -> bool {
    super::cmd::succeeds(&[
        "ip",
        "netns",
        "exec",
        NS_NODE,
        "ipvsadm",
        "-Ln",
        "-t",
        &vs.to_string(),
    ])
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

/// The KUBE-SERVICES rule that serves the VIP:80 locally (what binding the VIP to kube-ipvs0
/// gives IPVS mode; kube-proxy's iptables mode writes it for a LB ingress IP).
const VIP_RULE: &[&str] = &[
    "-d",
    "203.0.113.10/32",
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
    KUBE_EXT_CHAIN,
];

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
            ensure_rule("KUBE-SERVICES", VIP_RULE, on, true)
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

fn set_variants_in(mode: KubeProxyMode, v: &Variants) -> Result<()> {
    set_variant_in(mode, Variant::VipBound, v.vip_bound)?;
    set_variant_in(mode, Variant::RpFilter, v.rp_filter)?;
    set_variant_in(mode, Variant::Masquerade, v.masquerade)?;
    set_variant_in(mode, Variant::IpvsFilter, v.ipvs_filter)?;
    set_variant_in(mode, Variant::PeerNode, v.peer_node)?;
    set_variant_in(mode, Variant::VipLocalRoute, v.vip_local_route)?;
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
        ip(
            NS_NODE,
            &[
                "link",
                "set",
                "vpod-b",
                "type",
                "bridge_slave",
                "hairpin",
                "off",
            ],
        )?;
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
    ip(
        NS_NODE,
        &[
            "link",
            "set",
            "vpod-b",
            "type",
            "bridge_slave",
            "hairpin",
            if on { "on" } else { "off" },
        ],
    )
    .map(drop)
}

/// kube-proxy's IPVS access filter chain (filter table).
pub const IPVS_FILTER_CHAIN: &str = "KUBE-IPVS-FILTER";

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
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j {chain}
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
        run_stdin(
            &[
                "ip",
                "netns",
                "exec",
                NS_NODE,
                "iptables-restore",
                "-w",
                "--noflush",
            ],
            &rules,
        )
        .context("loading the IPVS access filter rules")?;
    }
    if !on && present {
        let jump = [
            "-t",
            "filter",
            "-D",
            "INPUT",
            "-m",
            "comment",
            "--comment",
            "kubernetes ipvs access filter",
            "-j",
            IPVS_FILTER_CHAIN,
        ];
        while iptables_ok(NS_NODE, &jump) {}
        iptables(NS_NODE, &["-t", "filter", "-F", IPVS_FILTER_CHAIN])?;
        iptables(NS_NODE, &["-t", "filter", "-X", IPVS_FILTER_CHAIN])?;
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
-A OUTPUT -m comment --comment "clb-lab: ETP services with their endpoint on the peer (variant peer-node)" -j {ETP_CHAIN}
-A {ETP_CHAIN} -d {VIP}/32 -p tcp -m tcp --dport {VIP_ETP_CLUSTER_PORT} -m comment --comment "ETP Cluster: masquerade" -j KUBE-MARK-MASQ
-A {ETP_CHAIN} -d {VIP}/32 -p tcp -m tcp --dport {VIP_ETP_LOCAL_PORT} -m comment --comment "ETP Local, no local endpoint" -j DNAT --to-destination {to}
-A {ETP_CHAIN} -d {VIP}/32 -p tcp -m tcp --dport {VIP_ETP_CLUSTER_PORT} -m comment --comment "ETP Cluster" -j DNAT --to-destination {to}
COMMIT
"#
        );
        run_stdin(
            &[
                "ip",
                "netns",
                "exec",
                NS_NODE,
                "iptables-restore",
                "-w",
                "--noflush",
            ],
            &rules,
        )
        .context("loading the peer-node rules into clb-node")?;
    } else if !on && bound {
        ip(NS_PEER, &["addr", "del", &vip, "dev", "lo"])?;
        ip(NS_PEER, &["addr", "del", &pod, "dev", "lo"])?;
        ip(NS_LB, &["route", "del", PEER_POD_CIDR])?;
        let jump = [
            "-t",
            "nat",
            "-D",
            "OUTPUT",
            "-m",
            "comment",
            "--comment",
            "clb-lab: ETP services with their endpoint on the peer (variant peer-node)",
            "-j",
            ETP_CHAIN,
        ];
        while iptables_ok(NS_NODE, &jump) {}
        iptables(NS_NODE, &["-t", "nat", "-F", ETP_CHAIN])?;
        iptables(NS_NODE, &["-t", "nat", "-X", ETP_CHAIN])?;
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
        _ => has_rule("KUBE-SERVICES", VIP_RULE),
    }
}

fn start_server(ns: &str, port: u16, name: &str) -> Result<()> {
    // `setsid -f` forks: the server is nobody's child here, lives on after the CLI exits, and is
    // found again by `ip netns pids` on `down`.
    let port = port.to_string();
    let argv = [
        "ip",
        "netns",
        "exec",
        ns,
        "setsid",
        "-f",
        "python3",
        "-c",
        SERVER_PY,
        "clb-lab-server",
        name,
        &port,
    ];
    run_detached(&argv).with_context(|| format!("starting the server {name} in {ns}"))
}

fn start_udp_server(ns: &str, port: u16, name: &str) -> Result<()> {
    let port = port.to_string();
    let argv = [
        "ip",
        "netns",
        "exec",
        ns,
        "setsid",
        "-f",
        "python3",
        "-c",
        super::udp::UDP_SERVER_PY,
        SERVER_TAG,
        name,
        &port,
    ];
    run_detached(&argv).with_context(|| format!("starting the UDP server {name} in {ns}"))
}

fn wait_udp_bound(ns: &str, port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while exec(ns, &["ss", "-Hlun", &format!("sport = :{port}")])?
        .trim()
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!("no UDP server on port {port} in {ns} 5 s after starting it");
        }
        sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub(crate) fn listening(ns: &str, port: u16) -> Result<bool> {
    let out = exec(ns, &["ss", "-Hltn", &format!("sport = :{port}")])?;
    Ok(!out.trim().is_empty())
}

/// How long a started server may take to listen: python3's start-up under the VM tier's
/// emulated CPU on a loaded machine took more than 5 s.
const SERVER_START: Duration = Duration::from_secs(30);

fn wait_listening(ns: &str, port: u16) -> Result<()> {
    let deadline = Instant::now() + SERVER_START;
    while !listening(ns, port)? {
        if Instant::now() > deadline {
            bail!(
                "no server listens on port {port} in {ns} {} s after starting it",
                SERVER_START.as_secs()
            );
        }
        sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub(crate) fn addresses(ns: &str) -> Result<Vec<String>> {
    Ok(ip(ns, &["-4", "-br", "addr", "show"])?
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect())
}
