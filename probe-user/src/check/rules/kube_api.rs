//! Whether the Service side was judged.

use probe_contract::check::{Finding, Kind, Severity};

use crate::check::{ApiState, Inputs};

/// Whether the Service side was judged.
pub fn kube_api(inp: &Inputs) -> Vec<Finding> {
    let (severity, summary, evidence, remedy) = match &inp.api {
        ApiState::NotUsed => (
            Severity::Info,
            "no API access configured: judged from the node alone (no Service names, \
             policies or annotations)"
                .to_string(),
            Vec::new(),
            vec![
                "Pass --kubeconfig, or run in the cluster (the DaemonSet's service account)."
                    .into(),
            ],
        ),
        ApiState::Read { services, lb_ips } => {
            let read = format!("{services} Service(s) read, {lb_ips} LB ingress IP(s) among them");
            match crate::check::services::missing_from_dataplane(inp) {
                // The API's table (what kube-proxy should program, from the Services and
                // EndpointSlices) beside the dataplane's: what the rules lack is kube-proxy
                // lagging or failing, or rules not kube-proxy's (a replacement, the lab's).
                // Evidence, not a verdict: one snapshot cannot tell lag from failure.
                Some((compared, missing)) if !missing.is_empty() => {
                    const SHOWN: usize = 10;
                    let mut evidence: Vec<String> = missing
                        .iter()
                        .take(SHOWN)
                        .map(|m| format!("missing from the dataplane: {m}"))
                        .collect();
                    if missing.len() > SHOWN {
                        evidence.push(format!("... and {} more", missing.len() - SHOWN));
                    }
                    (
                        Severity::Info,
                        format!(
                            "{read}; the dataplane lacks {} of the {compared} frontend(s) and \
                             NodePort(s) kube-proxy should program from them",
                            missing.len()
                        ),
                        evidence,
                        vec![
                            "Run the check again: a change kube-proxy has not synced yet passes; \
                             one that stays is kube-proxy failing (its log, its \
                             kubeproxy_sync_proxy_rules_last_timestamp_seconds)."
                                .into(),
                        ],
                    )
                }
                Some((compared, _)) => (
                    Severity::Info,
                    format!(
                        "{read}; the dataplane has all {compared} frontend(s) and NodePort(s)                          kube-proxy should program from them"
                    ),
                    Vec::new(),
                    Vec::new(),
                ),
                None => (
                    Severity::Info,
                    read,
                    inp.api_table_error
                        .iter()
                        .map(|e| format!("not compared with the dataplane: {e}"))
                        .collect(),
                    Vec::new(),
                ),
            }
        }
        ApiState::Failed(why) => (
            Severity::Warn,
            "Services not read: judged from the node alone".to_string(),
            vec![why.clone()],
            vec!["Check the kubeconfig / service account and its RBAC (list services).".into()],
        ),
    };
    vec![Finding {
        kind: Kind::KubeApi,
        severity,
        subject: "kubernetes api".into(),
        summary,
        evidence,
        remedy,
        fixes: Vec::new(),
    }]
}
