//! Remedies, one option a line, built from the event's facts ([`super::facts::Facts`]: who
//! sent the packet, who owns the local address, `externalTrafficPolicy` and `ipMode` as the
//! rules and the API say) and never from the kind alone. Written from the vendor notes in
//! `shared/reference/` (summarized, not quoted).
//!
//! Rules every remedy list keeps (the table test in `remedy_tests.rs` checks them):
//! - no sentence asserts a setting the facts do not say, or contradicts another sentence
//!   (a `Cluster` Service is never told to set `Cluster`, nor said to be `Local`);
//! - each piece of advice appears once (calling the Service by its DNS name: one line);
//! - the subject is the sender the facts name: a pod, this node, or a host-network caller.
//!
//! Layout: each kind's remedy and cause sentence live in its own module beside its rule
//! (`correlate/<kind>.rs`, found through `correlate::KIND_TEXTS`; [`build`] and [`cause`] look
//! them up), from the sentences they share (`remedy/sentences.rs`, `remedy/cause.rs`);
//! the two largest kinds keep theirs in a file of their own beside the rule
//! (`correlate/hairpin/texts.rs`, `correlate/self_loop/texts.rs`: the missing piece, per proxy
//! mode); `remedy/check.rs` the entry points `probe check` tells its risks with.

pub(super) mod cause;
mod check;
pub(super) mod sentences;

// Test support: the agent's tests build a placeholder event with it.
#[doc(hidden)]
pub use self::check::placeholder;
pub use self::{
    cause::cause,
    check::{
        etp_local_drop_risk, healthcheck_blackhole, proxy_mode, service_self_loop_risk, sock_of,
        vip_port_unserved,
    },
};

/// The remedy of a confirmed event, from its facts (the correlator's, and after attribution
/// the API's too): its kind's own (`super::KIND_TEXTS`).
pub fn build(e: &probe_contract::LoopbackEvent) -> Vec<String> {
    (super::kind_texts(e.kind).remedy)(e)
}

#[cfg(test)]
#[path = "remedy_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "remedy_golden_tests.rs"]
mod golden_tests;
