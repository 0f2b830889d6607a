//! `cargo xtask <command>`: developer and CI tasks for clb-probe.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod lab_cmd;

#[derive(Parser)]
#[command(name = "xtask", about = "Developer and CI tasks for clb-probe")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The network-namespace lab that reproduces the loopback failures (needs root).
    Lab(lab_cmd::LabArgs),
    /// One TCP attempt from inside a lab namespace; prints ok, refused, reset or timeout.
    #[command(hide = true)]
    LabClient(lab_cmd::ClientArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Lab(args) => lab_cmd::run(args),
        Command::LabClient(args) => lab_cmd::client(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
