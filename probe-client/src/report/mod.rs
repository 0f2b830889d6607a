//! The cluster's view as the plugin reads it: the `LoopbackReport` API resource (its coordinates
//! and `status` are the output contract's, `probe_contract::report`) and [`cluster`], the
//! `kubectl clb-probe report` table from the objects and the Nodes. The agent writes the
//! objects (`probe-user`'s `sink::node_report::writer`) through the same [`api_resource`].

pub mod cluster;

/// The API resource, for `kube::Api<DynamicObject>`.
pub fn api_resource() -> kube::core::ApiResource {
    use probe_contract::report::{API_VERSION, GROUP, KIND, PLURAL, VERSION};
    custom_resource(GROUP, VERSION, API_VERSION, KIND, PLURAL)
}

/// One of clb-probe's custom resources (LoopbackReport, LoopbackVerification), for
/// `kube::Api<DynamicObject>`.
pub fn custom_resource(
    group: &str,
    version: &str,
    api_version: &str,
    kind: &str,
    plural: &str,
) -> kube::core::ApiResource {
    kube::core::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}
