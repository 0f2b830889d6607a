//! `vip_port_unserved`: a packet to a bound VIP refused because nothing serves that port: no
//! socket (`NO_SOCKET`), or kube-proxy's IPVS access filter (`KUBE-IPVS-FILTER`, kube-proxy
//! >= 1.25 in IPVS mode: `NETFILTER_DROP` at `nf_hook_slow`, after an ICMP port unreachable).
//!
//! With the service table from the API (`ServiceTable::from_api`), a refused port the API's
//! Service does serve is a disagreement, not a verdict: kube-proxy should have DNATed it. The
//! dataplane is asked ([`Query::Programmed`]: one chain, set or IPVS service, read over
//! netlink); when it holds nothing for the port, kube-proxy on this node has not programmed
//! the API's Service (it lags, or failed), and that is confirmed as `vip_port_unserved` with
//! the disagreement as its evidence and `facts.kube_proxy_lags` (its remedy is kube-proxy,
//! not the Service). One question per VIP:port at a time; its answer is reused for
//! [`PROGRAMMED_TTL_NS`], so a flood of refused packets costs one read.

use std::net::IpAddr;

use probe_contract::{
    AggregateKey, LoopbackEvent, Outcome, Proto, Tag,
    facts::{Facts, SourceKind},
    record::Packet,
    sock,
};

use super::{
    Correlator, DropInfo, Output, Query,
    aggregate::dropped_call,
    drop_reason::{is_netfilter_drop, is_no_socket},
    evidence::{drop_line, refusal_line, service_name},
    held::QueryCtx,
    queries::DataplaneRead,
    remedy::{
        cause::CauseAddresses,
        sentences::{sender, service_key, unserved_options},
    },
    tuple_of,
};

/// How long a dataplane answer for a VIP:port is reused (kube-proxy re-syncs every second or
/// more; a lag shorter than this is no finding anyway).
pub(super) const PROGRAMMED_TTL_NS: u64 = 5_000_000_000;
/// VIP:ports whose dataplane answer is remembered at most (a spoofed flood over many ports
/// must not grow it).
const PROGRAMMED_MAX: usize = 1024;

/// One VIP:port's dataplane question: out, or answered at a time.
pub(super) enum ProgrammedAsk {
    Asked { since: u64 },
    Known { at: u64, read: DataplaneRead },
}

impl Correlator {
    /// A drop to a bound VIP for no socket (or by kube-proxy's IPVS access filter), TCP or
    /// UDP, on a port the service table does not serve.
    pub(super) fn is_unserved_drop(&self, packet: &Packet, info: &DropInfo) -> bool {
        self.is_refused_vip_drop(packet, info)
            && self
                .services
                .serves(packet.dst, packet.dport, packet.proto)
                .is_none()
    }

    fn is_refused_vip_drop(&self, packet: &Packet, info: &DropInfo) -> bool {
        packet.dst_tag == Some(Tag::Vip)
            && (is_no_socket(&info.reason) || self.is_access_filter_drop(info))
            && matches!(packet.proto, Proto::Tcp | Proto::Udp)
    }

    /// A refused VIP packet on a port the table *from the API* serves: kube-proxy should have
    /// DNATed it. True when it was taken (asked about, or confirmed from a recent answer).
    pub(super) fn ask_if_programmed(
        &mut self,
        packet: &Packet,
        info: &DropInfo,
        out: &mut Vec<Output>,
    ) -> bool {
        if !self.services.from_api || !self.is_refused_vip_drop(packet, info) {
            return false;
        }
        let key = (packet.dst, packet.dport, packet.proto);
        match self.programmed.get(&key) {
            Some(ProgrammedAsk::Asked { .. }) => {
                // The question is out: this packet is a retransmit of the same refusal.
                self.stats.drops_unmatched += 1;
                return true;
            }
            Some(ProgrammedAsk::Known { at, read })
                if self.now.saturating_sub(*at) < PROGRAMMED_TTL_NS =>
            {
                if read.found.is_none() {
                    let read = read.clone();
                    self.confirm_not_programmed(packet, info.clone(), Ok(read), out);
                }
                return true;
            }
            _ => {}
        }
        if self.programmed.len() >= PROGRAMMED_MAX {
            let now = self.now;
            self.programmed.retain(|_, a| match a {
                ProgrammedAsk::Asked { since, .. } => {
                    now.saturating_sub(*since) < PROGRAMMED_TTL_NS
                }
                ProgrammedAsk::Known { at, .. } => now.saturating_sub(*at) < PROGRAMMED_TTL_NS,
            });
            if self.programmed.len() >= PROGRAMMED_MAX {
                return true;
            }
        }
        // The drop waits with its question (`pending_drops` until the answer).
        self.held_drops += 1;
        let id = self.new_query(QueryCtx::Programmed {
            packet: Box::new(packet.clone()),
            info: Box::new(info.clone()),
        });
        self.programmed
            .insert(key, ProgrammedAsk::Asked { since: self.now });
        out.push(Output::Query(Query::Programmed {
            id,
            mode: self.services.source,
            addr: packet.dst,
            port: packet.dport,
            proto: packet.proto,
        }));
        true
    }

