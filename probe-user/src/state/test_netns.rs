//! Scratch network namespaces for the readers' tests against the real kernel (root only): made
//! on [`Netns::new`], deleted on drop (also when the test panics), and entered by a dedicated
//! thread only ([`Netns::run_in`]), so the test's own thread never changes namespace.

use std::{
    io,
    os::fd::AsRawFd as _,
    process::{Command, Stdio},
};

/// Namespaces `clbtest-<group>-<name>-<pid>`, or `clbtest-<group>-<pid>` for one unnamed.
pub struct Netns(Vec<String>);

impl Netns {
    /// One namespace per name in `names` (`&[""]`: one, named by the group alone).
    pub fn new(group: &str, names: &[&str]) -> Netns {
        let pid = std::process::id();
        let mut ns = Netns(Vec::new());
        for n in names {
            let name = if n.is_empty() {
                format!("clbtest-{group}-{pid}")
            } else {
                format!("clbtest-{group}-{n}-{pid}")
            };
            sh(&["ip", "netns", "add", &name]);
            ns.0.push(name);
        }
        ns
    }

    /// The name of namespace `i` (for `ip netns exec`).
    pub fn name(&self, i: usize) -> &str {
        &self.0[i]
    }

    /// Runs `args` in namespace `i` (`ip netns exec`); panics with its stderr if it fails.
    pub fn exec(&self, i: usize, args: &[&str]) {
        let mut full = vec!["ip", "netns", "exec", self.0[i].as_str()];
        full.extend_from_slice(args);
        sh(&full);
    }

    /// Runs `args` (a restore tool: `iptables-nft-restore`, `ipset restore`, ...) in namespace
    /// `i` with `text` on its standard input; panics with its stderr if it fails.
    pub fn restore(&self, i: usize, args: &[&str], text: &str) {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.0[i].as_str()])
            .args(args)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// [`Netns::restore`] of `text` without its `#` lines (the captures' comments, which the
    /// nft backends refuse).
    pub fn restore_without_comments(&self, i: usize, args: &[&str], text: &str) {
        let text: String = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        self.restore(i, args, &text);
    }

    /// `nft -j list table <family> <table>` run in namespace `i` (the JSON reader's input).
    pub fn nft_list_table(&self, i: usize, family: &str, table: &str) -> std::process::Output {
        Command::new("ip")
            .args([
                "netns", "exec", &self.0[i], "nft", "-j", "list", "table", family, table,
            ])
            .output()
            .unwrap()
    }

    /// Runs `f` on a new thread that has entered namespace `i`.
    pub fn run_in<T: Send + 'static>(&self, i: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.0[i]);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("open netns");
            // SAFETY: a valid namespace fd; only this thread changes namespace.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
            f()
        })
        .join()
        .expect("namespace thread")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Whether the test can load rulesets into scratch namespaces: root, and `tool` (`nft`,
/// `iptables-nft-restore`) answers `--version`; else it says that it skips.
pub fn root_with(tool: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new(tool).arg("--version").output().is_err() {
        eprintln!("skipping: needs root and {tool}");
        return false;
    }
    true
}

/// One scratch namespace named by `group` when [`root_with`] `tool`; `None` (the test skips)
/// otherwise.
pub fn scratch_with(tool: &str, group: &str) -> Option<Netns> {
    root_with(tool).then(|| Netns::new(group, &[""]))
}

/// Runs `args` here (no namespace); panics with its stderr if it fails.
pub fn sh(args: &[&str]) {
    test_support::run_ok(Command::new(args[0]).args(&args[1..]), &format!("{args:?}"));
}
