//! `probe check` on the real lab node: each risk the lab sets up is named in `--json` with
//! exit 1; the twin setup without it (the demo's healthy twins) does not name it; usage
//! errors exit 2 with nothing on stdout; an unreadable node is one `error:` line, exit 1.
//!
//! Root only for the lab tests (they print a skip line otherwise). One lab for the sequence.

use std::process::{Command, Output};

use probe_contract::check::{CheckReport, Finding, Kind, Limit, Mode, Replacement, Severity};
use probe_tests::agent::{lines, probe_bin, require_root};
use serde::Deserialize as _;
use serde_json::Value;
use test_support::lab::{self, KubeProxyMode, LabGuard, Variant, Variants};

fn check(args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(probe_bin())
        .arg("check")
        .args(args)
        .output()
        .expect("run probe check")
}

/// `probe check --json`'s stdout as the contract's report, read once: not one, or not what the
/// type writes back (a field the contract lacks or leaves out), fails the test with the text.
fn parse(o: &std::process::Output) -> CheckReport {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let report = CheckReport::deserialize(&json)
        .unwrap_or_else(|e| panic!("not the contract's check CheckReport ({e}): {stdout}"));
    assert_eq!(
        serde_json::to_value(&report).unwrap(),
        json,
        "not what the contract's check CheckReport writes: {stdout}"
    );
    report
}

/// `probe check --json` in the lab node: (exit code, report).
fn report() -> (i32, CheckReport) {
    let o = check(&["--json", "--nic", lab::NODE_NIC]);
    (o.status.code().expect("exit code"), parse(&o))
}

/// The findings of `kind`, as (severity, subject).
fn named(json: &CheckReport, kind: Kind) -> Vec<(String, String)> {
    json.findings
        .iter()
        .filter(|f| f.kind == kind)
        .map(|f| (f.severity.as_str().to_string(), f.subject.clone()))
        .collect()
}

