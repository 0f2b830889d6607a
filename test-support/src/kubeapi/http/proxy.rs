//! `GET /api/v1/namespaces/NS/pods/NAME[:PORT]/proxy/PATH`: the API server's proxy to a pod,
//! forwarded for real: the pod's `status.podIP` and PORT (80 when none) get an HTTP/1.0 GET of
//! PATH, and the pod's answer (status, content type, body) is the answer. The connection is
//! made from the network namespace [`crate::kubeapi::FakeApiServer::proxy_pods_in`] names
//! (the lab's node, where a hostNetwork agent listens), else from the test's own. RBAC is
//! the `pods/proxy` resource's `get` ([`crate::kubeapi::FakeApiServer::forbid`]
//! `("pods/proxy", "get")`); an unreachable pod is the API server's 503.

use http_body_util::Full;
use hyper::{StatusCode, body::Bytes};
use serde_json::json;

use super::response::{Body, Response, status};
use crate::kubeapi::Shared;

/// The proxied pod and path, when `path` is a pod proxy request.
pub(super) struct ProxyTarget {
    namespace: String,
    pod: String,
    port: u16,
    rest: String,
}

pub(super) fn route(path: &str) -> Option<ProxyTarget> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("pods/")?;
    let (pod_port, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("proxy")?;
    let (pod, port) = match pod_port.split_once(':') {
        Some((pod, port)) => (pod, port.parse().ok()?),
        None => (pod_port, 80),
    };
    Some(ProxyTarget {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        port,
        rest: if rest.is_empty() {
            "/".into()
        } else {
            rest.to_owned()
        },
    })
}

/// The request headers the proxy does not pass on to the pod: the caller's credentials and
/// the hop-by-hop headers (the fake speaks HTTP/1.0 to the pod with a `Host` of its own).
pub(super) const NOT_FORWARDED: &[&str] = &[
    "authorization",
    "host",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

pub(super) async fn forward(
    shared: &Shared,
    target: ProxyTarget,
    query: Option<&str>,
    headers: Vec<(String, String)>,
) -> Response {
    if shared
        .forbidden
        .lock()
        .unwrap()
        .contains(&("pods/proxy".to_owned(), "get".to_owned()))
    {
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "pods \"{}\" is forbidden: User \"fake-user\" cannot get resource \"pods/proxy\" in API group \"\" in the namespace \"{}\"",
                target.pod, target.namespace
            ),
            json!({ "name": target.pod, "kind": "pods" }),
        );
    }
    let pod = shared
        .store
        .lock()
        .unwrap()
        .get("pods", &target.namespace, &target.pod);
    let Some(ip) = pod
        .as_ref()
        .and_then(|p| p["status"]["podIP"].as_str())
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
    else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{}\" not found (or has no status.podIP)", target.pod),
            json!({ "name": target.pod, "kind": "pods" }),
        );
    };
    let addr = std::net::SocketAddr::new(ip, target.port);
    let netns = shared.proxy_netns.lock().unwrap().clone();
    let path = match query {
        Some(q) => format!("{}?{q}", target.rest),
        None => target.rest,
    };
    let fetched = tokio::task::spawn_blocking(move || get(netns.as_deref(), addr, &path, &headers))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    match fetched {
        Ok((code, content_type, body)) => {
            let mut r = hyper::Response::new(Body::Full(Full::new(Bytes::from(body))));
            *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
            if let Some(ct) =
                content_type.and_then(|c| hyper::header::HeaderValue::from_str(&c).ok())
            {
                r.headers_mut().insert(hyper::header::CONTENT_TYPE, ct);
            }
            r
        }
        // What the API server answers when it cannot reach the pod.
        Err(e) => status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("error trying to reach service: dial tcp {addr}: {e}"),
            json!({}),
        ),
    }
}

/// One HTTP/1.0 GET: (status, content type, body).
fn get(
    netns: Option<&str>,
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(String, String)],
) -> std::io::Result<(u16, Option<String>, Vec<u8>)> {
    let connect = || std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(3));
    let mut s = match netns {
        Some(ns) => crate::lab::in_netns(ns, || connect().map_err(anyhow::Error::from))
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?,
        None => connect()?,
    };
    let (code, head, body) = crate::lab::http_get_over(
        &mut s,
        addr,
        path,
        headers.iter().map(|(name, value)| (name, value)),
    )?;
    let content_type = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-type")
            .then(|| v.trim().to_owned())
    });
    Ok((code, content_type, body))
}
