//! Running the lab's commands: every failure names the command and its stderr.

use std::{
    io::Write,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

fn show(argv: &[&str]) -> String {
    argv.iter()
        .map(|a| {
            if a.is_empty() || a.contains(char::is_whitespace) {
                format!("'{a}'")
            } else {
                (*a).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn finish(argv: &[&str], out: std::process::Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            show(argv),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `argv`, returns its stdout; an error names the command, its status and stderr.
pub fn run(argv: &[&str]) -> Result<String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start `{}`", show(argv)))?;
    finish(argv, out)
}

/// Runs `argv` with `input` on its stdin.
pub(crate) fn run_stdin(argv: &[&str], input: &str) -> Result<String> {
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{}`", show(argv)))?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(input.as_bytes())
        .with_context(|| format!("writing stdin of `{}`", show(argv)))?;
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for `{}`", show(argv)))?;
    finish(argv, out).with_context(|| format!("input was:\n{input}"))
}

/// Runs `argv` with stdin/stdout null and stderr to a file, for commands that leave a daemon
/// behind (a pipe would be inherited by the daemon and never reach EOF).
pub(crate) fn run_detached(argv: &[&str]) -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    let mut err = tempfile_for_stderr()?;
    let mut cmd = Command::new(argv[0]);
    // The server outlives us: it must not inherit our descriptors beyond stdio (a caller's
    // `flock` on a lock file would otherwise stay held by the server until `lab down`).
    // SAFETY: close_range is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    let status = cmd
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err.try_clone()?)
        .status()
        .with_context(|| format!("cannot start `{}`", show(argv)))?;
    if !status.success() {
        use std::io::{Read, Seek};
        let mut text = String::new();
        err.rewind()?;
        err.read_to_string(&mut text)?;
        bail!("`{}` failed ({status}): {}", show(argv), text.trim());
    }
    Ok(())
}

/// An anonymous (already unlinked) file for a child's stderr.
fn tempfile_for_stderr() -> Result<std::fs::File> {
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "clb-lab-stderr-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    Ok(f)
}

/// True when `argv` exits 0 (for `iptables -C` style checks).
pub(crate) fn succeeds(argv: &[&str]) -> bool {
    Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `ip -n <ns> <args>`.
pub(crate) fn ip(ns: &str, args: &[&str]) -> Result<String> {
    let mut argv = vec!["ip", "-n", ns];
    argv.extend_from_slice(args);
    run(&argv)
}

/// `ip netns exec <ns> <args>`.
pub(crate) fn exec(ns: &str, args: &[&str]) -> Result<String> {
    let mut argv = vec!["ip", "netns", "exec", ns];
    argv.extend_from_slice(args);
    run(&argv)
}

/// `ip netns exec <ns> sysctl -q -w k=v ...`.
pub(crate) fn sysctl(ns: &str, settings: &[String]) -> Result<()> {
    let mut argv = vec!["ip", "netns", "exec", ns, "sysctl", "-q", "-w"];
    argv.extend(settings.iter().map(String::as_str));
    run(&argv).map(drop)
}

/// `ip netns exec <ns> sysctl -n <key>`, parsed as a number.
pub(crate) fn sysctl_read(ns: &str, key: &str) -> Result<i64> {
    let out = exec(ns, &["sysctl", "-n", key])?;
    out.trim()
        .parse()
        .with_context(|| format!("sysctl {key} in {ns} printed {out:?}"))
}

/// `iptables -w <args>` inside `ns`.
pub(crate) fn iptables(ns: &str, args: &[&str]) -> Result<String> {
    let mut argv = vec!["iptables", "-w"];
    argv.extend_from_slice(args);
    exec(ns, &argv)
}

/// Whether `iptables -w <args>` succeeds inside `ns` (`-C` checks).
pub(crate) fn iptables_ok(ns: &str, args: &[&str]) -> bool {
    let mut argv = vec!["ip", "netns", "exec", ns, "iptables", "-w"];
    argv.extend_from_slice(args);
    succeeds(&argv)
}

/// Removes the lab chain `chain` of `table` in `ns` and every jump to it from `from` (the
/// builtin chain) that carries `comment`: the jumps first, as iptables deletes no chain still
/// referenced.
pub(crate) fn remove_chain(
    ns: &str,
    table: &str,
    from: &str,
    comment: &str,
    chain: &str,
) -> Result<()> {
    let jump = [
        "-t",
        table,
        "-D",
        from,
        "-m",
        "comment",
        "--comment",
        comment,
        "-j",
        chain,
    ];
    while iptables_ok(ns, &jump) {}
    iptables(ns, &["-t", table, "-F", chain])?;
    iptables(ns, &["-t", table, "-X", chain])?;
    Ok(())
}

/// Loads `rules` into `ns` with `<tool> -w --noflush` (`iptables-restore` or
/// `ip6tables-restore`): the chains it names are added to, the others left alone.
pub(crate) fn restore_rules(ns: &str, tool: &str, rules: &str) -> Result<String> {
    run_stdin(&["ip", "netns", "exec", ns, tool, "-w", "--noflush"], rules)
}

/// A permanent neighbour entry in `ns`: `addr` (IPv4 or IPv6) is at `mac` on `dev`.
pub(crate) fn neigh_permanent(ns: &str, addr: &str, mac: &str, dev: &str) -> Result<()> {
    let family = if addr.contains(':') { "-6" } else { "-4" };
    let args = [
        family,
        "neigh",
        "replace",
        addr,
        "lladdr",
        mac,
        "dev",
        dev,
        "nud",
        "permanent",
    ];
    ip(ns, &args).map(drop)
}
