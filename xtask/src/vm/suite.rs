//! The VM tier's default command: test binaries built on the host, run in one boot per kernel
//! against the IPVS-mode lab.
//!
//! The guest sees the host's `/` at the same paths, so the executables cargo names (absolute
//! paths in its JSON messages) run there unchanged, as long as the target dir is not under
//! `/tmp` or `/run` (fresh tmpfs in the guest).

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::{KernelSpec, shell_quote};

/// The integration test files (tests/tests/*.rs) the VM runs (built once on the host).
/// (`loopback` is not here: `ipvs` drives the same failures and twins in the IPVS-mode lab with
/// the same assertions, in two lab start-ups instead of ten.)
pub const TEST_FILES: &[&str] = &[
    "ipvs",
    "datapath",
    "check",
    "nftables",
    "source_ranges",
    "etp_local_iptables",
    "etp_local_host_caller",
    "ipvs_stale_udp",
    "ipvs_source_ranges6",
];

/// The three kinds and their twins in the IPVS-mode lab, with that kernel's drop reasons or
/// drop sites (also the arm64 run's).
pub const THREE_KINDS_TEST: &str = "ipvs_mode_failures_are_confirmed_and_twins_are_silent";

/// What each kernel's boot runs after the IPVS reader, in order: (kernel, test file, its tests),
/// in the IPVS-mode lab.
///
/// Why spread, not everything everywhere: under TCG on this 2-core machine a test costs about
/// ten times its host time (datapath.rs: 37 s on the host, 363 s in the 6.1 guest), the 2 cores
/// hold two one-vCPU boots at once at best, and CI has 60 minutes for everything. So each test
/// runs where a kernel changes its outcome, once:
/// - the three kinds with their twins on 5.10 and 6.1, one per drop-reason class (5.10: no
///   reasons, drop sites decide; 6.1: a local source is `NOT_SPECIFIED` at route input; 6.12
///   is 6.1's class, the host's 6.18 the `IP_*_SOURCE` one); on 5.10 also the hairpin, its
///   variants and the self-loop, whose drops are named from their sites there; and
///   `etp_local_drop` (nftables.rs, its own nftables-mode lab: kube-proxy's drop is named
///   `NETFILTER_DROP` only from its `nf_hook_slow` site there). kube-proxy's nftables mode
///   itself wants 5.13 or later (kubernetes `pkg/proxy/nftables/supported.go`'s kernel
///   check; "requires Linux kernel 5.13 or later", docs.aws.amazon.com/eks/latest/
///   best-practices/nftables.html), so no real node runs it on 5.10: the boot stands for the
///   5.13-5.16 kernels (Ubuntu 22.04's 5.15) that pass no drop reason either;
/// - on 6.1, the one amd64 kernel without tcx: the clsact datapath tests (kube-ipvs0
///   re-attached, nothing left after SIGTERM or SIGKILL, foreign filters kept) and the
///   iptables-mode older-kernel script;
/// - on 6.12: the rest of `ipvs.rs` (the access filter, IPVS changes read without a timer,
///   names, `--as nftables`, IPVS services left after a switch to nftables mode, issue #51's
///   source-range shape in IPVS mode with its twin) and
///   `probe check`'s IPVS-mode prediction;
/// - on 5.10 and 6.12, issue #51's two shapes that end in kube-proxy's own netfilter drop,
///   each confirmed with its silent twin: `source_ranges_drop` (source_ranges.rs, its own
///   nftables-mode lab; on 5.10 for the same 5.13-5.16 kernels as above) and the
///   local-traffic detector's miss (etp_local_iptables.rs, its own iptables-mode lab). 5.10
///   names the drop from its `nf_hook_slow` site, 6.12 from its reason. And the node's own
///   (host-network) call in `etp_local_drop`'s nftables-mode lab, confirmed with its twin
///   (etp_local_host_caller.rs): its drop has no device at the output hook, so the drop
///   program reads its namespace through `skb->sk`, whose BTF offsets these kernels give
///   (measured: 119 s on 5.10, 128 s on 6.12, on a loaded machine).
/// - 6.1 also runs IPVS mode with the API's table (issue #52): the per-question virtual-service
///   look-up (`IPVS_CMD_GET_SERVICE`) names a port the API serves and IPVS lacks.
/// - on 5.10 and 6.12, issue #51's stale UDP shape in IPVS mode (ipvs_stale_udp.rs): real
///   IPVS carries a fixed-port sender's datagrams to the current endpoint every way in (the
///   real server replaced; the sender older than the virtual service; the Service scaled to
///   zero and back), nothing reported;
///   and its source-range shape over IPv6 (ipvs_source_ranges6.rs: the IPv6 proxier's
///   `KUBE-6-` ipsets and ip6tables chains), confirmed with its silent twin (5.10 names the
///   drop from its `nf_hook_slow` site, 6.12 from its reason).
///
/// The two lanes balance: 5.10 is the slowest guest (its reader takes twice 6.1's time).
///
/// A unit test holds every `ipvs.rs` test (IPVS exists only in the VM) to a kernel here. The
/// rest of datapath.rs and check.rs runs on the host.
pub const PLAN: &[(&str, &str, &[&str])] = &[
    // First in its boot: after the IPVS-mode tests its agent did not get past loading (run
    // of 2026-11-27: its stderr closed with no error line, in the 1 GiB guest).
    (
        "5.10",
        "nftables",
        &["nftables_no_endpoint_drop_of_a_pods_call_is_confirmed_with_the_element"],
    ),
    // Before the IPVS-mode tests too, for the same reason.
    ("5.10", "source_ranges", SOURCE_RANGES_SHAPE),
    ("5.10", "etp_local_iptables", DETECTOR_MISS_SHAPE),
    ("5.10", "etp_local_host_caller", HOST_CALLER_SHAPE),
    (
        "5.10",
        "ipvs",
        &[
            THREE_KINDS_TEST,
            "ipvs_mode_fails_clearly_without_ipvs",
            "ipvs_mode_hairpin_is_confirmed",
            "ipvs_mode_hairpin_variants_are_confirmed_and_twins_are_silent",
            "ipvs_mode_service_self_loop_is_confirmed_and_twins_are_silent",
        ],
    ),
    ("5.10", "ipvs_stale_udp", IPVS_STALE_UDP),
    ("5.10", "ipvs_source_ranges6", IPVS_SOURCE_RANGES6),
    (
        "6.1",
        "ipvs",
        &[
            THREE_KINDS_TEST,
            "ipvs_mode_a_port_the_api_serves_and_ipvs_lacks_is_named",
        ],
    ),
    (
        "6.1",
        "datapath",
        &[
            "address_changes_after_start_are_followed_and_kube_ipvs0_is_reattached",
            "nothing_stays_attached_after_exit_sigterm_or_sigkill",
            "clsact_fallback_keeps_foreign_filters",
        ],
    ),
    (
        "6.12",
        "ipvs",
        &[
            "ipvs_mode_access_filter_unserved_port_is_confirmed",
            "ipvs_mode_virtual_service_added_is_read_without_a_timer_tick",
            "ipvs_mode_first_events_are_named_and_on_the_service",
            "ipvs_mode_as_nftables_prediction_matches_the_nftables_lab",
            "ipvs_services_left_after_the_switch_to_nftables_are_named",
            "ipvs_mode_source_ranges_drop_is_confirmed_with_the_ipsets",
            "ipvs_mode_source_ranges_with_the_pod_cidr_report_nothing",
        ],
    ),
    (
        "6.12",
        "check",
        &["each_lab_risk_is_named_and_its_twin_is_not"],
    ),
    ("6.12", "source_ranges", SOURCE_RANGES_SHAPE),
    ("6.12", "etp_local_iptables", DETECTOR_MISS_SHAPE),
    ("6.12", "etp_local_host_caller", HOST_CALLER_SHAPE),
    ("6.12", "ipvs_stale_udp", IPVS_STALE_UDP),
    ("6.12", "ipvs_source_ranges6", IPVS_SOURCE_RANGES6),
];

