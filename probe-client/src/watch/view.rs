//! The view model of `probe watch`, built from the protocol's messages (pure; unit-tested).
//!
//! Every string taken from the agent is escaped here ([`crate::term::escape`]), once, so the
//! plain snapshot and the terminal UI, which both render only this model, never print a raw
//! control character: NIC names, Kubernetes names and the evidence built from them come from
//! whoever named the interface or the object.

use std::{
    collections::{BTreeMap, VecDeque},
    fmt::Display,
};

use probe_contract::{LoopbackEvent, Snapshot};

use crate::term::escape;

/// `s` escaped for the terminal, owned.
fn esc(s: &str) -> String {
    escape(s).into_owned()
}

/// One confirmed aggregate as the view shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub key: String,
    pub kind: String,
    pub vip: String,
    pub port: String,
    pub count: u64,
    pub outcome: String,
    pub flow: String,
    pub reason: String,
    pub evidence: Vec<String>,
    pub remedy: Vec<String>,
    /// The first [`FIXES_SHOWN`] fixes, one line each (`id: change`).
    pub fixes: Vec<String>,
    /// Events per second over the recent snapshots (client-side).
    pub rate: f64,
}

impl Row {
    pub fn from_event(e: &LoopbackEvent) -> Row {
        Row {
            key: esc(&e.key),
            kind: e.kind.as_str().to_string(),
            vip: or_dash(e.vip),
            port: or_dash(e.vip_port),
            count: e.count,
            outcome: e.outcome.as_str().to_string(),
            flow: format!(
                "{}:{} -> {}:{}{}",
                e.src,
                e.src_port,
                e.dst,
                e.dst_port,
                names(e)
            ),
            reason: or_dash(e.drop_reason.as_deref().map(esc)),
            evidence: e.evidence.iter().map(|l| esc(l)).collect(),
            remedy: e.remedy.iter().map(|l| esc(l)).collect(),
            fixes: fix_lines(e),
            rate: 0.0,
        }
    }

    fn matches(&self, filter: &str) -> bool {
        filter.is_empty()
            || [&self.kind, &self.vip, &self.flow]
                .iter()
                .any(|f| f.contains(filter))
    }
}

/// Fixes shown in the detail pane (the JSON and `kubectl clb-probe fix` have them all).
pub const FIXES_SHOWN: usize = 3;

/// `id: change`, plus the command that applies it when it patches a named Service.
fn fix_lines(e: &LoopbackEvent) -> Vec<String> {
    e.fixes
        .iter()
        .take(FIXES_SHOWN)
        .map(|f| {
            match (
                &f.patch,
                f.service.as_deref().and_then(|s| s.split_once('/')),
            ) {
                (Some(_), Some((ns, name))) => format!(
                    "{} [kubectl clb-probe fix -n {ns} {name} --apply {}]",
                    f.short(),
                    f.id
                ),
                _ => f.short(),
            }
        })
        .map(|l| esc(&l))
        .collect()
}

/// A value, or `-` when there is none.
fn or_dash(v: Option<impl Display>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Kubernetes attribution's names of a flow (` [pod ns/name, svc ns/name]`), or nothing.
fn names(e: &LoopbackEvent) -> String {
    let names: Vec<String> = [("pod", &e.client_pod), ("svc", &e.service)]
        .iter()
        .filter_map(|(label, v)| v.as_ref().map(|v| format!("{label} {}", escape(v))))
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" [{}]", names.join(", "))
    }
}

/// Everything on the screen.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub node: String,
    pub nics: String,
    pub vip_iface: String,
    /// What serves the node's Services (`kube-proxy ipvs`, `none (cilium)`), or `-`.
    pub dataplane: String,
    pub sets: String,
    pub kernel: String,
    pub features: String,
    pub suspects: BTreeMap<String, u64>,
    pub drops: BTreeMap<String, u64>,
    pub rows: Vec<Row>,
    /// Recent reports, newest first: (kind, flow, vip:port, outcome).
    pub recent: VecDeque<String>,
    pub selected: usize,
    pub paused: bool,
    pub filter: String,
    pub help: bool,
    /// Counts of each aggregate at the last snapshots, for rates: (key -> [(t, count)]).
    history: BTreeMap<String, VecDeque<(f64, u64)>>,
}

