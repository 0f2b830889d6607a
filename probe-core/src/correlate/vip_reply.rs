//! Drops addressed to a bound VIP that are no refused in-cluster call, so never a
//! `vip_port_unserved`:
//!
//! - **a TCP reply to a VIP** (ACK set: the node's SYN-ACK) dropped for no socket. The node
//!   answered a connection opened *from* the VIP: IPv6 has no martian-source check, so the LB's
//!   health check from a VIP bound on kube-ipvs0 is accepted and answered, and the answer is
//!   routed to the node itself (the VIP is local) and dies there. Paired with its VIP-source
//!   suspect (the check on the NIC: the reply's destination is the suspect's source, same port
//!   and protocol, within the pair window) it is a confirmed `healthcheck_blackhole`;
//!   alone it is counted as unmatched.
//! - **an opener from outside**: the drop arrived through a monitored NIC ([`Correlator::set_nics`])
//!   from an address that is not the node's (untagged): a scanner or any outside client hit a
//!   bound VIP. `vip_port_unserved` blames in-cluster callers (this node or its pods), so
//!   this is counted as unmatched.

use probe_contract::{
    LoopbackEvent, Outcome, Proto, SnatState, Tag,
    record::{Packet, tcp_flags},
};

use super::{
    Correlator, DropInfo, Output,
    aggregate::{NewEvent as _, healthcheck_blackhole_key},
    drop_reason::is_no_socket,
    evidence::{drop_line, suspect_line},
    held::VipSuspect,
    tuple_of,
};

impl Correlator {
    /// The node's monitored NICs (the agent's attachments), for [`Self::is_outside_opener`].
    pub fn set_nics(&mut self, nics: Vec<String>) {
        self.nics = nics;
    }

    /// A TCP packet with ACK set, to a bound VIP, dropped for no socket.
    pub(super) fn is_reply_to_vip(&self, packet: &Packet, info: &DropInfo) -> bool {
        packet.dst_tag == Some(Tag::Vip)
            && packet.proto == Proto::Tcp
            && packet.tcp_flags & tcp_flags::ACK != 0
            && is_no_socket(&info.reason)
    }

    /// A drop to a bound VIP from an untagged source that came in through a monitored NIC.
    pub(super) fn is_outside_opener(&self, packet: &Packet, info: &DropInfo) -> bool {
        packet.dst_tag == Some(Tag::Vip)
            && packet.src_tag.is_none()
            && info.iface.as_ref().is_some_and(|i| self.nics.contains(i))
    }

    /// See the module docs: confirms the health-check black hole with the suspect it answers.
    pub(super) fn on_reply_to_vip(&mut self, reply: Packet, info: DropInfo, out: &mut Vec<Output>) {
        let found = self
            .vip_suspects
            .iter()
            .find(|(k, s)| {
                k.src == reply.dst
                    && k.sport == reply.dport
                    && k.proto == reply.proto
                    && self.within(s.ts, info.ts)
            })
            .map(|(k, _)| k.clone());
        let Some(suspect) = found.and_then(|k| self.vip_suspects.remove(&k)) else {
            self.stats.drops_unmatched += 1;
            return;
        };
        self.held_suspects -= suspect.n;
        self.confirm_reply_blackhole(&reply, info, suspect, out);
    }

