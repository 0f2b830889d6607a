//! Replays a recorded stream of [`KernelEvent`]s through a [`Correlator`], answering its
//! queries from a script, and checks the reports against expectations.
//!
//! Pure (strings in, values out) so tests and tools can feed it files. Stream layout (see
//! `probe-core/tests/data/streams/README.md`): `events.jsonl` (one `KernelEvent` a line, as
//! `probe agent --record` writes them), `services.json` (a [`ServiceTable`]), `answers.json`
//! ([`ScriptedAnswers`]), `expect.json` (see [`check`]).

use std::{collections::VecDeque, net::IpAddr};

use probe_contract::record::{EgressRecord, KernelEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Answer, Confirmation, Correlator, CorrelatorConfig, CorrelatorStats, Output, Query};
use crate::state::{ConntrackEntry, SelfLoopFacts, ServiceTable, conntrack::is_self_call};

/// A conntrack entry the script returns once time has reached `visible_from_ns`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptedEntry {
    #[serde(default)]
    pub visible_from_ns: u64,
    pub entry: ConntrackEntry,
}

/// What the agent's look-ups would have returned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptedAnswers {
    /// The `EGRESS_FLOWS` map's records; an egress query gets those with its source address
    /// written (`ts_ns`) no later than the query.
    #[serde(default)]
    pub egress: Vec<EgressRecord>,
    /// Conntrack entries; a query gets the latest visible one whose original tuple matches.
    #[serde(default)]
    pub conntrack: Vec<ScriptedEntry>,
    /// What the node's ipsets, bridge and sysctls say to every self-loop query.
    #[serde(default)]
    pub self_loop: SelfLoopFacts,
    /// What the dataplane says to every [`Query::Programmed`]; absent: it could not be read.
    #[serde(default)]
    pub dataplane: Option<super::DataplaneRead>,
}

impl ScriptedAnswers {
    pub fn answer(&self, q: &Query, now_ns: u64) -> Answer {
        match q {
            // Every recorded flow of the source: the index and the exact look-ups alike.
            Query::Egress { id, src, .. } => Answer::Egress {
                id: *id,
                records: self
                    .egress
                    .iter()
                    .filter(|r| r.src == *src && r.ts_ns <= now_ns)
                    .cloned()
                    .collect(),
            },
            Query::Programmed { id, .. } => Answer::Programmed {
                id: *id,
                read: self
                    .dataplane
                    .clone()
                    .ok_or_else(|| "the recording holds no dataplane".into()),
            },
            // Recordings hold no sockets: nothing listens.
            Query::Listener { id, .. } => Answer::Listener {
                id: *id,
                listener: Ok(None),
            },
            Query::Conntrack { id, tuple } => Answer::Conntrack {
                id: *id,
                entry: self
                    .conntrack
                    .iter()
                    .filter(|e| e.entry.orig == *tuple && e.visible_from_ns <= now_ns)
                    .max_by_key(|e| e.visible_from_ns)
                    .map(|e| e.entry.clone()),
            },
            // The entry whose reply tuple is the call reversed; for a dropped reply, the
            // call's connection however it was answered (as the agent looks it up).
            Query::SelfLoop {
                id,
                tuple,
                reply_dropped,
                ..
            } => Answer::SelfLoop {
                id: *id,
                conntrack: Ok(self
                    .conntrack
                    .iter()
                    .filter(|e| {
                        e.visible_from_ns <= now_ns
                            && (e.entry.reply == tuple.reversed()
                                || (*reply_dropped && is_self_call(&e.entry, tuple)))
                    })
                    .max_by_key(|e| e.visible_from_ns)
                    .map(|e| e.entry.clone())),
                facts: self.self_loop.clone(),
            },
        }
    }
}

/// One stream to replay.
#[derive(Clone, Debug, Default)]
pub struct Stream {
    pub events: Vec<KernelEvent>,
    pub services: ServiceTable,
    pub answers: ScriptedAnswers,
    pub config: CorrelatorConfig,
}

/// What a replay produced.
#[derive(Clone, Debug)]
pub struct ReplayResult {
    pub reports: Vec<Confirmation>,
    pub queries: Vec<Query>,
    pub stats: CorrelatorStats,
}

/// Where a replay's result differs from its expectation, one line each.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct Mismatches(pub Vec<String>);

/// A line of a recording that is not a [`KernelEvent`].
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {source}")]
pub struct BadLine {
    pub line: usize,
    pub source: serde_json::Error,
}

