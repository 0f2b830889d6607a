//! The prediction as text (`probe check --as nftables` without `--json`).

use probe_contract::readiness::{Change, Prediction};

/// The prediction as text: one line per change, the fixes to apply first, the ipMode advice.
pub fn table(p: &Prediction) -> String {
    let mut out = format!(
        "Moving kube-proxy from {} to {} mode (predicted from this node):\n",
        p.from.as_str(),
        p.to.as_str()
    );
    let all = || p.disappear.iter().chain(&p.appear).chain(&p.remain);
    let w_kind = all().map(|c| c.kind.as_str().len()).max().unwrap_or(0);
    let w_subject = all().map(|c| c.subject.len()).max().unwrap_or(0);
    let w_service = all()
        .map(|c| c.service.as_deref().map_or(1, str::len))
        .max()
        .unwrap_or(0);
    let line = |out: &mut String, sign: &str, c: &Change| {
        out.push_str(&format!(
            "  {sign} {:<w_kind$}  {:<w_subject$}  {:<w_service$}  {}\n",
            c.kind.as_str(),
            c.subject,
            c.service.as_deref().unwrap_or("-"),
            c.why
        ));
    };
    for (title, sign, list) in [
        ("disappear", "-", &p.disappear),
        ("appear", "+", &p.appear),
        ("remain", "=", &p.remain),
    ] {
        out.push_str(&format!("{title}: {}\n", list.len()));
        for c in list {
            line(&mut out, sign, c);
        }
    }
    out.push_str(&format!(
        "fixes before migrating: {}\n",
        p.before_migrating.len()
    ));
    for f in &p.before_migrating {
        out.push_str(&format!(
            "  {} ({}{}): {}\n",
            f.id,
            f.provider,
            f.service
                .as_deref()
                .map(|s| format!(", {s}"))
                .unwrap_or_default(),
            f.change
        ));
    }
    if !p.not_short_circuited.is_empty() {
        out.push_str(&format!(
            "short-circuited in neither mode: {}\n",
            p.not_short_circuited.len()
        ));
        for e in &p.not_short_circuited {
            out.push_str(&format!("  {} {}: {}\n", e.address, e.service, e.why));
        }
    }
    out.push_str(&format!("ipMode advice: {}\n", p.ip_mode.len()));
    for a in &p.ip_mode {
        out.push_str(&format!(
            "  {} {} ({}, {}): {}: {}\n",
            a.ip,
            a.service.as_deref().unwrap_or("-"),
            a.ip_mode,
            a.provider,
            a.verdict,
            a.advice
        ));
    }
    out.push_str(&format!(
        "{} risk(s) after the move ({}): {} (evidence, fixes and costs: --json)\n",
        p.risks_after,
        p.summary(),
        if p.risks_after == 0 {
            "no loopback risk predicted"
        } else {
            "loopback risks predicted"
        }
    ));
    out
}
