//! Kubernetes attribution: pod and Service names (and the Services' settings) on confirmed
//! events, from the API server, when the agent has access to it.
//!
//! Public API (other modules build on it):
//! - [`KubeArgs`]: the agent's flags (`--kubeconfig`, `--node-name` / `NODE_NAME`,
//!   `--kube-attribution auto|on|off`), flattened into `probe agent`'s arguments.
//! - [`KubeArgs::source`] -> [`KubeSource`] (where the API is: a kubeconfig or in-cluster), or
//!   None when attribution is off / there is no configuration in `auto`; a usage error with
//!   `on` and no configuration.
//! - [`connect`]`(&KubeSource) -> Result<kube::Client>`: a client (lazy: nothing is sent yet);
//!   the Events writer reuses it.
//! - [`KubeStatus`]: connection state shared with the metrics (`clbprobe_kube_connected`).
//! - [`watcher::spawn`]: reflectors on this node's Pods, Services and EndpointSlices (pruned:
//!   `watcher::prune_*`; the Services and slices held once, in the
//!   [`service_table::ApiServiceTable`], per watch event); hands out [`index::Index`]
//!   snapshots on a `tokio::sync::watch` channel; reconnects with backoff.
//!   [`watcher::spawn_with_table`] also has the store compute kube-proxy's view and shares it
//!   ([`watcher::SharedApiTable`]: `table.read()`, `changed` counts updates).
//! - [`service_table`]: pure: what kube-proxy should program on this node (iptables, nftables,
//!   IPVS) from the pruned Services and EndpointSlices, with the look-ups of
//!   `state::ServiceTable` (`serves`, `nodeport`, `no_endpoint_drop`).
//! - [`index`]: pure address -> name index (`Index::pod_by_ip`, `service_by_frontend`,
//!   `service_by_node_port`, `services_by_lb_ip`, of `probe_core::service::ServiceFacts`).
//! - [`enrich::enrich`]`(&mut LoopbackEvent, &Index, node)`: pure attribution of one event.
//! - [`hold::Hold`]: holds a confirmed report (at most 2 s) until the cache can name it.
//!
//! Without API access (no configuration, 403, unreachable) the agent works as without this
//! module: one log line says so, `clbprobe_kube_connected` is 0, readiness does not depend on
//! it, and the reflectors keep retrying.

pub mod enrich;
pub mod hold;
pub mod index;
pub mod service_table;
pub mod watcher;
pub mod watches;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use anyhow::Context as _;

/// Where the in-cluster service-account token is mounted.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// `--kube-attribution`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Attribution {
    /// On when a configuration exists (`--kubeconfig`, or the in-cluster token), else off.
    #[default]
    Auto,
    /// Required: no configuration is a usage error.
    On,
    Off,
}

/// The agent's Kubernetes flags.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KubeArgs {
    /// Kubeconfig of the API server to name pods and Services from. Default: the in-cluster
    /// service account, when its token is mounted. (`KUBECONFIG` and ~/.kube/config are not
    /// read: an agent on a node must not pick up an administrator's credentials by accident.)
    #[arg(long, env = "CLB_PROBE_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name in Kubernetes (the DaemonSet sets NODE_NAME from spec.nodeName): only
    /// this node's pods are watched. Without it every pod is watched.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Name pods and Services on events from the Kubernetes API.
    #[arg(long, env = "CLB_PROBE_KUBE_ATTRIBUTION", value_enum, default_value_t = Attribution::Auto)]
    pub kube_attribution: Attribution,
}

/// Where the API server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeSource {
    Kubeconfig(PathBuf),
    InCluster,
}

impl KubeArgs {
    /// The configuration attribution uses, None when it is off. `Err` is a usage error (one
    /// line): `on` without a configuration, or a `--kubeconfig` that does not exist.
    pub fn source(&self) -> Result<Option<KubeSource>, SourceError> {
        self.source_with(std::path::Path::new(SERVICE_ACCOUNT_TOKEN).exists())
    }

