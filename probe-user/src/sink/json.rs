//! JSON lines for `--events` and `--record`, one line per write: `--events -` is read by
//! scripts and tests as it happens.
//!
//! Writers never sit on the correlation path. A line is serialised on the loop and handed to
//! a thread of its own through a bounded queue ([`EVENTS_QUEUE_LINES`],
//! [`RECORD_QUEUE_LINES`]); when the queue is full (the reader of `--events -` stopped
//! reading, the disk stalls) the line is dropped and counted
//! (`clbprobe_output_lines_lost_total{output}`), and `clbprobe_output_stalled{output}` says 1
//! while a write has been waiting for more than [`STALLED_AFTER`]. Detection, metrics and the
//! live view go on, and SIGTERM is not held: the process exits with the writer still blocked.
//! Before, a pipe nobody read froze confirmations at the 26th while suspects kept counting.
//!
//! Files. A path is opened only if it is a regular file or nothing at all: a symbolic link is
//! refused (`O_NOFOLLOW`: a link planted where the agent writes pointed it at a root-owned
//! file, which was emptied), and so is anything that is not a regular file (a FIFO with no
//! reader blocked start-up, and SIGTERM with it; a device would be written to). A new file is
//! created `O_EXCL` with mode 0600 whatever the umask (events name the node's addresses and
//! pods); an existing one keeps its mode. Lines are appended, never truncated: a restart (a
//! DaemonSet's agent restarts with the node) no longer empties the history, and a record file
//! stays replayable (the kernel's monotonic timestamps only grow within a boot).

use std::{
    fs::File,
    io::{self, Write},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::Path,
    sync::{
        Arc,
        atomic::Ordering,
        mpsc::{self, SyncSender, TrySendError},
    },
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tracing::{info, warn};

/// Lines waiting for `--events`' writer: confirmations are few and aggregated, so this is a
/// long burst (with the pipe's own 64 KiB behind it), about 0.5 MiB.
pub const EVENTS_QUEUE_LINES: usize = 256;
/// Lines waiting for `--record`'s writer: every kernel event, so bursts are thousands.
pub const RECORD_QUEUE_LINES: usize = 4096;
/// The outputs' counters live in the hub, which the metrics endpoint reads.
use crate::hub::outputs::OutputStats;

pub struct JsonLines {
    tx: SyncSender<Vec<u8>>,
    stats: Arc<OutputStats>,
}

impl JsonLines {
    /// `-` is stdout; anything else a regular file, appended to (see the module doc).
    /// `output` names it in metrics and logs (`events`, `record`); `queue` lines may wait.
    pub fn open(path: &Path, output: &'static str, queue: usize) -> anyhow::Result<Self> {
        let out = if path.as_os_str() == "-" {
            // A descriptor of our own: a blocked write must not hold the stdout lock.
            File::from(
                std::os::fd::AsFd::as_fd(&io::stdout())
                    .try_clone_to_owned()
                    .context("duplicating stdout")?,
            )
        } else {
            open_file(path)?
        };
        let stats = Arc::new(OutputStats::default());
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(queue);
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name(format!("out-{output}"))
            .spawn(move || write_lines(out, rx, &thread_stats, output))
            .with_context(|| format!("starting the {output} writer"))?;
        Ok(Self { tx, stats })
    }

    pub fn stats(&self) -> Arc<OutputStats> {
        self.stats.clone()
    }

    /// Queues one line; never blocks (a full queue loses the line, counted).
    pub fn write<T: Serialize>(&mut self, value: &T) {
        let mut line = match serde_json::to_vec(value) {
            Ok(line) => line,
            Err(e) => {
                warn!(error = %e, "serialising a JSON line");
                return;
            }
        };
        line.push(b'\n');
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// `--events`: the confirmed events the JSON stream shows (a new aggregate, then its periodic
/// repeats: `Confirmation::write_json`), one line each.
pub struct EventLines(pub JsonLines);

impl super::Writer for EventLines {
    async fn report(&mut self, report: &probe_contract::Confirmation) {
        if report.write_json {
            self.0.write(&report.event);
        }
    }

    /// A line missed is a line lost: counted (`clbprobe_output_lost_total`).
    fn lag_policy(&self) -> super::LagPolicy {
        super::LagPolicy::Tell
    }

    async fn lost(&mut self, n: u64) {
        self.0.stats.lost.fetch_add(n, Ordering::Relaxed);
    }
}

/// The writer thread: one line at a time; one WARN when writes start failing, one INFO when
/// they work again.
fn write_lines(
    mut out: File,
    rx: mpsc::Receiver<Vec<u8>>,
    stats: &OutputStats,
    output: &'static str,
) {
    let mut failing = false;
    for line in rx {
        stats.writing_since.store(
            probe_contract::clock::monotonic_ns().max(1),
            Ordering::Relaxed,
        );
        let res = out.write_all(&line);
        stats.writing_since.store(0, Ordering::Relaxed);
        match res {
            Ok(()) => {
                stats.written.fetch_add(1, Ordering::Relaxed);
                if failing {
                    info!(output, "writing JSON lines again");
                    failing = false;
                }
            }
            Err(e) => {
                stats.lost.fetch_add(1, Ordering::Relaxed);
                if !failing {
                    warn!(output, error = %e, "writing a JSON line (lost lines are counted in clbprobe_output_lines_lost_total)");
                    failing = true;
                }
            }
        }
    }
}

/// Opens `path` for appending if it is a regular file, or creates it 0600; refuses anything
/// else in one line, leaving it untouched.
fn open_file(path: &Path) -> anyhow::Result<File> {
    let shown = path.display();
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let existing = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => bail!(
            "{shown} is a symbolic link; refusing to follow it (it could point at any file): name the file itself"
        ),
        Ok(m) if !m.is_file() => bail!(
            "{shown} is not a regular file ({}); refusing to write to it: name a regular file, or `-` for stdout",
            kind(&m)
        ),
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => bail!("{shown}: {e}"),
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.append(true).custom_flags(flags);
    let file = match &existing {
        Some(_) => opts.open(path),
        None => opts.create_new(true).mode(0o600).open(path),
    }
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => anyhow::anyhow!(
            "{shown} became a symbolic link while being opened; refusing to follow it"
        ),
        _ => anyhow::anyhow!("opening {shown}: {e}"),
    })?;
    // Whatever is open now must be what was checked (or what was just created).
    let now = file.metadata().with_context(|| format!("{shown}: fstat"))?;
    if !now.is_file()
        || existing
            .as_ref()
            .is_some_and(|m| (m.dev(), m.ino()) != (now.dev(), now.ino()))
    {
        bail!("{shown} changed while being opened; refusing to write to it");
    }
    Ok(file)
}

fn kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Whether two output paths name the same file (`-` is stdout): the same path once made
/// absolute and normalised, or an existing file's same device and inode.
pub fn same_output(a: &Path, b: &Path) -> bool {
    if a.as_os_str() == "-" || b.as_os_str() == "-" {
        return a == b;
    }
    if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b))
        && (ma.dev(), ma.ino()) == (mb.dev(), mb.ino())
    {
        return true;
    }
    normalise(a) == normalise(b)
}

