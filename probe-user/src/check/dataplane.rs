//! Which dataplane serves this node's Services: kube-proxy (iptables, IPVS or nftables mode),
//! or none of kube-proxy's rules at all, as on nodes where an eBPF replacement does its work
//! (Cilium's kube-proxy replacement: GKE Dataplane V2, AKS and EKS with Cilium).
//!
//! [`detect`] is pure (what the node showed in, the verdict out); [`read_traces`] reads what
//! it needs and is cheap (two directory listings; the service table is the caller's).
//!
//! kube-proxy's traces are its rules as the service table reader found them (an IPVS or
//! nftables table with services; `KUBE-*` rules in iptables, which every kube-proxy mode
//! writes: KUBE-SERVICES, KUBE-POSTROUTING) and its ipsets (`KUBE-*`, IPVS mode). Cilium's are
//! its host interfaces (`cilium_host`, `cilium_net`, `cilium_vxlan`, `cilium_geneve`) and its
//! maps pinned under `/sys/fs/bpf/tc/globals/cilium_*`. With no kube-proxy trace the mode is
//! `none`, and the replacement is named `cilium` when one of Cilium's traces is seen, else
//! `unknown`: the probe never guesses a vendor it did not see.
//!
//! Without kube-proxy the rules of `probe check` still judge what the kernel itself decides
//! (a local address, a route, the source-validation sysctls) but have no service table from
//! rules: what that leaves possible and what it cannot confirm is stated ([`Dataplane`]'s
//! `still_possible` and `cannot_confirm`), never left to silence.

use std::path::Path;

use probe_contract::check::{Dataplane, Limit, Mode, Replacement};

use crate::state::{ServiceSource, ServiceTable};

/// Where Cilium pins its tc maps (bpffs).
pub const CILIUM_PIN_DIR: &str = "/sys/fs/bpf/tc/globals";
/// Cilium's host-side interfaces.
pub const CILIUM_LINKS: &[&str] = &["cilium_host", "cilium_net", "cilium_vxlan", "cilium_geneve"];

/// The kube-proxy mode whose rules the service table was read from.
pub fn mode_of(source: ServiceSource) -> Mode {
    match source {
        ServiceSource::Iptables => Mode::Iptables,
        ServiceSource::Ipvs => Mode::Ipvs,
        ServiceSource::Nftables => Mode::Nftables,
    }
}

/// What the node shows (the input of [`detect`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traces {
    /// The service table reader's source.
    pub source: Option<ServiceSource>,
    /// The table holds services or NodePorts (an iptables table is read, and named
    /// `iptables`, even where kube-proxy wrote nothing).
    pub table_has_services: bool,
    /// kube-proxy's rule text among what the reader kept (`KUBE-POSTROUTING`, `KUBE-*` chains).
    pub kube_rules: Vec<String>,
    /// Names of kube-proxy's ipsets (`KUBE-*`).
    pub kube_ipsets: Vec<String>,
    /// Interface names of the node.
    pub links: Vec<String>,
    /// Entries of [`CILIUM_PIN_DIR`] (None: the directory is absent or unreadable).
    pub pins: Option<Vec<String>>,
}

impl Traces {
    /// The kube-proxy side of the traces from a service table and `ipset` set names (pure).
    pub fn of_table(table: &ServiceTable, ipset_names: &[String]) -> Traces {
        let kube_rules = table
            .masquerade_rules
            .iter()
            .chain(&table.access_filter)
            .filter(|r| r.contains("KUBE-"))
            .cloned()
            .collect();
        Traces {
            source: table.source,
            table_has_services: !table.services.is_empty() || !table.nodeports.is_empty(),
            kube_rules,
            kube_ipsets: ipset_names
                .iter()
                .filter(|n| n.starts_with("KUBE-"))
                .cloned()
                .collect(),
            links: Vec::new(),
            pins: None,
        }
    }
}

/// Reads the node side of the traces (interfaces from sysfs, Cilium's pins) into `traces`.
pub fn read_traces(mut traces: Traces, sys_class_net: &Path, pin_dir: &Path) -> Traces {
    let names = |dir: &Path| -> Option<Vec<String>> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        v.sort();
        Some(v)
    };
    traces.links = names(sys_class_net).unwrap_or_default();
    traces.pins = names(pin_dir);
    traces
}

