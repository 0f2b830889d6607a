//! The kernel half, end to end on the real kernel: the real programs loaded by the real agent
//! in the lab's node namespace, real packets from the lab, observed through the agent's
//! recorded kernel events and, independently, through bpftool reading the maps.
//!
//! Root only (each test prints a skip line otherwise). Run one at a time: they share the lab.

use std::{
    net::{IpAddr, SocketAddrV4},
    time::Duration,
};

use probe_contract::{
    Proto, Tag,
    record::{KernelEvent, Packet},
};
use probe_tests::agent::{
    Agent, assert_contains, ip_in, is_local_source_drop, kernel_has_tcx, our_loaded_programs,
    our_tc_attachments, our_tc_links, percpu_map_sum, require_root, sh, sh_in_node, wait_for,
};
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants};

const WAIT: Duration = Duration::from_secs(10);

fn agent() -> Agent {
    Agent::on_node_nic(&[])
}

/// The record is a suspect (its NIC and packet), or None.
fn suspect(r: &KernelEvent) -> Option<(&str, &Packet)> {
    match r {
        KernelEvent::Suspect { nic, packet, .. } => Some((nic.as_str(), packet)),
        _ => None,
    }
}

/// SUSPECTS key: ifindex u32, tag u8, proto u8, pad.
fn suspects_of_tag(tag: u8) -> u64 {
    percpu_map_sum("SUSPECTS", |k| k.len() >= 5 && k[4] == tag)
}

#[test]
fn vip_source_on_the_nic_is_counted_evented_and_its_drop_has_the_reason() {
    let Some(lab) = LabGuard::for_test("vip_source", &Variants::default()) else {
        return;
    };
    let agent = agent();
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    let vip = IpAddr::V4(lab::VIP);
    agent.wait_record("suspect with a vip source on eth0", WAIT, |rs| {
        rs.iter()
            .find(|r| {
                suspect(r).is_some_and(|(nic, p)| {
                    p.src == vip
                        && p.src_tag == Some(Tag::Vip)
                        && nic == lab::NODE_NIC
                        && p.dport == lab::NODE_PORT
                })
            })
            .cloned()
    });
    let drop = agent.wait_record("its kernel drop", WAIT, |rs| {
        rs.iter().find_map(|r| match r {
            KernelEvent::Drop {
                packet,
                reason,
                location,
                iface,
                ..
            } if packet.src == vip => Some((reason.clone(), location.clone(), iface.clone())),
            _ => None,
        })
    });
    let (reason, location, iface) = &drop;
    // IP_LOCAL_SOURCE on 6.18; NOT_SPECIFIED at the route-input site on 6.1 (the VM tier).
    assert!(
        is_local_source_drop(&reason.name, location.as_deref().unwrap_or_default()),
        "{drop:#?}"
    );
    assert_eq!(iface.as_deref(), Some(lab::NODE_NIC));
    assert!(suspects_of_tag(probe_common::tag::VIP) >= 1);
    assert_eq!(suspects_of_tag(probe_common::tag::POD), 0);
}

/// Frames whose skb carries only the Ethernet header in its linear part (trafgen's PF_PACKET
/// TX ring builds them so; NICs that split headers can too) are classified all the same, and
/// counted exactly: 1000 VIP-source frames in, 1000 VIP suspects counted.
#[test]
fn suspects_in_nonlinear_skbs_are_counted_exactly() {
    if !require_root("nonlinear_skbs") {
        return;
    }
    if !probe_tests::trafgen::available("nonlinear_skbs") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = agent();
    // TX ring mode (the helper's): the non-linear layout under test.
    probe_tests::trafgen::send_from_lb(
        &probe_tests::trafgen::ipv4_frame_to_node(
            lab::VIP,
            lab::NODE_IP,
            "udp(sport=drnd(1024, 65000), dport=9), fill(0x00, 18)",
        ),
        1000,
    );
    let counted = wait_for("1000 VIP suspects counted", WAIT, || {
        let n = suspects_of_tag(probe_common::tag::VIP);
        (n >= 1000).then_some(n)
    })
    .unwrap_or_else(|| suspects_of_tag(probe_common::tag::VIP));
    assert_eq!(counted, 1000, "VIP-source frames sent: 1000");
    drop(agent);
    drop(lab);
}

