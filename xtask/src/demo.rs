//! `cargo xtask demo`: the README's "run it". Setup if needed, build, bring the lab up, run
//! `probe check` on the lab node, start the agent there, drive every failure and its healthy
//! twin, and show what the agent confirmed. The lab is torn down on every exit, Ctrl-C
//! included.

use std::{
    io::{BufRead as _, BufReader, IsTerminal as _},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use test_support::lab::{self, LabGuard, Scenario, Variants};

use crate::setup;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM only set a flag: the demo stops at the next step and unwinds normally,
/// so the lab guard and the agent are cleaned up.
fn trap_signals() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

fn check_interrupt() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// The agent, stopped with SIGTERM on drop.
struct AgentChild(Child);

impl Drop for AgentChild {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The live-view socket of the demo's agent.
const DEMO_SOCKET: &str = "/run/clb-probe/demo.sock";

/// Scenarios the demo drives: all of the lab's (`Scenario::ALL`: failures first, each followed
/// by its healthy twin), so every kind the agent confirms is shown.
const SCENARIOS: &[Scenario] = &Scenario::ALL;

/// The demo's agent: the package and its features (docs/lab.md, "The first run: where the time
/// goes"). xtask's Cargo.toml aligns its dependencies' features with this build's.
pub const DEMO_AGENT: &[&str] = &["-p", "clb-probe", "--no-default-features"];

/// `cargo xtask demo` options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DemoArgs {
    /// kube-proxy's mode in the lab (default: `CLB_LAB_MODE`, else iptables). `ipvs` needs a
    /// kernel with IPVS and `dummy` (the VM tier's); in `nftables` no LB IP is bound, so only
    /// the hairpin can happen.
    #[arg(long, value_enum)]
    pub mode: Option<lab::KubeProxyMode>,
    /// Then add the lab's dual-stack layer and drive the failures over IPv6 (iptables mode).
    #[arg(long)]
    pub ipv6: bool,
    /// The cloud whose fixes the agent's events carry (the agent's `--provider`), e.g.
    /// `tencentcloud` for the reference notes' own CLB fix (`service.cloud.tencent.com/
    /// prevent-loopback`). Default: the agent's choice, from each Service's LB class and
    /// annotations (the lab's are the generic fixes).
    #[arg(long, value_name = "NAME", value_parser = PROVIDERS)]
    pub provider: Option<String>,
    /// Each confirmed event in full: its first three fixes and the agent's JSON line (default:
    /// one line per event and its first fix).
    #[arg(short, long)]
    pub verbose: bool,
}

/// `--provider`'s names: probe-client's `fixes::Provider::ALL` spellings (xtask does not link
/// it; the agent rejects a name it does not know, so a drift fails loudly).
const PROVIDERS: [&str; 9] = [
    "aws",
    "azure",
    "gce",
    "alicloud",
    "tencentcloud",
    "hcloud",
    "digitalocean",
    "openstack",
    "generic",
];

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let mode = match args.mode {
        Some(m) => m,
        None => lab::KubeProxyMode::from_env()?,
    };
    if args.ipv6 && mode != lab::KubeProxyMode::Iptables {
        // A usage error: clap's format and exit code 2, before anything is built.
        clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            "--ipv6: the dual-stack lab is built in kube-proxy's iptables mode (--mode iptables)\n",
        )
        .exit();
    }
    if !setup::is_root() {
        bail!("the demo builds network namespaces and loads eBPF: run it as root");
    }
    setup::ensure_demo()?;
    trap_signals();
    let root = crate::workspace_root();
    eprintln!("demo: building the probe");
    // Only what the demo runs: the agent (not the plugin, not xtask's other tools) without the
    // OTLP exporter it never uses (the `otlp` feature: tonic, prost, OpenTelemetry), so a
    // first run compiles no more than it needs.
    let status = crate::build::cargo()
        .args(["build", "--quiet"])
        .args(DEMO_AGENT)
        .args(["--bin", "probe"])
        .current_dir(&root)
        .status()?;
    if !status.success() {
        bail!("building probe-user failed");
    }
    check_interrupt()?;
    eprintln!("demo: bringing the lab up (kube-proxy mode {mode})");
    let lab = LabGuard::up_in(mode, &Variants::default(), &Default::default())?;
    let probe = crate::build::target_dir(&root).join("debug/probe");

    // A fake Kubernetes API (test_support::kubeapi) with the lab's pods and Services, so the events
    // carry names: no real API server can run here.
    let api = test_support::kubeapi::FakeApiServer::start_in_netns(lab::NS_NODE)?;
    for object in test_support::kubeapi::fixtures::lab() {
        api.apply(object);
    }
    let kubeconfig = KubeconfigFile(
        std::env::temp_dir().join(format!("clb-probe-demo-kubeconfig-{}", std::process::id())),
    );
    api.write_kubeconfig(&kubeconfig.0)?;
    eprintln!(
        "demo: fake Kubernetes API (fixtures: pods, Services, EndpointSlices of the lab) at {} in {}",
        api.url(),
        lab::NS_NODE
    );

    // The risks first, as an operator would check a node before anything fails (with the
    // fake API, so the findings name the lab's Services): exit 1 (risks
    // found) is the expected answer for the lab as it comes up.
    eprintln!(
        "demo: `probe check` in {}: the risks before the failures",
        lab::NS_NODE
    );
    let check = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(&probe)
        .args(["check", "--nic", lab::NODE_NIC, "--kubeconfig"])
        .arg(&kubeconfig.0)
        .status()
        .context("running probe check")?;
    if check.code() != Some(1) {
        eprintln!("demo: probe check ended with {check} (expected 1: risks found)");
    }
    check_interrupt()?;

    eprintln!("demo: starting `probe agent` in {}", lab::NS_NODE);
    let mut child = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(&probe)
        // The service table every second: a scenario's variant (the IPVS access filter) is in
        // the agent's table before its traffic.
        .args(["agent", "--nic", lab::NODE_NIC, "--services-every", "1"])
        // Loops resolve after 5 s without a confirmation (default 300 s), so the demo's last
        // act, a fix applied, shows its resolution.
        .args(["--resolve-after", "5", "--metrics-addr", DEMO_METRICS])
        .args(["--events", "-", "--socket"])
        .arg(DEMO_SOCKET)
        .arg("--kubeconfig")
        .arg(&kubeconfig.0)
        .args(["--node-name", "clb-node"])
        .args(
            args.provider
                .iter()
                .flat_map(|p| ["--provider", p.as_str()]),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the agent")?;
    let (events_tx, events_rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped");
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = events_tx.send(line);
        }
    });
    let (log_tx, log_rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("piped");
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = log_tx.send(line);
        }
    });
    let mut agent = AgentChild(child);
    wait_ready(&mut agent, &log_rx)?;

    for scenario in SCENARIOS {
        check_interrupt()?;
        let variants = scenario.spec().variants;
        if lab.variants()? != variants {
            lab.set_all(&variants)?;
            thread::sleep(Duration::from_millis(1500));
        }
        let report = lab.run(*scenario)?;
        println!("demo: {report}");
        thread::sleep(Duration::from_millis(300));
        print_events(&events_rx, args.verbose, Duration::from_millis(10));
    }
    if args.ipv6 {
        eprintln!("demo: adding the dual-stack layer (2001:db8::/32)");
        lab.add_ipv6()?;
        for scenario in lab::v6::Scenario6::ALL {
            check_interrupt()?;
            let (outcome, expected) = lab.run6(scenario)?;
            println!("demo: ipv6 {scenario:?}: {outcome} (expected {expected})");
            thread::sleep(Duration::from_millis(300));
            print_events(&events_rx, args.verbose, Duration::from_millis(10));
        }
    }
    eprintln!("demo: waiting for the last confirmations (hairpin outcomes settle in ~2 s)");
    print_events(&events_rx, args.verbose, Duration::from_secs(3));
    check_interrupt()?;
    from_confirmed_to_fixed(&lab, &api, &events_rx, args.verbose)?;
    if std::io::stdout().is_terminal() && std::io::stdin().is_terminal() {
        eprintln!("demo: opening the live view (`probe watch`); q quits and tears the lab down");
        thread::sleep(Duration::from_secs(2));
        let status = Command::new(&probe)
            .args(["watch", "--socket", DEMO_SOCKET])
            .status()
            .context("starting probe watch")?;
        if !status.success() {
            eprintln!("demo: probe watch ended with {status}");
        }
        eprintln!(
            "demo: done. The lab is torn down now; `cargo xtask lab up` keeps one for exploring."
        );
    }
    drop(agent);
    api.stop();
    drop(lab);
    Ok(())
}

