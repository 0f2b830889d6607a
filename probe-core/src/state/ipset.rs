//! kube-proxy's IPVS-mode ipsets, the names (probe-user's `state::ipset` reads them).

/// kube-proxy IPVS mode's hairpin set: `endpoint,proto:port,endpoint` for every endpoint, so
/// the `KUBE-POSTROUTING` rule `--match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE`
/// masquerades a pod's call to its own Service (IPv6: `KUBE-6-LOOP-BACK`).
pub fn loop_back_set(v6: bool) -> &'static str {
    if v6 {
        "KUBE-6-LOOP-BACK"
    } else {
        "KUBE-LOOP-BACK"
    }
}
