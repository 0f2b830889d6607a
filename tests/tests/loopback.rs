//! Confirmed loopback events end to end: the lab drives each failure and each healthy twin, the
//! real agent (real programs, real kernel, real conntrack and iptables) writes its JSON events,
//! and each failure must yield exactly its kind with the right fields, each twin nothing.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::time::Duration;

use probe_tests::agent::{Agent, is_local_source_drop, lines, require_root};
use serde_json::Value;
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants, http_get_in};

/// Long enough for the hairpin's settle window and its conntrack answer.
const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);

fn run(scenario: Scenario) -> (Outcome, Agent) {
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::start_with_table(lab::NS_NODE, &["--nic", lab::NODE_NIC]);
    let outcome = lab.traffic(scenario).expect("traffic");
    std::thread::sleep(SETTLE);
    // Keep the lab until the agent has had its say.
    let _ = agent.events();
    drop(lab);
    (outcome, agent)
}

fn only_event(agent: &Agent, kind: &str) -> Value {
    let e = agent.only_event(kind, WAIT);
    for key in [
        "kind",
        "src",
        "src_port",
        "dst",
        "dst_port",
        "vip",
        "vip_port",
        "proto",
        "drop_reason",
        "snat",
        "outcome",
        "count",
        "evidence",
        "remedy",
    ] {
        assert!(e.get(key).is_some(), "missing key {key} in {e:#}");
    }
    assert!(e["count"].as_u64().unwrap() >= 1);
    assert!(!e["evidence"].as_array().unwrap().is_empty());
    assert!(!e["remedy"].as_array().unwrap().is_empty());
    e
}

fn no_events(scenario: Scenario) {
    let (outcome, agent) = run(scenario);
    assert_eq!(outcome, Outcome::Ok, "{scenario} should succeed");
    assert!(
        agent.events().is_empty(),
        "{scenario}: healthy traffic reported as loopback: {:#?}",
        agent.events()
    );
}

#[test]
fn healthcheck_blackhole_is_confirmed_with_the_vip_nodeport_and_reason() {
    if !require_root("healthcheck_blackhole") {
        return;
    }
    let (outcome, agent) = run(Scenario::HealthcheckBlackhole);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "healthcheck_blackhole");
    assert_eq!(e["src"], lab::VIP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["dst"], lab::NODE_IP.to_string());
    assert_eq!(e["dst_port"], lab::NODE_PORT);
    // IP_LOCAL_SOURCE on 6.18; NOT_SPECIFIED at the route-input site on 6.1 (the VM tier).
    assert!(
        is_local_source_drop(
            e["drop_reason"].as_str().unwrap_or_default(),
            e["drop_location"].as_str().unwrap_or_default()
        ),
        "{e:#}"
    );
    assert_eq!(e["outcome"], "dropped");
    assert_eq!(e["proto"], "tcp");
    assert_eq!(e["nic"], lab::NODE_NIC);
    if lab::KubeProxyMode::from_env().unwrap() == lab::KubeProxyMode::Ipvs {
        // kube-proxy's IPVS mode names no Service in the kernel: the NodePort is an IPVS
        // virtual service on the node IP.
        let evidence = e["evidence"].to_string();
        assert!(
            evidence.contains("service table (IPVS): NodePort 30080/tcp"),
            "{e:#}"
        );
    } else {
        assert_eq!(e["service"], "default/web");
    }
}

#[test]
fn hairpin_is_confirmed_with_the_vip_it_called_and_its_reset() {
    if !require_root("hairpin") {
        return;
    }
    let (outcome, agent) = run(Scenario::Hairpin);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["src"], lab::POD_A_IP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::SERVICE_PORT);
    assert_eq!(e["dst"], lab::NODE_IP.to_string());
    assert_eq!(e["dst_port"], lab::NODE_PORT);
    assert_eq!(e["snat"], "no");
    assert_eq!(e["layer"], "l4");
    // The node answered the pod directly; the pod reset that answer (conntrack: CLOSE).
    assert_eq!(e["outcome"], "reset");
    assert_eq!(e["drop_reason"], Value::Null);
}

