//! The tracker's states over injected time and proof results.

use super::*;
use crate::test_events::hairpin_for as tests_event;

const T0: i64 = 1_800_000_000_000;
/// One second, in the tracker's milliseconds.
const S: i64 = 1000;
const WINDOW: u64 = 300;
/// The loop of [`event`]: its kind and Service.
const LOOP: &str = "hairpin/shop/web";
const W: i64 = WINDOW as i64 * S;

fn tracker() -> Tracker {
    Tracker::new(TrackerConfig {
        resolve_after_s: WINDOW,
    })
}

fn event(count: u64) -> LoopbackEvent {
    let mut e = tests_event("hairpin/web", Some("shop/web"));
    e.count = count;
    e
}

fn fields(etp: &str) -> BTreeMap<String, String> {
    [
        ("spec.type".to_string(), "LoadBalancer".to_string()),
        ("spec.externalTrafficPolicy".to_string(), etp.to_string()),
    ]
    .into_iter()
    .collect()
}

fn proof() -> Option<proof::Found> {
    Some(proof::Found {
        lines: vec!["answered".to_string()],
        only_through_lb: false,
    })
}

#[test]
fn a_loop_is_resolved_only_after_the_window_and_with_proof() {
    let mut t = tracker();
    assert_eq!(
        t.observe(&event(1), Some(fields("Local")), T0),
        Observed::New
    );
    assert_eq!(t.observe(&event(4), None, T0 + 60 * S), Observed::Repeat);
    assert_eq!(t.lifecycle().active["hairpin"], 1);
    // Inside the window: nothing to look up.
    assert!(t.due(T0 + 60 * S + W - 1).is_empty());
    let now = T0 + 60 * S + W;
    let due = t.due(now);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].quiet_for_ms, WINDOW * 1000);
    assert_eq!(
        due[0].shape,
        Shape::To {
            addr: "203.0.113.10".parse().unwrap(),
            port: 80,
            proto: probe_contract::Proto::Tcp,
            lb_picks_backend: true,
            pairs: [(event(1).src, 80, probe_contract::Proto::Tcp)]
                .into_iter()
                .collect(),
        }
    );
    // The look-up is out: not asked again.
    assert!(t.due(now + S).is_empty());
    // No proof: quiet, not resolved; the gauge of active loops falls, nothing is counted.
    assert_eq!(t.proved(LOOP, None, None, now + S), None);
    let l = t.lifecycle();
    assert_eq!((l.active["hairpin"], l.quiet["hairpin"]), (0, 1));
    assert_eq!(l.resolutions["hairpin"], 0);
    // Asked again on the next check; this time the traffic is seen answered.
    assert_eq!(t.due(now + 30 * S).len(), 1);
    let r = t
        .proved(LOOP, proof(), Some(fields("Cluster")), now + 31 * S)
        .expect("resolved");
    assert_eq!(r.kind, LoopbackKind::Hairpin);
    assert_eq!(r.service.as_deref(), Some("shop/web"));
    assert_eq!((r.count, r.lasted_s, r.episode), (2, 60, 0));
    assert_eq!(r.key, LOOP);
    assert_eq!(r.aggregates, vec!["hairpin/web".to_string()]);
    assert_eq!(r.first_seen, rfc3339(T0 / S));
    assert_eq!(r.resolved_at, rfc3339((now + 31 * S) / S));
    assert_eq!(
        r.changed,
        vec!["spec.externalTrafficPolicy: Local -> Cluster".to_string()]
    );
    let l = t.lifecycle();
    assert_eq!((l.active["hairpin"], l.quiet["hairpin"]), (0, 0));
    assert_eq!(l.resolutions["hairpin"], 1);
    assert_eq!(l.resolved, vec![r]);
    // Resolved: never looked up again.
    assert!(t.due(now + 10_000 * S).is_empty());
}

/// A tracker that saw `event(count)` (no Service fields) at `T0`, its look-up due a window
/// later: the tracker and that time.
fn due_after_one_confirmation(count: u64) -> (Tracker, i64) {
    let mut t = tracker();
    t.observe(&event(count), None, T0);
    let now = T0 + W;
    assert_eq!(t.due(now).len(), 1);
    (t, now)
}

