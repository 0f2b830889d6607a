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
//! real cluster), so a short-circuited call is answered. iptables mode only. Removed with the
//! lab.

use anyhow::{Context, Result, bail};

use super::{
    KubeProxyMode, NS_NODE, POD_B_IP, POD_PORT, VIP, VIP_NFT_ETP_LOCAL_PORT,
    cmd::{iptables, iptables_ok, restore_rules},
    kube_proxy,
};

/// kube-proxy's chains for `default/web-local:http` (its hashes: base32(sha256(
/// "default/web-local:http" + "tcp"))[:16], the endpoint chain with "198.19.1.11:8080"
/// appended).
pub const WEB_LOCAL_EXT_CHAIN: &str = "KUBE-EXT-V7ZMVOA2AOW6ATRL";
pub const WEB_LOCAL_SVC_CHAIN: &str = "KUBE-SVC-V7ZMVOA2AOW6ATRL";
pub const WEB_LOCAL_SVL_CHAIN: &str = "KUBE-SVL-V7ZMVOA2AOW6ATRL";
pub const WEB_LOCAL_SEP_CHAIN: &str = "KUBE-SEP-XVFLJOFK7NP3H3NA";
/// kube-proxy's filter chain of external and LB IPs without (local) endpoints.
pub const EXTERNAL_SERVICES_CHAIN: &str = "KUBE-EXTERNAL-SERVICES";

/// The nat chains of `default/web-local`, with the pod short circuit matching `detector`
/// (`-s <CIDR>`, `-i <interface>`) when kube-proxy has one.
fn nat_rules(detector: Option<&str>) -> String {
    let (ext, svc, svl, sep) = (
        WEB_LOCAL_EXT_CHAIN,
        WEB_LOCAL_SVC_CHAIN,
        WEB_LOCAL_SVL_CHAIN,
        WEB_LOCAL_SEP_CHAIN,
    );
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
         -A {svc} -m comment --comment \"{name} -> {POD_B_IP}:{POD_PORT}\" -j {sep}\n\
         -A {sep} -s {POD_B_IP}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ\n\
         -A {sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {POD_B_IP}:{POD_PORT}\n\
         COMMIT\n"
    )
}

/// The `KUBE-SERVICES` rule of the LB IP (`<svc> loadbalancer IP`).
fn lb_rule() -> Vec<String> {
    [
        "KUBE-SERVICES",
        "-d",
        &format!("{VIP}/32"),
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
fn filter_rules() -> String {
    format!(
        "*filter\n\
         :{EXTERNAL_SERVICES_CHAIN} - [0:0]\n\
         -A {EXTERNAL_SERVICES_CHAIN} -d {VIP}/32 -p tcp -m comment --comment \"default/web-local:http has no local endpoints\" -m tcp --dport {VIP_NFT_ETP_LOCAL_PORT} -j DROP\n\
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

/// Inserts `rule` (chain first) at position 1 of `table` unless it is there.
fn ensure_first(table: &str, rule: &[String]) -> Result<()> {
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    let mut check = vec!["-t", table, "-C"];
    check.extend_from_slice(&rule);
    if iptables_ok(NS_NODE, &check) {
        return Ok(());
    }
    let mut insert = vec!["-t", table, "-I", rule[0], "1"];
    insert.extend_from_slice(&rule[1..]);
    iptables(NS_NODE, &insert).map(drop)
}

/// Writes kube-proxy's iptables rules of `default/web-local` without a local endpoint (see
/// the module docs): with `detector` (`-s <CIDR>` or `-i <interface>`) the external chain's
/// pod short circuit matches what it says; without, kube-proxy has no local-traffic detector.
/// Written again, the chains are replaced.
pub fn set_web_local(detector: Option<&str>) -> Result<()> {
    if kube_proxy::node_mode()? != KubeProxyMode::Iptables {
        bail!("default/web-local's iptables rules are written for kube-proxy's iptables mode");
    }
    restore_rules(NS_NODE, "iptables-restore", &nat_rules(detector))
        .context("kube-proxy's nat chains of default/web-local")?;
    ensure_first("nat", &lb_rule())?;
    restore_rules(NS_NODE, "iptables-restore", &filter_rules())
        .context("kube-proxy's KUBE-EXTERNAL-SERVICES")?;
    for chain in ["INPUT", "FORWARD"] {
        ensure_first("filter", &jump(chain))?;
    }
    Ok(())
}
