//! xtask's dependencies have the demo agent's feature sets (xtask/Cargo.toml says why): else a
//! first `cargo xtask demo` compiles them twice, silently.

use std::collections::{BTreeMap, BTreeSet};

use super::DEMO_AGENT;

/// Each package (name and version) of `cargo tree <selection>` with the feature sets it is
/// built with (normal and build dependencies: one set each side).
fn feature_sets(selection: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let out = test_support::run_ok(
        crate::build::cargo()
            .args([
                "tree",
                "-e",
                "normal,build",
                "--prefix",
                "none",
                "--no-dedupe",
            ])
            .args(["-f", "{p}|{f}"])
            .args(selection)
            .current_dir(crate::workspace_root()),
        &format!("cargo tree {selection:?}"),
    );
    let mut sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((package, features)) = line.split_once('|') else {
            continue;
        };
        // "serde v1.0.229", "xtask v0.1.0 (/work/xtask)": a path means a workspace member.
        if package.contains('(') && package.contains('/') {
            continue;
        }
        let name_version = package.split(' ').take(2).collect::<Vec<_>>().join(" ");
        let features = features
            .trim_end_matches(" (*)")
            .trim_end_matches(" (proc-macro)");
        sets.entry(name_version)
            .or_default()
            .insert(features.to_string());
    }
    sets
}

#[test]
fn xtask_builds_the_crates_it_shares_with_the_demo_agent_as_the_agent_does() {
    let xtask = feature_sets(&["-p", "xtask"]);
    let agent = feature_sets(DEMO_AGENT);
    let differ: Vec<String> = xtask
        .iter()
        .filter_map(|(package, sets)| {
            let theirs = agent.get(package)?;
            (!sets.is_subset(theirs))
                .then(|| format!("{package}: xtask {sets:?}, agent {theirs:?}"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "add the agent's features to xtask/Cargo.toml's aligned dependencies:\n{}",
        differ.join("\n")
    );
}