#[test]
fn hairpin_under_strict_rp_filter_is_confirmed_as_dropped() {
    if !require_root("hairpin_rpfilter") {
        return;
    }
    let (outcome, agent) = run(Scenario::HairpinRpfilter);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["src"], lab::POD_A_IP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::SERVICE_PORT);
    assert_eq!(e["dst_port"], lab::NODE_PORT);
    assert_eq!(e["outcome"], "dropped");
    assert_eq!(e["drop_reason"], "IP_RPFILTER");
}

#[test]
fn vip_port_unserved_is_confirmed_with_the_port_and_no_socket() {
    if !require_root("vip_port_unserved") {
        return;
    }
    let (outcome, agent) = run(Scenario::VipPortUnserved);
    assert_eq!(outcome, Outcome::Refused);
    let e = only_event(&agent, "vip_port_unserved");
    assert_eq!(e["src"], lab::POD_A_IP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::VIP_UNSERVED_PORT);
    assert_eq!(e["dst_port"], lab::VIP_UNSERVED_PORT);
    assert_eq!(e["drop_reason"], "NO_SOCKET");
    assert_eq!(e["outcome"], "refused");
}

#[test]
fn healthy_twin_healthcheck_with_unbound_vip_reports_nothing() {
    if require_root("twin_healthcheck_ok") {
        no_events(Scenario::HealthcheckOk);
    }
}

#[test]
fn healthy_twin_snated_egress_reports_nothing() {
    if require_root("twin_hairpin_snat") {
        no_events(Scenario::HairpinSnat);
    }
}

#[test]
fn healthy_twin_served_vip_port_reports_nothing() {
    if require_root("twin_vip_port_served") {
        no_events(Scenario::VipPortServed);
    }
}

#[test]
fn healthy_twin_outside_client_through_the_lb_reports_nothing() {
    if require_root("twin_outside_client") {
        no_events(Scenario::OutsideClient);
    }
}

#[test]
fn healthy_twin_pod_to_pod_reports_nothing() {
    if require_root("twin_pod_to_pod") {
        no_events(Scenario::PodToPod);
    }
}

