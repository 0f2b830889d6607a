//! The IPVS reader on a node with `--services N` virtual services (`cargo xtask chaos`, scale
//! row). This host has no IPVS, so the dump is synthesized from the replies captured in the VM
//! (`probe-user/tests/data/ipvs/`): the first captured service message (an IPv4 TCP service)
//! repeated with a distinct address and port each time, each with the captured destination
//! dump of that service; then decoded by the reader's own decoder ([`decode_capture`]) and
//! turned into the service table ([`table_from`]). Prints one JSON object with the times.
#![allow(
    clippy::print_stdout,
    reason = "a benchmark's measurement goes to stdout, where the bench reads it"
)]

use std::{path::Path, time::Instant};

use clb_probe::state::ipvs::{Capture, decode_capture, table_from};

const NLMSG_DONE: u16 = 3;

fn messages(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if len < 16 || len > rest.len() {
            break;
        }
        out.push(&rest[..len]);
        rest = &rest[(len + 3) & !3..];
    }
    out
}

/// Overwrites the payload of the first attribute whose header (length, type) is `header`.
fn patch(msg: &mut [u8], header: [u8; 4], payload: &[u8]) {
    let at = msg
        .windows(4)
        .position(|w| w == header)
        .expect("the captured service's attribute")
        + 4;
    msg[at..at + payload.len()].copy_from_slice(payload);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args
        .iter()
        .position(|a| a == "--services")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(10_000);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ipvs");
    let read = |name: &str| std::fs::read(dir.join(name)).expect("a captured reply");
    let services = read("services.bin");
    let msgs = messages(&services);
    let first = msgs[0].to_vec();
    let done = msgs
        .iter()
        .find(|m| u16::from_ne_bytes([m[4], m[5]]) == NLMSG_DONE)
        .expect("NLMSG_DONE");
    // The first captured service is an IPv4 TCP service (dests-0.bin holds its real servers);
    // its address (IPVS_SVC_ATTR_ADDR, 16 bytes) and port (IPVS_SVC_ATTR_PORT, network byte
    // order) are rewritten per copy.
    let mut dump = Vec::with_capacity(first.len() * n + done.len());
    for i in 0..n {
        let mut msg = first.clone();
        patch(
            &mut msg,
            [20, 0, 3, 0],
            &[10, 96, (i / 250) as u8, (i % 250 + 1) as u8],
        );
        patch(&mut msg, [6, 0, 4, 0], &(1_000 + i as u16).to_be_bytes());
        dump.extend_from_slice(&msg);
    }
    dump.extend_from_slice(done);
    let cap = Capture {
        family: read("family.bin"),
        services: dump,
        dests: vec![read("dests-0.bin"); n],
    };
    let t = Instant::now();
    let decoded = decode_capture(&cap).expect("decoding the synthesized dump");
    let decode_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let table = table_from(&decoded);
    let table_ms = t.elapsed().as_secs_f64() * 1e3;
    let distinct: std::collections::BTreeSet<_> =
        table.services.iter().map(|s| (s.vip, s.port)).collect();
    assert_eq!(distinct.len(), n, "every synthesized service decoded once");
    println!(
        "{}",
        serde_json::json!({
            "services": n,
            "dump_bytes": cap.services.len(),
            "decode_ms": decode_ms,
            "table_ms": table_ms,
        })
    );
}
