//! A small HTTP/1.1 server on the tokio runtime (hyper) for the metrics endpoint.
//!
//! Each connection is a task of its own, so a slow or stuck client never delays another one
//! (the kubelet's `/healthz` probe in particular). Bounds: at most [`MAX_CONNECTIONS`] at once
//! (more wait in the listen backlog until one ends), request headers within [`HEADER_TIMEOUT`],
//! and a connection lives at most [`CONNECTION_LIFETIME`], which also bounds a client that
//! pipelines requests and stops reading the answers (its writes would otherwise wait forever).
//! Only GET and HEAD are served (405 otherwise); routing looks at the path, never the query.

use std::{convert::Infallible, future::Future, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    service::service_fn,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::debug;

/// Connections served at once; each costs a task and a small buffer (see [`MAX_BUF`]): about
/// 25 MiB at the cap, inside the DaemonSet's memory limit.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections the kernel queues before we accept them (std binds with 128): a burst beyond
/// the cap waits here instead of having its SYNs dropped (a 1 s retransmit for the kubelet).
const BACKLOG: i32 = 1024;
/// A client has this long to send a request's headers (slow-loris clients are cut off).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection stays open, whatever it does (keep-alive scrapers reconnect).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);
/// How long open requests may finish once the agent is stopping.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(200);
/// Read buffer per connection: requests here are a line and a few headers.
const MAX_BUF: usize = 16 * 1024;

/// What a handler returns: status, content type, body.
pub type Reply = (StatusCode, &'static str, String);

/// Serves `route(path, headers)` for GET/HEAD on `listener` until `stop` resolves, then lets
/// open requests finish for [`SHUTDOWN_GRACE`] and returns.
pub async fn serve<R>(
    listener: std::net::TcpListener,
    route: R,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    R: Fn(&str, &hyper::HeaderMap) -> Reply + Send + Sync + 'static,
{
    listener.set_nonblocking(true)?;
    // listen(2) again on a listening socket only changes its backlog.
    // SAFETY: a valid listening socket fd.
    if unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), BACKLOG) } != 0 {
        debug!(error = %std::io::Error::last_os_error(), "metrics: raising the listen backlog");
    }
    let listener = TcpListener::from_std(listener)?;
    let route = Arc::new(route);
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BUF);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, never end the server.
                    debug!(error = %e, "metrics: accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let route = route.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let route = route.clone();
            async move { Ok::<_, Infallible>(respond(&req, route.as_ref())) }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                debug!(error = %e, "metrics: connection");
            }
            drop(permit);
        });
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    Ok(())
}

fn respond<R>(req: &Request<Incoming>, route: &R) -> Response<Full<Bytes>>
where
    R: Fn(&str, &hyper::HeaderMap) -> Reply,
{
    let (status, content_type, body) = match *req.method() {
        Method::GET | Method::HEAD => route(req.uri().path(), req.headers()),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed: GET or HEAD\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
    }
    response
}