/// The first finding of `kind`.
fn find(json: &CheckReport, kind: Kind) -> Finding {
    json.findings
        .iter()
        .find(|f| f.kind == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no {}: {json:#?}", kind.as_str()))
}

#[test]
fn each_lab_risk_is_named_and_its_twin_is_not() {
    if !require_root("probe check on the lab") {
        return;
    }
    let mode = KubeProxyMode::from_env().unwrap();
    let vip = lab::VIP.to_string();
    // vip-bound on, masquerade off: the healthcheck black hole, the refused ports of the
    // bound VIP, and unmasqueraded pod egress (in IPVS mode the bound VIP is served locally,
    // so the hairpin is judged once it is unbound, below).
    let lab = LabGuard::up(&Variants::default()).expect("lab up");
    // For the log of a failing run: what a person sees.
    eprintln!(
        "{}",
        String::from_utf8_lossy(&check(&["--nic", lab::NODE_NIC]).stdout)
    );
    let (code, json) = report();
    assert_eq!(code, 1, "{json:#?}");
    assert_eq!(json.schema, 1);
    if mode == KubeProxyMode::Nftables {
        // nftables mode binds no LB IP: nothing for an LB's health check to trip on.
        assert!(
            named(&json, Kind::HealthcheckBlackhole).is_empty(),
            "{json:#?}"
        );
    } else {
        assert_eq!(
            named(&json, Kind::HealthcheckBlackhole),
            [("risk".to_string(), vip.clone())],
            "{json:#?}"
        );
        let unserved = named(&json, Kind::VipPortUnserved);
        assert_eq!(unserved.len(), 1, "{json:#?}");
        assert_eq!(unserved[0].1, vip);
        let hc = find(&json, Kind::HealthcheckBlackhole);
        assert!(!hc.remedy.is_empty(), "{hc:#?}");
        assert!(lines(&hc.evidence).contains("accept_local=0"), "{hc:#?}");
    }
    if mode != KubeProxyMode::Ipvs {
        assert!(!named(&json, Kind::Hairpin).is_empty(), "{json:#?}");
    }
    let nic = named(&json, Kind::NicSourceValidation);
    assert_eq!(nic, [("info".to_string(), lab::NODE_NIC.to_string())]);

    // The healthcheck-ok twin: the VIP is not bound. Pods still leave unmasqueraded.
    lab.set(Variant::VipBound, false).expect("unbind the VIP");
    let (code, json) = report();
    assert!(
        named(&json, Kind::HealthcheckBlackhole).is_empty(),
        "{json:#?}"
    );
    assert!(named(&json, Kind::VipPortUnserved).is_empty(), "{json:#?}");
    let hairpin = named(&json, Kind::Hairpin);
    assert!(
        !hairpin.is_empty() && hairpin.iter().all(|(s, _)| s == "risk"),
        "{json:#?}"
    );
    assert_eq!(code, 1);

    // The hairpin-snat twin: pod egress masqueraded: no risk left.
    lab.set(Variant::Masquerade, true).expect("masquerade");
    let (code, json) = report();
    assert!(named(&json, Kind::Hairpin).is_empty(), "{json:#?}");
    assert_eq!(json.risks, 0, "{json:#?}");
    assert_eq!(code, 0, "{json:#?}");

    // Strict rp_filter shows in the NIC's settings (drop instead of reply).
    lab.set(Variant::RpFilter, true).expect("rp_filter");
    let (_, json) = report();
    let summary = find(&json, Kind::NicSourceValidation).summary;
    assert!(summary.contains("rp_filter=1 (strict)"), "{summary}");

    // The table: one line per finding plus the header, the dataplane and the summary line.
    let o = check(&["--nic", lab::NODE_NIC]);
    let table = String::from_utf8_lossy(&o.stdout);
    let findings = json.findings.len();
    assert_eq!(table.lines().count(), findings + 3, "{table}");
    assert!(
        table.contains(&format!("dataplane: kube-proxy {}\n", mode.name())),
        "{table}"
    );
    assert_eq!(
        json.dataplane.as_ref().map(|d| d.mode.as_str()),
        Some(mode.name()),
        "{json:#?}"
    );
    assert!(named(&json, Kind::Dataplane).is_empty(), "{json:#?}");
    assert!(
        table.lines().last().unwrap().starts_with("0 risk(s), "),
        "{table}"
    );
    assert_eq!(o.status.code(), Some(0));

    // A node that cannot be read as asked: one error line, exit 1, nothing on stdout.
    let o = check(&["--json", "--nic", "nosuch0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("probe: error:") && err.contains("nosuch0"),
        "{err}"
    );
    drop(lab);
}

/// A node without kube-proxy (the lab's `cilium` mode: no KUBE-* chains, sets or tables,
/// Cilium's `cilium_host`): the dataplane is named `none (cilium)`, the kinds that can still
/// happen and what cannot be confirmed are stated, and an LB IP made local by a route is
/// still judged (the healthcheck black hole needs no kube-proxy).
#[test]
fn a_node_without_kube_proxy_names_its_dataplane_and_its_limits() {
    let Some(lab) = LabGuard::for_test_in(
        "probe check on the lab",
        KubeProxyMode::Cilium,
        &Variants {
            vip_bound: false,
            vip_local_route: true,
            ..Variants::default()
        },
    ) else {
        return;
    };
    let o = check(&["--nic", lab::NODE_NIC]);
    let table = String::from_utf8_lossy(&o.stdout);
    eprintln!("{table}");
    assert!(table.contains("dataplane: none (cilium)\n"), "{table}");
    let (code, json) = report();
    // The local route's black hole is a risk whatever serves Services.
    assert_eq!(code, 1, "{json:#?}");
    let d = json
        .dataplane
        .as_ref()
        .unwrap_or_else(|| panic!("no dataplane: {json:#?}"));
    assert_eq!(d.mode, Mode::None, "{json:#?}");
    assert_eq!(d.replacement, Some(Replacement::Cilium), "{json:#?}");
    assert!(lines(&d.evidence).contains("cilium_host"), "{d:#?}");
    // Each limit says why (an empty list is left out of the JSON: no kinds).
    let kinds = |limits: &[Limit]| -> Vec<String> {
        limits
            .iter()
            .map(|l| {
                assert!(!l.why.is_empty(), "{l:#?}");
                l.kind.clone()
            })
            .collect()
    };
    assert_eq!(
        kinds(&d.still_possible),
        ["healthcheck_blackhole", "vip_port_unserved", "hairpin"]
    );
    let cannot = kinds(&d.cannot_confirm);
    assert!(
        cannot.contains(&"nodeport_attribution".to_string()),
        "{cannot:?}"
    );
    assert!(
        d.cannot_confirm
            .iter()
            .any(|l| l.why.contains("no service table from rules")),
        "{d:#?}"
    );
    // Not silence: a warning names the node's state, whatever the risks.
    assert_eq!(
        named(&json, Kind::Dataplane),
        [("warn".to_string(), "none (cilium)".to_string())],
        "{json:#?}"
    );
    // Which ports Cilium serves is not readable: a refusal is possible, not proven.
    assert_eq!(
        named(&json, Kind::VipPortUnserved),
        [("warn".to_string(), lab::VIP.to_string())],
        "{json:#?}"
    );
    // Pod egress masquerade is Cilium's (eBPF, unseen): a hairpin is possible, not proven.
    let hairpin = named(&json, Kind::Hairpin);
    assert!(
        !hairpin.is_empty() && hairpin.iter().all(|(s, _)| s == "warn"),
        "{json:#?}"
    );
    // The local route still makes the LB IP's health checks martian.
    assert_eq!(
        named(&json, Kind::HealthcheckBlackhole),
        [("risk".to_string(), lab::VIP.to_string())],
        "{json:#?}"
    );
    drop(lab);
}

/// `--as nftables` on the iptables-mode lab (its kube-ipvs0 stand-in holds the LB IP, as IPVS
/// mode does): the risks predicted after the move are the ones the nftables-mode lab then shows
/// for the same Services; the bound IP's risks disappear and `default/dns`'s unserved 53/udp
/// (externalTrafficPolicy Local) starts hairpinning. The IPVS-mode round is in tests/ipvs.rs.
#[test]
fn as_nftables_predicts_what_the_nftables_lab_shows() {
    use probe_tests::readiness::predict_then_observe;
    if !require_root("probe check --as nftables") {
        return;
    }
    let r = predict_then_observe(KubeProxyMode::Iptables);
    let p = &r.prediction;
    assert_eq!((p.from, p.to), (Mode::Iptables, Mode::Nftables), "{p:#?}");
    r.assert_the_move_to_nftables_as_predicted();
    assert!(!p.before_migrating.is_empty(), "{p:#?}");
    // ipMode advice for each LB Service, with its costs.
    assert!(
        p.ip_mode
            .iter()
            .any(|a| a.service.as_deref() == Some("default/dns") && a.verdict == "avoids_now"),
        "{p:#?}"
    );
    assert!(p.ip_mode.iter().all(|a| !a.costs.is_empty()));
    // Risks after the move: exit 1. On the nftables lab itself: a usage error.
    assert_eq!(r.prediction_code, 1);
    let (_, err) = &r.as_on_nftables;
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("already runs kube-proxy in nftables mode"),
        "{err}"
    );
}

/// `--as` with a mode it does not predict: one line, exit 2, before reading anything.
#[test]
fn as_another_mode_is_a_usage_error() {
    for mode in ["ipvs", "iptables", "bogus"] {
        let o = Command::new(probe_bin())
            .args(["check", "--as", mode])
            .output()
            .expect("run probe");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{mode}: {err}");
        assert!(o.stdout.is_empty(), "{mode}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("only `--as nftables`"), "{err}");
    }
}

#[test]
fn bad_flags_exit_2_and_print_nothing_else() {
    for args in [
        &["check", "--bogus"][..],
        &["check", "--json=yes"],
        &["check", "--pod-cidr", "10.0.0.1/24"],
        &["check", "--nic", "lo"],
        &["check", "--vip-iface", ""],
    ] {
        let o = Command::new(probe_bin())
            .args(args)
            .output()
            .expect("run probe");
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.stdout.is_empty(), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("error:"));
    }
}

/// The Service side through the real kube client against the fake API server (run inside the
/// lab node's namespace, where `probe check` runs): names, declared ports, a 403.
#[test]
fn services_from_the_api_name_the_risks() {
    use probe_tests::kube_fixture::KubeFixture;
    use test_support::kubeapi::fixtures;
    if !require_root("probe check with the API") {
        return;
    }
    if KubeProxyMode::from_env().unwrap() == KubeProxyMode::Nftables {
        eprintln!("skipping: nftables mode binds no LB IP");
        return;
    }
    let lab = LabGuard::up(&Variants::default().with(Variant::Masquerade, true)).expect("lab up");
    let api = KubeFixture::builder().tag("check").start();
    let kc = api.kubeconfig();
    let run = || {
        let o = check(&["--json", "--nic", lab::NODE_NIC, "--kubeconfig", kc]);
        (o.status.code().unwrap(), parse(&o))
    };

    // default/web as the fixture has it: LB ingress 203.0.113.10 (ipMode VIP), port 80.
    let (code, json) = run();
    assert_eq!(code, 1, "{json:#?}");
    let api_line = find(&json, Kind::KubeApi);
    assert_eq!(api_line.severity, Severity::Info, "{api_line:#?}");
    assert!(
        api_line.summary.contains("1 LB ingress IP"),
        "{api_line:#?}"
    );
    let hc = find(&json, Kind::HealthcheckBlackhole);
    assert!(hc.summary.contains("default/web"), "{hc:#?}");
    // default/dns shares the LB IP for 53/udp, which the bound VIP does not serve on the node.
    let unserved = find(&json, Kind::VipPortUnserved);
    assert_eq!(unserved.severity, Severity::Risk, "{unserved:#?}");
    let summary = &unserved.summary;
    assert!(
        summary.contains("53/udp") && !summary.contains("443/tcp"),
        "{unserved:#?}"
    );

    // The Service declares 443 too, which nothing on the node serves: a named risk.
    let mut web = fixtures::lab()
        .into_iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "web")
        .expect("web fixture");
    web["spec"]["ports"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "https", "protocol": "TCP", "port": 443, "targetPort": 8443, "nodePort": 30443}));
    api.apply(web.clone());
    let (_, json) = run();
    let unserved = find(&json, Kind::VipPortUnserved);
    assert_eq!(unserved.severity, Severity::Risk, "{unserved:#?}");
    assert!(unserved.summary.contains("443/tcp"), "{unserved:#?}");

    // Issue #51, shape 1: source ranges that leave out the node's pod range are a risk (kube-
    // proxy drops the pods' calls to the LB IP); a range that holds it is silent.
    let with_pods = || {
        let o = check(&[
            "--json",
            "--nic",
            lab::NODE_NIC,
            "--kubeconfig",
            kc,
            "--pod-cidr",
            "198.19.1.0/24",
        ]);
        parse(&o)
    };
    assert!(
        with_pods()
            .findings
            .iter()
            .all(|f| f.kind != Kind::SourceRangesDrop),
        "no ranges, no risk"
    );
    web["spec"]["loadBalancerSourceRanges"] = serde_json::json!(["192.0.2.0/24"]);
    api.apply(web.clone());
    let json = with_pods();
    let ranges = find(&json, Kind::SourceRangesDrop);
    assert_eq!(ranges.severity, Severity::Risk, "{ranges:#?}");
    assert!(
        ranges.summary.contains("default/web") && ranges.summary.contains("198.19.1.0/24"),
        "{ranges:#?}"
    );
    web["spec"]["loadBalancerSourceRanges"] = serde_json::json!(["192.0.2.0/24", "198.19.0.0/16"]);
    api.apply(web);
    assert!(
        with_pods()
            .findings
            .iter()
            .all(|f| f.kind != Kind::SourceRangesDrop),
        "a range holding the pods: no risk"
    );

    // RBAC denies the list: a warning, and the node side still judged.
    api.forbid("services", "list");
    let (code, json) = run();
    assert_eq!(code, 1, "{json:#?}");
    let api_line = find(&json, Kind::KubeApi);
    assert_eq!(api_line.severity, Severity::Warn, "{api_line:#?}");
    assert!(
        lines(&api_line.evidence).contains("403")
            || lines(&api_line.evidence).contains("forbidden"),
        "{api_line:#?}"
    );
    assert_eq!(
        find(&json, Kind::HealthcheckBlackhole).severity,
        Severity::Risk
    );
    drop(api);
    drop(lab);
}

