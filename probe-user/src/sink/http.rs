//! A small HTTP/1.1 server on the tokio runtime (hyper) for the metrics endpoint.
//!
//! Each connection is a task of its own, so a slow or stuck client never delays another one
//! (the kubelet's `/healthz` probe in particular). Bounds: at most [`MAX_CONNECTIONS`] at once,
//! request headers within [`HEADER_TIMEOUT`], and a connection lives at most
//! [`CONNECTION_LIFETIME`], which also bounds a client that pipelines requests and stops
//! reading the answers (its writes would otherwise wait forever).
//!
//! At the cap, a new connection is still accepted at once and the oldest connection that is
//! not inside a request's handler is cut to make room. Waiting in the listen backlog instead
//! (what the server did first) let 1,100 half-sent requests, reopened whenever cut, keep every
//! slot: the kubelet's probe queued behind them and failed 15 of 20 rounds, and the chart's
//! liveness probe would restart a healthy agent at any pod's will. Cutting the oldest means a
//! client that sends its request at once (a probe, a scrape) is answered before the flood can
//! cycle through the whole cap; the clients that lose are the ones that held a slot longest.
//! Only GET and HEAD are served (405 otherwise); routing looks at the path, never the query.

use std::{
    collections::VecDeque,
    convert::Infallible,
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

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
use tokio::{net::TcpListener, sync::Notify};
use tracing::debug;

/// Connections served at once; each costs a task and a small buffer (see [`MAX_BUF`]): about
/// 25 MiB at the cap, inside the DaemonSet's memory limit. One more cuts the oldest.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections the kernel queues before we accept them (std binds with 128): a burst waits
/// here instead of having its SYNs dropped (a 1 s retransmit for the kubelet).
const BACKLOG: i32 = 1024;
/// A client has this long to send a request's headers (slow-loris clients are cut off).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection stays open, whatever it does (keep-alive scrapers reconnect).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);
/// How long open requests may finish once the agent is stopping.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(200);
/// Read buffer per connection: requests here are a line and a few headers.
const MAX_BUF: usize = 16 * 1024;

/// What a handler returns: status, content type, body (text, JSON or a pcapng file).
pub type Reply = (StatusCode, &'static str, Bytes);

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
    let open = Arc::new(OpenConnections::default());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BUF);
    tokio::pin!(stop);
    loop {
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
        let conn_state = open.admit(MAX_CONNECTIONS);
        let route = route.clone();
        let in_handler = conn_state.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let route = route.clone();
            in_handler.busy.store(true, Ordering::Relaxed);
            let reply = respond(&req, route.as_ref());
            in_handler.busy.store(false, Ordering::Relaxed);
            async move { Ok::<_, Infallible>(reply) }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        let open = open.clone();
        tokio::spawn(async move {
            tokio::select! {
                ended = tokio::time::timeout(CONNECTION_LIFETIME, conn) => {
                    if let Ok(Err(e)) = ended {
                        debug!(error = %e, "metrics: connection");
                    }
                }
                () = conn_state.cut.notified() => debug!("metrics: oldest connection cut at the cap"),
            }
            open.remove(conn_state.id);
        });
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// One open connection: whether a request is inside its handler, and how to cut it.
struct Conn {
    id: u64,
    busy: AtomicBool,
    cut: Notify,
}

/// The open connections, oldest first.
#[derive(Default)]
struct OpenConnections {
    next_id: std::sync::atomic::AtomicU64,
    conns: Mutex<VecDeque<Arc<Conn>>>,
}

impl OpenConnections {
    /// Registers a new connection; at `cap`, cuts the oldest one not inside a handler (the
    /// oldest of all when every one is).
    fn admit(&self, cap: usize) -> Arc<Conn> {
        let conn = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            busy: AtomicBool::new(false),
            cut: Notify::new(),
        });
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= cap {
            let victim = conns
                .iter()
                .position(|c| !c.busy.load(Ordering::Relaxed))
                .unwrap_or(0);
            if let Some(old) = conns.remove(victim) {
                // A stored permit: the task sees it even if it is not waiting yet.
                old.cut.notify_one();
            }
        }
        conns.push_back(conn.clone());
        conn
    }

    fn remove(&self, id: u64) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = conns.iter().position(|c| c.id == id) {
            conns.remove(at);
        }
    }
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
            Bytes::from_static(b"method not allowed: GET or HEAD\n"),
        ),
    };
    let mut response = Response::new(Full::new(body));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// At the cap the oldest connection outside a handler is cut, never the newcomer; when
    /// every one is inside a handler, the oldest of all.
    #[test]
    fn at_the_cap_the_oldest_idle_connection_is_cut() {
        let open = OpenConnections::default();
        let a = open.admit(3);
        let b = open.admit(3);
        let c = open.admit(3);
        a.busy.store(true, Ordering::Relaxed);
        let d = open.admit(3);
        let ids = |o: &OpenConnections| -> Vec<u64> {
            o.conns.lock().unwrap().iter().map(|c| c.id).collect()
        };
        assert_eq!(
            ids(&open),
            [a.id, c.id, d.id],
            "b, the oldest idle one, is cut"
        );
        for conn in [&a, &c, &d] {
            conn.busy.store(true, Ordering::Relaxed);
        }
        let e = open.admit(3);
        assert_eq!(ids(&open), [c.id, d.id, e.id], "all busy: the oldest, a");
        open.remove(c.id);
        let f = open.admit(3);
        assert_eq!(
            ids(&open),
            [d.id, e.id, f.id],
            "below the cap nothing is cut"
        );
        drop(b);
    }
}