/// Repeats aggregate: three health checks (and their SYN retransmits) are one event whose
/// count grows, written once, then at most once per 10 s.
#[test]
fn repeated_health_checks_aggregate_into_one_event() {
    if !require_root("repeated_health_checks") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::start_with_table(lab::NS_NODE, &["--nic", lab::NODE_NIC]);
    for _ in 0..3 {
        assert_eq!(
            lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
            Outcome::Timeout
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let events = agent.events();
    assert!(!events.is_empty(), "no event for three health checks");
    // One aggregate; its first line has count 1; a repeat is written again only when 10 s
    // have passed since the aggregate's last written line (a slow machine, like the VM
    // tier's emulated CPU, can take that long over three checks), with a higher count.
    for e in &events {
        assert_eq!(e["kind"], "healthcheck_blackhole");
        assert_eq!(e["key"], events[0]["key"], "one aggregate: {events:#?}");
    }
    assert_eq!(events[0]["count"], 1);
    for pair in events.windows(2) {
        let gap =
            pair[1]["last_seen_ns"].as_u64().unwrap() - pair[0]["last_seen_ns"].as_u64().unwrap();
        assert!(
            gap >= 10_000_000_000,
            "a repeat written {gap} ns after the previous line: {events:#?}"
        );
        assert!(pair[1]["count"].as_u64() > pair[0]["count"].as_u64());
    }
}

/// [`run`] with the lab brought up in the scenario's own variants, so the agent's first read
/// of the service table (its access filter included) already sees them.
fn run_in_variants(scenario: Scenario) -> (Outcome, Agent) {
    let lab = LabGuard::up(&scenario.spec().variants).expect("lab up");
    let agent = Agent::start_with_table(lab::NS_NODE, &["--nic", lab::NODE_NIC]);
    let outcome = lab.traffic(scenario).expect("traffic");
    std::thread::sleep(SETTLE);
    let _ = agent.events();
    drop(lab);
    (outcome, agent)
}

/// kube-proxy >= 1.25 (IPVS mode) REJECTs the unserved VIP port in `KUBE-IPVS-FILTER`: the
/// packet dies as NETFILTER_DROP, not NO_SOCKET, and is still `vip_port_unserved`.
#[test]
fn vip_port_unserved_is_confirmed_from_the_ipvs_access_filter_reject() {
    if !require_root("vip_port_unserved_filtered") {
        return;
    }
    let (outcome, agent) = run_in_variants(Scenario::VipPortUnservedFiltered);
    assert_eq!(outcome, Outcome::Refused);
    let e = only_event(&agent, "vip_port_unserved");
    assert_eq!(e["src"], lab::POD_A_IP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::VIP_UNSERVED_PORT);
    assert_eq!(e["drop_reason"], "NETFILTER_DROP");
    assert_eq!(e["outcome"], "refused");
    let evidence = e["evidence"].to_string();
    assert!(evidence.contains("chain KUBE-IPVS-FILTER"), "{e:#}");
    assert!(evidence.contains("-j REJECT"), "{e:#}");
    assert!(
        e["remedy"].to_string().contains("KUBE-IPVS-FILTER"),
        "{e:#}"
    );
}

#[test]
fn healthy_twin_served_vip_port_under_the_ipvs_access_filter_reports_nothing() {
    if !require_root("twin_vip_port_served_filtered") {
        return;
    }
    let (outcome, agent) = run_in_variants(Scenario::VipPortServedFiltered);
    assert_eq!(outcome, Outcome::Ok);
    assert!(agent.events().is_empty(), "{:#?}", agent.events());
}

/// The receiving side of `vip_as_source`: a packet from the VIP to a pod of this node (no
/// NodePort: no health check), dropped as a local source.
#[test]
fn vip_as_source_is_confirmed_on_the_receiving_node_and_is_no_health_check() {
    if !require_root("vip_as_source") {
        return;
    }
    let (outcome, agent) = run_in_variants(Scenario::VipAsSource);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "vip_as_source");
    assert_eq!(e["src"], lab::VIP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["dst"], lab::POD_B_IP.to_string());
    assert_eq!(e["dst_port"], lab::POD_PORT);
    assert_eq!(e["outcome"], "dropped");
    assert_eq!(e["nic"], lab::NODE_NIC);
    assert!(
        is_local_source_drop(
            e["drop_reason"].as_str().unwrap_or_default(),
            e["drop_location"].as_str().unwrap_or_default()
        ),
        "{e:#}"
    );
    let evidence = e["evidence"].to_string();
    assert!(evidence.contains("is a pod of this node"), "{e:#}");
    let remedy = e["remedy"].to_string();
    assert!(remedy.contains("externalTrafficPolicy: Local"), "{e:#}");
    assert!(remedy.contains("internalTrafficPolicy"), "{e:#}");
}

#[test]
fn healthy_twin_snated_call_from_the_peer_reports_nothing() {
    if !require_root("twin_vip_as_source_snat") {
        return;
    }
    let (outcome, agent) = run_in_variants(Scenario::VipAsSourceSnat);
    assert_eq!(outcome, Outcome::Ok);
    assert!(agent.events().is_empty(), "{:#?}", agent.events());
}

/// The sending side of `vip_as_source`: the node's own call to the LB IP (ETP Local, endpoint
/// only on the peer) leaves eth0 with the VIP as source.
#[test]
fn vip_as_source_is_confirmed_on_the_sending_node() {
    if !require_root("vip_as_source_out") {
        return;
    }
    let (outcome, agent) = run_in_variants(Scenario::VipAsSourceOut);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "vip_as_source");
    assert_eq!(e["src"], lab::VIP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["dst"], lab::PEER_POD_IP.to_string());
    assert_eq!(e["dst_port"], lab::NODE_PORT);
    assert_eq!(e["outcome"], "no_reply");
    assert_eq!(e["nic"], lab::NODE_NIC);
    assert_eq!(e["drop_reason"], Value::Null);
    assert!(
        e["evidence"].to_string().contains("tc egress on eth0"),
        "{e:#}"
    );
    assert!(e["remedy"].to_string().contains("on this node"), "{e:#}");
}

#[test]
fn healthy_twin_etp_cluster_call_from_the_node_reports_nothing() {
    if !require_root("twin_vip_as_source_out_cluster") {
        return;
    }
    let (outcome, agent) = run_in_variants(Scenario::VipAsSourceOutCluster);
    assert_eq!(outcome, Outcome::Ok);
    assert!(agent.events().is_empty(), "{:#?}", agent.events());
}

