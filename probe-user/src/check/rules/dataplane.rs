//! `dataplane`: a node without kube-proxy is said to be one (a `warn`), with the kinds that
//! can still happen there and what the check cannot confirm, so an empty list of risks is
//! never read as "no risk" where the rules had no service table to judge.

use probe_contract::check::{Finding, Kind, Mode, Severity};

use crate::check::Inputs;

pub fn dataplane(inp: &Inputs) -> Vec<Finding> {
    let Some(d) = &inp.dataplane else {
        return Vec::new();
    };
    if d.mode != Mode::None {
        return Vec::new();
    }
    let mut remedy: Vec<String> = d
        .still_possible
        .iter()
        .map(|l| format!("still possible: {}: {}", l.kind, l.why))
        .collect();
    remedy.extend(
        d.cannot_confirm
            .iter()
            .map(|l| format!("cannot confirm: {}: {}", l.kind, l.why)),
    );
    vec![Finding {
        kind: Kind::Dataplane,
        severity: Severity::Warn,
        subject: d.name(),
        summary: format!(
            "no kube-proxy (Services served by {}): still possible: {}; cannot confirm: {} (no \
             service table from rules)",
            d.replacement.map_or("unknown", |r| r.as_str()),
            kinds(&d.still_possible),
            kinds(&d.cannot_confirm),
        ),
        evidence: d.evidence.clone(),
        remedy,
        fixes: Vec::new(),
    }]
}

fn kinds(limits: &[probe_contract::check::Limit]) -> String {
    limits
        .iter()
        .map(|l| l.kind.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