/// The agent's view: a service table it holds, this namespace's interfaces (sysfs) and
/// Cilium's pins. No `ipset` run (it would block the correlator): an IPVS-mode node with no
/// service at all reads as kube-proxy iptables through its KUBE-* rules, never as `none`.
pub fn of_node(table: &ServiceTable) -> Dataplane {
    detect(&read_traces(
        Traces::of_table(table, &[]),
        Path::new("/sys/class/net"),
        Path::new(CILIUM_PIN_DIR),
    ))
}

/// The verdict (pure).
pub fn detect(t: &Traces) -> Dataplane {
    let cilium_evidence = cilium_evidence(t);
    match kube_proxy_source(t) {
        Some(source) => kube_proxy_dataplane(source, cilium_evidence),
        None => replaced_dataplane(t, cilium_evidence),
    }
}

/// The evidence lines of Cilium's traces (none when it left none).
fn cilium_evidence(t: &Traces) -> Vec<String> {
    let cilium_links: Vec<&String> = t
        .links
        .iter()
        .filter(|l| CILIUM_LINKS.contains(&l.as_str()))
        .collect();
    let cilium_pins: Vec<&String> = t
        .pins
        .iter()
        .flatten()
        .filter(|p| p.starts_with("cilium_"))
        .collect();
    let mut cilium_evidence = Vec::new();
    if !cilium_links.is_empty() {
        cilium_evidence.push(format!(
            "Cilium's interfaces present: {}",
            join(&cilium_links)
        ));
    }
    if !cilium_pins.is_empty() {
        let mut shown: Vec<&String> = cilium_pins.iter().take(4).copied().collect();
        shown.sort();
        cilium_evidence.push(format!(
            "Cilium's maps pinned in {CILIUM_PIN_DIR}: {}{}",
            join(&shown),
            if cilium_pins.len() > 4 {
                format!(" and {} more", cilium_pins.len() - 4)
            } else {
                String::new()
            }
        ));
    }
    cilium_evidence
}

/// The kube-proxy mode whose traces the node shows (None: no kube-proxy trace at all).
fn kube_proxy_source(t: &Traces) -> Option<ServiceSource> {
    match t.source {
        Some(ServiceSource::Ipvs | ServiceSource::Nftables) if t.table_has_services => t.source,
        _ if t.table_has_services || !t.kube_rules.is_empty() || !t.kube_ipsets.is_empty() => {
            // IPVS mode's ipsets with an empty IPVS table is still IPVS mode.
            if t.source == Some(ServiceSource::Iptables)
                && t.kube_ipsets.iter().any(|s| s == "KUBE-CLUSTER-IP")
                && !t.table_has_services
            {
                Some(ServiceSource::Ipvs)
            } else {
                t.source.or(Some(ServiceSource::Iptables))
            }
        }
        _ => None,
    }
}

/// kube-proxy serves Services in the mode of `source`.
fn kube_proxy_dataplane(source: ServiceSource, cilium_evidence: Vec<String>) -> Dataplane {
    let mode = mode_of(source);
    let mut evidence = vec![match mode {
        Mode::Ipvs => "IPVS virtual services and kube-proxy's ipsets".to_string(),
        Mode::Nftables => "kube-proxy's nftables table (ip kube-proxy)".to_string(),
        _ => "kube-proxy's KUBE-* chains in the iptables nat table".to_string(),
    }];
    // Cilium as a CNI beside kube-proxy: kube-proxy still serves Services.
    evidence.extend(cilium_evidence);
    Dataplane {
        mode,
        replacement: None,
        evidence,
        still_possible: Vec::new(),
        cannot_confirm: Vec::new(),
    }
}

