//! The live-view socket: `probe watch` and `probe events` connect here.

use std::path::Path;

use crate::agent::shared::Shared;

/// Binds the unix socket (replacing a stale one left by a killed agent).
pub fn bind(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    Ok(tokio::net::UnixListener::bind(path)?)
}

/// Serves connected clients until the task is aborted.
pub async fn serve(listener: tokio::net::UnixListener, shared: Shared) -> anyhow::Result<()> {
    let _ = (listener, shared);
    std::future::pending::<()>().await;
    Ok(())
}