/// How many recent reports the list keeps.
const RECENT: usize = 100;
/// Rate window, seconds.
const RATE_WINDOW: f64 = 10.0;

impl Model {
    pub fn from_snapshot(snap: &Snapshot) -> Model {
        let mut m = Model::default();
        m.apply_snapshot(snap, 0.0);
        m
    }

    /// Applies a snapshot taken at `t` seconds (client clock) and recomputes rates.
    pub fn apply_snapshot(&mut self, snap: &Snapshot, t: f64) {
        let st = &snap.status;
        self.node = esc(&snap.node);
        self.nics = st
            .nics
            .iter()
            .map(|n| esc(n))
            .collect::<Vec<_>>()
            .join(", ");
        self.vip_iface = format!(
            "{} ({})",
            escape(&st.vip_iface),
            if st.vip_iface_present {
                "present"
            } else {
                "absent"
            }
        );
        self.dataplane = if st.dataplane.is_empty() {
            "-".into()
        } else {
            esc(&st.dataplane)
        };
        self.sets = ["vip", "node", "pod"]
            .iter()
            .map(|k| format!("{k} {}", st.set_sizes.get(*k).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(", ");
        let f = st.features.as_ref();
        self.kernel = or_dash(f.map(|f| esc(&f.kernel)));
        self.features = format!(
            "tc via {}, drops via {}",
            or_dash(f.map(|f| f.tc_mode.as_str())),
            or_dash(f.map(|f| f.drop_hook.as_str()))
        );
        self.suspects.clear();
        for (_, tag, _, n) in &snap.counters.suspects {
            *self.suspects.entry(tag.as_str().to_string()).or_insert(0) += n;
        }
        self.drops = snap
            .drops_by_reason
            .iter()
            .map(|(k, v)| (esc(k), *v))
            .collect();
        let mut rows: Vec<Row> = snap.confirmed.iter().map(Row::from_event).collect();
        rows.sort_by(|a, b| (&a.kind, &a.vip, &a.port).cmp(&(&b.kind, &b.vip, &b.port)));
        for row in &mut rows {
            let h = self.history.entry(row.key.clone()).or_default();
            h.push_back((t, row.count));
            while h.front().is_some_and(|(t0, _)| t - t0 > RATE_WINDOW) {
                h.pop_front();
            }
            row.rate = match (h.front(), h.back()) {
                (Some((t0, c0)), Some((t1, c1))) if t1 > t0 => (c1 - c0) as f64 / (t1 - t0),
                _ => 0.0,
            };
        }
        self.rows = rows;
        self.selected = self.selected.min(self.visible().len().saturating_sub(1));
    }

    pub fn apply_report(&mut self, event: &LoopbackEvent, is_new: bool) {
        let r = Row::from_event(event);
        self.recent.push_front(format!(
            "{} {:<22} {} vip {}:{} {}",
            if is_new { "NEW" } else { "   " },
            r.kind,
            r.flow,
            r.vip,
            r.port,
            r.outcome
        ));
        self.recent.truncate(RECENT);
    }

    /// Rows that pass the filter.
    pub fn visible(&self) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| r.matches(&self.filter))
            .collect()
    }

    pub fn select_next(&mut self) {
        let n = self.visible().len();
        if n > 0 {
            self.selected = (self.selected + 1).min(n - 1);
        }
    }

    pub fn select_prev(&mut self) {
        self.selected = self.selected.saturating_sub(1);
    }

    pub fn selected_row(&self) -> Option<&Row> {
        self.visible().get(self.selected).copied()
    }

    pub fn header_lines(&self) -> Vec<String> {
        vec![
            format!(
                "clb-probe on {}   kernel {}   {}",
                self.node, self.kernel, self.features
            ),
            format!(
                "NICs: {}   VIP interface: {}   address sets: {}",
                self.nics, self.vip_iface, self.sets
            ),
            format!(
                "suspect packets: {}   drops: {}   dataplane: {}",
                join_counts(&self.suspects),
                join_counts(&self.drops),
                self.dataplane
            ),
        ]
    }
}

