//! The VM tier's own test: kube-proxy's IPVS mode for real (a `dummy` kube-ipvs0, IPVS virtual
//! services, kube-proxy's ipsets and nat rules) on the VM's older kernel, with the real agent
//! reading IPVS over generic netlink as its service table. Each failure must be confirmed, each
//! healthy twin must stay silent.
//!
//! Runs only inside `cargo xtask vm-test` (`CLB_VM` set; it prints a skip line elsewhere).
//! Prints the kernel, `ipvsadm -Ln` and each scenario's verdict. With `CLB_VM_RESULTS` set it
//! also writes what it saw there (`streams/<name>/`: the agent's recorded kernel events, the
//! service table, the egress records the agent looked up, the confirmed events) for
//! `probe-core/tests/data/streams/`.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use probe_contract::{
    Layer, LoopbackEvent, LoopbackKind, Outcome as Fate, Proto, SnatState,
    check::Kind as CheckKind, record::KernelEvent,
};
use probe_tests::{
    agent::{
        Agent, KilledOnDrop, assert_ipvs_source_ranges_drop, dropped_as_local_source, hex_bytes,
        lines, our_loaded_programs, our_tc_attachments, probe_bin, require_root, sh, sh_in_node,
        wait_for,
    },
    kube_fixture::{
        KubeFixture, assert_unprogrammed_port_named, lab_objects_with_unprogrammed_port,
    },
    lab_check::{lab_node_report, lab_node_subjects},
    say,
};
use serde_json::{Value, json};
use test_support::lab::{self, KubeProxyMode, LabGuard, Outcome, Scenario, UpOptions, Variants};

/// Long enough for the hairpin's settle window and its conntrack answer.
const SETTLE: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(15);

/// On a kernel without IPVS or `dummy` (this machine's), the IPVS-mode lab refuses to start,
/// says why and where to run it, and makes nothing.
#[test]
fn ipvs_mode_fails_clearly_without_ipvs() {
    if std::env::var_os("CLB_VM").is_some() || !require_root("ipvs_mode_fails_clearly") {
        return;
    }
    if std::path::Path::new("/proc/net/ip_vs").exists()
        && std::path::Path::new("/sys/module/dummy").exists()
    {
        eprintln!("skipping ipvs_mode_fails_clearly: this kernel has IPVS and dummy");
        return;
    }
    // The lab's lock held: another test's lab going up or down meanwhile is not ours.
    let _lock = lab::LabLock::acquire().expect("the lab's lock");
    let before = lab::leftovers().unwrap();
    let err = lab::Lab::up_in(
        KubeProxyMode::Ipvs,
        &Variants::default(),
        &UpOptions::default(),
    )
    .expect_err("no IPVS here");
    let msg = format!("{err:#}");
    eprintln!("{msg}");
    assert!(msg.contains("CLB_LAB_MODE=ipvs"), "{msg}");
    assert!(msg.contains("vm-test"), "{msg}");
    assert!(msg.contains("IPVS") || msg.contains("dummy"), "{msg}");
    assert_eq!(lab::leftovers().unwrap(), before, "nothing made");
}

/// Where this run's recordings go (`$CLB_VM_RESULTS/streams`), if anywhere.
fn results_dir() -> Option<PathBuf> {
    std::env::var_os("CLB_VM_RESULTS").map(|d| PathBuf::from(d).join("streams"))
}

fn write_jsonl(path: &std::path::Path, rows: &[Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// EGRESS_FLOWS as `EgressRecord`s (key: addr[16] port u16 proto family; value: daddr[16]
/// dport u16 pad[2] ifindex u32 ts_ns u64), IPv4 only.
fn egress_records() -> Vec<Value> {
    let dump = sh(&["bpftool", "-j", "map", "dump", "name", "EGRESS_FLOWS"]);
    let entries: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
    let ip = |b: &[u8]| format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]);
    entries
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let k = hex_bytes(e.get("key"));
            let v = hex_bytes(e.get("value"));
            if k.len() < 20 || v.len() < 32 {
                return None;
            }
            Some(serde_json::json!({
                "src": ip(&k[..4]),
                "sport": u16::from_le_bytes([k[16], k[17]]),
                "dst": ip(&v[..4]),
                "dport": u16::from_le_bytes([v[16], v[17]]),
                "proto": if k[18] == 6 { "tcp" } else { "udp" },
                "ts_ns": u64::from_le_bytes(v[24..32].try_into().unwrap()),
                "nic": lab::NODE_NIC,
            }))
        })
        .collect()
}

/// `probe services` in the node namespace: the service table the agent reads.
fn services_json() -> String {
    let probe = probe_bin();
    sh_in_node(&[probe.to_str().unwrap(), "services"])
}

