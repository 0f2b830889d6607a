//! Aggregation: every confirmation lands in its [`AggregateKey`]'s aggregate (count, first and
//! last time, JSON throttling); least recently seen aggregates are evicted at the bound and
//! forgotten after the TTL.

use std::net::IpAddr;

use probe_contract::{
    AggregateKey, Confirmation, LoopbackEvent, Outcome, Tag,
    facts::{AddressOwner, Facts, SourceKind},
    record::Packet,
};

use super::{
    Correlator,
    held::{Aggregate, DropInfo},
    remedy,
};

/// `LoopbackEvent::new`: the event type is the output contract's (`probe-contract`), building
/// one from the packet the kernel saw is the correlator's, so the constructor is a trait here.
/// The rules import it (`NewEvent as _`) and call `LoopbackEvent::new` as before.
pub(super) trait NewEvent {
    fn new(key: &AggregateKey, p: &Packet, ts: u64, outcome: Outcome) -> Self;
}

impl NewEvent for LoopbackEvent {
    /// The event for one occurrence of `key`, from the packet the kernel saw at `ts`: kind,
    /// key and addresses filled in, `count` 0 (set by [`Correlator::record`]), `snat` unknown,
    /// everything optional empty. Rules set the rest with struct update syntax.
    fn new(key: &AggregateKey, p: &Packet, ts: u64, outcome: Outcome) -> Self {
        LoopbackEvent {
            key: key.to_string(),
            first_seen_ns: ts,
            last_seen_ns: ts,
            facts: Facts {
                source: source_kind(p.src_tag),
                ..Facts::default()
            },
            ..LoopbackEvent::between(
                key.kind(),
                (p.src, p.sport),
                (p.dst, p.dport),
                p.proto,
                outcome,
            )
        }
    }
}

/// The aggregate of a health check from LB VIP `check.src` to this node's node port that
/// was dropped (`blackhole.rs`, and a reply to the VIP that proves the check in
/// `vip_reply.rs`).
pub(super) fn healthcheck_blackhole_key(check: &Packet) -> AggregateKey {
    AggregateKey::HealthcheckBlackhole {
        vip: check.src,
        node: check.dst,
        node_port: check.dport,
        proto: check.proto,
    }
}

/// A call the kernel dropped (or refused) on its way to the frontend it was sent to (the
/// packet's destination and port, an LB IP or VIP): [`NewEvent::new`] with the drop's
/// reason, site and interface, the frontend as the event's VIP, `evidence` and the Service
/// the rule named.
pub(super) fn dropped_call(
    key: &AggregateKey,
    p: &Packet,
    drop: &DropInfo,
    outcome: Outcome,
    evidence: Vec<String>,
    service: Option<String>,
) -> LoopbackEvent {
    LoopbackEvent {
        vip: Some(p.dst),
        vip_port: Some(p.dport),
        drop_reason: Some(drop.reason.name.clone()),
        drop_location: drop.location.clone(),
        evidence,
        nic: drop.iface.clone(),
        service,
        ..LoopbackEvent::new(key, p, drop.ts, outcome)
    }
}

/// The sender's kind from its address tag.
pub(super) fn source_kind(tag: Option<Tag>) -> SourceKind {
    match tag {
        Some(Tag::Pod) => SourceKind::Pod,
        Some(Tag::Node) => SourceKind::Node,
        Some(Tag::Vip) => SourceKind::Vip,
        None => SourceKind::Unknown,
    }
}

impl Correlator {
    /// The owner of the local address `ip` tagged `tag`: the node's owners map (every local
    /// route of table local) when it names one, else the VIP interface for a `vip` tag (the
    /// tag means bound there), unknown otherwise.
    pub(super) fn vip_owner(&self, ip: IpAddr, tag: Option<Tag>) -> Option<AddressOwner> {
        self.owner_of(ip).or_else(|| {
            (tag == Some(Tag::Vip)).then(|| AddressOwner::VipInterface {
                iface: self.cfg.vip_iface.clone(),
            })
        })
    }
}

impl Correlator {
    pub(super) fn record(
        &mut self,
        key: AggregateKey,
        mut event: LoopbackEvent,
        ts: u64,
    ) -> Confirmation {
        // One builder for every kind, from the event's facts (attribution rebuilds it with
        // the API's facts added).
        event.remedy = remedy::build(&event);
        if let Some(agg) = self.aggregates.get_mut(&key) {
            let first = agg.event.first_seen_ns.min(ts);
            let last = agg.event.last_seen_ns.max(ts);
            event.count = agg.event.count + 1;
            event.first_seen_ns = first;
            event.last_seen_ns = last;
            let write_json = ts >= agg.last_json_ns.saturating_add(self.cfg.json_repeat_ns);
            if write_json {
                agg.last_json_ns = ts;
            }
            agg.event = event.clone();
            return Confirmation {
                event,
                is_new: false,
                write_json,
            };
        }
        if self.aggregates.len() >= self.cfg.max_aggregates.max(1)
            && let Some(oldest) = self
                .aggregates
                .iter()
                .min_by_key(|(_, a)| a.event.last_seen_ns)
                .map(|(k, _)| k.clone())
        {
            self.aggregates.remove(&oldest);
            self.stats.aggregates_evicted += 1;
        }
        event.count = 1;
        self.aggregates.insert(
            key,
            Aggregate {
                event: event.clone(),
                last_json_ns: ts,
            },
        );
        Confirmation {
            event,
            is_new: true,
            write_json: true,
        }
    }

    /// Forgets aggregates without a repeat for `aggregate_ttl_ns`.
    pub(super) fn expire_aggregates(&mut self, now: u64) {
        let ttl = self.cfg.aggregate_ttl_ns;
        self.aggregates
            .retain(|_, a| a.event.last_seen_ns.saturating_add(ttl) >= now);
    }
}
