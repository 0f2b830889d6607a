//! get and list: selectors, resourceVersion, 410 Gone, server-side tables.
#![expect(
    clippy::result_large_err,
    reason = "an error is the response itself, built once per request: boxing buys nothing"
)]

use std::collections::HashMap;

use hyper::StatusCode;
use serde_json::{Value, json};

use super::response::{Response, bad_request, expired, json_response, not_found_object};
use super::route::Target;
use crate::kubeapi::Shared;
use crate::kubeapi::selector::Selector;
use crate::kubeapi::store;

pub(super) fn get(shared: &Shared, target: &Target) -> Response {
    let name = target.name.as_deref().unwrap_or_default();
    let namespace = target.namespace.as_deref().unwrap_or_default();
    match shared
        .store
        .lock()
        .unwrap()
        .get(target.info.resource, namespace, name)
    {
        Some(object) if store::is_core_event(target.info) => {
            json_response(StatusCode::OK, &store::core_event(&object))
        }
        Some(object) => json_response(StatusCode::OK, &object),
        None => not_found_object(target.info, name),
    }
}

pub(super) struct Filters {
    fields: Selector,
    labels: Selector,
}

impl Filters {
    pub(super) fn parse(params: &HashMap<String, String>) -> Result<Self, Response> {
        let fields = Selector::parse(
            params.get("fieldSelector").map_or("", String::as_str),
            false,
        )
        .map_err(bad_request)?;
        let labels = Selector::parse(params.get("labelSelector").map_or("", String::as_str), true)
            .map_err(bad_request)?;
        Ok(Self { fields, labels })
    }

    pub(super) fn matches(&self, object: &Value) -> bool {
        self.fields.matches_fields(object) && self.labels.matches_labels(object)
    }
}

/// A client's resourceVersion: `None` for "any" (`""` or `"0"`).
pub(super) fn requested_version(params: &HashMap<String, String>) -> Result<Option<u64>, Response> {
    match params.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| bad_request(format!("invalid resourceVersion {text:?}"))),
    }
}

pub(super) fn list(
    shared: &Shared,
    target: &Target,
    params: &HashMap<String, String>,
    as_table: bool,
) -> Response {
    let filters = match Filters::parse(params) {
        Ok(filters) => filters,
        Err(response) => return response,
    };
    let version = match requested_version(params) {
        Ok(version) => version,
        Err(response) => return response,
    };
    let store = shared.store.lock().unwrap();
    if let Some(version) = version
        && store.is_expired(version)
    {
        return json_response(
            StatusCode::GONE,
            &expired(version, store.resource_version()),
        );
    }
    let items: Vec<Value> = store
        .list(target.info.resource, target.namespace.as_deref())
        .into_iter()
        .map(|object| {
            if store::is_core_event(target.info) {
                store::core_event(&object)
            } else {
                object
            }
        })
        .filter(|object| filters.matches(object))
        .map(|mut object| {
            // The real API leaves kind and apiVersion out of list items.
            if let Some(fields) = object.as_object_mut() {
                fields.remove("kind");
                fields.remove("apiVersion");
            }
            object
        })
        .collect();
    if as_table {
        // kubectl get: server-side printing, with a CRD's printer columns.
        let columns = if target.info.resource == "loopbackreports" {
            crate::kubeapi::table::loopbackreport_columns()
        } else {
            Vec::new()
        };
        return json_response(
            StatusCode::OK,
            &crate::kubeapi::table::table(&columns, &items, &store.resource_version().to_string()),
        );
    }
    json_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", target.info.kind),
            "apiVersion": target.info.api_version,
            "metadata": { "resourceVersion": store.resource_version().to_string() },
            "items": items,
        }),
    )
}
