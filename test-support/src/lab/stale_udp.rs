//! A stale UDP conntrack entry (issue #51, shape 3; kubernetes#139628): a statsd-like sender
//! in pod A with a fixed source port sends to a ClusterIP whose kube-proxy-shaped rules DNAT
//! it to pod B:8125 (the endpoint that goes away); then the rules move the Service to pod
//! B:8126 (the new endpoint) and nothing deletes the node's conntrack entry, so the sender's
//! datagrams keep going to 8125. Pod B only receives (statsd answers nothing): the entry stays
//! UNREPLIED, as the field's are.
//!
//! The rules are written as kube-proxy's iptables mode writes them, or, on a lab in nftables
//! mode, as its nftables mode does (the chains of the lab's `ip kube-proxy` table), or, on a
//! lab in IPVS mode, as an IPVS virtual service ([`write_ipvs`]).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    IPVS_SCHEDULER, KUBE_IPVS0, KubeProxyMode, NS_NODE, NS_POD_A, NS_POD_B, POD_B_IP,
    cmd::{exec, ip, restore_rules, run_detached, run_stdin},
    in_netns, kube_proxy,
    nft::NFT_TABLE,
    servers::SERVER_TAG,
};

/// The Service's ClusterIP and port (`monitoring/statsd:statsd`, UDP).
pub const STATSD_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 30);
pub const STATSD_PORT: u16 = 8125;
/// Pod B's port that is the endpoint first, and the one it moves to.
pub const OLD_ENDPOINT_PORT: u16 = 8125;
pub const NEW_ENDPOINT_PORT: u16 = 8126;
/// The sender's fixed source port (a statsd client keeps one socket).
pub const SENDER_PORT: u16 = 40125;
/// The Service's name as kube-proxy's rule comments write it.
pub const STATSD_SERVICE: &str = "monitoring/statsd:statsd";

/// kube-proxy's chains for the Service (made-up hashes of kube-proxy's shape).
const SVC_CHAIN: &str = "KUBE-SVC-CLBSTATSDUDP8125";
const OLD_SEP_CHAIN: &str = "KUBE-SEP-CLBSTATSDEPOLD01";
const NEW_SEP_CHAIN: &str = "KUBE-SEP-CLBSTATSDEPNEW01";

/// Pod B's sink: reads datagrams on both ports and answers none (statsd does not).
const SINK_PY: &str = r#"
import select, socket, sys
socks = []
for port in sys.argv[2:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(port)))
    socks.append(s)
while True:
    for s in select.select(socks, [], [])[0]:
        s.recvfrom(2048)
"#;

/// The Service's rules with its endpoint on pod B at `endpoint_port`: the `cluster IP` rule of
/// KUBE-SERVICES (once: `with_service_rule`), the SVC chain (re-declared: flushed) and the
/// endpoint's SEP chain (kubernetes/kubernetes pkg/proxy/iptables/proxier.go).
fn rules(endpoint_port: u16, with_service_rule: bool) -> String {
    let service = IptablesService {
        chains: [SVC_CHAIN, OLD_SEP_CHAIN, NEW_SEP_CHAIN],
        pod_b: POD_B_IP.into(),
        cluster_ip: STATSD_CLUSTER_IP.into(),
    };
    service.rules(endpoint_port, with_service_rule)
}