/// Issue #51's source-range shape in IPVS mode over IPv6: confirmed with the `KUBE-6-` sets,
/// the pod range in them silent.
const IPVS_SOURCE_RANGES6: &[&str] = &[
    "ipvs_mode_ipv6_source_ranges_drop_is_confirmed_with_the_v6_ipsets",
    "ipvs_mode_ipv6_source_ranges_with_the_pod_range_report_nothing",
];

/// Issue #51's stale UDP shape in IPVS mode: each way into it (the real server replaced, the
/// sender older than the virtual service, the Service scaled to zero and back), the datagrams
/// delivered and nothing reported.
const IPVS_STALE_UDP: &[&str] = &[
    "ipvs_mode_a_fixed_port_udp_sender_follows_the_real_server_change_and_nothing_is_reported",
    "ipvs_mode_a_sender_started_before_the_virtual_service_reaches_it_and_nothing_is_reported",
    "ipvs_mode_a_udp_service_scaled_to_zero_and_back_reaches_the_new_endpoint_and_nothing_is_reported",
];

/// Issue #51's source-range shape: a pod outside `loadBalancerSourceRanges` confirmed, the
/// pod CIDR in the ranges silent.
const SOURCE_RANGES_SHAPE: &[&str] = &[
    "source_ranges_drop_of_a_pods_call_is_confirmed_with_the_ranges",
    "source_ranges_with_the_pod_cidr_report_nothing",
];

