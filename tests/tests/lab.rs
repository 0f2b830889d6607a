//! The lab reproduces each failure and its healthy twin for real, and leaves nothing behind.
//!
//! Root only (each test prints `skipping: needs root` otherwise). The tests share one fixed lab:
//! run them with `--test-threads=1`. Every test starts by removing a leftover lab.

use std::process::Command;

use test_support::lab::{
    self, Lab, LabGuard, LabLock, Outcome, Scenario, UP_STEPS, UpOptions, Variant, Variants,
};

fn root() -> bool {
    if lab::is_root() {
        true
    } else {
        eprintln!("skipping: needs root");
        false
    }
}

/// Nothing of the lab is left (taking the lab lock, so no other test's lab is counted).
fn assert_clean() {
    let _lock = LabLock::acquire().unwrap();
    assert_clean_locked();
}

/// [`assert_clean`] for a test that holds the lab lock.
fn assert_clean_locked() {
    let left = lab::leftovers().expect("leftovers");
    assert!(left.is_empty(), "lab leftovers: {left:?}");
}

/// Brings the lab up, runs the scenario, checks the outcome (and the answer's origin).
fn scenario(sc: Scenario, expected: Outcome, answered_by: Option<&str>) {
    if !root() {
        return;
    }
    assert_eq!(
        sc.spec().expected,
        expected,
        "{sc}: the scenario's own expectation"
    );
    {
        let lab = LabGuard::up(&Variants::default()).expect("lab up");
        let report = lab.run(sc).expect("scenario runs");
        eprintln!("{report} {:?}", report.attempt);
        assert_eq!(report.outcome(), expected, "{report}");
        assert_eq!(
            lab.variants().unwrap(),
            sc.spec().variants,
            "{sc}: variants set"
        );
        if let Some(who) = answered_by {
            let answer = report.attempt.answer.clone().unwrap_or_default();
            assert!(
                answer.contains(who),
                "{sc}: answered by {answer:?}, expected {who:?}"
            );
        }
    }
    assert_clean();
}

/// One test a scenario: its name, then the scenario, the outcome [`scenario`] expects and the
/// server that answers (if one does).
macro_rules! scenarios {
    ($($name:ident: $scenario:ident, $outcome:ident, $answered_by:expr;)*) => {
        $(
            #[test]
            fn $name() {
                scenario(Scenario::$scenario, Outcome::$outcome, $answered_by);
            }
        )*
    };
}

scenarios! {
    healthcheck_blackhole_times_out: HealthcheckBlackhole, Timeout, None;
    healthcheck_ok_when_vip_not_bound: HealthcheckOk, Ok, Some("pod-b");
    hairpin_times_out: Hairpin, Timeout, None;
    hairpin_with_strict_rp_filter_times_out: HairpinRpfilter, Timeout, None;
    hairpin_with_snat_reaches_the_peer: HairpinSnat, Ok, Some("peer node");
    vip_port_unserved_is_refused: VipPortUnserved, Refused, None;
    vip_port_served_locally: VipPortServed, Ok, Some("pod-b");
    outside_client_ok: OutsideClient, Ok, Some("pod-b");
    outside_client_ok_with_vip_bound: OutsideClientVipBound, Ok, Some("pod-b");
    pod_to_pod_ok: PodToPod, Ok, Some("pod-b");
    vip_port_unserved_under_the_ipvs_access_filter_is_refused: VipPortUnservedFiltered, Refused, None;
    vip_port_served_under_the_ipvs_access_filter: VipPortServedFiltered, Ok, Some("pod-b");
    vip_as_source_from_the_peer_times_out: VipAsSource, Timeout, None;
    snated_call_from_the_peer_reaches_pod_b: VipAsSourceSnat, Ok, Some("pod-b");
    vip_as_source_from_the_node_times_out: VipAsSourceOut, Timeout, None;
    etp_cluster_call_from_the_node_reaches_the_peer_pod: VipAsSourceOutCluster, Ok, Some("peer");
}

#[test]
fn up_then_down_leaves_nothing() {
    if !root() {
        return;
    }
    let _lock = LabLock::acquire().unwrap();
    Lab::down().unwrap();
    let host_nat_before = host_nat_rules();
    let v = Variants {
        vip_bound: false,
        rp_filter: true,
        masquerade: true,
        ..Variants::default()
    };
    Lab::up(&v).expect("lab up");
    let st = Lab::status().unwrap();
    assert!(st.is_up(), "{st}");
    assert_eq!(st.variants, Some(v), "{st}");
    assert_eq!(st.vip_rule, Some(false), "{st}");
    assert!(st.servers.iter().all(|(_, _, up)| *up), "{st}");
    let left = lab::leftovers().unwrap();
    assert!(left.iter().all(|l| !l.starts_with("host")), "{left:?}");
    assert!(
        left.iter().any(|l| l.starts_with("process")),
        "servers run: {left:?}"
    );
    assert_eq!(
        host_nat_rules(),
        host_nat_before,
        "the host's nat table was touched"
    );
    Lab::down().expect("lab down");
    assert_clean_locked();
    assert!(Lab::status().unwrap().is_down());
    Lab::down().expect("down is idempotent");
}

