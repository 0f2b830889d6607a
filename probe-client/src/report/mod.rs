//! The cluster's view as the plugin reads it: the `LoopbackReport` API resource (its coordinates
//! and `status` are the output contract's, `probe_contract::report`) and [`cluster`], the
//! `kubectl clb-probe report` table from the objects and the Nodes. The agent writes the
//! objects (`probe-user`'s `sink::node_report::writer`) through the same [`api_resource`].

pub mod cluster;

/// The API resource, for `kube::Api<DynamicObject>`.
pub fn api_resource() -> kube::core::ApiResource {
    probe_contract::report::RESOURCE.api_resource()
}