/// The agent's metrics address in the node's namespace.
const DEMO_METRICS: &str = "127.0.0.1:9979";

/// One metric's value from the agent's `/metrics`.
fn metric(line_prefix: &str) -> Option<u64> {
    let (_, body) = lab::http_get_in(lab::NS_NODE, DEMO_METRICS, "/metrics")?;
    body.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The last act (issue 26): pod-a's hairpin fails and is confirmed; the fix is applied (pod
/// egress masqueraded, what a CNI's SNAT or ip-masq-agent does); pod-a's calls succeed; the
/// agent calls the loop resolved with proof: the `LoopbackResolved` Event and the gauge at 0.
fn from_confirmed_to_fixed(
    lab: &LabGuard,
    api: &test_support::kubeapi::FakeApiServer,
    events: &mpsc::Receiver<String>,
    verbose: bool,
) -> anyhow::Result<()> {
    const RESOLVED: &str = "clbprobe_loopback_resolutions_total{kind=\"hairpin\"}";
    const ACTIVE: &str = "clbprobe_loopback_active{kind=\"hairpin\"}";
    eprintln!("demo: from confirmed to fixed: pod-a -> LB, no SNAT (the loop)");
    let report = lab.run(Scenario::Hairpin)?;
    println!("demo: {report}");
    print_events(events, verbose, Duration::from_secs(3));
    let before = metric(RESOLVED).unwrap_or(0);
    println!(
        "demo: {ACTIVE} = {}",
        metric(ACTIVE).map_or("?".into(), |n| n.to_string())
    );
    thread::sleep(Duration::from_secs(1));
    eprintln!("demo: applying the fix: pod-a's egress masqueraded to the node's address");
    let report = lab.run(Scenario::HairpinSnat)?;
    println!("demo: {report}");
    eprintln!("demo: waiting for the resolution (--resolve-after 5: unconfirmed, calls answered)");
    // pod-a keeps calling, as a fixed client would: the proof is an answered call of the
    // loop's own client *after* its last confirmation, and a confirmation of the failed
    // calls can still be reported after the first answered one (an aggregate is written at
    // most every 10 s), which then proves nothing.
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut next_call = Instant::now() + Duration::from_secs(2);
    while metric(RESOLVED).unwrap_or(0) <= before {
        check_interrupt()?;
        if Instant::now() > deadline {
            bail!("the hairpin was not resolved within 45 s of its fix");
        }
        if Instant::now() > next_call {
            lab.run(Scenario::HairpinSnat)?;
            next_call = Instant::now() + Duration::from_secs(2);
        }
        thread::sleep(Duration::from_millis(500));
    }
    let resolved: Vec<serde_json::Value> = api
        .objects("events")
        .into_iter()
        .filter(|e| e["reason"] == "LoopbackResolved")
        .filter(|e| e["note"].as_str().is_some_and(|n| n.contains("hairpin")))
        .collect();
    if let Some(e) = resolved.last() {
        println!(
            "demo: Event {} {} regarding {} {}/{}:\n  {}",
            e["type"].as_str().unwrap_or_default(),
            e["reason"].as_str().unwrap_or_default(),
            e["regarding"]["kind"].as_str().unwrap_or_default(),
            e["regarding"]["namespace"].as_str().unwrap_or_default(),
            e["regarding"]["name"].as_str().unwrap_or_default(),
            e["note"].as_str().unwrap_or_default()
        );
    }
    println!(
        "demo: {ACTIVE} = {}, {RESOLVED} = {}",
        metric(ACTIVE).map_or("?".into(), |n| n.to_string()),
        metric(RESOLVED).map_or("?".into(), |n| n.to_string())
    );
    Ok(())
}

/// The demo's kubeconfig, removed on every exit.
struct KubeconfigFile(std::path::PathBuf);

impl Drop for KubeconfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn wait_ready(agent: &mut AgentChild, log: &mpsc::Receiver<String>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        check_interrupt()?;
        match log.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                eprintln!("  agent| {line}");
                let ready = line.contains("attached and address sets loaded");
                seen.push(line);
                if ready {
                    // Keep echoing the agent's log in the background.
                    return Ok(());
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(status) = agent.0.try_wait()? {
                    bail!("the agent exited ({status}) before it was ready");
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the agent closed its log"),
        }
    }
    bail!("the agent was not ready within 60 s:\n{}", seen.join("\n"))
}

/// Prints confirmed events (one JSON object per line from the agent) as they come, briefly.
fn print_events(rx: &mpsc::Receiver<String>, verbose: bool, wait: Duration) {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(line) => println!("{}", pretty(&line, verbose)),
            Err(_) => {
                if Instant::now() >= deadline {
                    return;
                }
            }
        }
    }
}

