//! Proof from the loop's own clients, over injected conntrack entries.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn entry(
    src: &str,
    dst: &str,
    dport: u16,
    state: &str,
    left: u32,
    answered: bool,
) -> ConntrackEntry {
    let t = crate::test_events::tcp_tuple;
    ConntrackEntry {
        orig: t(src, 40000, dst, dport),
        reply: t(dst, dport, src, 40000),
        snat: true,
        dnat: false,
        seen_reply: answered,
        assured: false,
        tcp_state: Some(state.into()),
        timeout_s: Some(left),
    }
}

const LB: &str = "203.0.113.10";
const POD: &str = "198.19.1.10";
const OTHER_POD: &str = "198.19.1.11";
const NODE: &str = "192.0.2.1";

fn to_lb(clients: &[&str], lb_picks_backend: bool) -> Shape {
    Shape::To {
        addr: ip(LB),
        port: 80,
        proto: Proto::Tcp,
        lb_picks_backend,
        pairs: clients.iter().map(|c| (ip(c), 80, Proto::Tcp)).collect(),
    }
}

/// Masqueraded on this node (the fix the lab applies).
fn snat(mut e: ConntrackEntry) -> ConntrackEntry {
    e.snat = true;
    e
}

/// Answered by the LB alone: no NAT on this node.
fn bare(mut e: ConntrackEntry) -> ConntrackEntry {
    e.snat = false;
    e.dnat = false;
    e
}

#[test]
fn only_an_answered_connection_of_the_shape_after_the_last_sighting_proves_it() {
    let t = StateTimeouts::kernel_defaults();
    let shape = to_lb(&[POD], false);
    // TIME_WAIT (120 s) with 110 s left: its latest packet passed 10 s ago.
    let fresh = entry(POD, LB, 80, "TIME_WAIT", 110, true);
    let found = find(&shape, std::slice::from_ref(&fresh), 60_000, &t).expect("proved");
    let lines = &found.lines;
    assert!(
        lines[0].contains("1 answered connections to 203.0.113.10:80/tcp from the loop's own clients (198.19.1.10) passed packets since"),
        "{lines:?}"
    );
    // The Event quotes the 5-tuple.
    assert!(
        lines[1].starts_with(
            "conntrack: tcp 198.19.1.10:40000 -> 203.0.113.10:80 (TIME_WAIT), answered"
        ),
        "{lines:?}"
    );
    assert!(lines[1].contains("latest packet 10 s ago"), "{lines:?}");
    // The same connection, but older than the quiet stretch: from before the last sighting.
    let old = entry(POD, LB, 80, "TIME_WAIT", 20, true);
    assert_eq!(find(&shape, &[old], 60_000, &t), None);
    // Not answered (the loop itself: SYN_SENT, no reply), another port, another address.
    let unanswered = entry(POD, LB, 80, "SYN_SENT", 119, false);
    let other_port = entry(POD, LB, 443, "TIME_WAIT", 119, true);
    let other_addr = entry(POD, "203.0.113.11", 80, "TIME_WAIT", 119, true);
    assert_eq!(
        find(&shape, &[unanswered, other_port, other_addr], 60_000, &t),
        None
    );
    // No timeout (a recording without it) or an unknown state: no age, no proof.
    let mut no_age = fresh.clone();
    no_age.timeout_s = None;
    assert_eq!(find(&shape, &[no_age], 60_000, &t), None);
}

#[test]
fn a_loop_whose_other_clients_succeed_is_not_proved() {
    let t = StateTimeouts::kernel_defaults();
    let pods_hairpin = to_lb(&[POD], true);
    // The node's own call to the LB (never sent back to it) and another pod's call, both
    // answered and masqueraded: they prove nothing about the pod that looped.
    let node_call = snat(entry(NODE, LB, 80, "TIME_WAIT", 115, true));
    let other_pod = snat(entry(OTHER_POD, LB, 80, "TIME_WAIT", 115, true));
    assert_eq!(
        find(&pods_hairpin, &[node_call.clone(), other_pod], 60_000, &t),
        None
    );
    // The looping pod's own call answered (masqueraded on this node): proof.
    let own = snat(entry(POD, LB, 80, "TIME_WAIT", 115, true));
    let found = find(&pods_hairpin, &[node_call, own], 60_000, &t).expect("proved");
    assert!(!found.only_through_lb);
    assert_eq!(
        found.lines.len(),
        2,
        "the node's call is not quoted: {found:?}"
    );
    assert!(
        found.lines[1].contains("198.19.1.10:40000 -> 203.0.113.10:80")
            && found.lines[1].contains("source-NATed on this node"),
        "{found:?}"
    );
}

