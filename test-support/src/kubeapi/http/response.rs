//! What the fake answers with: a full or streamed body, JSON responses and the API's `Status`
//! errors.

use std::{
    convert::Infallible,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
};

use http_body_util::Full;
use hyper::{
    StatusCode,
    body::{Bytes, Frame},
};
use serde_json::{Value, json};

use crate::kubeapi::{TrafficCell, store::ResourceInfo};

pub(super) type Response = hyper::Response<Body>;

/// A full body, or a watch stream fed by a channel (its bytes counted into the request's
/// traffic as they leave, [`crate::kubeapi::FakeApiServer::traffic`]).
pub(crate) enum Body {
    Full(Full<Bytes>),
    Stream(tokio::sync::mpsc::Receiver<Bytes>, Option<Arc<TrafficCell>>),
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
            Body::Stream(rx, meter) => rx.poll_recv(cx).map(|chunk| {
                chunk.map(|c| {
                    if let Some(meter) = meter {
                        meter.bytes.fetch_add(c.len() as u64, Ordering::Relaxed);
                    }
                    Ok(Frame::data(c))
                })
            }),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Full(full) => hyper::body::Body::size_hint(full),
            Body::Stream(..) => hyper::body::SizeHint::default(),
        }
    }
}

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::Full(Full::new(Bytes::from(body.to_string()))))
        .expect("a valid response")
}

/// A `Status` object as the API server returns for errors.
pub(super) fn status(code: StatusCode, reason: &str, message: String, details: Value) -> Response {
    json_response(code, &status_object(code, reason, message, details))
}

pub(super) fn status_object(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Value,
) -> Value {
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

pub(super) fn not_found_path(path: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource".into(),
        json!({ "causes": [{ "reason": "UnexpectedServerResponse", "message": format!("404 page not found: {path}") }] }),
    )
}

pub(super) fn not_found_object(info: &ResourceInfo, name: &str) -> Response {
    let resource = qualified(info);
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{resource} \"{name}\" not found"),
        json!({ "name": name, "group": info.group, "kind": info.resource }),
    )
}

pub(super) fn qualified(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        info.resource.to_owned()
    } else {
        format!("{}.{}", info.resource, info.group)
    }
}

pub(super) fn bad_request(message: String) -> Response {
    status(StatusCode::BAD_REQUEST, "BadRequest", message, json!({}))
}

pub(super) fn expired(version: u64, current: u64) -> Value {
    status_object(
        StatusCode::GONE,
        "Expired",
        format!("too old resource version: {version} ({current})"),
        json!({}),
    )
}
