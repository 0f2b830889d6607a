//! The agent that goes into an image: the release build for an architecture (arm64
//! cross-compiled), the eBPF object it embeds, and that object's executable sections (compared
//! across architectures before the images are assembled).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{arch::Arch, workspace_root};

/// The release agent for `arch`: the host's in target/release, arm64 cross-compiled.
pub fn release_build(arch: Arch) -> anyhow::Result<PathBuf> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "--release", "--locked", "-p", "clb-probe"])
        .current_dir(workspace_root());
    if arch != Arch::host() {
        cmd.args(["--target", arch.rust_target()]);
    }
    eprintln!("image: {cmd:?}");
    let status = cmd.status()?;
    if !status.success() {
        bail!("the {} release build failed", arch.name());
    }
    Ok(if arch == Arch::host() {
        workspace_root().join("target/release/probe")
    } else {
        arch.release_binary()
    })
}

/// The eBPF object embedded in the latest release build for `arch` (build.rs's OUT_DIR).
pub fn ebpf_object(arch: Arch) -> anyhow::Result<PathBuf> {
    let build = if arch == Arch::host() {
        workspace_root().join("target/release/build")
    } else {
        workspace_root()
            .join("target")
            .join(arch.rust_target())
            .join("release/build")
    };
    std::fs::read_dir(&build)
        .with_context(|| format!("reading {}", build.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("clb-probe-"))
        .map(|e| e.path().join("out/probe"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .with_context(|| format!("no eBPF object under {}", build.display()))
}

/// The sections of an eBPF object (ELF64, little endian) that the kernel executes or loads
/// as they are: programs, their relocations, maps, read-only data, license, symbols; by name.
/// Left out: `.BTF`/`.BTF.ext` and DWARF, which name the userspace target (aya-ebpf's helper
/// bindings live in a module per target architecture, `x86_64::bindings` vs
/// `aarch64::bindings`, identical in content) and so differ between the two builds.
pub fn ebpf_code(object: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let d = std::fs::read(object).with_context(|| format!("reading {}", object.display()))?;
    let bad = || anyhow::anyhow!("{} is not a 64-bit little-endian ELF", object.display());
    let u16_at = |o: usize| -> anyhow::Result<usize> {
        Ok(u16::from_le_bytes(d.get(o..o + 2).ok_or_else(bad)?.try_into()?) as usize)
    };
    let u32_at = |o: usize| -> anyhow::Result<usize> {
        Ok(u32::from_le_bytes(d.get(o..o + 4).ok_or_else(bad)?.try_into()?) as usize)
    };
    let u64_at = |o: usize| -> anyhow::Result<usize> {
        Ok(u64::from_le_bytes(d.get(o..o + 8).ok_or_else(bad)?.try_into()?) as usize)
    };
    if d.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err(bad());
    }
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?);
    let header = |i: usize| shoff + i * shentsize;
    let names = u64_at(header(shstrndx) + 0x18)?;
    let mut sections = Vec::new();
    for i in 0..shnum {
        let h = header(i);
        let name_at = names + u32_at(h)?;
        let end = d[name_at..].iter().position(|&b| b == 0).ok_or_else(bad)?;
        let name = String::from_utf8_lossy(&d[name_at..name_at + end]).into_owned();
        if name.starts_with(".debug") || name.starts_with(".rel.debug") || name.starts_with(".BTF")
        {
            continue;
        }
        const SHT_NOBITS: usize = 8;
        let (kind, offset, size) = (u32_at(h + 4)?, u64_at(h + 0x18)?, u64_at(h + 0x20)?);
        let bytes = if kind == SHT_NOBITS {
            size.to_le_bytes().to_vec()
        } else {
            d.get(offset..offset + size).ok_or_else(bad)?.to_vec()
        };
        sections.push((name, bytes));
    }
    Ok(sections)
}
