//! Exclusive use of the lab across processes: the lock, and the guard that brings the lab up
//! and always tears it down.

use super::{Context, KubeProxyMode, Lab, Result, UpOptions, Variants, bail};

/// The lock file that serializes users of the (one, fixed) lab across processes.
/// (`/run/clb-lab.lock` itself is left to people who wrap whole test runs in `flock`.)
pub const LOCK_PATH: &str = "/run/clb-lab.guard.lock";

/// An exclusive hold on the lab (flock on [`LOCK_PATH`]), released on drop. Tests in different
/// binaries (or threads) that use the lab take it, so they wait for each other instead of
/// tearing down each other's lab. [`LabGuard`] holds one.
#[derive(Debug)]
pub struct LabLock {
    _file: std::fs::File,
}

impl LabLock {
    /// Blocks until the lab is free.
    pub fn acquire() -> Result<LabLock> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_PATH)
            .with_context(|| format!("opening {LOCK_PATH}"))?;
        loop {
            // SAFETY: flock on a valid fd.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(LabLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                bail!("flock {LOCK_PATH}: {e}");
            }
        }
    }
}

/// Brings the lab up (after removing any leftover) and tears it down on drop, also when the
/// test holding it panics. Holds a [`LabLock`] from before `up` until after the teardown.
#[derive(Debug)]
pub struct LabGuard {
    lab: Lab,
    _lock: LabLock,
}

impl LabGuard {
    /// Takes the [`LabLock`], then `Lab::down()` and `Lab::up(variants)` in the mode of
    /// [`MODE_ENV`] (iptables unless it says `ipvs`).
    pub fn up(variants: &Variants) -> Result<LabGuard> {
        LabGuard::up_with(variants, &UpOptions::default())
    }

    pub fn up_with(variants: &Variants, opts: &UpOptions) -> Result<LabGuard> {
        LabGuard::up_in(KubeProxyMode::from_env()?, variants, opts)
    }

    /// A lab test's start: the lab up in `variants` (panics when it cannot come up), or None
    /// where the test cannot run (not root; it prints its skip line), so the test returns.
    pub fn for_test(test: &str, variants: &Variants) -> Option<LabGuard> {
        super::require_root(test).then(|| LabGuard::up(variants).expect("lab up"))
    }

    /// [`LabGuard::for_test`] in an explicit kube-proxy mode.
    pub fn for_test_in(test: &str, mode: KubeProxyMode, variants: &Variants) -> Option<LabGuard> {
        super::require_root(test).then(|| {
            LabGuard::up_in(mode, variants, &UpOptions::default())
                .unwrap_or_else(|e| panic!("lab up ({} mode): {e:?}", mode.name()))
        })
    }

    /// [`LabGuard::for_test_in`] nftables mode with the default variants: the nftables tests'
    /// start.
    pub fn for_test_nftables(test: &str) -> Option<LabGuard> {
        LabGuard::for_test_in(test, KubeProxyMode::Nftables, &Variants::default())
    }

    /// [`LabGuard::for_test_in`] with the default variants and the lab's IPv6 layer added (the
    /// dual-stack lab; panics when it cannot be added).
    pub fn for_test_dual_stack(test: &str, mode: KubeProxyMode) -> Option<LabGuard> {
        let lab = LabGuard::for_test_in(test, mode, &Variants::default())?;
        lab.add_ipv6()
            .unwrap_or_else(|e| panic!("dual-stack layer ({} mode): {e:?}", mode.name()));
        Some(lab)
    }

    /// The lab in iptables mode with the LB IP bound nowhere on the node: kube-proxy's iptables
    /// mode binds none (the lab's `vip_bound` stands in for IPVS mode's kube-ipvs0 and for
    /// announcers), so a pod's call to it is forwarded through the rules.
    pub fn up_iptables_lb_ip_unbound() -> Result<LabGuard> {
        let variants = Variants {
            vip_bound: false,
            ..Variants::default()
        };
        let lab = LabGuard::up_in(KubeProxyMode::Iptables, &variants, &UpOptions::default())?;
        lab.set_all(&variants).context("the LB IP unbound")?;
        Ok(lab)
    }

    /// [`LabGuard::up_iptables_lb_ip_unbound`] as a lab test's start ([`LabGuard::for_test`]).
    pub fn for_test_iptables_lb_ip_unbound(test: &str) -> Option<LabGuard> {
        super::require_root(test).then(|| {
            LabGuard::up_iptables_lb_ip_unbound().expect("lab up (iptables mode, LB IP unbound)")
        })
    }

    /// [`LabGuard::up_with`] in an explicit kube-proxy mode.
    pub fn up_in(mode: KubeProxyMode, variants: &Variants, opts: &UpOptions) -> Result<LabGuard> {
        let lock = LabLock::acquire()?;
        Lab::down().context("removing a leftover lab")?;
        Ok(LabGuard {
            lab: Lab::up_in(mode, variants, opts)?,
            _lock: lock,
        })
    }
}

impl std::ops::Deref for LabGuard {
    type Target = Lab;

    fn deref(&self) -> &Lab {
        &self.lab
    }
}

impl std::ops::DerefMut for LabGuard {
    fn deref_mut(&mut self) -> &mut Lab {
        &mut self.lab
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Err(e) = Lab::down() {
            eprintln!("clb-lab: teardown failed: {e:#}");
        }
    }
}
