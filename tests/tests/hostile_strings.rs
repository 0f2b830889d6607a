//! Issue #36, the hostile-user pass round 3: strings a tenant or a local user controls, bounded
//! and escaped on their way to every output (rows E2 and E8).
//!
//! - E2: a tenant's 250 KB annotation on its own LoadBalancer Service, then calls to ports of
//!   its LB IP that nothing serves: the annotation must not be copied into every event (the
//!   events' JSON lines stay small; the agent's peak RSS is printed for the record);
//! - E8: an unprivileged user (uid 65534) runs the host listener of a hairpinned port under a
//!   process name that clears the screen (`ESC[2J ALL CLEAR BEL`): no raw control character
//!   reaches the events, the Node condition, the Event notes or the LoopbackReport, and the
//!   notes name a host process (and the node as the node, not as a pod).
//!
//! Root only (each test prints a skip line otherwise); they share the lab: one at a time.

use std::{
    net::{IpAddr, SocketAddrV4},
    process::{Command, Stdio},
    time::Duration,
};

use probe_contract::{LoopbackEvent, LoopbackKind};
use probe_tests::{
    agent::{KilledOnDrop, sh_in_node, wait_for},
    kube_fixture::{KubeFixture, NODE_NAME},
};
use serde_json::{Value, json};
use test_support::{
    kubeapi::fixtures,
    lab::{self, LabGuard, Scenario, Variants},
};

const WAIT: Duration = Duration::from_secs(45);

/// What a terminal acts on: C0 controls and DEL, C1 controls, bidirectional overrides and
/// isolates (the set `term::escape` writes visibly).
fn hostile(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Every string in `v` that holds a hostile character, with its JSON path.
fn raw_strings(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.chars().any(hostile) => out.push(format!("{path}: {s:?}")),
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                raw_strings(x, &format!("{path}[{i}]"), out);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                raw_strings(x, &format!("{path}.{k}"), out);
            }
        }
        _ => {}
    }
}

fn raw_in(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    raw_strings(v, "", &mut out);
    out
}

/// The agent's peak resident set (`VmHWM`), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

// ----- E2: a tenant's huge annotation ----------------------------------------------------

/// The annotation's size: under the API server's 256 KiB limit on all of an object's
/// annotations together, as a tenant can write it.
const HUGE: usize = 250_000;
/// Distinct unserved ports called: one aggregate (one JSON line) each.
const PORTS: u16 = 40;

/// `default/web` (the LB of the lab's VIP) with the tenant's annotations: a 250 KB value on an
/// annotation the agent shows (Tencent's loop guard, one of the loopback annotations) and one
/// on a key of its own.
fn lab_objects_with_huge_annotations() -> Vec<Value> {
    let mut objects = fixtures::lab();
    let web = objects
        .iter_mut()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "web")
        .expect("the lab's default/web");
    let annotations = web["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations");
    annotations.insert(
        "service.cloud.tencent.com/prevent-loopback".into(),
        json!("x".repeat(HUGE)),
    );
    annotations.insert("tenant.example.com/blob".into(), json!("y".repeat(HUGE)));
    objects
}

