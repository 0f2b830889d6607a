//! Recorded-stream tests: every directory under `probe-core/tests/data/streams/` is replayed
//! through the correlator (see [`super::replay`]) and checked against its `expect.json`.
//! A real recording dropped in there (with an `expect.json`) is picked up automatically.

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use super::replay::{self, ScriptedAnswers, Stream};
use crate::state::ServiceTable;

fn streams_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/streams")
}

fn read_json<T: serde::de::DeserializeOwned + Default>(path: &Path) -> T {
    match fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        Err(_) => T::default(),
    }
}

fn load(dir: &Path) -> (Stream, serde_json::Value) {
    let events_path = dir.join("events.jsonl");
    let events = fs::read_to_string(&events_path)
        .unwrap_or_else(|e| panic!("{}: {e}", events_path.display()));
    let events =
        replay::parse_events(&events).unwrap_or_else(|e| panic!("{}: {e}", events_path.display()));
    let services: ServiceTable = read_json(&dir.join("services.json"));
    let answers: ScriptedAnswers = read_json(&dir.join("answers.json"));
    let expect_path = dir.join("expect.json");
    let expect = fs::read_to_string(&expect_path)
        .unwrap_or_else(|e| panic!("{}: {e}", expect_path.display()));
    let expect =
        serde_json::from_str(&expect).unwrap_or_else(|e| panic!("{}: {e}", expect_path.display()));
    let stream = Stream {
        events,
        services,
        answers,
        config: Default::default(),
    };
    (stream, expect)
}

/// 192.0.2.0/24, 198.18.0.0/15, 198.51.100.0/24, 203.0.113.0/24.
fn is_lab_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            matches!(
                (o[0], o[1], o[2]),
                (192, 0, 2) | (198, 18 | 19, _) | (198, 51, 100) | (203, 0, 113)
            )
        }
        IpAddr::V6(v6) => v6.segments()[0] == 0x2001 && v6.segments()[1] == 0x0db8,
    }
}

#[test]
fn recorded_streams() {
    let mut dirs: Vec<PathBuf> = fs::read_dir(streams_dir())
        .expect("streams directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let names: Vec<String> = dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for must in [
        "k6.18-healthcheck-blackhole",
        "k6.18-hairpin-l4-rpfilter",
        "k6.18-hairpin-l7-reset",
        "k6.18-vip-port-unserved",
        "k6.18-healthy",
        "debian6.1-healthcheck-blackhole",
        "debian6.1-hairpin-l4-rpfilter",
        "debian6.1-vip-port-unserved",
        "debian5.10-ipvs-recorded-healthcheck-blackhole",
        "debian5.10-ipvs-recorded-hairpin-rpfilter",
        "debian5.10-ipvs-recorded-vip-port-unserved",
    ] {
        assert!(names.iter().any(|n| n == must), "stream {must} is missing");
    }
    let mut failures = Vec::new();
    for (dir, name) in dirs.iter().zip(&names) {
        let (stream, expect) = load(dir);
        assert!(!stream.events.is_empty(), "{name}: no events");
        for ip in replay::addresses(&stream) {
            assert!(is_lab_address(ip), "{name}: {ip} is not a test address");
        }
        let res = replay::replay(&stream);
        let s = &res.stats;
        assert_eq!(
            s.suspects_seen.total(),
            s.suspects_confirmed + s.suspects_unconfirmed,
            "{name}: every suspect resolved: {s:#?}"
        );
        assert_eq!(
            s.drops_seen,
            s.drops_confirming + s.drops_unmatched,
            "{name}: every drop resolved: {s:#?}"
        );
        assert_eq!(s.pending, 0, "{name}: nothing left pending");
        if let Err(e) = replay::check(&res, &expect) {
            failures.push(format!("--- {name}:\n{e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn check_reports_mismatches() {
    // The checker itself must be able to fail.
    let (stream, mut expect) = load(&streams_dir().join("k6.18-vip-port-unserved"));
    let res = replay::replay(&stream);
    assert!(replay::check(&res, &expect).is_ok());
    expect["reports"][0]["outcome"] = "reset".into();
    expect["reports"][0]["evidence_contains"] = serde_json::json!(["no such line"]);
    expect["stats"]["drops_seen"] = 99.into();
    let err = replay::check(&res, &expect).unwrap_err().to_string();
    assert!(err.contains("reports[0].outcome"), "{err}");
    assert!(err.contains("no such line"), "{err}");
    assert!(err.contains("stats.drops_seen"), "{err}");
    expect["reports"].as_array_mut().unwrap().pop();
    assert!(
        replay::check(&res, &expect)
            .unwrap_err()
            .to_string()
            .contains("expected 1 reports, got 2")
    );
}
