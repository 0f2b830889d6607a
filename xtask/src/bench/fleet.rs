//! Part 10 (`--only fleet`, issue #52): what a fleet of agents costs the API server, and the
//! plugin at fleet scale.
//!
//! The fake API ([`super::fleet_api`]) holds `--fleet-services` Services with their
//! EndpointSlices and 1,000 then 5,000 Nodes, each with its LoopbackReport and its agent's
//! Events. `--fleet-agents` real agents (the release build, each told it runs on a fleet node
//! of its own, with the node report and the Node condition on; the first in the bench node
//! namespace, each other in a namespace of its own linked to it, since an agent refuses a
//! second in its namespace) run against it side by side, each with a bearer token of its own,
//! so the fake's request log counts each agent's requests and the bytes sent to it apart from
//! the others' and the plugin's. One steady window and one window with one Service change
//! a second (a Service and its EndpointSlice added, then removed) give each agent's rates, per
//! hour; the fleet's are one agent's times the nodes (every agent watches the same Services and
//! EndpointSlices, and only its own Node, report and verification requests). kube-proxy's own
//! watch set (Services, EndpointSlices, its Node) is the floor the agent is compared with.
//! Then the plugin (`kubectl-clb_probe`, release) runs `report`, `events`, `fix` and `verify`
//! against 1,000 and 5,000 nodes: wall time and peak RSS (the kernel's `ru_maxrss`), and the
//! writes of one verify fan-out per node asked.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use test_support::{
    kubeapi::{Traffic, TrafficKey},
    lab::{cmd::run, net::remove_namespaces},
};

use super::{
    fleet_api::{self, FleetApi},
    net,
    tools::{Agent, pause},
};

/// Fleet nodes that carry the bench node's address (an agent's node must, to write its
/// report outside a Pod): the most agents `--fleet-agents` runs side by side.
pub const MAX_AGENTS: usize = 8;
/// kube-rs's watcher asks for watches of this length (`timeoutSeconds`), client-go's reflector
/// for a random length in [5, 10) minutes: `minWatchTimeout = 5 * time.Minute`, timeout
/// `minWatchTimeout * (rand.Float64() + 1.0)` (kubernetes/kubernetes,
/// staging/src/k8s.io/client-go/tools/cache/reflector.go), 7.5 minutes on average.
const KUBE_PROXY_WATCH_S: f64 = 450.0;
/// kube-proxy's watch set: Services, EndpointSlices and its own Node (pkg/proxy's config
/// informers; cmd/kube-proxy's node informer, fieldSelector metadata.name).
const KUBE_PROXY_WATCHES: usize = 3;

#[derive(Debug, Clone)]
pub struct Plan {
    /// Nodes in the fleet, growing (1,000 then 5,000).
    pub sizes: Vec<usize>,
    pub services: usize,
    pub agents: usize,
    /// Each of the two windows.
    pub window: Duration,
    /// After the agents' first tables, before the steady window: their start-up writes (the
    /// first report, the condition) done.
    pub settle: Duration,
    /// `verify`'s `--timeout`.
    pub verify_timeout_s: u64,
}

/// One agent's requests and bytes in a window, by (verb, resource).
pub type Window = BTreeMap<(String, String), Traffic>;

/// What the run measured.
pub struct Fleet {
    pub plan: Plan,
    /// Per agent: its start (first list to the end of [`Plan::settle`]), steady, changing.
    pub agents: Vec<[Window; 3]>,
    /// Per agent: the `timeoutSeconds` of each watch it opened, by resource.
    pub watch_timeouts: Vec<BTreeMap<String, f64>>,
    pub plugin: Vec<PluginRun>,
    /// The verify fan-out: nodes asked and every client's writes and bytes during it.
    pub verify: Option<(usize, BTreeMap<TrafficKey, Traffic>)>,
}

/// One plugin command against one fleet size.
pub struct PluginRun {
    pub nodes: usize,
    pub command: String,
    pub wall_s: f64,
    pub peak_rss_mib: f64,
    pub exit: i32,
    pub requests: u64,
    pub bytes: u64,
}

/// `client`'s part of `after - before`.
pub fn window_of(
    before: &BTreeMap<TrafficKey, Traffic>,
    after: &BTreeMap<TrafficKey, Traffic>,
    client: &str,
) -> Window {
    after
        .iter()
        .filter(|(k, _)| k.client == client)
        .map(|(k, t)| {
            let old = before.get(k).copied().unwrap_or_default();
            let diff = Traffic {
                requests: t.requests - old.requests,
                bytes: t.bytes - old.bytes,
            };
            ((k.verb.clone(), k.resource.clone()), diff)
        })
        .filter(|(_, t)| t.requests > 0 || t.bytes > 0)
        .collect()
}

