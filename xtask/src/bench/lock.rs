//! One bench per machine: every run uses the same `clb-bench-*` namespaces, so a second one
//! would tear down the first one's (and measure its traffic).

use std::{
    fs::File,
    os::fd::{AsRawFd as _, FromRawFd as _},
    path::Path,
};

use anyhow::{Context as _, Result, bail};

pub const LOCK_PATH: &str = "/run/clb-bench.lock";

/// The machine's bench lock, held until dropped (or the process ends).
pub struct BenchLock {
    _file: File,
}

/// Takes the exclusive, non-blocking flock on [`LOCK_PATH`]. A descriptor of the lock file
/// inherited from `flock /run/clb-bench.lock cargo xtask bench` (the old way to serialise
/// benches) already holds it and is used as is.
pub fn take() -> Result<BenchLock> {
    let file = match inherited(Path::new(LOCK_PATH)) {
        Some(f) => f,
        None => File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_PATH)
            .with_context(|| format!("opening {LOCK_PATH}"))?,
    };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            bail!(
                "another bench or chaos run is using this machine's clb-bench namespaces (it holds {LOCK_PATH}); wait for it"
            );
        }
        bail!("flock {LOCK_PATH}: {err}");
    }
    Ok(BenchLock { _file: file })
}

/// A descriptor of `path` this process inherited, duplicated (so ours to close).
fn inherited(path: &Path) -> Option<File> {
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if std::fs::read_link(entry.path()).is_ok_and(|p| p == path) {
            let fd: i32 = entry.file_name().to_str()?.parse().ok()?;
            // SAFETY: dup of a descriptor open in this process; the copy shares its open file
            // description (and so the lock an outer flock(1) took on it).
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
            if dup >= 0 {
                // SAFETY: a new descriptor we own.
                return Some(unsafe { File::from_raw_fd(dup) });
            }
        }
    }
    None
}
