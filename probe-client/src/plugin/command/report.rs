//! `report`: the cluster table from the agents' LoopbackReports, a gate for pipelines.

use std::process::ExitCode;

use super::ReportOutput;
use crate::{plugin::query, report::cluster};

/// Prints the cluster view (`filter`ed) and exits as the view says: 0 clean, 1 a risk or an
/// active loop.
#[expect(clippy::print_stdout, reason = "the plugin's output")]
pub async fn run(
    client: kube::Client,
    filter: cluster::Filter,
    output: ReportOutput,
) -> anyhow::Result<ExitCode> {
    let view = query::report(client, filter).await?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    match output {
        ReportOutput::Json => println!("{}", serde_json::to_string_pretty(&view)?),
        ReportOutput::Table => print!("{}", cluster::table(&view, now, false)),
        ReportOutput::Wide => print!("{}", cluster::table(&view, now, true)),
    }
    Ok(ExitCode::from(view.exit_code()))
}
