//! The clients of the agent's live-view socket: `probe events` (JSON lines for scripts) and
//! `probe watch` (a live terminal view; a plain snapshot when stdout is not a terminal or with
//! `--once`). Both read the protocol of [`crate::sink::live`] and render from its JSON, so a
//! client of one version can read an agent of another.

pub mod tui;
pub mod view;

use std::{
    io::{IsTerminal as _, Write as _},
    path::Path,
};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::sink::live;

/// `probe events`: one JSON object per confirmed report, flushed per line. With `all`, the
/// aggregates confirmed before we connected come first.
pub async fn events(socket: &Path, all: bool) -> anyhow::Result<()> {
    let stream = live::connect(socket).await?;
    let mut lines = BufReader::new(stream).lines();
    let mut first = true;
    let mut out = std::io::stdout().lock();
    while let Some(line) = lines.next_line().await? {
        let msg: Value = serde_json::from_str(&line)?;
        match msg["type"].as_str() {
            Some("snapshot") if first && all => {
                for e in msg["snapshot"]["confirmed"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    writeln!(out, "{e}")?;
                }
            }
            Some("report") => writeln!(out, "{}", msg["event"])?,
            _ => {}
        }
        out.flush()?;
        first = false;
    }
    anyhow::bail!("the agent closed the connection")
}

/// `probe watch`.
pub async fn watch(socket: &Path, once: bool) -> anyhow::Result<()> {
    let stream = live::connect(socket).await?;
    let mut lines = BufReader::new(stream).lines();
    if once || !std::io::stdout().is_terminal() {
        while let Some(line) = lines.next_line().await? {
            let msg: Value = serde_json::from_str(&line)?;
            if msg["type"] == "snapshot" {
                let model = view::Model::from_snapshot(&msg["snapshot"]);
                print!("{}", view::plain(&model));
                return Ok(());
            }
        }
        anyhow::bail!("the agent closed the connection before its snapshot");
    }
    tui::run(lines).await
}