/// Parses JSON lines of [`KernelEvent`]s; blank lines are skipped.
pub fn parse_events(jsonl: &str) -> Result<Vec<KernelEvent>, BadLine> {
    jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| BadLine {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// Agent tick period simulated between events.
const TICK_NS: u64 = 250_000_000;
/// At most this many ticks are simulated in one gap between events (then one at the event).
const MAX_TICKS_PER_GAP: u64 = 64;

/// Replays `stream` the way the agent drives the correlator: ticks every 250 ms of event time
/// and at each event, answers every query right away from the script, and after the last
/// event ticks until every window and query has expired.
pub fn replay(stream: &Stream) -> ReplayResult {
    let mut c = Correlator::new(stream.config.clone());
    c.set_services(stream.services.clone());
    let mut res = ReplayResult {
        reports: Vec::new(),
        queries: Vec::new(),
        stats: CorrelatorStats::default(),
    };
    let mut now = stream.events.first().map_or(0, KernelEvent::ts_ns);
    for ev in &stream.events {
        let ts = ev.ts_ns();
        advance(&mut c, &stream.answers, &mut res, &mut now, ts);
        let outs = c.ingest(ev.clone());
        handle(&mut c, &stream.answers, &mut res, now, outs);
    }
    let cfg = &stream.config;
    let end = now
        .saturating_add(cfg.pair_window_ns)
        .saturating_add(cfg.hairpin_settle_ns)
        .saturating_add(cfg.query_timeout_ns.saturating_mul(4))
        .saturating_add(2_000_000_000);
    advance(&mut c, &stream.answers, &mut res, &mut now, end);
    res.stats = c.stats().clone();
    res
}

fn advance(
    c: &mut Correlator,
    answers: &ScriptedAnswers,
    res: &mut ReplayResult,
    now: &mut u64,
    to: u64,
) {
    let mut steps = 0;
    while now.saturating_add(TICK_NS) < to && steps < MAX_TICKS_PER_GAP {
        *now += TICK_NS;
        steps += 1;
        let outs = c.tick(*now);
        handle(c, answers, res, *now, outs);
    }
    *now = (*now).max(to);
    let outs = c.tick(*now);
    handle(c, answers, res, *now, outs);
}

fn handle(
    c: &mut Correlator,
    answers: &ScriptedAnswers,
    res: &mut ReplayResult,
    now: u64,
    outs: Vec<Output>,
) {
    let mut work: VecDeque<Output> = outs.into();
    while let Some(o) = work.pop_front() {
        match o {
            Output::Report(r) => res.reports.push(r),
            Output::Query(q) => {
                let a = answers.answer(&q, now);
                res.queries.push(q);
                work.extend(c.answer(a));
            }
        }
    }
}

/// A report as the JSON the expectations are written against: the event's fields plus
/// `is_new` and `write_json`.
pub fn report_json(r: &Confirmation) -> Value {
    let mut v = serde_json::to_value(&r.event).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("is_new".into(), Value::Bool(r.is_new));
        m.insert("write_json".into(), Value::Bool(r.write_json));
    }
    v
}

/// Checks a replay against `expect`:
///
/// ```json
/// { "reports": [ { "kind": "hairpin", "count": 1, "evidence_contains": ["EGRESS_FLOWS"] } ],
///   "stats": { "suspects_unconfirmed": 0, "confirmed": { "hairpin": 1 } } }
/// ```
///
/// `reports` must match the reports in number and order; each object lists fields that must
/// be equal (others are not checked), plus `evidence_contains` / `remedy_contains`: strings
/// each of which must occur in some line. `stats` fields must be equal (objects compared
/// field by field).
pub fn check(res: &ReplayResult, expect: &Value) -> Result<(), Mismatches> {
    let mut errs = Vec::new();
    if let Some(want) = expect.get("reports").and_then(Value::as_array) {
        if want.len() != res.reports.len() {
            errs.push(format!(
                "expected {} reports, got {}: {:?}",
                want.len(),
                res.reports.len(),
                res.reports
                    .iter()
                    .map(|r| (&r.event.key, r.event.count))
                    .collect::<Vec<_>>()
            ));
        }
        for (i, (w, r)) in want.iter().zip(&res.reports).enumerate() {
            let got = report_json(r);
            let Some(w) = w.as_object() else {
                errs.push(format!("reports[{i}]: expectation is not an object"));
                continue;
            };
            for (k, wv) in w {
                match k.as_str() {
                    "evidence_contains" | "remedy_contains" => {
                        let field = if k == "evidence_contains" {
                            &r.event.evidence
                        } else {
                            &r.event.remedy
                        };
                        for needle in wv.as_array().into_iter().flatten() {
                            let needle = needle.as_str().unwrap_or_default();
                            if !field.iter().any(|l| l.contains(needle)) {
                                errs.push(format!(
                                    "reports[{i}].{k}: no line contains {needle:?}: {field:#?}"
                                ));
                            }
                        }
                    }
                    _ => subset(&format!("reports[{i}].{k}"), wv, &got[k], &mut errs),
                }
            }
        }
    }
    if let Some(want) = expect.get("stats") {
        let got = serde_json::to_value(&res.stats).unwrap_or(Value::Null);
        subset("stats", want, &got, &mut errs);
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(Mismatches(errs))
    }
}

fn subset(path: &str, want: &Value, got: &Value, errs: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                subset(
                    &format!("{path}.{k}"),
                    wv,
                    g.get(k).unwrap_or(&Value::Null),
                    errs,
                );
            }
        }
        _ if want == got => {}
        _ => errs.push(format!("{path}: expected {want}, got {got}")),
    }
}

/// Addresses in a stream, for sanity checks of synthesized data (documentation ranges only).
pub fn addresses(stream: &Stream) -> Vec<IpAddr> {
    let mut v = Vec::new();
    for e in &stream.events {
        let p = e.packet();
        v.push(p.src);
        v.push(p.dst);
    }
    for r in &stream.answers.egress {
        v.push(r.src);
        v.push(r.dst);
    }
    v
}
