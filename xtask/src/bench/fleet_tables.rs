//! Part 10's sections ([`super::fleet`]): the API server's load per agent and per fleet
//! against kube-proxy's floor, and the plugin at fleet scale. Pure: unit-tested without root.

use super::{
    fleet::{Fleet, Rates, kube_proxy_watches_per_hour, rates, watches_per_hour},
    report::{Table, median},
};

/// The target: writes per agent per hour beyond kube-proxy's watch set at steady state.
const WRITES_PER_HOUR_TARGET: f64 = 60.0;
/// The target for `report` over 5,000 nodes.
const REPORT_TARGET_S: f64 = 3.0;
const REPORT_TARGET_MIB: f64 = 256.0;
const MIB: f64 = 1024.0 * 1024.0;

/// The median over agents of each rate.
fn median_rates(all: &[Rates]) -> Rates {
    let m = |f: fn(&Rates) -> f64| median(&all.iter().map(f).collect::<Vec<_>>());
    Rates {
        lists: m(|r| r.lists),
        writes: m(|r| r.writes),
        reports: m(|r| r.reports),
        conditions: m(|r| r.conditions),
        events: m(|r| r.events),
        verifications: m(|r| r.verifications),
        bytes: m(|r| r.bytes),
        bytes_kube_proxy_set: m(|r| r.bytes_kube_proxy_set),
    }
}

fn row(what: String, watches: f64, r: &Rates, scale: f64) -> Vec<String> {
    let n = |v: f64| format!("{:.0}", v * scale);
    vec![
        what,
        n(r.lists),
        n(watches),
        n(r.writes),
        n(r.reports),
        n(r.conditions),
        n(r.events),
        n(r.verifications),
        format!("{:.1}", r.bytes * scale / MIB),
    ]
}

/// The floor: kube-proxy's watches, no lists or writes, the bytes of the same objects.
fn floor(r: &Rates) -> Rates {
    Rates {
        bytes: r.bytes_kube_proxy_set,
        bytes_kube_proxy_set: r.bytes_kube_proxy_set,
        ..Rates::default()
    }
}

