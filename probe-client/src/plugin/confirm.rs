//! The operator's yes before a write (issue 36, E17): `--apply` and `--undo` show the API
//! server's dry run of the change, then ask on the terminal. `--yes` answers for scripts.
//! Without a terminal on stdin and without `--yes` the write is refused: a pipeline must say
//! that it means it, and nothing is applied that nobody was shown. The write itself is
//! guarded by the resourceVersion the dry run saw, so what is confirmed is what is written
//! (409 if the Service moves in between).

use std::io::{BufRead, IsTerminal as _, Write};

use super::fix::Refused;

/// Asks `question` on stderr and reads the answer from stdin, unless `yes`. Refused (exit 2)
/// when stdin is not a terminal, or the answer is not yes.
pub fn ask(yes: bool, question: &str) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Refused(
            "not applied: no terminal to confirm on; pass --yes to apply what the dry run above shows"
                .into(),
        )
        .into());
    }
    decide(question, &mut stdin.lock(), &mut std::io::stderr())
}

/// The question and the answer's verdict over any reader and writer (pure enough to test).
pub fn decide(
    question: &str,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    write!(out, "{question} [y/N] ")?;
    out.flush()?;
    let mut line = String::new();
    input.read_line(&mut line)?;
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Refused("not applied: not confirmed".into()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::decide;

    #[test]
    fn only_yes_applies() {
        for (answer, applies) in [
            ("y\n", true),
            ("YES\n", true),
            ("n\n", false),
            ("\n", false),
            ("", false),
            ("yess\n", false),
        ] {
            let mut out = Vec::new();
            let verdict = decide("apply?", &mut answer.as_bytes(), &mut out);
            assert_eq!(verdict.is_ok(), applies, "{answer:?}");
            assert_eq!(String::from_utf8(out).unwrap(), "apply? [y/N] ");
        }
    }
}