/// Issue #51's detector-miss shape: the local-traffic detector that misses the pod confirmed
/// in iptables mode's drop, the one that matches it silent.
const DETECTOR_MISS_SHAPE: &[&str] = &[
    "iptables_detector_that_misses_the_pod_is_named_in_the_drop",
    "iptables_detector_that_matches_the_pod_short_circuits_it_and_reports_nothing",
];

/// Issue #51 shape 2's host-network caller: the node's own call dropped by nftables mode's
/// `no-endpoint-services` confirmed, the twin with a local endpoint silent.
const HOST_CALLER_SHAPE: &[&str] = &[
    "nftables_no_endpoint_drop_of_the_nodes_own_call_is_confirmed_as_a_host_caller",
    "nftables_nodes_own_call_with_a_local_endpoint_is_answered_and_reports_nothing",
];

/// The lab a test file brings up: most files take `CLB_LAB_MODE` (ipvs here); these start
/// their own mode's lab, whatever it says.
fn lab_of(file: &str) -> &'static str {
    match file {
        // etp_local_host_caller's iptables-mode tests stay on the host.
        "nftables" | "source_ranges" | "etp_local_host_caller" => "nftables-mode lab",
        "etp_local_iptables" => "iptables-mode lab",
        _ => "IPVS-mode lab",
    }
}

/// The kernel that also runs the iptables-mode older-kernel script.
pub const OLDER_KERNEL_SCRIPT_ON: &str = "6.1";

/// The probe-user unit tests run in the VM (they need real IPVS).
pub const UNIT_FILTER: &str = "state::ipvs";

/// What the suite runs, all built on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bins {
    /// The agent (`CLB_PROBE_BIN`).
    pub probe: PathBuf,
    /// probe-user's unit-test executable.
    pub unit: PathBuf,
    /// (test file, executable), in [`TEST_FILES`] order.
    pub tests: Vec<(String, PathBuf)>,
    /// The iptables-mode older-kernel script runs too (it uses the workspace's own
    /// `target/debug` binaries: only when those are the ones just built).
    pub older_kernel: bool,
}

/// Builds everything the suite runs: the host build every step shares ([`crate::build::host`];
/// nothing left to compile when `cargo xtask test` already made it).
pub fn build(root: &Path) -> anyhow::Result<Bins> {
    let built = crate::build::host(root)?;
    let probe = crate::build::probe_binary(&built, "")?;
    let unit = built
        .iter()
        .find(|(p, _, k, _)| p == "clb-probe" && k.iter().any(|k| k == "lib"))
        .map(|a| a.3.clone())
        .context("cargo built no clb-probe unit-test executable")?;
    let tests = crate::build::test_executables(&built, TEST_FILES, "")?;
    let older_kernel = root.join("xtask/src/vm/older-kernel.sh").is_file()
        && probe == root.join("target/debug/probe");
    Ok(Bins {
        probe,
        unit,
        tests,
        older_kernel,
    })
}