/// The event's first `n` fixes, one line each: the id, the Service it patches and the patch (the
/// change an operator would apply with `kubectl clb-probe fix --apply`).
fn fix_lines(event: &serde_json::Value, n: usize) -> String {
    let Some(fixes) = event.get("fixes").and_then(|f| f.as_array()) else {
        return String::new();
    };
    fixes
        .iter()
        .take(n)
        .map(|f| {
            let text = |k: &str| f.get(k).and_then(|x| x.as_str()).unwrap_or("-");
            match f.get("patch") {
                Some(patch) => format!(
                    "  fix {} ({}): patch {} {patch}\n",
                    text("id"),
                    text("provider"),
                    text("service")
                ),
                None => format!(
                    "  fix {} ({}): {}\n",
                    text("id"),
                    text("provider"),
                    text("change")
                ),
            }
        })
        .collect()
}

/// One readable line per confirmed event and its first fix; verbose: its first three fixes,
/// then its JSON.
fn pretty(line: &str, verbose: bool) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        return line.to_string();
    };
    let s = |k: &str| match v.get(k) {
        None | Some(serde_json::Value::Null) => "-".to_string(),
        Some(x) => x.to_string().trim_matches('"').to_string(),
    };
    // IPv6 addresses in brackets before a port, as in a URL.
    let host = |k: &str| {
        let a = s(k);
        if a.contains(':') { format!("[{a}]") } else { a }
    };
    // Who made the local address local, and a host listener's socket, when the event has them.
    let owner = v.pointer("/facts/owner").and_then(|o| {
        let f = |k: &str| {
            o.get(k)
                .map(|x| x.to_string().trim_matches('"').to_string())
        };
        Some(match f("kind")?.as_str() {
            "local_route" => format!(
                " owner=local-route:proto {} ({}) dev {}",
                f("protocol")?,
                f("protocol_name")?,
                f("iface").unwrap_or_default()
            ),
            kind => format!(" owner={kind}:{}", f("iface").unwrap_or_default()),
        })
    });
    let listener = v.get("listener").filter(|l| !l.is_null()).map(|l| {
        let f = |k: &str| {
            l.get(k).map_or("-".to_string(), |x| {
                x.to_string().trim_matches('"').to_string()
            })
        };
        format!(
            " listener={} pid {} on {}:{}",
            f("process"),
            f("pid"),
            f("addr"),
            f("port")
        )
    });
    let mut summary = format!(
        "CONFIRMED {}: {}:{} -> {}:{} vip={}:{}",
        s("kind"),
        host("src"),
        s("src_port"),
        host("dst"),
        s("dst_port"),
        host("vip"),
        s("vip_port"),
    );
    // The rest as `label=field`, in the order the demo has always printed them.
    for (label, field) in [
        ("reason", "drop_reason"),
        ("snat", "snat"),
        ("outcome", "outcome"),
        ("count", "count"),
        ("pod", "client_pod"),
        ("service", "service"),
    ] {
        summary.push_str(&format!(" {label}={}", s(field)));
    }
    summary.push_str(&format!(
        "{}{}\n{}",
        owner.unwrap_or_default(),
        listener.unwrap_or_default(),
        fix_lines(&v, if verbose { 3 } else { 1 })
    ));
    let summary = summary.trim_end();
    if verbose {
        format!("{summary}\n  {line}")
    } else {
        summary.to_string()
    }
}