#[test]
fn variants_round_trip() {
    if !root() {
        return;
    }
    {
        let lab = LabGuard::up(&Variants::default()).expect("lab up");
        assert_eq!(lab.variants().unwrap(), Variants::default());
        assert_eq!(Lab::status().unwrap().vip_rule, Some(true));
        for v in Variant::ALL {
            for on in [true, false, true] {
                lab.set(v, on).unwrap();
                lab.set(v, on).unwrap(); // idempotent
                assert_eq!(lab.variants().unwrap().get(v), on, "{v} {on}");
            }
        }
        lab.set(Variant::VipBound, false).unwrap();
        assert_eq!(Lab::status().unwrap().vip_rule, Some(false));
    }
    assert_clean();
}

#[test]
fn failure_at_every_step_of_up_rolls_back() {
    if !root() {
        return;
    }
    let _lock = LabLock::acquire().unwrap();
    Lab::down().unwrap();
    for step in UP_STEPS {
        let opts = UpOptions {
            fail_after: Some(step.to_string()),
        };
        let err = Lab::up_with(&Variants::default(), &opts).expect_err("injected failure");
        let msg = format!("{err:#}");
        assert!(
            msg.contains("injected failure") && msg.contains(step),
            "{step}: {msg}"
        );
        let left = lab::leftovers().unwrap();
        assert!(left.is_empty(), "after failing at {step}: {left:?}");
    }
    let opts = UpOptions {
        fail_after: Some("no-such-step".into()),
    };
    assert!(Lab::up_with(&Variants::default(), &opts).is_err());
    assert_clean_locked();
}

#[test]
fn conflicting_namespace_fails_up_and_rolls_back_the_rest() {
    if !root() {
        return;
    }
    let _lock = LabLock::acquire().unwrap();
    Lab::down().unwrap();
    let ip = |args: &[&str]| {
        let st = Command::new("ip").args(args).status().unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    ip(&["netns", "add", lab::NS_POD_A]);
    let err = Lab::up(&Variants::default()).expect_err("namespace exists");
    let msg = format!("{err:#}");
    assert!(
        msg.contains(lab::NS_POD_A) && msg.contains("ip netns add"),
        "{msg}"
    );
    // Only the pre-existing namespace (not the lab's to remove) is left.
    assert_eq!(
        lab::leftovers().unwrap(),
        vec![format!("namespace {}", lab::NS_POD_A)]
    );
    ip(&["netns", "del", lab::NS_POD_A]);
    assert_clean_locked();
}

#[test]
fn guard_tears_down_when_the_test_panics() {
    if !root() {
        return;
    }
    let r = std::panic::catch_unwind(|| {
        let _lab = LabGuard::up(&Variants::default()).expect("lab up");
        assert!(Lab::status().unwrap().is_up());
        panic!("a failing test");
    });
    assert!(r.is_err());
    assert_clean();
}

#[test]
fn down_without_up_is_fine() {
    if !root() {
        return;
    }
    let _lock = LabLock::acquire().unwrap();
    Lab::down().unwrap();
    Lab::down().unwrap();
    assert!(Lab::status().unwrap().is_down());
    assert!(
        Lab::attach().traffic(Scenario::PodToPod).is_err(),
        "no lab, no traffic"
    );
}

fn host_nat_rules() -> String {
    let out = Command::new("iptables")
        .args(["-w", "-t", "nat", "-S"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The hairpin variants and their twins (issue 10, item 4), in one lab: each comes to its
/// outcome, answered by the server it names.
#[test]
fn hairpin_variants_and_their_twins() {
    if !root() {
        return;
    }
    {
        let lab = LabGuard::up(&Variants::default()).expect("lab up");
        for (sc, expected, answered_by) in [
            (Scenario::HairpinNodeSourced, Outcome::Timeout, None),
            (Scenario::NodeToLbGuarded, Outcome::Ok, Some("peer node")),
            (Scenario::HairpinLbToPod, Outcome::Timeout, None),
            (
                Scenario::OutsideClientLbToPod,
                Outcome::Ok,
                Some("pod-b web"),
            ),
            (Scenario::HairpinUdp, Outcome::Timeout, None),
            (Scenario::OutsideClientUdp, Outcome::Ok, Some("pod-b dns")),
        ] {
            assert_eq!(sc.spec().expected, expected, "{sc}");
            let report = lab.run(sc).expect("scenario runs");
            eprintln!("{report} {:?}", report.attempt);
            assert_eq!(report.outcome(), expected, "{report}");
            if let Some(who) = answered_by {
                let answer = report.attempt.answer.clone().unwrap_or_default();
                assert!(answer.contains(who), "{sc}: answered by {answer:?}");
            }
        }
    }
    assert_clean();
}
