//! The VM tier's default command: test binaries built on the host, run in one boot per kernel
//! against the IPVS-mode lab.
//!
//! The guest sees the host's `/` at the same paths, so the executables cargo names (absolute
//! paths in its JSON messages) run there unchanged, as long as the target dir is not under
//! `/tmp` or `/run` (fresh tmpfs in the guest).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::{KernelSpec, shell_quote};

/// The integration test files (tests/tests/*.rs) the VM runs (built once on the host).
/// (`loopback` is not here: `ipvs` drives the same failures and twins in the IPVS-mode lab with
/// the same assertions, in two lab start-ups instead of ten.)
pub const TEST_FILES: &[&str] = &["ipvs", "datapath", "check"];

/// The test every kernel runs: the three kinds and their twins in the IPVS-mode lab, with that
/// kernel's drop reasons or drop sites.
pub const THREE_KINDS_TEST: &str = "ipvs_mode_failures_are_confirmed_and_twins_are_silent";

/// What one kernel's boot runs beyond the IPVS reader and [`THREE_KINDS_TEST`]: each file's
/// tests (`None`: the whole file), in the IPVS-mode lab.
///
/// Why spread, not everything everywhere: under TCG a boot costs 5 to 25 minutes of CI's 60,
/// and the parts differ in what a kernel changes. The three kinds run on every kernel; `ipvs.rs`
/// is IPVS-only, so each of its other tests runs on one kernel (a unit test holds every test of
/// the file to a place here): the drop-site-sensitive hairpin and self-loop shapes on 5.10, the
/// oldest (no drop reasons, the oldest verifier), the state-reading ones on 6.12. 6.1 (no tcx)
/// runs the datapath file on clsact and the iptables-mode older-kernel script; 6.12 also `probe
/// check`'s IPVS-mode predictions. Those files' other tests run on the host's 6.18.
pub const PLAN: &[(&str, &str, Option<&[&str]>)] = &[
    (
        "5.10",
        "ipvs",
        Some(&[
            "ipvs_mode_fails_clearly_without_ipvs",
            "ipvs_mode_hairpin_is_confirmed",
            "ipvs_mode_hairpin_variants_are_confirmed_and_twins_are_silent",
            "ipvs_mode_service_self_loop_is_confirmed_and_twins_are_silent",
        ]),
    ),
    ("6.1", "datapath", None),
    (
        "6.12",
        "ipvs",
        Some(&[
            "ipvs_mode_access_filter_unserved_port_is_confirmed",
            "ipvs_mode_virtual_service_added_is_read_without_a_timer_tick",
            "ipvs_mode_first_events_are_named_and_on_the_service",
            "ipvs_mode_as_nftables_prediction_matches_the_nftables_lab",
        ]),
    ),
    (
        "6.12",
        "check",
        Some(&[
            "each_lab_risk_is_named_and_its_twin_is_not",
            "as_nftables_predicts_what_the_nftables_lab_shows",
        ]),
    ),
];

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

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// One built artifact: (package name, target name, target kinds, executable).
pub type Artifact = (String, String, Vec<String>, PathBuf);

/// Runs a cargo command with `--message-format=json`; returns (package name, target name,
/// target kinds, executable) of every artifact with an executable.
pub(super) fn artifacts(root: &Path, args: &[&str]) -> anyhow::Result<Vec<Artifact>> {
    eprintln!("vm: cargo {}", args.join(" "));
    let out = cargo()
        .args(args)
        .arg("--message-format=json")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting cargo {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), out.status);
    }
    Ok(parse_artifacts(&String::from_utf8_lossy(&out.stdout)))
}

/// The compiler artifacts with an executable in cargo's JSON messages.
pub fn parse_artifacts(json_lines: &str) -> Vec<Artifact> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let exe = m["executable"].as_str()?;
            let package = m["package_id"].as_str().unwrap_or_default();
            // "path+file:///work/main/tests#probe-tests@0.1.0", "path+file:///w/probe-user#0.1.0"
            // (the folder is the name) or the older "probe-tests 0.1.0 (...)".
            let name = match package.rsplit_once('#') {
                Some((_, r)) if r.contains('@') => r.split('@').next().unwrap_or(r),
                Some((url, _)) => url.rsplit('/').next().unwrap_or(url),
                None => package.split(' ').next().unwrap_or(package),
            }
            .to_string();
            let kinds = m["target"]["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(String::from))
                .collect();
            Some((
                name,
                m["target"]["name"].as_str()?.to_string(),
                kinds,
                PathBuf::from(exe),
            ))
        })
        .collect()
}