    /// The dataplane's answer (or none in time: `Err`) for a refused VIP packet.
    pub(super) fn on_programmed(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        read: Result<DataplaneRead, crate::state::ReadFailed>,
        out: &mut Vec<Output>,
    ) {
        let key = (packet.dst, packet.dport, packet.proto);
        self.held_drops -= 1;
        match read {
            Ok(read) => {
                let not_programmed = read.found.is_none();
                self.programmed.insert(
                    key,
                    ProgrammedAsk::Known {
                        at: self.now,
                        read: read.clone(),
                    },
                );
                if not_programmed {
                    self.confirm_not_programmed(packet, info, Ok(read), out);
                } else {
                    // kube-proxy programmed it and the kernel still refused: not a shape this
                    // kind names (the packet bypassed the rules); counted, not reported.
                    tracing::debug!(vip = %packet.dst, port = packet.dport, found = ?read.found, "refused VIP port is programmed");
                    self.stats.drops_unmatched += 1;
                }
            }
            Err(error) => {
                // Unreadable: nothing is confirmed from a guess; asked again on the next drop.
                self.programmed.remove(&key);
                tracing::debug!(%error, vip = %packet.dst, port = packet.dport, "dataplane read for a refused VIP port");
                self.stats.drops_unmatched += 1;
            }
        }
    }

    fn confirm_not_programmed(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        read: Result<DataplaneRead, crate::state::ReadFailed>,
        out: &mut Vec<Output>,
    ) {
        let Ok(read) = read else { return };
        let api = self
            .services
            .serves(packet.dst, packet.dport, packet.proto)
            .map(|s| s.service.clone().unwrap_or_else(|| "a Service".into()))
            .unwrap_or_else(|| "a Service".into());
        let disagreement = format!(
            "the API and this node disagree: {api} serves {}/{} (the service table from the \
             API), but kube-proxy has not programmed it here: {} holds nothing for it",
            sock(packet.dst, packet.dport),
            packet.proto.as_str(),
            read.read
        );
        self.confirm_unserved_with(packet, info, Some(disagreement), out);
    }

    /// Netfilter dropped it and kube-proxy's `KUBE-IPVS-FILTER` chain exists: the filter
    /// REJECTed it (any other netfilter drop of a VIP packet is not ours to name).
    fn is_access_filter_drop(&self, info: &DropInfo) -> bool {
        !self.services.access_filter.is_empty()
            && is_netfilter_drop(&info.reason, info.location.as_deref())
    }

    pub(super) fn confirm_unserved(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        out: &mut Vec<Output>,
    ) {
        self.confirm_unserved_with(packet, info, None, out);
    }

