//! JSON lines, flushed per line: `--events -` is read by scripts and tests as it happens.

use std::{
    fs::File,
    io::{self, LineWriter, Write},
    path::Path,
};

use anyhow::Context as _;
use serde::Serialize;
use tracing::warn;

pub struct JsonLines {
    out: Box<dyn Write + Send>,
}

impl JsonLines {
    /// `-` is stdout; anything else a file, created or truncated.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let out: Box<dyn Write + Send> = if path.as_os_str() == "-" {
            Box::new(LineWriter::new(io::stdout()))
        } else {
            let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
            Box::new(LineWriter::new(f))
        };
        Ok(Self { out })
    }

    pub fn write<T: Serialize>(&mut self, value: &T) {
        let res = serde_json::to_writer(&mut self.out, value)
            .map_err(io::Error::other)
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush());
        if let Err(e) = res {
            warn!(error = %e, "writing a JSON line");
        }
    }
}
