//! Confirmed loopback events end to end: the lab drives each failure and each healthy twin, the
//! real agent (real programs, real kernel, real conntrack and iptables) writes its JSON events,
//! and each failure must yield exactly its kind with the right fields, each twin nothing.
//!
//! The failures and the twins are tables ([`failures!`], [`twins!`]): one test per row, each
//! run by [`Failure::check`] or [`twin`]. A row lists every field it asserts ([`Is`]); what
//! depends on the kube-proxy mode or reads nested facts is the row's `more` function.
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use probe_contract::{
    Layer, LoopbackEvent, LoopbackKind, Outcome as Fate, Proto, SnatState, facts::AddressOwner,
    record::KernelEvent,
};
use probe_tests::agent::{Agent, assert_contains, dropped_as_local_source, lines, require_root};
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants, http_get_in};

/// Long enough for the hairpin's settle window and its conntrack answer.
const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(10);

/// Which variants the lab comes up in.
#[derive(Clone, Copy)]
enum Up {
    /// The default variants; the scenario switches its own on.
    Default,
    /// The scenario's own variants, so the agent's first read of the service table (its
    /// access filter included) already sees them.
    InVariants,
}

/// Brings the lab up, starts the agent (its service table read), drives `scenario` and lets
/// the agent have its say before the lab goes.
fn run(scenario: Scenario, up: Up) -> (Outcome, Agent) {
    let variants = match up {
        Up::Default => Variants::default(),
        Up::InVariants => scenario.spec().variants,
    };
    let lab = LabGuard::up(&variants).expect("lab up");
    let agent = Agent::on_node_nic_with_table(&[]);
    let outcome = lab.traffic(scenario).expect("traffic");
    std::thread::sleep(SETTLE);
    // Keep the lab until the agent has had its say.
    let _ = agent.events();
    drop(lab);
    (outcome, agent)
}

/// The one event of `kind` (every event so far must be of it), with what every event carries.
/// Every field of the contract is on the line ([`Agent::events`] checks the line against the
/// type).
fn only_event(agent: &Agent, kind: LoopbackKind) -> LoopbackEvent {
    let e = agent.only_event(kind, WAIT);
    assert!(e.count >= 1, "{e:#?}");
    assert!(!e.evidence.is_empty(), "{e:#?}");
    assert!(!e.remedy.is_empty(), "{e:#?}");
    e
}

