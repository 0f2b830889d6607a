//! The fake server's HTTP side (hyper): routing, verbs, watch streams, Status errors.
#![expect(
    clippy::result_large_err,
    reason = "an error is the response itself, built once per request: boxing buys nothing"
)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::selector::Selector;
use super::store;
use super::store::{
    ResourceInfo, WriteError, WriteMode, merge_patch, resource_at, strategic_merge_patch,
};
use super::{BOOKMARK_INTERVAL, Request, Shared};

type Response = hyper::Response<Body>;

/// A full body, or a watch stream fed by a channel.
pub(crate) enum Body {
    Full(Full<Bytes>),
    Stream(tokio::sync::mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(full) => Pin::new(full).poll_frame(cx),
            Body::Stream(rx) => rx
                .poll_recv(cx)
                .map(|chunk| chunk.map(|c| Ok(Frame::data(c)))),
        }
    }
}

pub(crate) async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("a nonblocking listener");
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(shared, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::Full(Full::new(Bytes::from(body.to_string()))))
        .expect("a valid response")
}

/// A `Status` object as the API server returns for errors.
fn status(code: StatusCode, reason: &str, message: String, details: Value) -> Response {
    json_response(code, &status_object(code, reason, message, details))
}

fn status_object(code: StatusCode, reason: &str, message: String, details: Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code.as_u16(),
    })
}

fn not_found_path(path: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource".into(),
        json!({ "causes": [{ "reason": "UnexpectedServerResponse", "message": format!("404 page not found: {path}") }] }),
    )
}

fn not_found_object(info: &ResourceInfo, name: &str) -> Response {
    let resource = qualified(info);
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{resource} \"{name}\" not found"),
        json!({ "name": name, "group": info.group, "kind": info.resource }),
    )
}

fn qualified(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        info.resource.to_owned()
    } else {
        format!("{}.{}", info.resource, info.group)
    }
}

fn bad_request(message: String) -> Response {
    status(StatusCode::BAD_REQUEST, "BadRequest", message, json!({}))
}

/// What a request addresses.
struct Target {
    info: &'static ResourceInfo,
    namespace: Option<String>,
    name: Option<String>,
    /// `.../NAME/status` of a resource with a status subresource.
    status: bool,
}

fn route(path: &str) -> Option<Target> {
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

/// Legacy discovery (`/api`, `/apis`, `/api/v1`, `/apis/GROUP/VERSION`), which kubectl reads
/// to map `service` to a resource: the resources of [`store::RESOURCES`], nothing else.
fn discovery(path: &str) -> Option<Value> {
    let group_version = |r: &ResourceInfo| r.api_version.to_string();
    let resources = |gv: &str| -> Vec<Value> {
        store::RESOURCES
            .iter()
            .filter(|r| group_version(r) == gv)
            .map(|r| {
                let verbs: &[&str] = if store::is_core_event(r) {
                    &["get", "list"]
                } else {
                    &[
                        "create", "delete", "get", "list", "patch", "update", "watch",
                    ]
                };
                json!({
                    "name": r.resource,
                    "singularName": r.kind.to_ascii_lowercase(),
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": verbs,
                    "shortNames": match r.resource {
                        "pods" => json!(["po"]),
                        "services" => json!(["svc"]),
                        "nodes" => json!(["no"]),
                        "events" => json!(["ev"]),
                        // The chart's CRD declares `lbr`.
                        "loopbackreports" => json!(["lbr"]),
                        _ => json!([]),
                    },
                })
            })
            .collect()
    };
    let trimmed = path.trim_end_matches('/');
    match trimmed {
        "/api" => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        "/apis" => {
            let mut groups: Vec<&str> = store::RESOURCES
                .iter()
                .filter(|r| !r.group.is_empty())
                .map(|r| r.group)
                .collect();
            groups.dedup();
            Some(json!({
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": groups.iter().map(|g| {
                    let version = store::RESOURCES
                        .iter()
                        .find(|r| r.group == *g)
                        .and_then(|r| r.api_version.rsplit_once('/'))
                        .map_or("v1", |(_, v)| v);
                    let gv = json!({"groupVersion": format!("{g}/{version}"), "version": version});
                    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
                }).collect::<Vec<_>>(),
            }))
        }
        "/api/v1" => Some(json!({
            "kind": "APIResourceList", "groupVersion": "v1", "resources": resources("v1"),
        })),
        _ => {
            let gv = trimmed.strip_prefix("/apis/")?;
            let list = resources(gv);
            (gv.matches('/').count() == 1 && !list.is_empty()).then(|| {
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list})
            })
        }
    }
}

