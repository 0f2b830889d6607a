//! Which watches the API server accepted, seen on the kube client's HTTP stack.
//!
//! kube-runtime's watcher restarts a watch after a non-410 error (a cut connection, a 403 or
//! 500 on the restart) without telling its consumer: the restarted watch yields nothing until
//! an object changes (it consumes bookmarks itself). `clbprobe_kube_connected`, cleared by the
//! error, would stay 0 until the next change. So the watcher's client carries this layer,
//! which counts, per watcher source, watch requests the API server answered with a 2xx
//! status: a count that grew after a source's error means its watch is live again. (A 410 is
//! no such case: the watcher relists, and the relist's end says so.)
//!
//! The same layer paces the watches. kube-runtime re-opens a watch the server ended cleanly at
//! once, with no backoff (its backoff is for errors): a server, or a proxy in front of it, that
//! ends every watch right away gets a new one per resource as fast as round trips go (75 a
//! second per agent was measured), and attribution silently lags. So a watch re-opened less
//! than [`SHORT_WATCH`] after the previous one of its resource was sent (and accepted: errors
//! are kube-runtime's to back off) waits first: 1 s,
//! doubling per short watch in a row, up to [`PACE_MAX`] (at most one watch per resource per
//! second). After [`SAY_AFTER`] short watches in a row one WARN says so and
//! `clbprobe_kube_connected` reads 0 until a watch lasts again (an INFO then). The wait is
//! taken before the request's future is first polled: the kube client's HTTP stack sends
//! nothing before that.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::future::BoxFuture;
use hyper::{Request, Response, Uri};
use tokio::time::Instant;
use tower::{Layer, Service};
use tracing::{info, warn};

use super::watcher::SOURCES;

/// A watch that ends sooner than this after it was sent is a short one (a healthy watch lasts
/// minutes: kube-runtime asks for 290 s).
pub const SHORT_WATCH: Duration = Duration::from_secs(5);
/// The first wait after a short watch; each further one in a row doubles it.
pub const PACE_FIRST: Duration = Duration::from_secs(1);
/// The longest wait before re-opening a watch.
pub const PACE_MAX: Duration = Duration::from_secs(30);
/// Short watches in a row before the WARN and `clbprobe_kube_connected` 0.
pub const SAY_AFTER: u32 = 3;

/// One resource's watch pacing.
#[derive(Debug, Default)]
struct Pace {
    /// When its last watch was sent.
    sent: Option<Instant>,
    /// Short watches in a row.
    short: u32,
    /// A watch is waiting out its pace.
    waiting: bool,
    /// The WARN was said for this run of short watches.
    said: bool,
}

impl Pace {
    /// A watch request arrives at `now`: how long it waits. `quiet`: another resource already
    /// said the WARN (one WARN for the API server, not one per resource).
    fn next(&mut self, now: Instant, source: usize, quiet: bool) -> Duration {
        let short = self.sent.is_some_and(|sent| now - sent < SHORT_WATCH);
        if short {
            self.short = self.short.saturating_add(1);
        } else {
            if self.said {
                info!(
                    resource = SOURCES[source],
                    "Kubernetes watches last again; re-opened without waiting"
                );
            }
            self.short = 0;
            self.said = false;
        }
        if self.short >= SAY_AFTER && !self.said {
            self.said = true;
        } else {
            return self.wait();
        }
        if !quiet {
            warn!(
                resource = SOURCES[source],
                short_watches = self.short,
                "the Kubernetes API ends watches at once; re-opening them with backoff (up to \
                 {PACE_MAX:?}): attribution may lag and clbprobe_kube_connected reads 0 until a \
                 watch lasts"
            );
        }
        self.wait()
    }

    fn wait(&mut self) -> Duration {
        let wait = match self.short {
            0 => Duration::ZERO,
            n => PACE_FIRST
                .saturating_mul(1 << (n - 1).min(16))
                .min(PACE_MAX),
        };
        self.waiting = !wait.is_zero();
        wait
    }

    /// Whether the watches of this resource are ending at once now.
    fn churning(&self, now: Instant) -> bool {
        self.short >= SAY_AFTER
            && (self.waiting || self.sent.is_some_and(|sent| now - sent < SHORT_WATCH))
    }
}

/// Watches accepted so far, by index into [`SOURCES`], and their pacing.
#[derive(Debug, Default)]
pub struct WatchesAccepted {
    counts: [AtomicU64; SOURCES.len()],
    pace: Mutex<[Pace; SOURCES.len()]>,
}

impl WatchesAccepted {
    pub fn count(&self, source: usize) -> u64 {
        self.counts[source].load(Ordering::Relaxed)
    }

