//! `mode_leftover`: another kube-proxy mode's state left on the node (issue 39, IPVS
//! retirement). kube-proxy does not delete its rules on exit (KEP-3866, "kube-proxy does not
//! delete its rules on exit ... when switching between proxy modes, it is necessary for the
//! administrator to ensure that the rules created by the old proxy mode get deleted"); a
//! kube-proxy started in a new mode removes the old mode's state (kubernetes.io blog
//! 2025-02-28, "NFTables mode for kube-proxy"; kubernetes PR #131243, "cleanup on kube-proxy
//! mode switch"), and IPVS mode's cleanup flushes IPVS, deletes kube-ipvs0 and destroys its
//! ipsets (kubernetes `pkg/proxy/ipvs/proxier.go`, `cleanupLeftovers`). So kube-ipvs0 or IPVS
//! services on a node whose kube-proxy runs nftables or iptables mode (or was replaced, e.g.
//! by Cilium's kube-proxy replacement, which runs no kube-proxy cleanup) are leftovers.
//!
//! What matters for loopback is kube-ipvs0's addresses: each keeps an LB IP local after the
//! switch, so the LB's health checks from it are still black-holed and calls to its unserved
//! ports still refused: the failures the switch was meant to end. Leftover IPVS services and
//! a leftover nftables table do not make addresses local, but they are stale state (the
//! nftables table's prerouting DNAT runs before IPVS, to old endpoints) and the probe's
//! service table may come from them: a warning.
//!
//! Which mode is live: what kube-proxy says (`/proxyMode` on its metrics port) when it
//! answers; else nftables when the service table came from kube-proxy's nftables table, and
//! none without kube-proxy rules. KUBE-* iptables rules alone prove nothing (IPVS mode writes
//! them too, and an IPVS reader without the module sees no service), and IPVS services beside
//! a nftables table leave the live one unknown: then both are named, the leftover not guessed.

use std::net::IpAddr;

use probe_contract::check::{Finding, Kind, Mode, Severity};

use crate::check::Inputs;

/// Addresses listed in a finding's evidence at most (a node can hold thousands).
const LISTED: usize = 8;

pub fn mode_leftover(inp: &Inputs) -> Vec<Finding> {
    let Some(dataplane) = &inp.dataplane else {
        return Vec::new();
    };
    let state = &inp.leftovers;
    let (live, said) = match state.proxy_mode.as_deref().and_then(mode_named) {
        Some(m) => (
            m,
            format!("kube-proxy says it runs {} mode (/proxyMode)", m.as_str()),
        ),
        None => match dataplane.mode {
            m @ (Mode::Nftables | Mode::None) => (
                m,
                format!("the service table was read from {}", dataplane.name()),
            ),
            Mode::Ipvs if state.nft_services > 0 => {
                return vec![both_modes(inp.services.services.len(), state.nft_services)];
            }
            // iptables rules or IPVS services alone: IPVS mode cannot be told from a leftover.
            Mode::Iptables | Mode::Ipvs => return Vec::new(),
        },
    };
    let mut out = Vec::new();
    if live != Mode::Ipvs {
        // Addresses of the VIP interface itself (not those a local route makes local).
        let held: Vec<IpAddr> = inp
            .bound
            .iter()
            .filter(|ip| {
                matches!(
                    inp.owners.get(ip),
                    None | Some(probe_contract::facts::AddressOwner::VipInterface { .. })
                )
            })
            .copied()
            .collect();
        let ipvs = if dataplane.mode == Mode::Ipvs {
            inp.services.services.len()
        } else {
            state.ipvs_services
        };
        if state.vip_iface_present && !held.is_empty() {
            out.push(Finding {
                kind: Kind::ModeLeftover,
                severity: Severity::Risk,
                subject: inp.vip_iface.clone(),
                summary: format!(
                    "{} still holds {} address(es) though kube-proxy runs {}: IPVS mode's \
                     leftover keeps these LB IPs local (health checks from them black-holed, \
                     calls to their unserved ports refused)",
                    inp.vip_iface,
                    held.len(),
                    live_name(live),
                ),
                evidence: evidence(&said, &inp.vip_iface, &held, ipvs),
                remedy: remedy(&inp.vip_iface),
                fixes: Vec::new(),
            });
        } else if ipvs > 0 {
            out.push(Finding {
                kind: Kind::ModeLeftover,
                severity: Severity::Warn,
                subject: "ipvs".into(),
                summary: format!(
                    "IPVS still holds {ipvs} virtual service(s) though kube-proxy runs {}: \
                     stale state from IPVS mode",
                    live_name(live)
                ),
                evidence: evidence(&said, &inp.vip_iface, &held, ipvs),
                remedy: remedy(&inp.vip_iface),
                fixes: Vec::new(),
            });
        }
    }
    if live != Mode::Nftables && state.nft_services > 0 {
        out.push(Finding {
            kind: Kind::ModeLeftover,
            severity: Severity::Warn,
            subject: "table ip kube-proxy".into(),
            summary: format!(
                "kube-proxy's nftables table still holds {} Service(s) though kube-proxy runs \
                 {}: its DNAT runs in prerouting, to the endpoints it had then",
                state.nft_services,
                live_name(live)
            ),
            evidence: vec![said],
            remedy: vec![
                "Restart kube-proxy in its mode (it removes the other modes' rules at start), \
                 or delete the table: `nft delete table ip kube-proxy` (and `ip6 kube-proxy`)."
                    .into(),
            ],
            fixes: Vec::new(),
        });
    }
    out
}

