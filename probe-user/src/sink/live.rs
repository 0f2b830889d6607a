//! The live-view socket: `probe watch` and `probe events` connect here.
//!
//! Protocol: JSON lines from the agent to the client, nothing the other way, each one
//! [`Message`] (the output contract's; the clients are `clb_probe_client::watch`).
//! - on connect: `{"type":"snapshot","snapshot":{...}}` (node, status, counters, drops by
//!   reason, correlator stats, the latest confirmed aggregates);
//! - then `{"type":"report","event":{...},"is_new":bool}` for every report (a new confirmation
//!   or a repeat; `event` is the same object `probe agent --events` writes);
//! - and a fresh snapshot every second.
//!
//! A client that falls behind gets a snapshot instead of the reports it missed; a client that
//! goes away never affects the agent. The socket is root-only (mode 0600), and never
//! reachable by anyone else, not even for an instant: it is bound inside a fresh 0700
//! directory next to its path, made 0600 there, then renamed into place (`RENAME_NOREPLACE`).
//! Binding at the path and then chmod-ing left a window in which, under umask 000, an
//! unprivileged client connected and read the snapshot. Changing the umask around bind(2)
//! would close it too, but the umask is the whole process's and the runtime's threads create
//! files meanwhile; a check of the peer's credentials on accept would still let the
//! connection exist. A failed accept (EMFILE when the agent is out of descriptors, something
//! any remote client of the metrics port can cause under a low limit) is logged (at most one
//! WARN a minute, one INFO when accepting works again) and retried with a backoff up to
//! [`ACCEPT_BACKOFF_MAX`]: the listener never ends while the agent runs.

use std::{os::unix::fs::PermissionsExt as _, path::Path, time::Duration};

use probe_contract::{Confirmation, Message, Snapshot};
use tokio::{
    io::AsyncWriteExt as _,
    net::{UnixListener, UnixStream},
};
use tracing::{debug, info, warn};

use crate::{
    hub::View,
    sink::{LagPolicy, Subscription, Writer},
};

fn snapshot(s: Snapshot) -> Message {
    Message::Snapshot {
        snapshot: Box::new(s),
    }
}

fn report(r: &Confirmation) -> Message {
    Message::Report {
        event: Box::new(r.event.clone()),
        is_new: r.is_new,
    }
}

/// Where the agent listens by default; its directory is the only one the agent creates.
pub const DEFAULT_SOCKET: &str = "/run/clb-probe/probe.sock";

/// The socket file this agent created: removed at exit only if it is still that file.
pub struct SocketFile {
    path: std::path::PathBuf,
    dev_ino: (u64, u64),
}

impl SocketFile {
    pub fn remove(self) {
        use std::os::unix::fs::MetadataExt as _;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.dev_ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds the unix socket, root-only. An existing file at `path` is replaced only when it is a
/// stale socket (one that refuses connections: left by a killed agent); a live socket (another
/// agent serving) or anything that is not a socket is refused. Only the default directory is
/// created; any other `--socket` directory must exist.
pub fn bind(path: &Path) -> anyhow::Result<(UnixListener, SocketFile)> {
    use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _};

    use anyhow::{Context as _, bail};
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("--socket {shown}: {e}"),
        Ok(m) if m.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => bail!(
                "--socket {shown}: another agent is serving on it; refusing to take it over (stop that agent, or choose another --socket)"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)
                    .with_context(|| format!("--socket {shown}: removing the stale socket"))?;
            }
            Err(e) => bail!("--socket {shown}: an existing socket that cannot be checked ({e})"),
        },
        Ok(m) => bail!(
            "--socket {shown}: exists and is not a socket ({}); refusing to replace it: remove it or choose another --socket",
            if m.is_dir() { "a directory" } else { "a file" }
        ),
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        if Some(dir) != Path::new(DEFAULT_SOCKET).parent() {
            bail!(
                "--socket {shown}: directory {} does not exist (only {} is created)",
                dir.display(),
                Path::new(DEFAULT_SOCKET).parent().unwrap_or(dir).display()
            );
        }
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let listener = bind_private(path)?;
    let m = std::fs::symlink_metadata(path)?;
    let file = SocketFile {
        path: path.to_path_buf(),
        dev_ino: (m.dev(), m.ino()),
    };
    Ok((listener, file))
}

