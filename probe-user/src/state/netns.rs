//! Pods' network namespaces, found from the host by address, and calls made from inside one
//! (issue #49: verify tests a pod's loop from the pod, along the path that looped).
//!
//! How a pod's namespace is found, runtime-agnostic: every network namespace the host can
//! name is a candidate — the files CNI runtimes pin them at (containerd and CRI-O:
//! `/var/run/netns/cni-*`, Docker: `/var/run/docker/netns/*`, `ip netns`: `/run/netns/*`),
//! then `/proc/<pid>/ns/net` of every process the agent can see — each counted once (by its
//! nsfs inode), the agent's own excluded; the pod's is the one namespace that has the pod's
//! IP on an interface. Entering a namespace to read its addresses is one `setns` and one
//! `getifaddrs` on a dedicated thread that exits afterwards, so no other thread of the agent
//! ever changes namespace. Two namespaces holding the address (a stale pin, a copy) is an
//! error: which one is the pod's is not known, and a test from the wrong one proves nothing.
//!
//! What it needs: `CAP_SYS_ADMIN` (`setns` into a namespace of the initial user namespace),
//! and the namespace files (SECURITY.md, "Verify from a pod"). Without them the answer is
//! `not_testable` with the reason, never a test from the node in the pod's place.

use std::{
    collections::HashSet,
    fs::File,
    net::IpAddr,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Where runtimes pin pods' network namespaces (bind mounts of nsfs files).
pub const PINNED_DIRS: [&str; 3] = ["/run/netns", "/var/run/netns", "/var/run/docker/netns"];

/// Candidates looked at most in one search (a node runs at most a few hundred pods; each
/// process of each pod shares its pod's namespace, counted once).
const MAX_CANDIDATES: usize = 4096;

/// One search's time bound: past it the search says so rather than holding verify up.
const SEARCH_BUDGET: Duration = Duration::from_secs(5);

/// A network namespace by the file that names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netns {
    pub path: PathBuf,
    /// The nsfs inode: the namespace's identity.
    pub inode: u64,
}

/// The namespace files to look at, each namespace once, the calling thread's own left out
/// (pure over the listings it is given: the pinned files, then the processes' links).
fn candidates(pinned: &[PathBuf], procs: &[PathBuf], own: Option<u64>) -> Vec<Netns> {
    let mut seen: HashSet<u64> = own.into_iter().collect();
    let mut out = Vec::new();
    for path in pinned.iter().chain(procs) {
        if out.len() >= MAX_CANDIDATES {
            break;
        }
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if seen.insert(meta.ino()) {
            out.push(Netns {
                path: path.clone(),
                inode: meta.ino(),
            });
        }
    }
    out
}

fn list(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

fn proc_links() -> Vec<PathBuf> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter()
        .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net")))
        .collect()
}

/// Whether the calling thread's namespace has `ip` on an interface.
fn has_addr_here(ip: IpAddr) -> bool {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return false;
    }
    let mut found = false;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list getifaddrs returned, until its null end.
        let entry = unsafe { &*cur };
        if !entry.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says its real type.
            let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
            let addr = match family {
                libc::AF_INET => {
                    // SAFETY: AF_INET: a sockaddr_in.
                    let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ))
                }
                libc::AF_INET6 => {
                    // SAFETY: AF_INET6: a sockaddr_in6.
                    let sin6 = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            found |= addr == Some(ip);
        }
        cur = entry.ifa_next;
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// Moves the calling thread into the namespace `file` names.
fn enter(file: &File) -> std::io::Result<()> {
    // SAFETY: setns on a valid fd; CLONE_NEWNET changes the calling thread only, and every
    // caller is a thread of its own that exits after.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Why a pod's network namespace could not be found or entered: each a `not_testable` answer.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot start the namespace thread: {0}")]
    Thread(std::io::Error),
    #[error("the namespace thread panicked")]
    Panicked,
    #[error(
        "looked at {looked} of {of} network namespaces in {budget_s} s without finding {ip} (budget spent)"
    )]
    BudgetSpent {
        looked: usize,
        of: usize,
        budget_s: u64,
        ip: IpAddr,
    },
    #[error(
        "cannot enter other network namespaces to find {ip} ({source}: the agent needs CAP_SYS_ADMIN for setns; chart: verify.fromPods)"
    )]
    Denied { ip: IpAddr, source: std::io::Error },
    #[error(
        "no network namespace on this node has {ip} (looked at {looked}: the pod is gone, or its namespace is pinned where the agent cannot see it; chart: verify.fromPods mounts /var/run/netns)"
    )]
    NotFound { ip: IpAddr, looked: usize },
    #[error(
        "{n} network namespaces on this node have {ip} ({paths}): which is the pod's is not known"
    )]
    Ambiguous { n: usize, ip: IpAddr, paths: String },
    #[error("{path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} names another namespace now (the pod was replaced)")]
    Replaced(PathBuf),
    #[error("setns {path}: {source}")]
    Enter {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} no longer holds {ip}")]
    Moved { path: PathBuf, ip: IpAddr },
}

