//! The fake server's HTTP side (hyper): accepting connections and dispatching each request
//! by path and verb to the files beside this one.

mod discovery;
mod proxy;
mod reads;
mod response;
mod route;
mod watch;
mod writes;

use std::{
    convert::Infallible,
    sync::{Arc, atomic::Ordering},
};

use discovery::discovery;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode, body::Incoming};
use reads::{get, list};
use response::{Body, Response, bad_request, json_response, not_found_path, qualified, status};
use route::{forbidden, query_params, route};
use serde_json::json;
use watch::watch_stream;
use writes::{delete, patch, write};

use crate::kubeapi::{Request, Shared, TrafficKey, store, store::WriteMode};

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

/// Answers `request`, counting it and the bytes of its answer into the traffic of its client
/// (the bearer token), verb and resource ([`crate::kubeapi::FakeApiServer::traffic`]).
async fn handle(shared: Arc<Shared>, request: hyper::Request<Incoming>) -> Response {
    let key = TrafficKey {
        client: client_of(request.headers()),
        verb: verb_of(request.method(), request.uri()),
        resource: resource_of(request.uri().path()),
    };
    let meter = shared.traffic_cell(key);
    meter.requests.fetch_add(1, Ordering::Relaxed);
    let mut response = respond(shared, request).await;
    match response.body_mut() {
        Body::Full(_) => {
            let size = hyper::body::Body::size_hint(response.body()).exact();
            meter.bytes.fetch_add(size.unwrap_or(0), Ordering::Relaxed);
        }
        Body::Stream(_, slot) => *slot = Some(meter),
    }
    response
}

/// Who sent a request: its bearer token (the fake authenticates nobody; a bench gives each
/// client a token of its own to tell their requests apart), else `anonymous`.
fn client_of(headers: &hyper::HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map_or_else(|| "anonymous".to_owned(), str::to_owned)
}

/// The RBAC verb of a request on a resource, else its method in lower case.
fn verb_of(method: &Method, uri: &hyper::Uri) -> String {
    let named = route(uri.path()).map(|t| t.name.is_some());
    let watch = matches!(
        query_params(uri.query()).get("watch").map(String::as_str),
        Some("1" | "true")
    );
    match (method, named) {
        (&Method::GET, Some(true)) => "get",
        (&Method::GET, Some(false)) if watch => "watch",
        (&Method::GET, Some(false)) => "list",
        (&Method::POST, Some(false)) => "create",
        (&Method::PATCH, Some(true)) => "patch",
        (&Method::PUT, Some(true)) => "update",
        (&Method::DELETE, Some(true)) => "delete",
        _ => return method.as_str().to_ascii_lowercase(),
    }
    .to_owned()
}

/// `resource.group` (`/status` when the subresource), `pods/proxy`, else the path.
fn resource_of(path: &str) -> String {
    if proxy::route(path).is_some() {
        return "pods/proxy".to_owned();
    }
    match route(path) {
        Some(target) if target.status => format!("{}/status", qualified(target.info)),
        Some(target) => qualified(target.info),
        None => path.to_owned(),
    }
}

async fn respond(shared: Arc<Shared>, request: hyper::Request<Incoming>) -> Response {
    let method = request.method().clone();
    let uri = request.uri().clone();
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let accept = request
        .headers()
        .get("accept")
        .and_then(|v| v.to_str().ok());
    let as_table = crate::kubeapi::table::wants_table(accept);
    // A metadata-only list (kube's `list_metadata`, client-go's metadata informers): the API
    // server sends each item's `metadata` alone, as `PartialObjectMetadataList`.
    let as_metadata = accept.is_some_and(|a| a.contains("as=PartialObjectMetadataList"));
    shared.requests.lock().unwrap().push(Request {
        method: method.to_string(),
        path: uri
            .path_and_query()
            .map(ToString::to_string)
            .unwrap_or_default(),
        content_type: content_type.clone(),
        client: client_of(request.headers()),
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
    // Who the caller is (kubectl auth whoami; the plugin names the verify requester with it):
    // the fake authenticates everyone as `fake-user`.
    if path == "/apis/authentication.k8s.io/v1/selfsubjectreviews" && method == Method::POST {
        return json_response(
            StatusCode::CREATED,
            &json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                "metadata": {"creationTimestamp": null},
                "status": {"userInfo": {"username": crate::kubeapi::FAKE_USER,
                                        "groups": ["system:authenticated"]}},
            }),
        );
    }
    if let Some(target) = proxy::route(path) {
        if method != Method::GET {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("the fake proxies GET to pods only: {method} {path}"),
                json!({}),
            );
        }
        // As the API server: the caller's headers go on, less its credentials (the
        // authentication filter removes `Authorization`) and the hop-by-hop ones.
        let forwarded: Vec<(String, String)> = request
            .headers()
            .iter()
            .filter(|(name, _)| !proxy::NOT_FORWARDED.contains(&name.as_str()))
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
            .collect();
        return proxy::forward(&shared, target, uri.query(), forwarded).await;
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
        "list" => list(&shared, &target, &params, as_table, as_metadata),
        "watch" => watch_stream(shared, target, params),
        "create" => write(&shared, &target, &body, WriteMode::Create),
        "update" => write(&shared, &target, &body, WriteMode::Replace),
        "patch" => patch(&shared, &target, &body, content_type.as_deref(), &params),
        "delete" => delete(&shared, &target),
        _ => unreachable!("every verb is handled"),
    }
}
