//! BENCHMARKS.md, section by section: each part of the bench owns its numbered sections
//! (`## 6. …`, marked `<!-- bench:6 -->` under the heading) and its lines of the summary table
//! (first column: the section). A run replaces exactly the sections it measured and their
//! summary lines, and keeps everything else in the file as it is: other parts' sections from
//! earlier runs, and hand-written sections (no marker), which the bench never touches.
//! Pure: unit-tested without root.

use std::cmp::Ordering;

use super::report::Table;

/// The marker line under a section heading the bench wrote; `{key}` is the section number.
const MARKER: &str = "<!-- bench:";
const SUMMARY_KEY: &str = "summary";

/// What the file starts with when it does not exist yet.
pub const PREAMBLE: &str = "# clb-probe benchmarks\n\n\
Written by `sudo cargo xtask bench` (see `xtask/src/bench/mod.rs` for what each part does).\n\
Each numbered section is one part of the bench and says when, with what command and on what\n\
machine it was measured: a run replaces the sections of the parts it ran (and their summary\n\
lines) and keeps every other section as it is, hand-written ones included. Every ratio is\n\
measured against its baseline in the same run; figures are median (min–max, n = samples).\n";

/// A section the bench measured: its key ("1", "1b", "6") and its Markdown.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub key: String,
    pub markdown: String,
}

/// The key of a numbered title: "1b. Throughput ratio" -> "1b"; `None` when not numbered.
pub fn section_key(title: &str) -> Option<String> {
    let (key, _) = title.split_once(". ")?;
    let digits = key.chars().take_while(char::is_ascii_digit).count();
    (digits > 0 && key[digits..].chars().all(|c| c.is_ascii_lowercase())).then(|| key.to_string())
}

/// Sections in the order of their numbers (summary first, "1" < "1b" < "2"), unnumbered last.
fn order(key: &str) -> (u32, String) {
    if key == SUMMARY_KEY {
        return (0, String::new());
    }
    let digits: String = key.chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<u32>() {
        Ok(n) => (n + 1, key[digits.len()..].to_string()),
        Err(_) => (u32::MAX, key.to_string()),
    }
}

fn cmp_keys(a: &str, b: &str) -> Ordering {
    order(a).cmp(&order(b))
}

/// `table` as a section of the bench: heading, marker, the `measured` line, note and rows.
pub fn section(table: &Table, measured: &str) -> Section {
    let key = section_key(&table.title).unwrap_or_else(|| table.title.clone());
    let md = table.markdown();
    let (heading, rest) = md.split_once('\n').unwrap_or((&md, ""));
    Section {
        markdown: format!(
            "{heading}\n\n{MARKER}{key} -->\n{measured}\n\n{}",
            rest.trim_start_matches('\n').trim_end()
        ),
        key,
    }
}

/// One `## ` block of the file: its text (heading included) and, if the bench wrote it, its key.
#[derive(Debug)]
struct Block {
    text: String,
    key: Option<String>,
}

/// The file's preamble (before the first `## ` heading) and its blocks.
fn blocks(doc: &str) -> (String, Vec<Block>) {
    let mut preamble = String::new();
    let mut out: Vec<Block> = Vec::new();
    let mut fence = false;
    for line in doc.split_inclusive('\n') {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        }
        if !fence && line.starts_with("## ") {
            out.push(Block {
                text: String::new(),
                key: None,
            });
        }
        match out.last_mut() {
            Some(b) => b.text.push_str(line),
            None => preamble.push_str(line),
        }
    }
    for b in &mut out {
        // The marker is the first non-empty line under the heading.
        b.key = b
            .text
            .lines()
            .skip(1)
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix(MARKER))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|k| k.trim().to_string());
    }
    (preamble, out)
}

/// The (section, what, figure) rows of a summary block's table.
fn summary_rows(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter(|l| l.starts_with("| "))
        .skip(1) // the header; the separator starts with "|-"
        .filter_map(|l| {
            let inner = l.strip_prefix("| ")?.strip_suffix(" |")?;
            let (key, rest) = inner.split_once(" | ")?;
            let (what, figure) = rest.split_once(" | ")?;
            Some((key.to_string(), what.to_string(), figure.to_string()))
        })
        .collect()
}

