//! The tiny initramfs: a static busybox, the modules that reach the 9p shares and overlayfs, and
//! `init` ([`INIT`]) that mounts the guest's root and `switch_root`s into it. Written as a newc
//! cpio archive by hand (no `cpio` on the host, and device nodes need no root this way).

use std::path::Path;

use anyhow::{Context as _, bail};

use super::kernel::{self, Kernel};

/// The initramfs's `/init` (busybox sh).
pub const INIT: &str = include_str!("init.sh");

/// Modules the initramfs loads, with their dependencies (the Debian kernel has them as modules).
pub const BOOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// Module paths from `modprobe --show-depends` output, in load order, without repeats
/// (`builtin` lines need nothing).
pub fn parse_show_depends(text: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("insmod "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|p| seen.insert(p.to_string()))
        .map(str::to_string)
        .collect()
}

/// True when `elf` is an ELF executable without a program interpreter (statically linked).
pub fn is_static_elf(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return false; // not ELF64 little-endian
    }
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into().unwrap_or_default()) as usize;
    let phentsize = u16_at(54);
    let phnum = u16_at(56);
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
            .is_none_or(|t| t != PT_INTERP)
    })
}

/// A newc ("070701") cpio archive built in memory.
#[derive(Default)]
pub struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
        self.ino += 1;
        let namesize = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0, // mtime
            data.len(),
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            namesize,
            0, // check
        );
        self.buf.extend_from_slice(header.as_bytes());
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[], (0, 0));
    }

    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, data, (0, 0));
    }

    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) {
        self.entry(name, 0o020000 | perm, &[], (major, minor));
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], (0, 0));
        // The kernel reads the archive in 512-byte blocks happily either way; keep it tidy.
        while !self.buf.len().is_multiple_of(512) {
            self.buf.push(0);
        }
        self.buf
    }
}

/// The host's static busybox (busybox-static).
fn busybox() -> anyhow::Result<Vec<u8>> {
    for p in ["/usr/bin/busybox", "/bin/busybox", "/usr/sbin/busybox"] {
        if let Ok(bytes) = std::fs::read(p) {
            if is_static_elf(&bytes) {
                return Ok(bytes);
            }
            bail!("{p} is dynamically linked: install busybox-static (cargo xtask setup)");
        }
    }
    bail!("no busybox on the host: install busybox-static (cargo xtask setup)")
}

