//! `kubectl clb-probe evidence [-n NS] SERVICE -o DIR`: each node's evidence of the loops it
//! confirmed for SERVICE, fetched from the agents' `GET /evidence` through the API server's
//! pod proxy (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/evidence/...`: the same kubeconfig,
//! RBAC `pods/proxy get` in the agent's namespace; nothing is exec'd) and written as one
//! folder per node. This file is the pure part: which nodes, the folder's layout and texts;
//! [`super::api`] fetches.
//!
//! The nodes: the `reportingInstance` of the agents' Events regarding the Service (those in
//! the shape an agent writes, [`super::forged_because`]). The agent pod on each: chosen as
//! `watch` chooses it ([`super::agent_pod`]). The port: the agent container's port named
//! `metrics` (the chart's 9966), else `--port`.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use k8s_openapi::api::{core::v1::Pod, events::v1::Event};
use probe_contract::evidence::{EvidenceBundle, EvidenceIndex};

use super::{AGENT_CONTAINER, forged_because};

/// The chart's metrics port (`--metrics-addr :9966`).
pub const DEFAULT_PORT: u16 = 9966;

/// The files of each node's folder, and what each holds (README.txt says the same).
pub const FILES: [(&str, &str); 5] = [
    (
        "capture.pcapng",
        "the loop's first packets (from the IP header; up to 128 bytes each), one comment per \
         packet: hook, interface, drop reason, loop id and kind (tcpdump -r, Wireshark); more \
         loops of the Service on the node: capture-ID.pcapng",
    ),
    (
        "events.json",
        "the agent's evidence bundles, one per loop: the confirmed event (evidence lines, \
         remedy, facts, fixes) and the kept packets",
    ),
    (
        "conntrack.json",
        "the conntrack entries the agent's evidence cites, per loop",
    ),
    (
        "rules.txt",
        "the rules the agent's evidence cites, per loop",
    ),
    (
        "check.json",
        "`probe check`'s risks for the Service on that node (empty when the agent runs without \
         the node report)",
    ),
];

/// The nodes whose agents reported a loop for the Service, sorted, from its Events (forged
/// ones left out).
pub fn nodes_of(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| forged_because(e).is_none())
        .filter_map(|e| e.reporting_instance.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The agent's HTTP port on `pod`: its agent container's port named `metrics`, else `fallback`.
pub fn metrics_port(pod: &Pod, fallback: u16) -> u16 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter(|c| c.name == AGENT_CONTAINER)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("metrics"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(fallback)
}

/// Why `evidence -o DIR` writes nothing there (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum OutputDirError {
    #[error("{0} exists and is not empty: name a new or empty directory (-o DIR)")]
    NotEmpty(PathBuf),
    #[error("{0} is a symbolic link: name a new directory (-o DIR)")]
    Link(PathBuf),
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("{0}: {1} (created by someone else since DIR was checked?)")]
    NodeFolder(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// DIR must be new or empty: the command never mixes its files with others.
pub fn check_dir(dir: &Path) -> Result<(), OutputDirError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                Err(OutputDirError::NotEmpty(dir.to_owned()))
            } else {
                Ok(())
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(OutputDirError::Io(dir.to_owned(), e)),
    }
}

/// A loop id from an agent as it may name a file: letters, digits, `-`, `_` and `.` kept,
/// anything else (a `/`, a `..`) replaced, so no id names a path outside its node's folder
/// (hostile round 4: the ids come from the agents, not from this plugin).
pub fn safe_id(id: &str) -> String {
    let safe: String = id
        .chars()
        .take(128)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.starts_with('.') {
        format!("id_{safe}")
    } else {
        safe
    }
}

/// Creates DIR (mode 0700) when it does not exist; an existing one must be a directory of its
/// own, not a link: the files go nowhere else.
pub fn create_private_dir(dir: &Path) -> Result<(), OutputDirError> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => Err(OutputDirError::Link(dir.to_owned())),
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(OutputDirError::NotADirectory(dir.to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|e| OutputDirError::Io(dir.to_owned(), e)),
        Err(e) => Err(OutputDirError::Io(dir.to_owned(), e)),
    }
}

