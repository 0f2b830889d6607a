//! Issue #36, the hostile-user pass round 3: trust boundaries in correlation.
//!
//! - E4: a pod (CAP_NET_RAW, the default) forges frames with source = destination = itself and
//!   sends them to its gateway, which routes them back into the pod: they die there as a local
//!   source exactly like a real `service_self_loop`, but nothing DNATed them (the node's
//!   conntrack has the entry pod -> pod, no DST_NAT). Nothing may be confirmed.
//!
//! - E3: an unprivileged local user (uid 65534) on a node whose loop is quiet but persists
//!   makes connections of the loop's shape and has them answered on the node itself: one
//!   connect bound to the VIP (a local address while the health checks are black-holed) to a
//!   listener of its own on the node's address; or one listen+connect on VIP:port of a
//!   `vip_port_unserved` loop. The loop must not be resolved "with proof".
//!
//! Root only (each test prints a skip line otherwise); they share the lab: one at a time.

use std::{process::Command, time::Duration};

use probe_contract::LoopbackKind;
use probe_tests::{
    agent::{Agent, node_metric, wait_for},
    kube_fixture::KubeFixture,
};
use test_support::{
    lab::{self, LabGuard, Scenario, Variants},
    run_ok,
};

const WAIT: Duration = Duration::from_secs(20);

const METRICS: &str = "127.0.0.1:19473";

/// Long enough for the drops, the conntrack answers and the agent's write.
const SETTLE: Duration = Duration::from_secs(4);

/// Sends `count` forged TCP SYNs (source ports 40000..) from `ns`'s `eth0` to `gw_mac`, IPv4
/// source and destination both `ip`, destination port `port`: an AF_PACKET frame, so the
/// pod's own stack never sees it leave and the node routes it back in.
const FORGE_SYNS: &str = r#"
import socket, struct, sys
ip = socket.inet_aton(sys.argv[1])
gw = bytes.fromhex(sys.argv[2].replace(':', ''))
port, count = int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
own = open('/sys/class/net/eth0/address').read().strip()
own = bytes.fromhex(own.replace(':', ''))
def csum(b):
    if len(b) % 2:
        b += b'\0'
    t = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while t >> 16:
        t = (t & 0xffff) + (t >> 16)
    return ~t & 0xffff
for i in range(count):
    tcp = struct.pack('!HHIIBBHHH', 40000 + i, port, 1000 + i, 0, 5 << 4, 0x02, 64240, 0, 0)
    c = csum(ip + ip + struct.pack('!BBH', 0, 6, len(tcp)) + tcp)
    tcp = tcp[:16] + struct.pack('!H', c) + tcp[18:]
    hdr = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(tcp), 7 + i, 0x4000, 64, 6, 0, ip, ip)
    hdr = hdr[:10] + struct.pack('!H', csum(hdr)) + hdr[12:]
    s.send(gw + own + b'\x08\x00' + hdr + tcp)
"#;

fn forge_self_syns(ns: &str, ip: &str, gw_mac: &str, port: u16, count: u32) {
    run_ok(
        Command::new("ip")
            .args(["netns", "exec", ns, "python3", "-c", FORGE_SYNS, ip, gw_mac])
            .args([port.to_string(), count.to_string()]),
        "forging failed",
    );
}

fn node_mac(dev: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE, "cat"])
        .arg(format!("/sys/class/net/{dev}/address"))
        .output()
        .expect("cat");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// E4: three forged self-addressed SYNs to pod-b's endpoint port (that of `default/web`) die
/// in pod-b as a local source; the node's conntrack entry is pod-b -> pod-b without DST_NAT.
/// Before: one `service_self_loop` event, count 3, "restart kube-proxy". After: none.
#[test]
fn a_pod_forging_its_own_address_both_ways_confirms_no_self_loop() {
    let Some(lab) = LabGuard::for_test("hostile_proof_forged_self_loop", &Variants::default())
    else {
        return;
    };
    let agent = Agent::on_node_nic_with_table(&["--metrics-addr", METRICS]);
    let gw = node_mac("vpod-b");
    forge_self_syns(
        lab::NS_POD_B,
        &lab::POD_B_IP.to_string(),
        &gw,
        lab::POD_PORT,
        3,
    );
    // The attack reached the pod: its drops as a local source were seen.
    let local_source = "clbprobe_kernel_drops_total{reason=\"IP_LOCAL_SOURCE\"}";
    let seen = wait_for("the forged drops", SETTLE, || {
        (node_metric(METRICS, local_source) >= 3).then_some(())
    });
    std::thread::sleep(SETTLE);
    let events = agent.events();
    drop(lab);
    assert!(seen.is_some(), "the forged SYNs were not dropped in pod-b");
    let self_loops: Vec<_> = events
        .iter()
        .filter(|e| e.kind == LoopbackKind::ServiceSelfLoop)
        .collect();
    let confirmed: u64 = self_loops.iter().map(|e| e.count).sum();
    assert_eq!(
        confirmed, 0,
        "forged self-addressed SYNs confirmed as {confirmed} service_self_loop: {self_loops:#?}"
    );
}