// ----- hairpin variants (issue 10, items 4 and 5) ----------------------------------------------

/// Where the agent serves /metrics inside the node namespace (its own namespace: no clash).
const METRICS: &str = "127.0.0.1:9977";

/// [`run`] with /metrics on; returns the outcome, the agent, and `clbprobe_loopback_events_total`
/// summed over `kind` (every report counts, repeats included) read before the lab goes.
fn run_counted(scenario: Scenario, kind: &str) -> (Outcome, Agent, u64) {
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::start_with_table(
        lab::NS_NODE,
        &["--nic", lab::NODE_NIC, "--metrics-addr", METRICS],
    );
    let outcome = lab.traffic(scenario).expect("traffic");
    std::thread::sleep(SETTLE);
    let _ = agent.events();
    let (_, body) = http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("/metrics");
    let prefix = format!("clbprobe_loopback_events_total{{kind=\"{kind}\"");
    let total = body
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    drop(lab);
    (outcome, agent, total)
}

fn evidence(e: &Value) -> String {
    e["evidence"].to_string()
}

/// The node itself calls the LB on a listener without the source-node guard: the request
/// comes back with the node's own IP as source and is dropped as a local source. Kind
/// `hairpin`, node-sourced.
#[test]
fn hairpin_node_sourced_is_confirmed_dropped_as_local_source() {
    if !require_root("hairpin_node_sourced") {
        return;
    }
    let (outcome, agent) = run(Scenario::HairpinNodeSourced);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["src"], lab::NODE_IP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::VIP_NO_GUARD_PORT);
    assert_eq!(e["dst"], lab::NODE_IP.to_string());
    assert_eq!(e["dst_port"], lab::NODE_PORT);
    assert_eq!(e["layer"], "l4");
    assert_eq!(e["snat"], "no");
    assert_eq!(e["outcome"], "dropped");
    assert!(
        is_local_source_drop(
            e["drop_reason"].as_str().unwrap_or_default(),
            e["drop_location"].as_str().unwrap_or_default()
        ),
        "{e:#}"
    );
    assert!(evidence(&e).contains("node-sourced"), "{e:#}");
    assert!(e["remedy"].to_string().contains("does not avoid"), "{e:#}");
}

/// The LB targets pod-b directly (no NodePort); pod-a's call comes back to the node with
/// pod-a as source and pod-b as destination; pod-b answers pod-a straight, which resets it.
#[test]
fn hairpin_lb_to_pod_is_confirmed_with_the_pod_as_destination() {
    if !require_root("hairpin_lb_to_pod") {
        return;
    }
    let (outcome, agent) = run(Scenario::HairpinLbToPod);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["src"], lab::POD_A_IP.to_string());
    assert_eq!(e["dst"], lab::POD_B_IP.to_string());
    assert_eq!(e["dst_port"], lab::POD_PORT);
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::VIP_TO_POD_PORT);
    assert_eq!(e["snat"], "no");
    assert_eq!(e["outcome"], "reset");
    assert!(evidence(&e).contains("straight to the local pod"), "{e:#}");
}

/// The hairpin over UDP: pod-a's datagram to VIP:53 comes back to the node's UDP NodePort;
/// the answer comes from the node, not the VIP.
#[test]
fn hairpin_udp_is_confirmed() {
    if !require_root("hairpin_udp") {
        return;
    }
    let (outcome, agent) = run(Scenario::HairpinUdp);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["proto"], "udp");
    assert_eq!(e["src"], lab::POD_A_IP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::VIP_UDP_PORT);
    assert_eq!(e["dst"], lab::NODE_IP.to_string());
    assert_eq!(e["dst_port"], lab::NODE_PORT_UDP);
    assert_eq!(e["snat"], "no");
    assert_eq!(e["outcome"], "no_reply");
}

/// One failed connect (the SYN and its retransmit, each dropped by rp_filter) is one
/// confirmation: the exposed total, which counts every report, stays at 1.
#[test]
fn a_failed_connect_and_its_retransmits_count_once() {
    if !require_root("hairpin_counts_once") {
        return;
    }
    let (outcome, agent, total) = run_counted(Scenario::HairpinRpfilter, "hairpin");
    assert_eq!(outcome, Outcome::Timeout);
    let drops = agent
        .records()
        .iter()
        .filter(|r| r["type"] == "drop")
        .count();
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["drop_reason"], "IP_RPFILTER");
    assert_eq!(
        total, 1,
        "reports for one connect attempt ({drops} drop records)"
    );
}