fn summary_block(rows: &[(String, String, String)]) -> String {
    let mut t = Table::new("Summary", &["section", "what", "figure"]);
    t.note = "One line per headline figure, from the section it names; \"target\" is the \
              issue's. Each line is replaced with its section."
        .to_string();
    for (k, w, f) in rows {
        t.row(vec![k.clone(), w.clone(), f.clone()]);
    }
    let md = t.markdown();
    let (heading, rest) = md.split_once('\n').unwrap_or((&md, ""));
    format!(
        "{heading}\n\n{MARKER}{SUMMARY_KEY} -->\n{}",
        rest.trim_start_matches('\n')
    )
}

/// `old` (the file as it is; empty if new) with `new` sections put in place of those with the
/// same key, and the summary's lines of `ran` (the sections this run measured) replaced by
/// `summary` (section, what, figure). Everything else is kept, in its place.
pub fn splice(old: &str, new: &[Section], summary: &[(String, String, String)]) -> String {
    let (preamble, mut blocks) = blocks(old);
    let preamble = if preamble.trim().is_empty() {
        PREAMBLE.to_string()
    } else {
        preamble
    };
    let ran: Vec<&str> = new.iter().map(|s| s.key.as_str()).collect();

    // The summary: kept lines of sections not run, then this run's, in section order.
    let at = blocks
        .iter()
        .position(|b| b.key.as_deref() == Some(SUMMARY_KEY));
    let mut rows: Vec<(String, String, String)> = at
        .map(|i| summary_rows(&blocks[i].text))
        .unwrap_or_default()
        .into_iter()
        .filter(|r| !ran.contains(&r.0.as_str()))
        .collect();
    rows.extend(summary.iter().cloned());
    rows.sort_by(|a, b| cmp_keys(&a.0, &b.0));
    let summary = Block {
        text: summary_block(&rows),
        key: Some(SUMMARY_KEY.into()),
    };
    match at {
        Some(i) => blocks[i] = summary,
        None => blocks.insert(0, summary),
    }

    for s in new {
        let block = Block {
            text: s.markdown.clone(),
            key: Some(s.key.clone()),
        };
        let same: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].key.as_deref() == Some(&s.key))
            .collect();
        if let Some(&first) = same.first() {
            for &i in same.iter().skip(1).rev() {
                blocks.remove(i);
            }
            blocks[first] = block;
            continue;
        }
        // Before the first section the bench wrote with a later number (so a hand-written
        // section stays after the one it follows), else at the end.
        let i = blocks
            .iter()
            .position(|b| {
                b.key
                    .as_deref()
                    .is_some_and(|k| cmp_keys(k, &s.key) == Ordering::Greater)
            })
            .unwrap_or(blocks.len());
        blocks.insert(i, block);
    }

    let mut doc = preamble.trim_end().to_string();
    for b in &blocks {
        doc.push_str("\n\n");
        doc.push_str(b.text.trim_end());
    }
    doc.push('\n');
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(title: &str, row: &str) -> Table {
        let mut t = Table::new(title, &["measure", "value"]);
        t.note = "A note.".into();
        t.row(vec!["x".into(), row.into()]);
        t
    }

    fn row(k: &str, w: &str, f: &str) -> (String, String, String) {
        (k.into(), w.into(), f.into())
    }

    #[test]
    fn keys_of_numbered_titles() {
        assert_eq!(section_key("1b. Throughput ratio").as_deref(), Some("1b"));
        assert_eq!(section_key("6. Per-packet cost").as_deref(), Some("6"));
        assert_eq!(section_key("Summary"), None);
        assert_eq!(section_key("Re-measured on a quiet machine. Again"), None);
        assert_eq!(cmp_keys("1", "1b"), Ordering::Less);
        assert_eq!(cmp_keys("1b", "2"), Ordering::Less);
        assert_eq!(cmp_keys("10", "9"), Ordering::Greater);
        assert_eq!(cmp_keys(SUMMARY_KEY, "1"), Ordering::Less);
    }

    #[test]
    fn a_section_carries_its_marker_and_measured_line() {
        let s = section(&table("6. Classes", "1"), "_Measured today._");
        assert_eq!(s.key, "6");
        assert_eq!(
            s.markdown,
            "## 6. Classes\n\n<!-- bench:6 -->\n_Measured today._\n\nA note.\n\n\
             | measure | value |\n|---|---|\n| x | 1 |"
        );
    }

    #[test]
    fn a_new_file_gets_the_preamble_summary_and_sections_in_order() {
        let new = [
            section(&table("6. Classes", "a"), "_m6_"),
            section(&table("1b. Ratio", "b"), "_m1b_"),
        ];
        let doc = splice(
            "",
            &new,
            &[row("6", "worst", "36 ns"), row("1b", "ratio", "0.97")],
        );
        assert!(doc.starts_with(PREAMBLE));
        let at = |s: &str| {
            doc.find(s)
                .unwrap_or_else(|| panic!("{s} missing in\n{doc}"))
        };
        assert!(at("## Summary") < at("## 6. Classes"));
        // Sections and summary rows in the order of their numbers.
        assert!(at("## 1b. Ratio") < at("## 6. Classes"));
        assert!(at("| 1b | ratio | 0.97 |") < at("| 6 | worst | 36 ns |"));
        assert!(doc.ends_with("| x | a |\n"));
    }

    #[test]
    fn a_run_replaces_its_sections_and_lines_and_keeps_everything_else() {
        let first = splice(
            "",
            &[
                section(&table("1. Datapath", "old1"), "_m1_"),
                section(&table("2. Cost", "old2"), "_m1_"),
                section(&table("6. Classes", "old6"), "_m6_"),
            ],
            &[row("1", "ratio", "0.90"), row("6", "worst", "40 ns")],
        );
        // A hand-written section after 6, and hand edits to the preamble.
        let edited = first.replace("# clb-probe benchmarks", "# clb-probe benchmarks (edited)")
            + "\n## 6. Classes: before and after\n\nHand-written, | with pipes |.\n";
        let second = splice(
            &edited,
            &[section(&table("6. Classes", "new6"), "_m6 again_")],
            &[row("6", "worst", "30 ns")],
        );
        assert!(second.starts_with("# clb-probe benchmarks (edited)"));
        assert!(second.contains("| x | old1 |") && second.contains("| x | old2 |"));
        assert!(second.contains("| x | new6 |") && !second.contains("old6"));
        assert!(second.contains("_m6 again_") && !second.contains("_m6_\n"));
        assert!(second.contains("| 1 | ratio | 0.90 |"));
        assert!(second.contains("| 6 | worst | 30 ns |") && !second.contains("40 ns"));
        let at = |s: &str| second.find(s).unwrap();
        assert!(at("## 6. Classes\n") < at("## 6. Classes: before and after"));
        assert!(second.ends_with("Hand-written, | with pipes |.\n"));
        // A section new to the file goes before the first later one the bench wrote.
        let third = splice(
            &second,
            &[section(&table("1b. Ratio", "r"), "_m1b_")],
            &[row("1b", "paired", "0.97")],
        );
        let at = |s: &str| third.find(s).unwrap();
        assert!(at("## 1. Datapath") < at("## 1b. Ratio") && at("## 1b. Ratio") < at("## 2. Cost"));
        assert!(at("| 1 | ratio") < at("| 1b | paired") && at("| 1b | paired") < at("| 6 | worst"));
        // Splicing the same run again changes nothing.
        let again = splice(
            &third,
            &[section(&table("1b. Ratio", "r"), "_m1b_")],
            &[row("1b", "paired", "0.97")],
        );
        assert_eq!(again, third);
    }

    #[test]
    fn headings_inside_code_fences_are_text() {
        let doc = splice(
            "# t\n\n## Notes\n\n```\n## not a heading\n```\n",
            &[section(&table("3. Flood", "f"), "_m_")],
            &[],
        );
        assert!(doc.contains("## Notes\n\n```\n## not a heading\n```\n\n## 3. Flood"));
    }

    #[test]
    fn the_repository_file_is_in_this_shape() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../BENCHMARKS.md");
        let text = std::fs::read_to_string(path).expect("BENCHMARKS.md");
        // A run that measured nothing rewrites it byte for byte...
        assert_eq!(splice(&text, &[], &[]), text);
        // ...and every part's section is there, marked, once.
        let (_, blocks) = blocks(&text);
        for key in ["summary", "1", "1b", "2", "3", "4", "5", "6", "7", "8"] {
            let n = blocks
                .iter()
                .filter(|b| b.key.as_deref() == Some(key))
                .count();
            assert_eq!(n, 1, "section {key}");
        }
    }
}
