//! What the agent wrote to the (fake) Kubernetes API, read as the types it writes: its Events
//! as `events.k8s.io/v1` Events. A field the agent misspells fails the parse, with the object.

use k8s_openapi::api::events::v1::Event;
use test_support::kubeapi::FakeApiServer;

/// The controller name the agent's Events carry (`reportingController`).
pub const CONTROLLER: &str = probe_contract::kube_event::REPORTING_CONTROLLER;

/// The Events clb-probe wrote, in the server's order.
pub fn clb_events(api: &FakeApiServer) -> Vec<Event> {
    api.objects("events")
        .into_iter()
        .filter(|e| e["reportingController"] == CONTROLLER)
        .map(|e| {
            serde_json::from_value(e.clone())
                .unwrap_or_else(|err| panic!("not an events.k8s.io/v1 Event ({err}): {e:#}"))
        })
        .collect()
}

/// Whether an optional field of a Kubernetes object is `want`.
pub fn is(field: &Option<String>, want: &str) -> bool {
    field.as_deref() == Some(want)
}