/// No kube-proxy: Cilium (when its traces are seen) or an unknown replacement serves
/// Services, and what that leaves possible and unconfirmable is stated (a list of texts).
fn replaced_dataplane(t: &Traces, cilium_evidence: Vec<String>) -> Dataplane {
    let replacement = if cilium_evidence.is_empty() {
        Replacement::Unknown
    } else {
        Replacement::Cilium
    };
    let mut evidence = vec![
        "no kube-proxy rules: no KUBE-* chains in iptables, no kube-proxy nftables table, no \
         IPVS services, no KUBE-* ipsets"
            .to_string(),
    ];
    if cilium_evidence.is_empty() {
        evidence.push(format!(
            "no trace of a known replacement (interfaces {}; {CILIUM_PIN_DIR} {})",
            CILIUM_LINKS.join(", "),
            if t.pins.is_some() {
                "holds no cilium_* map"
            } else {
                "absent"
            }
        ));
    }
    evidence.extend(cilium_evidence);
    let who = match replacement {
        Replacement::Cilium => "Cilium's eBPF programs",
        Replacement::Unknown => "whatever replaces kube-proxy",
    };
    let limit = |kind: &str, why: String| Limit {
        kind: kind.into(),
        why,
    };
    Dataplane {
        mode: Mode::None,
        replacement: Some(replacement),
        evidence,
        still_possible: vec![
            limit(
                "healthcheck_blackhole",
                "an LB IP held as a local address or a local route (a cloud guest agent, a \
                 manual bind) makes the LB's health checks from it martian, whatever serves \
                 Services: judged from the node's addresses and routes"
                    .into(),
            ),
            limit(
                "vip_port_unserved",
                format!(
                    "an LB IP local to the node is answered by the node's own stack: a port \
                     {who} do not serve is refused (connection refused) to in-cluster callers"
                ),
            ),
            limit(
                "hairpin",
                format!(
                    "an LB whose target is a backend on a host listener (a host-network process \
                     on the node's address) and that keeps client addresses sends a pod's call \
                     back to its own node; pod calls to LB IPs {who} do not short-circuit or \
                     masquerade can loop too (a warning: that part is in eBPF, unseen)"
                ),
            ),
        ],
        cannot_confirm: vec![
            limit(
                "nodeport_attribution",
                format!(
                    "no service table from rules: {who} keep it in BPF maps the probe does \
                     not read, so NodePort and ClusterIP traffic is not attributed to Services"
                ),
            ),
            limit(
                "pod_egress_masquerade",
                format!(
                    "masquerade is read from iptables and kube-proxy's nftables table: {who} \
                     masquerade in eBPF, unseen, so an unmasqueraded hairpin cannot be ruled out \
                     or confirmed from rules"
                ),
            ),
            limit(
                "service_self_loop",
                "kube-proxy's KUBE-LOOP-BACK and hairpin rules do not exist here: a pod calling \
                 its own Service is handled in eBPF, unseen"
                    .into(),
            ),
        ],
    }
}

