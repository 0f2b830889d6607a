//! `/metrics`, `/healthz`, `/readyz` (and `/evidence`, [`crate::sink::evidence_http`]) on the
//! bounded HTTP server ([`crate::sink::http`]).

use std::sync::Mutex;

use hyper::StatusCode;
use probe_contract::NodeStatus;

use super::{feed_totals, gather, render, to_prometheus_text};
use crate::{hub::View, sink::http};

/// Serves `/metrics`, `/healthz` and `/readyz` on an already bound listener until `stop`
/// resolves (see [`http`] for the connection bounds).
pub async fn serve(
    listener: std::net::TcpListener,
    hub: View,
    evidence: crate::sink::evidence_http::EvidenceAccess,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (totals, feed) = feed_totals(&hub);
    // The last rendering and when: a flood of scrapes costs at most one rendering (kernel
    // counters read, registry encoded) per RENDER_REUSE, so `/healthz` keeps its share.
    let cache: Mutex<Option<(std::time::Instant, String)>> = Mutex::new(None);
    let route = move |path: &str, headers: &hyper::HeaderMap| -> http::Reply {
        if path == "/evidence" || path.starts_with("/evidence/") {
            return crate::sink::evidence_http::route(path, headers, &evidence, &hub);
        }
        let (status, content_type, body): (StatusCode, &'static str, String) = match path {
            "/metrics" => {
                let wants_openmetrics = headers
                    .get_all(hyper::header::ACCEPT)
                    .iter()
                    .any(|v| v.to_str().is_ok_and(|v| v.contains("openmetrics")));
                let mut cached = cache.lock().unwrap_or_else(|e| e.into_inner());
                let text = match &*cached {
                    Some((at, text)) if at.elapsed() < RENDER_REUSE => text.clone(),
                    _ => {
                        let text = render(&gather(&hub, &totals));
                        *cached = Some((std::time::Instant::now(), text.clone()));
                        text
                    }
                };
                drop(cached);
                if wants_openmetrics {
                    (
                        StatusCode::OK,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        text,
                    )
                } else {
                    (
                        StatusCode::OK,
                        "text/plain; version=0.0.4; charset=utf-8",
                        to_prometheus_text(&text),
                    )
                }
            }
            "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
            "/readyz" => {
                let (ready, body) = readiness(&hub.status());
                let status = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (status, "text/plain", body)
            }
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found\n".to_string(),
            ),
        };
        (status, content_type, body.into())
    };
    let result = http::serve(listener, route, stop).await;
    feed.abort();
    result
}

/// How long one `/metrics` rendering is served again (scrapers come every 10 s or more).
pub const RENDER_REUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// `/readyz`: ready once programs are attached and the address sets loaded; the body names
/// what health-check detection still waits for (an absent VIP interface does not make the
/// agent unready: the other detections work, and the interface may appear later).
pub fn readiness(status: &NodeStatus) -> (bool, String) {
    if !status.ready {
        return (false, "not ready: attaching\n".to_string());
    }
    let mut body = "ready".to_string();
    if !status.vip_iface_present {
        body.push_str(&format!(
            "; VIP interface {:?} absent: health-check blackholes are not detected until it appears",
            status.vip_iface
        ));
    }
    // Still ready: the addresses that fit are watched, and a node's address count must not be
    // able to take every agent out of its DaemonSet's rollout.
    let left_out: usize = status.left_out.values().sum();
    if left_out > 0 {
        body.push_str(&format!(
            "; {left_out} addresses over --address-entries ({}) are not watched",
            status.address_capacity
        ));
    }
    if status.drop_destinations_left_out > 0 {
        body.push_str(&format!(
            "; {} of kube-proxy's drop destinations (no-endpoint drops and loadBalancerSourceRanges firewall entries) over --address-entries ({}) are not watched: a pod's call dropped at them is not confirmed",
            status.drop_destinations_left_out, status.address_capacity
        ));
    }
    body.push('\n');
    (true, body)
}