#[test]
fn hairpin_pod_source_is_evented_and_tied_to_the_pods_egress_record() {
    let Some(lab) = LabGuard::for_test("hairpin_pod_source", &Variants::default()) else {
        return;
    };
    let agent = agent();
    let outcome = lab.traffic(Scenario::Hairpin).unwrap();
    assert_ne!(outcome, Outcome::Ok);
    let pod = IpAddr::V4(lab::POD_A_IP);
    let seen = agent.wait_record("suspect with a pod source", WAIT, |rs| {
        rs.iter()
            .find(|r| suspect(r).is_some_and(|(_, p)| p.src == pod && p.src_tag == Some(Tag::Pod)))
            .cloned()
    });
    let packet = seen.packet();
    assert_eq!(packet.dst, IpAddr::V4(lab::NODE_IP));
    assert_eq!(packet.dport, lab::NODE_PORT);
    let sport = packet.sport;
    // The pod's SYN left the NIC un-SNATed: EGRESS_FLOWS has (pod, sport) -> VIP:80.
    let entries = probe_tests::agent::our_map_dump("EGRESS_FLOWS");
    let found = entries.iter().find(|e| {
        let key = probe_tests::agent::hex_bytes(e.get("key"));
        key.len() >= 20
            && key[..4] == lab::POD_A_IP.octets()
            && u16::from_le_bytes([key[16], key[17]]) == sport
    });
    let entry =
        found.unwrap_or_else(|| panic!("no egress record for {pod}:{sport} in {entries:?}"));
    let value = probe_tests::agent::hex_bytes(entry.get("value"));
    assert_eq!(value[..4], lab::VIP.octets(), "egress record's destination");
    assert_eq!(
        u16::from_le_bytes([value[16], value[17]]),
        lab::SERVICE_PORT
    );
    // The client waited past the SYN retransmit: the record keeps the first SYN's time
    // (before the suspect it caused) and moves only its latest time.
    let word = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().unwrap());
    let (first, last) = (word(24), word(32));
    let suspect_ts = seen.ts_ns();
    assert!(first <= suspect_ts, "first {first} > suspect {suspect_ts}");
    assert!(
        last > first,
        "the retransmit did not move last_ns: {first} {last}"
    );
}

#[test]
fn ordinary_packets_produce_no_events_and_no_suspect_counts() {
    let Some(lab) = LabGuard::for_test(
        "ordinary_packets",
        &Variants::default().with(lab::Variant::VipBound, false),
    ) else {
        return;
    };
    let agent = agent();
    // 10,000 ICMP echoes from the outside client to the node (through the LB), plus ordinary
    // TCP through the LB and between pods.
    sh(&[
        "ip",
        "netns",
        "exec",
        lab::NS_CLIENT,
        "ping",
        "-q",
        "-f",
        "-c",
        "10000",
        "-W",
        "1",
        &lab::NODE_IP.to_string(),
    ]);
    for scenario in [
        Scenario::OutsideClient,
        Scenario::PodToPod,
        Scenario::HealthcheckOk,
    ] {
        assert_eq!(lab.traffic(scenario).unwrap(), Outcome::Ok, "{scenario}");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        agent.records().is_empty(),
        "events for ordinary traffic: {:#?}",
        agent.records()
    );
    for tag in [
        probe_common::tag::NODE,
        probe_common::tag::VIP,
        probe_common::tag::POD,
    ] {
        assert_eq!(suspects_of_tag(tag), 0, "suspect count for tag {tag}");
    }
}