/// The statsd Service in one family's iptables `nat` table (`iptables`, `ip6tables`): its
/// chains (service, the old endpoint's, the new endpoint's), pod B's and the ClusterIP's
/// addresses in that family.
pub(super) struct IptablesService {
    pub chains: [&'static str; 3],
    pub pod_b: IpAddr,
    pub cluster_ip: IpAddr,
}

impl IptablesService {
    /// `iptables-restore` input for the steps of [`rules`], in this family.
    pub fn rules(&self, endpoint_port: u16, with_service_rule: bool) -> String {
        let [svc, old, new] = self.chains;
        let sep = if endpoint_port == OLD_ENDPOINT_PORT {
            old
        } else {
            new
        };
        let host = if self.pod_b.is_ipv4() { 32 } else { 128 };
        let (cluster_ip, pod_b) = (self.cluster_ip, self.pod_b);
        let to = SocketAddr::new(pod_b, endpoint_port);
        let service_rule = if with_service_rule {
            format!(
                "-A KUBE-SERVICES -d {cluster_ip}/{host} -p udp -m comment --comment \"{STATSD_SERVICE} cluster IP\" -m udp --dport {STATSD_PORT} -j {svc}\n"
            )
        } else {
            String::new()
        };
        format!(
            r#"*nat
:{svc} - [0:0]
:{sep} - [0:0]
{service_rule}-A {svc} -m comment --comment "{STATSD_SERVICE} -> {to}" -j {sep}
-A {sep} -s {pod_b}/{host} -m comment --comment "{STATSD_SERVICE}" -j KUBE-MARK-MASQ
-A {sep} -p udp -m comment --comment "{STATSD_SERVICE}" -m udp -j DNAT --to-destination {to}
COMMIT
"#
        )
    }
}

/// kube-proxy's nftables chains for the Service (`pkg/proxy/nftables/proxier.go`,
/// `hashAndTruncate`: base32(sha256("monitoring/statsd/udp/statsd"))[:8], and for an
/// endpoint the same with "__198.19.1.11/<port>" appended).
const NFT_SVC_CHAIN: &str = "service-XTVCXYO3-monitoring/statsd/udp/statsd";
const NFT_OLD_EP_CHAIN: &str = "endpoint-AMVF5QQN-monitoring/statsd/udp/statsd__198.19.1.11/8125";
const NFT_NEW_EP_CHAIN: &str = "endpoint-YC6ZDBCE-monitoring/statsd/udp/statsd__198.19.1.11/8126";

/// The Service's nftables rules with its endpoint on pod B at `endpoint_port`, as
/// kube-proxy's nftables proxier writes them (`syncProxyRules`): the endpoint's chain, the
/// service chain (flushed and rewritten when the endpoint changes) and, once
/// (`with_service_ip`), the ClusterIP in `cluster-ips` and its `service-ips` element. The old
/// endpoint's chain is flushed (kube-proxy deletes it in a later sync; nothing points at it).
fn nft_rules(endpoint_port: u16, with_service_ip: bool) -> String {
    let service = NftService {
        family: "ip",
        chains: [NFT_SVC_CHAIN, NFT_OLD_EP_CHAIN, NFT_NEW_EP_CHAIN],
        pod_b: POD_B_IP.into(),
        cluster_ip: STATSD_CLUSTER_IP.into(),
    };
    service.rules(endpoint_port, with_service_ip)
}

/// The statsd Service in one family's `kube-proxy` table: its chains (service, the old
/// endpoint's, the new endpoint's), pod B's and the ClusterIP's addresses in that family.
pub(super) struct NftService {
    /// `ip` or `ip6`: the table's family, also the word of its address matches.
    pub family: &'static str,
    pub chains: [&'static str; 3],
    pub pod_b: IpAddr,
    pub cluster_ip: IpAddr,
}

impl NftService {
    /// `nft -f` input for the steps of [`nft_rules`], in this family.
    pub fn rules(&self, endpoint_port: u16, with_service_ip: bool) -> String {
        let (t, f) = (NFT_TABLE, self.family);
        let [svc, old, new] = self.chains;
        let ep = if endpoint_port == OLD_ENDPOINT_PORT {
            old
        } else {
            new
        };
        let mut s = String::new();
        for c in [svc, ep] {
            s += &format!("add chain {f} {t} {c}\nflush chain {f} {t} {c}\n");
        }
        let (pod_b, to) = (self.pod_b, SocketAddr::new(self.pod_b, endpoint_port));
        s += &format!("add rule {f} {t} {ep} {f} saddr {pod_b} jump mark-for-masquerade\n");
        s += &format!("add rule {f} {t} {ep} meta l4proto udp dnat to {to}\n");
        s += &format!("add rule {f} {t} {svc} numgen random mod 1 vmap {{ 0 : goto {ep} }}\n");
        if ep == new {
            s += &format!("flush chain {f} {t} {old}\n");
        }
        if with_service_ip {
            let ip = self.cluster_ip;
            s += &format!("add element {f} {t} cluster-ips {{ {ip} }}\n");
            s += &format!(
                "add element {f} {t} service-ips {{ {ip} . udp . {STATSD_PORT} : goto {svc} }}\n"
            );
        }
        s
    }
}

/// The statsd Service in kube-proxy's IPVS mode (`pkg/proxy/ipvs/proxier.go`, `syncService`
/// and `syncEndpoint`): first (`first`) the ClusterIP in ipset `KUBE-CLUSTER-IP`, a UDP virtual
/// service on it and the ClusterIP bound on kube-ipvs0, with pod B at `endpoint_port` as its
/// masqueraded real server; a move adds the new real server and deletes the old one at once:
/// kube-proxy gives a UDP real server no graceful termination, "existing connections will be
/// deleted on the next packet because sysctlExpireNoDestConn=1"
/// (`pkg/proxy/ipvs/graceful_termination.go`, `deleteRsFunc`). The node's conntrack entries
/// are left as they are.
fn write_ipvs(endpoint_port: u16, first: bool) -> Result<()> {
    let vs = SocketAddrV4::new(STATSD_CLUSTER_IP, STATSD_PORT).to_string();
    let rs = |port: u16| SocketAddrV4::new(POD_B_IP, port).to_string();
    if first {
        let member = format!("{STATSD_CLUSTER_IP},udp:{STATSD_PORT}");
        exec(
            NS_NODE,
            &["ipset", "-exist", "add", "KUBE-CLUSTER-IP", &member],
        )?;
        exec(NS_NODE, &["ipvsadm", "-A", "-u", &vs, "-s", IPVS_SCHEDULER])?;
        let cidr = format!("{STATSD_CLUSTER_IP}/32");
        ip(NS_NODE, &["addr", "add", &cidr, "dev", KUBE_IPVS0])?;
    }
    let new = rs(endpoint_port);
    exec(
        NS_NODE,
        &["ipvsadm", "-a", "-u", &vs, "-r", &new, "-m", "-w", "1"],
    )?;
    if !first {
        let old = rs(OLD_ENDPOINT_PORT);
        exec(NS_NODE, &["ipvsadm", "-d", "-u", &vs, "-r", &old])?;
    }
    Ok(())
}

/// Writes the Service's rules in the node's kube-proxy mode: iptables, nftables or IPVS.
fn write_rules(endpoint_port: u16, first: bool) -> Result<()> {
    match kube_proxy::node_mode()? {
        KubeProxyMode::Iptables => {
            restore_rules(NS_NODE, "iptables-restore", &rules(endpoint_port, first)).map(drop)
        }
        KubeProxyMode::Nftables => run_stdin(
            &["ip", "netns", "exec", NS_NODE, "nft", "-f", "-"],
            &nft_rules(endpoint_port, first),
        )
        .map(drop),
        KubeProxyMode::Ipvs => write_ipvs(endpoint_port, first),
        mode => bail!(
            "the statsd Service's rules are written for kube-proxy's iptables, nftables and \
             IPVS modes, not {}",
            mode.name()
        ),
    }
}

/// Starts pod B's sink on both endpoint ports, each with a counting rule in pod B's `INPUT`
/// ([`delivered`]). Removed with the lab.
pub fn start_sink() -> Result<()> {
    let (old, new) = (OLD_ENDPOINT_PORT.to_string(), NEW_ENDPOINT_PORT.to_string());
    for port in [&old, &new] {
        let rule = ["-p", "udp", "--dport", port.as_str()];
        exec(
            NS_POD_B,
            &[&["iptables", "-w", "-A", "INPUT"][..], &rule].concat(),
        )
        .context("pod B's counting rule")?;
    }
    let argv = [
        "ip", "netns", "exec", NS_POD_B, "setsid", "-f", "python3", "-c", SINK_PY, SERVER_TAG,
        &old, &new,
    ];
    run_detached(&argv).context("starting the statsd sink in pod B")
}

/// Writes the Service's rules with pod B:8125 as its endpoint, in the lab's kube-proxy mode.
pub fn write_service() -> Result<()> {
    write_rules(OLD_ENDPOINT_PORT, true).context("kube-proxy's rules for the statsd Service")
}

/// Starts pod B's sink and writes the Service's rules with pod B:8125 as its endpoint, in the
/// lab's kube-proxy mode (iptables, nftables or IPVS). Removed with the lab.
pub fn serve_statsd() -> Result<()> {
    start_sink()?;
    write_service()
}

/// How many datagrams reached pod B on `port` (its `INPUT` counting rule, [`start_sink`]).
pub fn delivered(port: u16) -> Result<u64> {
    let table = exec(NS_POD_B, &["iptables", "-w", "-nvxL", "INPUT"])?;
    let dpt = format!("udp dpt:{port}");
    table
        .lines()
        .find(|l| l.trim_end().ends_with(&dpt))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("pod B's counting rule for {port}/udp in {table}"))
}

/// The node's IPVS connection table (`ipvsadm -Lnc`).
pub fn ipvs_connections() -> Result<String> {
    exec(NS_NODE, &["ipvsadm", "-Lnc"])
}

/// Moves the Service's endpoint to pod B:8126, as kube-proxy rewrites the chains when the
/// endpoint changes; the node's conntrack entries are left as they are.
pub fn move_endpoint() -> Result<()> {
    write_rules(NEW_ENDPOINT_PORT, false).context("moving the statsd Service's endpoint")
}

/// Scales the Service to zero in the node's kube-proxy mode: iptables (`scale_to_zero_iptables`)
/// or IPVS (`scale_to_zero_ipvs`). The node's conntrack entries are left as they are.
pub fn scale_to_zero() -> Result<()> {
    match kube_proxy::node_mode()? {
        KubeProxyMode::Iptables => scale_to_zero_iptables(),
        KubeProxyMode::Ipvs => scale_to_zero_ipvs(),
        mode => bail!(
            "scale_to_zero writes kube-proxy's iptables- and IPVS-mode rules, not {}",
            mode.name()
        ),
    }
}

/// Scales the Service to zero as kube-proxy's iptables mode writes it
/// (`pkg/proxy/iptables/proxier.go`, `syncProxyRules`: no endpoints, "we will not generate
/// any chains in the "nat" table for the service; only rules in the "filter" table rejecting
/// incoming packets"): its `KUBE-SERVICES` nat rule and chains go, and the filter chain
/// `KUBE-SERVICES` (jumped from `OUTPUT` and `FORWARD` for new connections) REJECTs its
/// ClusterIP:port, "<svc> has no endpoints".
fn scale_to_zero_iptables() -> Result<()> {
    let nat = format!(
        "*nat\n\
         -D KUBE-SERVICES -d {STATSD_CLUSTER_IP}/32 -p udp -m comment --comment \"{STATSD_SERVICE} cluster IP\" -m udp --dport {STATSD_PORT} -j {SVC_CHAIN}\n\
         :{SVC_CHAIN} - [0:0]\n:{OLD_SEP_CHAIN} - [0:0]\n\
         -X {SVC_CHAIN}\n-X {OLD_SEP_CHAIN}\n\
         COMMIT\n"
    );
    restore_rules(NS_NODE, "iptables-restore", &nat).context("the statsd Service's nat rules")?;
    let portals = "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES";
    let filter = format!(
        "*filter\n\
         :KUBE-SERVICES - [0:0]\n\
         -I OUTPUT 1 {portals}\n\
         -I FORWARD 1 {portals}\n\
         -A KUBE-SERVICES -d {STATSD_CLUSTER_IP}/32 -p udp -m comment --comment \"{STATSD_SERVICE} has no endpoints\" -m udp --dport {STATSD_PORT} -j REJECT --reject-with icmp-port-unreachable\n\
         COMMIT\n"
    );
    restore_rules(NS_NODE, "iptables-restore", &filter)
        .context("the statsd Service's no-endpoints REJECT")?;
    Ok(())
}

/// Scales the Service to zero as kube-proxy's IPVS mode does (`pkg/proxy/ipvs/proxier.go`,
/// `syncProxyRules`: `syncService` runs for every Service port, endpoints or not, so the
/// virtual service and its ClusterIP on kube-ipvs0 stay; `syncEndpoint` hands each real
/// server no longer an endpoint to `GracefulDeleteRS`, which deletes a UDP one at once,
/// `pkg/proxy/ipvs/graceful_termination.go`, `deleteRsFunc`): the virtual service is left with
/// no real server.
fn scale_to_zero_ipvs() -> Result<()> {
    let vs = SocketAddrV4::new(STATSD_CLUSTER_IP, STATSD_PORT).to_string();
    let old = SocketAddrV4::new(POD_B_IP, OLD_ENDPOINT_PORT).to_string();
    exec(NS_NODE, &["ipvsadm", "-d", "-u", &vs, "-r", &old]).map(drop)
}

/// IPVS mode: the Service scaled back up with a new endpoint, pod B:8126 (a new pod): kube-proxy
/// adds it as the virtual service's real server (`syncEndpoint`, `AddRealServer`).
pub fn scale_back_up_ipvs() -> Result<()> {
    if kube_proxy::node_mode()? != KubeProxyMode::Ipvs {
        bail!("scale_back_up_ipvs writes kube-proxy's IPVS-mode real server");
    }
    let vs = SocketAddrV4::new(STATSD_CLUSTER_IP, STATSD_PORT).to_string();
    let new = SocketAddrV4::new(POD_B_IP, NEW_ENDPOINT_PORT).to_string();
    exec(
        NS_NODE,
        &["ipvsadm", "-a", "-u", &vs, "-r", &new, "-m", "-w", "1"],
    )
    .map(drop)
}

/// A sender in pod A: one datagram to the ClusterIP every `every` from `source_port` (0: a
/// new socket, so a new port, for each datagram), until dropped.
pub struct Sender {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sender {
    pub fn start(source_port: u16, every: Duration) -> Result<Sender> {
        let dst = SocketAddr::from(SocketAddrV4::new(STATSD_CLUSTER_IP, STATSD_PORT));
        Sender::start_to(dst, source_port, every)
    }