#[test]
fn a_resolved_loop_that_recurs_is_a_regression_in_a_new_episode() {
    let (mut t, now) = due_after_one_confirmation(3);
    assert!(t.proved(LOOP, proof(), None, now).is_some());
    assert_eq!(
        t.observe(&event(4), None, now + 100 * S),
        Observed::Regression { episode: 1 }
    );
    let l = t.lifecycle();
    assert_eq!((l.active["hairpin"], l.regressions["hairpin"]), (1, 1));
    // The new episode counts its own confirmations.
    t.observe(&event(6), None, now + 110 * S);
    let later = now + 110 * S + W;
    assert_eq!(t.due(later).len(), 1);
    let r = t.proved(LOOP, proof(), None, later).unwrap();
    assert_eq!((r.episode, r.count, r.lasted_s), (1, 2, 10));
    assert_eq!(t.lifecycle().resolutions["hairpin"], 2);
}

#[test]
fn a_loop_confirmed_while_its_look_up_is_out_stays_active() {
    let (mut t, now) = due_after_one_confirmation(1);
    assert_eq!(t.observe(&event(2), None, now + S), Observed::Repeat);
    assert_eq!(t.proved(LOOP, proof(), None, now + 2 * S), None);
    assert_eq!(t.lifecycle().active["hairpin"], 1);
    assert_eq!(t.lifecycle().resolutions["hairpin"], 0);
}

#[test]
fn a_loop_without_the_address_its_proof_needs_stays_quiet() {
    let mut t = tracker();
    let mut e = event(1);
    e.vip = None;
    e.vip_port = None;
    t.observe(&e, None, T0);
    assert!(t.due(T0 + W).is_empty());
    assert_eq!(t.lifecycle().quiet["hairpin"], 1);
}

#[test]
fn the_tracked_loops_are_bounded_and_every_kind_is_listed() {
    let mut t = tracker();
    for i in 0..(MAX_TRACKED + 10) {
        let mut e = event(1);
        e.key = format!("hairpin/{i}");
        e.service = Some(format!("shop/web-{i}"));
        t.observe(&e, None, T0 + i as i64 * S);
    }
    let l = t.lifecycle();
    assert_eq!(l.active["hairpin"], MAX_TRACKED as u64);
    assert_eq!(l.active.len(), ALL_KINDS.len());
    assert_eq!(l.active["service_self_loop"], 0);
}

#[test]
fn changed_lists_each_differing_field_once() {
    let mut before = fields("Local");
    before.insert("metadata.annotations[a]".into(), "1".into());
    let mut after = fields("Local");
    after.insert("metadata.annotations[b]".into(), "2".into());
    assert_eq!(
        changed(&before, &after),
        vec![
            "metadata.annotations[a]: 1 -> (unset)".to_string(),
            "metadata.annotations[b]: (unset) -> 2".to_string(),
        ]
    );
    assert!(changed(&before, &before).is_empty());
}

#[test]
fn the_aggregates_of_one_service_are_one_loop() {
    let mut t = tracker();
    let mut other_client = event(1);
    other_client.key = "hairpin/other-client".into();
    assert_eq!(t.observe(&event(1), None, T0), Observed::New);
    assert_eq!(t.observe(&other_client, None, T0 + S), Observed::Repeat);
    assert_eq!(t.lifecycle().active["hairpin"], 1);
    // Without a Service name, the VIP and port name the loop.
    let mut unnamed = event(1);
    unnamed.service = None;
    assert_eq!(loop_key(&unnamed), "hairpin/203.0.113.10:80");
    assert_eq!(t.observe(&unnamed, None, T0 + S), Observed::New);
    let now = T0 + S + W;
    assert_eq!(t.due(now).len(), 2);
    let r = t.proved(LOOP, proof(), None, now).unwrap();
    assert_eq!(
        r.aggregates,
        vec![
            "hairpin/other-client".to_string(),
            "hairpin/web".to_string()
        ]
    );
    assert_eq!(r.count, 2);
}

