//! kube-proxy's iptables-mode drop of an externalTrafficPolicy Local LB IP on a node without a
//! local endpoint (issue 51, shape 2): `default/web-local` on the LB IP
//! [`VIP`]:[`VIP_NFT_ETP_LOCAL_PORT`], its nat chains and the filter chain
//! `KUBE-EXTERNAL-SERVICES`, as kube-proxy's iptables proxier writes them
//! (kubernetes/kubernetes `pkg/proxy/iptables/proxier.go`, `syncProxyRules`):
//!
//! - nat: `KUBE-SERVICES` sends the LB IP:port to `KUBE-EXT-*` (the Service has endpoints);
//!   that chain short-circuits the pods kube-proxy's local-traffic detector matches ("pod
//!   traffic for ... external destinations", `IfLocal()`: `-s <cluster CIDR>`; no such rule
//!   without a detector) and the node's own traffic (`--src-type LOCAL`) to `KUBE-SVC-*`, and
//!   sends the rest to the empty `KUBE-SVL-*` (no local endpoint): not DNATed;
//! - filter: `KUBE-EXTERNAL-SERVICES` (jumped from `INPUT` and `FORWARD` for new connections,
//!   prepended as kube-proxy does) drops the LB IP:port ("has no local endpoints"): the pod's
//!   call that was not short-circuited dies in `FORWARD`.
//!
//! The lab has one node: pod-b stands in for the cluster-wide endpoint (on another node in a
//! real cluster), so a short-circuited call is answered. iptables mode only; IPv6 too
//! ([`set_web_local_in`]: the same rules in `ip6tables` for the dual-stack layer's VIP6 and
//! pod-b's IPv6 address, as the IPv6 proxier writes them). Removed with the lab.

use anyhow::{Context, Result, bail};

use super::{
    KubeProxyMode, NS_NODE, POD_B_IP, POD_PORT, VIP_NFT_ETP_LOCAL_PORT,
    cmd::restore_rules,
    kube_proxy,
    source_ranges::{IpFamily, iptables_first},
    v6::POD_B_IP6,
};

/// kube-proxy's chains for `default/web-local:http` (its hashes: base32(sha256(
/// "default/web-local:http" + "tcp"))[:16], the endpoint chain with "198.19.1.11:8080"
/// appended; over IPv6 with "[2001:db8:19:1::11]:8080").
pub const WEB_LOCAL_EXT_CHAIN: &str = "KUBE-EXT-V7ZMVOA2AOW6ATRL";
pub const WEB_LOCAL_SVC_CHAIN: &str = "KUBE-SVC-V7ZMVOA2AOW6ATRL";
pub const WEB_LOCAL_SVL_CHAIN: &str = "KUBE-SVL-V7ZMVOA2AOW6ATRL";
pub const WEB_LOCAL_SEP_CHAIN: &str = "KUBE-SEP-XVFLJOFK7NP3H3NA";
pub const WEB_LOCAL_SEP_CHAIN6: &str = "KUBE-SEP-UC6Z3B4HCGZQBTJF";
/// kube-proxy's filter chain of external and LB IPs without (local) endpoints.
pub const EXTERNAL_SERVICES_CHAIN: &str = "KUBE-EXTERNAL-SERVICES";

/// `family`'s endpoint chain and pod-b as its rules write it: (chain, `-s` host, DNAT target).
fn endpoint(family: IpFamily) -> (&'static str, String, String) {
    match family {
        IpFamily::V4 => (
            WEB_LOCAL_SEP_CHAIN,
            format!("{POD_B_IP}/32"),
            format!("{POD_B_IP}:{POD_PORT}"),
        ),
        IpFamily::V6 => (
            WEB_LOCAL_SEP_CHAIN6,
            format!("{POD_B_IP6}/128"),
            format!("[{POD_B_IP6}]:{POD_PORT}"),
        ),
    }
}