struct Run<'a> {
    agent: &'a Agent,
    lab: &'a LabGuard,
    services: String,
    failures: Vec<String>,
}

/// The IPVS-mode lab with `variants` set.
fn ipvs_lab(variants: &Variants) -> LabGuard {
    LabGuard::up_in(KubeProxyMode::Ipvs, variants, &UpOptions::default()).expect("IPVS-mode lab up")
}

/// The agent on the lab's node, on its NIC, reading the service table.
fn ipvs_agent() -> Agent {
    Agent::on_node_nic_with_table(&[])
}

impl<'a> Run<'a> {
    /// A run with no failures yet; `services` is `probe services`' JSON.
    fn new(agent: &'a Agent, lab: &'a LabGuard, services: String) -> Self {
        Run {
            agent,
            lab,
            services,
            failures: Vec::new(),
        }
    }

    /// Fails the test with every failure the run noted, if any.
    fn assert_no_failures(mut self) {
        let failures = std::mem::take(&mut self.failures);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// The aggregates `after` has that `before` had not, by `key` (the latest line of each). An
/// aggregate is written again, with a higher count, when its repeats span more than 10 s
/// (SYN retransmits on a loaded machine): a repeat line of an earlier scenario's aggregate
/// may land in any later scenario's window, so scenarios are judged by new keys, not lines.
fn new_aggregates(before: &[LoopbackEvent], after: &[LoopbackEvent]) -> Vec<LoopbackEvent> {
    let old: std::collections::HashSet<&str> = before.iter().map(|e| e.key.as_str()).collect();
    let mut fresh: Vec<LoopbackEvent> = Vec::new();
    for e in after.iter().filter(|e| !old.contains(e.key.as_str())) {
        match fresh.iter_mut().find(|f| f.key == e.key) {
            Some(f) => *f = e.clone(),
            None => fresh.push(e.clone()),
        }
    }
    fresh
}

impl Run<'_> {
    /// Drives `scenario`; returns the aggregates it added and the new kernel records.
    fn drive(
        &mut self,
        scenario: Scenario,
    ) -> (
        Outcome,
        Vec<LoopbackEvent>,
        Vec<KernelEvent>,
        Vec<LoopbackEvent>,
    ) {
        let (events_before, records_before) = (self.agent.events(), self.agent.records().len());
        let report = self.lab.run(scenario).expect("traffic");
        std::thread::sleep(SETTLE);
        let events = new_aggregates(&events_before, &self.agent.events());
        let records = self.agent.records()[records_before..].to_vec();
        if report.outcome() != report.expected {
            self.failures.push(format!("{report}"));
        }
        (report.outcome(), events, records, events_before)
    }

    fn failure(
        &mut self,
        scenario: Scenario,
        name: &str,
        kind: LoopbackKind,
        check: impl Fn(&LoopbackEvent),
    ) {
        let kind_name = kind.as_str();
        let (outcome, mut events, mut records, before) = self.drive(scenario);
        if events.is_empty() {
            // The agent may still be deciding (the hairpin waits for its conntrack answer).
            std::thread::sleep(WAIT);
            events = new_aggregates(&before, &self.agent.events());
            records = self.agent.records();
        }
        let verdict = match events.as_slice() {
            [e] if e.kind == kind => {
                check(e);
                // Spelled as the JSON line spells them.
                format!(
                    "confirmed {kind_name} ({} at {}, outcome {}, service {}, count {})",
                    json!(e.drop_reason),
                    json!(e.drop_location),
                    json!(e.outcome),
                    json!(e.service),
                    e.count
                )
            }
            other => {
                self.failures.push(format!(
                    "{scenario}: expected one new {kind_name} aggregate, got {}",
                    serde_json::to_string_pretty(other).unwrap()
                ));
                "NOT CONFIRMED".to_string()
            }
        };
        say!("ipvs-vm: {scenario}: client {outcome}; {verdict}");
        if let Some(dir) = results_dir() {
            let dir = dir.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let records: Vec<Value> = records.iter().map(|r| json!(r)).collect();
            write_jsonl(&dir.join("events.jsonl"), &records);
            let confirmed: Vec<Value> = events.iter().map(|e| json!(e)).collect();
            write_jsonl(&dir.join("confirmed.jsonl"), &confirmed);
            std::fs::write(dir.join("services.json"), &self.services).unwrap();
            let answers = serde_json::json!({ "egress": egress_records(), "conntrack": [] });
            std::fs::write(
                dir.join("answers.json"),
                serde_json::to_string_pretty(&answers).unwrap(),
            )
            .unwrap();
        }
    }

    fn twin(&mut self, scenario: Scenario) {
        let (outcome, events, _, _) = self.drive(scenario);
        let verdict = if events.is_empty() {
            "no event".to_string()
        } else {
            self.failures.push(format!(
                "{scenario}: healthy twin reported: {}",
                serde_json::to_string_pretty(&events).unwrap()
            ));
            format!("WRONGLY REPORTED {} aggregate(s)", events.len())
        };
        say!("ipvs-vm: {scenario} (twin): client {outcome}; {verdict}");
    }
}

/// What the agent left after its exit (it was stopped with SIGTERM): our programs attached or
/// loaded, a clsact qdisc on the node's NIC. Programs are freed shortly after their last fd
/// closes, so this waits a little for them.
fn left_behind() -> Vec<String> {
    let gone = wait_for("programs freed", Duration::from_secs(10), || {
        (our_tc_attachments().is_empty() && our_loaded_programs().is_empty()).then_some(())
    });
    let qdiscs = sh_in_node(&["tc", "qdisc", "show", "dev", lab::NODE_NIC]);
    let clsact = qdiscs.contains("clsact");
    say!(
        "ipvs-vm: after the agent's exit: attached {:?}, loaded {:?}, clsact on {}: {clsact}",
        our_tc_attachments(),
        our_loaded_programs(),
        lab::NODE_NIC
    );
    let mut failures = Vec::new();
    if gone.is_none() {
        failures.push(format!(
            "left after exit: attached {:?}, loaded {:?}",
            our_tc_attachments(),
            our_loaded_programs()
        ));
    }
    if clsact {
        failures.push(format!("the agent's clsact qdisc is left: {qdiscs}"));
    }
    failures
}

/// IPVS as the service table: health-check blackhole (NodePort named from IPVS), hairpin
/// (pod -> unbound VIP -> back through the LB; and under strict rp_filter), unserved VIP port
/// (no virtual service for VIP:443), each confirmed once; every twin silent.
#[test]
fn ipvs_mode_failures_are_confirmed_and_twins_are_silent() {
    if !lab::require_vm("ipvs_mode_failures") {
        return;
    }
    say!("ipvs-vm: kernel {}", sh(&["uname", "-r"]).trim());
    let lab = ipvs_lab(&Variants::default());
    assert_eq!(lab.mode().unwrap(), KubeProxyMode::Ipvs);
    let exec = |args: &[&str]| {
        let mut v = vec!["ip", "netns", "exec", lab::NS_NODE];
        v.extend_from_slice(args);
        sh(&v)
    };
    say!("ipvs-vm: ipvsadm -Ln:\n{}", exec(&["ipvsadm", "-Ln"]));
    let link = exec(&["ip", "-d", "link", "show", lab::KUBE_IPVS0]);
    assert!(link.contains("dummy"), "{link}");
    let services = services_json();
    let table: Value = serde_json::from_str(&services).expect("probe services prints JSON");
    assert_eq!(
        table["source"], "ipvs",
        "service table from IPVS: {table:#}"
    );
    let served: Vec<String> = table["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{}:{}", s["vip"].as_str().unwrap(), s["port"]))
        .collect();
    for vs in KubeProxyMode::Ipvs.virtual_services(true) {
        assert!(
            served.contains(&vs.to_string()),
            "{vs} in {served:?}: {table:#}"
        );
    }

