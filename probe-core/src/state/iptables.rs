//! kube-proxy's iptables names the evidence cites (probe-user's `state::iptables` reads the
//! rules).

/// kube-proxy's IPVS access filter chain (filter table, jumped from INPUT; kube-proxy >= 1.25
/// in IPVS mode): REJECTs new connections to kube-ipvs0 addresses on ports no service uses.
pub const ACCESS_FILTER_CHAIN: &str = "KUBE-IPVS-FILTER";
