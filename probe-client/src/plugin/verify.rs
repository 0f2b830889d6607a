//! `kubectl clb-probe verify [-n NS] SERVICE [--node NODE]...` (#40), the pure part: which
//! nodes to ask, the request's spec, the answers as a table or JSON, the exit code. The plugin
//! creates a `LoopbackVerification` (generated name), waits until every chosen node answered
//! (`--timeout`, bounded), prints, and deletes the request (`api::run_verification`). No exec,
//! no port on the agents: the request and its answers go through the API server.
//!
//! Exit codes: 0 nothing confirmed and nothing unproven (every answer clean or not testable),
//! 3 a loop confirmed on some node, 4 not proven (no loop confirmed, but some test got no
//! answer: silence is no verdict), 1 an error (a node did not answer in time: named; the
//! Service does not exist; RBAC forbids creating the request), 2 a usage error.
//!
//! "Resolved" (`fix --apply ID --verify`, [`Verification::resolved`]): every node that had the
//! loop answered, nothing was confirmed, and each loop it had (its kind, from its own client,
//! at its LB IP:port: the results marked `looped`) was tested and is clean. A loop that could
//! not be tested from its client, or whose test got no answer, is not resolved.

use std::{collections::BTreeMap, fmt::Write as _};

use probe_contract::{
    report::ReportStatus,
    verify::{NodeVerification, Phase, ServiceRef, VerificationSpec, VerifyOutcome},
};
use serde::{Deserialize, Serialize};

/// The exit code when a loop was confirmed.
pub const CONFIRMED_EXIT: u8 = 3;
/// The exit code when nothing was confirmed but something was not proven (a test with no
/// answer), or `fix --verify` could not prove every loop gone.
pub const NOT_PROVEN_EXIT: u8 = 4;
/// `--timeout`'s default and bounds (seconds): a node tests at most 8 targets x 3 connections
/// x 1.5 s + 2.5 s (the agent's `verify` bounds), and waits for its turn.
pub const DEFAULT_TIMEOUT_S: u64 = 60;
pub const MAX_TIMEOUT_S: u64 = 120;

/// The nodes to ask about `service` (`namespace/name`) when none is named: those whose
/// LoopbackReport has an active or resolved loop or a risk naming it, and those whose agent
/// wrote an Event about it (`event_nodes`). Sorted, once each.
pub fn nodes_for(
    service: &str,
    reports: &[(String, ReportStatus)],
    event_nodes: &[String],
) -> Vec<String> {
    let mut nodes: Vec<String> = reports
        .iter()
        .filter(|(_, r)| {
            let named = |s: &Option<String>| {
                s.as_deref()
                    .is_some_and(|s| probe_contract::names_service(s, service))
            };
            r.active_loops.iter().any(|l| named(&l.service))
                || r.resolved_loops.iter().any(|l| named(&l.service))
                || r.risks
                    .iter()
                    .any(|k| named(&k.service) || k.services.iter().any(|s| s == service))
        })
        .map(|(name, r)| {
            if r.node.is_empty() {
                name.clone()
            } else {
                r.node.clone()
            }
        })
        .chain(event_nodes.iter().cloned())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The nodes whose agents wrote a (not forged, not resolved) Event about the Service
/// `namespace/name`: where a loop was confirmed.
pub fn event_nodes(
    events: &[k8s_openapi::api::events::v1::Event],
    namespace: &str,
    name: &str,
) -> Vec<String> {
    use probe_contract::kube_event::{REPORTING_CONTROLLER, RESOLVED_REASON};
    let mut nodes: Vec<String> = events
        .iter()
        .filter(|ev| {
            ev.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)
                && ev.reason.as_deref() != Some(RESOLVED_REASON)
                && super::forged_because(ev).is_none()
                && ev.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Service")
                        && r.namespace.as_deref() == Some(namespace)
                        && r.name.as_deref() == Some(name)
                })
        })
        .filter_map(|ev| ev.reporting_instance.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The request's spec.
pub fn spec(namespace: &str, name: &str, nodes: &[String]) -> VerificationSpec {
    VerificationSpec {
        service: ServiceRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        nodes: nodes.to_vec(),
        kinds: Vec::new(),
    }
}

/// Whether `node` answered for good (done or refused; running is not an answer yet).
pub fn answered(entry: Option<&NodeVerification>) -> bool {
    entry.is_some_and(|e| matches!(e.phase, Phase::Done | Phase::Refused))
}

/// `verify -o json`: the request, the Service, each node's answer, the nodes that did not
/// answer in time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    /// The request's name (deleted when the plugin is done).
    pub request: String,
    /// `namespace/name`.
    pub service: String,
    pub nodes: BTreeMap<String, NodeVerification>,
    /// Asked, no answer within `--timeout`.
    pub missing: Vec<String>,
}