/// The agent (the `probe` binary) among `built`; `what` names the build in the error (`""`,
/// `"arm64 "`).
pub(super) fn probe_binary(built: &[Artifact], what: &str) -> anyhow::Result<PathBuf> {
    built
        .iter()
        .find(|(_, t, k, _)| t == "probe" && k.iter().any(|k| k == "bin"))
        .map(|a| a.3.clone())
        .with_context(|| format!("cargo built no {what}`probe` binary"))
}

/// (test file, executable) of each of `files` (tests/tests/<file>.rs) among `built`, in
/// `files` order; `what` as for [`probe_binary`].
pub(super) fn test_executables(
    built: &[Artifact],
    files: &[&str],
    what: &str,
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    files
        .iter()
        .map(|file| {
            built
                .iter()
                .find(|(p, t, k, _)| {
                    p == "probe-tests" && t == file && k.iter().any(|k| k == "test")
                })
                .map(|a| (file.to_string(), a.3.clone()))
                .with_context(|| {
                    format!("cargo built no {what}test executable for tests/tests/{file}.rs")
                })
        })
        .collect()
}

/// Builds everything the suite runs.
pub fn build(root: &Path) -> anyhow::Result<Bins> {
    let built = artifacts(root, &["build", "-p", "probe-user", "-p", "xtask"])?;
    let probe = probe_binary(&built, "")?;
    let unit = artifacts(root, &["test", "-p", "probe-user", "--lib", "--no-run"])?
        .into_iter()
        .find(|(p, _, k, _)| p == "probe-user" && k.iter().any(|k| k == "lib"))
        .map(|a| a.3)
        .context("cargo built no probe-user unit-test executable")?;
    let all = artifacts(root, &["test", "-p", "probe-tests", "--tests", "--no-run"])?;
    let tests = test_executables(&all, TEST_FILES, "")?;
    let older_kernel = root.join("xtask/src/vm/older-kernel.sh").is_file()
        && probe == root.join("target/debug/probe");
    Ok(Bins {
        probe,
        unit,
        tests,
        older_kernel,
    })
}