pub fn measure(probe: &Path, plugin: &Path, work: &Path, port: u16, plan: &Plan) -> Result<Fleet> {
    let t = Instant::now();
    let mut api = FleetApi::start(work, plan.services)?;
    api.grow(plan.sizes[0]);
    eprintln!(
        "bench: fleet   fake API with {} Services, {} nodes in {:.1} s",
        plan.services,
        plan.sizes[0],
        t.elapsed().as_secs_f64()
    );
    // Every agent's start is counted: its first lists included.
    let start = BTreeMap::new();
    let agents = start_agents(probe, work, port, &api, plan)?;
    pause(plan.settle)?;
    let steady_from = api.api().traffic();
    pause(plan.window)?;
    let change_from = api.api().traffic();
    let t = Instant::now();
    let mut k = 0;
    while t.elapsed() < plan.window {
        api.change(k);
        k += 1;
        pause(Duration::from_secs(k as u64).saturating_sub(t.elapsed()))?;
    }
    let end = api.api().traffic();
    // What the first agent's report said at the end, for a look at why it wrote.
    let report = api.report_of(&fleet_api::node_name(0)).unwrap_or_default();
    std::fs::write(
        work.join("fleet-report-node-0.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let mut fleet = Fleet {
        plan: plan.clone(),
        agents: (0..plan.agents)
            .map(|i| {
                let c = agent_client(i);
                [
                    window_of(&start, &steady_from, &c),
                    window_of(&steady_from, &change_from, &c),
                    window_of(&change_from, &end, &c),
                ]
            })
            .collect(),
        watch_timeouts: (0..plan.agents)
            .map(|i| watch_timeouts(&api, &agent_client(i)))
            .collect(),
        plugin: Vec::new(),
        verify: None,
    };
    for (n, &size) in plan.sizes.iter().enumerate() {
        if n > 0 {
            api.grow(size);
        }
        let verify = plugin_runs(plugin, work, &api, size, plan, &mut fleet.plugin)?;
        fleet.verify.get_or_insert(verify);
    }
    drop(agents);
    Ok(fleet)
}

fn agent_client(i: usize) -> String {
    format!("agent-{i}")
}

/// The agents, each on its own fleet node, once each has its first table from the API.
fn start_agents(
    probe: &Path,
    work: &Path,
    port: u16,
    api: &FleetApi,
    plan: &Plan,
) -> Result<Agents> {
    if !(1..=MAX_AGENTS).contains(&plan.agents) {
        bail!("--fleet-agents: 1 to {MAX_AGENTS}");
    }
    let nodes = OtherNodes::up(plan.agents)?;
    let mut agents = Vec::new();
    for i in 0..plan.agents {
        let dir = work.join(format!("fleet-agent-{i}"));
        std::fs::create_dir_all(&dir)?;
        let (netns, kubeconfig) = match i {
            0 => (net::NS_NODE.to_string(), api.kubeconfig(&agent_client(i))?),
            _ => (
                OtherNodes::netns(i),
                api.kubeconfig_via(&agent_client(i), OtherNodes::api_side(i).into())?,
            ),
        };
        let kubeconfig = kubeconfig.display().to_string();
        let node = fleet_api::node_name(i);
        let env = [
            ("CLB_PROBE_KUBECONFIG", kubeconfig.as_str()),
            ("NODE_NAME", node.as_str()),
            ("CLB_PROBE_NODE_REPORT", "on"),
            ("CLB_PROBE_NODE_CONDITION", "on"),
        ];
        let filter = "warn,clb_probe::agent=info,clb_probe::kube=info";
        let agent = Agent::start_in(&netns, probe, &dir, port + 1 + i as u16, filter, &env)
            .with_context(|| format!("fleet agent {i}"))?;
        agents.push((agent, dir));
    }
    let t = Instant::now();
    for (i, (_, dir)) in agents.iter().enumerate() {
        let log = dir.join("agent.log");
        let want = format!("services={}", plan.services);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text
                .lines()
                .any(|l| l.contains("service table from the API") && l.contains(&want))
            {
                break;
            }
            if t.elapsed() > Duration::from_secs(300) {
                bail!(
                    "fleet agent {i}: no table from the API in 300 s ({})",
                    log.display()
                );
            }
            pause(Duration::from_millis(200))?;
        }
    }
    eprintln!(
        "bench: fleet   {} agent(s) with their first table from the API in {:.1} s",
        plan.agents,
        t.elapsed().as_secs_f64()
    );
    Ok(Agents {
        _agents: agents,
        _nodes: nodes,
    })
}

/// The running agents, and the namespaces of the ones beyond the first. Fields drop in
/// order: the agents stop before their namespaces go.
struct Agents {
    _agents: Vec<(Agent, PathBuf)>,
    _nodes: OtherNodes,
}

