//! Every reader's parser fuzzed with proptest for a bounded number of cases.

use std::{process::Command, time::Instant};

use anyhow::Result;

use super::row::Row;
use crate::workspace_root;

/// proptest over every reader's input (probe-user's `fuzz_` tests) with `cases` cases each.
pub(super) fn fuzz(cases: u32) -> Result<Row> {
    let t = Instant::now();
    // probe-user's unit-test executable from the build every step shares (a `cargo test -p
    // probe-user` would compile probe-user again with its own feature set).
    let unit = crate::build::host(&workspace_root())?
        .into_iter()
        .find(|(p, _, k, _)| p == "clb-probe" && k.iter().any(|k| k == "lib"))
        .map(|a| a.3)
        .ok_or_else(|| anyhow::anyhow!("cargo built no clb-probe unit-test executable"))?;
    let out = Command::new(unit)
        .arg("fuzz_")
        .env("PROPTEST_CASES", cases.to_string())
        .current_dir(workspace_root().join("probe-user"))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = text
        .lines()
        .find(|l| l.starts_with("test result:"))
        .unwrap_or("no summary")
        .to_string();
    let tests = text
        .lines()
        .filter(|l| l.starts_with("test fuzz_") && (l.ends_with(" ok") || l.ends_with("FAILED")))
        .count();
    Ok(Row {
        fault: "parsers fuzzed (proptest): IPVS and conntrack netlink replies, iptables-save text, recorded event streams (replayed through the correlator), prefixes; real captures mutated, truncated, spliced, and arbitrary input".into(),
        checked: "no panic: a value or a clear error".into(),
        figure: format!(
            "{tests} targets x {cases} cases in {:.0} s (build included)",
            t.elapsed().as_secs_f64()
        ),
        verdict: if out.status.success() {
            Ok("no panic".into())
        } else {
            Err(format!(
                "{summary}\n{}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .filter(|l| l.contains("panicked") || l.contains("minimal failing"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ))
        },
    })
}
