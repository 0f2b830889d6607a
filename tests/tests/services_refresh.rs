//! The service table is read on change, not on a timer: with `--services-every 3600` (no
//! timer tick during the test), a NodePort kube-proxy adds is in the agent's table. The
//! agent logs each new table (`service table read (change) ... nodeports=N`); the count going
//! up by the added NodePort is the proof. iptables mode (the nf_tables backend of this host's
//! iptables) and nftables mode here; IPVS mode in the VM tier (`ipvs.rs`).
//!
//! Root only (each test prints a skip line otherwise). One at a time: they share the lab.

use std::{process::Command, time::Duration};

use probe_tests::agent::{Agent, require_root};
use test_support::lab::{self, KubeProxyMode, LabGuard};

const WAIT: Duration = Duration::from_secs(20);

fn node(args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
}

/// Starts the agent with the safety net an hour away, waits for the table of `nodeports`
/// NodePorts, runs `change`, and waits for the table with one more.
fn nodeport_added_is_seen(mode: KubeProxyMode, nodeports: usize, change: &[&str]) {
    let lab = LabGuard::up_in(mode, &Default::default(), &Default::default()).expect("lab up");
    let mut agent = Agent::on_node_nic(&["--services-every", "3600"]);
    agent.wait_log(&format!("nodeports={nodeports} "), WAIT);
    node(change);
    agent.wait_log(&format!("nodeports={} ", nodeports + 1), WAIT);
    drop(agent);
    drop(lab);
}

#[test]
fn iptables_nodeport_added_is_read_without_a_timer_tick() {
    if !require_root("iptables_nodeport_added_is_read_without_a_timer_tick") {
        return;
    }
    nodeport_added_is_seen(
        KubeProxyMode::Iptables,
        2,
        &[
            "iptables",
            "-w",
            "-t",
            "nat",
            "-I",
            "KUBE-NODEPORTS",
            "-p",
            "tcp",
            "-m",
            "comment",
            "--comment",
            "default/added:http",
            "-m",
            "tcp",
            "--dport",
            "31999",
            "-j",
            "KUBE-SVC-CLBLABDNSUDP0001",
        ],
    );
}

#[test]
fn nftables_nodeport_added_is_read_without_a_timer_tick() {
    if !require_root("nftables_nodeport_added_is_read_without_a_timer_tick") {
        return;
    }
    let element = format!("{{ tcp . 31999 : goto {} }}", lab::nft::NFT_EXTERNAL_CHAIN);
    nodeport_added_is_seen(
        KubeProxyMode::Nftables,
        1,
        &[
            "nft",
            "add",
            "element",
            "ip",
            "kube-proxy",
            "service-nodeports",
            &element,
        ],
    );
}
