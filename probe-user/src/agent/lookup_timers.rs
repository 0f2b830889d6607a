//! When the correlation loop ([`super::correlation`]) starts its look-ups off the loop: the
//! quiet loops' proof (a conntrack dump every `check_every`) and the PROXY-protocol resets
//! (a conntrack dump every `correlate::proxy_protocol::DUMP_EVERY`) and the stale UDP entries
//! (a dump of the Service IPs' UDP entries every `correlate::stale_udp::DUMP_EVERY`). Pure, with the times
//! given: the loop's tick asks which are due, starts them, and says what came of it. One of
//! each kind is out at a time, and each is due an interval after the last one was asked for.

use std::time::{Duration, Instant};

/// A look-up the loop runs off itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    Proof,
    ProxyProtocol,
    StaleUdp,
}

/// What the loop tells the timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Signal {
    /// The loop's tick: which look-ups are due?
    Tick,
    /// A due look-up was started (`out`), or found nothing to look up.
    Started { lookup: Lookup, out: bool },
    /// A look-up's results arrived.
    Answered(Lookup),
}

#[derive(Debug)]
struct Timer {
    every: Duration,
    next: Instant,
    out: bool,
}

impl Timer {
    fn new(now: Instant, every: Duration) -> Timer {
        Timer {
            every,
            next: now + every,
            out: false,
        }
    }

    /// Due now (none out, its time come); the next one an interval from now.
    fn take_due(&mut self, now: Instant) -> bool {
        if self.out || now < self.next {
            return false;
        }
        self.next = now + self.every;
        true
    }
}

/// The correlation loop's look-up timers.
#[derive(Debug)]
pub(super) struct LookupTimers {
    proof: Timer,
    proxy_protocol: Timer,
    stale_udp: Timer,
}

impl LookupTimers {
    pub fn new(
        now: Instant,
        proof_every: Duration,
        proxy_protocol_every: Duration,
        stale_udp_every: Duration,
    ) -> Self {
        LookupTimers {
            proof: Timer::new(now, proof_every),
            proxy_protocol: Timer::new(now, proxy_protocol_every),
            stale_udp: Timer::new(now, stale_udp_every),
        }
    }

    fn timer(&mut self, lookup: Lookup) -> &mut Timer {
        match lookup {
            Lookup::Proof => &mut self.proof,
            Lookup::ProxyProtocol => &mut self.proxy_protocol,
            Lookup::StaleUdp => &mut self.stale_udp,
        }
    }

    /// The look-ups to start now, in this order (a tick's answer; the other signals' is none).
    pub fn step(&mut self, signal: Signal, now: Instant) -> Vec<Lookup> {
        match signal {
            Signal::Tick => [Lookup::Proof, Lookup::ProxyProtocol, Lookup::StaleUdp]
                .into_iter()
                .filter(|&lookup| self.timer(lookup).take_due(now))
                .collect(),
            Signal::Started { lookup, out } => {
                self.timer(lookup).out = out;
                Vec::new()
            }
            Signal::Answered(lookup) => {
                self.timer(lookup).out = false;
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROOF: Duration = Duration::from_secs(10);
    const PP: Duration = Duration::from_secs(3);
    /// Longer than these tests look: they are about the first two.
    const UDP: Duration = Duration::from_secs(1000);

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn started(lookup: Lookup, out: bool) -> Signal {
        Signal::Started { lookup, out }
    }

    #[test]
    fn each_look_up_is_due_its_interval_after_the_start_and_then_after_the_last_one() {
        let t0 = Instant::now();
        let mut t = LookupTimers::new(t0, PROOF, PP, UDP);
        assert_eq!(t.step(Signal::Tick, t0), []);
        assert_eq!(t.step(Signal::Tick, t0 + s(3)), [Lookup::ProxyProtocol]);
        // Nothing to look up (no LB with PROXY protocol): asked again an interval later.
        t.step(started(Lookup::ProxyProtocol, false), t0 + s(3));
        assert_eq!(t.step(Signal::Tick, t0 + s(5)), []);
        assert_eq!(t.step(Signal::Tick, t0 + s(6)), [Lookup::ProxyProtocol]);
        t.step(started(Lookup::ProxyProtocol, false), t0 + s(6));
        // Both due on one tick: the proof first.
        assert_eq!(
            t.step(Signal::Tick, t0 + s(10)),
            [Lookup::Proof, Lookup::ProxyProtocol]
        );
    }

    #[test]
    fn a_look_up_out_is_not_started_again_until_it_is_answered() {
        let t0 = Instant::now();
        let mut t = LookupTimers::new(t0, PROOF, PP, UDP);
        assert_eq!(
            t.step(Signal::Tick, t0 + s(10)),
            [Lookup::Proof, Lookup::ProxyProtocol]
        );
        for lookup in [Lookup::Proof, Lookup::ProxyProtocol] {
            t.step(Signal::Started { lookup, out: true }, t0 + s(10));
        }
        // A slow dump: long past both intervals, nothing new while they are out.
        assert_eq!(t.step(Signal::Tick, t0 + s(25)), []);
        t.step(Signal::Answered(Lookup::ProxyProtocol), t0 + s(25));
        assert_eq!(t.step(Signal::Tick, t0 + s(25)), [Lookup::ProxyProtocol]);
        t.step(Signal::Answered(Lookup::Proof), t0 + s(26));
        // Answered after its time: started again at the next tick.
        assert_eq!(t.step(Signal::Tick, t0 + s(26)), [Lookup::Proof]);
    }

    #[test]
    fn the_stale_udp_dump_comes_last_on_its_own_interval() {
        let t0 = Instant::now();
        let mut t = LookupTimers::new(t0, PROOF, PP, s(5));
        assert_eq!(
            t.step(Signal::Tick, t0 + s(5)),
            [Lookup::ProxyProtocol, Lookup::StaleUdp]
        );
        t.step(started(Lookup::StaleUdp, true), t0 + s(5));
        assert_eq!(
            t.step(Signal::Tick, t0 + s(10)),
            [Lookup::Proof, Lookup::ProxyProtocol]
        );
        t.step(Signal::Answered(Lookup::StaleUdp), t0 + s(10));
        assert_eq!(t.step(Signal::Tick, t0 + s(10)), [Lookup::StaleUdp]);
    }
}