/// IPVS and kube-proxy's nftables table both hold services and kube-proxy did not say which
/// mode it runs: one of them is a leftover.
fn both_modes(ipvs: usize, nft: usize) -> Finding {
    Finding {
        kind: Kind::ModeLeftover,
        severity: Severity::Warn,
        subject: "ipvs, table ip kube-proxy".into(),
        summary: format!(
            "IPVS ({ipvs} virtual services) and kube-proxy's nftables table ({nft} Services) \
             both hold Services: one mode's state is a leftover"
        ),
        evidence: vec![
            "kube-proxy's /proxyMode did not answer on 127.0.0.1:10249 (another \
             --metrics-bind-address?)"
                .into(),
        ],
        remedy: vec![
            "Ask kube-proxy (`curl 127.0.0.1:10249/proxyMode`, or its ConfigMap's `mode`), then \
             run the other mode's cleanup (`kube-proxy --proxy-mode=<old> --cleanup`) or \
             restart kube-proxy in its mode (it removes the other modes' state at start)."
                .into(),
        ],
        fixes: Vec::new(),
    }
}

/// `/proxyMode`'s answer as a mode.
fn mode_named(s: &str) -> Option<Mode> {
    match s.trim() {
        "iptables" => Some(Mode::Iptables),
        "ipvs" => Some(Mode::Ipvs),
        "nftables" => Some(Mode::Nftables),
        _ => None,
    }
}

fn live_name(mode: Mode) -> String {
    match mode {
        Mode::None => "nowhere on this node (no kube-proxy rules)".into(),
        m => format!("{} mode", m.as_str()),
    }
}

fn evidence(said: &str, iface: &str, held: &[IpAddr], ipvs: usize) -> Vec<String> {
    let mut out = vec![said.to_string()];
    if !held.is_empty() {
        let mut list: Vec<String> = held.iter().take(LISTED).map(|ip| ip.to_string()).collect();
        if held.len() > LISTED {
            list.push(format!("and {} more", held.len() - LISTED));
        }
        out.push(format!("{iface} addresses: {}", list.join(", ")));
    }
    if ipvs > 0 {
        out.push(format!("IPVS virtual services: {ipvs}"));
    }
    out
}

fn remedy(iface: &str) -> Vec<String> {
    vec![
        "Run IPVS mode's cleanup once: `kube-proxy --proxy-mode=ipvs --cleanup` (flushes IPVS, \
         deletes kube-ipvs0, its iptables rules and ipsets), or restart kube-proxy in its new \
         mode (it removes the other modes' state at start), or reboot the node."
            .into(),
        format!(
            "By hand: `ip link delete {iface}` (its addresses and their local routes go with \
             it) and `ipvsadm --clear`."
        ),
    ]
}
