//! What every row shares: the line it adds to the report, and the agent's metrics port.

/// The port every row's agent serves `/metrics` and `/healthz` on.
pub(super) const METRICS_PORT: u16 = 19968;

/// One row of the report.
pub(super) struct Row {
    pub(super) fault: String,
    pub(super) checked: String,
    pub(super) figure: String,
    /// Ok("nothing lost") or Err(what was lost / what failed).
    pub(super) verdict: Result<String, String>,
}