#[test]
fn healthy_twin_node_through_the_guarded_listener_reports_nothing() {
    if require_root("twin_node_to_lb_guarded") {
        no_events(Scenario::NodeToLbGuarded);
    }
}

#[test]
fn healthy_twin_outside_client_to_pod_through_the_lb_reports_nothing() {
    if require_root("twin_outside_client_lb_to_pod") {
        no_events(Scenario::OutsideClientLbToPod);
    }
}

#[test]
fn healthy_twin_outside_client_udp_reports_nothing() {
    if require_root("twin_outside_client_udp") {
        no_events(Scenario::OutsideClientUdp);
    }
}

/// The LB's instance target is a host-network listener on the node's own address (node:6443,
/// no NodePort, no pod): pod-a's call comes back with pod-a as source; confirmed on the exact
/// layer-4 match, with the socket that serves the port.
#[test]
fn hairpin_to_a_host_listener_is_confirmed_with_its_listener() {
    if !require_root("hairpin_host_listener") {
        return;
    }
    let (outcome, agent) = run(Scenario::HairpinHostListener);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["src"], lab::POD_A_IP.to_string());
    assert_eq!(e["vip"], lab::VIP.to_string());
    assert_eq!(e["vip_port"], lab::VIP_HOST_LISTENER_PORT);
    assert_eq!(e["dst"], lab::NODE_IP.to_string());
    assert_eq!(e["dst_port"], lab::HOST_LISTENER_PORT);
    assert_eq!(e["layer"], "l4");
    assert_eq!(e["snat"], "no");
    assert_eq!(e["outcome"], "reset");
    let l = &e["listener"];
    assert_eq!(l["port"], lab::HOST_LISTENER_PORT, "{e:#}");
    assert_eq!(l["proto"], "tcp", "{e:#}");
    assert_eq!(l["process"], "python3", "the lab's listener: {e:#}");
    assert!(l["pid"].as_u64().is_some(), "{e:#}");
    assert!(evidence(&e).contains("is no NodePort"), "{e:#}");
    assert!(
        e["remedy"].to_string().contains("host process python3"),
        "{e:#}"
    );
}

/// The node itself calls its own LB, whose target is the node's host listener: back with the
/// node's own address as source, dropped as a local source; the node address's owner named.
#[test]
fn hairpin_node_sourced_to_a_host_listener_is_confirmed_dropped() {
    if !require_root("hairpin_host_listener_node_sourced") {
        return;
    }
    let (outcome, agent) = run(Scenario::HairpinHostListenerNodeSourced);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "hairpin");
    assert_eq!(e["src"], lab::NODE_IP.to_string());
    assert_eq!(e["dst"], lab::NODE_IP.to_string());
    assert_eq!(e["dst_port"], lab::HOST_LISTENER_PORT);
    assert_eq!(e["layer"], "l4");
    assert_eq!(e["outcome"], "dropped");
    assert!(
        is_local_source_drop(
            e["drop_reason"].as_str().unwrap_or_default(),
            e["drop_location"].as_str().unwrap_or_default()
        ),
        "{e:#}"
    );
    assert_eq!(e["listener"]["port"], lab::HOST_LISTENER_PORT, "{e:#}");
    assert_eq!(e["facts"]["owner"]["kind"], "interface", "{e:#}");
    assert_eq!(e["facts"]["owner"]["iface"], lab::NODE_NIC, "{e:#}");
    assert!(evidence(&e).contains("node-sourced"), "{e:#}");
}

/// Twin: an outside client reaches the node's host listener through the LB and is answered.
#[test]
fn healthy_twin_outside_client_to_a_host_listener_reports_nothing() {
    if require_root("twin_outside_client_host_listener") {
        no_events(Scenario::OutsideClientHostListener);
    }
}

