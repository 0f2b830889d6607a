//! The evidence capture end to end (issue 40): the real programs copy the first bytes of the
//! packets they record, the agent keeps each confirmed loop's first packets and serves them
//! on its HTTP port; the pcapng is opened by tcpdump (the packets) and by pcap-parser (the
//! comments), neither of them the agent's writer.

use std::time::Duration;

use probe_contract::{
    LoopbackKind,
    evidence::{EvidenceBundle, EvidenceIndex, Hook},
};
use probe_tests::{
    agent::{Agent, require_root, tempdir::TempDir, wait_for},
    capture::{packet_comments, tcpdump_read},
};
use test_support::lab::{
    self, LabGuard, Outcome, Scenario, Variants, http_get_bytes_in, http_get_in,
};

const METRICS: &str = "127.0.0.1:19967";

fn index() -> EvidenceIndex {
    let (status, body) = http_get_in(lab::NS_NODE, METRICS, "/evidence").expect("GET /evidence");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn a_confirmed_health_check_black_hole_has_its_packets_in_a_capture_tcpdump_reads() {
    if !require_root("evidence") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::start(
        lab::NS_NODE,
        &["--nic", lab::NODE_NIC, "--metrics-addr", METRICS],
    );
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    let event = agent.only_event(LoopbackKind::HealthcheckBlackhole, Duration::from_secs(10));

    // The loop is listed with packets that include its drop (the store takes them when the
    // confirmation is published, which the JSON line may precede).
    let summary = wait_for(
        "the loop's packets are kept",
        Duration::from_secs(10),
        || {
            index()
                .loops
                .into_iter()
                .find(|l| l.key == event.key && l.packets > 0)
        },
    )
    .unwrap_or_else(|| panic!("no evidence for {} in {:#?}", event.key, index()));
    assert_eq!(summary.kind, LoopbackKind::HealthcheckBlackhole);
    assert_eq!(index().mode, "headers");

    let (status, body) =
        http_get_in(lab::NS_NODE, METRICS, &format!("/evidence/{}", summary.id)).unwrap();
    assert_eq!(status, 200, "{body}");
    let bundle: EvidenceBundle = serde_json::from_str(&body).unwrap();
    assert_eq!(bundle.event.key, event.key);
    let drop = bundle
        .packets
        .iter()
        .find(|p| p.hook == Hook::KfreeSkb)
        .unwrap_or_else(|| panic!("no drop among the kept packets: {:#?}", bundle.packets));
    let reason = drop.drop_reason.clone().expect("a drop names its reason");
    assert!(drop.captured >= 40, "IP and TCP headers captured: {drop:?}");
    assert_eq!((drop.src, drop.sport), (event.src, event.src_port));

    // The capture: tcpdump shows the looping flow's source; the comments name the drop reason.
    let (status, file) = http_get_bytes_in(
        lab::NS_NODE,
        METRICS,
        &format!("/evidence/{}/capture.pcapng", summary.id),
    )
    .unwrap();
    assert_eq!(status, 200);
    let dir = TempDir::new("evidence");
    let path = dir.path().join("capture.pcapng");
    std::fs::write(&path, &file).unwrap();
    let packets = tcpdump_read(&path);
    let flow = format!("IP {}.{} > ", event.src, event.src_port);
    assert!(
        packets.contains(&flow),
        "no packet of {flow:?} in:\n{packets}"
    );
    let comments = packet_comments(&file);
    assert!(
        comments
            .iter()
            .any(|c| c.contains(&format!("drop reason {reason}")) && c.contains("hook kfree_skb")),
        "no comment names the drop reason {reason}: {comments:#?}"
    );
    assert!(
        comments
            .iter()
            .all(|c| c.contains(&format!("loop {}", summary.id))
                && c.contains("kind healthcheck_blackhole"))
    );

    // Unknown loops and paths: clear 404s.
    let (status, body) = http_get_in(lab::NS_NODE, METRICS, "/evidence/0123456789abcdef").unwrap();
    assert_eq!(status, 404);
    assert!(
        body.contains("no evidence for loop 0123456789abcdef"),
        "{body}"
    );
    assert_eq!(
        http_get_in(lab::NS_NODE, METRICS, "/evidence/x/y")
            .unwrap()
            .0,
        404
    );
}

#[test]
fn with_the_capture_off_the_loop_is_listed_without_packets() {
    if !require_root("evidence") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::start(
        lab::NS_NODE,
        &[
            "--nic",
            lab::NODE_NIC,
            "--metrics-addr",
            METRICS,
            "--capture-bytes",
            "0",
        ],
    );
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    let event = agent.only_event(LoopbackKind::HealthcheckBlackhole, Duration::from_secs(10));
    let listed = wait_for("the loop is listed", Duration::from_secs(10), || {
        index().loops.into_iter().find(|l| l.key == event.key)
    })
    .expect("the loop is listed");
    // Confirmed as before, from plain records: nothing to keep.
    assert_eq!(listed.packets, 0);
}
