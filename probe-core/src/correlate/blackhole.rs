//! `healthcheck_blackhole`: a VIP-source packet on NIC ingress to a NodePort (or
//! healthCheckNodePort) of a node address, dropped as a local source. The same drop to any
//! other destination is `vip_as_source` (see `vip_as_source.rs`).

use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, SnatState, Tag, facts::Etp, record::Packet,
};

use super::{
    Correlator, DropInfo, Output, RecentDrop,
    aggregate::{NewEvent as _, healthcheck_blackhole_key},
    evidence::{
        drop_line, local_source_line, suspect_line, table_missing, unauthenticated_source_line,
    },
    held::VipSuspect,
    remedy::{
        cause::CauseAddresses,
        sentences::{bound, mismatch, service_key, unbind},
    },
    tuple_of,
};
use crate::state::{NODEPORT_RANGE, Tuple};

impl Correlator {
    pub(super) fn on_vip_suspect(
        &mut self,
        ts: u64,
        nic: String,
        packet: Packet,
        out: &mut Vec<Output>,
    ) {
        let t = tuple_of(&packet);
        if let Some(d) = self.drops.get(&t)
            && self.within(d.info.ts, ts)
        {
            if let Some(key) = d.confirmed.clone() {
                // The drop came first and already confirmed: fold the suspect in as evidence.
                self.stats.suspects_confirmed += 1;
                let line = suspect_line(ts, &nic, &packet);
                if let Some(agg) = self.aggregates.get_mut(&key)
                    && !agg.event.evidence.contains(&line)
                {
                    agg.event.evidence.insert(0, line);
                }
                return;
            }
            // A drop without an interface waited for this suspect.
            if let Some(d) = self.drops.remove(&t) {
                self.held_drops -= 1;
                let s = VipSuspect {
                    ts,
                    nic,
                    packet,
                    n: 1,
                };
                self.confirm_blackhole(&d.packet, d.info, Some(s), out);
                return;
            }
        }
        if let Some(s) = self.vip_suspects.get_mut(&t) {
            s.n += 1;
            self.held_suspects += 1;
            return;
        }
        if !self.has_room() {
            self.stats.suspects_unconfirmed += 1;
            return;
        }
        self.vip_suspects.insert(
            t,
            VipSuspect {
                ts,
                nic,
                packet,
                n: 1,
            },
        );
        self.held_suspects += 1;
    }

    /// A local-source drop of a `Vip`-source packet: confirms with its suspect, or alone when
    /// it names its interface; otherwise waits for the suspect.
    pub(super) fn on_vip_source_drop(
        &mut self,
        t: Tuple,
        info: DropInfo,
        packet: Packet,
        out: &mut Vec<Output>,
    ) {
        let suspect = match self.vip_suspects.get(&t) {
            Some(s) if self.within(s.ts, info.ts) => self.vip_suspects.remove(&t),
            _ => None,
        };
        if let Some(s) = &suspect {
            self.held_suspects -= s.n;
        }
        if info.iface.is_none() && suspect.is_none() {
            // Nothing says which interface it came in on: wait for the suspect.
            if self.has_room() {
                self.drops.insert(
                    t,
                    RecentDrop {
                        info,
                        packet,
                        confirmed: None,
                    },
                );
                self.held_drops += 1;
            } else {
                self.stats.drops_unmatched += 1;
            }
            return;
        }
        self.confirm_blackhole(&packet, info, suspect, out);
    }

    pub(super) fn confirm_blackhole(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        suspect: Option<VipSuspect>,
        out: &mut Vec<Output>,
    ) {
        if !self.is_health_check(packet) {
            self.confirm_vip_as_source(packet, info, suspect, out);
            return;
        }
        let mut lines = Vec::new();
        let svc = self.nodeport_evidence(packet, &mut lines);
        let key = healthcheck_blackhole_key(packet);
        let event = LoopbackEvent {
            snat: SnatState::Unknown,
            service: svc,
            ..self.vip_drop_event(packet, &info, suspect.as_ref(), &key, lines)
        };
        let event = self.healthcheck_facts(event, packet);
        self.stats.confirmed.healthcheck_blackhole += 1;
        self.report_vip_source_drop(packet, info, suspect.as_ref(), key, event, out);
    }