    fn record(&self, source: usize) {
        self.counts[source].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether some resource's watches end at once (see the module docs).
    pub fn churning(&self) -> bool {
        let now = Instant::now();
        self.pace
            .lock()
            .map(|p| p.iter().any(|p| p.churning(now)))
            .unwrap_or(false)
    }

    fn wait_before(&self, source: usize) -> Duration {
        self.pace
            .lock()
            .map(|mut p| {
                let quiet = p.iter().enumerate().any(|(i, o)| i != source && o.said);
                p[source].next(Instant::now(), source, quiet)
            })
            .unwrap_or_default()
    }

    fn sent(&self, source: usize) {
        if let Ok(mut p) = self.pace.lock() {
            p[source].sent = Some(Instant::now());
            p[source].waiting = false;
        }
    }

    /// The watch was refused or not answered: kube-runtime backs off on errors itself, and its
    /// retry is no short watch (a 403 is not a server ending watches at once).
    fn failed(&self, source: usize) {
        if let Ok(mut p) = self.pace.lock() {
            p[source].sent = None;
            p[source].short = 0;
        }
    }
}

/// The watcher source a request watches: a `watch=true` (or `1`) query on a resource the
/// watcher lists cluster-wide (`/api/v1/pods`, `/apis/discovery.k8s.io/v1/endpointslices`).
pub fn watched_source(uri: &Uri) -> Option<usize> {
    let watch = uri
        .query()?
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1");
    let resource = uri.path().rsplit('/').next()?;
    watch
        .then(|| SOURCES.iter().position(|s| *s == resource))
        .flatten()
}

/// A [`Layer`] for `kube::client::ClientBuilder::with_layer` that records accepted watches.
#[derive(Clone)]
pub struct AcceptedLayer(pub std::sync::Arc<WatchesAccepted>);

impl<S> Layer<S> for AcceptedLayer {
    type Service = Accepted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Accepted {
            inner,
            watches: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Accepted<S> {
    inner: S,
    watches: std::sync::Arc<WatchesAccepted>,
}

impl<S, B, RB> Service<Request<B>> for Accepted<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let source = watched_source(request.uri());
        let wait = source.map_or(Duration::ZERO, |s| self.watches.wait_before(s));
        let response = self.inner.call(request);
        let watches = self.watches.clone();
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if let Some(source) = source {
                watches.sent(source);
            }
            let response = response.await;
            if let Some(source) = source {
                match &response {
                    Ok(r) if r.status().is_success() => watches.record(source),
                    _ => watches.failed(source),
                }
            }
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(uri: &str) -> Option<usize> {
        watched_source(&uri.parse().unwrap())
    }

    #[test]
    fn only_watches_of_the_watcher_sources_count() {
        let pods = SOURCES.iter().position(|s| *s == "pods");
        let slices = SOURCES.iter().position(|s| *s == "endpointslices");
        assert_eq!(
            source("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&resourceVersion=7&watch=true"),
            pods
        );
        assert_eq!(
            source("/apis/discovery.k8s.io/v1/endpointslices?watch=1&timeoutSeconds=290"),
            slices
        );
        // A list, another resource, a watch-like parameter name: not counted.
        assert_eq!(source("/api/v1/pods?limit=500"), None);
        assert_eq!(source("/api/v1/pods"), None);
        assert_eq!(source("/api/v1/nodes?watch=true"), None);
        assert_eq!(source("/api/v1/pods?watch=false"), None);
        assert_eq!(source("/api/v1/pods?allowWatchBookmarks=true"), None);
    }

    /// Answers 200 for services, 403 for everything else.
    struct Api;

    impl Service<Request<()>> for Api {
        type Response = Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<()>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<()>) -> Self::Future {
            let status = if request.uri().path().ends_with("/services") {
                200
            } else {
                403
            };
            std::future::ready(Ok(Response::builder().status(status).body(()).unwrap()))
        }
    }

    #[tokio::test]
    async fn a_2xx_watch_response_is_recorded() {
        let watches = std::sync::Arc::new(WatchesAccepted::default());
        let mut service = AcceptedLayer(watches.clone()).layer(Api);
        let get = |uri: &str| Request::get(uri).body(()).unwrap();
        service.call(get("/api/v1/pods?watch=true")).await.unwrap();
        // Refused watches, retried at once: errors are kube-runtime's to back off, no pacing.
        for _ in 0..SAY_AFTER + 2 {
            service.call(get("/api/v1/pods?watch=true")).await.unwrap();
        }
        assert_eq!(watches.pace.lock().unwrap()[0].short, 0);
        assert!(!watches.churning());
        assert_eq!((0..SOURCES.len()).map(|s| watches.count(s)).sum::<u64>(), 0);
        service
            .call(get("/api/v1/services?watch=true"))
            .await
            .unwrap();
        let services = SOURCES.iter().position(|s| *s == "services").unwrap();
        assert_eq!(watches.count(services), 1);
    }

    /// Watches that end at once wait 1, 2, 4, ... up to 30 s; the state says so from the third;
    /// a watch that lasted resets it.
    #[test]
    fn short_watches_back_off_and_a_lasting_one_resets() {
        let mut p = Pace::default();
        let t0 = Instant::now();
        let mut t = t0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let w = p.next(t, 0, false);
            waits.push(w.as_secs());
            t += w; // sent after its wait, ended at once
            p.sent = Some(t);
            p.waiting = false;
        }
        assert_eq!(waits, [0, 1, 2, 4, 8, 16, 30, 30]);
        assert!(p.churning(t));
        assert!(p.said);
        // A watch that lasts: no wait, no longer churning.
        t += SHORT_WATCH * 2;
        assert_eq!(p.next(t, 0, false), Duration::ZERO);
        assert!(!p.churning(t));
        assert!(!p.said);
    }
}