/// As uid 65534 in the node's namespace: listens on `listen`, connects to it from `from`
/// (bound, port 0), exchanges a byte each way: one answered connection in the node's
/// conntrack, orig `from` -> `listen`.
const ANSWERED_CONNECT: &str = r#"
import socket, sys
la, lp = sys.argv[1], int(sys.argv[2])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((la, lp))
srv.listen(1)
c = socket.socket()
c.bind((sys.argv[3], 0))
c.connect((la, lp))
a, _ = srv.accept()
c.send(b'x'); a.recv(1); a.send(b'y'); c.recv(1)
"#;

fn answered_connect_as_nobody(listen: &str, port: u16, from: &str) {
    run_ok(
        Command::new("ip")
            .args(["netns", "exec", lab::NS_NODE, "setpriv", "--reuid=65534"])
            .args(["--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
            .args([ANSWERED_CONNECT, listen, &port.to_string(), from]),
        "the unprivileged connect failed",
    );
}

fn proof_lookups(agent: &mut Agent, kind: &str) -> usize {
    agent
        .log_lines()
        .iter()
        .filter(|l| l.contains("a quiet loop's proof look-up") && l.contains(kind))
        .count()
}

/// E3, a connect from the VIP: the LB's health checks (source the VIP) are black-holed at the
/// node, which owns the VIP; the loop goes quiet (`--resolve-after 2`) while the VIP stays
/// bound. uid 65534 binds a socket to the VIP and connects to its own listener on the node's
/// address: an answered connection from the VIP to the address the checks died at, the very
/// shape of the loop's proof. Before: `LoopbackResolved` "with proof" quoting it. After: the
/// look-ups run and resolve nothing (a connection from a VIP that is local to the node was
/// made on the node: the LB's checks never arrive with a local source).
#[test]
fn an_unprivileged_connect_from_the_vip_resolves_no_healthcheck_blackhole() {
    let Some(lab) = LabGuard::for_test("hostile_proof_connect_from_the_vip", &Variants::default())
    else {
        return;
    };
    let api = KubeFixture::builder().tag("e3-from-vip").start();
    let agent = api.start_agent(&["--resolve-after", "2"]);
    lab.traffic(Scenario::HealthcheckBlackhole)
        .expect("traffic");
    let confirmed = agent.first_event_of(LoopbackKind::HealthcheckBlackhole, WAIT);
    let node_addr = confirmed.dst.to_string();
    // Conntrack tells an entry's age to the second: the attack must look later than the loop.
    std::thread::sleep(Duration::from_secs(1));
    answered_connect_as_nobody(&node_addr, 45678, &lab::VIP.to_string());
    assert_two_lookups_resolve_nothing(
        agent,
        "healthcheck_blackhole",
        "a local user's connect from the VIP resolved the black hole",
    );
    drop(api);
    drop(lab);
}

/// E3, one listen+connect on VIP:port: the node's own call to an unserved port of its local
/// VIP is refused (`vip_port_unserved`, the node's address as client); the loop goes quiet.
/// uid 65534 listens on VIP:port and connects to it: an answered connection to the loop's
/// VIP:port from the node. Before: resolved "with proof". After: nothing resolved (a listener
/// on the VIP answered, nothing rewrote the destination, the source was the VIP: not the path
/// the loop broke, not its client).
#[test]
fn an_unprivileged_listen_and_connect_on_the_vip_port_resolves_no_unserved_port() {
    const PORT: u16 = 45679;
    let Some(lab) = LabGuard::for_test(
        "hostile_proof_listen_connect_vip_port",
        &Variants::default(),
    ) else {
        return;
    };
    lab.set_all(&Scenario::VipPortUnserved.spec().variants)
        .expect("the VIP bound");
    let api = KubeFixture::builder().tag("e3-listen-connect").start();
    let agent = api.start_agent(&["--resolve-after", "2"]);
    std::thread::sleep(Duration::from_secs(1));
    let vip_port = std::net::SocketAddrV4::new(lab::VIP, PORT);
    let attempt = lab.connect(lab::NS_NODE, None, vip_port).expect("connect");
    assert_eq!(attempt.outcome, lab::Outcome::Refused, "{attempt:?}");
    agent.wait_event("vip_port_unserved", WAIT, |es| {
        es.iter()
            .find(|e| e.kind == LoopbackKind::VipPortUnserved && e.vip_port == Some(PORT))
            .cloned()
    });
    std::thread::sleep(Duration::from_secs(1));
    let vip = lab::VIP.to_string();
    answered_connect_as_nobody(&vip, PORT, &vip);
    assert_two_lookups_resolve_nothing(
        agent,
        "vip_port_unserved",
        "a local user's listen+connect on VIP:port resolved the unserved port",
    );
    drop(api);
    drop(lab);
}

/// Waits for two more proof look-ups of `kind` and stops the agent; asserts they ran and
/// resolved no loop (`attack_resolved` says what a resolution would mean).
fn assert_two_lookups_resolve_nothing(mut agent: Agent, kind: &str, attack_resolved: &str) {
    let before = proof_lookups(&mut agent, kind);
    let ran = wait_for("two proof look-ups after the attack", WAIT, || {
        (proof_lookups(&mut agent, kind) >= before + 2).then_some(())
    });
    let resolved = agent.count_log("loop resolved");
    let log = agent.log_lines().join("\n");
    drop(agent);
    assert!(ran.is_some(), "no proof look-up ran:\n{log}");
    assert_eq!(resolved, 0, "{attack_resolved}:\n{log}");
}

/// Issue #49, G4, the issue's own shape: `default/web` with two ports on the LB, :80 (the LB
/// never sends a call back to the node it came from) and :8081 (no such guard). Pod A's call
/// to :80 hairpins, and so does the node's own call to :8081: one loop of the Service, clients
/// pod A and the node (`--resolve-after 2`). Then the Service changes (the annotation of the fix
/// `aws-nlb-target-type-ip`, which nothing in the lab acts on) and the node's calls to :80 are answered, ten of them (the LB sends the node to the
/// peer). Before: "the Service changed" plus an answered call with no NAT here from one of the
/// loop's clients to one of its ports resolved the loop, though pod A's :80 and the node's
/// :8081 both still loop. After: the look-ups run and resolve nothing: only a pair that looped
/// (pod A to :80, the node to :8081), answered, proves it.
#[test]
fn a_service_change_and_another_clients_answered_calls_resolve_no_pods_hairpin() {
    let Some(lab) = LabGuard::for_test(
        "hostile_proof_service_change",
        &Scenario::HairpinNodeSourced.spec().variants,
    ) else {
        return;
    };
    let with_no_guard_port = |annotated: bool| {
        let mut web = test_support::kubeapi::fixtures::lab()
            .into_iter()
            .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "web")
            .expect("the web Service");
        web["spec"]["ports"].as_array_mut().unwrap().push(
            serde_json::json!({"name": "no-guard", "protocol": "TCP",
                                     "port": lab::VIP_NO_GUARD_PORT, "targetPort": 8080,
                                     "nodePort": 30081}),
        );
        if annotated {
            // The AWS fix `aws-nlb-target-type-ip`, which nothing in the lab acts on.
            web["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] =
                "ip".into();
        }
        web
    };
    let mut objects: Vec<serde_json::Value> = test_support::kubeapi::fixtures::lab()
        .into_iter()
        .filter(|o| !(o["kind"] == "Service" && o["metadata"]["name"] == "web"))
        .collect();
    objects.push(with_no_guard_port(false));
    let api = KubeFixture::builder()
        .objects(objects)
        .tag("g4-service-change")
        .start();
    let mut agent = api.start_agent(&["--resolve-after", "2"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    let web80 = std::net::SocketAddrV4::new(lab::VIP, 80);
    let no_guard = std::net::SocketAddrV4::new(lab::VIP, lab::VIP_NO_GUARD_PORT);
    let pod = lab.connect(lab::NS_POD_A, None, web80).expect("connect");
    assert_ne!(pod.outcome, lab::Outcome::Ok, "pod A's call loops: {pod:?}");
    let node = lab.connect(lab::NS_NODE, None, no_guard).expect("connect");
    assert_ne!(
        node.outcome,
        lab::Outcome::Ok,
        "the node's call loops: {node:?}"
    );
    for (what, client) in [("pod A's", lab::POD_A_IP), ("the node's", lab::NODE_IP)] {
        agent.wait_event(what, WAIT, |es| {
            es.iter()
                .find(|e| {
                    e.kind == LoopbackKind::Hairpin
                        && e.src == std::net::IpAddr::V4(client)
                        && e.service
                            .as_deref()
                            .is_some_and(|s| s.starts_with("default/web"))
                })
                .cloned()
        });
    }
    std::thread::sleep(Duration::from_secs(1));
    api.apply(with_no_guard_port(true));
    for _ in 0..10 {
        let attempt = lab.connect(lab::NS_NODE, None, web80).expect("connect");
        assert_eq!(attempt.outcome, lab::Outcome::Ok, "{attempt:?}");
    }
    assert_two_lookups_resolve_nothing(
        agent,
        "hairpin",
        "a Service change and the node's answered calls to :80 resolved the loop",
    );
    drop(api);
    drop(lab);
}