/// `path` made absolute, `.` and `..` resolved lexically (no file system access).
fn normalise(path: &Path) -> std::path::PathBuf {
    use std::path::Component;
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = std::path::PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// Polls `f` every 10 ms for up to 10 s.
    fn wait_until<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
        for _ in 0..1000 {
            if let Some(v) = f() {
                return Some(v);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }

    /// [`wait_until`] the file at `path` reads `want`.
    fn wait_for_text(path: &std::path::Path, want: &str) -> Option<String> {
        wait_until(|| {
            let t = std::fs::read_to_string(path).unwrap_or_default();
            (t == want).then_some(t)
        })
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("clb-json-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn links_and_non_regular_paths_are_refused_and_left_untouched() {
        let d = scratch("refuse");
        let target = d.join("precious");
        std::fs::write(&target, "keep me\n").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = JsonLines::open(&link, "events", 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me\n");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = JsonLines::open(&fifo, "events", 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("a FIFO"), "{err}");
        let err = JsonLines::open(&d, "events", 1).err().unwrap().to_string();
        assert!(err.contains("a directory"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn files_are_appended_to_and_created_0600() {
        let d = scratch("append");
        let p = d.join("events.jsonl");
        // SAFETY: umask has no preconditions (only this test's files are created meanwhile).
        let old = unsafe { libc::umask(0) };
        let opened = JsonLines::open(&p, "events", 1);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let mut out = opened.unwrap();
        out.write(&1);
        drop(out);
        // The writer thread outlives its handle (a stalled output must not hold up the
        // agent's exit): wait for its line, or the next run's line could land first.
        let first = wait_for_text(&p, "1\n");
        assert_eq!(first.as_deref(), Some("1\n"));
        let mut out = JsonLines::open(&p, "events", 1).unwrap();
        out.write(&2);
        drop(out);
        let text = wait_for_text(&p, "1\n2\n");
        assert_eq!(text.as_deref(), Some("1\n2\n"));
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_reader_that_never_reads_loses_lines_but_never_blocks_the_writer() {
        let mut fds = [0; 2];
        // SAFETY: a two-int buffer.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors we own.
        let (read_end, write_end) = unsafe {
            use std::os::fd::FromRawFd as _;
            (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
        };
        let stats = Arc::new(OutputStats::default());
        let (tx, rx) = mpsc::sync_channel(RECORD_QUEUE_LINES);
        let s = stats.clone();
        std::thread::spawn(move || write_lines(write_end, rx, &s, "events"));
        let mut out = JsonLines {
            tx,
            stats: stats.clone(),
        };
        let line = "x".repeat(1000);
        // Were a write to block, this loop would never end.
        for _ in 0..(RECORD_QUEUE_LINES + 2000) {
            out.write(&line);
        }
        assert!(stats.lost.load(Ordering::Relaxed) >= 1900, "{stats:?}");
        let stalled = wait_until(|| {
            stats
                .stalled(probe_contract::clock::monotonic_ns())
                .then_some(())
        });
        assert!(stalled.is_some(), "the blocked write shows as stalled");
        drop(read_end);
    }

    #[test]
    fn equal_outputs_are_told_apart_from_different_ones() {
        assert!(same_output(Path::new("-"), Path::new("-")));
        assert!(!same_output(Path::new("-"), Path::new("x")));
        assert!(same_output(Path::new("a/./b"), Path::new("a/c/../b")));
        assert!(!same_output(Path::new("/tmp/a"), Path::new("/tmp/b")));
    }
}