pub fn load_table(f: &Fleet, summary: &mut Vec<(String, String)>) -> Table {
    let secs = f.plan.window.as_secs_f64();
    let per = |w: usize| -> Rates {
        median_rates(
            &f.agents
                .iter()
                .map(|a| rates(&a[w], secs))
                .collect::<Vec<_>>(),
        )
    };
    let (steady, changing) = (per(1), per(2));
    let watches = median(
        &f.watch_timeouts
            .iter()
            .map(watches_per_hour)
            .collect::<Vec<_>>(),
    );
    let floor_watches = kube_proxy_watches_per_hour();
    let mut t = Table::new(
        "10. Fleet: the API server's load, per agent and per fleet",
        &[
            "who, window",
            "lists/h",
            "watch requests/h",
            "writes/h",
            "report writes/h",
            "condition writes/h",
            "Event writes/h",
            "verification status writes/h",
            "MiB received/h",
        ],
    );
    let windows = [("steady", &steady), ("1 Service change/s", &changing)];
    let one = match f.agents.len() {
        1 => "one agent".to_string(),
        n => format!("median of {n} agents"),
    };
    for (name, r) in windows {
        t.row(row(format!("{one}, {name}"), watches, r, 1.0));
        t.row(row(
            format!("kube-proxy's watch set (floor), {name}"),
            floor_watches,
            &floor(r),
            1.0,
        ));
    }
    // Side by side, each agent's own: the spread the median hides.
    if f.agents.len() > 1 {
        for (i, (windows, timeouts)) in f.agents.iter().zip(&f.watch_timeouts).enumerate() {
            for (w, name) in [(1, "steady"), (2, "1 Service change/s")] {
                t.row(row(
                    format!("agent {i}, {name}"),
                    watches_per_hour(timeouts),
                    &rates(&windows[w], secs),
                    1.0,
                ));
            }
        }
    }
    for &n in &f.plan.sizes {
        for (name, r) in windows {
            t.row(row(
                format!("fleet of {n} agents, {name}"),
                watches,
                r,
                n as f64,
            ));
        }
    }
    let start = median_rates(
        &f.agents
            .iter()
            .map(|a| rates(&a[0], 3600.0))
            .collect::<Vec<_>>(),
    );
    let beyond = steady.writes;
    let met = if beyond <= WRITES_PER_HOUR_TARGET {
        "met"
    } else {
        "missed"
    };
    t.note = format!(
        "{agents} real agent(s) (release build, node report and Node condition on), each on a \
         fleet node of its own (the first in the bench's node namespace, each other in a \
         network namespace of its own linked to it), side by side against the fake API with {services} Services and their \
         EndpointSlices, one LoopbackReport per node (1 in {le} nodes with two active loops, 1 \
         in {re} with a risk) and the agents' Events; each agent's requests counted by the fake \
         under its own bearer token. Rates are the median agent's over a {secs:.0} s window, \
         per hour; a fleet is one agent times its nodes (every agent watches the same Services \
         and EndpointSlices and only its own Node, report and verification requests). Watch \
         requests/h: each open watch re-asked when its `timeoutSeconds` ends (the agent's from \
         its request log; kube-proxy's: client-go's reflector, 5-10 min, 7.5 on average, for \
         Services, EndpointSlices and its Node). kube-proxy's bytes are the agent's on those \
         three resources (the same objects and events). One agent's start (its first lists, \
         its first report and condition, {settle} s): {sl:.0} list requests (a list is read in \
         pages of 500), {sw:.0} writes, {smib:.1} MiB received; a restart of the whole fleet \
         of {last} nodes: {fleet_gib:.0} GiB. \
         **Target: at most 1 write per minute per agent beyond kube-proxy's watch set at steady \
         state: {beyond:.0} writes/h ({per_min:.2} a minute): {met}.** kube-proxy writes \
         nothing at steady state, so every write of the agent is beyond its set. The report \
         writer's heartbeat (a write every 300 s without a change, then the condition) is \
         longer than a window shorter than 300 s can show: 12 report and 12 condition writes/h \
         at most on top of what a short window counted. The agents' nodes have no loop here \
         (no traffic): a node with a continuing loop also patches its Event's series, at most \
         once a minute per loop and 10 writes a minute in all (the Event plan, \
         probe-user/src/sink/kube_event_plan.rs), by design beyond the target while it loops.",
        agents = f.agents.len(),
        services = f.plan.services,
        le = super::fleet_api::LOOP_EVERY,
        re = super::fleet_api::RISK_EVERY,
        settle = f.plan.settle.as_secs(),
        sl = start.lists,
        sw = start.writes,
        smib = start.bytes / MIB,
        last = f.plan.sizes.last().copied().unwrap_or(0),
        fleet_gib = start.bytes / MIB / 1024.0 * f.plan.sizes.last().copied().unwrap_or(0) as f64,
        per_min = beyond / 60.0,
    );
    summary.push((
        "Fleet: writes per agent beyond kube-proxy's watch set, steady (target <= 60/h)".into(),
        format!("{beyond:.0}/h ({met})"),
    ));
    summary.push((
        "Fleet: MiB/h an agent receives, steady / 1 Service change/s (kube-proxy's set)".into(),
        format!(
            "{:.2} / {:.1} ({:.2} / {:.1})",
            steady.bytes / MIB,
            changing.bytes / MIB,
            steady.bytes_kube_proxy_set / MIB,
            changing.bytes_kube_proxy_set / MIB
        ),
    ));
    t
}