    fn confirm_reply_blackhole(
        &mut self,
        reply: &Packet,
        info: DropInfo,
        s: VipSuspect,
        out: &mut Vec<Output>,
    ) {
        let check = s.packet.clone();
        let mut evidence = vec![
            suspect_line(s.ts, &s.nic, &check),
            drop_line(&info, &tuple_of(reply)),
            format!(
                "the node accepted the check from {} (a local address: {} has no martian-source \
                 check) and answered; its reply was routed to the node itself and dropped, so \
                 the LB never sees it",
                check.src,
                if check.src.is_ipv6() {
                    "IPv6"
                } else {
                    "this path"
                },
            ),
        ];
        let svc = self.nodeport_evidence(&check, &mut evidence);
        self.vip_served_evidence(check.src, &mut evidence);
        self.owner_evidence(check.src, &mut evidence);
        let key = healthcheck_blackhole_key(&check);
        let event = LoopbackEvent {
            vip: Some(check.src),
            drop_reason: Some(info.reason.name.clone()),
            drop_location: info.location.clone(),
            snat: SnatState::Unknown,
            evidence,
            nic: Some(s.nic.clone()),
            service: svc,
            ..LoopbackEvent::new(&key, &check, info.ts, Outcome::Dropped)
        };
        let event = self.healthcheck_facts(event, &check);
        self.stats.suspects_confirmed += s.n;
        self.stats.drops_confirming += 1;
        self.stats.confirmed.healthcheck_blackhole += 1;
        out.push(Output::Report(self.record(key, event, info.ts)));
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use probe_contract::{LoopbackKind, record::DropReason};

    use super::{
        super::{CorrelatorConfig, KernelEvent, tests::assert_mentions},
        *,
    };
    use crate::state::{NodePortEntry, ServiceSource, ServiceTable};

    const S: u64 = 1_000_000_000;
    const VIP6: &str = "2001:db8:113::10";
    const NODE6: &str = "2001:db8:18::2";
    const POD6: &str = "2001:db8:19:1::10";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The correlator tests' packet with its own TCP flags.
    #[allow(clippy::too_many_arguments)]
    fn pkt(
        src: &str,
        sport: u16,
        dst: &str,
        dport: u16,
        flags: u8,
        st: Option<Tag>,
        dt: Option<Tag>,
    ) -> Packet {
        Packet {
            tcp_flags: flags,
            ..super::super::tests::pkt(src, sport, dst, dport, st, dt)
        }
    }

    /// The node's SYN-ACK to the VIP's health check.
    fn reply_to_the_check() -> Packet {
        pkt(
            NODE6,
            30080,
            VIP6,
            41000,
            tcp_flags::SYN | tcp_flags::ACK,
            None,
            Some(Tag::Vip),
        )
    }

    fn no_socket(ts: u64, p: &Packet, iface: &str) -> KernelEvent {
        KernelEvent::Drop {
            ts_ns: ts,
            iface: Some(iface.into()),
            packet: p.clone(),
            reason: DropReason {
                code: 3,
                name: "NO_SOCKET".into(),
            },
            location: Some("tcp_v6_rcv+0x1f4".into()),
            foreign_netns: false,
        }
    }

    fn corr() -> Correlator {
        let mut c = Correlator::new(CorrelatorConfig::default());
        c.set_services(ServiceTable {
            source: Some(ServiceSource::Nftables),
            nodeports: vec![NodePortEntry {
                port: 30080,
                proto: Proto::Tcp,
                service: Some("default/web:http".into()),
                local_only: false,
            }],
            ..ServiceTable::default()
        });
        c.set_nics(vec!["eth0".into()]);
        c
    }

    fn reports(outs: &[Output]) -> Vec<&LoopbackEvent> {
        outs.iter()
            .filter_map(|o| match o {
                Output::Report(r) => Some(&r.event),
                _ => None,
            })
            .collect()
    }

    /// As measured on 6.18: the check from the VIP is answered, the SYN-ACK to the VIP's
    /// ephemeral port is delivered locally and dropped for no socket.
    #[test]
    fn ipv6_health_check_reply_dropped_locally_is_a_blackhole_not_unserved() {
        let mut c = corr();
        let check = pkt(
            VIP6,
            41000,
            NODE6,
            30080,
            tcp_flags::SYN,
            Some(Tag::Vip),
            Some(Tag::Node),
        );
        assert!(
            c.ingest(KernelEvent::Suspect {
                ts_ns: S,
                nic: "eth0".into(),
                packet: check,
            })
            .is_empty()
        );
        let reply = reply_to_the_check();
        let outs = c.ingest(no_socket(S + 1_000_000, &reply, "vpod-b"));
        let r = reports(&outs);
        assert_eq!(r.len(), 1, "{outs:#?}");
        let e = r[0];
        assert_eq!(e.kind, LoopbackKind::HealthcheckBlackhole);
        assert_eq!((e.src, e.dst, e.dst_port), (ip(VIP6), ip(NODE6), 30080));
        assert_eq!(e.vip, Some(ip(VIP6)));
        assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"));
        assert_eq!(e.outcome, Outcome::Dropped);
        assert_eq!(e.service.as_deref(), Some("default/web"));
        assert_mentions(
            &e.evidence,
            &[
                "tc ingress on eth0",
                "IPv6 has no martian-source check",
                "service table (kube-proxy nftables tables): NodePort 30080/tcp",
            ],
        );
        assert_eq!(c.stats().confirmed.vip_port_unserved, 0);
        assert_eq!(c.stats().confirmed.healthcheck_blackhole, 1);
    }

    /// A reply to a VIP without a check from it (or after the window): nothing, and never an
    /// unserved port.
    #[test]
    fn reply_to_a_vip_alone_is_never_unserved() {
        let mut c = corr();
        let reply = reply_to_the_check();
        assert!(reports(&c.ingest(no_socket(S, &reply, "vpod-b"))).is_empty());
        let ack = pkt(
            "192.0.2.10",
            30080,
            "192.0.2.10",
            50000,
            tcp_flags::ACK,
            None,
            Some(Tag::Vip),
        );
        assert!(reports(&c.ingest(no_socket(S, &ack, "lo"))).is_empty());
        assert_eq!(c.stats().drops_unmatched, 2);
        assert_eq!(c.stats().confirmed.vip_port_unserved, 0);
    }

    /// An outside scanner's SYN to a bound VIP through the NIC is not blamed on in-cluster
    /// callers (IPv4 and IPv6); the same SYN from a pod (its veth) still is.
    #[test]
    fn outside_scanner_is_not_an_unserved_port_but_a_pod_is() {
        let mut c = corr();
        for (scanner, vip) in [("198.51.100.66", "192.0.2.10"), ("2001:db8:51::66", VIP6)] {
            let syn = pkt(
                scanner,
                40000,
                vip,
                443,
                tcp_flags::SYN,
                None,
                Some(Tag::Vip),
            );
            assert!(reports(&c.ingest(no_socket(S, &syn, "eth0"))).is_empty());
        }
        assert_eq!(c.stats().confirmed.vip_port_unserved, 0);
        let syn = pkt(POD6, 40001, VIP6, 443, tcp_flags::SYN, None, Some(Tag::Vip));
        let outs = c.ingest(no_socket(2 * S, &syn, "vpod-a"));
        let r = reports(&outs);
        assert_eq!(r.len(), 1, "{outs:#?}");
        assert_eq!(r[0].kind, LoopbackKind::VipPortUnserved);
        assert_eq!((r[0].vip, r[0].vip_port), (Some(ip(VIP6)), Some(443)));
    }
}