/// E2: every event of the tenant's LB IP carried the 250 KB value twice (the evidence's
/// "settings" and `facts.service.annotations`): 504 KB per JSON line. Now only the annotations
/// the product reads are kept, each value at most 256 bytes (cut visibly).
#[test]
fn a_tenant_s_huge_annotation_is_not_copied_into_every_event() {
    let Some(lab) = LabGuard::for_test("hostile_strings_huge_annotation", &Variants::default())
    else {
        return;
    };
    let api = KubeFixture::builder()
        .tag("huge-annotation")
        .objects(lab_objects_with_huge_annotations())
        .start();
    let mut agent = api.start_agent(&["--kube-events", "off"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    // The VIP bound on the node (the scenario's variant), then the tenant's calls.
    lab.traffic(Scenario::VipPortUnserved).expect("traffic");
    for port in 0..PORTS {
        let _ = lab::connect_in(
            lab::NS_POD_A,
            None,
            SocketAddrV4::new(lab::VIP, 2001 + port),
            Duration::from_millis(500),
        );
    }
    // Most of the ports, each named by its Service (a connect the loaded machine lost is no
    // matter here: the size of each line is).
    let events = wait_for("the unserved ports confirmed and named", WAIT, || {
        let es: Vec<LoopbackEvent> = agent
            .events()
            .into_iter()
            .filter(|e| e.kind == LoopbackKind::VipPortUnserved && e.facts.service.is_some())
            .collect();
        (es.len() >= usize::from(PORTS) * 3 / 4).then_some(es)
    })
    .unwrap_or_else(|| {
        let all = agent.events();
        let named = all.iter().filter(|e| e.facts.service.is_some()).count();
        panic!(
            "too few ports confirmed with their Service: {} events, {named} named; the first: {:#?}",
            all.len(),
            all.first()
        )
    });
    let sizes: Vec<usize> = events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap().len())
        .collect();
    let largest = sizes.iter().max().copied().unwrap_or(0);
    let total: usize = sizes.iter().sum();
    eprintln!(
        "E2: {} events, largest JSON line {largest} bytes, {total} bytes in all; agent peak RSS {} KiB",
        events.len(),
        peak_rss_kib(agent.pid())
    );
    assert!(
        largest < 16 * 1024,
        "a JSON line of {largest} bytes: the tenant's annotation is copied into the event"
    );
    // What the event says of the annotation: its key, and the value cut with a marker.
    let e = &events[0];
    let annotations = &e
        .facts
        .service
        .as_ref()
        .expect("the loopback annotations")
        .annotations;
    let (_, value) = annotations
        .iter()
        .find(|(key, _)| key == "service.cloud.tencent.com/prevent-loopback")
        .unwrap_or_else(|| panic!("the guard annotation named: {e:#?}"));
    assert!(
        value.len() <= 300 && value.contains("cut"),
        "bounded, marked as cut: {value:?}"
    );
    assert!(
        !serde_json::to_string(e)
            .unwrap()
            .contains("tenant.example.com/blob"),
        "an annotation the product does not read is not kept"
    );
    drop(agent);
    drop(api);
    drop(lab);
}

// ----- E8: a host listener named with terminal escapes ------------------------------------

/// What uid 65534 names its listener: CSI clear screen, the all-clear, BEL (15 bytes: the
/// kernel's limit on a command name).
const HOSTILE_NAME: &str = "\x1b[2J ALL CLEAR\x07";

/// The host listener run by uid 65534 under [`HOSTILE_NAME`] (`prctl(PR_SET_NAME)`), killed on
/// drop (the lab's teardown would kill it too: it lives in the node's namespace).
struct HostileListener(#[allow(dead_code)] KilledOnDrop);

impl HostileListener {
    fn start() -> HostileListener {
        let script = format!(
            r#"
import ctypes, socket
ctypes.CDLL(None).prctl(15, {name}, 0, 0, 0)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port}))
s.listen(128)
while True:
    c, _ = s.accept()
    c.close()
"#,
            name = "b'\\x1b[2J ALL CLEAR\\x07'",
            port = lab::HOST_LISTENER_PORT
        );
        let child = Command::new("ip")
            .args(["netns", "exec", lab::NS_NODE, "setpriv"])
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["/usr/bin/python3", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .expect("start the hostile listener");
        let pid = child.id();
        let listener = HostileListener(KilledOnDrop(child));
        wait_for("the hostile listener named and listening", WAIT, || {
            let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
            (comm.starts_with(HOSTILE_NAME.as_bytes()) && listening_pid().is_some()).then_some(())
        })
        .expect("the hostile listener up");
        listener
    }
}

/// The pid listening on the host listener's port in the node, per `ss -p`.
fn listening_pid() -> Option<u32> {
    let out = sh_in_node(&[
        "ss",
        "-Hltnp",
        &format!("sport = :{}", lab::HOST_LISTENER_PORT),
    ]);
    let at = out.find("pid=")? + 4;
    out[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The lab's own host listener (a python3 server) stopped, so the hostile one takes its port.
fn stop_the_lab_s_host_listener() {
    let pid = listening_pid().expect("the lab's host listener");
    // SAFETY: signalling a process of the lab's (the node namespace's server).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for("the lab's host listener gone", WAIT, || {
        listening_pid().is_none().then_some(())
    })
    .expect("the lab's host listener stopped");
}

fn clb_events(api: &KubeFixture) -> Vec<Value> {
    api.objects("events")
        .into_iter()
        .filter(|e| e["reportingController"] == "clb-probe")
        .collect()
}

fn node_condition(api: &KubeFixture) -> Option<Value> {
    api.node_condition(NODE_NAME, "LoadBalancerLoopback")
}

fn report(api: &KubeFixture) -> Option<Value> {
    api.objects("loopbackreports")
        .into_iter()
        .find(|o| o["metadata"]["name"] == NODE_NAME)
}

