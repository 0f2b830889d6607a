//! Issue #36, the hostile-user pass round 3: trust boundaries in correlation.
//!
//! - E4: a pod (CAP_NET_RAW, the default) forges frames with source = destination = itself and
//!   sends them to its gateway, which routes them back into the pod: they die there as a local
//!   source exactly like a real `service_self_loop`, but nothing DNATed them (the node's
//!   conntrack has the entry pod -> pod, no DST_NAT). Nothing may be confirmed.
//!
//! Root only (each test prints a skip line otherwise); they share the lab: one at a time.

use std::{process::Command, time::Duration};

use probe_tests::agent::{Agent, node_metric, require_root, wait_for};
use xtask::lab::{self, LabGuard, Variants};

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
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", FORGE_SYNS, ip, gw_mac])
        .args([port.to_string(), count.to_string()])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "forging failed: {}",
        String::from_utf8_lossy(&out.stderr)
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
    if !require_root("hostile_proof_forged_self_loop") {
        return;
    }
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    let agent = Agent::start_with_table(
        lab::NS_NODE,
        &["--nic", lab::NODE_NIC, "--metrics-addr", METRICS],
    );
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
        .filter(|e| e["kind"] == "service_self_loop")
        .collect();
    let confirmed: u64 = self_loops
        .iter()
        .map(|e| e["count"].as_u64().unwrap_or(1))
        .sum();
    assert_eq!(
        confirmed, 0,
        "forged self-addressed SYNs confirmed as {confirmed} service_self_loop: {self_loops:#?}"
    );
}
