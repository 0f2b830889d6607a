//! `GET /evidence`, `GET /evidence/{id}` and `GET /evidence/{id}/capture.pcapng` on the
//! metrics port: the confirmed loops' evidence the hub keeps (`crate::hub::evidence`).
//! Every answer is bounded by the store's bounds (256 loops, 16 packets of at most 128 bytes
//! each per loop); an unknown loop or a store that is off is a 404 that says why.

use hyper::{StatusCode, body::Bytes};
use probe_contract::evidence::{TOKEN_HEADER, TOKEN_KEY, TOKEN_MAX_BYTES, TOKEN_SECRET};

use crate::{
    hub::{View, evidence::EvidenceMode},
    sink::http::Reply,
};

/// The pcapng media type (IANA registration draft, as Wireshark serves it).
pub const PCAPNG: &str = "application/x-pcapng";

/// Who may read `/evidence` (issue #49, H9: it was open to any pod that reaches the metrics
/// port, and hands out more than `/metrics` does): a request carrying the token read from
/// `--evidence-token-file` in [`TOKEN_HEADER`]. No file (or an empty one): `/evidence` is off,
/// 403, saying how to turn it on. The file is read on each request (a few bytes), so a Secret
/// created or rotated after the start takes effect once the kubelet has synced its volume.
#[derive(Clone, Debug, Default)]
pub struct EvidenceAccess {
    pub token_file: Option<std::path::PathBuf>,
}

impl EvidenceAccess {
    /// The token, when one is configured and readable.
    fn token(&self) -> Result<Vec<u8>, EvidenceOff> {
        let Some(path) = &self.token_file else {
            return Err(EvidenceOff::NoFlag);
        };
        let off = |why: &'static str| EvidenceOff::NoToken {
            why,
            path: path.clone(),
        };
        let mut buf = Vec::new();
        let file = std::fs::File::open(path).map_err(|_| off("no token at"))?;
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, TOKEN_MAX_BYTES as u64 + 1),
            &mut buf,
        )
        .map_err(|_| off("cannot read"))?;
        let token = buf.trim_ascii().to_vec();
        if token.is_empty() || buf.len() > TOKEN_MAX_BYTES {
            return Err(off("no usable token (empty or over 4 KiB) in"));
        }
        Ok(token)
    }

    /// None: the request may read; Some: the refusal.
    fn refuse(&self, headers: &hyper::HeaderMap) -> Option<Reply> {
        let token = match self.token() {
            Ok(t) => t,
            Err(why) => {
                return Some((
                    StatusCode::FORBIDDEN,
                    "text/plain",
                    Bytes::from(format!("{why}\n")),
                ));
            }
        };
        let given = headers
            .get(TOKEN_HEADER)
            .map(|v| v.as_bytes().trim_ascii())
            .unwrap_or_default();
        if constant_time_eq(given, &token) {
            return None;
        }
        Some((
            StatusCode::UNAUTHORIZED,
            "text/plain",
            Bytes::from(format!(
                "GET /evidence needs the {TOKEN_HEADER} header with the token of Secret {TOKEN_SECRET} (kubectl clb-probe evidence sends it)\n"
            )),
        ))
    }
}

/// Why `/evidence` is off: the 403's text.
#[derive(Debug, thiserror::Error)]
enum EvidenceOff {
    #[error(
        "GET /evidence is off on this agent: it runs without --evidence-token-file (SECURITY.md, \"Evidence\")"
    )]
    NoFlag,
    #[error(
        "GET /evidence is off on this agent: {why} {} (create Secret {TOKEN_SECRET} with key {TOKEN_KEY} in the agent's namespace; SECURITY.md, \"Evidence\")",
        .path.display()
    )]
    NoToken {
        why: &'static str,
        path: std::path::PathBuf,
    },
}

/// Equal bytes, in a time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

pub fn route(path: &str, headers: &hyper::HeaderMap, access: &EvidenceAccess, hub: &View) -> Reply {
    if let Some(refusal) = access.refuse(headers) {
        return refusal;
    }
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

#[cfg(test)]
mod access_tests {
    use super::*;

    fn with_token(value: Option<&str>) -> Result<Vec<u8>, EvidenceOff> {
        let dir = std::env::temp_dir().join(format!("clb-evidence-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("t{}", value.map_or(0, str::len)));
        let _ = std::fs::remove_file(&path);
        if let Some(v) = value {
            std::fs::write(&path, v).unwrap();
        }
        let access = EvidenceAccess {
            token_file: Some(path),
        };
        access.token()
    }

    #[test]
    fn no_flag_no_file_or_an_empty_or_huge_file_is_off_and_a_token_is_trimmed() {
        let off = EvidenceAccess::default().token().unwrap_err().to_string();
        assert!(off.contains("--evidence-token-file"), "{off}");
        assert!(
            with_token(None)
                .unwrap_err()
                .to_string()
                .contains("no token at")
        );
        assert!(
            with_token(Some(" \n"))
                .unwrap_err()
                .to_string()
                .contains("no usable token")
        );
        let huge = "x".repeat(TOKEN_MAX_BYTES + 1);
        assert!(with_token(Some(&huge)).is_err());
        assert_eq!(with_token(Some("abc\n")).unwrap(), b"abc");
    }

    #[test]
    fn only_the_exact_token_is_equal() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
    }
}
