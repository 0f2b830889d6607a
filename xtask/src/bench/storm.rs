//! 6. **Correlation at scale**: a full 65,536-entry egress table (real kernel maps) and a
//!    hairpin storm of 10,000 suspects/s from 1,000 pod addresses through the agent's
//!    correlation logic (`probe-user/examples/correlation_storm.rs`; release build, debug with
//!    `--quick`): the per-suspect egress match time with the keyed look-up (the source's index
//!    plus the exact look-up of the suspect's own flow) against the walk of
//!    the whole table it replaced, and the storm's confirmations/s, correlation-loop CPU and queue depth with
//!    each. The walk's storm is shorter: it cannot keep up, the queue is full after a second.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

use super::report::{Table, spread};

/// One run of the example: its JSON object.
fn storm(root: &Path, profile: &str, args: &[&str]) -> Result<serde_json::Value> {
    let cargo = std::env::var_os("CARGO").unwrap_or("cargo".into());
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let out = crate::setup::output(
        std::process::Command::new(target.join(profile).join("examples/correlation_storm"))
            .args(args),
    )
    .with_context(|| format!("running correlation_storm (built with {cargo:?})"))?;
    serde_json::from_str(&out).context("correlation_storm's output")
}

/// Builds the example: release for figures; `--quick` (CI's smoke run) takes the debug build,
/// whose dev-dependencies the tests have already built.
fn build(root: &Path, release: bool) -> Result<()> {
    eprintln!("bench: cargo build -p clb-probe --example correlation_storm (release: {release})");
    let mut build = crate::build::workspace_cargo(root, "build");
    build.args(["--example", "correlation_storm"]);
    if release {
        build.arg("--release");
    }
    let status = build.status().context("running cargo build")?;
    if !status.success() {
        bail!("building correlation_storm failed ({status})");
    }
    Ok(())
}

/// The section's table; `summary` gets its headline figures.
pub fn correlation_at_scale(
    root: &Path,
    quick: bool,
    summary: &mut Vec<(String, String)>,
) -> Result<Table> {
    build(root, !quick)?;
    let profile = if quick { "debug" } else { "release" };
    let (rounds, secs, walk_secs, samples) = if quick {
        (1, "1", "1", "20")
    } else {
        (5, "5", "2", "200")
    };
    let mut runs = Vec::new();
    for round in 0..rounds {
        eprintln!("bench: correlation storm, round {}/{rounds}", round + 1);
        runs.push(storm(
            root,
            profile,
            &["--secs", secs, "--samples", samples],
        )?);
    }
    let walk = storm(
        root,
        profile,
        &["--secs", walk_secs, "--samples", "20", "--walk"],
    )?;
    let field = |v: &[serde_json::Value], k: &str| -> Vec<f64> {
        v.iter().filter_map(|r| r[k].as_f64()).collect()
    };
    let mut t = Table::new(
        "7. Correlation at scale",
        &[
            "case",
            "keyed look-up (after)",
            "walk of the table (before)",
        ],
    );
    t.note = format!(
        "A full 65,536-entry egress table (1,000 pods, 65-66 flows each) in real kernel maps; a \
         hairpin storm of 10,000 suspects/s (each a new egress flow recorded in the map, then \
         its suspect and drop) through the agent's correlator, egress queries answered from the \
         map, conntrack answered at once (`probe-user/examples/correlation_storm.rs`, {profile} \
         build). Keyed: {rounds} round(s) of {secs} s, median (min–max) over rounds; the \
         walk: one {walk_secs} s run (it falls behind at once). Per-suspect times: median and \
         p99 of each round's samples. The machine is shared (2 CPUs, other builds running): \
         the spread is theirs as much as ours."
    );
    let one = std::slice::from_ref(&walk);
    let row = |t: &mut Table, case: &str, key: &str, digits: usize| {
        t.row(vec![
            case.to_string(),
            spread(&field(&runs, key), digits),
            spread(&field(one, key), digits),
        ]);
    };
    for (case, key) in [
        ("egress match per suspect, median (µs)", "keyed_us_median"),
        ("egress match per suspect, p99 (µs)", "keyed_us_p99"),
    ] {
        row(&mut t, case, key, 1);
    }
    // The walk's match time is measured in every keyed run too: the "before" column's times
    // come from those rounds (the walk storm's own samples are fewer).
    let walk_med = field(&runs, "walk_us_median");
    let walk_p99 = field(&runs, "walk_us_p99");
    t.rows[0][2] = spread(&walk_med, 0);
    t.rows[1][2] = spread(&walk_p99, 0);
    for (case, key) in [
        ("hairpin confirmations/s", "confirmations_per_s"),
        ("correlation-loop CPU (% of one core)", "loop_cpu_percent"),
        ("max queue depth (of 4,096)", "max_queue_depth"),
        ("events lost to a full queue", "events_lost_queue_full"),
        ("suspects sent", "suspects_sent"),
        ("events processed (suspects + drops)", "events_processed"),
        ("hairpin confirmations", "hairpin_confirmations"),
        (
            "suspects with no egress match (answer too late or none)",
            "hairpin_no_egress",
        ),
    ] {
        row(&mut t, case, key, 0);
    }
    summary.push((
        "egress match per suspect, full 65,536-entry table (keyed vs walk)".to_string(),
        format!(
            "{} µs vs {} µs median",
            spread(&field(&runs, "keyed_us_median"), 1),
            spread(&walk_med, 0)
        ),
    ));
    summary.push((
        "hairpin storm 10,000 suspects/s: confirmations/s, loop CPU".to_string(),
        format!(
            "{} /s, {} %",
            spread(&field(&runs, "confirmations_per_s"), 0),
            spread(&field(&runs, "loop_cpu_percent"), 0)
        ),
    ));
    Ok(t)
}