    let agent = ipvs_agent();
    let mut run = Run::new(&agent, &lab, services);

    run.failure(
        Scenario::HealthcheckBlackhole,
        "healthcheck-blackhole",
        LoopbackKind::HealthcheckBlackhole,
        |e| {
            assert_eq!(e.src, IpAddr::V4(lab::VIP));
            assert_eq!(e.dst, IpAddr::V4(lab::NODE_IP));
            assert_eq!(e.dst_port, lab::NODE_PORT);
            assert_eq!(e.outcome, Fate::Dropped);
            assert!(dropped_as_local_source(e), "{e:#?}");
            let ev = lines(&e.evidence);
            assert!(
                ev.contains("service table (IPVS): NodePort 30080/tcp"),
                "{e:#?}"
            );
        },
    );
    run.twin(Scenario::HealthcheckOk);
    run.twin(Scenario::OutsideClientVipBound);

    run.failure(
        Scenario::VipPortUnserved,
        "vip-port-unserved",
        LoopbackKind::VipPortUnserved,
        |e| {
            assert_eq!(e.vip, Some(IpAddr::V4(lab::VIP)));
            assert_eq!(e.vip_port, Some(lab::VIP_UNSERVED_PORT));
            assert_eq!(e.drop_reason.as_deref(), Some("NO_SOCKET"));
            assert_eq!(e.outcome, Fate::Refused);
            let ev = lines(&e.evidence);
            assert!(ev.contains("(IPVS)"), "judged on the IPVS table: {e:#?}");
        },
    );
    run.twin(Scenario::VipPortServed);