    fn source_with(&self, token_mounted: bool) -> Result<Option<KubeSource>, SourceError> {
        if self.kube_attribution == Attribution::Off {
            return Ok(None);
        }
        if let Some(path) = &self.kubeconfig {
            if !path.is_file() {
                return Err(SourceError::NoKubeconfig(path.clone()));
            }
            return Ok(Some(KubeSource::Kubeconfig(path.clone())));
        }
        if token_mounted && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            return Ok(Some(KubeSource::InCluster));
        }
        match self.kube_attribution {
            Attribution::On => Err(SourceError::NoAccess),
            _ => Ok(None),
        }
    }
}

/// Why the API access asked for cannot be configured (a usage error, one line).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("--kubeconfig {}: no such file", .0.display())]
    NoKubeconfig(PathBuf),
    #[error(
        "--kube-attribution on: no API access configured (no --kubeconfig, no in-cluster token at {SERVICE_ACCOUNT_TOKEN})"
    )]
    NoAccess,
}

/// A client for `source` (reads the kubeconfig or the in-cluster files; sends nothing).
pub async fn connect(source: &KubeSource) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(config(source).await?).context("building the Kubernetes client")
}

/// [`connect`] for [`watcher::spawn`]: the client also counts the watches the API server
/// accepts into `status` ([`watches`]), so the watcher sees a restarted watch come back.
pub async fn connect_watched(
    source: &KubeSource,
    status: &KubeStatus,
) -> anyhow::Result<kube::Client> {
    let builder = kube::client::ClientBuilder::try_from(config(source).await?)
        .context("building the Kubernetes client")?;
    Ok(builder
        .with_layer(&watches::AcceptedLayer(status.watches.clone()))
        .build())
}

async fn config(source: &KubeSource) -> anyhow::Result<kube::Config> {
    Ok(match source {
        KubeSource::Kubeconfig(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        KubeSource::InCluster => {
            kube::Config::incluster().context("in-cluster Kubernetes configuration")?
        }
    })
}

/// Attribution's connection state, for metrics and the log.
#[derive(Debug, Default)]
pub struct KubeStatus {
    connected: AtomicBool,
    /// Watches the API server accepted, counted on the watcher's client.
    pub watches: Arc<watches::WatchesAccepted>,
}

impl KubeStatus {
    /// Connected, and no resource's watches are ending at once ([`watches`]).
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed) && !self.watches.churning()
    }

    /// Sets the state; returns the previous one.
    pub fn set_connected(&self, connected: bool) -> bool {
        self.connected.swap(connected, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_by_mode_and_configuration() {
        let off = KubeArgs {
            kube_attribution: Attribution::Off,
            kubeconfig: Some("/nonexistent".into()),
            ..Default::default()
        };
        assert_eq!(off.source_with(true), Ok(None));
        let auto = KubeArgs::default();
        // No token (KUBERNETES_SERVICE_HOST is not set in unit tests either): off.
        assert_eq!(auto.source_with(false), Ok(None));
        let on = KubeArgs {
            kube_attribution: Attribution::On,
            ..Default::default()
        };
        let error = on.source_with(false).unwrap_err().to_string();
        assert!(
            error.starts_with("--kube-attribution on: no API access"),
            "{error}"
        );
        assert!(!error.contains('\n'));
        let missing = KubeArgs {
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
            ..Default::default()
        };
        assert!(
            missing
                .source_with(false)
                .unwrap_err()
                .to_string()
                .contains("no such file")
        );
        let file = std::env::temp_dir().join(format!("kubeconfig-unit-{}", std::process::id()));
        std::fs::write(&file, "apiVersion: v1\nkind: Config\n").unwrap();
        let given = KubeArgs {
            kubeconfig: Some(file.clone()),
            ..Default::default()
        };
        assert_eq!(
            given.source_with(false),
            Ok(Some(KubeSource::Kubeconfig(file.clone())))
        );
        std::fs::remove_file(file).unwrap();
    }
}
