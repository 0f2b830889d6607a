//! Reading the agent's evidence capture as an outsider would: `tcpdump -r` for the packets,
//! `pcap-parser` (not the agent's writer, `pcap-file`) for the per-packet comments.

use std::{path::Path, process::Command};

use pcap_parser::{Block, PcapBlockOwned, PcapNGSlice, pcapng::OptionCode};

/// `tcpdump -r FILE -nn`'s output (one line a packet); panics with tcpdump's error when it
/// cannot read the file.
pub fn tcpdump_read(file: &Path) -> String {
    let out = Command::new("tcpdump")
        .args(["-r"])
        .arg(file)
        .args(["-nn"])
        .output()
        .expect("run tcpdump");
    assert!(
        out.status.success(),
        "tcpdump -r {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The comment of each Enhanced Packet Block, in file order (empty string: none).
pub fn packet_comments(pcapng: &[u8]) -> Vec<String> {
    let mut comments = Vec::new();
    for block in PcapNGSlice::from_slice(pcapng).expect("a pcapng section header") {
        if let PcapBlockOwned::NG(Block::EnhancedPacket(epb)) = block.expect("a pcapng block") {
            comments.push(
                epb.options
                    .iter()
                    .find(|o| o.code == OptionCode::Comment)
                    .and_then(|o| o.as_bytes().ok())
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default(),
            );
        }
    }
    comments
}
