//! kube-proxy's side of the node, as kube-proxy writes it: the nat rules (iptables mode), the
//! ipsets, rules and virtual services (IPVS mode), and reading which mode the node runs.

use anyhow::Result;

use super::{
    CLUSTER_CIDR, CLUSTER_IP, IPVS_SCHEDULER, KUBE_EXT_CHAIN, KUBE_SEP_CHAIN, KUBE_SVC_CHAIN,
    KubeProxyMode, MASQ_CHAIN, NODE_IP, NODE_PORT, NODE_PORT_UDP, NS_NODE, POD_B_IP, POD_PORT,
    POD_UDP_PORT, SERVICE_PORT, SocketAddrV4, VIP,
    cmd::{exec, iptables_ok},
};

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

/// The nat table and the chains kube-proxy's iptables mode declares in it in every sync, as
/// iptables-restore lines (kubernetes pkg/proxy/iptables/proxier.go, `syncProxyRules`).
pub(super) const NAT_TABLE_HEAD: &str = "*nat\n\
                                         :KUBE-SERVICES - [0:0]\n\
                                         :KUBE-NODEPORTS - [0:0]\n\
                                         :KUBE-POSTROUTING - [0:0]\n\
                                         :KUBE-MARK-MASQ - [0:0]";

/// A jump kube-proxy's iptables mode prepends to a filter chain (`INPUT`, `FORWARD`, `OUTPUT`)
/// for new connections only: `<chain> -m conntrack --ctstate NEW -m comment --comment
/// <comment> -j <target>` (kubernetes pkg/proxy/iptables/proxier.go, `iptablesJumpChains`).
pub(super) fn new_connections_jump(chain: &str, comment: &str, target: &str) -> Vec<String> {
    [
        chain,
        "-m",
        "conntrack",
        "--ctstate",
        "NEW",
        "-m",
        "comment",
        "--comment",
        comment,
        "-j",
        target,
    ]
    .map(str::to_string)
    .to_vec()
}

/// kube-proxy (iptables mode) nat rules for `default/web` port `http`, as kube-proxy writes them.
/// The chain hashes are kube-proxy's own: base32(sha256("default/web:http" + "tcp"))[:16], and
/// for the endpoint chain the same with "198.19.1.11:8080" appended.
pub(super) fn kube_proxy_rules() -> String {
    format!(
        r#"{NAT_TABLE_HEAD}
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
pub(super) fn lab_masq_chain() -> String {
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
pub(super) fn kube_proxy_ipsets() -> String {
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
pub(super) const LB_SET: &str = "KUBE-LOAD-BALANCER";

/// kube-proxy (IPVS mode) nat rules, as kube-proxy 1.30 writes them (`iptables-save -t nat`
/// of such a node, trimmed to what `default/web` uses), plus the lab's masquerade chain. No
/// DNAT: IPVS rewrites the destination at LOCAL_IN; these rules only mark what must be
/// masqueraded on the way out.
pub(super) fn kube_proxy_ipvs_rules() -> String {
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
pub(super) fn ipvs_service(vs: SocketAddrV4, on: bool) -> Result<()> {
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
pub(super) fn ipvs_udp_nodeport() -> Result<()> {
    let vs = SocketAddrV4::new(NODE_IP, NODE_PORT_UDP).to_string();
    let rs = format!("{POD_B_IP}:{POD_UDP_PORT}");
    exec(NS_NODE, &["ipvsadm", "-A", "-u", &vs, "-s", IPVS_SCHEDULER])?;
    exec(
        NS_NODE,
        &["ipvsadm", "-a", "-u", &vs, "-r", &rs, "-m", "-w", "1"],
    )
    .map(drop)
}

pub(super) fn ipvs_has_service(vs: SocketAddrV4) -> bool {
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