#[test]
fn address_changes_after_start_are_followed_and_kube_ipvs0_is_reattached() {
    let Some(lab) = LabGuard::for_test("address_changes", &Variants::default()) else {
        return;
    };
    let mut agent = agent();
    let vip2 = std::net::Ipv4Addr::new(203, 0, 113, 20);
    let node_port = SocketAddrV4::new(lab::NODE_IP, lab::NODE_PORT);
    // The LB can send from the new VIP too.
    ip_in(
        lab::NS_LB,
        &["addr", "add", &format!("{vip2}/32"), "dev", "lo"],
    );

    let from_vip2 = |agent: &Agent| {
        agent
            .records()
            .iter()
            .filter(|r| suspect(r).is_some_and(|(_, p)| p.src == IpAddr::V4(vip2)))
            .count()
    };

    // The agent's local prefixes, as its address sync last loaded them (its `prefixes=N`
    // lines): each step below waits for the sync it causes instead of a fixed sleep, so a
    // loaded machine (the VM tier under TCG beside the host tests) waits longer rather than
    // testing before the agent has seen the change (issue 54).
    let prefixes = |agent: &mut Agent| {
        agent.log_lines().iter().rev().find_map(|l| {
            l.split("prefixes=")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        })
    };
    let synced_to = |agent: &mut Agent, want: usize, what: &str| {
        wait_for(what, WAIT, || (prefixes(agent) == Some(want)).then_some(())).unwrap_or_else(
            || {
                panic!(
                    "{what}: the agent's prefixes never {want}: {:?}",
                    prefixes(agent)
                )
            },
        );
    };
    let base = wait_for("the agent's first address sync", WAIT, || {
        prefixes(&mut agent)
    })
    .expect("the agent logs its prefixes");

    // Added after start: matched on the next packet once synced.
    ip_in(
        lab::NS_NODE,
        &["addr", "add", &format!("{vip2}/32"), "dev", lab::KUBE_IPVS0],
    );
    synced_to(&mut agent, base + 1, "the new VIP synced");
    lab.connect(lab::NS_LB, Some(vip2), node_port).unwrap();
    wait_for("suspect from the new VIP", WAIT, || {
        (from_vip2(&agent) >= 1).then_some(())
    })
    .unwrap_or_else(|| panic!("new VIP not matched: {:#?}", agent.records()));

    // Removed: no longer matched (the node now answers it like any other client).
    ip_in(
        lab::NS_NODE,
        &["addr", "del", &format!("{vip2}/32"), "dev", lab::KUBE_IPVS0],
    );
    synced_to(&mut agent, base, "the removed VIP synced");
    let before = from_vip2(&agent);
    let attempt = lab.connect(lab::NS_LB, Some(vip2), node_port).unwrap();
    assert_eq!(attempt.outcome, Outcome::Ok);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(from_vip2(&agent), before, "a removed VIP is still matched");

    // kube-proxy recreates kube-ipvs0: re-attached, its VIP matched again.
    ip_in(lab::NS_NODE, &["link", "del", lab::KUBE_IPVS0]);
    ip_in(
        lab::NS_NODE,
        &["link", "add", lab::KUBE_IPVS0, "type", "bridge"],
    );
    ip_in(
        lab::NS_NODE,
        &[
            "addr",
            "add",
            &format!("{}/32", lab::VIP),
            "dev",
            lab::KUBE_IPVS0,
        ],
    );
    wait_for("re-attached on the new kube-ipvs0", WAIT, || {
        (agent.count_log("attached iface=\"kube-ipvs0\"") >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("kube-ipvs0 not re-attached:\n{}", agent.log.join("\n")));
    // Still exactly one ingress and one egress attachment per interface (the old ones went
    // away): tcx links, or cls_bpf filters on kernels without tcx.
    assert_eq!(our_tc_attachments().len(), 4, "{:?}", our_tc_attachments());
    std::thread::sleep(Duration::from_millis(300));
    let suspects_before = suspects_of_tag(probe_common::tag::VIP);
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    wait_for("VIP matched after the recreate", WAIT, || {
        (suspects_of_tag(probe_common::tag::VIP) > suspects_before).then_some(())
    })
    .expect("VIP source counted after kube-ipvs0 was recreated");
    assert!(agent.stop().success());
}

#[test]
fn nothing_stays_attached_after_exit_sigterm_or_sigkill() {
    let Some(_lab) = LabGuard::for_test("nothing_stays_attached", &Variants::default()) else {
        return;
    };

    let mut a = agent();
    assert_eq!(
        our_tc_attachments().len(),
        4,
        "ingress+egress on eth0 and kube-ipvs0"
    );
    let status = a.stop();
    assert!(status.success(), "SIGTERM exit status {status}");
    assert_eq!(our_tc_attachments(), Vec::<String>::new());

    let mut b = agent();
    b.kill();
    if kernel_has_tcx() {
        // tcx links and programs go with the process's fds; the kernel frees them shortly after.
        let gone = wait_for("programs released after SIGKILL", WAIT, || {
            (our_tc_links().is_empty() && our_loaded_programs().is_empty()).then_some(())
        });
        assert!(
            gone.is_some(),
            "left after SIGKILL: {:?} / {:?}",
            our_tc_links(),
            our_loaded_programs()
        );
    } else {
        // cls_bpf filters are not tied to our fds: they stay until the next agent removes them.
        assert_eq!(our_tc_attachments().len(), 4, "{:?}", our_tc_attachments());
    }

    // A restart after SIGKILL attaches cleanly (adopting clsact orphans) and exits cleanly.
    let mut c = agent();
    assert_eq!(our_tc_attachments().len(), 4, "{:?}", our_tc_attachments());
    assert!(c.stop().success());
    assert_eq!(our_tc_attachments(), Vec::<String>::new());
    assert!(
        wait_for("unloaded", WAIT, || our_loaded_programs()
            .is_empty()
            .then_some(()))
        .is_some()
    );
}

/// tc filters and qdiscs on `dev` inside the node namespace, as `tc` prints them.
fn tc_state(dev: &str) -> (String, String) {
    let filters = ["ingress", "egress"]
        .iter()
        .map(|hook| sh_in_node(&["tc", "filter", "show", "dev", dev, hook]))
        .collect::<Vec<_>>()
        .join("");
    let qdiscs = sh_in_node(&["tc", "qdisc", "show", "dev", dev]);
    (filters, qdiscs)
}

/// The agent on the node's NIC with the pre-6.6 attach path forced (cls_bpf under clsact).
const NETLINK_TC: [&str; 4] = ["--nic", lab::NODE_NIC, "--tc-mode", "netlink"];

/// The node NIC's qdiscs, once none of the agent's filters is left on it.
fn qdiscs_without_our_filters() -> String {
    let (filters, qdiscs) = tc_state(lab::NODE_NIC);
    assert!(!filters.contains("clb_"), "filters left: {filters}");
    qdiscs
}

/// Neither the agent's filters nor a clsact qdisc left on the node's NIC.
fn assert_no_clsact_left() {
    let qdiscs = qdiscs_without_our_filters();
    assert!(!qdiscs.contains("clsact"), "qdisc left: {qdiscs}");
}

/// The pre-6.6 path, forced on this kernel: cls_bpf under a clsact qdisc the agent adds. It
/// must still see packets, and leave neither filter nor qdisc behind, also after a SIGKILL
/// followed by a restart.
#[test]
fn clsact_fallback_sees_packets_and_leaves_nothing_behind() {
    let Some(lab) = LabGuard::for_test("clsact_fallback", &Variants::default()) else {
        return;
    };
    let args = NETLINK_TC;
    let mut a = Agent::start(lab::NS_NODE, &args);
    let (filters, qdiscs) = tc_state(lab::NODE_NIC);
    assert!(
        filters.contains("clb_ingress") && filters.contains("clb_egress"),
        "{filters}"
    );
    assert_contains(&qdiscs, "clsact");
    assert!(our_tc_links().is_empty(), "no tcx links in netlink mode");
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    a.wait_record("suspect seen through cls_bpf", WAIT, |rs| {
        rs.iter()
            .find(|r| suspect(r).is_some_and(|(_, p)| p.src_tag == Some(Tag::Vip)))
            .cloned()
    });
    assert!(a.stop().success());
    assert_no_clsact_left();

    // SIGKILL leaves cls_bpf filters (they are not tied to our fds), which the next agent
    // removes, adopting the orphaned qdisc, and cleans up at exit.
    let mut c = killed_then_adopted(&args);
    assert!(c.stop().success());
    assert_no_clsact_left();
}

/// An agent SIGKILLed (its cls_bpf filter stays: it is not tied to the agent's fds), then the
/// next agent, which removes the orphan: one `clb_ingress` filter, not two. Returns the next
/// agent, running.
fn killed_then_adopted(args: &[&str]) -> Agent {
    let mut b = Agent::start(lab::NS_NODE, args);
    b.kill();
    let (filters, _) = tc_state(lab::NODE_NIC);
    assert_contains(&filters, "clb_ingress");
    let c = Agent::start(lab::NS_NODE, args);
    let (filters, _) = tc_state(lab::NODE_NIC);
    assert_eq!(
        filters.matches("name clb_ingress").count(),
        1,
        "one filter, not two: {filters}"
    );
    c
}

/// Runs `tc` inside the node namespace (the test's own tool: the agent never runs it).
fn node_tc(args: &[&str]) -> String {
    let mut argv = vec!["ip", "netns", "exec", lab::NS_NODE, "tc"];
    argv.extend_from_slice(args);
    sh(&argv)
}

/// Another tool's filters on the NIC's clsact hooks: a u32 on each hook (this kernel has
/// neither matchall nor gact) and, on ingress, a classic-BPF cls_bpf carrying our very handle
/// (0xc1b) but not our program.
fn add_foreign_filters() {
    let nic = lab::NODE_NIC;
    for hook in ["ingress", "egress"] {
        node_tc(&[
            "filter", "add", "dev", nic, hook, "pref", "100", "u32", "match", "u32", "0", "0",
            "classid", "1:1",
        ]);
    }
    node_tc(&[
        "filter",
        "add",
        "dev",
        nic,
        "ingress",
        "pref",
        "200",
        "handle",
        "0xc1b",
        "bpf",
        "bytecode",
        "1,6 0 0 0",
    ]);
}

fn assert_foreign_filters_intact() {
    for hook in ["ingress", "egress"] {
        let filters = node_tc(&["filter", "show", "dev", lab::NODE_NIC, hook]);
        assert!(
            filters.contains("pref 100 u32"),
            "foreign u32 lost on {hook}: {filters}"
        );
        if hook == "ingress" {
            assert!(
                filters.contains("handle 0xc1b not_in_hw bytecode"),
                "foreign cls_bpf lost: {filters}"
            );
        }
    }
}

/// The clsact path leaves other tools' filters alone: at exit it removes only its own filters
/// (program name and handle), keeps a qdisc it added while others use it, and a restart after
/// SIGKILL removes the orphaned filters, again only ours.
#[test]
fn clsact_fallback_keeps_foreign_filters() {
    let Some(_lab) = LabGuard::for_test("clsact_foreign_filters", &Variants::default()) else {
        return;
    };
    let args = NETLINK_TC;

    // The agent adds the qdisc; another tool then adds filters to it.
    let mut a = Agent::start(lab::NS_NODE, &args);
    add_foreign_filters();
    assert!(a.stop().success());
    let qdiscs = qdiscs_without_our_filters();
    assert_foreign_filters_intact();
    assert!(
        qdiscs.contains("clsact"),
        "a qdisc in use removed: {qdiscs}"
    );

    // The qdisc is the other tool's now: SIGKILL leaves our filters beside theirs; the next
    // agent removes only the orphans, and at exit only its own.
    let mut c = killed_then_adopted(&args);
    assert_foreign_filters_intact();
    assert!(c.stop().success());
    let qdiscs = qdiscs_without_our_filters();
    assert_foreign_filters_intact();
    assert_contains(&qdiscs, "clsact");
    node_tc(&["qdisc", "del", "dev", lab::NODE_NIC, "clsact"]);
}

/// Two namespaces of this test's own, removed on drop (also on panic).
struct V6Pair;

const V6_A: &str = "clbv6-node";
const V6_B: &str = "clbv6-peer";

impl V6Pair {
    fn up() -> V6Pair {
        let _ = V6Pair::down();
        let pair = V6Pair;
        sh(&["ip", "netns", "add", V6_A]);
        sh(&["ip", "netns", "add", V6_B]);
        // `ip -n NS` with a command's words.
        let ip = |ns: &str, words: &str| ip_in(ns, &words.split(' ').collect::<Vec<_>>());
        ip(
            V6_A,
            &format!("link add eth0 type veth peer name eth0 netns {V6_B}"),
        );
        ip(V6_A, "link add kube-ipvs0 type bridge");
        ip(V6_A, "addr add 2001:db8::1/64 dev eth0 nodad");
        ip(V6_A, "addr add 2001:db8:ffff::10/128 dev kube-ipvs0 nodad");
        ip(V6_A, "link set eth0 up");
        ip(V6_A, "link set lo up");
        ip(V6_A, "route add default via 2001:db8::2");
        ip(V6_B, "addr add 2001:db8::2/64 dev eth0 nodad");
        ip(V6_B, "addr add 2001:db8:ffff::10/128 dev lo");
        ip(V6_B, "link set eth0 up");
        ip(V6_B, "link set lo up");
        pair
    }

    fn down() -> Option<()> {
        for ns in [V6_A, V6_B] {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(std::process::Stdio::null())
                .status();
        }
        Some(())
    }
}

impl Drop for V6Pair {
    fn drop(&mut self) {
        V6Pair::down();
    }
}

/// The IPv6 path of the programs and the v6 trie: a packet from the node's own (VIP) IPv6
/// address arriving on the NIC is a suspect tagged vip; an ordinary v6 packet is not.
#[test]
fn ipv6_vip_source_is_matched_and_ordinary_v6_is_not() {
    if !require_root("ipv6_vip_source") {
        return;
    }
    let _pair = V6Pair::up();
    let agent = Agent::start(V6_A, &["--nic", "eth0"]);
    let send = |src: &str| {
        let script = format!(
            "import socket; s=socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); \
             s.bind(('{src}', 0)); s.sendto(b'x', ('2001:db8::1', 9999))"
        );
        sh(&["ip", "netns", "exec", V6_B, "python3", "-c", &script]);
    };
    send("2001:db8::2");
    send("2001:db8:ffff::10");
    let seen = agent.wait_record("v6 suspect", WAIT, |rs| {
        rs.iter().find(|r| suspect(r).is_some()).cloned()
    });
    let packet = seen.packet();
    assert_eq!(packet.src, "2001:db8:ffff::10".parse::<IpAddr>().unwrap());
    assert_eq!(packet.src_tag, Some(Tag::Vip));
    assert_eq!(packet.dst_tag, Some(Tag::Node));
    assert_eq!(packet.proto, Proto::Udp);
    assert_eq!(packet.dport, 9999);
    std::thread::sleep(Duration::from_millis(300));
    let suspects: Vec<_> = agent
        .records()
        .into_iter()
        .filter(|r| suspect(r).is_some())
        .collect();
    assert_eq!(
        suspects.len(),
        1,
        "the ordinary v6 packet is not a suspect: {suspects:#?}"
    );
}