    run.failure(
        Scenario::HairpinRpfilter,
        "hairpin-rpfilter",
        LoopbackKind::Hairpin,
        |e| {
            assert_eq!(e.src, IpAddr::V4(lab::POD_A_IP));
            assert_eq!(e.vip, Some(IpAddr::V4(lab::VIP)));
            assert_eq!(e.vip_port, Some(lab::SERVICE_PORT));
            assert_eq!(e.dst_port, lab::NODE_PORT);
            assert_eq!(e.snat, SnatState::No);
            assert_eq!(e.outcome, Fate::Dropped);
            assert_eq!(e.drop_reason.as_deref(), Some("IP_RPFILTER"));
        },
    );
    run.twin(Scenario::HairpinSnat);
    run.twin(Scenario::OutsideClient);
    run.twin(Scenario::PodToPod);
    let mut failures = std::mem::take(&mut run.failures);
    drop(run);
    drop(agent);
    failures.extend(left_behind());
    drop(lab);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The plain hairpin (no rp_filter) in IPVS mode, with its own agent: the looping SYN gets
/// through, IPVS answers the pod straight from the node, the pod resets that answer.
#[test]
fn ipvs_mode_hairpin_is_confirmed() {
    if !lab::require_vm("ipvs_mode_hairpin") {
        return;
    }
    let lab = ipvs_lab(&Variants::default());
    let agent = ipvs_agent();
    let mut run = Run::new(&agent, &lab, services_json());
    run.failure(Scenario::Hairpin, "hairpin", LoopbackKind::Hairpin, |e| {
        assert_eq!(e.src, IpAddr::V4(lab::POD_A_IP));
        assert_eq!(e.vip, Some(IpAddr::V4(lab::VIP)));
        assert_eq!(e.dst_port, lab::NODE_PORT);
        assert_eq!(e.snat, SnatState::No);
        assert_eq!(e.layer, Some(Layer::L4));
        // default/web has externalTrafficPolicy Local in the IPVS-mode lab (its NodePort in
        // KUBE-NODE-PORT-LOCAL-TCP): that is why the pod's call to the LB left unmasqueraded.
        let ev = lines(&e.evidence);
        assert!(ev.contains("externalTrafficPolicy: Local"), "{e:#?}");
        let remedy = lines(&e.remedy);
        assert!(
            remedy.contains("externalTrafficPolicy: Local") && remedy.contains("Cluster"),
            "{e:#?}"
        );
    });
    run.assert_no_failures();
}

/// kube-proxy >= 1.25's IPVS access filter for real (variant `ipvs-filter`: `KUBE-IPVS-FILTER`
/// and its ipsets beside real IPVS): the unserved VIP port is REJECTed (NETFILTER_DROP) and
/// still confirmed as `vip_port_unserved`; the served port passes the filter.
#[test]
fn ipvs_mode_access_filter_unserved_port_is_confirmed() {
    if !lab::require_vm("ipvs_mode_access_filter") {
        return;
    }
    let lab = ipvs_lab(&Scenario::VipPortUnservedFiltered.spec().variants);
    // The agent's first read of the service table sees the filter chain.
    let agent = ipvs_agent();
    let mut run = Run::new(&agent, &lab, services_json());
    run.failure(
        Scenario::VipPortUnservedFiltered,
        "vip-port-unserved-filtered",
        LoopbackKind::VipPortUnserved,
        |e| {
            assert_eq!(e.vip, Some(IpAddr::V4(lab::VIP)));
            assert_eq!(e.vip_port, Some(lab::VIP_UNSERVED_PORT));
            assert_eq!(e.outcome, Fate::Refused);
            let ev = lines(&e.evidence);
            assert!(ev.contains("chain KUBE-IPVS-FILTER"), "{e:#?}");
        },
    );
    run.twin(Scenario::VipPortServedFiltered);
    run.assert_no_failures();
}

/// With the API's table in IPVS mode (issue #52: no poll of the virtual services), the API's
/// `default/web` also serves 443 on the LB IP and IPVS has no virtual service for it (a
/// kube-proxy that has not synced): a pod's call to VIP:443 is refused, the agent asks the
/// kernel for that one virtual service (`IPVS_CMD_GET_SERVICE`), finds none, reads the
/// virtual services to be sure, and names the disagreement with kube-proxy as the remedy. The
/// served port (a virtual service the keyed look-up finds) is answered. kube.rs holds the
/// iptables-mode twin.
#[test]
fn ipvs_mode_a_port_the_api_serves_and_ipvs_lacks_is_named() {
    if !lab::require_vm("ipvs_mode_api_unprogrammed") {
        return;
    }
    let lab = ipvs_lab(&Variants::default());
    let api = KubeFixture::builder()
        .objects(lab_objects_with_unprogrammed_port())
        .start();
    let mut agent = api.start_agent(&["--kube-events", "off"]);
    agent.wait_log("service table from the API", WAIT);
    assert_eq!(
        lab.traffic(Scenario::VipPortUnserved).unwrap(),
        Outcome::Refused
    );
    let e = agent.first_event_of(LoopbackKind::VipPortUnserved, WAIT);
    say!("ipvs_mode_api_unprogrammed: {:?}", lines(&e.evidence));
    assert_unprogrammed_port_named(&e, "IPVS virtual services");
    assert_eq!(lab.traffic(Scenario::VipPortServed).unwrap(), Outcome::Ok);
    assert!(agent.stop().success());
    drop(api);
    drop(lab);
}

/// The hairpin variants in IPVS mode (issue 10, item 4), one agent: node-sourced through the
/// LB listener without the source-node guard (IPVS NodePort), LB straight to pod-b, UDP
/// through an IPVS UDP NodePort; each twin silent. On 6.1 the node-sourced drop is
/// `NOT_SPECIFIED` at the route-input site.
#[test]
fn ipvs_mode_hairpin_variants_are_confirmed_and_twins_are_silent() {
    if !lab::require_vm("ipvs_mode_hairpin_variants") {
        return;
    }
    let lab = ipvs_lab(&Variants::default());
    let agent = ipvs_agent();
    let mut run = Run::new(&agent, &lab, services_json());
    run.failure(
        Scenario::HairpinNodeSourced,
        "hairpin-node-sourced",
        LoopbackKind::Hairpin,
        |e| {
            assert_eq!(e.src, IpAddr::V4(lab::NODE_IP));
            assert_eq!(e.vip_port, Some(lab::VIP_NO_GUARD_PORT));
            assert_eq!(e.outcome, Fate::Dropped);
            assert!(lines(&e.evidence).contains("node-sourced"), "{e:#?}");
        },
    );
    run.twin(Scenario::NodeToLbGuarded);
    run.failure(
        Scenario::HairpinLbToPod,
        "hairpin-lb-to-pod",
        LoopbackKind::Hairpin,
        |e| {
            assert_eq!(e.dst, IpAddr::V4(lab::POD_B_IP));
            assert_eq!(e.vip_port, Some(lab::VIP_TO_POD_PORT));
        },
    );
    run.twin(Scenario::OutsideClientLbToPod);
    run.failure(
        Scenario::HairpinUdp,
        "hairpin-udp",
        LoopbackKind::Hairpin,
        |e| {
            assert_eq!(e.proto, Proto::Udp);
            assert_eq!(e.dst_port, lab::NODE_PORT_UDP);
        },
    );
    run.twin(Scenario::OutsideClientUdp);
    run.assert_no_failures();
}

/// The service table is read on change in IPVS mode too (IPVS has no notifications: the
/// agent's one-dump digest of the virtual services, tested each second, is the signal): with
/// `--services-every 3600`, a virtual service added on a NodePort-range port becomes a
/// NodePort of the agent's table (its `service table read` log line counts one more).
#[test]
fn ipvs_mode_virtual_service_added_is_read_without_a_timer_tick() {
    if !lab::require_vm("ipvs_mode_virtual_service_added") {
        return;
    }
    let lab = ipvs_lab(&Variants::default());
    let mut agent = Agent::on_node_nic_with_table(&["--services-every", "3600"]);
    let count = |agent: &mut Agent| -> usize {
        agent.wait_log("source=Some(Ipvs)", WAIT);
        agent
            .log_lines()
            .iter()
            .rev()
            .find_map(|l| {
                l.contains("service table read")
                    .then(|| {
                        l.split_whitespace()
                            .find_map(|w| w.strip_prefix("nodeports="))
                    })
                    .flatten()
                    .and_then(|n| n.parse().ok())
            })
            .expect("a service table line")
    };
    let before = count(&mut agent);
    let vs = format!("{}:31999", lab::NODE_IP);
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            lab::NS_NODE,
            "ipvsadm",
            "-A",
            "-t",
            &vs,
            "-s",
            "rr",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    agent.wait_log(&format!("nodeports={} ", before + 1), WAIT);
    drop(agent);
    drop(lab);
}

/// kube-proxy IPVS mode with the fake API server: the first event of a run, confirmed before
/// the agent's API cache synced, carries the pod and Service the API knows, and the hairpin's
/// and the health check's Events regard the existing Service (name and uid), listed by the
/// real `kubectl describe service web`. (The unserved port names no Service here: both
/// fixture Services share the LB IP and IPVS names none, so its Event regards the Node.)
#[test]
fn ipvs_mode_first_events_are_named_and_on_the_service() {
    if !lab::require_vm("ipvs_mode_kube_names") {
        return;
    }
    use probe_tests::kube_names::{Case, first_events_named_and_described};
    first_events_named_and_described(
        KubeProxyMode::Ipvs,
        &[
            Case {
                scenario: Scenario::Hairpin,
                kind: LoopbackKind::Hairpin,
                reason: "LoopbackHairpin",
                service: "default/web",
                client_pod: true,
            },
            Case {
                scenario: Scenario::HealthcheckBlackhole,
                kind: LoopbackKind::HealthcheckBlackhole,
                reason: "HealthCheckBlackhole",
                service: "default/web",
                client_pod: false,
            },
        ],
    );
}

/// Issue 23 item 6 in IPVS mode: kube-proxy 1.31 without pod-b's KUBE-LOOP-BACK entry
/// (kubernetes#134884): pod-b's call to its own ClusterIP is not masqueraded and dies in pod-b
/// as a local source; confirmed with the ipset entry named. Twin: the entry in place. (Pod-b
/// behind a bridge without hairpin mode, where the *answer* dies at the port in IPVS mode,
/// is driven by loopback.rs's `service_self_loop_at_a_bridge_port_without_hairpin_mode_names_it`,
/// which the VM tier runs in IPVS mode.)
#[test]
fn ipvs_mode_service_self_loop_is_confirmed_and_twins_are_silent() {
    if !lab::require_vm("ipvs_mode_service_self_loop") {
        return;
    }
    let lab = ipvs_lab(&Scenario::SelfLoop.spec().variants);
    let agent = ipvs_agent();
    let mut run = Run::new(&agent, &lab, services_json());
    run.failure(
        Scenario::SelfLoop,
        "service-self-loop",
        LoopbackKind::ServiceSelfLoop,
        |e| {
            assert_eq!(e.src, IpAddr::V4(lab::POD_B_IP));
            assert_eq!(e.dst, IpAddr::V4(lab::POD_B_IP));
            assert_eq!(e.dst_port, lab::POD_PORT);
            assert_eq!(e.vip, Some(IpAddr::V4(lab::CLUSTER_IP)));
            assert_eq!(e.outcome, Fate::Dropped);
            assert_eq!(e.snat, SnatState::No);
            assert!(dropped_as_local_source(e), "{e:#?}");
            let ev = lines(&e.evidence);
            assert!(
                ev.contains("ipset KUBE-LOOP-BACK lacks 198.19.1.11,tcp:8080,198.19.1.11"),
                "{e:#?}"
            );
            assert!(ev.contains("no SRC_NAT"), "IPVS conntrack entry: {e:#?}");
            assert!(
                lines(&e.remedy).contains("KUBE-LOOP-BACK ipset entry"),
                "{e:#?}"
            );
        },
    );
    run.twin(Scenario::SelfLoopSnat);
    // Pod-b on a bridge without hairpin mode, br_netfilter on, KUBE-LOOP-BACK in place: the
    // call is masqueraded and reaches pod-b; its answer, un-NATed back to pod-b while bridged,
    // dies at pod-b's port. The event is the call's, with the SNAT in its evidence.
    run.failure(
        Scenario::SelfLoopBridge,
        "service-self-loop-bridge",
        LoopbackKind::ServiceSelfLoop,
        |e| {
            assert_eq!(e.src, IpAddr::V4(lab::POD_B_IP));
            assert_eq!(e.dst, IpAddr::V4(lab::POD_B_IP));
            assert_eq!(e.dst_port, lab::POD_PORT, "the call's port: {e:#?}");
            assert_eq!(e.vip, Some(IpAddr::V4(lab::CLUSTER_IP)), "{e:#?}");
            assert_eq!(e.vip_port, Some(lab::SERVICE_PORT), "{e:#?}");
            assert_eq!(e.snat, SnatState::Yes, "{e:#?}");
            assert_eq!(e.nic.as_deref(), Some("vpod-b"), "{e:#?}");
            let ev = lines(&e.evidence);
            assert!(ev.contains("the call was masqueraded"), "{e:#?}");
            assert!(
                ev.contains("ipset KUBE-LOOP-BACK holds 198.19.1.11,tcp:8080,198.19.1.11"),
                "{e:#?}"
            );
            assert!(
                ev.contains("missing: hairpin mode on cbr0 port vpod-b"),
                "{e:#?}"
            );
            assert!(
                lines(&e.remedy).contains("--hairpin-mode=hairpin-veth"),
                "{e:#?}"
            );
        },
    );
    run.assert_no_failures();
}

/// `probe check --as nftables` on the IPVS-mode lab (real IPVS: the LB IP bound on a dummy
/// kube-ipvs0, kube-proxy's ipsets, the Services from the fake API), then the same node rebuilt
/// in nftables mode in this VM: the risks predicted after the move (kind and subject, with the
/// Service) are the ones `probe check` then reports; the bound IP's black hole and refused port
/// disappear, and `default/dns`'s unserved 53/udp (externalTrafficPolicy Local) starts
/// hairpinning.
#[test]
fn ipvs_mode_as_nftables_prediction_matches_the_nftables_lab() {
    if !lab::require_vm("ipvs_mode_as_nftables_prediction") {
        return;
    }
    let r = probe_tests::readiness::predict_then_observe(KubeProxyMode::Ipvs);
    let p = &r.prediction;
    say!(
        "--as nftables on IPVS: predicted {:?}, nftables lab shows {:?}",
        r.predicted,
        r.observed
    );
    assert_eq!(p.from, probe_contract::check::Mode::Ipvs, "{p:#?}");
    r.assert_the_move_to_nftables_as_predicted();
}

/// kube-proxy's `/proxyMode` (its metrics address, 127.0.0.1:10249) in the lab node,
/// answering `mode`: kube-proxy saying which mode it runs. Stopped when dropped.
struct ProxyModeAnswer(#[allow(dead_code)] KilledOnDrop);

impl ProxyModeAnswer {
    fn start(mode: &str) -> ProxyModeAnswer {
        let server = format!(
            "import http.server\n\
             class H(http.server.BaseHTTPRequestHandler):\n\
             \x20   def do_GET(self):\n\
             \x20       body = b'{mode}' if self.path == '/proxyMode' else b''\n\
             \x20       self.send_response(200 if body else 404)\n\
             \x20       self.send_header('Content-Length', str(len(body)))\n\
             \x20       self.end_headers()\n\
             \x20       self.wfile.write(body)\n\
             \x20   def log_message(self, *args):\n\
             \x20       pass\n\
             http.server.HTTPServer(('127.0.0.1', 10249), H).serve_forever()\n"
        );
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", lab::NS_NODE, "python3", "-c", &server])
            .spawn()
            .expect("python3");
        let answer = ProxyModeAnswer(KilledOnDrop(child));
        wait_for("kube-proxy's /proxyMode stand-in", WAIT, || {
            let out = std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    lab::NS_NODE,
                    "ss",
                    "-Hltn",
                    "sport = :10249",
                ])
                .output()
                .ok()?;
            (!out.stdout.is_empty()).then_some(())
        })
        .expect("/proxyMode listening");
        answer
    }
}

