//! The hairpin state machine's steps, per candidate flow: the egress answer (layer 4 or 7),
//! conntrack of the egress flow (SNAT?), settling (a drop, or conntrack of the looping flow),
//! the outcome; and the expiry of settled or stuck flows. The intake of suspects and drops and
//! the confirmation are in [`super`].

use probe_contract::record::EgressRecord;

use super::answered;
use crate::{
    correlate::{
        Correlator, Layer, Outcome, Output, Query, QueryCtx, SEC,
        conntrack::{CtAnswer, egress_tuple},
        evidence::{egress_ct_line, outcome_line},
        held::{EgressMatch, Flow, Stage},
    },
    state::Tuple,
};

impl Correlator {
    /// The egress answer for flow `t` (`None`: the query expired).
    pub(in crate::correlate) fn on_egress(
        &mut self,
        t: &Tuple,
        records: Option<&[EgressRecord]>,
        out: &mut Vec<Output>,
    ) {
        let Some(f) = self.flows.get(t) else {
            return;
        };
        if f.stage != Stage::AwaitEgress {
            return;
        }
        let m = records.and_then(|r| self.match_egress(f, r));
        let Some(m) = m else {
            self.stats.hairpin_no_egress += 1;
            self.dismiss_flow(t);
            return;
        };
        let et = egress_tuple(&m.record);
        let id = self.new_query(QueryCtx::Snat { flow: t.clone() });
        if let Some(f) = self.flows.get_mut(t) {
            f.egress = Some(m);
            f.stage = Stage::AwaitSnat(id);
        }
        out.push(Output::Query(Query::Conntrack { id, tuple: et }));
    }

    /// Layer 4 from the suspect's own record (the answer holds it whenever it exists: its key
    /// was looked up exactly), else layer 7 from the source's index. Layer 7 has no key to
    /// look up (the LB opened its own connection, with its own port) and needs no more than
    /// the index: it picks the pod's latest opener before the suspect, one LB round trip
    /// earlier, which the latest 16 records hold unless the pod opened 16 more flows in
    /// between (then one of those is as good a guess of what the proxy carried).
    ///
    /// A host-listener candidate (no NodePort, no pod) takes layer 4 only: the exact match is
    /// its proof; a layer-7 guess to an arbitrary port of the node would pair any local
    /// caller's traffic with any connection to a host service.
    pub(in crate::correlate) fn match_egress(
        &self,
        f: &Flow,
        records: &[EgressRecord],
    ) -> Option<EgressMatch> {
        let p = &f.packet;
        // (record, its latest opener by the suspect's time) for records of this pod and
        // protocol that had left by then, within the window.
        // The record's destination must be the LB: never this node's own address or pod.
        let candidates = || {
            records
                .iter()
                .filter(|r| r.src == p.src && r.proto == p.proto)
                .filter(|r| r.dst != p.dst && r.dst != r.src && !self.known_local.contains(&r.dst))
                .filter_map(|r| Some((r, r.latest_by(f.ts)?)))
                .filter(|(_, at)| f.ts - at <= self.cfg.l7_window_ns)
        };
        if let Some((r, _)) = candidates()
            .filter(|(r, _)| r.sport == p.sport)
            .max_by_key(|(_, at)| *at)
        {
            return Some(EgressMatch {
                record: r.clone(),
                layer: Layer::L4,
            });
        }
        if f.listener.is_some() {
            return None;
        }
        candidates()
            .max_by_key(|(_, at)| *at)
            .map(|(r, _)| EgressMatch {
                record: r.clone(),
                layer: Layer::L7,
            })
    }

    /// Conntrack of the egress tuple.
    pub(in crate::correlate) fn on_snat(&mut self, t: &Tuple, ct: CtAnswer, out: &mut Vec<Output>) {
        let Some(f) = self.flows.get_mut(t) else {
            return;
        };
        let l4 = f.egress.as_ref().is_some_and(|m| m.layer == Layer::L4);
        match &ct {
            CtAnswer::Found(e) if e.snat => {
                // SNAT happened after all: the LB saw the node, not the pod.
                self.stats.hairpin_snat_seen += 1;
                self.dismiss_flow(t);
                return;
            }
            CtAnswer::Found(e) if l4 && (e.seen_reply || answered(e)) => {
                // The LB answered the very connection: it did not loop (or not fatally).
                self.stats.hairpin_answered += 1;
                self.dismiss_flow(t);
                return;
            }
            CtAnswer::Failed(_) => {
                f.snat_unknown = true;
                self.stats.conntrack_failures += 1;
            }
            _ => {}
        }
        let et = f.egress.as_ref().map(|m| egress_tuple(&m.record));
        f.evidence.push(egress_ct_line(et.as_ref(), &ct));
        f.stage = Stage::Settling;
        self.advance(t, out);
    }

    /// Egress proven: report a drop now, or ask conntrack once the settle time has passed.
    pub(in crate::correlate) fn advance(&mut self, t: &Tuple, out: &mut Vec<Output>) {
        let Some(f) = self.flows.get(t) else {
            return;
        };
        if f.stage != Stage::Settling {
            return;
        }
        if f.drop.is_some() {
            self.confirm_hairpin(t, Outcome::Dropped, Vec::new(), out);
        } else if self.now >= f.ts.saturating_add(self.cfg.hairpin_settle_ns) {
            let id = self.new_query(QueryCtx::Outcome { flow: t.clone() });
            if let Some(f) = self.flows.get_mut(t) {
                f.stage = Stage::AwaitOutcome(id);
            }
            out.push(Output::Query(Query::Conntrack {
                id,
                tuple: t.clone(),
            }));
        }
    }

    /// Conntrack of the hairpin tuple.
    pub(in crate::correlate) fn on_outcome(
        &mut self,
        t: &Tuple,
        ct: CtAnswer,
        out: &mut Vec<Output>,
    ) {
        let outcome = match &ct {
            CtAnswer::Found(e) if answered(e) => {
                // The looping connection got established after all: no failure.
                self.stats.hairpin_answered += 1;
                self.dismiss_flow(t);
                return;
            }
            CtAnswer::Found(e) if e.tcp_state.as_deref() == Some("CLOSE") => Outcome::Reset,
            CtAnswer::Failed(_) => {
                self.stats.conntrack_failures += 1;
                Outcome::NoReply
            }
            _ => Outcome::NoReply,
        };
        let line = outcome_line(t, &ct);
        self.confirm_hairpin(t, outcome, vec![line], out);
    }

    /// Settled flows, and a safety net for flows stuck longer than any path allows.
    pub(in crate::correlate) fn expire_flows(&mut self, now: u64, out: &mut Vec<Output>) {
        let settle = self.cfg.hairpin_settle_ns;
        let max_age = settle
            .saturating_add(self.cfg.pair_window_ns)
            // Egress (twice for a joiner asked again), SNAT, outcome.
            .saturating_add(self.cfg.query_timeout_ns.saturating_mul(4))
            .saturating_add(SEC);
        let mut due: Vec<(u64, Tuple, bool)> = self
            .flows
            .iter()
            .filter_map(|(t, f)| {
                if f.ts.saturating_add(max_age) < now {
                    Some((f.seq, t.clone(), true))
                } else if f.stage == Stage::Settling && f.ts.saturating_add(settle) <= now {
                    Some((f.seq, t.clone(), false))
                } else {
                    None
                }
            })
            .collect();
        due.sort_unstable_by_key(|(seq, _, _)| *seq);
        for (_, t, stuck) in due {
            if stuck {
                self.dismiss_flow(&t);
            } else {
                self.advance(&t, out);
            }
        }
    }
}