    /// [`Sender::start`] to `dst`, an IPv4 or an IPv6 Service address (bound to the
    /// unspecified address of its family).
    pub fn start_to(dst: SocketAddr, source_port: u16, every: Duration) -> Result<Sender> {
        let unspecified = match dst {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let bind = move || {
            in_netns(NS_POD_A, move || {
                UdpSocket::bind(SocketAddr::new(unspecified, source_port))
                    .context("bind the sender")
            })
        };
        let first = bind()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut sock = Some(first);
            while !stopped.load(Ordering::Relaxed) {
                let s = match sock.take() {
                    Some(s) => s,
                    None => match bind() {
                        Ok(s) => s,
                        Err(_) => break,
                    },
                };
                let _ = s.send_to(b"lab.counter:1|c\n", dst);
                if source_port != 0 {
                    sock = Some(s);
                }
                std::thread::sleep(every);
            }
        });
        Ok(Sender {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The node's conntrack entries to the ClusterIP, as `conntrack -L` prints them.
pub fn entries() -> Result<String> {
    entries_to(IpAddr::V4(STATSD_CLUSTER_IP))
}

/// The node's UDP conntrack entries to `service_ip` (with `-f ipv6` for an IPv6 one),
/// as `conntrack -L` prints them.
pub fn entries_to(service_ip: IpAddr) -> Result<String> {
    let family: &[&str] = if service_ip.is_ipv6() {
        &["-f", "ipv6"]
    } else {
        &[]
    };
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", NS_NODE, "conntrack", "-L"])
        .args(family)
        .args(["-p", "udp", "--orig-dst", &service_ip.to_string()])
        .output()
        .context("conntrack -L")?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Runs a `conntrack ...` command line (the remedy's) in the node namespace.
pub fn run_in_node(command_line: &str) -> Result<()> {
    let args: Vec<&str> = command_line.split_whitespace().collect();
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", NS_NODE])
        .args(&args)
        .output()
        .with_context(|| format!("running {command_line}"))?;
    if !o.status.success() {
        bail!(
            "{command_line}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}
