//! Default NICs (issue 10, item 7): without `--nic` the agent watches every interface with a
//! default route in any routing table, not only main's: a secondary ENI whose default route
//! lives in a per-ENI table carries pod traffic too.
//!
//! Root only.

use probe_tests::agent::{Agent, sh};
use test_support::lab::{self, LabGuard, Variants};

#[test]
fn a_default_route_in_a_per_eni_table_makes_a_nic() {
    let Some(_lab) = LabGuard::for_test("default_nics", &Variants::default()) else {
        return;
    };
    let ip = |args: &[&str]| {
        let mut v = vec!["ip", "-n", lab::NS_NODE];
        v.extend_from_slice(args);
        sh(&v)
    };
    // A secondary ENI stand-in (both ends inside the node: nothing leaves the lab), with its
    // default route only in table 100 and a rule sending its subnet's traffic there.
    ip(&[
        "link", "add", "eth1", "type", "veth", "peer", "name", "eth1-far",
    ]);
    ip(&["addr", "add", "198.18.9.2/24", "dev", "eth1"]);
    ip(&["link", "set", "eth1", "up"]);
    ip(&["link", "set", "eth1-far", "up"]);
    ip(&[
        "route",
        "add",
        "default",
        "via",
        "198.18.9.1",
        "dev",
        "eth1",
        "table",
        "100",
    ]);
    ip(&["rule", "add", "from", "198.18.9.0/24", "table", "100"]);
    let agent = Agent::start(lab::NS_NODE, &[]);
    let line = agent
        .log
        .iter()
        .find(|l| l.contains("attached and address sets loaded"))
        .cloned()
        .unwrap_or_default();
    // `nics=[("eth0", 2), ...]` only (vip_iface follows it).
    let line = line
        .split("nics=")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or_default()
        .to_string();
    assert!(line.contains("\"eth0\""), "main's default route: {line}");
    assert!(
        line.contains("\"eth1\""),
        "table 100's default route: {line}"
    );
    for virtual_without_default in ["eth1-far", "vpod-a", "vpod-b", "kube-ipvs0"] {
        assert!(
            !line.contains(&format!("\"{virtual_without_default}\"")),
            "{virtual_without_default} is no NIC: {line}"
        );
    }
}
