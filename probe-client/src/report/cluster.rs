//! `kubectl clb-probe report`: the cluster table from the `LoopbackReport` objects and the
//! Node list (pure: the plugin lists, this module judges and renders).
//!
//! A node is `ok` (its report was updated within [`STALE_AFTER`]), `stale` (older: the agent
//! is gone, not ready or cannot write) or `missing` (a Node without a report: no agent ran
//! there with `--node-report on`). A report whose Node is gone is listed as `no-node`.
//! Exit code ([`ClusterView::exit_code`]): 1 when a shown node has a risk or an active loop,
//! else 0; missing and stale nodes are listed and counted, not an exit 1 (a gate must not fail
//! on an unknown; the footer says how many are unknown). Errors exit 2 (the plugin).

use std::collections::{BTreeMap, BTreeSet};

use probe_contract::report::{ReportStatus, parse_rfc3339};
use serde::Serialize;

/// Three heartbeats (the agent's `sink::node_report::api::HEARTBEAT`) without an update: stale.
pub const STALE_AFTER: i64 = 900;
/// Services shown in the table.
pub const TOP_SERVICES: usize = 10;

/// The loop kinds, in column order: (spelling, column header), every kind
/// ([`LoopbackKind::ALL`]). Issue #49: `service_self_loop`, `etp_local_drop` and
/// `proxy_protocol_short_circuit` had no column, so a node row read zeros while the exit code
/// was 1.
pub const KINDS: [(&str, &str); probe_contract::LoopbackKind::ALL.len()] = {
    let mut out = [("", ""); probe_contract::LoopbackKind::ALL.len()];
    let mut i = 0;
    while i < out.len() {
        let k = probe_contract::LoopbackKind::ALL[i];
        out[i] = (k.as_str(), k.column());
        i += 1;
    }
    out
};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeRow {
    pub node: String,
    /// `ok`, `stale`, `missing`, `no-node`.
    pub state: String,
    pub mode: Option<String>,
    pub kernel: Option<String>,
    pub agent_version: Option<String>,
    pub risks: u32,
    /// Active loops by kind (every kind present, 0 included).
    pub active_loops: BTreeMap<String, u32>,
    pub last_update: Option<String>,
    /// Capabilities the agent lacks (what it cannot confirm is in the report).
    pub cannot_confirm: Vec<String>,
    /// `probe check --as nftables` in short (`ready, 2 gone`, `1 new, 2 gone`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nftables_readiness: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServiceRow {
    pub service: String,
    pub active_loops: u32,
    pub risks: u32,
    pub nodes: BTreeSet<String>,
    pub kinds: BTreeSet<String>,
    pub first_fix: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClusterView {
    pub nodes: Vec<NodeRow>,
    /// Most affected first (active loops, then risks, then name); at most [`TOP_SERVICES`].
    pub services: Vec<ServiceRow>,
    pub missing: usize,
    pub stale: usize,
    pub risks: u32,
    pub active_loops: u32,
}

/// What to show.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub service: Option<String>,
    pub node: Option<String>,
}

impl ClusterView {
    /// 1 with a risk or an active loop among the shown nodes, else 0.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.risks > 0 || self.active_loops > 0)
    }
}

/// The view of `nodes` (the Node names) and `reports` (object name, status) at `now`.
pub fn build(
    nodes: &[String],
    reports: &[(String, ReportStatus)],
    now: i64,
    filter: &Filter,
) -> ClusterView {
    let by_name: BTreeMap<&str, &ReportStatus> =
        reports.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let mut names: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    names.extend(by_name.keys());
    let wants_service = |s: &Option<String>| match &filter.service {
        None => true,
        Some(want) => s.as_deref() == Some(want.as_str()),
    };
    let mut view = ClusterView::default();
    let mut services: BTreeMap<String, ServiceRow> = BTreeMap::new();
    for name in names {
        if filter.node.as_deref().is_some_and(|n| n != name) {
            continue;
        }
        let Some(r) = by_name.get(name) else {
            view.missing += 1;
            view.nodes.push(NodeRow {
                node: name.into(),
                state: "missing".into(),
                active_loops: zero_by_kind(),
                ..Default::default()
            });
            continue;
        };
        let state = node_state(nodes.iter().any(|n| n == name), &r.last_update, now);
        if state == "stale" {
            view.stale += 1;
        }
        // A risk on a shared LB IP regards each of its Services, not only the first.
        let risks: Vec<_> = r
            .risks
            .iter()
            .filter(|x| {
                wants_service(&x.service)
                    || x.services.iter().any(|s| wants_service(&Some(s.clone())))
            })
            .collect();
        let loops: Vec<_> = r
            .active_loops
            .iter()
            .filter(|x| wants_service(&x.service))
            .collect();
        if filter.service.is_some() && risks.is_empty() && loops.is_empty() && state == "ok" {
            continue;
        }
        let mut by_kind = zero_by_kind();
        for l in &loops {
            *by_kind.entry(l.kind.clone()).or_insert(0) += 1;
            if let Some(s) = &l.service {
                tally(&mut services, s, name, &l.kind, &l.first_fix).active_loops += 1;
            }
        }
        for x in &risks {
            // Each Service on a shared LB IP counts the risk (an older agent names one).
            let mut named: Vec<&String> = x.services.iter().collect();
            if named.is_empty() {
                named.extend(&x.service);
            }
            for s in named {
                tally(&mut services, s, name, &x.kind, &x.first_fix).risks += 1;
            }
        }
        let risk_count = u32::try_from(risks.len()).unwrap_or(u32::MAX);
        view.risks += risk_count;
        view.active_loops += u32::try_from(loops.len()).unwrap_or(u32::MAX);
        view.nodes
            .push(node_row(name, state, r, risk_count, by_kind));
    }
    view.services = top_services(services);
    view
}