/// Issue 39, item 3: the LB IP held on the node's NIC as kube-vip holds it (a /32 with
/// preferred_lft 0, no kube-ipvs0 binding) is a health-check black hole named for kube-vip
/// before any check fails, with kube-vip's remedy, not kube-proxy's; without it, none.
#[test]
fn an_lb_ip_an_announcer_holds_is_named_before_it_fails() {
    use probe_tests::kube_fixture::KubeFixture;
    let vip = lab::VIP.to_string();
    let Some(lab) = LabGuard::for_test(
        "probe check of an announced VIP",
        &Variants {
            vip_bound: false,
            vip_announced: true,
            ..Variants::default()
        },
    ) else {
        return;
    };
    let api = KubeFixture::builder().tag("check-announced").start();
    // `probe check --json` on the lab's node with the fake API's Services.
    let check_json_with_api = || {
        check(&[
            "--json",
            "--nic",
            lab::NODE_NIC,
            "--kubeconfig",
            api.kubeconfig(),
        ])
    };
    let o = check_json_with_api();
    let json = parse(&o);
    assert_eq!(o.status.code(), Some(1), "{json:#?}");
    let hc = find(&json, Kind::HealthcheckBlackhole);
    assert_eq!(hc.severity, Severity::Risk, "{hc:#?}");
    assert_eq!(hc.subject, vip);
    assert!(hc.summary.contains("held by kube-vip"), "{hc:#?}");
    assert!(hc.summary.contains("default/web"), "{hc:#?}");
    assert!(lines(&hc.evidence).contains("preferred_lft 0"), "{hc:#?}");
    let remedy = lines(&hc.remedy);
    assert!(remedy.contains("not bound by kube-proxy"), "{remedy}");
    assert!(!remedy.contains("kube-ipvs0"), "{remedy}");
    // The twin: the VIP not held on the node.
    lab.set(Variant::VipAnnounced, false)
        .expect("release the VIP");
    let o = check_json_with_api();
    let json = parse(&o);
    assert!(
        named(&json, Kind::HealthcheckBlackhole).is_empty(),
        "{json:#?}"
    );
    drop(api);
    drop(lab);
}

