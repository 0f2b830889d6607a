//! get and list: selectors, resourceVersion, 410 Gone, server-side tables.
#![expect(
    clippy::result_large_err,
    reason = "an error is the response itself, built once per request: boxing buys nothing"
)]

use std::collections::HashMap;

use hyper::StatusCode;
use serde_json::{Value, json};

use super::{
    response::{Response, bad_request, expired, json_response, not_found_object},
    route::Target,
};
use crate::kubeapi::{Shared, selector::Selector, store};

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
    as_metadata: bool,
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
    // `limit` and `continue` as the real API pages (not for tables: `kubectl get` is happy
    // with everything at once). The token is the last item's `namespace/name`: the next page
    // starts after it.
    let limit = match params.get("limit").map(|l| l.parse::<usize>()) {
        None => None,
        Some(Ok(0)) => None,
        Some(Ok(limit)) if !as_table => Some(limit),
        Some(Ok(_)) => None,
        Some(Err(_)) => return bad_request("invalid limit".to_owned()),
    };
    let after = match params.get("continue").filter(|t| !t.is_empty()) {
        None => None,
        Some(token) => match token.split_once('/') {
            Some((ns, name)) => Some((ns.to_owned(), name.to_owned())),
            None => return bad_request(format!("invalid continue token {token:?}")),
        },
    };
    let mut items: Vec<Value> = Vec::new();
    let mut continue_token = None;
    let candidates = store
        .iter(target.info.resource, target.namespace.as_deref())
        .filter(|(ns, name, _)| {
            after
                .as_ref()
                .is_none_or(|(a_ns, a_name)| (*ns, *name) > (a_ns.as_str(), a_name.as_str()))
        });
    for (_, _, object) in candidates {
        let object = if store::is_core_event(target.info) {
            store::core_event(object)
        } else if filters.matches(object) {
            object.clone()
        } else {
            continue;
        };
        if store::is_core_event(target.info) && !filters.matches(&object) {
            continue;
        }
        if let Some(limit) = limit
            && items.len() == limit
        {
            // More match: this page ends at the previous item.
            let last = &items[limit - 1]["metadata"];
            continue_token = Some(format!(
                "{}/{}",
                last["namespace"].as_str().unwrap_or_default(),
                last["name"].as_str().unwrap_or_default()
            ));
            break;
        }
        items.push(object);
    }
    let items: Vec<Value> = items
        .into_iter()
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
        let columns = crate::kubeapi::table::columns_of(target.info.resource);
        return json_response(
            StatusCode::OK,
            &crate::kubeapi::table::table(&columns, &items, &store.resource_version().to_string()),
        );
    }
    let (kind, api_version, items) = if as_metadata {
        let items = items
            .into_iter()
            .map(|o| json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}))
            .collect();
        (
            "PartialObjectMetadataList".to_owned(),
            "meta.k8s.io/v1",
            items,
        )
    } else {
        (
            format!("{}List", target.info.kind),
            target.info.api_version,
            items,
        )
    };
    json_response(
        StatusCode::OK,
        &json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": match continue_token {
                Some(token) => json!({"resourceVersion": store.resource_version().to_string(), "continue": token}),
                None => json!({"resourceVersion": store.resource_version().to_string()}),
            },
            "items": items,
        }),
    )
}