#[test]
fn only_a_change_of_the_view_is_reported_not_a_loops_repeats() {
    let mut t = tracker();
    t.observe(&event(1), None, T0);
    assert!(t.take_changed(), "a new loop");
    t.observe(&event(2), None, T0 + S);
    assert!(!t.take_changed(), "a repeat of an active loop");
    assert_eq!(t.due(T0 + S + W).len(), 1);
    assert!(t.take_changed(), "gone quiet");
    t.observe(&event(3), None, T0 + 2 * S + W);
    assert!(t.take_changed(), "active again");
    assert_eq!(
        t.due(T0 + 2 * S + 2 * W).len(),
        0,
        "its look-up is still out"
    );
    assert!(t.proved(LOOP, proof(), None, T0 + 2 * S + 2 * W).is_none());
    assert!(!t.take_changed());
}

/// A conntrack entry `src:40000 -> 203.0.113.10:80/tcp`, answered 5 s ago (TIME_WAIT).
fn answered(src: &str, snat: bool) -> crate::state::ConntrackEntry {
    let t = |src: std::net::IpAddr, sport, dst: std::net::IpAddr, dport| crate::state::Tuple {
        src,
        dst,
        sport,
        dport,
        proto: probe_contract::Proto::Tcp,
    };
    let (src, lb) = (src.parse().unwrap(), "203.0.113.10".parse().unwrap());
    crate::state::ConntrackEntry {
        orig: t(src, 40000, lb, 80),
        reply: t(lb, 80, src, 40000),
        snat,
        dnat: false,
        seen_reply: true,
        assured: false,
        tcp_state: Some("TIME_WAIT".into()),
        timeout_s: Some(115),
    }
}

/// The tracker's look-up, run over `entries` as the agent runs it.
fn look_up(
    t: &mut Tracker,
    now: i64,
    entries: &[crate::state::ConntrackEntry],
) -> Option<proof::Found> {
    let due = t.due(now);
    assert_eq!(due.len(), 1, "{due:?}");
    let timeouts = crate::state::conntrack::StateTimeouts::kernel_defaults();
    proof::find(&due[0].shape, entries, due[0].quiet_for_ms, &timeouts)
}

/// A tracker that saw the hairpin `event(1)` of an externalTrafficPolicy Local Service at
/// `T0`, and the looping pod's address.
fn tracking_a_local_hairpin() -> (Tracker, String) {
    let mut t = tracker();
    let looping = event(1);
    t.observe(&looping, Some(fields("Local")), T0);
    (t, looping.src.to_string())
}

#[test]
fn a_loop_whose_other_clients_succeed_is_not_resolved_its_own_client_succeeding_is() {
    let (mut t, pod) = tracking_a_local_hairpin();
    let now = T0 + W;
    // The node's own call (the LB never sends it back) and another pod's, both answered and
    // masqueraded: the loop stays quiet, the gauge says so, nothing is counted.
    let others = [answered("192.0.2.1", true), answered("10.244.1.99", true)];
    let found = look_up(&mut t, now, &others);
    assert_eq!(found, None);
    assert_eq!(t.proved(LOOP, found, Some(fields("Local")), now), None);
    let l = t.lifecycle();
    assert_eq!((l.quiet["hairpin"], l.resolutions["hairpin"]), (1, 0));
    // The looping pod's own call answered, masqueraded on this node: resolved, its 5-tuple
    // quoted.
    let found = look_up(&mut t, now + 30 * S, &[answered(&pod, true)]);
    let r = t
        .proved(LOOP, found, Some(fields("Local")), now + 30 * S)
        .expect("resolved");
    assert!(
        r.proof[1].contains(&format!("conntrack: tcp {pod}:40000 -> 203.0.113.10:80")),
        "{:?}",
        r.proof
    );
    assert_eq!(t.lifecycle().resolutions["hairpin"], 1);
}

/// `answered`, from another source port (another connection of the same client).
fn answered_from_port(
    src: &str,
    sport: u16,
    snat: bool,
    dport: u16,
) -> crate::state::ConntrackEntry {
    let mut e = answered(src, snat);
    e.orig.sport = sport;
    e.reply.dport = sport;
    e.orig.dport = dport;
    e.reply.sport = dport;
    e
}