/// E8: the listener's name reached the condition, the Event notes and the report raw
/// (`kubectl describe node` then cleared the operator's screen), and the node-sourced note
/// called the node "Pod". Now the name is escaped where it is read (`\x1b[2J ALL CLEAR\x07`),
/// every output carries that form, and the notes name the host process and the node.
#[test]
fn a_host_listener_named_with_escapes_reaches_no_output_raw() {
    let Some(lab) = LabGuard::for_test("hostile_strings_listener_name", &Variants::default())
    else {
        return;
    };
    stop_the_lab_s_host_listener();
    let listener = HostileListener::start();
    let api = KubeFixture::lab();
    let mut agent = api.start_agent(&["--node-report", "on", "--node-condition", "on"]);
    agent.wait_log("Kubernetes attribution connected", WAIT);
    // A pod's call and the node's own call, each to the LB listener whose target is the
    // hostile host listener.
    lab.traffic(Scenario::HairpinHostListener).expect("traffic");
    lab.traffic(Scenario::HairpinHostListenerNodeSourced)
        .expect("traffic");
    let events = wait_for("both host-listener hairpins", WAIT, || {
        let es: Vec<LoopbackEvent> = agent
            .events()
            .into_iter()
            .filter(|e| e.kind == LoopbackKind::Hairpin && e.listener.is_some())
            .collect();
        let from_node = es.iter().any(|e| e.src == IpAddr::V4(lab::NODE_IP));
        let from_pod = es.iter().any(|e| e.src == IpAddr::V4(lab::POD_A_IP));
        (from_node && from_pod).then_some(es)
    })
    .unwrap_or_else(|| panic!("no host-listener hairpins: {:#?}", agent.events()));
    let notes = wait_for("an Event for each", WAIT, || {
        let notes: Vec<Value> = clb_events(&api)
            .into_iter()
            .filter(|e| e["reason"] == "LoopbackHairpin")
            .collect();
        (notes.len() >= 2).then_some(notes)
    })
    .unwrap_or_else(|| panic!("Events: {:#?}", clb_events(&api)));
    let condition = wait_for("the Node condition on the loop", WAIT, || {
        node_condition(&api).filter(|c| c["reason"] == "Hairpin")
    })
    .unwrap_or_else(|| panic!("condition: {:#?}", node_condition(&api)));
    let written = wait_for("the report with the loops", WAIT, || {
        report(&api).filter(|r| r["status"]["activeLoopCount"].as_u64() >= Some(2))
    })
    .unwrap_or_else(|| panic!("report: {:#?}", report(&api)));

    let mut raw = Vec::new();
    // Every string of each event, wherever it is (the whole line, not a field).
    for e in &events {
        let line = serde_json::to_value(e).unwrap();
        raw.extend(raw_in(&line).into_iter().map(|r| format!("event {r}")));
    }
    for e in &notes {
        raw.extend(raw_in(e).into_iter().map(|r| format!("Event {r}")));
    }
    raw.extend(
        raw_in(&condition)
            .into_iter()
            .map(|r| format!("condition {r}")),
    );
    raw.extend(raw_in(&written).into_iter().map(|r| format!("report {r}")));
    eprintln!("E8: {} raw strings: {raw:#?}", raw.len());
    eprintln!("E8: condition message: {}", condition["message"]);
    for e in &notes {
        eprintln!("E8: note: {}", e["note"]);
    }
    assert!(
        raw.is_empty(),
        "raw control characters reach the outputs: {raw:#?}"
    );

    let escaped = "\\x1b[2J ALL CLEAR\\x07";
    for e in &events {
        let process = e.listener.as_ref().and_then(|l| l.process.as_deref());
        assert_eq!(process, Some(escaped), "{e:#?}");
    }
    assert!(
        condition["message"].as_str().unwrap().contains(escaped),
        "{condition:#}"
    );
    for e in &notes {
        let note = e["note"].as_str().unwrap();
        assert!(note.contains(&format!("host process {escaped}")), "{note}");
    }
    let node_ip = lab::NODE_IP.to_string();
    let from_node = notes
        .iter()
        .map(|e| e["note"].as_str().unwrap())
        .find(|n| n.contains(&format!("({node_ip})")) || n.contains(&format!(" {node_ip} called")))
        .unwrap_or_else(|| panic!("a note of the node's own call: {notes:#?}"));
    assert!(
        !from_node.contains(&format!("Pod {node_ip}")),
        "the node called a pod: {from_node}"
    );
    drop(agent);
    drop(api);
    drop(listener);
    drop(lab);
}