/// One field of a confirmed event, as a row expects it.
#[derive(Clone, Copy, Debug)]
enum Is {
    Src(Ipv4Addr),
    Dst(Ipv4Addr),
    DstPort(u16),
    Vip(Ipv4Addr),
    VipPort(u16),
    Proto(Proto),
    Snat(SnatState),
    Layer(Layer),
    Outcome(Fate),
    /// `drop_reason` exactly (None: null).
    DropReason(Option<&'static str>),
    /// Dropped as a local source, as this kernel reports it ([`dropped_as_local_source`]).
    LocalSourceDrop,
    /// `nic` exactly (None: null).
    Nic(Option<&'static str>),
    Service(&'static str),
    /// The listener that serves the port: its port, protocol and process, with a pid.
    Listener(u16, Proto, &'static str),
    /// The listener's port (the rest not asserted).
    ListenerPort(u16),
    /// `facts.owner`.
    OwnedByInterface(&'static str),
    /// `facts.owner`: an address on this interface held by this announcer.
    OwnedByAnnouncer(&'static str, &'static str),
    /// `facts.owner` names no announcer.
    NoAnnouncer,
    /// `facts.owner`: a `local` route (device, protocol number, protocol name).
    OwnedByLocalRoute(&'static str, u8, &'static str),
    /// A line of `evidence` contains it.
    Evidence(&'static str),
    /// A line of `remedy` contains it.
    Remedy(&'static str),
    /// No line of `remedy` contains it.
    NoRemedy(&'static str),
}

impl Is {
    fn check(self, e: &LoopbackEvent) {
        let v4 = |a: Ipv4Addr| IpAddr::V4(a);
        let evidence = lines(&e.evidence);
        let remedy = lines(&e.remedy);
        let ok = match self {
            Is::Src(a) => e.src == v4(a),
            Is::Dst(a) => e.dst == v4(a),
            Is::DstPort(p) => e.dst_port == p,
            Is::Vip(a) => e.vip == Some(v4(a)),
            Is::VipPort(p) => e.vip_port == Some(p),
            Is::Proto(p) => e.proto == p,
            Is::Snat(s) => e.snat == s,
            Is::Layer(l) => e.layer == Some(l),
            Is::Outcome(o) => e.outcome == o,
            Is::DropReason(r) => e.drop_reason.as_deref() == r,
            Is::LocalSourceDrop => dropped_as_local_source(e),
            Is::Nic(n) => e.nic.as_deref() == n,
            Is::Service(s) => e.service.as_deref() == Some(s),
            Is::Listener(port, proto, process) => e.listener.as_ref().is_some_and(|l| {
                l.port == port
                    && l.proto == proto
                    && l.process.as_deref() == Some(process)
                    && l.pid.is_some()
            }),
            Is::ListenerPort(port) => e.listener.as_ref().is_some_and(|l| l.port == port),
            Is::OwnedByInterface(iface) => e.facts.owner == Some(AddressOwner::interface(iface)),
            Is::OwnedByAnnouncer(iface, name) => matches!(
                &e.facts.owner,
                Some(AddressOwner::Interface { iface: i, announcer: Some(a) })
                    if i == iface && a.name == name
            ),
            Is::NoAnnouncer => e
                .facts
                .owner
                .as_ref()
                .and_then(AddressOwner::announcer)
                .is_none(),
            Is::OwnedByLocalRoute(iface, protocol, name) => {
                e.facts.owner
                    == Some(AddressOwner::LocalRoute {
                        iface: Some(iface.into()),
                        protocol,
                        protocol_name: name.into(),
                    })
            }
            Is::Evidence(s) => evidence.contains(s),
            Is::Remedy(s) => remedy.contains(s),
            Is::NoRemedy(s) => !remedy.contains(s),
        };
        assert!(ok, "expected {self:?}: {e:#?}");
    }
}

/// A failure: the client's outcome, then exactly one event of `kind` with every field of `is`
/// and whatever `more` asserts.
struct Failure {
    scenario: Scenario,
    up: Up,
    client: Outcome,
    kind: LoopbackKind,
    is: &'static [Is],
    more: fn(&LoopbackEvent),
}

impl Failure {
    fn check(&self, test: &str) {
        if !require_root(test) {
            return;
        }
        let (outcome, agent) = run(self.scenario, self.up);
        assert_eq!(outcome, self.client, "{}", self.scenario);
        let e = only_event(&agent, self.kind);
        for is in self.is {
            is.check(&e);
        }
        (self.more)(&e);
    }
}

fn nothing_more(_: &LoopbackEvent) {}

fn ipvs_mode() -> bool {
    lab::KubeProxyMode::from_env().unwrap() == lab::KubeProxyMode::Ipvs
}

/// One test per failure row: `name: Failure { .. };`.
macro_rules! failures {
    ($($(#[$doc:meta])* $name:ident: $failure:expr;)*) => {$(
        $(#[$doc])*
        #[test]
        fn $name() {
            $failure.check(stringify!($name));
        }
    )*};
}

/// A healthy twin: the client is answered and the agent reports nothing.
fn twin(test: &str, scenario: Scenario, up: Up) {
    if !require_root(test) {
        return;
    }
    let (outcome, agent) = run(scenario, up);
    assert_eq!(outcome, Outcome::Ok, "{scenario} should succeed");
    let events = agent.events();
    assert!(
        events.is_empty(),
        "{scenario}: healthy traffic reported as loopback: {events:#?}"
    );
}

/// One test per twin row: `name: Scenario, Up;`.
macro_rules! twins {
    ($($(#[$doc:meta])* $name:ident: $scenario:expr, $up:expr;)*) => {$(
        $(#[$doc])*
        #[test]
        fn $name() {
            twin(stringify!($name), $scenario, $up);
        }
    )*};
}

// ----- the three failures, the IPVS access filter, vip_as_source -----------------------------

/// kube-proxy's IPVS mode names no Service in the kernel: the NodePort is an IPVS virtual
/// service on the node IP, which the evidence says; else the event names `default/web`.
fn names_the_nodeport_or_service(e: &LoopbackEvent) {
    if ipvs_mode() {
        Is::Evidence("service table (IPVS): NodePort 30080/tcp").check(e);
    } else {
        Is::Service("default/web").check(e);
    }
}

failures! {
    healthcheck_blackhole_is_confirmed_with_the_vip_nodeport_and_reason: Failure {
        scenario: Scenario::HealthcheckBlackhole,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::HealthcheckBlackhole,
        // IP_LOCAL_SOURCE on 6.18; NOT_SPECIFIED at the route-input site on 6.1 (the VM tier).
        is: &[
            Is::Src(lab::VIP),
            Is::Vip(lab::VIP),
            Is::Dst(lab::NODE_IP),
            Is::DstPort(lab::NODE_PORT),
            Is::LocalSourceDrop,
            Is::Outcome(Fate::Dropped),
            Is::Proto(Proto::Tcp),
            Is::Nic(Some(lab::NODE_NIC)),
            // kube-proxy's binding is kube-proxy's: no announcer named (issue 39, item 3).
            Is::NoAnnouncer,
        ],
        more: names_the_nodeport_or_service,
    };

    /// The node answered the pod directly; the pod reset that answer (conntrack: CLOSE).
    hairpin_is_confirmed_with_the_vip_it_called_and_its_reset: Failure {
        scenario: Scenario::Hairpin,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::Hairpin,
        is: &[
            Is::Src(lab::POD_A_IP),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::SERVICE_PORT),
            Is::Dst(lab::NODE_IP),
            Is::DstPort(lab::NODE_PORT),
            Is::Snat(SnatState::No),
            Is::Layer(Layer::L4),
            Is::Outcome(Fate::Reset),
            Is::DropReason(None),
        ],
        more: nothing_more,
    };

    hairpin_under_strict_rp_filter_is_confirmed_as_dropped: Failure {
        scenario: Scenario::HairpinRpfilter,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::Hairpin,
        is: &[
            Is::Src(lab::POD_A_IP),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::SERVICE_PORT),
            Is::DstPort(lab::NODE_PORT),
            Is::Outcome(Fate::Dropped),
            Is::DropReason(Some("IP_RPFILTER")),
        ],
        more: nothing_more,
    };

    vip_port_unserved_is_confirmed_with_the_port_and_no_socket: Failure {
        scenario: Scenario::VipPortUnserved,
        up: Up::Default,
        client: Outcome::Refused,
        kind: LoopbackKind::VipPortUnserved,
        is: &[
            Is::Src(lab::POD_A_IP),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::VIP_UNSERVED_PORT),
            Is::DstPort(lab::VIP_UNSERVED_PORT),
            Is::DropReason(Some("NO_SOCKET")),
            Is::Outcome(Fate::Refused),
        ],
        more: nothing_more,
    };

    /// kube-proxy >= 1.25 (IPVS mode) REJECTs the unserved VIP port in `KUBE-IPVS-FILTER`: the
    /// packet dies as NETFILTER_DROP, not NO_SOCKET, and is still `vip_port_unserved`.
    vip_port_unserved_is_confirmed_from_the_ipvs_access_filter_reject: Failure {
        scenario: Scenario::VipPortUnservedFiltered,
        up: Up::InVariants,
        client: Outcome::Refused,
        kind: LoopbackKind::VipPortUnserved,
        is: &[
            Is::Src(lab::POD_A_IP),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::VIP_UNSERVED_PORT),
            Is::DropReason(Some("NETFILTER_DROP")),
            Is::Outcome(Fate::Refused),
            Is::Evidence("chain KUBE-IPVS-FILTER"),
            Is::Evidence("-j REJECT"),
            Is::Remedy("KUBE-IPVS-FILTER"),
        ],
        more: nothing_more,
    };

    /// The receiving side of `vip_as_source`: a packet from the VIP to a pod of this node (no
    /// NodePort: no health check), dropped as a local source.
    vip_as_source_is_confirmed_on_the_receiving_node_and_is_no_health_check: Failure {
        scenario: Scenario::VipAsSource,
        up: Up::InVariants,
        client: Outcome::Timeout,
        kind: LoopbackKind::VipAsSource,
        is: &[
            Is::Src(lab::VIP),
            Is::Vip(lab::VIP),
            Is::Dst(lab::POD_B_IP),
            Is::DstPort(lab::POD_PORT),
            Is::Outcome(Fate::Dropped),
            Is::Nic(Some(lab::NODE_NIC)),
            Is::LocalSourceDrop,
            Is::Evidence("is a pod of this node"),
            Is::Remedy("externalTrafficPolicy: Local"),
            Is::Remedy("internalTrafficPolicy"),
        ],
        more: nothing_more,
    };

    /// The sending side of `vip_as_source`: the node's own call to the LB IP (ETP Local,
    /// endpoint only on the peer) leaves eth0 with the VIP as source.
    vip_as_source_is_confirmed_on_the_sending_node: Failure {
        scenario: Scenario::VipAsSourceOut,
        up: Up::InVariants,
        client: Outcome::Timeout,
        kind: LoopbackKind::VipAsSource,
        is: &[
            Is::Src(lab::VIP),
            Is::Vip(lab::VIP),
            Is::Dst(lab::PEER_POD_IP),
            Is::DstPort(lab::NODE_PORT),
            Is::Outcome(Fate::NoReply),
            Is::Nic(Some(lab::NODE_NIC)),
            Is::DropReason(None),
            Is::Evidence("tc egress on eth0"),
            Is::Remedy("on this node"),
        ],
        more: nothing_more,
    };
}

failures! {
    /// The VIP held on the node's NIC as kube-vip holds it in ARP mode (a /32, preferred_lft
    /// 0; kube-vip/kube-vip#1086, #1018): the LB's health checks from it are martians. The
    /// event names kube-vip on eth0 as the owner, and the remedy is kube-vip's and the
    /// checker's, not kube-proxy's (issue 39, item 3).
    healthcheck_blackhole_from_a_vip_an_announcer_holds_names_the_announcer: Failure {
        scenario: Scenario::HealthcheckBlackholeAnnounced,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::HealthcheckBlackhole,
        is: &[
            Is::Src(lab::VIP),
            Is::DstPort(lab::NODE_PORT),
            Is::LocalSourceDrop,
            Is::OwnedByAnnouncer(lab::NODE_NIC, "kube-vip"),
            Is::Evidence("held by kube-vip"),
            Is::Remedy("not bound by kube-proxy"),
            Is::Remedy("from a source that is not 203.0.113.10"),
            Is::NoRemedy("kube-ipvs0"),
            Is::NoRemedy("a controller that sets"),
        ],
        more: nothing_more,
    };

    /// The node's own call to the LB IP kube-vip holds on its NIC (ETP Local, the endpoint
    /// only on the peer) leaves eth0 with the VIP as source (kube-vip/kube-vip#1086): the
    /// sending side of `vip_as_source`, kube-vip named as the VIP's owner.
    vip_as_source_from_a_vip_an_announcer_holds_names_the_announcer: Failure {
        scenario: Scenario::VipAsSourceOutAnnounced,
        up: Up::InVariants,
        client: Outcome::Timeout,
        kind: LoopbackKind::VipAsSource,
        is: &[
            Is::Src(lab::VIP),
            Is::Dst(lab::PEER_POD_IP),
            Is::Nic(Some(lab::NODE_NIC)),
            Is::Evidence("tc egress on eth0"),
            Is::OwnedByAnnouncer(lab::NODE_NIC, "kube-vip"),
            Is::Remedy("held on eth0 by kube-vip"),
            Is::NoRemedy("kube-ipvs0"),
        ],
        more: nothing_more,
    };
}

twins! {
    healthy_twin_healthcheck_with_unbound_vip_reports_nothing: Scenario::HealthcheckOk, Up::Default;
    healthy_twin_snated_egress_reports_nothing: Scenario::HairpinSnat, Up::Default;
    healthy_twin_served_vip_port_reports_nothing: Scenario::VipPortServed, Up::Default;
    healthy_twin_outside_client_through_the_lb_reports_nothing: Scenario::OutsideClient, Up::Default;
    healthy_twin_pod_to_pod_reports_nothing: Scenario::PodToPod, Up::Default;
    healthy_twin_served_vip_port_under_the_ipvs_access_filter_reports_nothing:
        Scenario::VipPortServedFiltered, Up::InVariants;
    healthy_twin_snated_call_from_the_peer_reports_nothing: Scenario::VipAsSourceSnat, Up::InVariants;
    healthy_twin_etp_cluster_call_from_the_node_reports_nothing:
        Scenario::VipAsSourceOutCluster, Up::InVariants;
    healthy_twin_etp_cluster_call_to_an_announced_vip_reports_nothing:
        Scenario::VipAsSourceOutAnnouncedCluster, Up::InVariants;
}

/// Repeats aggregate: three health checks (and their SYN retransmits) are one event whose
/// count grows, written once, then at most once per 10 s.
#[test]
fn repeated_health_checks_aggregate_into_one_event() {
    let Some(lab) = LabGuard::for_test("repeated_health_checks", &Variants::default()) else {
        return;
    };
    let agent = Agent::on_node_nic_with_table(&[]);
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
        assert_eq!(e.kind, LoopbackKind::HealthcheckBlackhole);
        assert_eq!(e.key, events[0].key, "one aggregate: {events:#?}");
    }
    assert_eq!(events[0].count, 1);
    for pair in events.windows(2) {
        let gap = pair[1].last_seen_ns - pair[0].last_seen_ns;
        assert!(
            gap >= 10_000_000_000,
            "a repeat written {gap} ns after the previous line: {events:#?}"
        );
        assert!(pair[1].count > pair[0].count);
    }
}

// ----- hairpin variants (issue 10, items 4 and 5) ----------------------------------------------

failures! {
    /// The node itself calls the LB on a listener without the source-node guard: the request
    /// comes back with the node's own IP as source and is dropped as a local source. Kind
    /// `hairpin`, node-sourced.
    hairpin_node_sourced_is_confirmed_dropped_as_local_source: Failure {
        scenario: Scenario::HairpinNodeSourced,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::Hairpin,
        is: &[
            Is::Src(lab::NODE_IP),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::VIP_NO_GUARD_PORT),
            Is::Dst(lab::NODE_IP),
            Is::DstPort(lab::NODE_PORT),
            Is::Layer(Layer::L4),
            Is::Snat(SnatState::No),
            Is::Outcome(Fate::Dropped),
            Is::LocalSourceDrop,
            Is::Evidence("node-sourced"),
            Is::Remedy("does not avoid"),
        ],
        more: nothing_more,
    };

    /// The LB targets pod-b directly (no NodePort); pod-a's call comes back to the node with
    /// pod-a as source and pod-b as destination; pod-b answers pod-a straight, which resets it.
    hairpin_lb_to_pod_is_confirmed_with_the_pod_as_destination: Failure {
        scenario: Scenario::HairpinLbToPod,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::Hairpin,
        is: &[
            Is::Src(lab::POD_A_IP),
            Is::Dst(lab::POD_B_IP),
            Is::DstPort(lab::POD_PORT),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::VIP_TO_POD_PORT),
            Is::Snat(SnatState::No),
            Is::Outcome(Fate::Reset),
            Is::Evidence("straight to the local pod"),
        ],
        more: nothing_more,
    };

    /// The hairpin over UDP: pod-a's datagram to VIP:53 comes back to the node's UDP NodePort;
    /// the answer comes from the node, not the VIP.
    hairpin_udp_is_confirmed: Failure {
        scenario: Scenario::HairpinUdp,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::Hairpin,
        is: &[
            Is::Proto(Proto::Udp),
            Is::Src(lab::POD_A_IP),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::VIP_UDP_PORT),
            Is::Dst(lab::NODE_IP),
            Is::DstPort(lab::NODE_PORT_UDP),
            Is::Snat(SnatState::No),
            Is::Outcome(Fate::NoReply),
        ],
        more: nothing_more,
    };

    /// The LB's instance target is a host-network listener on the node's own address
    /// (node:6443, no NodePort, no pod): pod-a's call comes back with pod-a as source;
    /// confirmed on the exact layer-4 match, with the socket that serves the port (the lab's
    /// listener, python3).
    hairpin_to_a_host_listener_is_confirmed_with_its_listener: Failure {
        scenario: Scenario::HairpinHostListener,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::Hairpin,
        is: &[
            Is::Src(lab::POD_A_IP),
            Is::Vip(lab::VIP),
            Is::VipPort(lab::VIP_HOST_LISTENER_PORT),
            Is::Dst(lab::NODE_IP),
            Is::DstPort(lab::HOST_LISTENER_PORT),
            Is::Layer(Layer::L4),
            Is::Snat(SnatState::No),
            Is::Outcome(Fate::Reset),
            Is::Listener(lab::HOST_LISTENER_PORT, Proto::Tcp, "python3"),
            Is::Evidence("is no NodePort"),
            Is::Remedy("host process python3"),
        ],
        more: nothing_more,
    };

    /// The node itself calls its own LB, whose target is the node's host listener: back with
    /// the node's own address as source, dropped as a local source; the node address's owner
    /// named.
    hairpin_node_sourced_to_a_host_listener_is_confirmed_dropped: Failure {
        scenario: Scenario::HairpinHostListenerNodeSourced,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::Hairpin,
        is: &[
            Is::Src(lab::NODE_IP),
            Is::Dst(lab::NODE_IP),
            Is::DstPort(lab::HOST_LISTENER_PORT),
            Is::Layer(Layer::L4),
            Is::Outcome(Fate::Dropped),
            Is::LocalSourceDrop,
            Is::ListenerPort(lab::HOST_LISTENER_PORT),
            Is::OwnedByInterface(lab::NODE_NIC),
            Is::Evidence("node-sourced"),
        ],
        more: nothing_more,
    };

    /// The VIP is local through a `local` route of table local (proto 66, no address), as the
    /// GCE guest agent makes LB IPs local: the LB's health checks from it are martians. The
    /// event names that owner, and the remedy addresses it rather than kube-proxy: keep the
    /// guest agent's route; no node-file edit (issue 35, item 3).
    healthcheck_blackhole_from_a_vip_made_local_by_a_route_names_the_route: Failure {
        scenario: Scenario::HealthcheckBlackholeLocalRoute,
        up: Up::Default,
        client: Outcome::Timeout,
        kind: LoopbackKind::HealthcheckBlackhole,
        is: &[
            Is::Src(lab::VIP),
            Is::DstPort(lab::NODE_PORT),
            Is::OwnedByLocalRoute(lab::NODE_NIC, 66, "cloud guest agent"),
            Is::Evidence("proto 66 = cloud guest agent"),
            Is::Remedy("guest-agent#555"),
            Is::NoRemedy("instance_configs"),
            Is::NoRemedy("kube-ipvs0"),
        ],
        more: nothing_more,
    };
}

twins! {
    healthy_twin_node_through_the_guarded_listener_reports_nothing:
        Scenario::NodeToLbGuarded, Up::Default;
    healthy_twin_outside_client_to_pod_through_the_lb_reports_nothing:
        Scenario::OutsideClientLbToPod, Up::Default;
    healthy_twin_outside_client_udp_reports_nothing: Scenario::OutsideClientUdp, Up::Default;
    /// An outside client reaches the node's host listener through the LB and is answered.
    healthy_twin_outside_client_to_a_host_listener_reports_nothing:
        Scenario::OutsideClientHostListener, Up::Default;
}

/// Where the agent serves /metrics inside the node namespace (its own namespace: no clash).
const METRICS: &str = "127.0.0.1:9977";

/// One failed connect (the SYN and its retransmit, each dropped by rp_filter) is one
/// confirmation: `clbprobe_loopback_events_total{kind="hairpin"}`, which counts every report
/// (repeats included), read before the lab goes, stays at 1.
#[test]
fn a_failed_connect_and_its_retransmits_count_once() {
    let Some(lab) = LabGuard::for_test("hairpin_counts_once", &Variants::default()) else {
        return;
    };
    let agent = Agent::on_node_nic_with_table(&["--metrics-addr", METRICS]);
    let outcome = lab.traffic(Scenario::HairpinRpfilter).expect("traffic");
    std::thread::sleep(SETTLE);
    let _ = agent.events();
    let (_, body) = http_get_in(lab::NS_NODE, METRICS, "/metrics").expect("/metrics");
    let prefix = "clbprobe_loopback_events_total{kind=\"hairpin\"";
    let total: u64 = body
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    drop(lab);
    assert_eq!(outcome, Outcome::Timeout);
    let drops = agent
        .records()
        .iter()
        .filter(|r| matches!(r, KernelEvent::Drop { .. }))
        .count();
    let e = only_event(&agent, LoopbackKind::Hairpin);
    Is::DropReason(Some("IP_RPFILTER")).check(&e);
    assert_eq!(
        total, 1,
        "reports for one connect attempt ({drops} drop records)"
    );
}

// ----- service_self_loop (issue 23, item 6) ---------------------------------------------------

/// What every `service_self_loop` of the lab says: pod-b called `default/web`'s ClusterIP and
/// was its own endpoint; nothing rewrote its source (`snat` is the row's: the bridge case's
/// answer drop in IPVS mode says the call was masqueraded).
const SELF_LOOP: &[Is] = &[
    Is::Src(lab::POD_B_IP),
    Is::Dst(lab::POD_B_IP),
    Is::DstPort(lab::POD_PORT),
    Is::Vip(lab::CLUSTER_IP),
    Is::VipPort(lab::SERVICE_PORT),
    Is::Service("default/web"),
    Is::Outcome(Fate::Dropped),
];

/// Without the hairpin SNAT: dropped in pod-b's namespace (no node interface), the node's
/// conntrack entry (to the ClusterIP, reply from pod-b to pod-b) and the missing piece in the
/// evidence; in IPVS mode the KUBE-LOOP-BACK entry, else the KUBE-SEP masquerade rule.
fn self_loop_without_the_snat(e: &LoopbackEvent) {
    for is in SELF_LOOP {
        is.check(e);
    }
    assert_eq!(
        e.nic, None,
        "dropped in the pod, not on a node interface: {e:#?}"
    );
    let evidence = lines(&e.evidence);
    assert_contains(&evidence, "dropped in the pod's own network namespace");
    assert!(
        evidence.contains("orig 198.19.1.11:") && evidence.contains("-> 198.18.100.10:80/tcp"),
        "{evidence}"
    );
    assert_contains(&evidence, "reply 198.19.1.11:8080 -> 198.19.1.11:");
    assert_contains(&evidence, "no SRC_NAT");
    assert_contains(&evidence, "missing: the hairpin SNAT");
    let remedy = lines(&e.remedy);
    if ipvs_mode() {
        assert_contains(
            &evidence,
            "ipset KUBE-LOOP-BACK lacks 198.19.1.11,tcp:8080,198.19.1.11",
        );
        assert_contains(&remedy, "KUBE-LOOP-BACK ipset entry");
    } else {
        assert_contains(&evidence, "-s 198.19.1.11/32 -j KUBE-MARK-MASQ");
    }
    assert!(!remedy.contains("hairpin-mode"), "{remedy}");
}

/// At the bridge port without hairpin mode. In IPVS mode (the VM tier) the call is
/// masqueraded by KUBE-LOOP-BACK and reaches pod-b; its *answer*, un-NATed back to pod-b in
/// the bridge, dies at the port instead: the event is still the call's (endpoint port, the
/// ClusterIP), with the SNAT (`snat: yes`) in its evidence and the drop's own tuple the
/// answer's. Else nothing rewrote the call's source (`snat: no`).
fn self_loop_at_the_bridge_port(e: &LoopbackEvent) {
    for is in SELF_LOOP {
        is.check(e);
    }
    let evidence = lines(&e.evidence);
    if ipvs_mode() {
        Is::Snat(SnatState::Yes).check(e);
        assert_contains(&evidence, "the call was masqueraded");
        assert!(
            evidence.contains(&format!(
                "{}:{} -> {}:",
                lab::POD_B_IP,
                lab::POD_PORT,
                lab::POD_B_IP
            )),
            "the drop's own tuple is the answer: {evidence}"
        );
    } else {
        Is::Snat(SnatState::No).check(e);
    }
    assert_contains(&evidence, "port vpod-b of cbr0, hairpin_mode 0");
    assert_contains(&evidence, "bridge-nf-call-iptables = 1");
    assert_contains(&evidence, "missing: hairpin mode on cbr0 port vpod-b");
    let remedy = lines(&e.remedy);
    assert_contains(&remedy, "--hairpin-mode=hairpin-veth");
}

failures! {
    /// Without kube-proxy's hairpin masquerade (KUBE-SEP `-s pod -j KUBE-MARK-MASQ`; in IPVS
    /// mode the KUBE-LOOP-BACK entry), pod-b's call to its own ClusterIP comes back to it with
    /// its own address as source and dies in pod-b's namespace: seen there, confirmed with the
    /// node's conntrack entry, the missing piece named.
    service_self_loop_without_the_hairpin_snat_is_confirmed_in_the_pod: Failure {
        scenario: Scenario::SelfLoop,
        up: Up::InVariants,
        client: Outcome::Timeout,
        kind: LoopbackKind::ServiceSelfLoop,
        is: &[Is::Snat(SnatState::No), Is::LocalSourceDrop],
        more: self_loop_without_the_snat,
    };

    /// pod-b behind a bridge with br_netfilter on and hairpin mode off: kube-proxy's DNAT runs
    /// in the bridge and the frame would have to leave by the port it came in on; the bridge
    /// drops it. Confirmed at that port, hairpin mode named. Up in the scenario's variants: the
    /// agent's service table then has only the ClusterIP with pod-b as endpoint, which names
    /// the address called when conntrack has no entry.
    service_self_loop_at_a_bridge_port_without_hairpin_mode_names_it: Failure {
        scenario: Scenario::SelfLoopBridge,
        up: Up::InVariants,
        client: Outcome::Timeout,
        kind: LoopbackKind::ServiceSelfLoop,
        is: &[Is::Nic(Some("vpod-b"))],
        more: self_loop_at_the_bridge_port,
    };
}

twins! {
    healthy_twin_self_loop_with_the_hairpin_snat_reports_nothing:
        Scenario::SelfLoopSnat, Up::Default;
}

/// The bridge twin: the same bridge with hairpin mode on (the kubelet's
/// `--hairpin-mode=hairpin-veth`) and kube-proxy's masquerade: answered, nothing reported.
#[test]
fn healthy_twin_bridge_port_with_hairpin_mode_reports_nothing() {
    let variants = Scenario::SelfLoopBridge.spec().variants;
    let Some(lab) = LabGuard::for_test("twin_self_loop_hairpin_mode", &variants) else {
        return;
    };
    lab.set_pod_b_hairpin_mode(true).expect("hairpin mode on");
    let agent = Agent::on_node_nic_with_table(&[]);
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