/// Every kind's count at 0.
fn zero_by_kind() -> BTreeMap<String, u32> {
    KINDS.iter().map(|(k, _)| (k.to_string(), 0)).collect()
}

/// `ok`, `stale` (not updated within [`STALE_AFTER`] of `now`) or `no-node` (the report's Node
/// is gone).
fn node_state(has_node: bool, last_update: &str, now: i64) -> &'static str {
    if !has_node {
        "no-node"
    } else if parse_rfc3339(last_update).is_none_or(|t| now - t > STALE_AFTER) {
        "stale"
    } else {
        "ok"
    }
}

/// `service`'s row, noting that `node` has a `kind` for it (and its first fix, if the row has
/// none yet); the caller counts the loop or the risk.
fn tally<'a>(
    services: &'a mut BTreeMap<String, ServiceRow>,
    service: &str,
    node: &str,
    kind: &str,
    first_fix: &Option<String>,
) -> &'a mut ServiceRow {
    let row = services
        .entry(service.to_owned())
        .or_insert_with(|| ServiceRow {
            service: service.to_owned(),
            ..Default::default()
        });
    row.nodes.insert(node.into());
    row.kinds.insert(kind.to_owned());
    if row.first_fix.is_none() {
        row.first_fix = first_fix.clone();
    }
    row
}

/// A node's row from its report.
fn node_row(
    name: &str,
    state: &str,
    r: &ReportStatus,
    risks: u32,
    active_loops: BTreeMap<String, u32>,
) -> NodeRow {
    NodeRow {
        node: name.into(),
        state: state.into(),
        mode: Some(r.kube_proxy_mode.clone()),
        kernel: Some(r.kernel.clone()),
        agent_version: Some(r.agent_version.clone()),
        risks,
        active_loops,
        last_update: Some(r.last_update.clone()),
        cannot_confirm: r.capabilities.iter().map(|c| c.name.clone()).collect(),
        nftables_readiness: (!r.nftables_readiness.is_empty())
            .then(|| r.nftables_readiness.clone()),
    }
}

/// The most affected Services first (active loops, then risks, then nodes, then name), at
/// most [`TOP_SERVICES`].
fn top_services(services: BTreeMap<String, ServiceRow>) -> Vec<ServiceRow> {
    let mut services: Vec<ServiceRow> = services.into_values().collect();
    services.sort_by(|a, b| {
        (b.active_loops, b.risks, b.nodes.len())
            .cmp(&(a.active_loops, a.risks, a.nodes.len()))
            .then(a.service.cmp(&b.service))
    });
    services.truncate(TOP_SERVICES);
    services
}

/// The table's FIRST FIX: a fix's id (`id: what it changes`), else the remedy line cut to 60
/// characters; `-o wide` shows it whole.
fn short_fix(f: &str) -> String {
    if let Some((id, _)) = f.split_once(": ")
        && !id.is_empty()
        && !id.contains(char::is_whitespace)
    {
        return id.to_string();
    }
    if f.chars().count() <= 60 {
        return f.to_string();
    }
    let cut: String = f.chars().take(59).collect();
    format!("{cut}…")
}

