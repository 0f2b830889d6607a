//! The reader's wake-up policy end to end: records that can confirm an event (drops) wake the
//! reader, within a per-CPU budget, and only they do; a flood of spoofed frames leaves the
//! kernel's counts exact and a health-check blackhole after it is still confirmed. Behaviour
//! only: how fast is `cargo xtask bench --detect`'s business.
//!
//! Root only (a skip line otherwise); shares the lab like the other integration tests.

use std::time::Duration;

use probe_contract::{LoopbackKind, record::KernelEvent};
use probe_tests::{
    agent::{Agent, node_metric, require_root, wait_for},
    trafgen,
};
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants};

const METRICS: &str = "127.0.0.1:19967";
const WAIT: Duration = Duration::from_secs(10);
const FRAMES: u64 = 20_000;

/// One sample of the agent's `/metrics` (exact name and labels), 0 when absent.
fn metric(name: &str) -> u64 {
    node_metric(METRICS, name)
}

fn drop_records(agent: &Agent) -> u64 {
    records_where(agent, |r| matches!(r, KernelEvent::Drop { .. }))
}

fn suspect_records(agent: &Agent) -> u64 {
    records_where(agent, |r| matches!(r, KernelEvent::Suspect { .. }))
}

/// How many of the agent's kernel records `is` picks.
fn records_where(agent: &Agent, is: impl Fn(&KernelEvent) -> bool) -> u64 {
    agent.records().iter().filter(|r| is(r)).count() as u64
}

#[test]
fn confirming_records_wake_the_reader_within_budget_and_survive_a_flood() {
    if !require_root("wakeup") {
        return;
    }
    if !trafgen::available("wakeup") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::on_node_nic(&["--metrics-addr", METRICS]);
    let wakeups = "clbprobe_kernel_reader_wakeups_total";
    let past_budget = "clbprobe_kernel_reader_wakeups_suppressed_total";

    // A flood of VIP-source frames, each a new flow: every one a suspect and a drop.
    let suspects = "clbprobe_suspect_packets_total{nic=\"eth0\",source=\"vip\"}";
    let suspects_before = metric(suspects);
    trafgen::send_from_lb(
        &trafgen::ipv4_frame_to_node(
            lab::VIP,
            lab::NODE_IP,
            "udp(sport=drnd(1024, 65000), dport=drnd(1024, 65000)), fill(0x00, 18)",
        ),
        FRAMES,
    );
    let counted = wait_for("every flood frame counted", WAIT, || {
        let n = metric(suspects) - suspects_before;
        (n >= FRAMES).then_some(n)
    })
    .unwrap_or_else(|| metric(suspects) - suspects_before);
    assert_eq!(counted, FRAMES, "kernel counts stay exact under the flood");
    // The agent drained what the flood left: records read equal records emitted.
    wait_for("the ring drained", WAIT, || {
        let read = metric("clbprobe_kernel_events_read_total");
        (read > 0 && read == drop_records(&agent) + suspect_records(&agent)).then_some(())
    });
    let woken = metric(wakeups);
    let refused = metric(past_budget);
    let drops = drop_records(&agent);
    eprintln!("flood: {drops} drop records, {woken} wake-ups, {refused} past the budget");
    assert!(metric("clbprobe_events_suppressed_total{stage=\"budget\"}") > 0);
    assert!(woken >= 1, "a drop record woke the reader");
    // Only drop records may wake it, at most once each (suspects never do), and far fewer
    // wake-ups than flood frames.
    assert!(
        woken + refused <= drops,
        "{woken} wake-ups + {refused} past the budget from {drops} drop records"
    );
    assert!(woken < FRAMES / 10, "{woken} wake-ups for {FRAMES} frames");

    // After the flood, a health-check blackhole is still confirmed, and its drop woke the
    // reader (the wake-up budget's window has turned over by the time the SYN retransmits).
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    agent.wait_event("the health-check blackhole", WAIT, |es| {
        es.iter()
            .find(|e| e.kind == LoopbackKind::HealthcheckBlackhole)
            .cloned()
    });
    assert!(
        metric(wakeups) > woken,
        "the blackhole's drop woke the reader"
    );
}
