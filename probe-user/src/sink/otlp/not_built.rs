//! The sink's types in an agent built without the `otlp` feature: empty, never made
//! (`--otlp-endpoint` is refused by [`super::parse_endpoint`] before the agent starts; the
//! constructors refuse too, should a caller get past it).

use std::sync::Arc;

use super::{EndpointError, OtlpConfig};
use crate::hub::{View, outputs::OtlpStats};

/// No log records without the feature.
pub enum OtlpLogs {}

/// No metric exporter without the feature.
pub enum PendingMetrics {}

/// No metric exporter without the feature.
pub enum OtlpMetrics {}

impl OtlpLogs {
    pub fn start(_: &OtlpConfig, _: String, _: Arc<OtlpStats>) -> anyhow::Result<Self> {
        Err(EndpointError::NotBuilt.into())
    }

    pub fn stats(&self) -> Arc<OtlpStats> {
        match *self {}
    }
}

impl crate::sink::Writer for OtlpLogs {
    async fn report(&mut self, _: &probe_contract::Confirmation) {
        match *self {}
    }

    fn lag_policy(&self) -> crate::sink::LagPolicy {
        match *self {}
    }
}

impl OtlpMetrics {
    pub fn exporter(_: &OtlpConfig, _: String) -> anyhow::Result<PendingMetrics> {
        Err(EndpointError::NotBuilt.into())
    }

    pub fn start(pending: PendingMetrics, _: &View, _: Arc<OtlpStats>) -> Self {
        match pending {}
    }

    pub fn shutdown(self) {
        match self {}
    }
}