impl Verification {
    /// Whether any node confirmed a loop.
    pub fn confirmed(&self) -> bool {
        self.nodes.values().any(|n| {
            n.results
                .iter()
                .any(|r| r.outcome == VerifyOutcome::Confirmed)
        })
    }

    /// The nodes where a loop was confirmed, with the first confirmed result's kind, target
    /// and evidence.
    pub fn still_looping(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .filter_map(|(node, n)| {
                let r = n
                    .results
                    .iter()
                    .find(|r| r.outcome == VerifyOutcome::Confirmed)?;
                Some((
                    node.clone(),
                    format!(
                        "{} at {}: {}",
                        r.kind,
                        r.target,
                        r.evidence.first().map(String::as_str).unwrap_or("")
                    ),
                ))
            })
            .collect()
    }

    /// Whether anything proves nothing either way: a test with no answer, or a node that
    /// tested nothing (it refused, or is still running). A refusal is no test, so never
    /// "nothing confirmed".
    pub fn not_proven(&self) -> bool {
        self.nodes.values().any(|n| {
            n.phase != Phase::Done
                || n.results
                    .iter()
                    .any(|r| r.outcome == VerifyOutcome::NotProven)
        })
    }

    /// Why the loops are not proven gone, one line each (empty: resolved). Resolved: every
    /// asked node answered `done`, nothing was confirmed, and every node has its loops'
    /// results (`looped`), each clean: tested from the loop's own client, answered.
    pub fn not_resolved_because(&self) -> Vec<String> {
        let mut why = Vec::new();
        if self.nodes.is_empty() && self.missing.is_empty() {
            why.push("no node was asked".to_owned());
        }
        for node in &self.missing {
            why.push(format!("node {node}: no answer in time"));
        }
        for (node, n) in &self.nodes {
            if n.phase != Phase::Done {
                why.push(format!("node {node}: {} ({})", n.phase.as_str(), n.message));
                continue;
            }
            let looped: Vec<_> = n.results.iter().filter(|r| r.looped).collect();
            if looped.is_empty() {
                why.push(format!(
                    "node {node}: its agent holds no loop of this Service to test from the loop's own client (restarted, or the loop was never confirmed there)"
                ));
            }
            for r in n
                .results
                .iter()
                .filter(|r| r.outcome == VerifyOutcome::Confirmed)
            {
                why.push(format!(
                    "node {node}: {} at {} from {}: confirmed",
                    r.kind,
                    r.target,
                    source_of(r)
                ));
            }
            for r in looped
                .iter()
                .filter(|r| !matches!(r.outcome, VerifyOutcome::Clean | VerifyOutcome::Confirmed))
            {
                why.push(format!(
                    "node {node}: {} at {} from {}: {} ({})",
                    r.kind,
                    r.target,
                    source_of(r),
                    r.outcome.as_str(),
                    if r.reason.is_empty() {
                        &r.tried
                    } else {
                        &r.reason
                    }
                ));
            }
        }
        why
    }

    /// [`Verification::not_resolved_because`] is empty.
    pub fn resolved(&self) -> bool {
        self.not_resolved_because().is_empty()
    }
}

/// What a verify run comes to: `verify` and `fix --apply --verify` print and exit by it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A loop was confirmed on some node (exit [`CONFIRMED_EXIT`]).
    Confirmed,
    /// A node did not answer in time (an error naming it, [`missing_error`]).
    Unanswered,
    /// Nothing confirmed, but not proven either (exit [`NOT_PROVEN_EXIT`]): `fix --verify`'s
    /// reasons, one line each ([`Verification::not_resolved_because`]); none for `verify`.
    NotProven(Vec<String>),
    /// Every answer clean or not testable; `resolving`: every loop gone (exit 0).
    Clean,
}