/// The fleet nodes of the agents beyond the first: an agent refuses to start beside another
/// in its network namespace (two would attach twice and detach each other:
/// probe-user/src/agent/instance.rs), so agent `i > 0` runs in a namespace of its own with
/// the bench node's NIC and `kube-ipvs0` by their names, the NIC holding the bench node's
/// address as its Node object says (`fleet_api::node`), and a link to the bench node
/// namespace, where the fake API listens. Removed on drop, whatever way the bench ends.
struct OtherNodes(Vec<String>);

impl OtherNodes {
    fn netns(i: usize) -> String {
        format!("clb-bench-fleet-{i}")
    }

    /// The bench node namespace's end of agent `i`'s link: the fake API's address for it.
    fn api_side(i: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 252, i as u8, 1)
    }

    fn up(agents: usize) -> Result<OtherNodes> {
        let names: Vec<String> = (1..agents).map(Self::netns).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        // A run killed hard leaves its namespaces: start clean.
        remove_namespaces(&refs).context("removing a previous fleet run's namespaces")?;
        let nodes = OtherNodes(names);
        for i in 1..agents {
            Self::build(i).with_context(|| format!("fleet node namespace {i}"))?;
        }
        Ok(nodes)
    }

    fn build(i: usize) -> Result<()> {
        let ns = Self::netns(i);
        let link = format!("fleet{i}");
        let api = format!("{}/24", Self::api_side(i));
        let node = format!("10.252.{i}.2/24");
        let node_ip = format!("{}/32", net::NODE_IP);
        let ip = |args: &[&str]| run(&[&["ip"][..], args].concat()).map(drop);
        ip(&["netns", "add", &ns])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            net::NS_NODE,
            "link",
            "add",
            &link,
            "type",
            "veth",
            "peer",
            "name",
            net::NODE_IF,
            "netns",
            &ns,
        ])?;
        ip(&["-n", net::NS_NODE, "addr", "add", &api, "dev", &link])?;
        ip(&["-n", net::NS_NODE, "link", "set", &link, "up"])?;
        ip(&["-n", &ns, "addr", "add", &node, "dev", net::NODE_IF])?;
        ip(&["-n", &ns, "addr", "add", &node_ip, "dev", net::NODE_IF])?;
        ip(&["-n", &ns, "link", "set", net::NODE_IF, "up"])?;
        ip(&["-n", &ns, "link", "add", net::VIP_IF, "type", "bridge"])?;
        ip(&["-n", &ns, "link", "set", net::VIP_IF, "up"])
    }
}

impl Drop for OtherNodes {
    fn drop(&mut self) {
        let refs: Vec<&str> = self.0.iter().map(String::as_str).collect();
        if let Err(e) = remove_namespaces(&refs) {
            eprintln!("bench: fleet teardown failed: {e:#}");
        }
    }
}

/// The `timeoutSeconds` of each watch `client` opened, by resource (the last one asked).
fn watch_timeouts(api: &FleetApi, client: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for r in api.api().requests() {
        if r.client != client || !(r.path.contains("watch=true") || r.path.contains("watch=1")) {
            continue;
        }
        let (path, query) = r.path.split_once('?').unwrap_or((&r.path, ""));
        let timeout = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
            .and_then(|t| t.parse::<f64>().ok());
        let resource = path.rsplit('/').next().unwrap_or(path).to_owned();
        if let Some(timeout) = timeout {
            out.insert(resource, timeout);
        }
    }
    out
}

/// `report`, `events`, `fix` and `verify` against `nodes` nodes; returns the verify
/// fan-out's traffic.
fn plugin_runs(
    plugin: &Path,
    work: &Path,
    api: &FleetApi,
    nodes: usize,
    plan: &Plan,
    out: &mut Vec<PluginRun>,
) -> Result<(usize, BTreeMap<TrafficKey, Traffic>)> {
    let kubeconfig = api.kubeconfig("plugin")?.display().to_string();
    let service = format!("svc-{}", fleet_api::HOT_SERVICE);
    let ns = super::scale_api::NAMESPACE;
    let timeout = plan.verify_timeout_s.to_string();
    let mut verify_args: Vec<String> = ["verify", "-n", ns, &service, "--timeout", &timeout]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for i in 0..plan.agents {
        verify_args.extend(["--node".to_string(), fleet_api::node_name(i)]);
    }
    let commands: [Vec<String>; 4] = [
        vec!["report".into()],
        vec!["events".into()],
        vec!["fix".into(), "-n".into(), ns.into(), service.clone()],
        verify_args,
    ];
    let mut verify = (plan.agents, BTreeMap::new());
    for args in commands {
        let before = api.api().traffic();
        let mut argv = vec!["--kubeconfig".to_string(), kubeconfig.clone()];
        argv.extend(args.iter().cloned());
        let (wall_s, peak_rss_mib, exit) = run_measured(plugin, &argv, work)?;
        let after = api.api().traffic();
        let own = window_of(&before, &after, "plugin");
        out.push(PluginRun {
            nodes,
            command: args.join(" "),
            wall_s,
            peak_rss_mib,
            exit,
            requests: own.values().map(|t| t.requests).sum(),
            bytes: own.values().map(|t| t.bytes).sum(),
        });
        if args[0] == "verify" {
            verify.1 = after
                .iter()
                .map(|(k, t)| {
                    let old = before.get(k).copied().unwrap_or_default();
                    let d = Traffic {
                        requests: t.requests - old.requests,
                        bytes: t.bytes - old.bytes,
                    };
                    (k.clone(), d)
                })
                .filter(|(_, t)| t.requests > 0 || t.bytes > 0)
                .collect();
        }
        eprintln!(
            "bench: fleet   {nodes} nodes: {} in {wall_s:.2} s, peak RSS {peak_rss_mib:.0} MiB (exit {exit})",
            args.join(" ")
        );
    }
    Ok(verify)
}

