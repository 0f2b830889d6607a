//! The Services, listed once from the Kubernetes API (a check needs a snapshot, not a watch).
//!
//! Where the API is: `--kubeconfig PATH` (or `KUBECONFIG`), else the in-cluster config when
//! running in a pod; without either, `probe check` judges the node alone. Any failure (no
//! route, 403, a bad kubeconfig) is a warning in the report, never a failed check: the node
//! side stands on its own.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{Api, Client, Config, api::ListParams, config::Kubeconfig};
use probe_core::service::ServiceFacts;

/// Where to find the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiAccess {
    /// Neither a kubeconfig nor in-cluster: the node alone.
    None,
    InCluster,
    Kubeconfig(PathBuf),
}

impl ApiAccess {
    /// `--kubeconfig` first, then in-cluster when the pod environment says so.
    pub fn choose(kubeconfig: Option<PathBuf>) -> ApiAccess {
        match kubeconfig {
            Some(p) => ApiAccess::Kubeconfig(p),
            None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => ApiAccess::InCluster,
            None => ApiAccess::None,
        }
    }
}

/// A check must not hang on an unreachable API.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Lists every Service. Blocking (its own small runtime).
pub fn list_services(access: &ApiAccess) -> anyhow::Result<Vec<ServiceFacts>> {
    Ok(list(access)?
        .0
        .iter()
        .filter_map(ServiceFacts::from_service)
        .collect())
}

/// Every Service and, as a second result (its failure is no failure of the Services: an RBAC
/// may allow Services only), every EndpointSlice. Blocking (its own small runtime).
#[allow(clippy::type_complexity)]
pub fn list(
    access: &ApiAccess,
) -> anyhow::Result<(Vec<Service>, anyhow::Result<Vec<EndpointSlice>>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut config = match access {
            ApiAccess::None => return Ok((Vec::new(), Ok(Vec::new()))),
            ApiAccess::InCluster => Config::incluster().context("in-cluster config")?,
            ApiAccess::Kubeconfig(path) => {
                let kc = Kubeconfig::read_from(path)
                    .with_context(|| format!("--kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .with_context(|| format!("--kubeconfig {}", path.display()))?
            }
        };
        config.connect_timeout = Some(TIMEOUT);
        config.read_timeout = Some(TIMEOUT);
        let client = Client::try_from(config).context("API client")?;
        let list = tokio::time::timeout(
            TIMEOUT,
            Api::<Service>::all(client.clone()).list(&ListParams::default()),
        )
        .await
        .context("listing Services: no answer within 10 s")?
        .context("listing Services")?;
        let slices = async {
            let list = tokio::time::timeout(
                TIMEOUT,
                Api::<EndpointSlice>::all(client).list(&ListParams::default()),
            )
            .await
            .context("listing EndpointSlices: no answer within 10 s")?
            .context("listing EndpointSlices")?;
            anyhow::Ok(list.items)
        }
        .await;
        Ok((list.items, slices))
    })
}
