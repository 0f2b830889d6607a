//! Whether the Service side was judged.

use crate::check::ApiState;

use crate::check::Inputs;

use probe_contract::check::Finding;

use probe_contract::check::Kind;

use probe_contract::check::Severity;

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
        ApiState::Read { services, lb_ips } => (
            Severity::Info,
            format!("{services} Service(s) read, {lb_ips} LB ingress IP(s) among them"),
            Vec::new(),
            Vec::new(),
        ),
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