fn query_params(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

async fn handle(shared: Arc<Shared>, request: hyper::Request<Incoming>) -> Response {
    let method = request.method().clone();
    let uri = request.uri().clone();
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let as_table = super::table::wants_table(
        request
            .headers()
            .get("accept")
            .and_then(|v| v.to_str().ok()),
    );
    shared.requests.lock().unwrap().push(Request {
        method: method.to_string(),
        path: uri
            .path_and_query()
            .map(ToString::to_string)
            .unwrap_or_default(),
        content_type: content_type.clone(),
    });
    let path = uri.path();
    if path == "/version" && method == Method::GET {
        return json_response(
            StatusCode::OK,
            &json!({
                "major": "1", "minor": "34", "gitVersion": "v1.34.0-fake",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
                "platform": "linux/amd64",
            }),
        );
    }
    if method == Method::GET
        && let Some(document) = discovery(path)
    {
        return json_response(StatusCode::OK, &document);
    }
    let Some(target) = route(path) else {
        return not_found_path(path);
    };
    let params = query_params(uri.query());
    let watch = matches!(params.get("watch").map(String::as_str), Some("1" | "true"));
    let verb = match (&method, target.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PATCH, true) => "patch",
        (&Method::PUT, true) => "update",
        (&Method::DELETE, true) => "delete",
        _ => {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource: {method} {path}"
                ),
                json!({}),
            );
        }
    };
    if store::is_core_event(target.info) && !matches!(verb, "get" | "list") {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the fake serves core/v1 events read-only ({verb}): {method} {path}"),
            json!({}),
        );
    }
    if verb == "list" {
        // Held by a test (`FakeApiServer::hold_lists`): the client waits for its first list.
        let mut held = shared.lists_held.subscribe();
        let _ = held.wait_for(|held| !*held).await;
    }
    if shared
        .forbidden
        .lock()
        .unwrap()
        .contains(&(target.info.resource.to_owned(), verb.to_owned()))
    {
        return forbidden(&target, verb);
    }
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => return bad_request(format!("reading the body: {error}")),
    };
    if target.status && !matches!(verb, "get" | "patch") {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the fake serves /status for get and patch only ({verb}): {method} {path}"),
            json!({}),
        );
    }
    match verb {
        "get" => get(&shared, &target),
        "list" => list(&shared, &target, &params, as_table),
        "watch" => watch_stream(shared, target, params),
        "create" => write(&shared, &target, &body, WriteMode::Create),
        "update" => write(&shared, &target, &body, WriteMode::Replace),
        "patch" => patch(&shared, &target, &body, content_type.as_deref(), &params),
        "delete" => delete(&shared, &target),
        _ => unreachable!("every verb is handled"),
    }
}

