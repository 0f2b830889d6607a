//! The plugin's subcommands as flows, one module each: the binary parses the command line and
//! calls one of these. Each reads through [`super::api`] and [`super::query`], decides with the
//! pure modules ([`super::fix`], [`super::verify`], [`super::evidence`], ...) and prints:
//! the plugin's output is its job, so printing is allowed here and only here (and in `mcp`,
//! which answers on stdout).

pub mod events;
pub mod evidence;
pub mod fix;
pub mod report;
pub mod verify;
pub mod watch;

/// `-o`: the listing as a table, or as JSON.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// `report -o`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ReportOutput {
    Table,
    /// The table with each agent's version and what it cannot confirm.
    Wide,
    Json,
}

/// API text (annotation values, an error Status's `message`, names) made safe for a terminal:
/// issue 36, E11 and E16. JSON output (`-o json`) is printed as it is: JSON escapes controls.
pub fn esc(s: &str) -> std::borrow::Cow<'_, str> {
    crate::term::escape_lines(s)
}