/// Issue 39 item 4 with real IPVS (the host has none): kube-proxy moved to nftables mode and
/// IPVS mode's virtual services were left behind (no `--cleanup`). Read from the kernel's
/// IPVS: while kube-proxy does not say its mode, both modes' state is named as ambiguous;
/// once its `/proxyMode` says nftables, the IPVS services are a `mode_leftover` warning
/// (subject `ipvs`, with their count and the cleanup); cleared as kube-proxy's cleanup clears
/// them (`ipvsadm -C`), nothing is named. (kube-ipvs0 left with addresses, the risk, runs on
/// the host: a bridge stands in for its dummy there.)
#[test]
fn ipvs_services_left_after_the_switch_to_nftables_are_named() {
    use probe_contract::check::{CheckReport, Kind, Severity};
    if !lab::require_vm("ipvs_services_left_after_the_switch") {
        return;
    }
    let lab = LabGuard::up_in(
        KubeProxyMode::Nftables,
        &Variants {
            vip_bound: false,
            ..Variants::default()
        },
        &UpOptions::default(),
    )
    .expect("lab up (nftables mode)");
    let leftovers = |r: &CheckReport| -> Vec<(Severity, String)> {
        r.findings
            .iter()
            .filter(|f| f.kind == Kind::ModeLeftover)
            .map(|f| (f.severity, f.subject.clone()))
            .collect()
    };
    let leftover = |r: &CheckReport| {
        r.findings
            .iter()
            .find(|f| f.kind == Kind::ModeLeftover)
            .cloned()
            .unwrap_or_else(|| panic!("no mode_leftover: {r:#?}"))
    };
    let ipvsadm = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", lab::NS_NODE, "ipvsadm"])
            .args(args)
            .output()
            .expect("ipvsadm");
        assert!(out.status.success(), "ipvsadm {args:?}: {out:?}");
    };
    let clean = lab_node_report();
    assert!(leftovers(&clean).is_empty(), "{clean:#?}");
    ipvsadm(&["-A", "-t", &format!("{}:80", lab::VIP), "-s", "rr"]);
    ipvsadm(&["-A", "-u", &format!("{}:53", lab::VIP), "-s", "rr"]);
    // kube-proxy silent: IPVS and its nftables table both hold services, neither guessed.
    let unsaid = lab_node_report();
    assert_eq!(
        leftovers(&unsaid),
        vec![(Severity::Warn, "ipvs, table ip kube-proxy".to_string())],
        "{unsaid:#?}"
    );
    let finding = leftover(&unsaid);
    assert!(
        finding.summary.contains("IPVS (2 virtual services)"),
        "{}",
        finding.summary
    );
    // kube-proxy says nftables: the IPVS services are the leftover.
    let answer = ProxyModeAnswer::start("nftables");
    let left = lab_node_report();
    say!(
        "ipvs-vm: after the switch, IPVS left: {:?}",
        leftovers(&left)
    );
    assert_eq!(
        leftovers(&left),
        vec![(Severity::Warn, "ipvs".to_string())],
        "{left:#?}"
    );
    let finding = leftover(&left);
    assert!(
        finding.summary.contains("holds 2 virtual service"),
        "{}",
        finding.summary
    );
    assert!(
        finding.remedy.iter().any(|l| l.contains("--cleanup")),
        "{finding:#?}"
    );
    ipvsadm(&["-C"]);
    let after = lab_node_report();
    assert!(leftovers(&after).is_empty(), "{after:#?}");
    drop(answer);
    drop(lab);
}