/// The VIP is local through a `local` route of table local (proto 66, no address), as the GCE
/// guest agent makes LB IPs local: the LB's health checks from it are martians. The event
/// names that owner, and the remedy addresses it rather than kube-proxy.
#[test]
fn healthcheck_blackhole_from_a_vip_made_local_by_a_route_names_the_route() {
    if !require_root("healthcheck_blackhole_local_route") {
        return;
    }
    let (outcome, agent) = run(Scenario::HealthcheckBlackholeLocalRoute);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "healthcheck_blackhole");
    assert_eq!(e["src"], lab::VIP.to_string());
    assert_eq!(e["dst_port"], lab::NODE_PORT);
    let o = &e["facts"]["owner"];
    assert_eq!(o["kind"], "local_route", "{e:#}");
    assert_eq!(o["protocol"], 66, "{e:#}");
    assert_eq!(o["protocol_name"], "cloud guest agent", "{e:#}");
    assert_eq!(o["iface"], lab::NODE_NIC, "{e:#}");
    assert!(
        evidence(&e).contains("proto 66 = cloud guest agent"),
        "{e:#}"
    );
    let remedy = e["remedy"].to_string();
    // Keep the guest agent's route; no node-file edit (issue 35, item 3).
    assert!(remedy.contains("guest-agent#555"), "{e:#}");
    assert!(!remedy.contains("instance_configs"), "{e:#}");
    assert!(!remedy.contains("kube-ipvs0"), "{e:#}");
}

// ----- service_self_loop (issue 23, item 6) ---------------------------------------------------

/// What every `service_self_loop` of the lab says: pod-b called `default/web`'s ClusterIP and
/// was its own endpoint; nothing rewrote its source.
fn assert_self_loop(e: &Value) {
    assert_eq!(e["src"], lab::POD_B_IP.to_string(), "{e:#}");
    assert_eq!(e["dst"], lab::POD_B_IP.to_string(), "{e:#}");
    assert_eq!(e["dst_port"], lab::POD_PORT, "{e:#}");
    assert_eq!(e["vip"], lab::CLUSTER_IP.to_string(), "{e:#}");
    assert_eq!(e["vip_port"], lab::SERVICE_PORT, "{e:#}");
    assert_eq!(e["service"], "default/web", "{e:#}");
    assert_eq!(e["outcome"], "dropped", "{e:#}");
    assert_eq!(e["snat"], "no", "{e:#}");
}

/// Without kube-proxy's hairpin masquerade (KUBE-SEP `-s pod -j KUBE-MARK-MASQ`; in IPVS mode
/// the KUBE-LOOP-BACK entry), pod-b's call to its own ClusterIP comes back to it with its own
/// address as source and dies in pod-b's namespace: seen there, confirmed with the node's
/// conntrack entry (to the ClusterIP, reply from pod-b to pod-b), the missing piece named.
#[test]
fn service_self_loop_without_the_hairpin_snat_is_confirmed_in_the_pod() {
    if !require_root("service_self_loop_snat") {
        return;
    }
    let (outcome, agent) = run_in_variants(Scenario::SelfLoop);
    assert_eq!(outcome, Outcome::Timeout);
    let e = only_event(&agent, "service_self_loop");
    assert_self_loop(&e);
    assert!(
        is_local_source_drop(
            e["drop_reason"].as_str().unwrap_or_default(),
            e["drop_location"].as_str().unwrap_or_default()
        ),
        "{e:#}"
    );
    assert_eq!(
        e["nic"],
        Value::Null,
        "dropped in the pod, not on a node interface"
    );
    let evidence = lines(&e, "evidence");
    assert!(
        evidence.contains("dropped in the pod's own network namespace"),
        "{evidence}"
    );
    assert!(
        evidence.contains("orig 198.19.1.11:") && evidence.contains("-> 198.18.100.10:80/tcp"),
        "{evidence}"
    );
    assert!(
        evidence.contains("reply 198.19.1.11:8080 -> 198.19.1.11:"),
        "{evidence}"
    );
    assert!(evidence.contains("no SRC_NAT"), "{evidence}");
    assert!(evidence.contains("missing: the hairpin SNAT"), "{evidence}");
    let remedy = lines(&e, "remedy");
    if lab::KubeProxyMode::from_env().unwrap() == lab::KubeProxyMode::Ipvs {
        assert!(
            evidence.contains("ipset KUBE-LOOP-BACK lacks 198.19.1.11,tcp:8080,198.19.1.11"),
            "{evidence}"
        );
        assert!(remedy.contains("KUBE-LOOP-BACK ipset entry"), "{remedy}");
    } else {
        assert!(
            evidence.contains("-s 198.19.1.11/32 -j KUBE-MARK-MASQ"),
            "{evidence}"
        );
    }
    assert!(!remedy.contains("hairpin-mode"), "{remedy}");
}

