//! What the running kernel's BTF tells us: struct offsets for the drop program and the names of
//! `enum skb_drop_reason`. Nothing here is baked for one kernel: reason numbers and offsets
//! change between versions (6.1 has no `SKB_CONSUMED`; `IP_LOCAL_SOURCE` is 89 on 6.18).

use std::{collections::BTreeMap, path::Path};

use btf_rs::{Backend, Btf, Type};
use probe_common::KernelOffsets;
use probe_contract::record::DropReason;

use super::KernelError;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The kernel facts the agent needs from BTF.
#[derive(Clone, Debug, Default)]
pub struct KernelBtf {
    pub offsets: KernelOffsets,
    /// `enum skb_drop_reason` value -> name without the `SKB_DROP_REASON_` prefix.
    pub drop_reasons: DropReasons,
    /// Arguments of the `kfree_skb` tracepoint (its `btf_trace_kfree_skb` prototype without
    /// the leading `void *`): 2 before 5.17 (skb, location), 3 or more with the reason.
    /// None when the BTF does not describe it.
    pub kfree_skb_args: Option<usize>,
}

/// Drop reason names of the running kernel.
#[derive(Clone, Debug, Default)]
pub struct DropReasons {
    names: BTreeMap<u32, String>,
}

impl DropReasons {
    pub fn from_pairs(pairs: impl IntoIterator<Item = (u32, String)>) -> Self {
        Self {
            names: pairs.into_iter().collect(),
        }
    }

    /// The name of a reason, or `UNKNOWN_<n>` for a value this kernel's BTF does not list, or
    /// [`DropReason::UNREPORTED`] on a kernel without drop reasons (< 5.17).
    pub fn name(&self, code: u32) -> String {
        if self.names.is_empty() {
            return DropReason::UNREPORTED.to_string();
        }
        self.names
            .get(&code)
            .cloned()
            .unwrap_or_else(|| format!("UNKNOWN_{code}"))
    }

    /// The value of a named reason on this kernel, if it has one.
    pub fn code(&self, name: &str) -> Option<u32> {
        self.names
            .iter()
            .find_map(|(code, n)| (n == name).then_some(*code))
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

impl KernelBtf {
    /// Whether the `kfree_skb` tracepoint passes a drop reason (kernels >= 5.17). Unknown
    /// prototypes count as "yes" when the kernel has the reason enum.
    pub fn kfree_skb_has_reason(&self) -> bool {
        match self.kfree_skb_args {
            Some(n) => n >= 3,
            None => !self.drop_reasons.is_empty(),
        }
    }

    /// Reads the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
    pub fn load() -> Result<Self, KernelError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    pub fn from_file(path: &Path) -> Result<Self, KernelError> {
        if !path.exists() {
            return Err(KernelError::MissingBtf {
                path: path.display().to_string(),
            });
        }
        let btf = open_btf(path)?;
        let off = |ty: &str, path: &[&str]| -> Result<u32, KernelError> {
            member_offset(&btf, ty, path).ok_or_else(|| KernelError::Btf {
                what: format!("finding {ty}.{}", path.join(".")),
                source: "not in this kernel's BTF".into(),
            })
        };
        let offsets = KernelOffsets {
            skb_head: off("sk_buff", &["head"])?,
            skb_network_header: off("sk_buff", &["network_header"])?,
            skb_dev: off("sk_buff", &["dev"])?,
            skb_iif: off("sk_buff", &["skb_iif"])?,
            dev_nd_net: off("net_device", &["nd_net", "net"])?,
            net_ns_inum: off("net", &["ns", "inum"])?,
            valid: 1,
            skb_tail: off("sk_buff", &["tail"])?,
            // A plain member after the list union on 5.10, 6.12 and 6.18 alike (read from
            // their BTF); `skc_net` is `possible_net_t` there, one pointer, the same path as
            // `nd_net` above.
            skb_sk: off("sk_buff", &["sk"])?,
            sk_net: off("sock", &["__sk_common", "skc_net", "net"])?,
        };
        Ok(Self {
            offsets,
            drop_reasons: drop_reasons(&btf),
            kfree_skb_args: tracepoint_args(&btf, "kfree_skb"),
        })
    }
}

/// Opens `path` without parsing all of it: btf-rs's mmap backend walks the type section once
/// and looks names up on demand, so the few look-ups here take a few milliseconds, where its
/// default backend's full parse (every name hashed) took 226 of the 339 ms to ready
/// (BENCHMARKS.md, footprint). Older kernels cannot map `/sys/kernel/btf/vmlinux` (kernfs
/// refuses): the file is then copied into a memfd and that is mapped; nothing is left behind,
/// the memfd goes with its last reference.
fn open_btf(path: &Path) -> Result<Btf, KernelError> {
    let err = |e: super::BoxError| KernelError::Btf {
        what: format!("parsing {}", path.display()),
        source: e,
    };
    if let Ok(btf) = Btf::from_file_with_backend(path, Backend::Mmap) {
        return Ok(btf);
    }
    let bytes = std::fs::read(path).map_err(|e| err(e.into()))?;
    let copy = memfd_with(&bytes).map_err(|e| err(format!("copying it to a memfd: {e}").into()))?;
    let via = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&copy));
    Btf::from_file_with_backend(&via, Backend::Mmap).map_err(|e| err(e.into()))
}