/// Issue #51 shape 1 in IPVS mode: `default/web`'s LB IP:80 in `KUBE-LOAD-BALANCER-FW`, its
/// ranges in `KUBE-LOAD-BALANCER-SOURCE-CIDR`, and the filter chains that drop the rest
/// (kubernetes PR #110628): pod-a's call to the LB IP (bound on kube-ipvs0) dies in `INPUT`,
/// before IPVS, and is confirmed as `source_ranges_drop` with the sets named; `probe check`
/// names the risk from the sets alone.
#[test]
fn ipvs_mode_source_ranges_drop_is_confirmed_with_the_ipsets() {
    if !lab::require_vm("ipvs_mode_source_ranges_drop") {
        return;
    }
    use test_support::lab::source_ranges;
    let lab = ipvs_lab(&Variants::default());
    source_ranges::set_ipvs_source_ranges(Some(&["192.0.2.0/24", "198.51.100.0/24"]))
        .expect("default/web's IPVS-mode firewall");
    assert_eq!(
        lab_node_subjects(CheckKind::SourceRangesDrop),
        ["203.0.113.10:80/tcp"]
    );
    let agent = ipvs_agent();
    let to_lb = std::net::SocketAddrV4::new(lab::VIP, lab::SERVICE_PORT);
    let pod = lab.connect(lab::NS_POD_A, None, to_lb).unwrap();
    say!("ipvs-vm: source ranges without the pod CIDR: client {pod:?}");
    assert_eq!(pod.outcome, Outcome::Timeout, "{pod:?}");
    let e = agent.only_event(LoopbackKind::SourceRangesDrop, WAIT);
    let ev = assert_ipvs_source_ranges_drop(
        &e,
        IpAddr::V4(lab::POD_A_IP),
        IpAddr::V4(lab::VIP),
        &[
            "ipset KUBE-LOAD-BALANCER-FW has 203.0.113.10,tcp:80",
            "KUBE-SOURCE-RANGES-FIREWALL",
            "source outside { 192.0.2.0/24, 198.51.100.0/24 }",
            "the caller 198.19.1.10 is in none",
        ],
    );
    say!("ipvs-vm: source ranges: confirmed source_ranges_drop ({ev})");
    source_ranges::set_ipvs_source_ranges(None).unwrap();
    drop(agent);
    drop(lab);
}

