//! Output of `probe check`: an aligned table (one line per finding, then a summary line) or
//! the [`CheckReport`] as JSON.

use probe_contract::check::CheckReport;

/// The table for people. Evidence and remedies are in `--json`; the summary line says so.
pub fn table(report: &CheckReport) -> String {
    let rows: Vec<[&str; 4]> = report
        .findings
        .iter()
        .map(|f| {
            [
                f.severity.as_str(),
                f.kind.as_str(),
                f.subject.as_str(),
                f.summary.as_str(),
            ]
        })
        .collect();
    let header = ["SEVERITY", "KIND", "SUBJECT", "SUMMARY"];
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |r: &[&str; 4]| {
        format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}\n",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2]
        )
    };
    let mut out = line(&header);
    for r in &rows {
        out.push_str(&line(r));
    }
    if let Some(d) = &report.dataplane {
        out.push_str(&format!("dataplane: {}\n", d.name()));
    }
    let info = report.findings.len() - report.risks - report.warnings;
    out.push_str(&format!(
        "{} risk(s), {} warning(s), {info} info: {} (evidence and remedies: probe check --json)\n",
        report.risks,
        report.warnings,
        if report.risks == 0 {
            "no loopback risk found"
        } else {
            "loopback risks found"
        }
    ));
    out
}

pub fn json(report: &CheckReport) -> String {
    // A CheckReport is plain data: serializing it cannot fail.
    serde_json::to_string_pretty(report).expect("report serializes")
}
