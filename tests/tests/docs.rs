//! The docs cannot drift from the binaries: every `probe`, `kubectl clb-probe` and
//! `cargo xtask` command shown in a shell block of the README and docs/ is parsed by the real
//! binary (`--help` appended: the arguments before it must all be accepted, nothing runs).
//! Placeholders such as `<namespace>` stand where values go, so they parse as values; a
//! synopsis's optional parts (`[-n NS]`) are all given. No root.

use std::{path::PathBuf, process::Command};

use probe_tests::{agent::probe_bin, kube_fixture::plugin_bin};

/// One command as written, where it was found.
struct Shown {
    at: String,
    bin: PathBuf,
    args: Vec<String>,
}

fn doc_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    [root.join("README.md")].into_iter().chain(docs).collect()
}

/// Splits a command line into words: whitespace, with '...' and "..." kept whole.
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The commands of ours in one file's `sh` blocks (continuations joined, comments, pipes and
/// redirections cut).
fn shown_in(path: &PathBuf) -> Vec<Shown> {
    let text = std::fs::read_to_string(path).expect("a doc file");
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let (mut out, mut in_sh, mut pending) = (Vec::new(), false, String::new());
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_sh = trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell";
            continue;
        }
        if !in_sh {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        let full = std::mem::take(&mut pending) + trimmed;
        let mut cmd = full.trim_start_matches("$ ").trim_start_matches("sudo ");
        if let Some((_, after)) = cmd.split_once(" -- ") {
            cmd = after;
        }
        let cmd = cmd
            .split(" #")
            .next()
            .unwrap()
            .split(['|', '>', ';'])
            .next()
            .unwrap()
            .split(" && ")
            .next()
            .unwrap();
        // A synopsis (`fix [-n NS] SERVICE`) is checked with every optional part given.
        let w = words(&cmd.replace(['[', ']'], ""));
        let (bin, rest) = match w.as_slice() {
            [p, rest @ ..] if p == "probe" => (probe_bin(), rest),
            [k, c, rest @ ..] if k == "kubectl" && c == "clb-probe" => (plugin_bin(), rest),
            [c, x, rest @ ..] if c == "cargo" && x == "xtask" => {
                (probe_bin().with_file_name("xtask"), rest)
            }
            _ => continue,
        };
        out.push(Shown {
            at: format!("{name}:{}: {cmd}", i + 1),
            bin,
            args: rest.to_vec(),
        });
    }
    out
}

#[test]
fn every_command_the_docs_show_is_accepted_by_its_binary() {
    let shown: Vec<Shown> = doc_files().iter().flat_map(shown_in).collect();
    // The README's two first commands, the plugin and `probe check` at least.
    assert!(shown.len() >= 10, "found only {} commands", shown.len());
    let mut refused = Vec::new();
    for s in &shown {
        let out = Command::new(&s.bin)
            .args(&s.args)
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", s.bin.display()));
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            refused.push(format!(
                "{}\n    {}",
                s.at,
                err.lines().next().unwrap_or("")
            ));
        }
    }
    assert!(
        refused.is_empty(),
        "commands in the docs that their binary refuses:\n{}",
        refused.join("\n")
    );
}

#[test]
fn the_reader_of_commands_splits_as_a_shell_does() {
    assert_eq!(
        words(r#"fix -n shop "my svc" --apply 'a b'"#),
        ["fix", "-n", "shop", "my svc", "--apply", "a b"]
    );
    assert_eq!(words("events  ''"), ["events", ""]);
}
