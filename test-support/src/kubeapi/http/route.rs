//! What a request addresses (group, version, resource, namespace, name, `/status`), its
//! query, and the Forbidden answer a test can set per resource and verb.

use std::collections::HashMap;

use hyper::StatusCode;
use serde_json::json;

use super::response::{Response, qualified, status};
use crate::kubeapi::store::{ResourceInfo, resource_at};

/// What a request addresses.
pub(super) struct Target {
    pub(super) info: &'static ResourceInfo,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    /// `.../NAME/status` of a resource with a status subresource.
    pub(super) status: bool,
}

pub(super) fn route(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, resource, name, status) = match rest {
        ["namespaces", ns, resource] => (Some(*ns), *resource, None, false),
        ["namespaces", ns, resource, name] => (Some(*ns), *resource, Some(*name), false),
        ["namespaces", ns, resource, name, "status"] => (Some(*ns), *resource, Some(*name), true),
        [resource] => (None, *resource, None, false),
        [resource, name] => (None, *resource, Some(*name), false),
        [resource, name, "status"] => (None, *resource, Some(*name), true),
        _ => return None,
    };
    let info = resource_at(group, version, resource)?;
    if (namespace.is_some() && !info.namespaced) || (status && !info.status_subresource) {
        return None;
    }
    Some(Target {
        info,
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        status,
    })
}

pub(super) fn query_params(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

pub(super) fn forbidden(target: &Target, verb: &str) -> Response {
    let resource = qualified(target.info);
    let scope = match &target.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".into(),
    };
    let mut details = json!({ "group": target.info.group, "kind": target.info.resource });
    if let Some(name) = &target.name {
        details["name"] = json!(name);
    }
    status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "{resource} is forbidden: User \"system:serviceaccount:kube-system:clb-probe\" cannot {verb} resource \"{}\" in API group \"{}\" {scope}",
            target.info.resource, target.info.group
        ),
        details,
    )
}