/// The guest script for `kernel`: every part runs (one failing does not stop the rest), the
/// exit code says whether all passed, and each part's wall time is printed.
pub fn script(b: &Bins, kernel: &KernelSpec) -> String {
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let mut s = String::from(
        "# the VM suite, written by cargo xtask vm-test\n\
         set -u\n\
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
         }\n\
         echo \"=== vm-suite: kernel $(uname -r)\"\n\
         modprobe -a ip_vs ip_vs_rr dummy ip_set xt_set 2>/dev/null\n",
    );
    s.push_str(&format!("export CLB_PROBE_BIN={}\n", q(&b.probe)));
    s.push_str(&format!(
        "part 'IPVS generic-netlink reader (real IPVS)' {} {UNIT_FILTER} --test-threads=1\n",
        q(&b.unit)
    ));
    let exe = |file: &str| b.tests.iter().find(|(f, _)| f == file).map(|(_, e)| q(e));
    let plan: Vec<_> = PLAN.iter().filter(|(k, _, _)| *k == kernel.name).collect();
    let whole_ipvs = plan.iter().any(|(_, f, t)| *f == "ipvs" && t.is_none());
    if !whole_ipvs && let Some(ipvs) = exe("ipvs") {
        s.push_str(&format!(
            "CLB_LAB_MODE=ipvs part 'the three kinds (tests/ipvs.rs, IPVS-mode lab)' {ipvs} \
             --exact {THREE_KINDS_TEST} --test-threads=1\n"
        ));
    }
    for (_, file, tests) in plan {
        let Some(path) = exe(file) else { continue };
        let (what, filter) = match tests {
            None => ("", String::new()),
            Some(t) => (" (part)", format!(" --exact {}", t.join(" "))),
        };
        s.push_str(&format!(
            "CLB_LAB_MODE=ipvs part 'tests/{file}.rs{what} (IPVS-mode lab)' {path}{filter} \
             --test-threads=1\n"
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
    fn finds_executables_in_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","package_id":"path+file:///work/main/tests#probe-tests@0.1.0","target":{"kind":["test"],"name":"ipvs"},"executable":"/t/debug/deps/ipvs-1"}
{"reason":"compiler-artifact","package_id":"path+file:///work/main/probe-user#0.1.0","target":{"kind":["bin"],"name":"probe"},"executable":"/t/debug/probe"}
{"reason":"compiler-artifact","package_id":"serde 1.0.0 (registry+https://github.com/rust-lang/crates.io-index)","target":{"kind":["lib"],"name":"serde"},"executable":null}
{"reason":"build-finished","success":true}"#;
        let a = parse_artifacts(json);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].0, "probe-tests");
        assert_eq!(a[0].1, "ipvs");
        assert_eq!(a[0].3, PathBuf::from("/t/debug/deps/ipvs-1"));
        assert_eq!(a[1].0, "probe-user");
        assert_eq!(a[1].1, "probe");
    }

    #[test]
    fn each_kernel_runs_the_reader_the_three_kinds_and_its_own_part() {
        let b = Bins {
            probe: "/t/probe".into(),
            unit: "/t/clb_probe-1".into(),
            tests: vec![
                ("ipvs".into(), "/t/ipvs-1".into()),
                ("datapath".into(), "/t/datapath-1".into()),
                ("check".into(), "/t/check-1".into()),
            ],
            older_kernel: false,
        };
        let script_of = |name| script(&b, crate::vm::kernel::spec(name).unwrap());
        let three = format!(
            "part 'the three kinds (tests/ipvs.rs, IPVS-mode lab)' '/t/ipvs-1' --exact \
             {THREE_KINDS_TEST} --test-threads=1"
        );
        for name in ["5.10", "6.1", "6.12"] {
            let s = script_of(name);
            assert!(s.contains("export CLB_PROBE_BIN='/t/probe'"), "{name}");
            assert!(
                s.contains("'/t/clb_probe-1' state::ipvs --test-threads=1"),
                "{name}"
            );
            assert!(s.contains(&three), "{name}");
            assert!(s.ends_with("exit 1\n"), "{name}");
        }
        let s = script_of("5.10");
        assert!(s.contains(
            "part 'tests/ipvs.rs (part) (IPVS-mode lab)' '/t/ipvs-1' --exact \
             ipvs_mode_fails_clearly_without_ipvs ipvs_mode_hairpin_is_confirmed"
        ));
        assert!(!s.contains("/t/datapath-1") && !s.contains("/t/check-1"));
        // 6.1: the datapath file, the older-kernel script (skipped here: the binaries are not
        // the workspace's own).
        let s = script_of("6.1");
        assert!(
            s.contains("part 'tests/datapath.rs (IPVS-mode lab)' '/t/datapath-1' --test-threads=1")
        );
        assert!(s.contains("skipping older-kernel.sh"));
        assert!(!s.contains("/t/check-1") && !s.contains("(part)"));
        let s = script_of("6.12");
        assert!(s.contains(
            "'/t/check-1' --exact each_lab_risk_is_named_and_its_twin_is_not \
             as_nftables_predicts_what_the_nftables_lab_shows --test-threads=1"
        ));
        assert!(s.contains("ipvs_mode_virtual_service_added_is_read_without_a_timer_tick"));
        assert!(!s.contains("/t/datapath-1") && !s.contains("older-kernel"));
    }

    /// `ipvs.rs` runs only in the VM: each of its tests must run on some kernel, so a new one
    /// that nobody placed in [`PLAN`] fails here instead of never running.
    #[test]
    fn every_ipvs_test_runs_on_some_kernel() {
        let src = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests/ipvs.rs"),
        )
        .unwrap();
        let tests: Vec<&str> = src
            .split("#[test]")
            .skip(1)
            .filter_map(|rest| rest.trim_start().strip_prefix("fn "))
            .map(|rest| rest.split('(').next().unwrap())
            .collect();
        assert!(tests.len() >= 9, "{tests:?}");
        let placed = |t: &str| {
            t == THREE_KINDS_TEST
                || PLAN
                    .iter()
                    .any(|(_, f, list)| *f == "ipvs" && list.is_none_or(|l| l.contains(&t)))
        };
        for t in tests {
            assert!(
                placed(t),
                "tests/ipvs.rs's {t} runs on no VM kernel: add it to PLAN"
            );
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
