//! The rules of `probe check`, pure: [`Inputs`] in, [`Finding`]s out. One function per kind.

use std::net::IpAddr;

use super::{ApiState, Finding, Inputs, Kind, LbTarget, NicSysctls, Severity};
use crate::{correlate::remedy, event::Proto, state::addrs::Prefix};

/// Every finding for these inputs.
pub fn judge(inp: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(healthcheck_blackhole(inp));
    out.extend(vip_port_unserved(inp));
    out.extend(hairpin(inp));
    out.extend(service_self_loop(inp));
    out.extend(nic_source_validation(inp));
    out.extend(kptr_restrict(inp));
    out.extend(kernel_visibility(inp));
    out.extend(kube_api(inp));
    out
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn targets_of(inp: &Inputs, ip: IpAddr) -> Vec<&LbTarget> {
    inp.lb_targets.iter().filter(|t| t.ip == ip).collect()
}

/// Addresses bound on the VIP interface that an LB can health-check from: every one named as
/// an LB ingress IP, and every other one kube-proxy does not name as a ClusterIP (an external
/// IP, or an LB IP on a node whose sets we could not read). ClusterIPs are never an LB's
/// source, so they are left out: on an IPVS node they are most of kube-ipvs0.
fn bound_lb_ips(inp: &Inputs) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = inp
        .bound
        .iter()
        .copied()
        .filter(|ip| !is_link_local(*ip))
        .filter(|ip| !targets_of(inp, *ip).is_empty() || !inp.cluster_ips.contains(ip))
        .collect();
    v.sort();
    v.dedup();
    v
}