/// The nat chains of `default/web-local`, with the pod short circuit matching `detector`
/// (`-s <CIDR>`, `-i <interface>`) when kube-proxy has one.
fn nat_rules(family: IpFamily, detector: Option<&str>) -> String {
    let (ext, svc, svl) = (
        WEB_LOCAL_EXT_CHAIN,
        WEB_LOCAL_SVC_CHAIN,
        WEB_LOCAL_SVL_CHAIN,
    );
    let (sep, pod_b_host, pod_b) = endpoint(family);
    let name = "default/web-local:http";
    let short_circuit = detector
        .map(|d| {
            format!(
                "-A {ext} {d} -m comment --comment \"pod traffic for {name} external \
                 destinations\" -j {svc}\n"
            )
        })
        .unwrap_or_default();
    format!(
        "*nat\n\
         :{ext} - [0:0]\n\
         :{svc} - [0:0]\n\
         :{svl} - [0:0]\n\
         :{sep} - [0:0]\n\
         {short_circuit}\
         -A {ext} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ\n\
         -A {ext} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {svc}\n\
         -A {ext} -j {svl}\n\
         -A {svc} -m comment --comment \"{name} -> {pod_b}\" -j {sep}\n\
         -A {sep} -s {pod_b_host} -m comment --comment \"{name}\" -j KUBE-MARK-MASQ\n\
         -A {sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {pod_b}\n\
         COMMIT\n"
    )
}

/// The `KUBE-SERVICES` rule of the LB IP (`<svc> loadbalancer IP`).
fn lb_rule(family: IpFamily) -> Vec<String> {
    [
        "KUBE-SERVICES",
        "-d",
        &family.lb_ip(),
        "-p",
        "tcp",
        "-m",
        "comment",
        "--comment",
        "default/web-local:http loadbalancer IP",
        "-m",
        "tcp",
        "--dport",
        &VIP_NFT_ETP_LOCAL_PORT.to_string(),
        "-j",
        WEB_LOCAL_EXT_CHAIN,
    ]
    .map(str::to_string)
    .to_vec()
}

/// `KUBE-EXTERNAL-SERVICES` with the drop of the LB IP:port.
fn filter_rules(family: IpFamily) -> String {
    let lb_ip = family.lb_ip();
    format!(
        "*filter\n\
         :{EXTERNAL_SERVICES_CHAIN} - [0:0]\n\
         -A {EXTERNAL_SERVICES_CHAIN} -d {lb_ip} -p tcp -m comment --comment \"default/web-local:http has no local endpoints\" -m tcp --dport {VIP_NFT_ETP_LOCAL_PORT} -j DROP\n\
         COMMIT\n"
    )
}

/// The jump kube-proxy prepends to `INPUT` and `FORWARD`.
fn jump(chain: &str) -> Vec<String> {
    kube_proxy::new_connections_jump(
        chain,
        "kubernetes externally-visible service portals",
        EXTERNAL_SERVICES_CHAIN,
    )
}

/// Writes kube-proxy's iptables rules of `default/web-local` without a local endpoint (see
/// the module docs): with `detector` (`-s <CIDR>` or `-i <interface>`) the external chain's
/// pod short circuit matches what it says; without, kube-proxy has no local-traffic detector.
/// Written again, the chains are replaced.
pub fn set_web_local(detector: Option<&str>) -> Result<()> {
    set_web_local_in(IpFamily::V4, detector)
}

/// [`set_web_local`] in `family`'s rules (IPv6: `ip6tables`, [VIP6]:8445 to pod-b's IPv6
/// address; the dual-stack layer added first).
pub fn set_web_local_in(family: IpFamily, detector: Option<&str>) -> Result<()> {
    if kube_proxy::node_mode()? != KubeProxyMode::Iptables {
        bail!("default/web-local's iptables rules are written for kube-proxy's iptables mode");
    }
    restore_rules(NS_NODE, family.restore(), &nat_rules(family, detector))
        .context("kube-proxy's nat chains of default/web-local")?;
    iptables_first(family, "nat", &lb_rule(family), true)?;
    restore_rules(NS_NODE, family.restore(), &filter_rules(family))
        .context("kube-proxy's KUBE-EXTERNAL-SERVICES")?;
    for chain in ["INPUT", "FORWARD"] {
        iptables_first(family, "filter", &jump(chain), true)?;
    }
    Ok(())
}