/// Issue #49: a change of the Service alone proves nothing (a fix that changed an annotation
/// nothing acted on). A hairpin's calls answered by the LB alone prove it only when there are
/// enough of them that a standing loop would have been confirmed again.
#[test]
fn a_hairpin_answered_by_the_lb_alone_is_resolved_only_by_enough_calls_never_by_a_change() {
    let (mut t, pod) = tracking_a_local_hairpin();
    let now = T0 + W;
    // The looping pod's one call answered with no NAT here, after the Service changed: the
    // LB may have picked another node. Not proof.
    let lucky = [answered(&pod, false)];
    let found = look_up(&mut t, now, &lucky);
    assert_eq!(found, None);
    assert_eq!(t.proved(LOOP, found, Some(fields("Cluster")), now), None);
    assert_eq!(t.lifecycle().quiet["hairpin"], 1);
    // As many answered calls as a standing loop could not dodge: resolved, and said how.
    let many: Vec<_> = (0..proof::MIN_ANSWERED_THROUGH_LB as u16)
        .map(|i| answered_from_port(&pod, 41000 + i, false, 80))
        .collect();
    let found = look_up(&mut t, now + 30 * S, &many);
    assert!(found.as_ref().is_some_and(|f| f.only_through_lb));
    let r = t
        .proved(LOOP, found, Some(fields("Local")), now + 30 * S)
        .expect("resolved");
    assert!(
        r.proof.last().unwrap().contains("none confirmed looping"),
        "{:?}",
        r.proof
    );
}

/// Issue #49, seen: the node looped on :8083 of a Service, a fix changed an annotation nothing
/// acted on, and the node's answered calls to :80 (which the LB sends elsewhere) resolved pod
/// A's loop on :8083. Only the same client's calls to the same port prove.
#[test]
fn a_service_change_and_answered_calls_on_another_port_do_not_resolve_a_loop() {
    let mut t = tracker();
    let mut pod_loop = event(1);
    pod_loop.vip_port = Some(8083);
    let mut node_loop = event(1);
    node_loop.key = "hairpin/node".into();
    node_loop.src = "192.0.2.1".parse().unwrap();
    node_loop.vip_port = Some(80);
    let pod = pod_loop.src.to_string();
    t.observe(&pod_loop, Some(fields("Local")), T0);
    t.observe(&node_loop, Some(fields("Local")), T0);
    let now = T0 + W;
    // The node's calls to :80, NATed and answered, and the pod's to :80 (it never looped
    // there): nothing about the pod's loop on :8083.
    let others = [
        answered_from_port("192.0.2.1", 42000, true, 8083),
        answered_from_port(&pod, 42001, true, 80),
    ];
    let found = look_up(&mut t, now, &others);
    assert_eq!(
        found, None,
        "another client's or another port's calls proved it"
    );
    assert_eq!(t.proved(LOOP, found, Some(fields("Cluster")), now), None);
    // The pod's own call to :8083, masqueraded here: proof.
    let own = [answered_from_port(&pod, 42002, true, 8083)];
    let found = look_up(&mut t, now + 30 * S, &own);
    assert!(
        t.proved(LOOP, found, Some(fields("Local")), now + 30 * S)
            .is_some()
    );
}

#[test]
fn a_regression_proves_itself_from_its_own_clients() {
    let mut t = tracker();
    let first = event(1);
    t.observe(&first, None, T0);
    let now = T0 + W;
    let found = look_up(&mut t, now, &[answered(&first.src.to_string(), true)]);
    assert!(t.proved(LOOP, found, None, now).is_some());
    // Another pod loops through the same Service: a new episode whose proof is that pod's.
    let mut second = event(2);
    second.src = "10.244.1.99".parse().unwrap();
    second.key = "hairpin/other".into();
    t.observe(&second, None, now + S);
    let later = now + S + W;
    let found = look_up(&mut t, later, &[answered(&first.src.to_string(), true)]);
    assert_eq!(
        found, None,
        "the first pod's call proves nothing about the second"
    );
}
