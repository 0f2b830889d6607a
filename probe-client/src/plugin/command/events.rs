//! `events`: the confirmed loopbacks from the Events, newest first.

use std::process::ExitCode;

use super::Output;
use crate::plugin::{self, query};

/// Lists clb-probe's Events (in `namespace`, else every namespace) as a table or JSON.
#[expect(clippy::print_stdout, reason = "the plugin's output")]
pub async fn run(
    client: kube::Client,
    namespace: Option<&str>,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let rows = query::events(client, namespace).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Output::Table if rows.is_empty() => println!("{}", plugin::NO_EVENTS),
        Output::Table => print!(
            "{}",
            plugin::table(&rows, k8s_openapi::jiff::Timestamp::now())
        ),
    }
    Ok(ExitCode::SUCCESS)
}