    /// `not_programmed`: the API's Service serves the port and the dataplane has no rule for
    /// it (the disagreement, said as evidence instead of the table's "no entry").
    fn confirm_unserved_with(
        &mut self,
        packet: &Packet,
        info: DropInfo,
        not_programmed: Option<String>,
        out: &mut Vec<Output>,
    ) {
        let t = tuple_of(packet);
        let mut evidence = vec![drop_line(&info, &t)];
        // The Service the VIP belongs to: one serving the same protocol there first (an LB IP
        // shared by a TCP and a UDP Service: a refused TCP port is the TCP one's), else any.
        let on_vip = || {
            self.services
                .services
                .iter()
                .filter(|s| s.vip == packet.dst)
        };
        let owner = on_vip()
            .find(|s| s.proto == packet.proto)
            .or_else(|| on_vip().next())
            .map(|s| s.service.clone());
        let filtered = !is_no_socket(&info.reason) && self.is_access_filter_drop(&info);
        if filtered {
            self.access_filter_evidence(&mut evidence);
        }
        let kube_proxy_lags = not_programmed.is_some();
        match not_programmed {
            Some(line) => evidence.push(line),
            None => self.unserved_table_evidence(packet, &mut evidence),
        }
        evidence.push(refusal_line(packet.proto, filtered));
        self.owner_evidence(packet.dst, &mut evidence);
        let owner_name = owner.flatten().map(|s| service_name(&s));
        let key = AggregateKey::VipPortUnserved {
            vip: packet.dst,
            port: packet.dport,
            proto: packet.proto,
        };
        let event = dropped_call(&key, packet, &info, Outcome::Refused, evidence, owner_name);
        let event = LoopbackEvent {
            facts: Facts {
                owner: self.vip_owner(packet.dst, packet.dst_tag),
                access_filtered: filtered,
                kube_proxy_lags,
                ..event.facts.clone()
            },
            ..event
        };
        self.stats.drops_confirming += 1;
        self.stats.confirmed.vip_port_unserved += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }
}

// Its remedy, one option a line, and its cause: read through `super::KIND_TEXTS`.

pub(super) fn remedy(e: &LoopbackEvent) -> Vec<String> {
    let vip = e.vip.unwrap_or(e.dst);
    let port = e.vip_port.unwrap_or(e.dst_port);
    if e.facts.kube_proxy_lags {
        return not_programmed(e, vip, port);
    }
    let from = match e.facts.source {
        SourceKind::Pod | SourceKind::Node => sender(e),
        _ => "this node or its pods".to_string(),
    };
    let mut out = unserved_options(
        vip,
        port,
        e.proto,
        service_key(e).as_deref(),
        &e.facts,
        &from,
    );
    if let Some(s) = &e.facts.service
        && !s.ports.is_empty()
    {
        // The named form of "add it to the Service's ports": which ones it has.
        out[1] = format!(
            "Service {} serves {} only on {vip}: call {} on one of those ports, or, if port \
             {port} belongs to the cluster, add it to the Service's ports.",
            s.key(),
            s.ports.join(", "),
            s.dns_name()
        );
    }
    out
}

/// The API's Service serves the port and this node's kube-proxy has not programmed it (metric
/// names: kubernetes/kubernetes pkg/proxy/metrics/metrics.go): the
/// Service is right, kube-proxy is what to look at (changing the Service or the LB would
/// move nothing).
fn not_programmed(e: &LoopbackEvent, vip: IpAddr, port: u16) -> Vec<String> {
    let svc = service_key(e)
        .map(|k| format!("Service {k}"))
        .unwrap_or_else(|| "the Service".into());
    vec![
        format!(
            "Cause: {svc} serves {}/{} in the API, but kube-proxy on this node has not \
             programmed it: calls to it from this node and its pods are refused while the LB \
             still reaches other nodes. kube-proxy lags the API or its last sync failed.",
            sock(vip, port),
            e.proto.as_str()
        ),
        "Look at kube-proxy on this node: its log (sync errors), its metrics \
         `kubeproxy_sync_proxy_rules_last_timestamp_seconds` (stale) and \
         `kubeproxy_sync_proxy_rules_iptables_restore_failures_total` / \
         `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`, and its /healthz."
            .to_string(),
        "If it is stuck, restart the kube-proxy pod on this node; it re-programs every Service \
         at start. Do not change the Service or the LB: they are right."
            .to_string(),
    ]
}

/// Its cause in one sentence (the Event note's first words).
pub(super) fn cause(event: &LoopbackEvent) -> String {
    let CauseAddresses { vip, proto, .. } = CauseAddresses::of(event);
    format!(
        "{vip}/{proto} is bound on this node but nothing serves that port: calls from {} are refused locally instead of reaching the load balancer.",
        event.src
    )
}