    /// The event of a local-source drop of a `Vip`-source packet, one assembly for both kinds
    /// it confirms (`healthcheck_blackhole`, `vip_as_source`): the suspect, the drop and what
    /// the VIP source means, then the kind's own `lines`, then what serves and owns the VIP.
    pub(super) fn vip_drop_event(
        &self,
        packet: &Packet,
        info: &DropInfo,
        suspect: Option<&VipSuspect>,
        key: &AggregateKey,
        lines: Vec<String>,
    ) -> LoopbackEvent {
        let mut evidence = Vec::new();
        if let Some(s) = suspect {
            evidence.push(suspect_line(s.ts, &s.nic, &s.packet));
        }
        evidence.push(drop_line(info, &tuple_of(packet)));
        evidence.push(local_source_line(info, packet.src));
        evidence.push(unauthenticated_source_line(packet.src));
        evidence.extend(lines);
        self.vip_served_evidence(packet.src, &mut evidence);
        self.owner_evidence(packet.src, &mut evidence);
        LoopbackEvent {
            vip: Some(packet.src),
            drop_reason: Some(info.reason.name.clone()),
            drop_location: info.location.clone(),
            evidence,
            nic: info
                .iface
                .clone()
                .or_else(|| suspect.map(|s| s.nic.clone())),
            ..LoopbackEvent::new(key, packet, info.ts, Outcome::Dropped)
        }
    }

    /// A health check: the destination is a node address and the port a NodePort of the
    /// service table, or one of the NodePort range it does not list (a healthCheckNodePort:
    /// kube-proxy allocates those there and serves them from its own socket, not from rules).
    /// Without a service table, any port of a node address.
    pub(super) fn is_health_check(&self, p: &Packet) -> bool {
        p.dst_tag == Some(Tag::Node)
            && (table_missing(&self.services)
                || self.services.nodeport(p.dport, p.proto).is_some()
                || NODEPORT_RANGE.contains(&p.dport))
    }

    /// Counts, keeps the drop (a suspect arriving after it folds into this event) and records
    /// a confirmed local-source drop of a `Vip`-source packet.
    pub(super) fn report_vip_source_drop(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        suspect: Option<&VipSuspect>,
        key: AggregateKey,
        event: LoopbackEvent,
        out: &mut Vec<Output>,
    ) {
        let t = tuple_of(packet);
        self.stats.suspects_confirmed += suspect.map_or(0, |s| s.n);
        self.stats.drops_confirming += 1;
        let ts = info.ts;
        // Keep the drop so a suspect arriving after it folds into this event.
        if !self.drops.contains_key(&t) && self.pending_len() < self.cfg.max_pending {
            self.drops.insert(
                t,
                RecentDrop {
                    info,
                    packet: packet.clone(),
                    confirmed: Some(key.clone()),
                },
            );
        }
        out.push(Output::Report(self.record(key, event, ts)));
    }

    /// Forgets `Vip`-source suspects whose drop did not come within the pair window.
    pub(super) fn expire_vip_suspects(&mut self, now: u64) {
        let pw = self.cfg.pair_window_ns;
        let mut n_unconf = 0;
        self.vip_suspects.retain(|_, s| {
            let keep = s.ts.saturating_add(pw) >= now;
            if !keep {
                n_unconf += s.n;
            }
            keep
        });
        self.stats.suspects_unconfirmed += n_unconf;
        self.held_suspects -= n_unconf;
    }
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let vip = e.vip.unwrap_or(e.src);
    let f = &e.facts;
    let checked = match (
        f.service.as_ref().and_then(|s| s.health_check_node_port),
        f.etp(),
    ) {
        (Some(hc), Some(Etp::Local)) if hc == e.dst_port => {
            format!("its healthCheckNodePort {hc} (externalTrafficPolicy: Local)")
        }
        (_, Some(Etp::Cluster)) => format!(
            "NodePort {} (externalTrafficPolicy: Cluster: the LB checks the traffic port)",
            e.dst_port
        ),
        _ => format!("port {}", e.dst_port),
    };
    let mut out = vec![format!(
        "Cause: the LB{} health-checks this node from its own VIP {vip} on {checked}, and {vip} \
         is {}, so the kernel discards every check as a packet with a local (martian) source.",
        service_key(e)
            .map(|k| format!(" of Service {k}"))
            .unwrap_or_default(),
        bound(vip, f.owner.as_ref()),
    )];
    out.extend(mismatch(e));
    out.push(
        "Have the LB send health checks from a source range that is not a VIP (a provider \
         option: a dedicated health-check source range, e.g. turned on together with the \
         provider's prevent-loopback Service annotation)."
            .to_string(),
    );
    out.push(unbind(vip, f));
    out.push(
        "Do not read the LB's health status as fine: when every check fails the LB treats all \
         backends as alive, which hides this until a backend really fails and still gets \
         traffic."
            .to_string(),
    );
    out
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, dst } = CauseAddresses::of(event);
    format!(
        "The load balancer's health checks from {vip} to {dst}/{proto} are dropped: the VIP is bound on this node, so the kernel drops them as a local source."
    )
}