/// The verdict on `v`: `verify`'s (is a loop there?), or with `resolving` `fix --verify`'s (is
/// every loop the nodes had gone, each tested from its own client?). A confirmed loop comes
/// first, then a node that did not answer.
pub fn verdict(v: &Verification, resolving: bool) -> Verdict {
    if v.confirmed() {
        return Verdict::Confirmed;
    }
    if !v.missing.is_empty() {
        return Verdict::Unanswered;
    }
    if resolving {
        let because = v.not_resolved_because();
        return if because.is_empty() {
            Verdict::Clean
        } else {
            Verdict::NotProven(because)
        };
    }
    if v.not_proven() {
        Verdict::NotProven(Vec::new())
    } else {
        Verdict::Clean
    }
}

/// Where a result's connections came from ("node" for answers written before `source`).
fn source_of(r: &probe_contract::verify::VerifyResult) -> &str {
    if r.source.is_empty() {
        probe_contract::verify::FROM_NODE
    } else {
        &r.source
    }
}

/// The table: per node, its phase, then per target its confirmed kinds (with their evidence),
/// its clean kinds on one line (with what was tried) and its not-testable kinds (with why).
/// Every string from the API goes through [`crate::term::escape`] by the caller.
pub fn render(v: &Verification) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "verify {} (request {}):", v.service, v.request);
    for (node, n) in &v.nodes {
        let _ = writeln!(out, "node {node}: {}", n.phase.as_str());
        if !n.message.is_empty() {
            let _ = writeln!(out, "  {}", n.message);
        }
        let mut groups: Vec<(&str, &str)> = Vec::new();
        for r in &n.results {
            let g = (r.target.as_str(), source_of(r));
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        for (target, source) in groups {
            let at: Vec<_> = n
                .results
                .iter()
                .filter(|r| r.target == target && source_of(r) == source)
                .collect();
            let _ = writeln!(out, "  {target}  from {source}:");
            for r in at.iter().filter(|r| r.outcome == VerifyOutcome::Confirmed) {
                let _ = writeln!(out, "    CONFIRMED {}{}", r.kind, looped_mark(r));
                for line in &r.evidence {
                    let _ = writeln!(out, "      {line}");
                }
            }
            for r in at.iter().filter(|r| r.outcome == VerifyOutcome::NotProven) {
                let _ = writeln!(
                    out,
                    "    NOT PROVEN {}{}: {} ({})",
                    r.kind,
                    looped_mark(r),
                    r.tried,
                    r.reason
                );
            }
            let clean: Vec<String> = at
                .iter()
                .filter(|r| r.outcome == VerifyOutcome::Clean)
                .map(|r| format!("{}{}", r.kind, looped_mark(r)))
                .collect();
            if let Some(first) = at.iter().find(|r| r.outcome == VerifyOutcome::Clean) {
                let _ = writeln!(out, "    clean: {} ({})", clean.join(", "), first.tried);
            }
            for r in at
                .iter()
                .filter(|r| r.outcome == VerifyOutcome::NotTestable)
            {
                let kind = if r.kind.is_empty() { "*" } else { &r.kind };
                let _ = writeln!(
                    out,
                    "    not testable: {kind}{}: {}",
                    looped_mark(r),
                    r.reason
                );
            }
        }
    }
    for node in &v.missing {
        let _ = writeln!(out, "node {node}: no answer in time");
    }
    out
}

/// " (the loop)" after a result that tests a loop the node had.
fn looped_mark(r: &probe_contract::verify::VerifyResult) -> &'static str {
    if r.looped { " (the loop)" } else { "" }
}

