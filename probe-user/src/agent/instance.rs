//! One agent per network namespace.
//!
//! Two agents in one namespace would attach twice, and the one that exits would remove what
//! the other relies on. The lock is an abstract unix socket: abstract names are per network
//! namespace, need no writable filesystem (the DaemonSet's root is read-only), and vanish with
//! the process however it dies (SIGKILL included), so a stale lock cannot exist. The name
//! carries the namespace's inode for whoever looks at `ss -xl`. A second agent connects to
//! it and names the first one's PID (SO_PEERCRED, as seen from its own PID namespace).

use std::{
    io,
    os::{
        fd::AsRawFd as _,
        linux::net::SocketAddrExt as _,
        unix::net::{SocketAddr, UnixListener, UnixStream},
    },
};

/// Held for the agent's lifetime; dropping it releases the namespace.
pub struct InstanceLock {
    listener: UnixListener,
}

/// The abstract socket name for the namespace with inode `netns_ino`.
pub fn lock_name(netns_ino: u64) -> String {
    format!("clb-probe/agent/netns:{netns_ino}")
}

impl InstanceLock {
    /// Takes the namespace, or fails in one line naming the agent that holds it.
    pub fn acquire(netns_ino: u64) -> anyhow::Result<InstanceLock> {
        let name = lock_name(netns_ino);
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        match UnixListener::bind_addr(&addr) {
            Ok(listener) => {
                listener.set_nonblocking(true)?;
                Ok(InstanceLock { listener })
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                let holder = match holder_pid(&addr) {
                    Some(pid) if pid > 0 => format!("PID {pid}"),
                    // Its PID namespace is not ours (another container).
                    Some(_) => "PID not visible from here".to_string(),
                    None => "PID unknown".to_string(),
                };
                anyhow::bail!(
                    "another probe agent ({holder}) already watches this network namespace \
                     (netns inode {netns_ino}); two would attach twice and detach each other: \
                     stop it first"
                )
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!(
                "taking the one-agent-per-namespace lock (abstract socket @{name})"
            ))),
        }
    }

    /// Accepts and closes connections to the lock so that later agents asking who holds it
    /// never find a full backlog (their connect would block).
    pub async fn serve(self) {
        let Ok(listener) = tokio::net::UnixListener::from_std(self.listener) else {
            // Without the runtime's reactor the lock still holds; only the answers stop.
            return std::future::pending().await;
        };
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        }
    }
}

/// The PID of the process listening on `addr` (0 when it lives in a PID namespace we cannot see).
fn holder_pid(addr: &SocketAddr) -> Option<i32> {
    let stream = UnixStream::connect_addr(addr).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid socket fd, a ucred-sized buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second lock in the same namespace fails and names this process; the first one's
    /// release frees the namespace.
    #[test]
    fn a_second_agent_is_refused_with_the_first_ones_pid() {
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
}
