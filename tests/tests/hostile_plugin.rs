//! Issue 36's attacks on the kubectl plugin (rows E6, E17, E11, E16), against the in-process
//! fake API server (test_support::kubeapi: the real kube client on the wire). No root needed.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use probe_tests::{
    agent::{assert_contains, text},
    kube_fixture::{KubeFixture, node_object, plugin_bin},
};
use serde_json::{Value, json};

/// A bare API with the Node `node-a`, the node the agents' Events name.
fn api(tag: &str) -> KubeFixture {
    let a = KubeFixture::bare(&format!("hostile-plugin-{tag}"));
    a.apply(node("node-a"));
    a
}

/// [`api`] with [`web`].
fn api_with_web(tag: &str) -> KubeFixture {
    let a = api(tag);
    a.apply(web());
    a
}

/// `shop/web`: an ETP Local LoadBalancer (the `etp-cluster` fix applies to it).
fn web() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                 "healthCheckNodePort": 32000,
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10", "ipMode": "VIP"}]}},
    })
}

fn node(name: &str) -> Value {
    node_object(name, "aws:///eu-west-1a/i-0abc")
}

/// A hairpin Event about `shop/web` in the agents' shape, written in `ns` as `instance`.
fn hairpin_event(name: &str, ns: &str, instance: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": "2026-11-27T01:00:00.000000Z",
        "series": {"count": 3, "lastObservedTime": "2026-11-27T01:00:10.000000Z"},
        "type": "Warning", "action": "Detected", "reason": "LoopbackHairpin",
        "reportingController": "clb-probe", "reportingInstance": instance,
        "note": "cause. Remedy: fix",
        "regarding": {"apiVersion": "v1", "kind": "Service", "namespace": "shop", "name": "web"},
        "related": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "client-0"},
    })
}

