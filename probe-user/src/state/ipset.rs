//! kube-proxy's IPVS-mode ipsets that say `externalTrafficPolicy: Local`, from `ipset save`.
//!
//! IPVS mode has no per-Service chains: a Service with Local policy shows only as set members.
//! `KUBE-NODE-PORT-LOCAL-TCP` / `-UDP` (bitmap:port) hold its NodePorts and
//! `KUBE-LOAD-BALANCER-LOCAL` (hash:ip,port) its LB ingress IP:port; the nat rules that use
//! them `RETURN` before `KUBE-MARK-MASQ`, so traffic to them (pod traffic to the LB IP
//! included) leaves without masquerade, which is how a pod's call to its own LB loops (reference
//! 002, Local vs Cluster). [`parse_save`] is pure; [`read_ipvs_sets`] runs `ipset save` (and
//! also reads the source-range sets, `super::ipvs_firewall`).

use std::{collections::BTreeMap, net::IpAddr, process::Command};

use probe_contract::Proto;

use crate::state::ServiceTable;

/// The sets of NodePorts with externalTrafficPolicy Local, by protocol.
pub const NODE_PORT_LOCAL_SETS: [(&str, Proto); 2] = [
    ("KUBE-NODE-PORT-LOCAL-TCP", Proto::Tcp),
    ("KUBE-NODE-PORT-LOCAL-UDP", Proto::Udp),
];

/// Set name -> members (the entry as `ipset save` writes it, options such as `comment` cut).
/// Pure and total: lines it does not understand are skipped.
pub fn parse_save(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut sets: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("create"), Some(name), _) => {
                sets.entry(name.to_string()).or_default();
            }
            (Some("add"), Some(name), Some(entry)) => {
                sets.entry(name.to_string())
                    .or_default()
                    .push(entry.to_string());
            }
            _ => {}
        }
    }
    sets
}

/// NodePorts kube-proxy put in its Local sets.
pub fn local_nodeports(sets: &BTreeMap<String, Vec<String>>) -> Vec<(u16, Proto)> {
    NODE_PORT_LOCAL_SETS
        .iter()
        .flat_map(|(name, proto)| {
            sets.get(*name)
                .into_iter()
                .flatten()
                .filter_map(move |m| Some((m.parse::<u16>().ok()?, *proto)))
        })
        .collect()
}

/// Sets `local_only` on every NodePort of `table` that is in a Local set.
pub fn apply_local_nodeports(table: &mut ServiceTable, local: &[(u16, Proto)]) {
    for n in &mut table.nodeports {
        if local.contains(&(n.port, n.proto)) {
            n.local_only = true;
        }
    }
}

/// `ipset save` of the calling thread's network namespace, parsed; None without `ipset` (or
/// its module), said at debug level: the facts read from the sets are then left out.
fn save() -> Option<BTreeMap<String, Vec<String>>> {
    match Command::new("ipset").arg("save").output() {
        Ok(out) if out.status.success() => Some(parse_save(&String::from_utf8_lossy(&out.stdout))),
        Ok(out) => {
            tracing::debug!(
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "ipset save failed; externalTrafficPolicy Local and source ranges not read from ipsets"
            );
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot run ipset; externalTrafficPolicy Local and source ranges not read");
            None
        }
    }
}

/// Reads the ipsets (one `ipset save`) into an IPVS-mode table: marks its Local NodePorts
/// (without them the hairpin names no policy) and fills its `loadBalancerSourceRanges`
/// firewall ([`super::ipvs_firewall`]). Blocking.
pub fn read_ipvs_sets(table: &mut ServiceTable) {
    if let Some(sets) = save() {
        apply_local_nodeports(table, &local_nodeports(&sets));
        table.firewall = super::ipvs_firewall::firewall_entries(&sets);
    }
}

/// IPVS mode's `loadBalancerSourceRanges` firewall alone (the API path's facts). Blocking.
pub fn read_firewall() -> Vec<probe_core::state::FirewallEntry> {
    save()
        .map(|sets| super::ipvs_firewall::firewall_entries(&sets))
        .unwrap_or_default()
}

pub use probe_core::state::ipset::loop_back_set;

/// Whether the hairpin set holds `pod`'s entry for `port`/`proto`; `None` when there is no
/// such set (not IPVS mode). Pure.
pub fn loop_back_entry(
    sets: &BTreeMap<String, Vec<String>>,
    pod: IpAddr,
    proto: Proto,
    port: u16,
) -> Option<bool> {
    let entry = format!("{pod},{}:{port},{pod}", proto.as_str());
    sets.get(loop_back_set(pod.is_ipv6()))
        .map(|members| members.contains(&entry))
}