#[test]
fn a_hairpin_answered_by_the_lb_alone_is_flagged_not_quoted_as_node_proof() {
    let t = StateTimeouts::kernel_defaults();
    let shape = to_lb(&[POD], true);
    // The looping pod's call, answered with no NAT here: the LB may have sent it to another
    // node while the loop stands. One is no proof; enough of them (each a chance for a
    // standing loop to be confirmed again) are, flagged as through the LB.
    let lucky = bare(entry(POD, LB, 80, "TIME_WAIT", 115, true));
    assert_eq!(find(&shape, std::slice::from_ref(&lucky), 60_000, &t), None);
    let many: Vec<_> = (0..MIN_ANSWERED_THROUGH_LB as u16)
        .map(|i| {
            let mut e = lucky.clone();
            e.orig.sport += i;
            e.reply.dport += i;
            e
        })
        .collect();
    let found = find(&shape, &many, 60_000, &t).expect("seen");
    assert!(found.only_through_lb);
    assert!(found.lines[1].contains("no NAT on this node"), "{found:?}");
    // With a call NATed here beside it, the NATed one is the proof.
    let fixed = snat(entry(POD, LB, 80, "TIME_WAIT", 110, true));
    let found = find(&shape, &[lucky.clone(), fixed], 60_000, &t).expect("proved");
    assert!(!found.only_through_lb);
    assert!(found.lines[0].contains("while 1 answered"), "{found:?}");
    // A VIP port served by the node (vip_port_unserved's fix) is not the LB's choice.
    let unserved = to_lb(&[POD], false);
    assert!(
        !find(&unserved, &[lucky], 60_000, &t)
            .unwrap()
            .only_through_lb
    );
}

#[test]
fn each_kind_has_its_shape() {
    let t = StateTimeouts::kernel_defaults();
    // A health check from the VIP to the node, answered 5 s ago.
    let hc = entry(LB, NODE, 30080, "TIME_WAIT", 115, true);
    let checks_to_node = Shape::From {
        addr: ip(LB),
        to: BTreeSet::from([ip(NODE)]),
        from_outside: true,
    };
    assert!(find(&checks_to_node, std::slice::from_ref(&hc), 60_000, &t).is_some());
    assert_eq!(find(&to_lb(&[LB, NODE], false), &[hc], 60_000, &t), None);
    // The node's own VIP-sourced call elsewhere is not the LB's health check.
    let node_from_vip = entry(LB, "198.51.100.7", 443, "TIME_WAIT", 115, true);
    assert_eq!(find(&checks_to_node, &[node_from_vip], 60_000, &t), None);
    // A self-loop's proof must be the pod's own call.
    let pod_only = to_lb(&[OTHER_POD], false);
    let another_pod = entry(POD, LB, 80, "TIME_WAIT", 115, true);
    assert_eq!(find(&pod_only, &[another_pod], 60_000, &t), None);
    let the_pod = entry(OTHER_POD, LB, 80, "TIME_WAIT", 115, true);
    assert!(find(&pod_only, &[the_pod], 60_000, &t).is_some());
}

#[test]
fn a_shape_gathers_the_clients_of_its_loop() {
    let mut e = crate::test_events::hairpin("hairpin/a");
    let mut shape = Shape::of(&e).expect("a hairpin has a shape");
    e.src = ip(OTHER_POD);
    shape.widen(&e);
    let Shape::To {
        lb_picks_backend, ..
    } = &shape
    else {
        panic!("{shape:?}")
    };
    let clients = shape.clients();
    assert!(
        clients.contains(&ip(OTHER_POD)) && clients.len() == 2,
        "{clients:?}"
    );
    assert!(lb_picks_backend);
}

