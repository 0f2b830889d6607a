//! The house's boundaries, checked (issue #50): the pure core links no I/O crate, and the
//! agent's readers and rules do not reach into the kubectl plugin's crate. No root.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use test_support::run_ok;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cargo --offline ARGS` in the workspace root; panics with its stderr when it fails.
fn cargo(args: &[&str]) -> Output {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let what = format!("cargo {}", args.join(" "));
    run_ok(
        Command::new(cargo)
            .current_dir(root())
            .args(&args[..1])
            .arg("--offline")
            .args(&args[1..]),
        &what,
    )
}

/// The crates in `package`'s normal dependency tree, by name.
fn normal_dependencies(package: &str) -> Vec<String> {
    let out = cargo(&["tree", "-e", "normal", "--prefix", "none", "-p", package]);
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_core_links_no_kernel_runtime_or_api_client_crate() {
    let deps = normal_dependencies("probe-core");
    assert!(deps.iter().any(|d| d == "probe-contract"), "{deps:?}");
    let io: Vec<&String> = deps
        .iter()
        .filter(|d| {
            d.starts_with("aya")
                || d.starts_with("tokio")
                || *d == "kube"
                || d.starts_with("kube-")
                || d.contains("netlink")
                || d.starts_with("hyper")
        })
        .collect();
    assert!(io.is_empty(), "the pure core links {io:?}");
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_agents_readers_rules_and_attribution_do_not_use_the_plugins_crate() {
    let mut offenders = Vec::new();
    for dir in ["state", "kube", "check", "hub", "kernel"] {
        for file in sources(&root().join("probe-user/src").join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            if text.lines().any(|l| {
                let code = l.split("//").next().unwrap_or_default();
                code.contains("clb_probe_client")
            }) {
                offenders.push(file.display().to_string());
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

/// Issue #50: errors are typed per domain (thiserror), never a bare `String`, in the product's
/// crates (tests may use what they like).
#[test]
fn the_product_returns_no_string_errors() {
    let mut offenders = Vec::new();
    for krate in ["probe-contract", "probe-core", "probe-client", "probe-user"] {
        for file in sources(&root().join(krate).join("src")) {
            let name = file.to_string_lossy();
            if name.ends_with("_tests.rs") || name.ends_with("/tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            // Up to the first `#[cfg(test)] mod`: the product's code, not its unit tests.
            let product = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
            for (i, line) in product.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if result_errors(code).any(|e| e == "String") {
                    offenders.push(format!("{name}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

/// The error type of each `Result<T, E>` on `line` (its last top-level argument), as written.
fn result_errors(line: &str) -> impl Iterator<Item = String> + '_ {
    line.match_indices("Result<").filter_map(|(at, _)| {
        let rest = &line[at + "Result<".len()..];
        let (mut depth, mut last_comma) = (0i32, None);
        for (i, c) in rest.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth > 0 => depth -= 1,
                '>' => return last_comma.map(|c: usize| rest[c + 1..i].trim().to_string()),
                ',' if depth == 0 => last_comma = Some(i),
                _ => {}
            }
        }
        None
    })
}

#[test]
fn a_results_error_type_is_its_last_top_level_argument() {
    let errors = |l: &str| result_errors(l).collect::<Vec<_>>();
    assert_eq!(errors("fn a() -> Result<Vec<u8>, String> {"), ["String"]);
    assert_eq!(
        errors("x: Result<Option<(u8, u16)>, BTreeMap<String, String>>,"),
        ["BTreeMap<String, String>"]
    );
    assert!(errors("service: Option<BTreeMap<String, String>>,").is_empty());
    assert_eq!(errors("anyhow::Result<String>"), Vec::<String>::new());
}

/// Issue #50: every `unsafe` in the eBPF programs says why it is sound, in a `SAFETY:` comment
/// just above it (an `unsafe fn` in its `# Safety` section).
#[test]
fn every_unsafe_in_the_ebpf_programs_says_why_it_is_sound() {
    let mut bare = Vec::new();
    for file in sources(&root().join("probe-ebpf/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if !code.contains("unsafe") {
                continue;
            }
            let above = &lines[i.saturating_sub(4)..i];
            let said = above
                .iter()
                .any(|l| l.contains("SAFETY:") || l.contains("# Safety"));
            if !said {
                bare.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(bare.is_empty(), "{bare:#?}");
}

/// Issue #50: a package's name is its library's (`clb-probe` is `clb_probe`), so a search for
/// either finds the other and an import drawing draws the arrow. The folders keep the design's
/// names (probe-user/ holds the package clb-probe, probe-client/ clb-probe-client): the library
/// names are what operators already filter logs on (`CLB_PROBE_LOG=clb_probe=debug`).
#[test]
fn every_package_is_named_as_its_library() {
    let out = cargo(&["metadata", "--no-deps", "--format-version", "1"]);
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut libraries = 0;
    let mut offenders = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            if kinds.iter().any(|k| k == "lib") {
                libraries += 1;
                let library = target["name"].as_str().unwrap();
                if library != name.replace('-', "_") {
                    offenders.push(format!("package {name}, library {library}"));
                }
            }
        }
    }
    assert!(
        libraries >= 5,
        "cargo metadata listed {libraries} libraries"
    );
    assert!(offenders.is_empty(), "{offenders:?}");
}
