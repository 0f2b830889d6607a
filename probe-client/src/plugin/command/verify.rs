//! `verify SERVICE`, and the verify flow `fix --apply ID --verify` runs too: one request, its
//! answers printed, the exit code by [`verify::verdict`] (the pure part:
//! [`crate::plugin::verify`]).

use std::{process::ExitCode, time::Duration};

use probe_contract::verify::VerificationSpec;

use super::{Output, esc};
use crate::plugin::{
    api, fix, query,
    verify::{self, Verdict},
};

/// What the flow answers: `verify`'s question (is a loop there?), printed as `-o` says, or
/// `fix --verify`'s (is every loop the nodes had gone?), printed as a table and a conclusion.
#[derive(Clone, Copy, Debug)]
pub enum Question {
    Looping(Output),
    Resolved,
}

/// `verify`: asks `nodes` (none: those whose reports or Events name the Service) to test it.
pub async fn run(
    client: kube::Client,
    service: &str,
    namespace: Option<&str>,
    nodes: Vec<String>,
    timeout_s: u64,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let (namespace, service) = fix::service_ref(service, namespace)?;
    let spec = query::verify_spec(client.clone(), &namespace, &service, nodes).await?;
    flow(client, &spec, timeout_s, Question::Looping(output)).await
}

/// The one verify flow: creates the requests, waits up to `timeout_s` for the answers, prints
/// them and exits by the verdict: 0 clean (or resolved), 3 a loop confirmed, 4 not proven; a
/// node that did not answer is an error.
#[expect(clippy::print_stdout, reason = "the plugin's output")]
pub async fn flow(
    client: kube::Client,
    spec: &VerificationSpec,
    timeout_s: u64,
    question: Question,
) -> anyhow::Result<ExitCode> {
    let v = api::run_verification(client, spec, Duration::from_secs(timeout_s)).await?;
    match question {
        Question::Looping(Output::Json) => println!("{}", serde_json::to_string_pretty(&v)?),
        _ => print!("{}", esc(&verify::render(&v))),
    }
    let resolving = matches!(question, Question::Resolved);
    match verify::verdict(&v, resolving) {
        Verdict::Confirmed => {
            if resolving {
                for (node, what) in v.still_looping() {
                    println!("still looping on node {}: {}", esc(&node), esc(&what));
                }
            }
            Ok(ExitCode::from(verify::CONFIRMED_EXIT))
        }
        Verdict::Unanswered => anyhow::bail!(verify::missing_error(&v.missing, timeout_s)),
        Verdict::NotProven(because) => {
            if resolving {
                println!("not proven resolved:");
                for line in because {
                    println!("  {}", esc(&line));
                }
            }
            Ok(ExitCode::from(verify::NOT_PROVEN_EXIT))
        }
        Verdict::Clean => {
            if resolving {
                println!(
                    "resolved: every loop tested from its own client is clean on every node that had it ({})",
                    esc(&spec.nodes.join(", "))
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