/// pod-b behind a bridge with br_netfilter on and hairpin mode off: kube-proxy's DNAT runs in
/// the bridge and the frame would have to leave by the port it came in on; the bridge drops
/// it. Confirmed at that port, hairpin mode named. In IPVS mode (the VM tier) the call is
/// masqueraded by KUBE-LOOP-BACK and reaches pod-b; its *answer*, un-NATed back to pod-b in
/// the bridge, dies at the port instead: the event is still the call's (endpoint port, the
/// ClusterIP), with the SNAT in its evidence.
#[test]
fn service_self_loop_at_a_bridge_port_without_hairpin_mode_names_it() {
    if !require_root("service_self_loop_bridge") {
        return;
    }
    // Up in the scenario's variants: the agent's service table then has only the ClusterIP
    // with pod-b as endpoint, which names the address called when conntrack has no entry.
    let (outcome, agent) = run_in_variants(Scenario::SelfLoopBridge);
    assert_eq!(outcome, Outcome::Timeout);
    let ipvs = lab::KubeProxyMode::from_env().unwrap() == lab::KubeProxyMode::Ipvs;
    let e = only_event(&agent, "service_self_loop");
    let mut expected = e.clone();
    if ipvs {
        // The answer's drop: the call was masqueraded, which the event says.
        assert_eq!(e["snat"], "yes", "{e:#}");
        expected["snat"] = "no".into();
        let evidence = lines(&e, "evidence");
        assert!(evidence.contains("the call was masqueraded"), "{evidence}");
        assert!(
            evidence.contains(&format!(
                "{}:{} -> {}:",
                lab::POD_B_IP,
                lab::POD_PORT,
                lab::POD_B_IP
            )),
            "the drop's own tuple is the answer: {evidence}"
        );
    }
    assert_self_loop(&expected);
    assert_eq!(e["nic"], "vpod-b", "{e:#}");
    let evidence = lines(&e, "evidence");
    assert!(
        evidence.contains("port vpod-b of cbr0, hairpin_mode 0"),
        "{evidence}"
    );
    assert!(
        evidence.contains("bridge-nf-call-iptables = 1"),
        "{evidence}"
    );
    assert!(
        evidence.contains("missing: hairpin mode on cbr0 port vpod-b"),
        "{evidence}"
    );
    let remedy = lines(&e, "remedy");
    assert!(remedy.contains("--hairpin-mode=hairpin-veth"), "{remedy}");
}

#[test]
fn healthy_twin_self_loop_with_the_hairpin_snat_reports_nothing() {
    if require_root("twin_self_loop_snat") {
        no_events(Scenario::SelfLoopSnat);
    }
}

/// The bridge twin: the same bridge with hairpin mode on (the kubelet's
/// `--hairpin-mode=hairpin-veth`) and kube-proxy's masquerade: answered, nothing reported.
#[test]
fn healthy_twin_bridge_port_with_hairpin_mode_reports_nothing() {
    if !require_root("twin_self_loop_hairpin_mode") {
        return;
    }
    let variants = Scenario::SelfLoopBridge.spec().variants;
    let lab = LabGuard::up(&variants).expect("lab up");
    lab.set_pod_b_hairpin_mode(true).expect("hairpin mode on");
    let agent = Agent::start_with_table(lab::NS_NODE, &["--nic", lab::NODE_NIC]);
    let spec = Scenario::SelfLoopBridge.spec();
    let attempt = lab
        .connect(spec.from_ns, spec.src, spec.dst)
        .expect("traffic");
    assert_eq!(attempt.outcome, Outcome::Ok, "{attempt:?}");
    std::thread::sleep(SETTLE);
    let events = agent.events();
    drop(lab);
    assert!(events.is_empty(), "healthy self-call reported: {events:#?}");
}