/// The demo's last act: the episode opened with the node's hairpin on VIP:8081, the pods'
/// then looped on VIP:80 of the same Service; the pods' fixed calls to :80 are the proof.
#[test]
fn a_loop_over_several_ports_of_its_service_is_proved_on_any_of_them() {
    let mut e = crate::test_events::hairpin("hairpin/a");
    e.src = ip(NODE);
    e.vip_port = Some(8081);
    let mut shape = Shape::of(&e).expect("a hairpin has a shape");
    let mut pods = crate::test_events::hairpin("hairpin/b");
    pods.src = ip(POD);
    pods.vip_port = Some(80);
    shape.widen(&pods);
    assert!(matches!(shape, Shape::To { .. }), "{shape:?}");
    let clients = shape.clients();
    assert_eq!(shape.other_ports(), [(80, Proto::Tcp)]);
    assert!(clients.contains(&ip(POD)) && clients.contains(&ip(NODE)));
    // Before: only :8081 matched, and the pod's answered, masqueraded call proved nothing.
    let t = StateTimeouts::kernel_defaults();
    let call = snat(entry(POD, LB, 80, "TIME_WAIT", 110, true));
    assert!(find(&shape, &[call], 60_000, &t).is_some());
    // Another port of the LB IP that no aggregate called is still no proof.
    let other = snat(entry(POD, LB, 443, "TIME_WAIT", 110, true));
    assert!(find(&shape, &[other], 60_000, &t).is_none());
}

/// Issue #36, E3: while the VIP is an address of this node, any local user (uid 65534) can
/// bind it. A connection from it to the node's address is no LB health check; a connection to
/// VIP:port answered by a listener on the VIP (nothing rewritten) is not the LB path; a
/// connection whose source is the VIP is no client's. None proves the loop; the LB's own
/// checks once the VIP is no longer local, and a pod's call DNATed on this node, still do.
#[test]
fn a_local_users_connections_on_a_local_vip_prove_nothing() {
    let t = StateTimeouts::kernel_defaults();
    // One entry, quiet for a minute; `vip_is_local`: the VIP is still an address of this node.
    let find_one = |shape: &Shape, entry: &ConntrackEntry, vip_is_local: bool| {
        find_on_node(shape, std::slice::from_ref(entry), 60_000, &t, vip_is_local)
    };
    let checks_to_node = Shape::From {
        addr: ip(LB),
        to: BTreeSet::from([ip(NODE)]),
        from_outside: true,
    };
    let from_vip = bare(entry(LB, NODE, 45678, "TIME_WAIT", 115, true));
    assert_eq!(find_one(&checks_to_node, &from_vip, true), None);
    assert!(find_one(&checks_to_node, &from_vip, false).is_some());

    // The node itself is one of the loop's clients (its own call looped).
    let shape = to_lb(&[NODE, POD], false);
    let own_listener = bare(entry(NODE, LB, 80, "TIME_WAIT", 115, true));
    assert_eq!(find_one(&shape, &own_listener, true), None);
    let mut vip_as_client = to_lb(&[LB, NODE], false);
    let from_the_vip = snat(entry(LB, LB, 80, "TIME_WAIT", 115, true));
    assert_eq!(find_one(&vip_as_client, &from_the_vip, false), None);
    vip_as_client.widen(&crate::test_events::hairpin("hairpin/a"));
    assert_eq!(find_one(&vip_as_client, &from_the_vip, true), None);
    // Served through kube-proxy's DNAT to a backend: the path the loop broke, proof.
    let mut served = bare(entry(POD, LB, 80, "TIME_WAIT", 115, true));
    served.dnat = true;
    served.reply.src = ip(OTHER_POD);
    served.reply.sport = 8080;
    assert!(find_one(&shape, &served, true).is_some());
}