#[cfg(test)]
#[path = "demo_build_tests.rs"]
mod build_tests;

#[cfg(test)]
mod tests {
    use super::{fix_lines, pretty};

    #[test]
    fn an_event_is_one_line_and_its_first_fix_unless_verbose() {
        let line = r#"{"kind":"hairpin","src":"198.19.1.10","vip":"203.0.113.10","fixes":[{"id":"a","provider":"generic","change":"x"},{"id":"b","provider":"generic","change":"y"}]}"#;
        let short = pretty(line, false);
        assert_eq!(short.lines().count(), 2, "{short}");
        assert!(
            short.starts_with("CONFIRMED hairpin: 198.19.1.10:"),
            "{short}"
        );
        assert!(short.ends_with("  fix a (generic): x"), "{short}");
        let full = pretty(line, true);
        assert_eq!(full.lines().count(), 4, "{full}");
        assert!(full.ends_with(&format!("  {line}")), "{full}");
    }

    #[test]
    fn an_events_fixes_print_with_their_patch() {
        let event = serde_json::json!({"fixes": [
            {"id": "tencent-prevent-loopback", "provider": "tencentcloud", "change": "annotate",
             "service": "default/web",
             "patch": {"metadata": {"annotations": {"service.cloud.tencent.com/prevent-loopback": "true"}}}},
            {"id": "call-by-service-name", "provider": "generic", "change": "call the Service's name"}
        ]});
        assert_eq!(fix_lines(&event, 1).lines().count(), 1);
        let text = fix_lines(&event, 3);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.starts_with("  fix tencent-prevent-loopback (tencentcloud): patch default/web {")
                && text.contains("\"service.cloud.tencent.com/prevent-loopback\":\"true\""),
            "{text}"
        );
        assert!(text.contains("  fix call-by-service-name (generic): call the Service's name\n"));
        assert_eq!(fix_lines(&serde_json::json!({"kind": "hairpin"}), 3), "");
    }
}