fn join_counts(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The plain-text snapshot (`probe watch --once`, or stdout not a terminal).
pub fn plain(m: &Model) -> String {
    let mut out = String::new();
    for l in m.header_lines() {
        out.push_str(&l);
        out.push('\n');
    }
    out.push('\n');
    if m.rows.is_empty() {
        out.push_str("no confirmed loopback events\n");
        return out;
    }
    out.push_str(&format!(
        "{:<22} {:<16} {:<5} {:>6}  {:<9} {:<16} FLOW\n",
        "KIND", "VIP", "PORT", "COUNT", "OUTCOME", "REASON"
    ));
    for r in &m.rows {
        out.push_str(&format!(
            "{:<22} {:<16} {:<5} {:>6}  {:<9} {:<16} {}\n",
            r.kind, r.vip, r.port, r.count, r.outcome, r.reason, r.flow
        ));
    }
    for r in &m.rows {
        out.push_str(&format!("\n{} {}:{}\n  evidence:\n", r.kind, r.vip, r.port));
        for e in &r.evidence {
            out.push_str(&format!("    - {e}\n"));
        }
        out.push_str("  remedy:\n");
        for e in &r.remedy {
            out.push_str(&format!("    - {e}\n"));
        }
        if !r.fixes.is_empty() {
            out.push_str("  fixes:\n");
            for e in &r.fixes {
                out.push_str(&format!("    - {e}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The snapshot as the wire carries it (only what the view shows, the rest defaulted).
    fn snap(count: u64) -> Snapshot {
        serde_json::from_value(serde_json::json!({
            "node": "node-1",
            "status": {
                "nics": ["eth0"], "vip_iface": "kube-ipvs0", "vip_iface_present": true,
                "dataplane": "kube-proxy ipvs",
                "set_sizes": {"vip": 1, "node": 4, "pod": 2},
                "features": {"kernel": "6.18.44", "tc_mode": "tcx", "drop_hook": "tp_btf",
                             "drop_reason_arg": true, "drop_reasons": 120}
            },
            "counters": {"suspects": [[2, "vip", "tcp", 3], [2, "pod", "tcp", 2]]},
            "drops_by_reason": {"IP_LOCAL_SOURCE": 2},
            "confirmed": [
                {"key": "a", "kind": "vip_port_unserved", "vip": "203.0.113.10", "vip_port": 443,
                 "count": count, "outcome": "refused", "src": "198.19.1.10", "src_port": 1,
                 "dst": "203.0.113.10", "dst_port": 443, "drop_reason": "NO_SOCKET",
                 "evidence": ["kfree_skb ..."], "remedy": ["serve the port"], "proto": "tcp",
                 "snat": "unknown", "first_seen_ns": 1, "last_seen_ns": 2},
                {"key": "b", "kind": "healthcheck_blackhole", "vip": "203.0.113.10",
                 "vip_port": null, "count": 1, "outcome": "dropped", "src": "203.0.113.10",
                 "src_port": 2, "dst": "198.18.0.2", "dst_port": 30080,
                 "drop_reason": "IP_LOCAL_SOURCE", "evidence": [], "remedy": [],
                 "proto": "tcp", "snat": "unknown", "first_seen_ns": 1, "last_seen_ns": 2}
            ]
        }))
        .unwrap()
    }

    /// A hairpin from 198.19.1.10:1 to 198.18.0.2:30080, with these names.
    fn hairpin(client_pod: Option<&str>, service: Option<&str>) -> LoopbackEvent {
        use probe_contract::{LoopbackKind, Outcome, Proto, SnatState};
        LoopbackEvent {
            kind: LoopbackKind::Hairpin,
            key: "k".into(),
            src: "198.19.1.10".parse().unwrap(),
            src_port: 1,
            dst: "198.18.0.2".parse().unwrap(),
            dst_port: 30080,
            vip: None,
            vip_port: None,
            proto: Proto::Tcp,
            drop_reason: None,
            drop_location: None,
            snat: SnatState::No,
            outcome: Outcome::Reset,
            count: 1,
            evidence: Vec::new(),
            remedy: Vec::new(),
            first_seen_ns: 1,
            last_seen_ns: 2,
            nic: None,
            service: service.map(String::from),
            layer: None,
            client_pod: client_pod.map(String::from),
            node: None,
            fixes: Vec::new(),
            facts: Default::default(),
            listener: None,
        }
    }

    #[test]
    fn flows_carry_the_pod_and_service_names_when_known() {
        let named = hairpin(Some("default/client-1"), Some("default/web:http"));
        assert_eq!(
            Row::from_event(&named).flow,
            "198.19.1.10:1 -> 198.18.0.2:30080 [pod default/client-1, svc default/web:http]"
        );
        let bare = hairpin(None, None);
        assert_eq!(
            Row::from_event(&bare).flow,
            "198.19.1.10:1 -> 198.18.0.2:30080"
        );
    }

    #[test]
    fn plain_snapshot_has_header_rows_evidence_and_remedy() {
        let text = plain(&Model::from_snapshot(&snap(3)));
        for needle in [
            "clb-probe on node-1",
            "kube-ipvs0 (present)",
            "address sets: vip 1, node 4, pod 2",
            "suspect packets: pod 2, vip 3",
            "IP_LOCAL_SOURCE 2",
            "dataplane: kube-proxy ipvs",
            "healthcheck_blackhole  203.0.113.10     -",
            "vip_port_unserved      203.0.113.10     443",
            "- serve the port",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    /// A NIC, a pod and evidence named with terminal controls (CSI, OSC + BEL, C1 CSI): the
    /// plain snapshot shows them escaped, never raw (the TUI renders the same model).
    #[test]
    fn names_from_the_node_are_escaped() {
        let mut s = snap(3);
        s.status.nics = vec!["eth0".into(), "e\x1b[2J\x1b]0;x\x07".into()];
        s.node = "n\u{9b}31m".into();
        s.confirmed[0].client_pod = Some("ns/\x1b[32mALL CLEAR".into());
        s.confirmed[0].evidence = vec!["dropped on \x1b]8;;x\x07".into()];
        s.drops_by_reason = BTreeMap::from([("\x1b[H".to_string(), 1)]);
        let text = plain(&Model::from_snapshot(&s));
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "raw control characters in\n{text:?}"
        );
        for needle in [
            "e\\x1b[2J\\x1b]0;x\\x07",
            "n\\u{9b}31m",
            "pod ns/\\x1b[32mALL CLEAR",
            "dropped on \\x1b]8;;x\\x07",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    #[test]
    fn the_detail_shows_the_first_three_fixes_with_their_command() {
        let mut e = hairpin(None, Some("shop/web:http"));
        e.fixes = [
            "etp-cluster",
            "call-by-service-name",
            "snat-pod-egress-to-lb",
            "fourth",
        ]
        .iter()
        .enumerate()
        .map(|(i, id)| probe_contract::Fix {
            id: id.to_string(),
            provider: "generic".into(),
            change: "c".into(),
            service: (i == 0).then(|| "shop/web".into()),
            patch: (i == 0).then(|| serde_json::json!({})),
            undo: (i == 0).then(|| serde_json::json!({})),
            preconditions: vec![],
            side_effects: vec![],
            source: "https://example.invalid/".into(),
        })
        .collect();
        let mut snapshot = snap(1);
        snapshot.confirmed = vec![e];
        let text = plain(&Model::from_snapshot(&snapshot));
        assert!(
            text.contains(
                "  fixes:\n    - etp-cluster: c [kubectl clb-probe fix -n shop web --apply etp-cluster]\n    - call-by-service-name: c\n    - snat-pod-egress-to-lb: c\n"
            ),
            "{text}"
        );
        assert!(!text.contains("fourth"), "{text}");
        assert!(!plain(&Model::from_snapshot(&snap(1))).contains("fixes:"));
    }

    #[test]
    fn rates_filter_and_selection() {
        let mut m = Model::from_snapshot(&snap(3));
        m.apply_snapshot(&snap(13), 5.0);
        let unserved = m.rows.iter().find(|r| r.key == "a").unwrap();
        assert!((unserved.rate - 2.0).abs() < 1e-9, "{}", unserved.rate);
        assert_eq!(m.visible().len(), 2);
        m.select_next();
        m.select_next();
        assert_eq!(m.selected, 1, "selection stops at the last row");
        m.filter = "unserved".into();
        assert_eq!(m.visible().len(), 1);
        m.apply_snapshot(&snap(13), 6.0);
        assert_eq!(m.selected, 0, "selection clamped to the filtered rows");
        assert_eq!(m.selected_row().unwrap().kind, "vip_port_unserved");
    }
}
