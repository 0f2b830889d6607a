//! The only module that touches aya: load the programs, attach them, read their maps.
//!
//! Ownership (no `Mutex<Ebpf>`): [`Probe`] owns the programs and their links and lives in the
//! node-sync task, which attaches and detaches as interfaces come and go. The maps the other
//! tasks need are taken out of the `Ebpf` at load time and handed over:
//! the ring buffer to [`reader`], the address tries to the node sync, the counters to
//! [`counters::Counters`] (read at scrape time), the egress LRU to [`counters::EgressTable`].

pub mod btf;
pub mod codec;
pub mod counters;
pub mod kallsyms;
pub mod prefilter;
pub mod probe;
pub mod reader;
pub mod sizing;
pub mod tc;

pub use btf::{DropReasons, KernelBtf};
pub use probe::{AddressMaps, DropDestinations, Probe, ProbeSettings};

/// An underlying error of any kind, kept as the source of a [`KernelError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors at the kernel boundary, each naming what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "missing capabilities {missing}: run as root, or grant {missing} (the DaemonSet adds them)"
    )]
    MissingCapability { missing: String },
    #[error(
        "kernel {kernel} is too old: clb-probe needs Linux {MIN_KERNEL} or newer (BPF ring \
         buffer, CAP_BPF); run it on a newer node kernel"
    )]
    KernelTooOld { kernel: String },
    #[error("no kernel BTF at {path}: clb-probe needs a kernel built with CONFIG_DEBUG_INFO_BTF=y")]
    MissingBtf { path: String },
    #[error("kernel BTF: {what}: {source}")]
    Btf {
        what: String,
        /// The parser's or the file's error, or what was not found.
        #[source]
        source: BoxError,
    },
    #[error("this build has no eBPF programs (built with AYA_BUILD_SKIP): rebuild without it")]
    NoPrograms,
    #[error("loading the eBPF programs: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program {program}: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map {map} is missing from the object: the programs and the agent differ")]
    MissingMap { map: &'static str },
    #[error("eBPF program {program} is missing from the object: the programs and the agent differ")]
    MissingProgram { program: &'static str },
    #[error("eBPF map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("unknown interface {name:?}: it does not exist in this network namespace")]
    UnknownInterface { name: String },
    #[error("attaching to {iface} ({direction}): {source}")]
    Attach {
        iface: String,
        direction: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
}

/// The oldest kernel the agent runs on: the BPF ring buffer and CAP_BPF came in 5.8.
pub const MIN_KERNEL: &str = "5.8";

/// Refuses kernels older than [`MIN_KERNEL`] in one clear line, before anything is loaded.
/// A vendor kernel that reports an older version but has the ring buffer (a backport) passes.
pub fn check_kernel_version() -> Result<(), KernelError> {
    use aya::util::KernelVersion;
    let Ok(v) = KernelVersion::current() else {
        return Ok(());
    };
    kernel_supported(v >= KernelVersion::new(5, 8, 0), &v.to_string(), || {
        aya::sys::is_map_supported(aya::maps::MapType::RingBuf).unwrap_or(false)
    })
}

/// [`check_kernel_version`]'s decision: `ring_buffer` is asked only below 5.8.
pub fn kernel_supported(
    at_least_5_8: bool,
    release: &str,
    ring_buffer: impl FnOnce() -> bool,
) -> Result<(), KernelError> {
    if at_least_5_8 || ring_buffer() {
        Ok(())
    } else {
        Err(KernelError::KernelTooOld {
            kernel: release.to_string(),
        })
    }
}

/// The running kernel's release and whether it has tcx (>= 6.6), the attach default.
pub fn release_and_tcx() -> (String, bool) {
    use aya::util::KernelVersion;
    match KernelVersion::current() {
        Ok(v) => (v.to_string(), v >= KernelVersion::new(6, 6, 0)),
        Err(_) => ("unknown".into(), false),
    }
}

/// Linux capability numbers we need (linux/capability.h).
pub(crate) const CAP_NET_ADMIN: u32 = 12;
pub(crate) const CAP_SYS_ADMIN: u32 = 21;
pub(crate) const CAP_PERFMON: u32 = 38;
pub(crate) const CAP_BPF: u32 = 39;

/// Checks the effective capabilities before touching the kernel, so a missing one is named
/// instead of surfacing as an EPERM from deep inside a load.
pub fn check_capabilities() -> Result<(), KernelError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    // CAP_SYS_ADMIN covers BPF and PERFMON on every kernel; BPF + PERFMON alone need >= 5.8.
    if !has(CAP_SYS_ADMIN) {
        if !has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if !has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(KernelError::MissingCapability {
            missing: missing.join(", "),
        })
    }
}

/// Inode of the calling thread's network namespace: the drop program ignores other namespaces.
pub fn current_netns_inode() -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/thread-self/ns/net")
        .or_else(|_| std::fs::metadata("/proc/self/ns/net"))
        .map(|m| m.ino() as u32)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_below_5_8_are_refused_in_one_line() {
        assert!(kernel_supported(true, "6.1.0", || unreachable!()).is_ok());
        // 5.4 without a ring buffer: refused, naming the minimum.
        let err = kernel_supported(false, "5.4.0", || false).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("5.4.0") && msg.contains("5.8 or newer"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        // A 4.18 vendor kernel with the ring buffer backported runs.
        assert!(kernel_supported(false, "4.18.0", || true).is_ok());
    }
}