/// Issue 39, IPVS retirement: a node switched to kube-proxy's nftables mode whose IPVS-mode
/// kube-ipvs0 was left behind (kube-proxy's cleanup did not run) still holds the LB IP, so the
/// health-check black hole the switch was meant to end goes on. `probe check` names the
/// leftover as a risk with its remedy; the same node after the cleanup (no kube-ipvs0) does not.
#[test]
fn a_kube_ipvs0_left_behind_after_the_switch_to_nftables_is_named() {
    let Some(_lab) = LabGuard::for_test_in(
        "probe check on the lab",
        KubeProxyMode::Nftables,
        &Variants {
            vip_bound: false,
            ..Variants::default()
        },
    ) else {
        return;
    };
    let (_, clean) = report();
    assert!(named(&clean, Kind::ModeLeftover).is_empty(), "{clean:#?}");
    // What IPVS mode leaves: kube-ipvs0 (a bridge with no ports stands in for its dummy) with
    // the LB IP bound.
    let ip = |args: &[&str]| {
        let st = Command::new("ip")
            .args(["-n", lab::NS_NODE])
            .args(args)
            .status()
            .expect("ip");
        assert!(st.success(), "ip {args:?}");
    };
    ip(&["link", "add", lab::KUBE_IPVS0, "type", "bridge"]);
    ip(&[
        "addr",
        "add",
        &format!("{}/32", lab::VIP),
        "dev",
        lab::KUBE_IPVS0,
    ]);
    let (code, json) = report();
    assert_eq!(code, 1, "{json:#?}");
    assert_eq!(
        named(&json, Kind::ModeLeftover),
        vec![("risk".to_string(), lab::KUBE_IPVS0.to_string())],
        "{json:#?}"
    );
    let finding = find(&json, Kind::ModeLeftover);
    assert!(
        lines(&finding.evidence).contains(&lab::VIP.to_string()),
        "{finding:#?}"
    );
    assert!(lines(&finding.remedy).contains("--cleanup"), "{finding:#?}");
    // The black hole it keeps is named too.
    assert!(
        named(&json, Kind::HealthcheckBlackhole)
            .iter()
            .any(|(_, s)| s == &lab::VIP.to_string()),
        "{json:#?}"
    );
    // The cleanup done (kube-proxy's removes kube-ipvs0 with its addresses): silent again.
    ip(&["link", "delete", lab::KUBE_IPVS0]);
    let (_, after) = report();
    assert!(named(&after, Kind::ModeLeftover).is_empty(), "{after:#?}");
}