pub fn plugin_table(f: &Fleet, summary: &mut Vec<(String, String)>) -> Table {
    let mut t = Table::new(
        "10b. Fleet: the plugin at 1,000 and 5,000 nodes",
        &[
            "nodes",
            "command",
            "wall s",
            "peak RSS MiB",
            "requests",
            "MiB received",
            "exit",
        ],
    );
    for p in &f.plugin {
        t.row(vec![
            p.nodes.to_string(),
            format!("`{}`", p.command),
            format!("{:.2}", p.wall_s),
            format!("{:.0}", p.peak_rss_mib),
            p.requests.to_string(),
            format!("{:.1}", p.bytes as f64 / MIB),
            p.exit.to_string(),
        ]);
    }
    let biggest = f.plan.sizes.last().copied().unwrap_or(0);
    let report = f
        .plugin
        .iter()
        .find(|p| p.nodes == biggest && p.command == "report");
    let verdict = match report {
        Some(r) => {
            let met = r.wall_s < REPORT_TARGET_S && r.peak_rss_mib < REPORT_TARGET_MIB;
            summary.push((
                format!("Fleet: `report` over {biggest} nodes (target < 3 s, < 256 MiB)"),
                format!(
                    "{:.2} s, {:.0} MiB ({})",
                    r.wall_s,
                    r.peak_rss_mib,
                    if met { "met" } else { "missed" }
                ),
            ));
            format!(
                "**Target: `report` over {biggest} nodes under 3 s and 256 MiB: {:.2} s, {:.0} \
                 MiB: {}.**",
                r.wall_s,
                r.peak_rss_mib,
                if met { "met" } else { "missed" }
            )
        }
        None => String::new(),
    };
    t.note = format!(
        "The release plugin (`kubectl-clb_probe`) against the fake API of section 10, in the \
         bench node namespace; wall time from spawn to exit, peak RSS the kernel's `ru_maxrss`; \
         requests and bytes from the fake's request log. `fix` and `verify` name the Service \
         every looping node's first loop names; `verify` asks the real agents' nodes (`--node` \
         each). {verdict} {fanout}",
        fanout = fanout_note(f, summary),
    );
    t
}

/// One verify fan-out's writes per node asked: the plugin's (a request object created and
/// deleted per node) and the agents' (each patches its answer into its own request's status).
fn fanout_note(f: &Fleet, summary: &mut Vec<(String, String)>) -> String {
    let Some((asked, traffic)) = &f.verify else {
        return String::new();
    };
    let asked = (*asked).max(1) as f64;
    let writes = |agents: bool| -> f64 {
        traffic
            .iter()
            .filter(|(k, _)| k.client.starts_with("agent-") == agents)
            .filter(|(k, _)| matches!(k.verb.as_str(), "create" | "patch" | "update" | "delete"))
            .filter(|(k, _)| k.resource.starts_with("loopbackverifications"))
            .map(|(_, t)| t.requests as f64)
            .sum()
    };
    let agent_bytes: f64 = traffic
        .iter()
        .filter(|(k, _)| {
            k.client.starts_with("agent-") && k.resource.starts_with("loopbackverifications")
        })
        .map(|(_, t)| t.bytes as f64)
        .sum();
    let (agent, plugin) = (writes(true) / asked, writes(false) / asked);
    let met = if agent <= 1.0 { "met" } else { "missed" };
    summary.push((
        "Fleet: a verify's writes per node asked, agent / plugin (target: agent <= 1)".into(),
        format!("{agent:.1} / {plugin:.1} ({met})"),
    ));
    format!(
        "One verify fan-out to {asked:.0} node(s): per node asked, {agent:.1} agent write(s) \
         (its answer in its request's status) and {plugin:.1} plugin write(s) (the request \
         object created, then deleted), {kib:.1} KiB sent to each agent for it (its watch's events, its patch's answer). \
         **Target: a verify to every node costs at most one write per node (the agent's): \
         {met}.** A fan-out to every node of a big fleet is {per_run}-node runs: the plugin asks \
         at most {per_run} nodes a run (`probe_contract::verify::MAX_NODES`), so 5,000 nodes are \
         {runs} runs, {total:.0} writes in all.",
        kib = agent_bytes / asked / 1024.0,
        per_run = probe_contract::verify::MAX_NODES,
        runs = 5000usize.div_ceil(probe_contract::verify::MAX_NODES),
        total = (agent + plugin) * 5000.0,
    )
}