/// Binds the socket in a private 0700 directory beside `path`, makes it 0600, and renames it
/// to `path` (never replacing what may have appeared there meanwhile): no other user can
/// connect to it at any moment.
fn bind_private(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt as _;

    use anyhow::Context as _;
    let shown = path.display();
    let parent = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let private = parent.join(format!(
        ".clb-probe-bind.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    // 0700 whatever the umask (a umask only removes bits).
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("--socket {shown}: creating {}", private.display()))?;
    let staged = private.join("probe.sock");
    let result = (|| {
        let listener = UnixListener::bind(&staged)
            .with_context(|| format!("--socket {shown}: cannot listen"))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        rename_noreplace(&staged, path)
            .with_context(|| format!("--socket {shown}: moving the socket into place"))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    result
}

fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two valid C strings; AT_FDCWD resolves relative paths as open(2) would.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The longest pause between accept attempts while accept fails.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// At most one accept-failure WARN in this long.
pub const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(60);

/// Serves connected clients until the task is aborted.
pub async fn serve(listener: UnixListener, hub: View) -> anyhow::Result<()> {
    let mut failures = 0u64;
    let mut backoff = Duration::from_millis(10);
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Descriptors come and go while the agent is short of them (accept may work
                // once in between): one WARN a minute, not one per flap.
                if warned.is_none_or(|at| at.elapsed() >= ACCEPT_WARN_EVERY) {
                    warn!(error = %e, "live view: accepting a connection failed; retrying with a backoff (up to {ACCEPT_BACKOFF_MAX:?})");
                    warned = Some(std::time::Instant::now());
                }
                failures += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        if failures > 0 {
            info!(failures, "live view: accepting connections again");
            failures = 0;
            backoff = Duration::from_millis(10);
        }
        // Subscribed before the snapshot: nothing published in between is missed.
        let subscription = Subscription::to_view(&hub);
        let hub = hub.clone();
        tokio::spawn(async move {
            if let Err(e) = client(stream, hub, subscription).await {
                debug!(error = %e, "live-view client went away");
            }
        });
    }
}

async fn send(stream: &mut UnixStream, msg: &Message) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line).await
}

/// One client: the snapshot, then its [`LiveClient`] until the client goes away or the agent
/// stops.
async fn client(
    mut stream: UnixStream,
    hub: View,
    subscription: Subscription,
) -> std::io::Result<()> {
    send(&mut stream, &snapshot(hub.snapshot())).await?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut client = LiveClient {
        stream,
        hub,
        tick,
        gone: None,
    };
    subscription.feed(&mut client).await;
    client.gone.map_or(Ok(()), Err)
}

/// The writer of one connected client: every report, and a snapshot every second.
struct LiveClient {
    stream: UnixStream,
    hub: View,
    tick: tokio::time::Interval,
    /// Why the client is gone (a write failed): nothing more is written.
    gone: Option<std::io::Error>,
}

impl LiveClient {
    async fn send(&mut self, msg: &Message) {
        if let Err(e) = send(&mut self.stream, msg).await {
            self.gone = Some(e);
        }
    }
}

impl Writer for LiveClient {
    async fn report(&mut self, r: &Confirmation) {
        self.send(&report(r)).await;
    }

    /// A client that fell behind gets a snapshot instead of the reports it missed.
    fn lag_policy(&self) -> LagPolicy {
        LagPolicy::Tell
    }

    async fn lost(&mut self, _n: u64) {
        self.send(&snapshot(self.hub.snapshot())).await;
    }

    async fn tick_due(&mut self) {
        self.tick.tick().await;
    }

    async fn tick(&mut self) {
        self.send(&snapshot(self.hub.snapshot())).await;
    }

    fn finished(&self) -> bool {
        self.gone.is_some()
    }
}
