//! The request this node's agent is testing, marked on the node rather than in the API (issue
//! #52: a verify costs the agent one API write per node, its answer).
//!
//! Why a mark at all (issue #49): a request that crashes the agent must not be taken again by
//! its restart, or one request object would crash-loop every agent it names. The mark is a
//! file beside the live-view socket (`/run/clb-probe`, a hostPath in the DaemonSet, so it
//! outlives the container), written before anything is planned and removed once the answer is
//! written. An agent that starts and finds one answers that request `refused` ("stopped while
//! testing") and never takes it. Where no file can be written (no socket directory, a
//! read-only one), the mark goes to the API as before (`running` in the node's entry): two
//! writes, the guard kept.

use std::{
    io,
    path::{Path, PathBuf},
};

/// Where the mark of `node`'s agent lives: beside the live-view socket, one file per node name
/// (two agents of one host, in two network namespaces, are two nodes).
pub fn path_beside(socket: &Path, node: &str) -> Option<PathBuf> {
    let dir = socket.parent().filter(|d| !d.as_os_str().is_empty())?;
    // A node name is a DNS subdomain; anything else is not put in a file name.
    let safe = !node.is_empty()
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !node.starts_with('.');
    safe.then(|| dir.join(format!("verify-testing.{node}")))
}

/// The mark file of one node's agent.
#[derive(Clone, Debug)]
pub struct TestingMark {
    path: PathBuf,
}

impl TestingMark {
    pub fn at(path: PathBuf) -> Self {
        Self { path }
    }

    /// The request a previous agent marked and never answered (it stopped while testing), if
    /// any; the mark is removed, so it is answered once.
    pub fn take_left_over(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.path).ok();
        let _ = std::fs::remove_file(&self.path);
        let name = text?.trim().to_owned();
        // A Kubernetes object name: at most 253 bytes; a longer or empty file is not one.
        (!name.is_empty() && name.len() <= 253 && !name.contains(char::is_whitespace))
            .then_some(name)
    }

    /// Marks `request` as being tested: written whole (a temporary file renamed over the
    /// mark), so a crash leaves the old mark or the new one, never half of one.
    pub fn set(&self, request: &str) -> io::Result<()> {
        // The mark's own name plus `.tmp` (not `with_extension`: a node name's last label
        // would be taken for an extension, and two nodes' marks would share one file).
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        std::fs::write(&tmp, request)?;
        std::fs::rename(&tmp, &self.path)
    }

    /// The request is answered: no mark.
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of the test's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("clb-mark-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mark_in(dir: &Scratch) -> TestingMark {
        TestingMark::at(path_beside(&dir.path().join("probe.sock"), "node-a").unwrap())
    }

    #[test]
    fn a_mark_left_by_a_stopped_agent_is_taken_once() {
        let dir = Scratch::new("once");
        let mark = mark_in(&dir);
        assert_eq!(mark.take_left_over(), None, "no mark yet");
        mark.set("clb-verify-abc12").unwrap();
        mark.set("clb-verify-def34").unwrap();
        // The agent stopped here: its restart finds the last request it marked.
        let restarted = mark_in(&dir);
        assert_eq!(
            restarted.take_left_over().as_deref(),
            Some("clb-verify-def34")
        );
        assert_eq!(restarted.take_left_over(), None, "answered once, not again");
    }

    #[test]
    fn an_answered_request_leaves_no_mark() {
        let dir = Scratch::new("answered");
        let mark = mark_in(&dir);
        mark.set("clb-verify-abc12").unwrap();
        // Two nodes' marks in one directory stay apart (names that differ in a last label).
        let other = TestingMark::at(path_beside(&dir.path().join("probe.sock"), "node-b").unwrap());
        other.set("clb-verify-zzz99").unwrap();
        assert_eq!(other.take_left_over().as_deref(), Some("clb-verify-zzz99"));
        mark.clear();
        assert_eq!(mark.take_left_over(), None);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no file left behind"
        );
    }

    #[test]
    fn a_mark_that_is_not_a_name_is_ignored_and_removed() {
        let dir = Scratch::new("junk");
        let mark = mark_in(&dir);
        for junk in ["", "two words", &"x".repeat(300)] {
            mark.set(junk).unwrap();
            assert_eq!(mark.take_left_over(), None, "{junk:?}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_mark_is_per_node_beside_the_socket_and_only_for_a_node_name() {
        let socket = Path::new("/run/clb-probe/probe.sock");
        assert_eq!(
            path_beside(socket, "ip-10-0-1-7.ec2.internal"),
            Some(PathBuf::from(
                "/run/clb-probe/verify-testing.ip-10-0-1-7.ec2.internal"
            ))
        );
        for bad in ["", "../etc", "a/b", ".hidden", "node a"] {
            assert_eq!(path_beside(socket, bad), None, "{bad:?}");
        }
        assert_eq!(path_beside(Path::new("probe.sock"), "node-a"), None);
    }
}