fn join(v: &[&String]) -> String {
    v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::test_nodes::KUBE_MASQ;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// Captured from the lab's nodes and a Cilium 1.16 node (kube-proxy replacement on):
    /// (case, traces, mode, replacement).
    #[test]
    fn the_dataplane_is_named_from_what_the_node_shows() {
        let iptables = Traces {
            source: Some(ServiceSource::Iptables),
            table_has_services: true,
            kube_rules: s(&[KUBE_MASQ]),
            links: s(&["eth0", "kube-ipvs0", "lo"]),
            ..Default::default()
        };
        let cilium_node = Traces {
            // iptables-save still reads: an empty nat table, Cilium's own chains only.
            source: Some(ServiceSource::Iptables),
            links: s(&[
                "cilium_host",
                "cilium_net",
                "cilium_vxlan",
                "eth0",
                "lo",
                "lxc1a2b",
            ]),
            pins: Some(s(&[
                "cilium_calls_hostns",
                "cilium_ct4_global",
                "cilium_lb4_services_v2",
                "cilium_lxc",
                "cilium_policy_v2_00412",
            ])),
            ..Default::default()
        };
        let cases: Vec<(&str, Traces, Mode, Option<Replacement>)> = vec![
            ("iptables", iptables.clone(), Mode::Iptables, None),
            (
                "ipvs",
                Traces {
                    source: Some(ServiceSource::Ipvs),
                    kube_ipsets: s(&["KUBE-CLUSTER-IP", "KUBE-LOOP-BACK"]),
                    ..iptables.clone()
                },
                Mode::Ipvs,
                None,
            ),
            (
                "ipvs, no service yet",
                Traces {
                    source: Some(ServiceSource::Iptables),
                    table_has_services: false,
                    kube_ipsets: s(&["KUBE-CLUSTER-IP"]),
                    ..iptables.clone()
                },
                Mode::Ipvs,
                None,
            ),
            (
                "nftables",
                Traces {
                    source: Some(ServiceSource::Nftables),
                    kube_rules: vec![],
                    ..iptables.clone()
                },
                Mode::Nftables,
                None,
            ),
            (
                "kube-proxy with Cilium as CNI",
                Traces {
                    links: s(&["cilium_host", "eth0"]),
                    ..iptables.clone()
                },
                Mode::Iptables,
                None,
            ),
            (
                "cilium, links and pins",
                cilium_node.clone(),
                Mode::None,
                Some(Replacement::Cilium),
            ),
            (
                "cilium, bpffs not mounted here",
                Traces {
                    pins: None,
                    ..cilium_node.clone()
                },
                Mode::None,
                Some(Replacement::Cilium),
            ),
            (
                "cilium, pins only",
                Traces {
                    links: s(&["eth0", "lo"]),
                    ..cilium_node.clone()
                },
                Mode::None,
                Some(Replacement::Cilium),
            ),
            (
                "no kube-proxy, nothing known",
                Traces {
                    source: Some(ServiceSource::Iptables),
                    links: s(&["eth0", "lo"]),
                    pins: Some(s(&["tc_other"])),
                    ..Default::default()
                },
                Mode::None,
                Some(Replacement::Unknown),
            ),
            (
                // A masquerade rule of a CNI is no kube-proxy trace.
                "cni masquerade only",
                Traces {
                    source: Some(ServiceSource::Iptables),
                    links: s(&["eth0"]),
                    ..Default::default()
                },
                Mode::None,
                Some(Replacement::Unknown),
            ),
        ];
        for (case, traces, mode, replacement) in cases {
            let d = detect(&traces);
            assert_eq!(
                (d.mode, d.replacement),
                (mode, replacement),
                "{case}: {d:?}"
            );
            let limited = mode == Mode::None;
            assert_eq!(!d.still_possible.is_empty(), limited, "{case}");
            assert_eq!(!d.cannot_confirm.is_empty(), limited, "{case}");
        }
    }

    #[test]
    fn without_kube_proxy_the_limits_are_stated_with_their_reasons() {
        let d = detect(&Traces {
            links: s(&["cilium_host", "eth0"]),
            ..Default::default()
        });
        assert_eq!(d.name(), "none (cilium)");
        assert_eq!(d.serving(), "cilium");
        let kinds: Vec<&str> = d.still_possible.iter().map(|l| l.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["healthcheck_blackhole", "vip_port_unserved", "hairpin"]
        );
        assert!(d.still_possible[2].why.contains("host listener"));
        let cannot: Vec<&str> = d.cannot_confirm.iter().map(|l| l.kind.as_str()).collect();
        assert!(cannot.contains(&"nodeport_attribution"), "{cannot:?}");
        assert!(
            d.cannot_confirm[0]
                .why
                .contains("no service table from rules")
        );
        assert!(d.evidence.iter().any(|e| e.contains("cilium_host")));
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["mode"], "none");
        assert_eq!(v["replacement"], "cilium");
        // With kube-proxy, no limits and no replacement in the JSON.
        let k = serde_json::to_value(detect(&Traces {
            source: Some(ServiceSource::Ipvs),
            table_has_services: true,
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(k["mode"], "ipvs");
        assert!(k.get("replacement").is_none() && k.get("still_possible").is_none());
    }

    #[test]
    fn traces_of_a_table_keep_only_kube_proxy_rules_and_sets() {
        let table = ServiceTable {
            source: Some(ServiceSource::Iptables),
            masquerade_rules: s(&[KUBE_MASQ, "-A CILIUM_POST_nat -s 10.0.0.0/8 -j MASQUERADE"]),
            ..Default::default()
        };
        let t = Traces::of_table(&table, &s(&["KUBE-CLUSTER-IP", "cilium_node_set_v4"]));
        assert_eq!(t.kube_rules, s(&[KUBE_MASQ]));
        assert_eq!(t.kube_ipsets, s(&["KUBE-CLUSTER-IP"]));
        assert!(!t.table_has_services);
    }

    #[test]
    fn read_traces_lists_links_and_pins() {
        let dir = std::env::temp_dir().join(format!("clb-dp-{}", std::process::id()));
        let net = dir.join("net");
        let pins = dir.join("pins");
        std::fs::create_dir_all(net.join("cilium_host")).unwrap();
        std::fs::create_dir_all(net.join("eth0")).unwrap();
        let t = read_traces(Traces::default(), &net, &pins);
        assert_eq!(t.links, s(&["cilium_host", "eth0"]));
        assert_eq!(t.pins, None);
        std::fs::create_dir_all(&pins).unwrap();
        std::fs::write(pins.join("cilium_lxc"), "").unwrap();
        let t = read_traces(Traces::default(), &net, &pins);
        assert_eq!(t.pins, Some(s(&["cilium_lxc"])));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