fn prevent_loopback(targets: &[&LbTarget]) -> Vec<String> {
    let mut v: Vec<String> = targets
        .iter()
        .flat_map(|t| t.prevent_loopback.iter().cloned())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn named(targets: &[&LbTarget]) -> String {
    let mut names: Vec<&str> = targets
        .iter()
        .filter_map(|t| t.service.as_deref())
        .collect();
    names.sort();
    names.dedup();
    names.join(", ")
}

/// How a NIC treats a packet whose source is a local address (`fib_validate_source`).
fn local_source_verdict(nic: &NicSysctls, src: IpAddr) -> String {
    if nic.accept_local {
        format!(
            "{}: accept_local=1: a packet from {src} is accepted, and the answer goes to {src}, a \
             local address: it never leaves the node (the LB still sees no reply)",
            nic.name
        )
    } else {
        format!(
            "{}: accept_local=0: a packet from {src} is dropped as a martian (local) source \
             (IP_LOCAL_SOURCE; NOT_SPECIFIED at the route-input site before 6.x)",
            nic.name
        )
    }
}

/// Failure 1: an LB ingress IP bound locally; the LB's health checks from it are discarded.
pub fn healthcheck_blackhole(inp: &Inputs) -> Vec<Finding> {
    bound_lb_ips(inp)
        .into_iter()
        .map(|ip| {
            let targets = targets_of(inp, ip);
            let mut evidence = vec![format!(
                "{ip} is bound on {} (a local address of this node)",
                inp.vip_iface
            )];
            if targets.is_empty() {
                evidence.push(
                    "not named as a ClusterIP by kube-proxy's sets: taken for an LB ingress or \
                     external IP"
                        .into(),
                );
            } else {
                let mut sources: Vec<&str> = targets.iter().map(|t| t.source.as_str()).collect();
                sources.sort();
                sources.dedup();
                evidence.push(format!("LB ingress IP per {}", sources.join(", ")));
            }
            if targets.iter().any(|t| t.ip_mode_proxy) {
                evidence.push(
                    "ipMode: Proxy, yet bound: something other than kube-proxy binds it".into(),
                );
            }
            if let Some(port) = targets.iter().find_map(|t| t.health_check_node_port) {
                evidence.push(format!("the Service's healthCheckNodePort is {port}"));
            }
            evidence.extend(inp.nics.iter().map(|n| local_source_verdict(n, ip)));
            let guard = prevent_loopback(&targets);
            let severity = if guard.is_empty() {
                Severity::Risk
            } else {
                evidence.push(format!(
                    "provider prevent-loopback annotation set ({}): the LB is expected to \
                     health-check from another source",
                    guard.join(", ")
                ));
                Severity::Warn
            };
            let node_port = targets
                .iter()
                .find_map(|t| t.health_check_node_port)
                .or_else(|| inp.services.nodeports.first().map(|n| n.port))
                .unwrap_or(0);
            let svc = named(&targets);
            Finding {
                kind: Kind::HealthcheckBlackhole,
                severity,
                subject: ip.to_string(),
                summary: format!(
                    "LB IP {ip}{} is bound on {}: health checks from it never get an answer",
                    if svc.is_empty() {
                        String::new()
                    } else {
                        format!(" ({svc})")
                    },
                    inp.vip_iface
                ),
                evidence,
                // The remedies of the confirmed event, without its "Cause:" line (the finding
                // is a prediction, its cause is the evidence).
                remedy: remedy::healthcheck_blackhole(ip, node_port)
                    .into_iter()
                    .skip(1)
                    .collect(),
            }
        })
        .collect()
}

fn port_list(ports: &[(u16, Proto)]) -> String {
    ports
        .iter()
        .map(|(p, proto)| format!("{p}/{}", proto.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Failure 3: an LB ingress IP bound locally answers in-cluster calls only on the ports a
/// service serves. A risk when a port the Service declares (API, kube-proxy's sets) or every
/// port is unserved; a warning otherwise (the LB's other listeners are not visible here).
pub fn vip_port_unserved(inp: &Inputs) -> Vec<Finding> {
    bound_lb_ips(inp)
        .into_iter()
        .map(|ip| {
            let targets = targets_of(inp, ip);
            let mut served: Vec<(u16, Proto)> = inp
                .services
                .services
                .iter()
                .filter(|s| s.vip == ip)
                .map(|s| (s.port, s.proto))
                .collect();
            served.sort_by_key(|(p, proto)| (*p, proto.as_str()));
            served.dedup();
            let mut unserved: Vec<(u16, Proto)> = targets
                .iter()
                .filter_map(|t| Some((t.port?, t.proto)))
                .filter(|pp| !served.contains(pp))
                .collect();
            unserved.sort_by_key(|(p, proto)| (*p, proto.as_str()));
            unserved.dedup();
            let source = inp
                .services
                .source
                .map_or("service table", |s| match s {
                    crate::state::ServiceSource::Ipvs => "IPVS",
                    crate::state::ServiceSource::Iptables => "iptables",
                    crate::state::ServiceSource::Nftables => "nftables",
                });
            let mut evidence = vec![if served.is_empty() {
                format!("{source}: no service for {ip} on any port")
            } else {
                format!("{source}: {ip} served on {} only", port_list(&served))
            }];
            let filtered = !inp.services.access_filter.is_empty();
            if filtered {
                evidence.push(
                    "KUBE-IPVS-FILTER present: calls to other ports are REJECTed \
                     (NETFILTER_DROP, connection refused)"
                        .into(),
                );
            }
            let (severity, summary, port, proto) = if let Some((p, proto)) = unserved.first() {
                evidence.push(format!(
                    "declared but unserved: {} (per {})",
                    port_list(&unserved),
                    targets
                        .iter()
                        .map(|t| t.source.as_str())
                        .next()
                        .unwrap_or("kube-proxy")
                ));
                (
                    Severity::Risk,
                    format!(
                        "LB IP {ip} is bound locally but {} is not served: in-cluster calls are refused",
                        port_list(&unserved)
                    ),
                    *p,
                    *proto,
                )
            } else if served.is_empty() {
                (
                    Severity::Risk,
                    format!(
                        "LB IP {ip} is bound locally and no port of it is served: every in-cluster call is refused"
                    ),
                    0,
                    Proto::Tcp,
                )
            } else {
                (
                    Severity::Warn,
                    format!(
                        "LB IP {ip} is bound locally: in-cluster calls to ports other than {} are refused",
                        port_list(&served)
                    ),
                    0,
                    Proto::Tcp,
                )
            };
            let svc = named(&targets);
            let owner = (!svc.is_empty()).then_some(svc.as_str());
            let mut remedy = remedy::vip_port_unserved(ip, port, proto, owner, filtered);
            remedy.remove(0);
            if port == 0 {
                // No single port to name: keep the general options.
                remedy.remove(0);
            }
            Finding {
                kind: Kind::VipPortUnserved,
                severity,
                subject: ip.to_string(),
                summary,
                evidence,
                remedy,
            }
        })
        .collect()
}

/// A MASQUERADE rule that applies to pods' egress off the node: not kube-proxy's marked
/// masquerade (`KUBE-POSTROUTING` / `--mark` / nftables `masquerading`, which covers only the
/// traffic kube-proxy marked), no set match, no positive destination, and a source (if any)
/// that covers a pod prefix of this node. Read from the rule text the state readers keep.
pub fn covers_pod_egress(rule: &str, pods: &[Prefix]) -> bool {
    if rule.contains("kube-proxy chain masquerading") {
        return false;
    }
    let words: Vec<&str> = rule.split_whitespace().collect();
    if words.get(1) == Some(&"KUBE-POSTROUTING")
        || words
            .iter()
            .any(|w| matches!(*w, "--mark" | "--match-set" | "mark"))
    {
        return false;
    }
    let negated = |i: usize| i > 0 && words[i - 1] == "!";
    let mut src_ok = true;
    for (i, w) in words.iter().enumerate() {
        let value = words.get(i + 1).and_then(|v| Prefix::parse(v).ok());
        match *w {
            "-d" | "--destination" if !negated(i) => return false,
            "-s" | "--source" => {
                let Some(p) = value else { continue };
                let covers = |pod: &Prefix| {
                    if p.len <= pod.len {
                        p.contains(pod.addr)
                    } else {
                        pod.contains(p.addr)
                    }
                };
                src_ok = if negated(i) {
                    pods.iter()
                        .any(|pod| !(p.len <= pod.len && p.contains(pod.addr)))
                } else {
                    pods.iter().any(covers)
                };
            }
            _ => {}
        }
    }
    src_ok
}

/// Failure 2's precondition: pod egress to an LB IP leaves the node without SNAT.
///
/// How it is read from kube-proxy's rules: a call to an LB IP stays on the node when the
/// service table serves that IP:port or the IP is bound (short-circuit: no hairpin, but see
/// the other rules); otherwise it leaves, SNATed when a masquerade rule covers pod egress
/// ([`covers_pod_egress`]) or kube-proxy marks it (IPVS mode: the IP:port is in
/// `KUBE-LOAD-BALANCER` but not in `KUBE-LOAD-BALANCER-LOCAL`, whose rule RETURNs before
/// `KUBE-MARK-MASQ`: externalTrafficPolicy Local, reference 002). Each known LB target that
/// leaves unSNATed is a risk; with none known, unmasqueraded pod egress is one risk for any LB
/// that keeps client addresses.
pub fn hairpin(inp: &Inputs) -> Vec<Finding> {
    if inp.pod_prefixes.is_empty() {
        return Vec::new();
    }
    let pod_masq: Vec<&String> = inp
        .services
        .masquerade_rules
        .iter()
        .filter(|r| covers_pod_egress(r, &inp.pod_prefixes))
        .collect();
    // A node has a /32 route per pod: name a few, count the rest.
    let mut pods = inp
        .pod_prefixes
        .iter()
        .take(3)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if inp.pod_prefixes.len() > 3 {
        pods.push_str(&format!(" and {} more", inp.pod_prefixes.len() - 3));
    }
    let no_masq = match inp.services.masquerade_rules.len() {
        0 => format!("no masquerade rule covers pod egress from {pods} (none found)"),
        n => format!(
            "no masquerade rule covers pod egress from {pods} ({n} masquerade rule(s), all for \
             marked or other traffic)"
        ),
    };
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for t in &inp.lb_targets {
        let key = (t.ip, t.port, t.proto);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let short_circuit = inp.bound.contains(&t.ip)
            || match t.port {
                Some(p) => inp.services.serves(t.ip, p, t.proto).is_some(),
                None => inp.services.services.iter().any(|s| s.vip == t.ip),
            };
        if short_circuit && !t.ip_mode_proxy {
            continue;
        }
        if !pod_masq.is_empty() || t.kube_proxy_masquerades {
            continue;
        }
        let subject = match t.port {
            Some(p) => format!(
                "{}/{}",
                std::net::SocketAddr::new(t.ip, p),
                t.proto.as_str()
            ),
            None => t.ip.to_string(),
        };
        let mut evidence = vec![
            format!(
                "nothing on this node serves {subject}{}: pod calls to it leave for the LB",
                if t.ip_mode_proxy {
                    " (ipMode: Proxy)"
                } else {
                    ""
                }
            ),
            no_masq.clone(),
        ];
        if t.etp_local == Some(true) {
            evidence.push(format!(
                "externalTrafficPolicy: Local (per {}): kube-proxy does not mark pod traffic to \
                 it for masquerade",
                t.source
            ));
        }
        let guard = prevent_loopback(&[t]);
        let severity = if guard.is_empty() {
            Severity::Risk
        } else {
            evidence.push(format!(
                "provider prevent-loopback annotation set ({})",
                guard.join(", ")
            ));
            Severity::Warn
        };
        let svc = t.service.as_deref().unwrap_or("the Service");
        out.push(Finding {
            kind: Kind::Hairpin,
            severity,
            subject: subject.clone(),
            summary: format!(
                "pod calls to LB {subject} ({svc}) leave without SNAT: the LB can send them back to \
                 this node"
            ),
            evidence,
            remedy: hairpin_remedy(svc, t.etp_local == Some(true)),
        });
    }
    if out.is_empty() && pod_masq.is_empty() && seen.is_empty() {
        let mut evidence = vec![
            no_masq,
            "masquerade is read from the iptables nat table and kube-proxy's nftables table: a \
             CNI that masquerades in eBPF (e.g. Cilium) or in its own nftables table is not seen"
                .to_string(),
        ];
        for n in inp.services.nodeports.iter().filter(|n| n.local_only) {
            evidence.push(format!(
                "NodePort {}/{}{} has externalTrafficPolicy: Local rules",
                n.port,
                n.proto.as_str(),
                n.service
                    .as_deref()
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default()
            ));
        }
        let local = inp.services.nodeports.iter().any(|n| n.local_only);
        out.push(Finding {
            kind: Kind::Hairpin,
            severity: Severity::Risk,
            subject: "pod egress".into(),
            summary: format!(
                "pods ({pods}) reach LB IPs this node does not serve without SNAT: an LB that keeps \
                 client addresses can send them back to this node"
            ),
            evidence,
            remedy: hairpin_remedy("the Service", local),
        });
    }
    out
}

fn hairpin_remedy(svc: &str, etp_local: bool) -> Vec<String> {
    let mut out = Vec::new();
    if etp_local {
        out.push(format!(
            "Set externalTrafficPolicy: Cluster on {svc} if the client source IP need not be \
             preserved (kube-proxy then masquerades pod calls to the LB IP)."
        ));
    }
    out.push(format!(
        "Call {svc} by its cluster DNS name (<name>.<namespace>.svc.cluster.local) or ClusterIP \
         from inside the cluster, not the LB address."
    ));
    out.push(
        "Masquerade (SNAT) pod traffic to the LB to the node IP (the CNI's masquerade or \
         ip-masq-agent, without exempting the LB's addresses): the LB then avoids the calling \
         node."
            .into(),
    );
    out.push(
        "Or make the LB source-NAT toward backends, or enable the provider's prevent-loopback \
         option."
            .into(),
    );
    out
}

/// The sysctls that decide whether a looping packet is dropped or answered, per NIC.
pub fn nic_source_validation(inp: &Inputs) -> Vec<Finding> {
    inp.nics
        .iter()
        .map(|n| {
            let rp = match n.rp_filter {
                0 => "off",
                1 => "strict",
                _ => "loose",
            };
            let hairpin = if n.rp_filter == 1 {
                "a looped pod packet is dropped (IP_RPFILTER)"
            } else {
                "a looped pod packet is answered directly, bypassing the LB (the pod resets it)"
            };
            let local = if n.accept_local {
                "a packet from a local address is accepted (its answer stays on the node)"
            } else {
                "a packet from a local address is dropped (martian source)"
            };
            Finding {
                kind: Kind::NicSourceValidation,
                severity: Severity::Info,
                subject: n.name.clone(),
                summary: format!(
                    "rp_filter={} ({rp}) accept_local={} route_localnet={} log_martians={}",
                    n.rp_filter,
                    u8::from(n.accept_local),
                    u8::from(n.route_localnet),
                    u8::from(n.log_martians)
                ),
                evidence: vec![
                    local.into(),
                    hairpin.into(),
                    if n.route_localnet {
                        "route_localnet=1: 127/8 sources and destinations are routed on this NIC"
                            .into()
                    } else {
                        "route_localnet=0: 127/8 on this NIC is dropped".into()
                    },
                ],
                remedy: Vec::new(),
            }
        })
        .collect()
}

/// `kernel.kptr_restrict`: kallsyms without addresses means unresolved drop sites.
pub fn kptr_restrict(inp: &Inputs) -> Vec<Finding> {
    let value = inp
        .kernel
        .kptr_restrict
        .map_or("unreadable".to_string(), |v| v.to_string());
    let (severity, summary, remedy) = if inp.kernel.kallsyms_readable {
        (
            Severity::Info,
            format!("kernel.kptr_restrict={value}: drop sites resolve to kernel symbols"),
            Vec::new(),
        )
    } else {
        (
            Severity::Warn,
            format!(
                "kernel.kptr_restrict={value}: /proc/kallsyms hides addresses, drop sites are \
                 unreadable"
            ),
            vec![
                "Run the agent with CAP_SYSLOG (the DaemonSet adds it) and kernel.kptr_restrict \
                 at most 1; on kernels without drop reasons (< 5.17) a local-source drop is \
                 confirmed only from its site."
                    .into(),
            ],
        )
    };
    vec![Finding {
        kind: Kind::KptrRestrict,
        severity,
        subject: "kernel.kptr_restrict".into(),
        summary,
        evidence: Vec::new(),
        remedy,
    }]
}

/// What the running kernel lets the probe see.
pub fn kernel_visibility(inp: &Inputs) -> Vec<Finding> {
    let k = &inp.kernel;
    let attach = if k.tcx {
        "tcx links"
    } else {
        "clsact qdiscs (no tcx before 6.6)"
    };
    let (severity, summary, evidence, remedy) = match &k.btf_error {
        Some(why) => (
            Severity::Warn,
            format!("kernel {}: no usable BTF: the agent cannot run", k.release),
            vec![why.clone()],
            vec!["Use a node kernel built with CONFIG_DEBUG_INFO_BTF=y.".to_string()],
        ),
        None if !k.drop_reason_arg => {
            (
                Severity::Warn,
                format!(
                    "kernel {}: attaches via {attach}; kfree_skb has no drop reason: drops are told \
                 apart by their site",
                    k.release
                ),
                vec![format!("{} drop reason names in BTF", k.drop_reasons)],
                if k.kallsyms_readable {
                    Vec::new()
                } else {
                    vec!["Make drop sites readable (see kptr_restrict): without reasons they are all \
                      there is."
                    .to_string()]
                },
            )
        }
        None => (
            Severity::Info,
            format!(
                "kernel {}: attaches via {attach}; kfree_skb reports drop reasons ({} names)",
                k.release, k.drop_reasons
            ),
            Vec::new(),
            Vec::new(),
        ),
    };
    vec![Finding {
        kind: Kind::KernelVisibility,
        severity,
        subject: "kernel".into(),
        summary,
        evidence,
        remedy,
    }]
}

/// Whether the Service side was judged.
pub fn kube_api(inp: &Inputs) -> Vec<Finding> {
    let (severity, summary, evidence, remedy) = match &inp.api {
        ApiState::NotUsed => (
            Severity::Info,
            "no API access configured: judged from the node alone (no Service names, \
             policies or annotations)"
                .to_string(),
            Vec::new(),
            vec![
                "Pass --kubeconfig, or run in the cluster (the DaemonSet's service account)."
                    .into(),
            ],
        ),
        ApiState::Read { services, lb_ips } => (
            Severity::Info,
            format!("{services} Service(s) read, {lb_ips} LB ingress IP(s) among them"),
            Vec::new(),
            Vec::new(),
        ),
        ApiState::Failed(why) => (
            Severity::Warn,
            "Services not read: judged from the node alone".to_string(),
            vec![why.clone()],
            vec!["Check the kubeconfig / service account and its RBAC (list services).".into()],
        ),
    };
    vec![Finding {
        kind: Kind::KubeApi,
        severity,
        subject: "kubernetes api".into(),
        summary,
        evidence,
        remedy,
    }]
}

/// `service_self_loop`: a local endpoint that cannot reach itself through its Service. IPVS
/// mode: an endpoint on a pod of this node without its `KUBE-LOOP-BACK` entry (kube-proxy 1.31
/// can drop them, kubernetes#134884). Every mode with br_netfilter on: bridge
/// ports without hairpin mode (the DNAT runs in the bridge, which will not send a frame back
/// out its port; in IPVS mode the reply is un-NATed in the bridge and dies the same way).
pub fn service_self_loop(inp: &Inputs) -> Vec<Finding> {
    use crate::state::{ServiceSource, ipset::loop_back_set};
    let mut out = Vec::new();
    let sl = &inp.self_loop;
    if inp.services.source == Some(ServiceSource::Ipvs) {
        let mut seen = Vec::new();
        for s in &inp.services.services {
            for b in &s.backends {
                let Ok(ep) = b.parse::<std::net::SocketAddr>() else {
                    continue;
                };
                let (ip, port) = (ep.ip(), ep.port());
                if !inp.pod_prefixes.iter().any(|p| p.contains(ip)) || seen.contains(&(ip, port)) {
                    continue;
                }
                seen.push((ip, port));
                let entry = format!("{ip},{}:{port},{ip}", s.proto.as_str());
                let set = loop_back_set(ip.is_ipv6());
                let lacks = match &sl.loop_back {
                    Some(members) if members.contains(&entry) => continue,
                    Some(_) => format!("ipset {set} lacks {entry}"),
                    // Unread (no `ipset` here) is no proof of a missing entry.
                    None => continue,
                };
                out.push(Finding {
                    kind: Kind::ServiceSelfLoop,
                    severity: Severity::Risk,
                    subject: format!("{ep}/{}", s.proto.as_str()),
                    summary: format!(
                        "pod {ip} cannot reach itself through {}: {lacks}",
                        crate::correlate::remedy::sock_of(s.vip, s.port)
                    ),
                    evidence: vec![
                        format!(
                            "IPVS: {ep} is a real server of {}/{}{}, and {ip} is a pod of this \
                             node",
                            crate::correlate::remedy::sock_of(s.vip, s.port),
                            s.proto.as_str(),
                            s.service
                                .as_deref()
                                .map(|n| format!(" ({n})"))
                                .unwrap_or_default()
                        ),
                        format!(
                            "{lacks}: KUBE-POSTROUTING masquerades an endpoint's call to itself \
                             only through it"
                        ),
                    ],
                    remedy: vec![
                        "Upgrade kube-proxy to a release that keeps KUBE-LOOP-BACK complete \
                         (kubernetes#134884), or restart it to rewrite its ipsets."
                            .into(),
                    ],
                });
            }
        }
    }
    if sl.br_netfilter != Some(true) || inp.services.source.is_none() {
        return out;
    }
    let mut bridges: Vec<&str> = sl.bridge_ports.iter().map(|p| p.bridge.as_str()).collect();
    bridges.dedup();
    for br in bridges {
        let off: Vec<&str> = sl
            .bridge_ports
            .iter()
            .filter(|p| p.bridge == br && !p.hairpin_mode)
            .map(|p| p.port.as_str())
            .collect();
        if off.is_empty() {
            continue;
        }
        out.push(Finding {
            kind: Kind::ServiceSelfLoop,
            severity: Severity::Risk,
            subject: br.to_string(),
            summary: format!(
                "{} port(s) of {br} without hairpin mode: their pods cannot reach themselves \
                 through a Service",
                off.len()
            ),
            evidence: vec![
                format!(
                    "ports of {br} with hairpin_mode 0: {}",
                    off.iter().take(5).copied().collect::<Vec<_>>().join(", ")
                ),
                "br_netfilter: net.bridge.bridge-nf-call-iptables = 1: kube-proxy's DNAT runs \
                 while the frame is bridged, so a call DNATed back to its own pod must leave by \
                 the port it came in on"
                    .into(),
            ],
            remedy: vec![format!(
                "Run the kubelet with --hairpin-mode=hairpin-veth (or set `hairpinMode: true` in \
                 the bridge CNI's config); now: echo 1 > /sys/class/net/{br}/brif/<port>/hairpin_mode."
            )],
        });
    }
    out
}