/// [`loop_back_entry`] from this namespace's `ipset save` of that one set. Blocking. `None`
/// also when `ipset` cannot run (said at debug level).
pub fn read_loop_back_entry(pod: IpAddr, proto: Proto, port: u16) -> Option<bool> {
    let set = loop_back_set(pod.is_ipv6());
    match Command::new("ipset").args(["save", set]).output() {
        Ok(out) if out.status.success() => loop_back_entry(
            &parse_save(&String::from_utf8_lossy(&out.stdout)),
            pod,
            proto,
            port,
        ),
        // No such set: not IPVS mode (`ipset` says "The set with the given name does not exist").
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "cannot run ipset; {set} not read");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::NodePortEntry;

    /// `ipset save` of sets made as kube-proxy makes them (captured on this project's kernel).
    const CAPTURE: &str = include_str!("../../tests/data/ipset/lab-etp-local-save.txt");

    #[test]
    fn parses_the_capture() {
        let sets = parse_save(CAPTURE);
        assert_eq!(sets["KUBE-NODE-PORT-TCP"], ["30080", "30090"]);
        assert_eq!(sets["KUBE-LOAD-BALANCER-LOCAL"], ["203.0.113.10,tcp:80"]);
        assert_eq!(sets["KUBE-NODE-PORT-LOCAL-UDP"], ["30053"]);
        let mut local = local_nodeports(&sets);
        local.sort_by_key(|(p, _)| *p);
        assert_eq!(
            local,
            [
                (30053, Proto::Udp),
                (30080, Proto::Tcp),
                (30081, Proto::Tcp),
                (30082, Proto::Tcp)
            ]
        );
    }

    #[test]
    fn marks_only_local_nodeports_of_their_protocol() {
        let np = |port, proto| NodePortEntry {
            port,
            proto,
            service: None,
            local_only: false,
        };
        let mut table = ServiceTable {
            nodeports: vec![
                np(30080, Proto::Tcp),
                np(30090, Proto::Tcp),
                np(30080, Proto::Udp),
                np(30053, Proto::Udp),
            ],
            ..ServiceTable::default()
        };
        apply_local_nodeports(&mut table, &local_nodeports(&parse_save(CAPTURE)));
        let local: Vec<(u16, Proto, bool)> = table
            .nodeports
            .iter()
            .map(|n| (n.port, n.proto, n.local_only))
            .collect();
        assert_eq!(
            local,
            [
                (30080, Proto::Tcp, true),
                (30090, Proto::Tcp, false),
                (30080, Proto::Udp, false),
                (30053, Proto::Udp, true),
            ]
        );
    }

    #[test]
    fn the_loop_back_entry_is_the_pods_own_port_and_protocol() {
        let pod: IpAddr = "198.19.1.11".parse().unwrap();
        let sets = parse_save(
            "create KUBE-LOOP-BACK hash:ip,port,ip family inet\n\
             add KUBE-LOOP-BACK 198.19.1.11,tcp:8080,198.19.1.11\n\
             add KUBE-LOOP-BACK 198.19.1.12,tcp:8080,198.19.1.12\n",
        );
        assert_eq!(loop_back_entry(&sets, pod, Proto::Tcp, 8080), Some(true));
        assert_eq!(loop_back_entry(&sets, pod, Proto::Udp, 8080), Some(false));
        assert_eq!(loop_back_entry(&sets, pod, Proto::Tcp, 9090), Some(false));
        // An empty set (kube-proxy 1.31, kubernetes#134884) is a missing entry, no set is none.
        let empty = parse_save("create KUBE-LOOP-BACK hash:ip,port,ip family inet\n");
        assert_eq!(loop_back_entry(&empty, pod, Proto::Tcp, 8080), Some(false));
        assert_eq!(
            loop_back_entry(&BTreeMap::new(), pod, Proto::Tcp, 8080),
            None
        );
        let v6: IpAddr = "fd00::11".parse().unwrap();
        let sets6 = parse_save("add KUBE-6-LOOP-BACK fd00::11,tcp:8080,fd00::11\n");
        assert_eq!(loop_back_entry(&sets6, v6, Proto::Tcp, 8080), Some(true));
    }

    #[test]
    fn garbage_and_truncation_never_panic() {
        for cut in 0..CAPTURE.len() {
            if CAPTURE.is_char_boundary(cut) {
                let _ = local_nodeports(&parse_save(&CAPTURE[..cut]));
            }
        }
        let sets = parse_save("add\ncreate\nadd KUBE-NODE-PORT-LOCAL-TCP notaport\n☃ add x");
        assert!(local_nodeports(&sets).is_empty());
    }
}
