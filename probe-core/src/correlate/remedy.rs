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
//! Layout: `remedy/kinds.rs` builds the remedy of each kind ([`build`]), from the sentences
//! they share (`remedy/sentences.rs`); `remedy/self_loop.rs` the `service_self_loop` remedy (the
//! missing piece, per proxy mode); `remedy/check.rs` the entry points `probe check` tells its
//! risks with. This file only hands their names on.

mod cause;
mod check;
mod kinds;
mod self_loop;
mod sentences;

// Test support: the agent's tests build a placeholder event with it.
pub use self::cause::cause;
#[doc(hidden)]
pub use self::check::placeholder;
pub use self::{
    check::{
        etp_local_drop_risk, healthcheck_blackhole, proxy_mode, service_self_loop_risk, sock_of,
        vip_port_unserved,
    },
    kinds::build,
    self_loop::self_masq_rule,
};

#[cfg(test)]
#[path = "remedy_tests.rs"]
mod tests;
