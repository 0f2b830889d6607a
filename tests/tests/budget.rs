//! The kernel's event budget is per record kind and source: a burst of pod-source suspects the
//! node forwards (a hairpin storm, spoofed pod sources) spends its own share of the second,
//! never the one of a health check's VIP-source suspect or of its drop, so a health check in
//! the same second on the same CPU still leaves the kernel and is confirmed as such (the
//! NodePort check's drop carries the DNAT target; its suspect names the NodePort). Behaviour
//! only, no timing assertion.
//!
//! Root only (a skip line otherwise); shares the lab like the other integration tests.

use std::time::Duration;

use probe_contract::LoopbackKind;
use probe_tests::{
    agent::{Agent, node_metric, require_root, wait_for},
    trafgen,
};
use test_support::lab::{self, LabGuard, Variants};

const METRICS: &str = "127.0.0.1:19968";
const WAIT: Duration = Duration::from_secs(10);
/// Distinct pod-source flows, far past the per-CPU budget (256 records of a kind per second):
/// even if a budget window turns over during the burst, the next one is spent as well.
const BURST: u64 = 2_000;

#[test]
fn a_suspect_burst_does_not_starve_the_drop_that_confirms_a_health_check() {
    if !require_root("budget") || !trafgen::available("budget") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::on_node_nic(&["--metrics-addr", METRICS]);
    let metric = |name: &str| node_metric(METRICS, name);
    let pod_suspects = "clbprobe_suspect_packets_total{nic=\"eth0\",source=\"pod\"}";
    let before = metric(pod_suspects);

    // The burst: UDP from a local pod's address to another node's pod, each frame a new flow.
    // The node forwards them (no drop), so they are suspects only.
    trafgen::send_from_lb(
        &trafgen::ipv4_frame_to_node(
            lab::POD_A_IP,
            lab::PEER_POD_IP,
            "udp(sport=dinc(1024, 60000), dport=9), fill(0x00, 18)",
        ),
        BURST,
    );
    // Right after it, from the same CPU (trafgen pins its worker to CPU 0): one health-check
    // SYN from the VIP, dropped as a martian source. One frame, no retransmit: its drop
    // record must leave the kernel in this budget window or never.
    trafgen::send_from_lb(
        &trafgen::ipv4_frame_to_node(
            lab::VIP,
            lab::NODE_IP,
            &format!("tcp(sp=40000, dp={}, syn, win=64240)", lab::NODE_PORT),
        ),
        1,
    );

    agent.wait_event("the health-check blackhole after the burst", WAIT, |es| {
        es.iter()
            .find(|e| e.kind == LoopbackKind::HealthcheckBlackhole && e.src_port == 40000)
            .cloned()
    });
    // The burst did spend the suspects' budget (counted exactly all the same), and no drop
    // record was shed.
    let counted = wait_for("every burst frame counted", WAIT, || {
        let n = metric(pod_suspects) - before;
        (n >= BURST).then_some(n)
    })
    .unwrap_or_else(|| metric(pod_suspects) - before);
    assert_eq!(counted, BURST, "kernel counts stay exact under the burst");
    let shed = |record: &str, source: &str| {
        metric(&format!(
            "clbprobe_events_budget_suppressed_total{{record=\"{record}\",source=\"{source}\"}}"
        ))
    };
    assert!(
        shed("suspect", "pod") > 0,
        "the burst spent the pod suspects' budget"
    );
    assert_eq!(
        shed("suspect", "vip"),
        0,
        "the health check's suspect was not shed"
    );
    assert_eq!(
        shed("drop", "vip"),
        0,
        "the health check's drop was not shed"
    );
    assert_eq!(
        metric("clbprobe_events_suppressed_total{stage=\"budget\"}"),
        shed("suspect", "pod"),
        "only the burst was shed"
    );
    drop(agent);
    drop(lab);
}
