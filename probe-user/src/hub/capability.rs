//! What the agent can confirm on this node, said once when it is lost, and exposed as
//! `clbprobe_capability{name}` (1 = available, 0 = not).
//!
//! A blind spot must never be silent: without the drop hook no drop confirms anything; with
//! `kernel.kptr_restrict=2` (or without `CAP_SYSLOG`) drop sites cannot be resolved, so a
//! local-source drop on a kernel without drop reasons (`NOT_SPECIFIED` at the route-input
//! site) cannot be told apart from any other drop; and a conntrack look-up that fails leaves
//! SNAT and the hairpin outcome unknown. Each is one WARN when it goes from available to
//! unavailable (and one INFO when it comes back), not one per event.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{info, warn};

/// One capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// The `kfree_skb` hook is attached: kernel drops are seen.
    DropHook,
    /// Drop sites resolve to kernel symbols (/proc/kallsyms readable with addresses).
    DropSites,
    /// Conntrack look-ups work (SNAT of an egress flow, what became of a looping flow).
    Conntrack,
}

impl Capability {
    pub const ALL: [Capability; 3] = [
        Capability::DropHook,
        Capability::DropSites,
        Capability::Conntrack,
    ];

    /// The metric's `name` label.
    pub fn name(self) -> &'static str {
        match self {
            Capability::DropHook => "drop_hook",
            Capability::DropSites => "drop_sites",
            Capability::Conntrack => "conntrack",
        }
    }

    /// What cannot be confirmed without it (the WARN line).
    pub fn lost(self) -> &'static str {
        match self {
            Capability::DropHook => {
                "no kfree_skb hook: kernel drops are not seen, so no healthcheck_blackhole or \
                 vip_port_unserved can be confirmed and a hairpin's outcome is never `dropped` \
                 (suspects are still counted)"
            }
            Capability::DropSites => {
                "drop sites cannot be resolved (/proc/kallsyms hides addresses: \
                 kernel.kptr_restrict=2, or no CAP_SYSLOG): on kernels without drop reasons a \
                 local-source drop (NOT_SPECIFIED at the route-input site) cannot be confirmed, \
                 and events carry no drop_location"
            }
            Capability::Conntrack => {
                "conntrack look-ups fail: whether a hairpin's egress was SNATed and what became \
                 of the looping flow cannot be confirmed (reported as snat unknown / no_reply)"
            }
        }
    }
}

/// Current state of every capability; shared by the agent's tasks and its surfaces.
#[derive(Debug)]
pub struct Capabilities {
    state: [AtomicBool; 3],
}

impl Default for Capabilities {
    /// Everything available until a check says otherwise.
    fn default() -> Self {
        Capabilities {
            state: [
                AtomicBool::new(true),
                AtomicBool::new(true),
                AtomicBool::new(true),
            ],
        }
    }
}

impl Capabilities {
    fn slot(&self, c: Capability) -> &AtomicBool {
        &self.state[c as usize]
    }

    /// Records whether `c` is available; says so on a change (WARN when lost, with `detail`).
    /// Returns true when this call changed it.
    pub fn set(&self, c: Capability, available: bool, detail: &str) -> bool {
        let was = self.slot(c).swap(available, Ordering::Relaxed);
        if was == available {
            return false;
        }
        if available {
            info!(capability = c.name(), "available again");
        } else {
            warn!(capability = c.name(), detail, "{}", c.lost());
        }
        true
    }

    pub fn get(&self, c: Capability) -> bool {
        self.slot(c).load(Ordering::Relaxed)
    }

    /// (name, available) for every capability, for the metrics.
    pub fn snapshot(&self) -> Vec<(String, bool)> {
        Capability::ALL
            .iter()
            .map(|c| (c.name().to_string(), self.get(*c)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_is_reported_once_and_a_recovery_once() {
        let caps = Capabilities::default();
        // (capability, available, changed?)
        let steps = [
            (Capability::Conntrack, true, false),
            (Capability::Conntrack, false, true),
            (Capability::Conntrack, false, false),
            (Capability::Conntrack, false, false),
            (Capability::Conntrack, true, true),
            (Capability::DropSites, false, true),
            (Capability::DropSites, false, false),
        ];
        for (i, (c, available, changed)) in steps.into_iter().enumerate() {
            assert_eq!(caps.set(c, available, "test"), changed, "step {i}");
        }
        assert_eq!(
            caps.snapshot(),
            [
                ("drop_hook".to_string(), true),
                ("drop_sites".to_string(), false),
                ("conntrack".to_string(), true)
            ]
        );
    }
}
