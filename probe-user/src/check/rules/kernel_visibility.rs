//! What the running kernel lets the probe see.

use probe_contract::check::{Finding, Kind, Severity};

use crate::check::Inputs;

/// What the running kernel lets the probe see.
pub fn kernel_visibility(inp: &Inputs) -> Vec<Finding> {
    let k = &inp.kernel;
    let attach = if k.tcx {
        "tcx links"
    } else {
        "clsact qdiscs (no tcx before 6.6)"
    };
    let (severity, summary, evidence, remedy) = match &k.btf_error {
        Some(why) => (
            Severity::Warn,
            format!("kernel {}: no usable BTF: the agent cannot run", k.release),
            vec![why.clone()],
            vec!["Use a node kernel built with CONFIG_DEBUG_INFO_BTF=y.".to_string()],
        ),
        None if !k.drop_reason_arg => {
            (
                Severity::Warn,
                format!(
                    "kernel {}: attaches via {attach}; kfree_skb has no drop reason: drops are told \
                 apart by their site",
                    k.release
                ),
                vec![format!("{} drop reason names in BTF", k.drop_reasons)],
                if k.kallsyms_readable {
                    Vec::new()
                } else {
                    vec!["Make drop sites readable (see kptr_restrict): without reasons they are all \
                      there is."
                    .to_string()]
                },
            )
        }
        None => (
            Severity::Info,
            format!(
                "kernel {}: attaches via {attach}; kfree_skb reports drop reasons ({} names)",
                k.release, k.drop_reasons
            ),
            Vec::new(),
            Vec::new(),
        ),
    };
    vec![Finding {
        kind: Kind::KernelVisibility,
        severity,
        subject: "kernel".into(),
        summary,
        evidence,
        remedy,
        fixes: Vec::new(),
    }]
}