/// The twin: the pod CIDR among the ranges (upstream's advice): the call is returned by
/// `KUBE-SOURCE-RANGES-FIREWALL`, IPVS sends it to pod-b, it is answered; nothing is reported
/// and `probe check` names no risk.
#[test]
fn ipvs_mode_source_ranges_with_the_pod_cidr_report_nothing() {
    if !lab::require_vm("ipvs_mode_source_ranges_twin") {
        return;
    }
    use test_support::lab::source_ranges;
    let lab = ipvs_lab(&Variants::default());
    source_ranges::set_ipvs_source_ranges(Some(&["192.0.2.0/24", lab::POD_CIDR]))
        .expect("default/web's IPVS-mode firewall");
    assert!(lab_node_subjects(CheckKind::SourceRangesDrop).is_empty());
    let agent = ipvs_agent();
    let to_lb = std::net::SocketAddrV4::new(lab::VIP, lab::SERVICE_PORT);
    let pod = lab.connect(lab::NS_POD_A, None, to_lb).unwrap();
    say!("ipvs-vm: source ranges with the pod CIDR (twin): client {pod:?}");
    assert_eq!(pod.outcome, Outcome::Ok, "{pod:?}");
    agent.assert_reports_nothing_after(SETTLE);
    source_ranges::set_ipvs_source_ranges(None).unwrap();
    drop(agent);
    drop(lab);
}
