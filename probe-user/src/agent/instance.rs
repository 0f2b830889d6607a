//! One agent per network namespace.
//!
//! Two agents in one namespace would attach twice, and the one that exits would remove what
//! the other relies on. The lock is an abstract unix socket: abstract names are per network
//! namespace, need no writable filesystem (the DaemonSet's root is read-only), and vanish with
//! the process however it dies (SIGKILL included), so a stale lock cannot exist. The name
//! carries the namespace's inode for whoever looks at `ss -xl`. A second agent connects to
//! it and names the first one's PID (SO_PEERCRED, as seen from its own PID namespace).
//!
//! Squatting. Any process of the namespace may bind an abstract name, capabilities or not, so
//! an unprivileged user could take `@clb-probe/agent/netns:<inode>` first and keep every agent
//! from starting (the DaemonSet would crash-loop for good). A name that anyone can take
//! cannot prove anything by being taken; the holder's credentials can. An agent runs as root
//! (the chart's `runAsUser: 0`) or at least with CAP_BPF/CAP_SYS_ADMIN and CAP_NET_ADMIN, so
//! a holder counts as an agent only when SO_PEERCRED says uid 0, or its `/proc/<pid>/status`
//! (when its PID is visible) shows those capabilities. A holder that is neither, or that
//! cannot be asked (it never listens, or keeps its backlog full so a connect would block: the
//! check connects without blocking), is a squatter: the agent says so in one WARN naming its
//! PID and uid, and takes a name of its own under the same prefix,
//! `@clb-probe/agent/netns:<inode>/<pid>.<nanos>`. A handshake would not help: whatever an
//! agent answers, a squatter can answer too.
//!
//! Because a lock can now live under a fallback name, every agent, whichever name it got,
//! then lists the namespace's abstract sockets (`/proc/net/unix` shows the reader's
//! namespace) and refuses to run, with the usual one-line error, when another holder under the
//! prefix is a real agent. Two agents that start in the same instant behind a squatter can
//! both see each other and both refuse: a restart settles it, and no namespace is ever watched
//! twice.

use std::{
    io,
    os::{
        fd::AsRawFd as _,
        linux::net::SocketAddrExt as _,
        unix::net::{SocketAddr, UnixListener},
    },
    time::{Duration, Instant},
};

use tracing::warn;

use crate::kernel::{CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN};

/// Held for the agent's lifetime; dropping it releases the namespace.
pub struct InstanceLock {
    listener: UnixListener,
}

/// The abstract socket name for the namespace with inode `netns_ino`.
pub fn lock_name(netns_ino: u64) -> String {
    format!("clb-probe/agent/netns:{netns_ino}")
}

/// Who holds a lock name, as far as the kernel tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    /// 0 when it lives in a PID namespace we cannot see.
    pub pid: i32,
    pub uid: u32,
    /// CapEff of `/proc/<pid>/status`, when readable.
    pub cap_eff: Option<u64>,
}

impl Holder {
    /// Whether this holder can be an agent: root, or the capabilities an agent needs to load
    /// and attach its programs (pure: the decision the module doc explains).
    pub fn is_agent(&self) -> bool {
        let has = |eff: u64, cap: u32| eff & (1u64 << cap) != 0;
        self.uid == 0
            || self.cap_eff.is_some_and(|eff| {
                (has(eff, CAP_SYS_ADMIN) || has(eff, CAP_BPF)) && has(eff, CAP_NET_ADMIN)
            })
    }

    fn shown(&self) -> String {
        if self.pid > 0 {
            format!("PID {}", self.pid)
        } else {
            "PID not visible from here".to_string()
        }
    }
}

