//! `probe check --as nftables` against the lab: the prediction made on a lab in one kube-proxy
//! mode, then what `probe check` says once the same node (same variants, same Services from
//! the fake API) is rebuilt in nftables mode. Used by `tests/check.rs` (from iptables mode)
//! and `tests/ipvs.rs` (from IPVS mode, VM tier only).
//!
//! The Services are the lab's fixtures with `default/dns` switched to externalTrafficPolicy
//! Local: its 53/udp on the shared LB IP is declared but not served on the node, so it is
//! refused while kube-proxy binds the IP and leaves for the LB (unmasqueraded) once it does not.

use std::{collections::BTreeSet, process::Command};

use probe_contract::readiness::Prediction;
use serde_json::Value;
use test_support::{
    kubeapi::fixtures,
    lab::{self, KubeProxyMode, LabGuard, UpOptions, Variants},
};

use crate::{agent::probe_bin, kube_fixture::KubeFixture};

/// (kind, subject).
pub type RiskSet = BTreeSet<(String, String)>;

/// The loopback kinds the prediction covers.
pub const LOOP_KINDS: [&str; 4] = [
    "healthcheck_blackhole",
    "vip_port_unserved",
    "hairpin",
    "service_self_loop",
];

/// What one round saw.
pub struct Round {
    /// `probe check --as nftables --json` on the first lab, and its exit code.
    pub prediction: Prediction,
    pub prediction_code: i32,
    /// The prediction's risks after the move (`remain` and `appear`).
    pub predicted: RiskSet,
    /// `probe check --json` on the nftables-mode lab, and its loopback risks.
    pub observed_report: probe_contract::check::CheckReport,
    pub observed: RiskSet,
    /// `probe check --as nftables` on the nftables-mode lab: (exit code, stderr).
    pub as_on_nftables: (i32, String),
}

impl Round {
    /// What both rounds (from iptables and from IPVS mode) see: the prediction is what the
    /// nftables lab shows; the bound LB IP's black hole and refused port disappear; the one
    /// new risk is `default/dns`'s 53/udp hairpin; and `--as nftables` on the nftables lab is
    /// a usage error (exit 2).
    pub fn assert_the_move_to_nftables_as_predicted(&self) {
        use probe_contract::check::Kind;
        let p = &self.prediction;
        assert_eq!(
            self.predicted, self.observed,
            "prediction {p:#?}\nobserved {:#?}",
            self.observed_report
        );
        let vip = lab::VIP.to_string();
        let gone: Vec<(Kind, &str)> = p
            .disappear
            .iter()
            .map(|c| (c.kind, c.subject.as_str()))
            .collect();
        assert!(
            gone.contains(&(Kind::HealthcheckBlackhole, vip.as_str())),
            "{p:#?}"
        );
        assert!(
            gone.contains(&(Kind::VipPortUnserved, vip.as_str())),
            "{p:#?}"
        );
        assert_eq!(p.appear.len(), 1, "{p:#?}");
        let new = &p.appear[0];
        assert_eq!(new.kind, Kind::Hairpin);
        assert_eq!(new.subject, format!("{vip}:53/udp"));
        assert_eq!(new.service.as_deref(), Some("default/dns"));
        let (code, err) = &self.as_on_nftables;
        assert_eq!(*code, 2, "{err}");
    }
}

/// The lab's Services, `default/dns` with externalTrafficPolicy Local.
fn services() -> Vec<Value> {
    let mut objects = fixtures::lab();
    for o in &mut objects {
        if o["kind"] == "Service" && o["metadata"]["name"] == "dns" {
            o["spec"]["externalTrafficPolicy"] = "Local".into();
        }
    }
    objects
}

/// Runs `probe check ARGS --kubeconfig <fake API>` in the lab node: (exit code, stdout,
/// stderr). The API server lives in the node's namespace for this call only.
fn check_with_api(args: &[&str]) -> (i32, String, String) {
    let api = KubeFixture::builder()
        .objects(services())
        .tag("readiness")
        .start();
    let o = Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(probe_bin())
        .arg("check")
        .args(args)
        .args(["--nic", lab::NODE_NIC, "--kubeconfig", api.kubeconfig()])
        .output()
        .expect("run probe check");
    drop(api);
    (
        o.status.code().expect("exit code"),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Prediction on the lab in `from` mode, then the nftables-mode lab's report.
pub fn predict_then_observe(from: KubeProxyMode) -> Round {
    let variants = Variants::default();
    let first = LabGuard::up_in(from, &variants, &UpOptions::default()).expect("lab up");
    let (_, text, _) = check_with_api(&["--as", "nftables"]);
    // What a person sees (in the log of a failing run, and for the README).
    eprintln!("probe check --as nftables on the {from}-mode lab:\n{text}");
    let (prediction_code, out, err) = check_with_api(&["--as", "nftables", "--json"]);
    let prediction: Prediction = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("not a prediction ({e}): {out}\n{err}"));
    drop(first);
    let mut predicted = RiskSet::new();
    for list in [&prediction.remain, &prediction.appear] {
        for c in list {
            predicted.insert((c.kind.as_str().to_string(), c.subject.clone()));
        }
    }

    let second = LabGuard::up_in(KubeProxyMode::Nftables, &variants, &UpOptions::default())
        .expect("lab up (nftables mode)");
    let (_, out, err) = check_with_api(&["--json"]);
    let observed_report: probe_contract::check::CheckReport = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("not a check report ({e}): {out}\n{err}"));
    let observed = observed_report
        .findings
        .iter()
        .filter(|f| {
            f.severity == probe_contract::check::Severity::Risk
                && LOOP_KINDS.contains(&f.kind.as_str())
        })
        .map(|f| (f.kind.as_str().to_string(), f.subject.clone()))
        .collect();
    let (code, out, err) = check_with_api(&["--as", "nftables"]);
    assert!(out.is_empty(), "nothing on stdout: {out}");
    drop(second);
    Round {
        prediction,
        prediction_code,
        predicted,
        observed_report,
        observed,
        as_on_nftables: (code, err),
    }
}
