//! create, replace, patch and delete.
#![expect(
    clippy::result_large_err,
    reason = "an error is the response itself, built once per request: boxing buys nothing"
)]

use std::collections::HashMap;

use hyper::{StatusCode, body::Bytes};
use serde_json::{Value, json};

use super::{
    response::{Response, bad_request, json_response, not_found_object, qualified, status},
    route::Target,
};
use crate::kubeapi::{
    Shared,
    store::{WriteError, WriteMode, merge_patch, strategic_merge_patch},
};

pub(super) fn parse_body(body: &Bytes) -> Result<Value, Response> {
    serde_json::from_slice(body)
        .map_err(|error| bad_request(format!("the body is not JSON: {error}")))
}

pub(super) fn write_error(target: &Target, name: &str, error: WriteError) -> Response {
    match error {
        WriteError::AlreadyExists => status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(target.info)),
            json!({ "name": name, "group": target.info.group, "kind": target.info.resource }),
        ),
        WriteError::NotFound => not_found_object(target.info, name),
        WriteError::Invalid(message) => status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{} \"{name}\" is invalid: {message}", target.info.kind),
            json!({ "name": name, "group": target.info.group, "kind": target.info.kind }),
        ),
    }
}

pub(super) fn write(shared: &Shared, target: &Target, body: &Bytes, mode: WriteMode) -> Response {
    let mut object = match parse_body(body) {
        Ok(object) => object,
        Err(response) => return response,
    };
    if target.info.status_subresource
        && let Some(fields) = object.as_object_mut()
    {
        // The object's writes ignore `status` (only `/status` changes it); a PUT keeps it.
        fields.remove("status");
        if mode == WriteMode::Replace
            && let Some(name) = &target.name
            && let Some(old) = shared.store.lock().unwrap().get(
                target.info.resource,
                target.namespace.as_deref().unwrap_or_default(),
                name,
            )
            && !old["status"].is_null()
        {
            object["status"] = old["status"].clone();
        }
    }
    let name = target
        .name
        .clone()
        .or_else(|| object["metadata"]["name"].as_str().map(str::to_owned))
        .unwrap_or_default();
    if let Some(path_name) = &target.name
        && object["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n != path_name)
    {
        return bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({path_name})"
        ));
    }
    let result = shared.store.lock().unwrap().write(
        target.info,
        target.namespace.as_deref().unwrap_or("default"),
        object,
        mode,
    );
    match result {
        Ok(stored) => {
            let _ = shared.changed.send(());
            let code = if mode == WriteMode::Create {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(code, &stored)
        }
        Err(error) => write_error(target, &name, error),
    }
}

/// PATCH as the API server does it: a `metadata.resourceVersion` in the patch is a
/// precondition (409 Conflict when the object moved on), and `dryRun=All` answers with the
/// patched object without storing it (nor bumping the resourceVersion, nor notifying watches).
pub(super) fn patch(
    shared: &Shared,
    target: &Target,
    body: &Bytes,
    content_type: Option<&str>,
    params: &HashMap<String, String>,
) -> Response {
    let dry_run = match params.get("dryRun").map(String::as_str) {
        None => false,
        Some("All") => true,
        Some(other) => {
            return bad_request(format!(
                "dryRun: Unsupported value: \"{other}\": supported values: \"All\""
            ));
        }
    };
    let content_type = content_type.unwrap_or_default();
    let apply = content_type.starts_with("application/apply-patch");
    if !(apply
        || content_type.starts_with("application/merge-patch+json")
        || content_type.starts_with("application/strategic-merge-patch+json"))
    {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
            json!({}),
        );
    }
    let patch = match parse_body(body) {
        Ok(patch) => patch,
        Err(response) => return response,
    };
    let name = target.name.clone().unwrap_or_default();
    let namespace = target.namespace.clone().unwrap_or_default();
    let mut store = shared.store.lock().unwrap();
    let mut object = match store.get(target.info.resource, &namespace, &name) {
        Some(object) => object,
        // As the API server: apply to `/status` does not create the object.
        None if apply && !target.status => json!({ "metadata": { "name": name } }),
        None => return not_found_object(target.info, &name),
    };
    if let Some(wanted) = patch["metadata"]["resourceVersion"].as_str()
        && object["metadata"]["resourceVersion"].as_str() != Some(wanted)
    {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(target.info)
            ),
            json!({ "name": name, "group": target.info.group, "kind": target.info.resource }),
        );
    }
    let strategic = content_type.starts_with("application/strategic-merge-patch+json");
    if target.status && strategic {
        strategic_merge_patch(&mut object["status"], &patch["status"]);
    } else if target.status {
        // `/status` changes `status` only (and checks the patch's resourceVersion, above).
        merge_patch(&mut object["status"], &patch["status"]);
    } else if target.info.status_subresource {
        let mut patch = patch.clone();
        if let Some(fields) = patch.as_object_mut() {
            fields.remove("status");
        }
        merge_patch(&mut object, &patch);
    } else {
        merge_patch(&mut object, &patch);
    }
    object["metadata"]["name"] = json!(name);
    if dry_run {
        // The stored object keeps its resourceVersion: restore it over the patch's.
        if let Some(stored) = store.get(target.info.resource, &namespace, &name) {
            object["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"].clone();
        }
        return json_response(StatusCode::OK, &object);
    }
    let result = store.write(target.info, &namespace, object, WriteMode::Upsert);
    drop(store);
    match result {
        Ok(stored) => {
            let _ = shared.changed.send(());
            json_response(StatusCode::OK, &stored)
        }
        Err(error) => write_error(target, &name, error),
    }
}

pub(super) fn delete(shared: &Shared, target: &Target) -> Response {
    let name = target.name.clone().unwrap_or_default();
    let namespace = target.namespace.clone().unwrap_or_default();
    let deleted = shared
        .store
        .lock()
        .unwrap()
        .delete(target.info, &namespace, &name);
    match deleted {
        Some(object) => {
            let _ = shared.changed.send(());
            json_response(StatusCode::OK, &object)
        }
        None => not_found_object(target.info, &name),
    }
}