/// The error for the nodes that did not answer.
pub fn missing_error(missing: &[String], timeout_s: u64) -> String {
    format!(
        "no answer from node{} {} within {timeout_s} s: its agent is not running, runs with no API access, or cannot watch loopbackverifications (chart: kube.verify)",
        if missing.len() == 1 { "" } else { "s" },
        missing.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use probe_contract::{
        report::{ActiveLoop, RiskStatus},
        verify::VerifyResult,
    };

    use super::*;

    fn result(kind: &str, outcome: VerifyOutcome) -> VerifyResult {
        VerifyResult {
            kind: kind.into(),
            target: "203.0.113.10:8081/tcp".into(),
            outcome,
            evidence: if outcome == VerifyOutcome::Confirmed {
                vec!["hairpin/l4/... (dropped, drop reason IP_LOCAL_SOURCE)".into()]
            } else {
                vec![]
            },
            tried: if outcome == VerifyOutcome::Clean {
                "3 TCP connections from the node: 3 connected (<= 2 ms)".into()
            } else {
                String::new()
            },
            reason: if outcome == VerifyOutcome::NotTestable {
                "why".into()
            } else {
                String::new()
            },
            source: "node".into(),
            looped: false,
        }
    }

    fn looped(kind: &str, outcome: VerifyOutcome, source: &str) -> VerifyResult {
        VerifyResult {
            source: source.into(),
            looped: true,
            ..result(kind, outcome)
        }
    }

    #[test]
    fn nodes_are_those_whose_report_or_events_name_the_service() {
        let report = |node: &str, loops: Vec<ActiveLoop>, risks: Vec<RiskStatus>| {
            (
                node.to_owned(),
                ReportStatus {
                    node: node.into(),
                    active_loops: loops,
                    risks,
                    ..Default::default()
                },
            )
        };
        let reports = vec![
            report(
                "a",
                vec![ActiveLoop {
                    service: Some("shop/web".into()),
                    ..Default::default()
                }],
                vec![],
            ),
            report(
                "b",
                vec![],
                vec![RiskStatus {
                    services: vec!["other/x".into(), "shop/web".into()],
                    ..Default::default()
                }],
            ),
            report("c", vec![], vec![]),
        ];
        assert_eq!(
            nodes_for("shop/web", &reports, &["d".into(), "a".into()]),
            ["a", "b", "d"]
        );
        // A loop names a Service with a named port as `namespace/name:port`.
        let named_port = vec![report(
            "e",
            vec![ActiveLoop {
                service: Some("shop/web:http".into()),
                ..Default::default()
            }],
            vec![],
        )];
        assert_eq!(nodes_for("shop/web", &named_port, &[]), ["e"]);
        assert!(nodes_for("shop/we", &named_port, &[]).is_empty());
        assert!(nodes_for("shop/none", &reports, &[]).is_empty());
    }

    #[test]
    fn the_table_groups_by_node_and_target_and_the_verdicts_follow_the_answers() {
        let mut v = Verification {
            request: "verify-x".into(),
            service: "shop/web".into(),
            ..Default::default()
        };
        v.nodes.insert(
            "a".into(),
            NodeVerification {
                phase: Phase::Done,
                results: vec![
                    result("hairpin", VerifyOutcome::Confirmed),
                    result("vip_port_unserved", VerifyOutcome::Clean),
                    result("etp_local_drop", VerifyOutcome::Clean),
                    result("service_self_loop", VerifyOutcome::NotTestable),
                ],
                ..Default::default()
            },
        );
        let text = render(&v);
        assert!(
            text.contains(
                "203.0.113.10:8081/tcp  from node:\n    CONFIRMED hairpin\n      hairpin/l4/"
            ),
            "{text}"
        );
        assert!(
            text.contains("    clean: vip_port_unserved, etp_local_drop (3 TCP connections"),
            "{text}"
        );
        assert!(
            text.contains("not testable: service_self_loop: why"),
            "{text}"
        );
        assert!(v.confirmed());
        assert!(!v.resolved());
        assert_eq!(v.still_looping()[0].0, "a");

        // Clean from the node, but the node's agent holds no loop to test: not resolved.
        v.nodes.get_mut("a").unwrap().results.remove(0);
        assert!(!v.confirmed());
        let why = v.not_resolved_because();
        assert!(why[0].contains("holds no loop"), "{why:?}");
        // The pod's loop tested from the pod and clean: resolved.
        let pod = "pod shop/client (10.0.0.5)";
        v.nodes
            .get_mut("a")
            .unwrap()
            .results
            .push(looped("hairpin", VerifyOutcome::Clean, pod));
        assert!(v.resolved(), "{:?}", v.not_resolved_because());
        assert!(render(&v).contains(&format!("  from {pod}:\n    clean: hairpin (the loop)")));
        v.missing.push("b".into());
        assert!(!v.resolved(), "a node that did not answer is no proof");
        assert!(render(&v).contains("node b: no answer in time"));
        assert!(missing_error(&v.missing, 60).contains("node b within 60 s"));
    }

    /// Issue #49: silence is no verdict, and a loop its client could not test is not gone.
    #[test]
    fn a_loop_not_proven_or_not_testable_from_its_client_is_not_resolved() {
        let pod = "pod shop/client (10.0.0.5)";
        let mut v = Verification {
            request: "verify-y".into(),
            service: "shop/web".into(),
            ..Default::default()
        };
        let node = |results| NodeVerification {
            phase: Phase::Done,
            results,
            ..Default::default()
        };
        v.nodes.insert(
            "a".into(),
            node(vec![
                result("hairpin", VerifyOutcome::Clean),
                looped("hairpin", VerifyOutcome::NotProven, pod),
            ]),
        );
        assert!(v.not_proven());
        assert!(!v.confirmed());
        let why = v.not_resolved_because();
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(
            why[0].contains(&format!("from {pod}: not_proven")),
            "{why:?}"
        );
        assert!(render(&v).contains("NOT PROVEN hairpin (the loop)"));

        v.nodes.insert(
            "a".into(),
            node(vec![
                result("hairpin", VerifyOutcome::Clean),
                looped("hairpin", VerifyOutcome::NotTestable, pod),
            ]),
        );
        assert!(!v.not_proven());
        assert!(!v.resolved());
        // A refusal is no answer either.
        v.nodes.insert(
            "a".into(),
            NodeVerification {
                phase: Phase::Refused,
                message: "this agent runs with --verify off".into(),
                ..Default::default()
            },
        );
        assert!(v.not_resolved_because()[0].contains("refused"));
        // A refused node tested nothing: `verify` says not proven, never clean.
        assert!(v.not_proven());
        assert_eq!(verdict(&v, false), Verdict::NotProven(Vec::new()));
    }

    #[test]
    fn running_is_no_answer() {
        assert!(!answered(None));
        assert!(!answered(Some(&NodeVerification::default())));
        assert!(answered(Some(&NodeVerification {
            phase: Phase::Refused,
            ..Default::default()
        })));
    }

    /// `verify` and `fix --verify` read one run the same way until their questions differ: a
    /// confirmed loop first, then a silent node; then "not proven" for `verify` is a test with
    /// no answer, for `fix --verify` any loop not shown gone.
    #[test]
    fn the_verdict_puts_a_confirmed_loop_first_then_a_silent_node() {
        let pod = "pod shop/client (10.0.0.5)";
        let node = |results| NodeVerification {
            phase: Phase::Done,
            results,
            ..Default::default()
        };
        let mut v = Verification::default();
        // Node `name` answers with its one hairpin result.
        let answer = |v: &mut Verification, name: &str, one| {
            v.nodes.insert(name.into(), node(vec![one]));
        };
        answer(&mut v, "a", looped("hairpin", VerifyOutcome::Clean, pod));
        assert_eq!(verdict(&v, false), Verdict::Clean);
        assert_eq!(verdict(&v, true), Verdict::Clean);
        answer(&mut v, "b", result("hairpin", VerifyOutcome::Clean));
        assert_eq!(verdict(&v, false), Verdict::Clean);
        assert!(
            matches!(verdict(&v, true), Verdict::NotProven(why) if why[0].contains("node b")),
            "node b holds no loop to test: not proven resolved"
        );
        answer(&mut v, "c", result("hairpin", VerifyOutcome::NotProven));
        assert_eq!(verdict(&v, false), Verdict::NotProven(Vec::new()));
        v.missing.push("d".into());
        assert_eq!(verdict(&v, false), Verdict::Unanswered);
        assert_eq!(verdict(&v, true), Verdict::Unanswered);
        answer(&mut v, "e", result("hairpin", VerifyOutcome::Confirmed));
        assert_eq!(verdict(&v, false), Verdict::Confirmed);
        assert_eq!(verdict(&v, true), Verdict::Confirmed);
    }
}