impl InstanceLock {
    /// Takes the namespace, or fails in one line naming the agent that holds it.
    pub fn acquire(netns_ino: u64) -> anyhow::Result<InstanceLock> {
        let name = lock_name(netns_ino);
        let refuse = |holder: &str| {
            anyhow::anyhow!(
                "another probe agent ({holder}) already watches this network namespace \
                 (netns inode {netns_ino}); two would attach twice and detach each other: \
                 stop it first"
            )
        };
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let (listener, own) = match UnixListener::bind_addr(&addr) {
            Ok(listener) => (listener, name.clone()),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => match holder(&addr) {
                Some(h) if h.is_agent() => return Err(refuse(&h.shown())),
                squatter => {
                    let own = format!(
                        "{name}/{}.{}",
                        std::process::id(),
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_nanos())
                    );
                    match squatter {
                        Some(h) => warn!(
                            "the agent lock @{name} is held by {} (uid {}), which has neither uid 0 nor an agent's capabilities: not an agent; locking under @{own} instead",
                            h.shown(),
                            h.uid
                        ),
                        None => warn!(
                            "the agent lock @{name} is held by a process that does not answer (not listening, or a full backlog): not an agent; locking under @{own} instead"
                        ),
                    }
                    let listener =
                        UnixListener::bind_addr(&SocketAddr::from_abstract_name(own.as_bytes())?)
                            .map_err(|e| {
                            anyhow::Error::new(e).context(format!(
                                "taking the one-agent-per-namespace lock (abstract socket @{own})"
                            ))
                        })?;
                    (listener, own)
                }
            },
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "taking the one-agent-per-namespace lock (abstract socket @{name})"
                )));
            }
        };
        // An agent may hold a fallback name (it started behind a squatter that has gone since).
        let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
        for other in lock_names_under(&unix, &name) {
            if other == own {
                continue;
            }
            let Ok(addr) = SocketAddr::from_abstract_name(other.as_bytes()) else {
                continue;
            };
            if let Some(h) = holder(&addr)
                && h.is_agent()
                && h.pid != std::process::id() as i32
            {
                return Err(refuse(&h.shown()));
            }
        }
        listener.set_nonblocking(true)?;
        Ok(InstanceLock { listener })
    }

    /// Accepts and closes connections to the lock so that later agents asking who holds it
    /// never find a full backlog.
    pub async fn serve(self) {
        let Ok(listener) = tokio::net::UnixListener::from_std(self.listener) else {
            // Without the runtime's reactor the lock still holds; only the answers stop.
            return std::future::pending().await;
        };
        loop {
            match listener.accept().await {
                Ok((stream, _)) => drop(stream),
                // Out of descriptors: the lock holds; answer again a little later.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// The abstract names in `/proc/net/unix` text that are `prefix` or start with `prefix/`
/// (each once; the kernel lists one line per socket, connected ones included). Pure.
pub fn lock_names_under(proc_net_unix: &str, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = proc_net_unix
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7)?.strip_prefix('@'))
        .filter(|n| *n == prefix || n.strip_prefix(prefix).is_some_and(|r| r.starts_with('/')))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The credentials of the process listening on `addr`; None when it cannot be asked.
fn holder(addr: &SocketAddr) -> Option<Holder> {
    // Non-blocking: a squatter that never accepts fills its backlog, and a blocking connect
    // would then wait forever. A real agent accepts at once; a full backlog is retried briefly.
    // SAFETY: socket(2) has no memory preconditions.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a socket we just created and own.
    let sock: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    let name = addr.as_abstract_name()?;
    // SAFETY: sockaddr_un is plain data.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > sun.sun_path.len() {
        return None;
    }
    for (i, b) in name.iter().enumerate() {
        sun.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        // SAFETY: a valid socket and a sockaddr_un of `len` bytes.
        let rc = unsafe { libc::connect(sock.as_raw_fd(), (&raw const sun).cast(), len) };
        if rc == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EAGAIN) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        return None;
    }
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut clen = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid socket fd, a ucred-sized buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut clen,
        )
    };
    if rc != 0 {
        return None;
    }
    let cap_eff = (cred.pid > 0)
        .then(|| std::fs::read_to_string(format!("/proc/{}/status", cred.pid)).ok())
        .flatten()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        });
    Some(Holder {
        pid: cred.pid,
        uid: cred.uid,
        cap_eff,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second lock in the same namespace fails and names this process; the first one's
    /// release frees the namespace.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn a_second_agent_is_refused_with_the_first_ones_pid() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: a holder counts as an agent only as root or with capabilities");
            return;
        }
        // An inode no real namespace has here, so a running agent does not interfere.
        let ino = u64::MAX - u64::from(std::process::id());
        let first = InstanceLock::acquire(ino).expect("first lock");
        let err = InstanceLock::acquire(ino)
            .err()
            .expect("second lock refused")
            .to_string();
        assert!(
            err.contains(&format!("PID {}", std::process::id())),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
        drop(first);
        InstanceLock::acquire(ino).expect("free again once the first is gone");
    }

    #[test]
    fn only_root_or_an_agents_capabilities_make_a_holder_an_agent() {
        let h = |uid, cap_eff| Holder {
            pid: 7,
            uid,
            cap_eff,
        };
        assert!(h(0, None).is_agent());
        assert!(h(0, Some(0)).is_agent());
        assert!(!h(65534, None).is_agent(), "caps unknown, not root");
        assert!(!h(65534, Some(0)).is_agent(), "capability-less");
        let net_admin = 1u64 << CAP_NET_ADMIN;
        assert!(!h(1000, Some(net_admin)).is_agent(), "NET_ADMIN alone");
        assert!(h(1000, Some(net_admin | 1 << CAP_BPF)).is_agent());
        assert!(h(1000, Some(net_admin | 1 << CAP_SYS_ADMIN)).is_agent());
    }

    #[test]
    fn lock_names_are_found_under_the_prefix_only() {
        let unix = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 11 @clb-probe/agent/netns:42\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 12 @clb-probe/agent/netns:42/99.123\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 13 @clb-probe/agent/netns:421\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 14 @clb-probe/agent/netns:42/99.123\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 15 /run/clb-probe/probe.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 16\n";
        assert_eq!(
            lock_names_under(unix, "clb-probe/agent/netns:42"),
            [
                "clb-probe/agent/netns:42",
                "clb-probe/agent/netns:42/99.123"
            ]
        );
    }
}
