use std::{collections::BTreeMap, time::Duration};

use test_support::{
    assert_contains,
    kubeapi::{Traffic, TrafficKey},
};

use super::*;
use crate::bench::fleet_tables;

fn key(client: &str, verb: &str, resource: &str) -> TrafficKey {
    TrafficKey {
        client: client.into(),
        verb: verb.into(),
        resource: resource.into(),
    }
}

fn t(requests: u64, bytes: u64) -> Traffic {
    Traffic { requests, bytes }
}

#[test]
fn a_window_is_one_clients_difference() {
    let before = BTreeMap::from([(key("agent-0", "watch", "services"), t(1, 100))]);
    let after = BTreeMap::from([
        (key("agent-0", "watch", "services"), t(1, 400)),
        (key("agent-0", "list", "nodes"), t(0, 0)),
        (key("agent-1", "watch", "services"), t(1, 999)),
        (
            key("agent-0", "patch", "loopbackreports.clb-probe.io/status"),
            t(2, 50),
        ),
    ]);
    let w = window_of(&before, &after, "agent-0");
    assert_eq!(w.len(), 2, "{w:?}");
    assert_eq!(w[&("watch".into(), "services".into())], t(0, 300));
    let r = rates(&w, 60.0);
    assert_eq!(r.reports, 120.0);
    assert_eq!(r.writes, 120.0);
    assert_eq!(r.bytes, 350.0 * 60.0);
    assert_eq!(r.bytes_kube_proxy_set, 300.0 * 60.0);
    assert_eq!(r.lists, 0.0);
}

#[test]
fn writes_are_sorted_by_what_they_write() {
    let w: Window = [
        (("patch", "nodes/status"), t(1, 10)),
        (("create", "events.events.k8s.io"), t(3, 10)),
        (("patch", "events.events.k8s.io"), t(1, 10)),
        (
            ("patch", "loopbackverifications.clb-probe.io/status"),
            t(2, 10),
        ),
        (("list", "services"), t(1, 10)),
        (("get", "nodes"), t(5, 10)),
    ]
    .into_iter()
    .map(|((v, r), t)| ((v.to_string(), r.to_string()), t))
    .collect();
    let r = rates(&w, 3600.0);
    assert_eq!(
        (r.conditions, r.events, r.verifications, r.writes, r.lists),
        (1.0, 4.0, 2.0, 7.0, 1.0)
    );
}

#[test]
fn watches_are_reasked_as_they_time_out() {
    let timeouts = BTreeMap::from([("services".to_string(), 290.0), ("nodes".into(), 290.0)]);
    assert!((watches_per_hour(&timeouts) - 2.0 * 3600.0 / 290.0).abs() < 1e-9);
    assert_eq!(kube_proxy_watches_per_hour(), 24.0);
}

fn fleet(report_wall_s: f64) -> Fleet {
    let steady: Window = [(("patch", "loopbackreports.clb-probe.io/status"), t(1, 10))]
        .into_iter()
        .map(|((v, r), t)| ((v.to_string(), r.to_string()), t))
        .collect();
    Fleet {
        plan: Plan {
            sizes: vec![1000, 5000],
            services: 30_000,
            agents: 1,
            window: Duration::from_secs(60),
            settle: Duration::from_secs(20),
            verify_timeout_s: 30,
        },
        agents: vec![[Window::new(), steady.clone(), steady]],
        watch_timeouts: vec![BTreeMap::from([("services".into(), 290.0)])],
        plugin: vec![PluginRun {
            nodes: 5000,
            command: "report".into(),
            wall_s: report_wall_s,
            peak_rss_mib: 100.0,
            exit: 1,
            requests: 3,
            bytes: 1 << 20,
        }],
        verify: Some((
            2,
            BTreeMap::from([
                (
                    key(
                        "agent-0",
                        "patch",
                        "loopbackverifications.clb-probe.io/status",
                    ),
                    t(1, 10),
                ),
                (
                    key(
                        "agent-1",
                        "patch",
                        "loopbackverifications.clb-probe.io/status",
                    ),
                    t(1, 10),
                ),
                (
                    key("plugin", "create", "loopbackverifications.clb-probe.io"),
                    t(2, 10),
                ),
                (
                    key("plugin", "delete", "loopbackverifications.clb-probe.io"),
                    t(2, 10),
                ),
            ]),
        )),
    }
}

#[test]
fn the_sections_state_each_target_met_or_missed() {
    let mut summary = Vec::new();
    let load = fleet_tables::load_table(&fleet(1.0), &mut summary);
    // One report write a minute: 60/h, at the target.
    assert_contains(&load.note, "60 writes/h (1.00 a minute): met");
    assert_eq!(load.rows.len(), 4 + 4);
    assert_eq!(load.rows[4][0], "fleet of 1000 agents, steady");
    assert_eq!(load.rows[4][3], "60000");
    let plugin = fleet_tables::plugin_table(&fleet(1.0), &mut summary);
    assert_contains(&plugin.note, "1.00 s, 100 MiB: met");
    assert_contains(&plugin.note, "1.0 agent write(s)");
    assert_contains(&plugin.note, "2.0 plugin write(s)");
    let slow = fleet_tables::plugin_table(&fleet(4.0), &mut summary);
    assert_contains(&slow.note, "missed");
    assert!(
        summary
            .iter()
            .any(|(w, f)| w.contains("report") && f.contains("missed"))
    );
}

#[test]
fn several_agents_show_the_median_and_each_agent_side_by_side() {
    let mut f = fleet(1.0);
    // A second agent that wrote three times as often: the median is between the two, and
    // each agent's own row shows the spread.
    let mut busy = f.agents[0].clone();
    busy[1] = [(
        (
            "patch".to_string(),
            "loopbackreports.clb-probe.io/status".to_string(),
        ),
        t(3, 30),
    )]
    .into_iter()
    .collect();
    f.agents.push(busy);
    f.watch_timeouts.push(f.watch_timeouts[0].clone());
    f.plan.agents = 2;
    let load = fleet_tables::load_table(&f, &mut Vec::new());
    assert_eq!(load.rows[0][0], "median of 2 agents, steady");
    assert_eq!(load.rows[0][3], "120");
    let row = |name: &str| {
        load.rows
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("no row {name}: {:?}", load.rows))
            .clone()
    };
    assert_eq!(row("agent 0, steady")[3], "60");
    assert_eq!(row("agent 1, steady")[3], "180");
    assert_eq!(load.rows.len(), 4 + 4 + 4);
}