/// `12s`, `5m`, `3h`, `2d`.
fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn aligned(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i + 1 == r.len() {
                    s.clone()
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The table (`wide`: `probe check --as nftables` in short, the agent's version and what it
/// cannot confirm). Terminal-unsafe
/// characters in what the API returned are escaped ([`crate::term`]).
pub fn table(view: &ClusterView, now: i64, wide: bool) -> String {
    let esc = |s: &str| crate::term::escape(s).into_owned();
    let dash = || "-".to_string();
    let mut head: Vec<String> = ["NODE", "STATE", "MODE", "KERNEL", "RISKS"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    head.extend(KINDS.iter().map(|(_, h)| h.to_string()));
    head.push("UPDATED".into());
    if wide {
        head.push("NFTABLES".into());
        head.push("AGENT".into());
        head.push("CANNOT-CONFIRM".into());
    }
    let mut rows = vec![head];
    for n in &view.nodes {
        let known = n.state != "missing";
        let mut row = vec![
            esc(&n.node),
            n.state.clone(),
            n.mode.as_deref().map_or_else(dash, esc),
            n.kernel.as_deref().map_or_else(dash, esc),
            if known { n.risks.to_string() } else { dash() },
        ];
        for (k, _) in KINDS {
            row.push(if known {
                n.active_loops.get(k).copied().unwrap_or(0).to_string()
            } else {
                dash()
            });
        }
        row.push(
            n.last_update
                .as_deref()
                .and_then(parse_rfc3339)
                .map_or_else(dash, |t| age(now - t)),
        );
        if wide {
            row.push(n.nftables_readiness.as_deref().map_or_else(dash, esc));
            row.push(n.agent_version.as_deref().map_or_else(dash, esc));
            row.push(if n.cannot_confirm.is_empty() {
                dash()
            } else {
                esc(&n.cannot_confirm.join(","))
            });
        }
        rows.push(row);
    }
    let mut out = aligned(&rows);
    if !view.services.is_empty() {
        out.push('\n');
        let mut rows = vec![
            [
                "SERVICE",
                "ACTIVE-LOOPS",
                "RISKS",
                "NODES",
                "KINDS",
                "FIRST FIX",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
        ];
        for s in &view.services {
            rows.push(vec![
                esc(&s.service),
                s.active_loops.to_string(),
                s.risks.to_string(),
                s.nodes.len().to_string(),
                esc(&s.kinds.iter().cloned().collect::<Vec<_>>().join(",")),
                s.first_fix
                    .as_deref()
                    .map_or_else(dash, |f| if wide { esc(f) } else { esc(&short_fix(f)) }),
            ]);
        }
        out.push_str(&aligned(&rows));
    }
    out.push('\n');
    out.push_str(&format!(
        "{} nodes: {} risks, {} active loops; {} without a report (missing), {} stale (no update for {}m)\n",
        view.nodes.len(),
        view.risks,
        view.active_loops,
        view.missing,
        view.stale,
        STALE_AFTER / 60
    ));
    out
}

#[cfg(test)]
mod tests {
    use probe_contract::report::{ActiveLoop, RiskStatus, rfc3339};

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn report(
        node: &str,
        updated: i64,
        loops: &[(&str, &str)],
        risks: &[&str],
    ) -> (String, ReportStatus) {
        (
            node.into(),
            ReportStatus {
                node: node.into(),
                agent_version: "0.1.0".into(),
                kernel: "6.12.0".into(),
                kube_proxy_mode: "ipvs".into(),
                active_loops: loops
                    .iter()
                    .map(|(kind, svc)| ActiveLoop {
                        kind: kind.to_string(),
                        service: Some(svc.to_string()),
                        vip: "203.0.113.10:80".into(),
                        first_fix: Some("etp-cluster: set externalTrafficPolicy Cluster".into()),
                        ..Default::default()
                    })
                    .collect(),
                risks: risks
                    .iter()
                    .map(|svc| RiskStatus {
                        kind: "healthcheck_blackhole".into(),
                        subject: "203.0.113.10".into(),
                        service: Some(svc.to_string()),
                        ..Default::default()
                    })
                    .collect(),
                last_update: rfc3339(updated),
                ..Default::default()
            },
        )
    }

    fn nodes(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    /// Issue #49: the later kinds had no column, so a node with only such a loop read zeros
    /// while the exit code was 1.
    #[test]
    fn every_kind_has_its_column() {
        let reports = vec![report(
            "node-a",
            NOW - 5,
            &[
                ("etp_local_drop", "shop/web"),
                ("proxy_protocol_short_circuit", "shop/pp"),
            ],
            &[],
        )];
        let v = build(&nodes(&["node-a"]), &reports, NOW, &Filter::default());
        let text = table(&v, NOW, false);
        let head: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        let at = |col: &str| row[head.iter().position(|h| *h == col).unwrap()];
        assert_eq!(at("ETP-LOCAL-DROP"), "1", "{text}");
        assert_eq!(at("PROXY-PROTOCOL"), "1", "{text}");
        assert_eq!(at("SELF-LOOP"), "0", "{text}");
        assert_eq!(KINDS.len(), probe_contract::LoopbackKind::ALL.len());
    }

    #[test]
    fn missing_stale_and_ok_nodes_with_loops_by_kind_and_services() {
        let reports = vec![
            report(
                "node-a",
                NOW - 5,
                &[("hairpin", "shop/web"), ("hairpin", "shop/api")],
                &["shop/web"],
            ),
            report("node-b", NOW - STALE_AFTER - 1, &[], &[]),
        ];
        let v = build(
            &nodes(&["node-a", "node-b", "node-c"]),
            &reports,
            NOW,
            &Filter::default(),
        );
        let states: Vec<_> = v
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [("node-a", "ok"), ("node-b", "stale"), ("node-c", "missing")]
        );
        assert_eq!((v.missing, v.stale, v.risks, v.active_loops), (1, 1, 1, 2));
        assert_eq!(v.nodes[0].active_loops["hairpin"], 2);
        assert_eq!(v.services[0].service, "shop/web", "loops then risks");
        assert_eq!((v.services[0].active_loops, v.services[0].risks), (1, 1));
        assert_eq!(v.exit_code(), 1);
        let t = table(&v, NOW, false);
        assert!(t.lines().next().unwrap().starts_with("NODE"), "{t}");
        assert!(t.contains("node-c  missing"), "{t}");
        assert!(t.contains("1 without a report (missing), 1 stale"), "{t}");
    }

    /// Issue 35 item 9: a black-holed LB IP shared by two Services is a risk of each.
    #[test]
    fn a_risk_on_a_shared_lb_ip_is_each_services() {
        let (name, mut status) = report("node-a", NOW, &[], &["shop/web"]);
        status.risks[0].services = vec!["shop/web".into(), "shop/api".into()];
        let reports = vec![(name, status)];
        let second = build(
            &nodes(&["node-a"]),
            &reports,
            NOW,
            &Filter {
                service: Some("shop/api".into()),
                node: None,
            },
        );
        assert_eq!(
            second.exit_code(),
            1,
            "the second Service's LB IP is black-holed"
        );
        assert_eq!(second.risks, 1);
        let all = build(&nodes(&["node-a"]), &reports, NOW, &Filter::default());
        let rows: Vec<&str> = all.services.iter().map(|r| r.service.as_str()).collect();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert!(
            rows.contains(&"shop/api") && rows.contains(&"shop/web"),
            "{rows:?}"
        );
    }

    #[test]
    fn filters_and_a_clean_cluster_exits_0() {
        let reports = vec![
            report("node-a", NOW, &[("hairpin", "shop/web")], &[]),
            report("node-b", NOW, &[], &[]),
        ];
        let all = nodes(&["node-a", "node-b"]);
        let filtered = |service: Option<&str>, node: Option<&str>| {
            let filter = Filter {
                service: service.map(Into::into),
                node: node.map(Into::into),
            };
            build(&all, &reports, NOW, &filter)
        };
        let by_svc = filtered(Some("shop/other"), None);
        assert!(by_svc.nodes.is_empty());
        assert_eq!(by_svc.exit_code(), 0);
        let b = filtered(None, Some("node-b"));
        assert_eq!(b.nodes.len(), 1);
        assert_eq!(b.exit_code(), 0);
        let a = filtered(Some("shop/web"), None);
        assert_eq!(a.nodes.len(), 1);
        assert_eq!(a.exit_code(), 1);
    }

    #[test]
    fn a_report_without_its_node_is_listed_as_such() {
        let v = build(
            &nodes(&[]),
            &[report("gone", NOW, &[], &[])],
            NOW,
            &Filter::default(),
        );
        assert_eq!(v.nodes[0].state, "no-node");
    }

    #[test]
    fn wide_shows_each_nodes_nftables_readiness() {
        let (name, mut st) = report("node-a", NOW, &[], &["shop/web"]);
        st.nftables_readiness = "1 new, 2 gone".into();
        let v = build(
            &nodes(&["node-a", "node-b"]),
            &[(name, st), report("node-b", NOW, &[], &[])],
            NOW,
            &Filter::default(),
        );
        assert_eq!(
            v.nodes[0].nftables_readiness.as_deref(),
            Some("1 new, 2 gone")
        );
        let wide = table(&v, NOW, true);
        let head = wide.lines().next().unwrap();
        assert!(
            head.ends_with("NFTABLES       AGENT  CANNOT-CONFIRM"),
            "{wide}"
        );
        assert!(wide.contains("1 new, 2 gone  0.1.0"), "{wide}");
        assert!(!table(&v, NOW, false).contains("NFTABLES"));
    }
}
