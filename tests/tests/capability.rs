//! No silent blind spots (issue 10, item 8): with drop sites unresolvable
//! (`kernel.kptr_restrict=2`), with conntrack failing, or without a drop hook, the agent says
//! once what it cannot confirm and exposes it as `clbprobe_capability{name}`.
//!
//! Root only. kptr_restrict is host-wide: the test sets it while holding the lab's lock (every
//! lab user takes it) and restores it on drop, also when it fails.

use std::time::Duration;

use probe_contract::{Outcome as Fate, SnatState};
use probe_tests::agent::{Agent, lines};
use test_support::lab::{self, LabGuard, Outcome, Scenario, Variants, http_get_in};

const METRICS: &str = "127.0.0.1:9978";
const SETTLE: Duration = Duration::from_secs(4);

fn agent(env: &[(&str, &str)]) -> Agent {
    Agent::start_with_env(
        lab::NS_NODE,
        &["--nic", lab::NODE_NIC, "--metrics-addr", METRICS],
        env,
    )
}

/// `clbprobe_capability{name="<name>"}`'s value.
fn capability(name: &str) -> Option<u8> {
    let (_, body) = http_get_in(lab::NS_NODE, METRICS, "/metrics")?;
    let prefix = format!("clbprobe_capability{{name=\"{name}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Restores a sysctl file's value on drop.
struct Restore(&'static str, String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0, &self.1);
    }
}

#[test]
fn unresolvable_drop_sites_are_said_once_and_exposed() {
    const KPTR: &str = "/proc/sys/kernel/kptr_restrict";
    let Some(lab) = LabGuard::for_test("kptr_restrict", &Variants::default()) else {
        return;
    };
    let old = std::fs::read_to_string(KPTR).expect("kptr_restrict");
    let _restore = Restore(KPTR, old.trim().to_string());
    std::fs::write(KPTR, "2").expect("set kptr_restrict=2");
    let mut agent = agent(&[]);
    assert_eq!(capability("drop_sites"), Some(0));
    assert_eq!(capability("drop_hook"), Some(1));
    assert_eq!(capability("conntrack"), Some(1));
    // Two health checks: the drops still confirm (this kernel names the reason), without a
    // drop site, and the blind spot is said once, not per drop.
    for _ in 0..2 {
        assert_eq!(
            lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
            Outcome::Timeout
        );
    }
    let e = agent.wait_event("healthcheck_blackhole", Duration::from_secs(10), |es| {
        es.first().cloned()
    });
    assert_eq!(e.drop_reason.as_deref(), Some("IP_LOCAL_SOURCE"));
    assert_eq!(e.drop_location, None, "{e:#?}");
    assert_eq!(agent.count_log("drop sites cannot be resolved"), 1);
}

#[test]
fn failing_conntrack_is_not_no_entry_and_is_said_once() {
    let Some(lab) = LabGuard::for_test("conntrack_failure", &Variants::default()) else {
        return;
    };
    let mut agent = agent(&[(
        "CLB_PROBE_TEST_CONNTRACK_ERROR",
        "netlink: Operation not permitted (injected)",
    )]);
    assert_eq!(capability("conntrack"), Some(1), "nothing failed yet");
    assert_eq!(lab.traffic(Scenario::Hairpin).unwrap(), Outcome::Timeout);
    std::thread::sleep(SETTLE);
    let e = agent.wait_event("hairpin", Duration::from_secs(10), |es| es.first().cloned());
    // Egress and outcome look-ups both failed: SNAT unknown, said as a failure.
    assert_eq!(e.snat, SnatState::Unknown, "{e:#?}");
    assert_eq!(e.outcome, Fate::NoReply, "{e:#?}");
    let ev = lines(&e.evidence);
    assert!(ev.contains("egress flow failed"), "{e:#?}");
    assert!(!ev.contains("no entry for the egress flow"), "{e:#?}");
    assert_eq!(capability("conntrack"), Some(0));
    assert_eq!(agent.count_log("conntrack look-ups fail"), 1);
}

#[test]
fn a_missing_drop_hook_is_said_once_and_exposed() {
    let Some(lab) = LabGuard::for_test("no_drop_hook", &Variants::default()) else {
        return;
    };
    let mut agent = agent(&[("CLB_PROBE_TEST_NO_DROP_HOOK", "1")]);
    assert_eq!(capability("drop_hook"), Some(0));
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    std::thread::sleep(Duration::from_secs(1));
    // Blind to drops: the health check is a suspect only, never confirmed.
    assert!(agent.events().is_empty(), "{:#?}", agent.events());
    assert_eq!(agent.count_log("no kfree_skb hook"), 1);
}