/// An anonymous in-memory file holding `bytes`.
fn memfd_with(bytes: &[u8]) -> std::io::Result<std::fs::File> {
    use std::{io::Write as _, os::fd::FromRawFd as _};

    // SAFETY: a NUL-terminated name and valid flags; the returned descriptor is checked and
    // then owned by the File.
    let fd = unsafe { libc::memfd_create(c"clb-probe-btf".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(bytes)?;
    Ok(file)
}

/// Number of arguments a tracepoint passes its programs: the parameters of its
/// `btf_trace_<name>` typedef (a pointer to a function prototype whose first parameter is the
/// tracepoint's own `void *` data).
fn tracepoint_args(btf: &Btf, name: &str) -> Option<usize> {
    let ty = btf
        .resolve_types_by_name(&format!("btf_trace_{name}"))
        .ok()?
        .into_iter()
        .find(|t| matches!(t, Type::Typedef(_)))?;
    let Type::Ptr(ptr) = strip_modifiers(btf, ty)? else {
        return None;
    };
    match strip_modifiers(btf, btf.resolve_chained_type(&ptr).ok()?)? {
        Type::FuncProto(proto) => proto.parameters.len().checked_sub(1),
        _ => None,
    }
}

/// Names of `enum skb_drop_reason`, prefix stripped. Empty on kernels without it (< 5.17).
fn drop_reasons(btf: &Btf) -> DropReasons {
    let Ok(types) = btf.resolve_types_by_name("skb_drop_reason") else {
        return DropReasons::default();
    };
    let mut names = BTreeMap::new();
    for ty in types {
        if let Type::Enum(e) = ty {
            for m in &e.members {
                if let Ok(name) = btf.resolve_name(m) {
                    let short = name.strip_prefix("SKB_DROP_REASON_").unwrap_or(&name);
                    names.insert(m.val(), short.to_string());
                }
            }
        }
    }
    DropReasons { names }
}

/// Byte offset of `path` (a chain of member names) inside struct `ty`, descending through
/// anonymous structs and unions (sk_buff keeps most fields in anonymous groups).
fn member_offset(btf: &Btf, ty: &str, path: &[&str]) -> Option<u32> {
    let root = btf
        .resolve_types_by_name(ty)
        .ok()?
        .into_iter()
        .find(|t| matches!(t, Type::Struct(_)))?;
    let mut current = root;
    let mut total_bits = 0u32;
    for name in path {
        let Type::Struct(s) = &current else {
            return None;
        };
        let (bits, member_ty) = find_member(btf, s, name)?;
        total_bits += bits;
        current = strip_modifiers(btf, member_ty)?;
    }
    total_bits.is_multiple_of(8).then_some(total_bits / 8)
}

/// Finds `name` in a struct or union, recursing into anonymous members. Returns the bit offset
/// and the member's type.
fn find_member(btf: &Btf, s: &btf_rs::Struct, name: &str) -> Option<(u32, Type)> {
    for m in &s.members {
        let member_name = btf.resolve_name(m).unwrap_or_default();
        let member_ty = btf.resolve_chained_type(m).ok()?;
        if member_name == name {
            return Some((m.bit_offset(), member_ty));
        }
        if member_name.is_empty()
            && let Some(Type::Struct(inner) | Type::Union(inner)) = strip_modifiers(btf, member_ty)
            && let Some((bits, ty)) = find_member(btf, &inner, name)
        {
            return Some((m.bit_offset() + bits, ty));
        }
    }
    None
}

/// Follows typedefs and qualifiers to the underlying type.
fn strip_modifiers(btf: &Btf, mut ty: Type) -> Option<Type> {
    loop {
        ty = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t).ok()?,
            Type::Const(t) => btf.resolve_chained_type(t).ok()?,
            Type::Volatile(t) => btf.resolve_chained_type(t).ok()?,
            Type::Restrict(t) => btf.resolve_chained_type(t).ok()?,
            Type::TypeTag(t) => btf.resolve_chained_type(t).ok()?,
            _ => return Some(ty),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kernel BTF, loaded; `None` where it has none (the test says it skips).
    fn running_kernel_btf() -> Option<KernelBtf> {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("skipping: no {VMLINUX_BTF}");
            return None;
        }
        Some(KernelBtf::load().expect("BTF"))
    }

    /// Reads this machine's BTF: the fields the drop program needs exist and are sane.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn reads_running_kernel_btf() {
        let Some(k) = running_kernel_btf() else {
            return;
        };
        let o = k.offsets;
        assert_eq!(o.valid, 1);
        // sk_buff.dev sits in the first cache line; head and network_header much later.
        assert!(o.skb_dev < 64, "{o:?}");
        assert!(
            o.skb_head > o.skb_dev && o.skb_network_header > o.skb_dev,
            "{o:?}"
        );
        // sk_buff.sk follows the list union, still in the first cache line; a socket's
        // namespace pointer sits inside its sock_common (136 bytes on 64-bit kernels).
        assert!(o.skb_sk > o.skb_dev && o.skb_sk < 64, "{o:?}");
        assert!(o.sk_net > 0 && o.sk_net < 136, "{o:?}");
        assert!(k.drop_reasons.len() > 10);
        assert!(k.drop_reasons.code("NOT_SPECIFIED").is_some());
        assert!(k.drop_reasons.code("NO_SOCKET").is_some());
        assert!(k.drop_reasons.name(u32::MAX).starts_with("UNKNOWN_"));
        // 6.18: (skb, location, reason, rx_sk).
        assert!(k.kfree_skb_args.is_some_and(|n| n >= 3), "{k:?}");
        assert!(k.kfree_skb_has_reason());
    }

    /// The memfd copy (the path older kernels take) reads the same facts as the direct map.
    #[test]
    #[allow(clippy::print_stdout, reason = "a test's diagnostics")]
    fn memfd_copy_reads_the_same_btf() {
        let Some(direct) = running_kernel_btf() else {
            return;
        };
        let bytes = std::fs::read(VMLINUX_BTF).expect("reading BTF");
        let copy = memfd_with(&bytes).expect("memfd");
        let via = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&copy));
        let copied = KernelBtf::from_file(Path::new(&via)).expect("BTF from the memfd");
        assert_eq!(
            format!("{:?}", direct.offsets),
            format!("{:?}", copied.offsets)
        );
        assert_eq!(direct.drop_reasons.len(), copied.drop_reasons.len());
        assert_eq!(direct.kfree_skb_args, copied.kfree_skb_args);
    }

    #[test]
    fn missing_btf_is_a_clear_error() {
        let err = KernelBtf::from_file(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/vmlinux"), "{err}");
    }
}
