//! Raw frames into the lab with trafgen (netsniff-ng): spoofed sources and exact frame counts
//! that no socket can produce, sent from the LB namespace's `vnode` to the node's NIC.

use std::net::Ipv4Addr;

use serde_json::Value;
use test_support::lab;

use crate::agent::{sh, tempdir::TempDir};

/// True when trafgen is installed; otherwise prints a skip line for the calling test.
pub fn available(test: &str) -> bool {
    if test_support::tools::which("trafgen").is_some() {
        return true;
    }
    eprintln!("skipping {test}: trafgen (netsniff-ng) not installed; run cargo xtask setup");
    false
}

/// The MAC address of `dev` in namespace `ns`.
pub fn mac(ns: &str, dev: &str) -> String {
    let out = sh(&["ip", "-n", ns, "-j", "link", "show", dev]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["address"].as_str().unwrap().to_string()
}

/// One trafgen packet block: an IPv4 frame from the LB's `vnode` to the node's NIC with
/// `l4`, trafgen's layer-4 header and payload (e.g. `udp(sport=drnd(1024, 65000), dport=9),
/// fill(0x00, 18)`).
pub fn ipv4_frame_to_node(saddr: Ipv4Addr, daddr: Ipv4Addr, l4: &str) -> String {
    format!(
        "{{ eth(da={}, sa={}, type=0x0800), ipv4(saddr={saddr}, daddr={daddr}, ttl=64), {l4} }}\n",
        mac(lab::NS_NODE, lab::NODE_NIC),
        mac(lab::NS_LB, "vnode"),
    )
}

/// Sends `count` frames of `conf` (trafgen cycles through its packet blocks) from the LB
/// namespace's `vnode` and returns when they are sent. One worker, which trafgen pins to
/// CPU 0: the node's receive path (veth delivers on the sending CPU) and so the programs'
/// per-CPU state see every frame on that CPU. TX ring mode (no `--gap`): the skbs' linear part
/// is only the Ethernet header, which the programs classify all the same.
pub fn send_from_lb(conf: &str, count: u64) {
    let dir = TempDir::new("trafgen");
    let path = dir.path().join("frames.trafgen");
    std::fs::write(&path, conf).unwrap();
    sh(&[
        "ip",
        "netns",
        "exec",
        lab::NS_LB,
        "trafgen",
        "--dev",
        "vnode",
        "--conf",
        path.to_str().unwrap(),
        "--cpus",
        "1",
        "-n",
        &count.to_string(),
        "-q",
    ]);
}