/// Runs `plugin argv` in the bench node namespace (where the fake API listens): wall time,
/// peak RSS and exit code. The RSS is GNU time's (`%M`, the plugin's `ru_maxrss` as time
/// waits for it): a process this bench forks or spawns itself starts with the bench's own
/// high-water mark (Linux carries the forked memory's peak over `exec`), and the bench holds
/// the fake API's objects, 1.6 GB at 5,000 nodes; time's own child starts from time's.
fn run_measured(plugin: &Path, argv: &[String], work: &Path) -> Result<(f64, f64, i32)> {
    let stdout = std::fs::File::create(work.join("fleet-plugin.out"))?;
    let stderr = std::fs::File::create(work.join("fleet-plugin.err"))?;
    let rss_file = work.join("fleet-plugin.rss");
    let _ = std::fs::remove_file(&rss_file);
    let t = Instant::now();
    let status = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            net::NS_NODE,
            "/usr/bin/time",
            "-f",
            "%M",
            "-o",
        ])
        .arg(&rss_file)
        .arg(plugin)
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .status()
        .context("running the plugin under /usr/bin/time")?;
    let wall_s = t.elapsed().as_secs_f64();
    // GNU time writes "Command exited with non-zero status N" first when it did; the format
    // is the last line.
    let text = std::fs::read_to_string(&rss_file).unwrap_or_default();
    let kib: f64 = text
        .lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("no peak RSS from /usr/bin/time: {text:?}"))?;
    Ok((wall_s, kib / 1024.0, status.code().unwrap_or(-1)))
}

/// One agent's rates per hour in a window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub lists: f64,
    pub writes: f64,
    pub reports: f64,
    pub conditions: f64,
    pub events: f64,
    pub verifications: f64,
    /// Bytes the API server sent the agent.
    pub bytes: f64,
    /// Of those, on kube-proxy's watch set (Services, EndpointSlices, Nodes).
    pub bytes_kube_proxy_set: f64,
}

/// Whether a resource is in kube-proxy's watch set.
fn in_kube_proxy_set(resource: &str) -> bool {
    matches!(
        resource,
        "services" | "endpointslices.discovery.k8s.io" | "nodes"
    )
}

fn is_write(verb: &str) -> bool {
    matches!(verb, "create" | "patch" | "update" | "delete")
}

/// `w`, measured over `secs`, per hour.
pub fn rates(w: &Window, secs: f64) -> Rates {
    let per_hour = 3600.0 / secs;
    let mut r = Rates::default();
    for ((verb, resource), t) in w {
        let n = t.requests as f64 * per_hour;
        if verb == "list" {
            r.lists += n;
        }
        if is_write(verb) {
            r.writes += n;
            match resource.split('/').next().unwrap_or_default() {
                "loopbackreports.clb-probe.io" => r.reports += n,
                "nodes" => r.conditions += n,
                "events.events.k8s.io" => r.events += n,
                "loopbackverifications.clb-probe.io" => r.verifications += n,
                _ => {}
            }
        }
        r.bytes += t.bytes as f64 * per_hour;
        if in_kube_proxy_set(resource) {
            r.bytes_kube_proxy_set += t.bytes as f64 * per_hour;
        }
    }
    r
}

/// Watch requests per hour of open watches with these `timeoutSeconds` (each re-watched as
/// it ends).
pub fn watches_per_hour(timeouts: &BTreeMap<String, f64>) -> f64 {
    timeouts
        .values()
        .filter(|t| **t > 0.0)
        .map(|t| 3600.0 / t)
        .sum()
}

/// kube-proxy's watch requests per hour (the floor).
pub fn kube_proxy_watches_per_hour() -> f64 {
    KUBE_PROXY_WATCHES as f64 * 3600.0 / KUBE_PROXY_WATCH_S
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;