/// How many times longer the tests' waits may be in a guest (`test_support::PATIENCE_ENV`):
/// under TCG the same code runs 10-24x slower than on the host (BENCHMARKS 9h), and beside the
/// host tests an agent's start took 28-48 s against ~1 s (CI runs 41-42), so a 10 s wait for an
/// event missed it by 0.1 s. The waits end when what they wait for comes, so only a failing
/// test waits the whole time.
pub const GUEST_PATIENCE: u32 = 6;

/// The start of a guest script: the `# comment` line, the tests' patience, then `part NAME
/// CMD...`, which runs one part, prints its wall time and adds its name to `failed` when it
/// fails.
pub(crate) fn script_prelude(comment: &str) -> String {
    format!(
        "# {comment}\nexport {}={GUEST_PATIENCE}\n{PART}",
        test_support::PATIENCE_ENV
    )
}

const PART: &str = "set -u\n\
         failed=()\n\
         part() {\n\
         \tlocal name=$1; shift\n\
         \tlocal t0=$SECONDS\n\
         \techo \"=== vm-suite: $name\"\n\
         \tif \"$@\"; then\n\
         \t\techo \"=== vm-suite: $name: ok ($((SECONDS - t0)) s)\"\n\
         \telse\n\
         \t\techo \"=== vm-suite: $name: FAILED ($((SECONDS - t0)) s)\"\n\
         \t\tfailed+=(\"$name\")\n\
         \tfi\n\
         }\n";