/// Creates a node's folder inside DIR (mode 0700); it must not exist yet (a folder or link
/// placed there after DIR was checked empty is refused, not followed).
pub fn create_node_dir(folder: &Path) -> Result<(), OutputDirError> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(folder)
        .map_err(|e| OutputDirError::NodeFolder(folder.to_owned(), e))
}

/// Writes a new file (mode 0600): never one that exists, never through a link
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`): another local user's link placed in DIR after its check
/// cannot redirect the operator's write.
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<(), OutputDirError> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| OutputDirError::Io(path.to_owned(), e))?;
    file.write_all(bytes)
        .map_err(|e| OutputDirError::Io(path.to_owned(), e))
}

/// A node's folder name: the node name where it is a plain one, else made safe.
pub fn node_dir(dir: &Path, node: &str) -> PathBuf {
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = if safe.is_empty() || safe.starts_with('.') {
        format!("node_{safe}")
    } else {
        safe
    };
    dir.join(safe)
}

/// The loops of `service` (`namespace/name`) in an agent's index, their ids. An event names
/// a Service as `namespace/name`, or `namespace/name:port` when the service table named its
/// port: both are the Service's.
pub fn loops_of(index: &EvidenceIndex, service: &str) -> Vec<String> {
    index
        .loops
        .iter()
        .filter(|l| {
            l.service
                .as_deref()
                .is_some_and(|s| names_service(s, service))
        })
        .map(|l| l.id.clone())
        .collect()
}

pub use probe_contract::names_service;

/// One node's files from its bundles (and their captures, in the same order).
pub fn node_files(bundles: &[EvidenceBundle], captures: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for (i, (b, c)) in bundles.iter().zip(captures).enumerate() {
        let name = if i == 0 {
            "capture.pcapng".to_string()
        } else {
            format!("capture-{}.pcapng", safe_id(&b.id))
        };
        files.push((name, c.clone()));
    }
    let json = |v: serde_json::Value| serde_json::to_vec_pretty(&v).unwrap_or_default();
    files.push((
        "events.json".into(),
        json(serde_json::to_value(bundles).unwrap_or_default()),
    ));
    files.push((
        "conntrack.json".into(),
        json(serde_json::Value::Array(
            bundles
                .iter()
                .map(|b| serde_json::json!({ "loop": b.id, "key": b.event.key, "entries": b.conntrack }))
                .collect(),
        )),
    ));
    let mut rules = String::new();
    for b in bundles {
        let _ = writeln!(rules, "# loop {} ({})", b.id, b.event.key);
        for r in &b.rules {
            let _ = writeln!(rules, "{r}");
        }
        if b.rules.is_empty() {
            rules.push_str("(the evidence cites no rule)\n");
        }
    }
    files.push(("rules.txt".into(), rules.into_bytes()));
    let mut risks: Vec<&probe_contract::report::RiskStatus> = Vec::new();
    for r in bundles.iter().flat_map(|b| &b.check) {
        if !risks.contains(&r) {
            risks.push(r);
        }
    }
    files.push((
        "check.json".into(),
        json(serde_json::to_value(risks).unwrap_or_default()),
    ));
    files
}

/// What happened on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeOutcome {
    /// Written: the loops' ids and their packet counts.
    Written(Vec<(String, usize)>),
    /// The agent answered but keeps no evidence for the Service (its loops were evicted, or it
    /// restarted since).
    NoLoops,
    /// The agent could not be reached or refused: why.
    Failed(String),
}

/// README.txt: what is where, per node.
pub fn readme(service: &str, outcomes: &[(String, NodeOutcome)]) -> String {
    let mut s = format!(
        "clb-probe evidence for Service {service}, from the agents of the nodes that reported a \
         loop for it (kubectl clb-probe evidence).\n\nEach node's folder holds:\n"
    );
    for (file, what) in FILES {
        let _ = writeln!(s, "  {file}: {what}");
    }
    s.push_str(
        "\nWhat the captures are (issue #49): the packets the agent's eBPF programs saw on this \
         node's side of the loop, as they arrived back from the LB or as the kernel dropped them \
         (each packet's comment names its hook: tc ingress on the NIC, or kfree_skb with the drop \
         reason), not the client's outgoing leg. The Ethernet header is synthetic (the programs \
         copy from the IP header). With the agent's default `--evidence headers`, every payload \
         byte after the IP and transport headers is zeroed (fragments, ICMP echo data and SCTP \
         chunks included): addresses and ports are what a loop is about; `--evidence full` keeps \
         them.\n",
    );
    s.push_str("\nNodes:\n");
    for (node, outcome) in outcomes {
        let _ = match outcome {
            NodeOutcome::Written(loops) => writeln!(
                s,
                "  {node}/: {} loop(s): {}",
                loops.len(),
                loops
                    .iter()
                    .map(|(id, n)| format!("{id} ({n} packets)"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            NodeOutcome::NoLoops => writeln!(
                s,
                "  {node}: the agent keeps no evidence for this Service (restarted, or the loop \
                 was evicted: 256 loops are kept); nothing written"
            ),
            NodeOutcome::Failed(why) => writeln!(s, "  {node}: NOT WRITTEN: {why}"),
        };
    }
    s
}

#[cfg(test)]
mod write_tests {
    use super::*;

    /// Hostile round 4: a link placed in DIR after its check is refused, not followed; an id
    /// from an agent never names a path outside its folder.
    #[test]
    fn files_are_new_never_through_a_link_and_ids_stay_in_their_folder() {
        let base = tests::no_temp_dir("clb-evidence-write");
        create_private_dir(&base).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&base).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let victim = base.join("victim");
        std::fs::write(&victim, "the operator's file").unwrap();
        let planted = base.join("README.txt");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert!(write_new(&planted, b"evidence").is_err());
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "the operator's file"
        );
        let link_dir = base.join("linkdir");
        std::os::unix::fs::symlink(&base, &link_dir).unwrap();
        assert!(
            create_private_dir(&link_dir)
                .unwrap_err()
                .to_string()
                .contains("symbolic link")
        );
        assert!(create_node_dir(&link_dir).is_err());
        write_new(&base.join("new.txt"), b"x").unwrap();
        assert!(
            write_new(&base.join("new.txt"), b"y").is_err(),
            "never overwritten"
        );
        assert_eq!(safe_id("../../etc/passwd"), "id_.._.._etc_passwd");
        assert_eq!(safe_id("hairpin-1a2b"), "hairpin-1a2b");
        std::fs::remove_dir_all(&base).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `NAME-PID` in the temp directory, removed if a run before left it.
    pub(super) fn no_temp_dir(name: &str) -> std::path::PathBuf {
        let base = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        base
    }

    #[test]
    fn a_non_empty_dir_is_refused_and_a_new_or_empty_one_is_fine() {
        let base = no_temp_dir("clb-evidence-dir");
        assert!(check_dir(&base).is_ok());
        std::fs::create_dir_all(&base).unwrap();
        assert!(check_dir(&base).is_ok());
        std::fs::write(base.join("x"), "x").unwrap();
        let e = check_dir(&base).unwrap_err();
        assert!(e.to_string().contains("exists and is not empty"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_service_with_its_port_is_the_service() {
        assert!(names_service("default/web", "default/web"));
        assert!(names_service("default/web:http", "default/web"));
        assert!(!names_service("default/webshop", "default/web"));
        assert!(!names_service("other/web", "default/web"));
    }

    #[test]
    fn node_folders_cannot_leave_the_directory() {
        let d = Path::new("/tmp/out");
        assert_eq!(node_dir(d, "node-a.example"), d.join("node-a.example"));
        assert_eq!(node_dir(d, "../etc"), d.join("node_.._etc"));
        assert_eq!(node_dir(d, ""), d.join("node_"));
    }

    #[test]
    fn the_readme_names_every_file_and_each_nodes_outcome() {
        let text = readme(
            "default/web",
            &[
                (
                    "node-a".into(),
                    NodeOutcome::Written(vec![("00ff".into(), 3)]),
                ),
                (
                    "node-b".into(),
                    NodeOutcome::Failed("connection refused".into()),
                ),
            ],
        );
        for (file, _) in FILES {
            assert!(text.contains(file), "{file}");
        }
        assert!(text.contains("node-a/: 1 loop(s): 00ff (3 packets)"));
        assert!(text.contains("node-b: NOT WRITTEN: connection refused"));
    }
}