/// E6: a tenant with `create events` in its own namespace writes a clb-probe-shaped Event
/// about another team's Service (and one naming no Node in the Service's namespace, as
/// whoever holds a stolen token there could): `fix` confirms nothing and `--apply` patches
/// nothing. The agents' own Event (the Service's namespace, a real Node) still confirms.
#[test]
fn a_forged_event_confirms_nothing_and_applies_nothing() {
    let a = api_with_web("forged");
    a.apply(hairpin_event("clb-probe.forged.1", "tenant", "node-a"));
    a.apply(hairpin_event("clb-probe.forged.2", "shop", "node-z"));
    let out = a.run(&["fix", "-n", "shop", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_contains(
        &text(&out.stdout),
        "no confirmed loopback regards this Service",
    );
    let out = a.run_words("fix -n shop web --apply etp-cluster --yes");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(a.stored_etp("web"), "Local");
    assert!(
        !a.requests().iter().any(|r| r.method == "PATCH"),
        "no patch, not even a dry run"
    );

    // The twin: the agent's own Event.
    a.apply(hairpin_event("clb-probe.node-a.1", "shop", "node-a"));
    let out = a.run(&["fix", "-n", "shop", "web"]);
    assert_contains(&text(&out.stdout), "confirmed: hairpin");
}

/// Runs the plugin on a terminal (util-linux `script` gives it a pty), typing `answer`.
fn on_a_terminal(a: &KubeFixture, args: &[&str], answer: &str) -> (bool, String) {
    let cmd = std::iter::once(plugin_bin().display().to_string())
        .chain(["--kubeconfig".into(), a.kubeconfig().to_string()])
        .chain(args.iter().map(|s| s.to_string()))
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    // The answer waits in the terminal's input until the plugin reads it; stdin stays open
    // until the plugin exits, so `script` never passes it an end of input first (no race
    // with a slow dry run).
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(answer.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    (out.status.success(), text(&out.stdout))
}

/// E17: `--apply` shows the dry run and asks; only a yes applies. Without a terminal and
/// without `--yes` it refuses (`kubectl_plugin.rs` checks that); the listing's `apply:` line
/// carries the version it was listed at.
#[test]
fn apply_asks_and_only_yes_applies() {
    let a = api_with_web("confirm");
    a.apply(hairpin_event("clb-probe.node-a.1", "shop", "node-a"));
    let out = a.run(&["fix", "-n", "shop", "web"]);
    let listing = text(&out.stdout);
    let rv = a
        .objects("Service")
        .iter()
        .find_map(|s| s["metadata"]["resourceVersion"].as_str().map(String::from))
        .unwrap();
    assert!(
        listing.contains(&format!(
            "apply: kubectl clb-probe fix -n shop web --apply etp-cluster --resource-version {rv}"
        )),
        "{listing}"
    );
    let apply = ["fix", "-n", "shop", "web", "--apply", "etp-cluster"];
    let (ok, shown) = on_a_terminal(&a, &apply, "n\n");
    assert!(!ok, "{shown}");
    assert_contains(&shown, "\"Local\" -> \"Cluster\"");
    assert_contains(&shown, "[y/N]");
    assert_eq!(a.stored_etp("web"), "Local");
    let (ok, shown) = on_a_terminal(&a, &apply, "y\n");
    assert!(ok, "{shown}");
    assert_eq!(a.stored_etp("web"), "Cluster");
}

/// Raw terminal controls in `s`: ESC, BEL, C1 (U+0080..U+009F), bidi overrides and isolates.
fn raw_controls(s: &str) -> usize {
    s.chars()
        .filter(|c| {
            matches!(c, '\x1b' | '\x07' | '\u{80}'..='\u{9f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .count()
}

/// E11: a tenant's annotation value with a C1 CSI and a bidi override reaches the operator's
/// terminal through `fix`'s dry-run diff and the undo it prints: escaped there; `-o json`
/// stays byte-exact.
#[test]
fn annotation_values_with_terminal_controls_are_printed_escaped() {
    let a = api("annotations");
    let mut svc = web();
    // The AWS Load Balancer Controller's NLB: its own fixes are offered.
    svc["spec"]["loadBalancerClass"] = json!("service.k8s.aws/nlb");
    svc["metadata"]["annotations"] = json!({
        "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "\u{9b}2J\u{202e}ecnatsni",
    });
    a.apply(svc);
    a.apply(hairpin_event("clb-probe.node-a.1", "shop", "node-a"));
    let out = a.run_words("fix -n shop web --apply aws-nlb-target-type-ip --dry-run");
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    assert_contains(&shown, "aws-load-balancer-nlb-target-type");
    assert_eq!(raw_controls(&shown), 0, "{shown:?}");
    assert_contains(&shown, "\\u{9b}2J\\u{202e}ecnatsni");
    let listing = a.run(&["fix", "-n", "shop", "web"]);
    assert_eq!(raw_controls(&text(&listing.stdout)), 0);
}

/// E16: a faulty API server or proxy answers with an error Status whose `message` carries
/// OSC and CSI sequences: the plugin's error line shows them escaped.
#[test]
fn an_error_status_with_terminal_controls_is_printed_escaped() {
    use std::io::{BufRead as _, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        // Every request gets the same 500 Status (the plugin may retry or page).
        for _ in 0..4 {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31mALL CLEAR", "code": 500,
                "reason": "InternalError"})
            .to_string();
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let dir = tempfile_dir();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: bad\n\
             clusters:\n- name: bad\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: bad\n  context:\n    cluster: bad\n    user: bad\n\
             users:\n- name: bad\n  user:\n    token: t\n"
        ),
    )
    .unwrap();
    let out = Command::new(plugin_bin())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("events")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_contains(&err, "ALL CLEAR");
    assert_eq!(raw_controls(&err), 0, "{err:?}");
    assert_contains(&err, "\\x1b]0;pwned\\x07");
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// A fresh directory under the system's temp dir.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("clb-hostile-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An Event another controller wrote (the kubelet about a Pod), about 1 KB as real ones are.
fn other_event(i: usize) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": format!("pod-{i}.17a0c0de{i:08x}"), "namespace": format!("team-{}", i % 50)},
        "eventTime": "2026-11-27T01:00:00.000000Z",
        "type": "Normal", "action": "Pulling", "reason": "Pulled",
        "reportingController": "kubelet", "reportingInstance": format!("node-{}", i % 20),
        "note": format!("Successfully pulled image \"registry.example/team/app:{i}\" in 1.2s (1.2s including waiting). Image size: 123456789 bytes. {}", "x".repeat(700)),
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": format!("team-{}", i % 50), "name": format!("pod-{i}"), "fieldPath": "spec.containers{app}"},
    })
}

/// The data (heap) the plugin may use in the E15 test: a few pages of Events, far from the
/// 100,000 (800 MiB in a debug build) it held before.
const PLUGIN_DATA_LIMIT: u64 = 128 << 20;

/// Runs the plugin with its data segment limited to [`PLUGIN_DATA_LIMIT`] (RLIMIT_DATA: an
/// allocation past it fails, and the plugin aborts), under GNU time when there is one:
/// (success, stdout, stderr, peak RSS in KiB as time measured it, or 0).
fn run_within_data_limit(a: &KubeFixture, args: &[&str]) -> (bool, String, String, u64) {
    use std::os::unix::process::CommandExt as _;
    let gnu_time = std::path::Path::new("/usr/bin/time");
    let rss_file =
        std::env::temp_dir().join(format!("clb-hostile-plugin-rss-{}", std::process::id()));
    let mut cmd = if gnu_time.exists() {
        let mut cmd = Command::new(gnu_time);
        cmd.args(["-f", "%M", "-o"])
            .arg(&rss_file)
            .arg(plugin_bin());
        cmd
    } else {
        Command::new(plugin_bin())
    };
    cmd.arg("--kubeconfig")
        .arg(a.kubeconfig())
        .args(args)
        .env_remove("KUBECONFIG");
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: PLUGIN_DATA_LIMIT,
                rlim_max: PLUGIN_DATA_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run kubectl-clb_probe");
    let rss = std::fs::read_to_string(&rss_file)
        .ok()
        .and_then(|t| t.lines().last().and_then(|l| l.trim().parse().ok()))
        .unwrap_or(0);
    let _ = std::fs::remove_file(&rss_file);
    (
        out.status.success(),
        text(&out.stdout),
        text(&out.stderr),
        rss,
    )
}

/// E15: a busy cluster holds 100,000 Events of other controllers. `events` asks the API
/// server for clb-probe's only (fieldSelector `reportingController=clb-probe`, pages of at
/// most 500), and `fix` for the Service's only, in the Service's namespace (no cluster-wide
/// `list events`); neither holds the others (the plugin runs with 128 MiB of data at most).
#[test]
fn a_hundred_thousand_other_events_are_neither_fetched_nor_held() {
    let a = api_with_web("busy");
    for i in 0..100_000 {
        a.apply(other_event(i));
    }
    a.apply(hairpin_event("clb-probe.node-a.1", "shop", "node-a"));
    let before = a.requests().len();

    let (ok, shown, err, events_kib) = run_within_data_limit(&a, &["events"]);
    eprintln!("events: peak RSS {events_kib} KiB");
    assert!(ok, "{shown}{err}");
    assert_contains(&shown, "shop/web");
    assert_eq!(
        shown.lines().count(),
        2,
        "the header and the one row: {shown}"
    );
    let (ok, shown, err, fix_kib) = run_within_data_limit(&a, &["fix", "-n", "shop", "web"]);
    eprintln!("fix: peak RSS {fix_kib} KiB");
    assert!(ok, "{shown}{err}");
    assert_contains(&shown, "confirmed: hairpin");

    let lists: Vec<String> = a.requests()[before..]
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/apis/events.k8s.io/v1/"))
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(lists.len(), 2, "one page each: {lists:#?}");
    for path in &lists {
        assert_contains(path, "reportingController%3Dclb-probe");
        assert_contains(path, "limit=500");
    }
    assert!(
        lists[0].starts_with("/apis/events.k8s.io/v1/events?"),
        "{}",
        lists[0]
    );
    assert!(
        lists[1].starts_with("/apis/events.k8s.io/v1/namespaces/shop/events?")
            && lists[1].contains("regarding.name%3Dweb"),
        "{}",
        lists[1]
    );
}

/// E15, the pages: 1,100 of the agents' Events in `shop` come in three pages of at most 500,
/// every one listed once; `events -n shop` asks in `shop` only.
#[test]
fn the_agents_events_are_read_page_by_page_in_the_namespace_given() {
    let a = api("pages");
    for i in 0..1_100 {
        a.apply(hairpin_event(
            &format!("clb-probe.node-a.{i:04}"),
            "shop",
            "node-a",
        ));
    }
    a.apply(hairpin_event(
        "clb-probe.node-a.elsewhere",
        "other",
        "node-a",
    ));
    let out = a.run(&["events", "-n", "shop", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!((rows.len(), names.len()), (1_100, 1_100));
    assert!(rows.iter().all(|r| r["namespace"] == "shop"));
    let pages: Vec<String> = a
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/apis/events.k8s.io/"))
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(pages.len(), 3, "{pages:#?}");
    assert!(
        pages
            .iter()
            .all(|p| p.starts_with("/apis/events.k8s.io/v1/namespaces/shop/events?")),
        "{pages:#?}"
    );
}