/// The network namespace that holds `ip` on an interface (a pod's, by its IP), searched on a
/// thread of its own. Errors say why none could be named (none holds it, two do, no
/// permission to enter), for a `not_testable` answer.
pub fn find_by_addr(ip: IpAddr) -> Result<Netns, NetnsError> {
    std::thread::Builder::new()
        .name("clb-netns-find".into())
        .spawn(move || search(ip))
        .map_err(NetnsError::Thread)?
        .join()
        .map_err(|_| NetnsError::Panicked)?
}

fn search(ip: IpAddr) -> Result<Netns, NetnsError> {
    let own = std::fs::metadata("/proc/thread-self/ns/net")
        .ok()
        .map(|m| m.ino());
    let pinned: Vec<PathBuf> = PINNED_DIRS
        .iter()
        .flat_map(|d| list(Path::new(d)))
        .collect();
    let all = candidates(&pinned, &proc_links(), own);
    let started = Instant::now();
    let (mut found, mut denied, mut looked) = (Vec::new(), None, 0usize);
    for ns in &all {
        if started.elapsed() > SEARCH_BUDGET {
            return Err(NetnsError::BudgetSpent {
                looked,
                of: all.len(),
                budget_s: SEARCH_BUDGET.as_secs(),
                ip,
            });
        }
        let Ok(file) = File::open(&ns.path) else {
            continue;
        };
        looked += 1;
        match enter(&file) {
            Ok(()) if has_addr_here(ip) => found.push(ns.clone()),
            Ok(()) => {}
            Err(e) => {
                denied.get_or_insert(e);
            }
        }
    }
    match (found.len(), denied) {
        (1, _) => Ok(found.remove(0)),
        (0, Some(source)) => Err(NetnsError::Denied { ip, source }),
        (0, None) => Err(NetnsError::NotFound { ip, looked }),
        (n, _) => Err(NetnsError::Ambiguous {
            n,
            ip,
            paths: found
                .iter()
                .map(|n| n.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Runs `f` inside `ns` on a thread of its own (sockets it creates belong to `ns`), after
/// checking that `ns` is still the namespace found (same inode) and still holds `ip`.
pub fn run_in<T: Send + 'static>(
    ns: &Netns,
    ip: IpAddr,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NetnsError> {
    let ns = ns.clone();
    std::thread::Builder::new()
        .name("clb-netns-call".into())
        .spawn(move || {
            let file = File::open(&ns.path).map_err(|source| NetnsError::Open {
                path: ns.path.clone(),
                source,
            })?;
            let inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
            if inode != ns.inode {
                return Err(NetnsError::Replaced(ns.path.clone()));
            }
            enter(&file).map_err(|source| NetnsError::Enter {
                path: ns.path.clone(),
                source,
            })?;
            if !has_addr_here(ip) {
                return Err(NetnsError::Moved {
                    path: ns.path.clone(),
                    ip,
                });
            }
            Ok(f())
        })
        .map_err(NetnsError::Thread)?
        .join()
        .map_err(|_| NetnsError::Panicked)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_namespace_is_a_candidate_once_and_the_own_is_left_out() {
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        let me = PathBuf::from("/proc/self/ns/net");
        let missing = PathBuf::from("/nonexistent/ns");
        // The own namespace twice, a file that does not exist: nothing to search.
        assert!(
            candidates(&[me.clone(), missing], std::slice::from_ref(&me), Some(own)).is_empty()
        );
        // Not excluded: once, though named twice.
        let c = candidates(std::slice::from_ref(&me), std::slice::from_ref(&me), None);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].inode, own);
    }

    #[test]
    fn the_threads_own_addresses_are_seen() {
        assert!(has_addr_here(IpAddr::from([127, 0, 0, 1])) || !Path::new("/proc/net").exists());
        assert!(!has_addr_here(IpAddr::from([192, 0, 2, 254])));
    }

    /// Root only: a scratch namespace with an address is found by it, and a call made in it
    /// runs there (it sees the address; the test's thread does not).
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn a_namespace_is_found_by_its_address_and_entered() {
        let Some(ns) = crate::state::test_netns::scratch_with("ip", "findns") else {
            return;
        };
        ns.exec(0, &["ip", "link", "add", "clbfind0", "type", "bridge"]);
        ns.exec(
            0,
            &["ip", "addr", "add", "192.0.2.77/32", "dev", "clbfind0"],
        );
        let ip = IpAddr::from([192, 0, 2, 77]);
        let found = find_by_addr(ip).expect("the scratch namespace holds the address");
        assert!(
            found.path.ends_with(ns.name(0)),
            "found {found:?}, not {}",
            ns.name(0)
        );
        assert!(run_in(&found, ip, move || has_addr_here(ip)).unwrap());
        assert!(!has_addr_here(ip), "the caller's thread never moved");
        let err = find_by_addr(IpAddr::from([192, 0, 2, 78])).unwrap_err();
        assert!(err.to_string().contains("no network namespace"), "{err}");
    }
}
