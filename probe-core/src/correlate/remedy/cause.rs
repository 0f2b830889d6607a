//! What every cause sentence names (the first words of a Kubernetes Event's note, the agent's
//! `sink::kube_event_doc`): [`cause`] finds the kind's own sentence, beside its rule.

use probe_contract::{LoopbackEvent, sock};

/// The cause of `event`, in one sentence (before attribution's names: addresses only): its
/// kind's own (`super::super::KIND_TEXTS`).
pub fn cause(event: &LoopbackEvent) -> String {
    (super::super::kind_texts(event.kind).cause)(event)
}

/// The addresses a cause sentence names: the VIP (with its port when known), the protocol,
/// the destination.
pub(in crate::correlate) struct CauseAddresses {
    pub vip: String,
    pub proto: &'static str,
    pub dst: String,
}

impl CauseAddresses {
    pub(in crate::correlate) fn of(event: &LoopbackEvent) -> CauseAddresses {
        let vip = event
            .vip
            .map(|v| match event.vip_port {
                Some(p) => sock(v, p),
                None => v.to_string(),
            })
            .unwrap_or_else(|| "the LB VIP".to_string());
        CauseAddresses {
            vip,
            proto: event.proto.as_str(),
            dst: sock(event.dst, event.dst_port),
        }
    }
}