/// A module's bytes and file name, decompressed when the kernel ships it compressed (trixie's
/// `.ko.xz`): busybox's insmod takes plain ELF only.
fn read_module(path: &Path, file: &str) -> anyhow::Result<(String, Vec<u8>)> {
    let tool = if file.ends_with(".ko.xz") {
        "xz"
    } else if file.ends_with(".ko.zst") {
        "zstd"
    } else if file.ends_with(".ko.gz") {
        "gzip"
    } else {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        return Ok((file.to_string(), data));
    };
    let out = std::process::Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("starting {tool} for {}", path.display()))?;
    if !out.status.success() {
        bail!(
            "{tool} -dc {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let plain = file.rsplit_once('.').map_or(file, |(base, _)| base);
    Ok((plain.to_string(), out.stdout))
}

/// Builds the initramfs for `kernel` into `out`.
pub fn build(kernel: &Kernel, out: &Path) -> anyhow::Result<()> {
    let show = kernel::kmod(&kernel.root, "modprobe")
        .arg("-d")
        .arg(kernel.root.join("usr"))
        .args(["-S", &kernel.release, "--show-depends", "-a"])
        .args(BOOT_MODULES)
        .output()
        .context("running the unpacked kmod (modprobe --show-depends)")?;
    if !show.status.success() {
        bail!(
            "modprobe --show-depends {BOOT_MODULES:?} failed: {}",
            String::from_utf8_lossy(&show.stderr).trim()
        );
    }
    let listing = String::from_utf8_lossy(&show.stdout);
    let modules = parse_show_depends(&listing);
    if modules.is_empty() && !listing.contains("builtin") {
        bail!("modprobe --show-depends listed no module for {BOOT_MODULES:?}");
    }

    let mut cpio = Cpio::default();
    for d in [
        "bin", "dev", "proc", "sys", "modules", "newroot", "host", "pkgs", "rw",
    ] {
        cpio.dir(d);
    }
    cpio.char_dev("dev/console", 0o600, 5, 1);
    cpio.char_dev("dev/null", 0o666, 1, 3);
    let bb = match kernel.arch {
        crate::arch::Arch::Amd64 => busybox()?,
        // The arm64 root's busybox-static (the host's is amd64).
        crate::arch::Arch::Arm64 => {
            let p = kernel.root.join("usr/bin/busybox");
            let b = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            if !is_static_elf(&b) {
                bail!("{} is not a static busybox", p.display());
            }
            b
        }
    };
    cpio.file("bin/busybox", 0o755, &bb);
    cpio.file("init", 0o755, INIT.as_bytes());
    let mut order = String::new();
    for (i, m) in modules.iter().enumerate() {
        let path = Path::new(m);
        let file = path
            .file_name()
            .context("module path without a file name")?
            .to_string_lossy();
        let (file, data) = read_module(path, &file)?;
        let name = format!("{i:02}-{file}");
        cpio.file(&format!("modules/{name}"), 0o644, &data);
        order.push_str(&name);
        order.push('\n');
    }
    cpio.file("modules/order", 0o644, order.as_bytes());
    std::fs::write(out, cpio.finish()).with_context(|| format!("writing {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_depends_in_order_without_repeats() {
        let out = "\
insmod /r/usr/lib/modules/6.1.0-56-amd64/kernel/drivers/virtio/virtio_ring.ko 
insmod /r/usr/lib/modules/6.1.0-56-amd64/kernel/drivers/virtio/virtio.ko 
insmod /r/usr/lib/modules/6.1.0-56-amd64/kernel/drivers/virtio/virtio_pci.ko 
insmod /r/usr/lib/modules/6.1.0-56-amd64/kernel/drivers/virtio/virtio_ring.ko 
builtin crc32c
insmod /r/usr/lib/modules/6.1.0-56-amd64/kernel/net/9p/9pnet.ko debug=1
";
        let m = parse_show_depends(out);
        let names: Vec<_> = m.iter().map(|p| p.rsplit('/').next().unwrap()).collect();
        assert_eq!(
            names,
            ["virtio_ring.ko", "virtio.ko", "virtio_pci.ko", "9pnet.ko"]
        );
    }

    #[test]
    fn newc_layout() {
        let mut c = Cpio::default();
        c.file("init", 0o755, b"hello");
        c.char_dev("dev/console", 0o600, 5, 1);
        let b = c.finish();
        assert_eq!(&b[..6], b"070701");
        // mode of the first entry
        assert_eq!(&b[14..22], b"000081ed");
        // file size 5, name size 5 ("init\0")
        assert_eq!(&b[54..62], b"00000005");
        assert_eq!(&b[94..102], b"00000005");
        assert_eq!(&b[110..115], b"init\0");
        // header + name = 115, padded to 116; data at 116
        assert_eq!(&b[116..121], b"hello");
        let second = 124;
        assert_eq!(&b[second..second + 6], b"070701");
        assert_eq!(&b[second + 14..second + 22], b"00002180");
        assert_eq!(&b[second + 78..second + 86], b"00000005"); // rdevmajor
        assert_eq!(&b[second + 86..second + 94], b"00000001"); // rdevminor
        assert!(b.windows(10).any(|w| w == b"TRAILER!!!"));
        assert_eq!(b.len() % 512, 0);
    }

    #[test]
    fn static_elf_detection() {
        // The test binary itself is dynamically linked (glibc).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(!is_static_elf(&me));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        // A minimal ELF64 header with no program headers counts as static.
        let mut h = vec![0u8; 64];
        h[..6].copy_from_slice(b"\x7fELF\x02\x01");
        assert!(is_static_elf(&h));
    }
}
