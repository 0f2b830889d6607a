//! Watch streams: history replay, BOOKMARKs, timeouts, 410 Gone as an ERROR event.

use std::{collections::HashMap, sync::Arc, time::Duration};

use hyper::{StatusCode, body::Bytes};
use serde_json::{Value, json};

use super::{
    reads::{Filters, requested_version},
    response::{Body, Response, expired},
    route::Target,
};
use crate::kubeapi::{BOOKMARK_INTERVAL, Shared};

pub(super) fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

pub(super) fn watch_stream(
    shared: Arc<Shared>,
    target: Target,
    params: HashMap<String, String>,
) -> Response {
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
        // Counted as queued for the client: what this watcher receives.
        let tally = |line: &Bytes| {
            let mut sent = shared.watch_sent.lock().unwrap();
            let entry = sent.entry(info.resource.to_string()).or_default();
            entry.events += 1;
            entry.bytes += line.len() as u64;
        };
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
                    let line = watch_line("ADDED", object);
                    tally(&line);
                    if tx.send(line).await.is_err() {
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
                        if !in_scope(&change.object) {
                            continue;
                        }
                        let line = watch_line(change.kind, &change.object);
                        tally(&line);
                        if tx.send(line).await.is_err() {
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
        .body(Body::Stream(rx, None))
        .expect("a valid response")
}
