//! Map sizing flags (docs/agent.md, "Map sizing"): the kernel maps are created with the capacities
//! the flags ask for, read back from the kernel; nonsense is a usage error (exit 2), from the
//! argument parser, before anything is loaded.
//!
//! Root only for the kernel part; the maps are found through the agent's own descriptors
//! (/proc/<pid>/fdinfo), so other agents on the machine do not count.

use std::process::Command;

use probe_tests::{
    agent::{Agent, probe_bin},
    kernel_view::maps_held_by,
};
use test_support::lab::{LabGuard, Variants};

/// (name, max_entries) of each BPF map process `pid` holds.
fn maps_of(pid: u32) -> Vec<(String, u64)> {
    maps_held_by(pid)
        .into_iter()
        .map(|(_, info)| {
            (
                info["name"].as_str().unwrap_or_default().to_string(),
                info["max_entries"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn max_entries(maps: &[(String, u64)], name: &str) -> u64 {
    maps.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no map {name} among {maps:?}"))
        .1
}

#[test]
fn map_capacities_follow_the_flags() {
    let Some(_lab) = LabGuard::for_test("map_capacities", &Variants::default()) else {
        return;
    };
    let defaults = {
        let agent = Agent::on_node_nic(&[]);
        maps_of(agent.pid())
    };
    let sized = {
        let agent = Agent::on_node_nic(&[
            "--egress-flows",
            "4096",
            "--address-entries",
            "2048",
            "--dedup-flows",
            "512",
            "--counter-keys",
            "128",
            "--ringbuf-kib",
            "64",
        ]);
        maps_of(agent.pid())
    };
    for (name, default, asked) in [
        ("EGRESS_FLOWS", 65_536, 4_096),
        ("HOSTS_V4", 16_384, 2_048),
        ("HOSTS_V6", 16_384, 2_048),
        ("LOCAL_V4", 16_384, 2_048),
        ("LOCAL_V6", 16_384, 2_048),
        // DROP_DESTINATIONS, as the kernel names it (15 characters).
        ("DROP_DESTINATIO", 16_384, 2_048),
        ("RECENT", 16_384, 512),
        ("SUSPECTS", 1_024, 128),
        ("DROPS", 1_024, 128),
        ("EVENTS", 256 * 1024, 64 * 1024),
    ] {
        assert_eq!(max_entries(&defaults, name), default, "{name} by default");
        assert_eq!(max_entries(&sized, name), asked, "{name} as asked");
    }
}

#[test]
fn nonsense_sizes_exit_2_with_nothing_loaded() {
    for args in [
        &["--egress-flows", "10"][..],
        &["--egress-flows", "lots"],
        &["--address-entries", "0"],
        &["--dedup-flows", "99999999999"],
        &["--counter-keys=-1"],
        &["--ringbuf-kib", "300"],
        &["--ringbuf-kib", "8"],
    ] {
        let o = Command::new(probe_bin())
            .arg("agent")
            .args(args)
            .env("CLB_PROBE_LOG", "warn")
            .output()
            .expect("run probe");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        let flag = args[0].split('=').next().unwrap();
        assert!(
            err.contains("error:") && err.contains(flag),
            "{args:?}: {err}"
        );
    }
}
