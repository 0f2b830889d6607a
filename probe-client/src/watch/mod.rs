//! The clients of the agent's live-view socket: `probe events` (JSON lines for scripts) and
//! `probe watch` (a live terminal view; a plain snapshot when stdout is not a terminal or with
//! `--once`). Both read the agent's live-view protocol (`probe-user`'s `sink::live`) as the
//! output contract's [`Message`]s (`probe-contract`, whose snapshot tolerates fields added or
//! missing, so a client of one version can read an agent of another).

pub mod tui;
pub mod view;

use std::{
    io::{IsTerminal as _, Write as _},
    path::Path,
};

use probe_contract::Message;
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    net::UnixStream,
};

/// `probe events`: one JSON object per confirmed report, flushed per line. With `all`, the
/// aggregates confirmed before we connected come first. When whoever reads our stdout goes
/// away (`probe events | head -1`), it ends at once, quietly, with success.
pub async fn events(socket: &Path, all: bool) -> anyhow::Result<()> {
    let stream = connect(socket).await?;
    let mut lines = BufReader::new(stream).lines();
    let reader_gone = stdout_reader_gone();
    tokio::pin!(reader_gone);
    let mut first = true;
    let mut out = std::io::stdout().lock();
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            () = &mut reader_gone => return Ok(()),
        };
        let Some(line) = line else { break };
        let mut text = String::new();
        match serde_json::from_str(&line)? {
            Message::Snapshot { snapshot } if first && all => {
                for e in &snapshot.confirmed {
                    text.push_str(&serde_json::to_string(e)?);
                    text.push('\n');
                }
            }
            Message::Report { event, .. } => {
                text.push_str(&serde_json::to_string(&event)?);
                text.push('\n');
            }
            Message::Snapshot { .. } => {}
        }
        first = false;
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("the agent closed the connection")
}

/// Resolves when stdout is a pipe or socket whose reader has gone (POLLERR / POLLHUP on the
/// write end); never for a terminal or a file. Waits on a thread of its own: the process exits
/// without waiting for it.
async fn stdout_reader_gone() {
    use std::os::fd::AsRawFd as _;
    let fd = std::io::stdout().as_raw_fd();
    // SAFETY: fstat on our own stdout into a zeroed stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let is_pipe = unsafe { libc::fstat(fd, &mut st) } == 0
        && matches!(st.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK);
    if !is_pipe {
        return std::future::pending().await;
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        loop {
            let mut pfd = libc::pollfd {
                fd,
                events: 0,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, -1) };
            if rc > 0 && pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                let _ = tx.send(());
                return;
            }
            if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return; // cannot tell: the write error will say it
            }
        }
    });
    if rx.await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `probe watch`.
#[expect(
    clippy::print_stdout,
    reason = "`probe watch --once` and a pipe get the view as text on stdout"
)]
pub async fn watch(socket: &Path, once: bool) -> anyhow::Result<()> {
    let stream = connect(socket).await?;
    let mut lines = BufReader::new(stream).lines();
    if once || !std::io::stdout().is_terminal() {
        while let Some(line) = lines.next_line().await? {
            if let Message::Snapshot { snapshot } = serde_json::from_str(&line)? {
                let model = view::Model::from_snapshot(&snapshot);
                print!("{}", view::plain(&model));
                return Ok(());
            }
        }
        anyhow::bail!("the agent closed the connection before its snapshot");
    }
    tui::run(lines).await
}

/// Connects to the agent's socket, or explains what to do when none is there.
pub async fn connect(path: &Path) -> anyhow::Result<UnixStream> {
    UnixStream::connect(path).await.map_err(|e| {
        anyhow::anyhow!(
            "no agent is listening on {} ({e}): start one with `probe agent` (as root), or point --socket at its socket",
            path.display()
        )
    })
}