/// Issue 39 item 1: kube-proxy's nftables `no-endpoint-services` drop of an ETP Local LB IP
/// on a node without a local endpoint is named before any pod calls it (`default/web-local`,
/// LB IP:8445); with a local endpoint (no drop element) it is not.
#[test]
fn an_etp_local_lb_ip_kube_proxy_drops_is_named_and_its_twin_is_not() {
    let Some(lab) = LabGuard::for_test_nftables("probe check on the lab") else {
        return;
    };
    let subject = format!("{}:{}/tcp", lab::VIP, lab::VIP_NFT_ETP_LOCAL_PORT);
    lab.set_nft_web_local(false).unwrap();
    let (code, json) = report();
    assert_eq!(code, 1, "{json:#?}");
    assert_eq!(
        named(&json, Kind::EtpLocalDrop),
        vec![("risk".to_string(), subject.clone())],
        "{json:#?}"
    );
    let finding = find(&json, Kind::EtpLocalDrop);
    assert!(
        lines(&finding.evidence).contains("map no-endpoint-services has the element"),
        "{finding:#?}"
    );
    assert!(
        lines(&finding.remedy).contains("kubernetes#132456"),
        "{finding:#?}"
    );
    lab.set_nft_web_local(true).unwrap();
    let (_, twin) = report();
    assert!(named(&twin, Kind::EtpLocalDrop).is_empty(), "{twin:#?}");
}
