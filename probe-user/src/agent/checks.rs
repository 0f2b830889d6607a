//! Checks of what the operator asked for, before anything touches the kernel (pure).
//!
//! Each message says what the setting would do to detection, so the operator can decide.

use std::net::IpAddr;

use crate::state::addrs::{NodeState, Prefix};

/// A `--pod-cidr` that cannot be meant: a usage error (exit 2) with the reason.
pub fn pod_cidr_error(p: &Prefix) -> Option<PodCidrError> {
    if p.len == 0 {
        return Some(PodCidrError::Everything(*p));
    }
    let network = network(p);
    if network.addr != p.addr {
        return Some(PodCidrError::HostBits { given: *p, network });
    }
    None
}

/// Why a `--pod-cidr` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodCidrError {
    #[error(transparent)]
    Prefix(#[from] probe_core::state::addrs::PrefixError),
    #[error(
        "--pod-cidr {0} makes every address a pod address: every packet from outside the node would be a hairpin suspect (counted, events shed by the budget) and a pod's egress to anything would be remembered; name the node's pod range (e.g. 10.244.1.0/24)"
    )]
    Everything(Prefix),
    #[error("--pod-cidr {given} has host bits set: did you mean {network}?")]
    HostBits { given: Prefix, network: Prefix },
}

/// `p` with its host bits cleared.
pub fn network(p: &Prefix) -> Prefix {
    let addr = match p.addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(p.len)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(p.len)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & mask).into())
        }
    };
    Prefix { addr, len: p.len }
}

/// `--nic` / `--vip-iface` combinations that cannot work: a usage error (exit 2).
pub fn interface_error(nics: &[String], vip_iface: &str) -> Option<String> {
    if vip_iface.trim().is_empty() {
        return Some(
            "--vip-iface is empty: name the interface kube-proxy binds VIPs to (default kube-ipvs0)"
                .into(),
        );
    }
    if nics.iter().any(|n| n.trim().is_empty()) {
        return Some("--nic is empty: name an interface (e.g. --nic eth0)".into());
    }
    if nics.iter().any(|n| n == "lo") {
        return Some(
            "--nic lo: the loopback interface never carries the load balancer's traffic; name the \
             node's NIC (e.g. --nic eth0)"
                .into(),
        );
    }
    if nics.iter().any(|n| n == vip_iface) {
        return Some(format!(
            "--vip-iface {vip_iface} is also a --nic: every address of the NIC would be taken for a \
             VIP (the node's own traffic would look like health checks); the VIP interface is \
             kube-proxy's dummy (kube-ipvs0)"
        ));
    }
    None
}

/// `--pod-cidr`s that overlap the subnet of a watched NIC: allowed (some CNIs give pods
/// addresses from the node's subnet), but said, with what it does to detection.
pub fn pod_cidr_warnings(
    pod_cidrs: &[Prefix],
    state: &NodeState,
    nics: &[(String, u32)],
) -> Vec<String> {
    let mut out = Vec::new();
    for cidr in pod_cidrs {
        for a in &state.addrs {
            let Some((nic, _)) = nics.iter().find(|(_, i)| *i == a.ifindex) else {
                continue;
            };
            let subnet = network(&Prefix {
                addr: a.addr,
                len: a.prefix_len,
            });
            let overlaps = if cidr.len <= subnet.len {
                cidr.contains(subnet.addr)
            } else {
                subnet.contains(cidr.addr)
            };
            if overlaps {
                out.push(format!(
                    "--pod-cidr {cidr} overlaps {nic}'s subnet {subnet}: other hosts on that \
                     subnet count as pods, so their packets to this node are hairpin suspects \
                     (counted, never confirmed without a matching un-SNATed pod egress); the \
                     node's own addresses stay `node`"
                ));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::addrs::{AddrEntry, Link};

    fn p(s: &str) -> Prefix {
        Prefix::parse(s).unwrap()
    }

    #[test]
    fn pod_cidrs_everything_and_host_bits_are_refused() {
        for (cidr, says) in [
            ("0.0.0.0/0", "every address a pod address"),
            ("::/0", "every address a pod address"),
            ("10.244.1.5/24", "did you mean 10.244.1.0/24?"),
            ("fd00::1/64", "did you mean fd00::/64?"),
        ] {
            let e = pod_cidr_error(&p(cidr)).unwrap_or_else(|| panic!("{cidr} accepted"));
            assert!(e.to_string().contains(says), "{cidr}: {e}");
        }
        for ok in ["10.244.1.0/24", "10.244.1.7", "fd00::/64", "fd00::1"] {
            assert_eq!(pod_cidr_error(&p(ok)), None, "{ok}");
        }
    }

    #[test]
    fn interface_conflicts_are_usage_errors() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (nics, vip, says) in [
            (s(&["eth0"]), "", "--vip-iface is empty"),
            (s(&["eth0"]), "eth0", "is also a --nic"),
            (s(&["eth0", "eth1"]), "eth1", "is also a --nic"),
            (s(&["lo"]), "kube-ipvs0", "--nic lo"),
            (s(&[""]), "kube-ipvs0", "--nic is empty"),
        ] {
            let e = interface_error(&nics, vip)
                .unwrap_or_else(|| panic!("{nics:?} / {vip:?} accepted"));
            assert!(e.contains(says), "{nics:?} / {vip:?}: {e}");
        }
        assert_eq!(interface_error(&s(&["eth0"]), "kube-ipvs0"), None);
        assert_eq!(interface_error(&[], "kube-ipvs0"), None);
    }

    #[test]
    fn a_pod_cidr_over_the_nic_subnet_is_warned_about() {
        let state = NodeState {
            links: vec![Link {
                index: 2,
                name: "eth0".into(),
                kind: None,
            }],
            addrs: vec![AddrEntry::plain(2, "192.0.2.10".parse().unwrap(), 24)],
            routes: vec![],
            route_sources: vec![],
        };
        let nics = vec![("eth0".to_string(), 2)];
        for overlapping in ["192.0.2.0/24", "192.0.0.0/16", "192.0.2.128/25"] {
            let w = pod_cidr_warnings(&[p(overlapping)], &state, &nics);
            assert_eq!(w.len(), 1, "{overlapping}: {w:?}");
            assert!(w[0].contains("eth0's subnet 192.0.2.0/24"), "{}", w[0]);
        }
        assert!(pod_cidr_warnings(&[p("10.244.1.0/24")], &state, &nics).is_empty());
        // Not a watched NIC: nothing to say.
        assert!(pod_cidr_warnings(&[p("192.0.2.0/24")], &state, &[]).is_empty());
    }
}
