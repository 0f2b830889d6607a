//! Where a suspect or a drop goes: each to the rule of its kind (`blackhole`, `hairpin`,
//! `unserved`, `vip_reply`, `vip_as_source`), after a drop's NodePort DNAT is undone.

use probe_contract::{Tag, record::Packet};

use super::{Correlator, DropInfo, Output, drop_reason::local_source_drop, tuple_of};
use crate::state::Tuple;

impl Correlator {
    // ----- suspects ---------------------------------------------------------------------------

    pub(super) fn on_suspect(
        &mut self,
        ts: u64,
        nic: String,
        packet: Packet,
        out: &mut Vec<Output>,
    ) {
        match packet.src_tag {
            Some(Tag::Vip) => self.stats.suspects_seen.vip += 1,
            Some(Tag::Pod) => self.stats.suspects_seen.pod += 1,
            Some(Tag::Node) => self.stats.suspects_seen.node += 1,
            None => self.stats.suspects_seen.untagged += 1,
        }
        match packet.src_tag {
            Some(Tag::Vip) => self.on_vip_suspect(ts, nic, packet, out),
            // A node source is the node-sourced loop (a host-network or masqueraded caller
            // through an LB that keeps client addresses): the hairpin rule, node-sourced.
            Some(Tag::Pod | Tag::Node) => self.on_pod_suspect(ts, nic, packet, out),
            // No rule uses untagged suspects: counted only.
            _ => self.stats.suspects_unconfirmed += 1,
        }
    }

    // ----- drops ------------------------------------------------------------------------------

    /// kube-proxy's NodePort DNAT runs in PREROUTING, before the route lookup that drops
    /// local-source and rp_filter packets: such a drop carries the DNAT target as destination,
    /// its suspect (seen at tc ingress, before netfilter) the NodePort the LB sent to. When no
    /// pending suspect or flow has the drop's exact tuple, pair it by source (address, port,
    /// protocol) within the pair window, and give it the suspect's destination back.
    pub(super) fn undo_dnat(&mut self, mut packet: Packet, info: &mut DropInfo) -> Packet {
        let t = tuple_of(&packet);
        if self.vip_suspects.contains_key(&t) || self.flows.contains_key(&t) {
            return packet;
        }
        let same_source =
            |k: &Tuple| k.src == t.src && k.sport == t.sport && k.proto == t.proto && k.sport != 0;
        let found = self
            .vip_suspects
            .iter()
            .filter(|(k, v)| same_source(k) && self.within(v.ts, info.ts))
            .map(|(_, v)| &v.packet)
            .chain(
                self.flows
                    .iter()
                    .filter(|(k, f)| same_source(k) && self.within(f.ts, info.ts))
                    .map(|(_, f)| &f.packet),
            )
            .next();
        let post = t.clone();
        if let Some(seen) = found {
            info.dnat_to = Some((packet.dst, packet.dport));
            if self.dnat_seen.len() < self.cfg.max_known_addrs || self.dnat_seen.contains_key(&post)
            {
                self.dnat_seen.insert(post, (seen.dst, seen.dport));
            }
            packet.dst = seen.dst;
            packet.dport = seen.dport;
            packet.dst_tag = seen.dst_tag;
        } else if packet.src_tag == Some(Tag::Vip)
            && let Some((dst, dport)) = self.dnat_seen.get(&post).copied()
        {
            info.dnat_to = Some((packet.dst, packet.dport));
            packet.dst = dst;
            packet.dport = dport;
            packet.dst_tag = Some(Tag::Node);
        }
        packet
    }

    pub(super) fn on_drop(&mut self, info: DropInfo, packet: Packet, out: &mut Vec<Output>) {
        self.stats.drops_seen += 1;
        let t = tuple_of(&packet);

        if packet.src_tag == Some(Tag::Vip)
            && local_source_drop(&info.reason, info.location.as_deref()).is_some()
        {
            self.on_vip_source_drop(t, info, packet, out);
            return;
        }

        // The LB's own probe to a node address, refused or dropped here (lb_probe_refused.rs).
        if self.is_lb_probe_refused(&packet, &info) {
            self.confirm_lb_probe_refused(&packet, info, out);
            return;
        }
        // Replies to a VIP and outside openers are never vip_port_unserved (vip_reply.rs).
        if self.is_reply_to_vip(&packet, &info) {
            self.on_reply_to_vip(packet, info, out);
            return;
        }
        if self.is_outside_opener(&packet, &info) {
            self.stats.drops_unmatched += 1;
            return;
        }
        if self.is_unserved_drop(&packet, &info) {
            self.confirm_unserved(&packet, info, out);
            return;
        }
        // kube-proxy's source-range firewall runs before DNAT and before its other drops.
        if let Some(entry) = self.source_ranges_drop_entry(&packet, &info) {
            self.confirm_source_ranges_drop(&packet, info, entry, out);
            return;
        }
        if self.ask_if_programmed(&packet, &info, out) {
            return;
        }
        if let Some(element) = self.etp_local_drop_element(&packet, &info) {
            self.confirm_etp_local_drop(&packet, info, element, out);
            return;
        }

        if self.flows.contains_key(&t) {
            self.on_flow_drop(&t, info, out);
            return;
        }

        if self.fold_confirmed_attempt(&packet, info.ts) {
            self.stats.drops_confirming += 1;
            return;
        }

        if self.hold_pod_drop(&t, info, packet) {
            return;
        }
        self.stats.drops_unmatched += 1;
    }
}
