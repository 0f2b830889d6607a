//! `kernel.kptr_restrict`: kallsyms without addresses means unresolved drop sites.

use probe_contract::check::{Finding, Kind, Severity};

use crate::check::Inputs;

/// `kernel.kptr_restrict`: kallsyms without addresses means unresolved drop sites.
pub fn kptr_restrict(inp: &Inputs) -> Vec<Finding> {
    let value = inp
        .kernel
        .kptr_restrict
        .map_or("unreadable".to_string(), |v| v.to_string());
    let (severity, summary, remedy) = if inp.kernel.kallsyms_readable {
        (
            Severity::Info,
            format!("kernel.kptr_restrict={value}: drop sites resolve to kernel symbols"),
            Vec::new(),
        )
    } else {
        (
            Severity::Warn,
            format!(
                "kernel.kptr_restrict={value}: /proc/kallsyms hides addresses, drop sites are \
                 unreadable"
            ),
            vec![
                "Run the agent with CAP_SYSLOG (the DaemonSet adds it) and kernel.kptr_restrict \
                 at most 1; on kernels without drop reasons (< 5.17) a local-source drop is \
                 confirmed only from its site."
                    .into(),
            ],
        )
    };
    vec![Finding {
        kind: Kind::KptrRestrict,
        severity,
        subject: "kernel.kptr_restrict".into(),
        summary,
        evidence: Vec::new(),
        remedy,
        fixes: Vec::new(),
    }]
}
