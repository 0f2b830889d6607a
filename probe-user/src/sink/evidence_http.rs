//! `GET /evidence`, `GET /evidence/{id}` and `GET /evidence/{id}/capture.pcapng` on the
//! metrics port: the confirmed loops' evidence the hub keeps (`crate::hub::evidence`).
//! Every answer is bounded by the store's bounds (256 loops, 16 packets of at most 128 bytes
//! each per loop); an unknown loop or a store that is off is a 404 that says why.

use hyper::{StatusCode, body::Bytes};

use crate::{
    hub::{View, evidence::EvidenceMode},
    sink::http::Reply,
};

/// The pcapng media type (IANA registration draft, as Wireshark serves it).
pub const PCAPNG: &str = "application/x-pcapng";

pub fn route(path: &str, hub: &View) -> Reply {
    let store = hub.evidence();
    if store.mode() == EvidenceMode::Off {
        return not_found("evidence is off on this agent (--evidence off)\n".into());
    }
    let rest = path.trim_start_matches("/evidence").trim_start_matches('/');
    if rest.is_empty() {
        return json(&store.index(hub.node_name()));
    }
    let (id, capture) = match rest.split_once('/') {
        Some((id, "capture.pcapng")) => (id, true),
        Some(_) => {
            return not_found(format!(
                "no such path {path}: /evidence/ID or /evidence/ID/capture.pcapng\n"
            ));
        }
        None => (rest, false),
    };
    if capture {
        let Some(l) = store.get(id) else {
            return unknown(id);
        };
        let offset = unix_offset_ns();
        return match crate::hub::evidence::pcapng::write(l, offset) {
            Ok(file) => (StatusCode::OK, PCAPNG, Bytes::from(file)),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                Bytes::from(format!("writing the capture failed: {e}\n")),
            ),
        };
    }
    let risks = hub.check_risks();
    match store.bundle(id, hub.node_name(), &risks) {
        Some(b) => json(&b),
        None => unknown(id),
    }
}

fn unknown(id: &str) -> Reply {
    // The id is echoed only when it is one (16 hex digits): never arbitrary request text.
    let shown = if id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()) {
        id
    } else {
        "(not a loop id: 16 hex digits)"
    };
    not_found(format!(
        "no evidence for loop {shown} on this node: GET /evidence lists the loops kept\n"
    ))
}

fn not_found(body: String) -> Reply {
    (StatusCode::NOT_FOUND, "text/plain", Bytes::from(body))
}

fn json<T: serde::Serialize>(value: &T) -> Reply {
    match serde_json::to_vec_pretty(value) {
        Ok(body) => (StatusCode::OK, "application/json", Bytes::from(body)),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            Bytes::from(format!("encoding failed: {e}\n")),
        ),
    }
}

/// The wall clock minus the monotonic clock (ns): kernel times to wall-clock times.
fn unix_offset_ns() -> i128 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    wall - i128::from(probe_contract::clock::monotonic_ns())
}