/// The guest script for `kernel`: every part runs (one failing does not stop the rest), the
/// exit code says whether all passed, and each part's wall time is printed.
pub fn script(b: &Bins, kernel: &KernelSpec) -> String {
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let mut s = script_prelude("the VM suite, written by cargo xtask vm-test");
    s.push_str(
        "echo \"=== vm-suite: kernel $(uname -r)\"\n\
         modprobe -a ip_vs ip_vs_rr dummy ip_set xt_set 2>/dev/null\n",
    );
    s.push_str(&format!("export CLB_PROBE_BIN={}\n", q(&b.probe)));
    s.push_str(&format!(
        "part 'IPVS generic-netlink reader (real IPVS)' {} {UNIT_FILTER} --test-threads=1\n",
        q(&b.unit)
    ));
    let exe = |file: &str| b.tests.iter().find(|(f, _)| f == file).map(|(_, e)| q(e));
    for (_, file, tests) in PLAN.iter().filter(|(k, _, _)| *k == kernel.name) {
        let Some(path) = exe(file) else { continue };
        let what = match tests {
            [THREE_KINDS_TEST] => "the three kinds".to_string(),
            t => format!("{} of its tests", t.len()),
        };
        let lab = lab_of(file);
        s.push_str(&format!(
            "CLB_LAB_MODE=ipvs part 'tests/{file}.rs ({what}) ({lab})' {path} --exact {} \
             --test-threads=1\n",
            tests.join(" ")
        ));
    }
    if kernel.name == OLDER_KERNEL_SCRIPT_ON {
        if b.older_kernel {
            s.push_str(
                "part 'older-kernel.sh (iptables-mode lab)' bash xtask/src/vm/older-kernel.sh\n",
            );
        } else {
            s.push_str(
                "echo '=== vm-suite: skipping older-kernel.sh: it runs target/debug binaries, \
                 and this build went elsewhere (CARGO_TARGET_DIR)'\n",
            );
        }
    }
    s.push_str(
        "if [ ${#failed[@]} -eq 0 ]; then echo '=== vm-suite: all passed'; exit 0; fi\n\
         echo \"=== vm-suite: FAILED: ${failed[*]}\"\n\
         exit 1\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kernel_runs_the_reader_and_its_own_part() {
        let b = Bins {
            probe: "/t/probe".into(),
            unit: "/t/clb_probe-1".into(),
            tests: vec![
                ("ipvs".into(), "/t/ipvs-1".into()),
                ("datapath".into(), "/t/datapath-1".into()),
                ("check".into(), "/t/check-1".into()),
                ("nftables".into(), "/t/nftables-1".into()),
                ("source_ranges".into(), "/t/source_ranges-1".into()),
                (
                    "etp_local_iptables".into(),
                    "/t/etp_local_iptables-1".into(),
                ),
                (
                    "etp_local_host_caller".into(),
                    "/t/etp_local_host_caller-1".into(),
                ),
            ],
            older_kernel: false,
        };
        let script_of = |name| script(&b, crate::vm::kernel::spec(name).unwrap());
        for name in ["5.10", "6.1", "6.12"] {
            let s = script_of(name);
            assert!(s.contains("export CLB_PROBE_BIN='/t/probe'"), "{name}");
            assert!(s.contains("\nexport CLB_TEST_PATIENCE=6\n"), "{name}");
            assert!(
                s.contains("'/t/clb_probe-1' state::ipvs --test-threads=1"),
                "{name}"
            );
            assert!(s.ends_with("exit 1\n"), "{name}");
        }
        // The three kinds on one kernel of each drop-reason class the VM has.
        let s = script_of("5.10");
        assert!(s.contains(&format!(
            "'/t/ipvs-1' --exact {THREE_KINDS_TEST} ipvs_mode_fails_clearly_without_ipvs \
             ipvs_mode_hairpin_is_confirmed"
        )));
        assert!(!s.contains("/t/datapath-1") && !s.contains("/t/check-1"));
        assert!(s.contains(
            "part 'tests/nftables.rs (1 of its tests) (nftables-mode lab)' '/t/nftables-1' \
             --exact nftables_no_endpoint_drop_of_a_pods_call_is_confirmed_with_the_element"
        ));
        // 6.1: the clsact datapath tests, the older-kernel script (skipped here: the binaries
        // are not the workspace's own).
        let s = script_of("6.1");
        assert!(s.contains(&format!(
            "part 'tests/ipvs.rs (2 of its tests) (IPVS-mode lab)' '/t/ipvs-1' --exact \
             {THREE_KINDS_TEST} ipvs_mode_a_port_the_api_serves_and_ipvs_lacks_is_named"
        )));
        assert!(s.contains(
            "part 'tests/datapath.rs (3 of its tests) (IPVS-mode lab)' '/t/datapath-1' --exact \
             address_changes_after_start_are_followed_and_kube_ipvs0_is_reattached"
        ));
        assert!(s.contains("skipping older-kernel.sh"));
        assert!(!s.contains("/t/check-1"));
        let s = script_of("6.12");
        assert!(!s.contains(THREE_KINDS_TEST));
        assert!(s.contains(
            "'/t/check-1' --exact each_lab_risk_is_named_and_its_twin_is_not --test-threads=1"
        ));
        assert!(s.contains("ipvs_mode_virtual_service_added_is_read_without_a_timer_tick"));
        assert!(!s.contains("/t/datapath-1") && !s.contains("older-kernel"));
        // Issue #51's two shapes on 5.10 and 6.12, each in its own mode's lab; not on 6.1.
        for name in ["5.10", "6.12"] {
            let s = script_of(name);
            assert!(
                s.contains(
                    "part 'tests/source_ranges.rs (2 of its tests) (nftables-mode lab)' \
                     '/t/source_ranges-1' --exact \
                     source_ranges_drop_of_a_pods_call_is_confirmed_with_the_ranges \
                     source_ranges_with_the_pod_cidr_report_nothing --test-threads=1"
                ),
                "{name}"
            );
            assert!(
                s.contains(
                    "part 'tests/etp_local_iptables.rs (2 of its tests) (iptables-mode lab)' \
                     '/t/etp_local_iptables-1' --exact \
                     iptables_detector_that_misses_the_pod_is_named_in_the_drop \
                     iptables_detector_that_matches_the_pod_short_circuits_it_and_reports_nothing"
                ),
                "{name}"
            );
            assert!(
                s.contains(
                    "part 'tests/etp_local_host_caller.rs (2 of its tests) (nftables-mode lab)' \
                     '/t/etp_local_host_caller-1' --exact \
                     nftables_no_endpoint_drop_of_the_nodes_own_call_is_confirmed_as_a_host_caller"
                ),
                "{name}"
            );
        }
        let s = script_of("6.1");
        assert!(!s.contains("/t/source_ranges-1") && !s.contains("/t/etp_local_iptables-1"));
        assert!(!s.contains("/t/etp_local_host_caller-1"));
    }

    /// The `#[test]` functions of tests/tests/<file>.rs.
    fn tests_of(file: &str) -> Vec<String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/tests/{file}.rs"));
        let src = std::fs::read_to_string(&path).unwrap();
        src.split("#[test]")
            .skip(1)
            .filter_map(|rest| rest.trim_start().strip_prefix("fn "))
            .map(|rest| rest.split('(').next().unwrap().to_string())
            .collect()
    }

    /// The test files that run only in the VM (real IPVS): each of their tests must be in
    /// [`PLAN`].
    const VM_ONLY_FILES: &[&str] = &["ipvs", "ipvs_stale_udp", "ipvs_source_ranges6"];

    /// `ipvs.rs` (and the other [`VM_ONLY_FILES`]) runs only in the VM: each of its tests must
    /// run on some kernel, so a new one that nobody placed in [`PLAN`] fails here instead of
    /// never running.
    #[test]
    fn every_ipvs_test_runs_on_some_kernel() {
        assert!(tests_of("ipvs").len() >= 9);
        for file in VM_ONLY_FILES {
            assert!(TEST_FILES.contains(file), "{file}");
            for t in tests_of(file) {
                let placed = PLAN
                    .iter()
                    .any(|(_, f, list)| f == file && list.contains(&t.as_str()));
                assert!(
                    placed,
                    "tests/{file}.rs's {t} runs on no VM kernel: add it to PLAN"
                );
            }
        }
    }

    /// Issue #51's stale UDP and IPv6 source-range shapes in IPVS mode run on 5.10 and 6.12.
    #[test]
    fn the_ipvs_stale_udp_shape_runs_on_5_10_and_6_12() {
        for kernel in ["5.10", "6.12"] {
            for (file, shape) in [
                ("ipvs_stale_udp", IPVS_STALE_UDP),
                ("ipvs_source_ranges6", IPVS_SOURCE_RANGES6),
            ] {
                assert!(
                    PLAN.iter()
                        .any(|(k, f, list)| *k == kernel && *f == file && *list == shape),
                    "{kernel} {file}"
                );
            }
        }
    }

    /// `--exact` with a name that matches nothing runs nothing and passes: every name in
    /// [`PLAN`] must be a test of its file.
    #[test]
    fn every_planned_test_exists() {
        for (kernel, file, list) in PLAN {
            let tests = tests_of(file);
            for t in *list {
                assert!(
                    tests.iter().any(|x| x == t),
                    "PLAN's {kernel} names {t}, which tests/tests/{file}.rs does not have"
                );
            }
        }
        // The arm64 run's lists too.
        let datapath = tests_of("datapath");
        for t in crate::vm::arm64::DATAPATH_SMOKE {
            assert!(
                datapath.iter().any(|x| x == t),
                "arm64's datapath smoke names {t}"
            );
        }
        assert!(tests_of("ipvs").iter().any(|x| x == THREE_KINDS_TEST));
    }

    /// Issue #51's done-when: the source-range and detector-miss shapes, each confirmed case
    /// with its twin, run on 5.10 and 6.12; so does the host-network caller's drop.
    #[test]
    fn issue_51_shapes_run_on_5_10_and_6_12() {
        for kernel in ["5.10", "6.12"] {
            for (file, shape) in [
                ("source_ranges", SOURCE_RANGES_SHAPE),
                ("etp_local_iptables", DETECTOR_MISS_SHAPE),
                ("etp_local_host_caller", HOST_CALLER_SHAPE),
            ] {
                let planned = PLAN
                    .iter()
                    .any(|(k, f, list)| *k == kernel && *f == file && *list == shape);
                assert!(planned, "{kernel} runs no {file} shape");
            }
        }
    }

    #[test]
    fn the_plan_names_only_matrix_kernels_and_built_files() {
        for (kernel, file, _) in PLAN {
            assert!(crate::vm::kernel::spec(kernel).is_some(), "{kernel}");
            assert!(TEST_FILES.contains(file), "{file}");
        }
        assert!(crate::vm::kernel::spec(OLDER_KERNEL_SCRIPT_ON).is_some());
    }
}
