//! Which watches the API server accepted, seen on the kube client's HTTP stack.
//!
//! kube-runtime's watcher restarts a watch after a non-410 error (a cut connection, a 403 or
//! 500 on the restart) without telling its consumer: the restarted watch yields nothing until
//! an object changes (it consumes bookmarks itself). `clbprobe_kube_connected`, cleared by the
//! error, would stay 0 until the next change. So the watcher's client carries this layer,
//! which counts, per watcher source, watch requests the API server answered with a 2xx
//! status: a count that grew after a source's error means its watch is live again. (A 410 is
//! no such case: the watcher relists, and the relist's end says so.)

use std::{
    sync::atomic::{AtomicU64, Ordering},
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use hyper::{Request, Response, Uri};
use tower::{Layer, Service};

use super::watcher::SOURCES;

/// Watches accepted so far, by index into [`SOURCES`].
#[derive(Debug, Default)]
pub struct WatchesAccepted {
    counts: [AtomicU64; SOURCES.len()],
}

impl WatchesAccepted {
    pub fn count(&self, source: usize) -> u64 {
        self.counts[source].load(Ordering::Relaxed)
    }

    fn record(&self, source: usize) {
        self.counts[source].fetch_add(1, Ordering::Relaxed);
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
        let response = self.inner.call(request);
        let watches = self.watches.clone();
        Box::pin(async move {
            let response = response.await?;
            if let Some(source) = source
                && response.status().is_success()
            {
                watches.record(source);
            }
            Ok(response)
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
        assert_eq!((0..SOURCES.len()).map(|s| watches.count(s)).sum::<u64>(), 0);
        service
            .call(get("/api/v1/services?watch=true"))
            .await
            .unwrap();
        let services = SOURCES.iter().position(|s| *s == "services").unwrap();
        assert_eq!(watches.count(services), 1);
    }
}