fn forbidden(target: &Target, verb: &str) -> Response {
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

fn get(shared: &Shared, target: &Target) -> Response {
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

struct Filters {
    fields: Selector,
    labels: Selector,
}

impl Filters {
    fn parse(params: &HashMap<String, String>) -> Result<Self, Response> {
        let fields = Selector::parse(
            params.get("fieldSelector").map_or("", String::as_str),
            false,
        )
        .map_err(bad_request)?;
        let labels = Selector::parse(params.get("labelSelector").map_or("", String::as_str), true)
            .map_err(bad_request)?;
        Ok(Self { fields, labels })
    }

    fn matches(&self, object: &Value) -> bool {
        self.fields.matches_fields(object) && self.labels.matches_labels(object)
    }
}

/// A client's resourceVersion: `None` for "any" (`""` or `"0"`).
fn requested_version(params: &HashMap<String, String>) -> Result<Option<u64>, Response> {
    match params.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| bad_request(format!("invalid resourceVersion {text:?}"))),
    }
}

fn expired(version: u64, current: u64) -> Value {
    status_object(
        StatusCode::GONE,
        "Expired",
        format!("too old resource version: {version} ({current})"),
        json!({}),
    )
}

fn list(
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
            super::table::loopbackreport_columns()
        } else {
            Vec::new()
        };
        return json_response(
            StatusCode::OK,
            &super::table::table(&columns, &items, &store.resource_version().to_string()),
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

fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch_stream(shared: Arc<Shared>, target: Target, params: HashMap<String, String>) -> Response {
    let filters = match Filters::parse(&params) {
        Ok(filters) => filters,
        Err(response) => return response,
    };
    let version = match requested_version(&params) {
        Ok(version) => version,
        Err(response) => return response,
    };
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true" || v == "1");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut changed = shared.changed.subscribe();
        let mut end = shared.end_watches.subscribe();
        let info = target.info;
        let namespace = target.namespace;
        let in_scope = |object: &Value| {
            namespace
                .as_deref()
                .is_none_or(|ns| object["metadata"]["namespace"] == json!(ns))
                && filters.matches(object)
        };
        let mut seen = match version {
            Some(version) => version,
            None => {
                let (objects, current) = {
                    let store = shared.store.lock().unwrap();
                    (
                        store.list(info.resource, namespace.as_deref()),
                        store.resource_version(),
                    )
                };
                for object in objects.iter().filter(|o| in_scope(o)) {
                    if tx.send(watch_line("ADDED", object)).await.is_err() {
                        return;
                    }
                }
                current
            }
        };
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut bookmark = tokio::time::interval(BOOKMARK_INTERVAL);
        bookmark.tick().await;
        loop {
            let pending = {
                let store = shared.store.lock().unwrap();
                match store.changes_since(info.resource, seen) {
                    Some(changes) => Ok((changes, store.resource_version())),
                    None => Err(expired(seen, store.resource_version())),
                }
            };
            match pending {
                Err(gone) => {
                    let _ = tx.send(watch_line("ERROR", &gone)).await;
                    return;
                }
                Ok((changes, current)) => {
                    for change in changes {
                        seen = change.resource_version;
                        if in_scope(&change.object)
                            && tx
                                .send(watch_line(change.kind, &change.object))
                                .await
                                .is_err()
                        {
                            return;
                        }
                    }
                    seen = seen.max(current);
                }
            }
            if shared
                .end_at_once
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                return;
            }
            tokio::select! {
                _ = &mut deadline => return,
                _ = end.recv() => return,
                _ = changed.recv() => {}
                _ = bookmark.tick(), if bookmarks => {
                    let object = json!({
                        "kind": info.kind,
                        "apiVersion": info.api_version,
                        "metadata": { "resourceVersion": seen.to_string() },
                    });
                    if tx.send(watch_line("BOOKMARK", &object)).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    hyper::Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::Stream(rx))
        .expect("a valid response")
}

fn parse_body(body: &Bytes) -> Result<Value, Response> {
    serde_json::from_slice(body)
        .map_err(|error| bad_request(format!("the body is not JSON: {error}")))
}

fn write_error(target: &Target, name: &str, error: WriteError) -> Response {
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

fn write(shared: &Shared, target: &Target, body: &Bytes, mode: WriteMode) -> Response {
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
fn patch(
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

fn delete(shared: &Shared, target: &Target) -> Response {
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
