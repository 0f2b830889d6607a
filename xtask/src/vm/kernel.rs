//! The guests' kernels and tools: Debian packages *downloaded* (`apt-get download`) and
//! unpacked (`dpkg -x`) into a cache folder, never installed on the host.
//!
//! The unpacked tree is the guest's package layer: an overlayfs lower layer above the host's
//! `/`. Debian's root is merged-/usr, so `bin`, `sbin` and `lib` are folded into `usr/` and
//! `depmod` runs on `usr/lib/modules` (with the unpacked kmod, so the host needs none).
//!
//! The kernels ([`KERNELS`]) come from their own Debian suites (bullseye 5.10, bookworm 6.1,
//! trixie 6.12) on the mirror this machine's apt already uses, through a private apt
//! configuration per suite (its own sources list, lists and cache folders under the VM cache):
//! the system's apt state is never touched. The tools (kmod, ipvsadm, iptables, bpftool, ...)
//! stay this machine's release, from its own apt.
//!
//! Pinning: each [`KernelSpec`] names a package and version. Debian's archive keeps only the
//! newest build of each package name, so once a pinned ABI is superseded it cannot be
//! downloaded any more. A machine that has it cached keeps using it; a machine that has not
//! falls back to the newest image of the same series that the suite's `linux-image-amd64`
//! depends on, with a loud warning naming the constants to update (results must not change
//! silently, but a Debian point release must not break CI either).

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::apt::{
    SuiteApt, apt_depends, apt_update, closure, crate_is_root, host_installed, output,
    parse_depends, parse_policy_candidate, parse_policy_versions, say,
};

/// One kernel of the VM matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSpec {
    /// What `--kernel` calls it, e.g. `5.10`.
    pub name: &'static str,
    /// The Debian suite that ships it.
    pub suite: &'static str,
    /// The pinned image package (update together with `version`).
    pub package: &'static str,
    /// The pinned Debian version of `package`.
    pub version: &'static str,
    /// A fallback image must start with this.
    pub series: &'static str,
}

/// The kernels the VM tier proves, oldest first.
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        name: "5.10",
        suite: "bullseye",
        package: "linux-image-5.10.0-46-amd64",
        version: "5.10.262-1",
        series: "linux-image-5.10.",
    },
    KernelSpec {
        name: "6.1",
        suite: "bookworm",
        package: "linux-image-6.1.0-56-amd64",
        version: "6.1.192-2",
        series: "linux-image-6.1.",
    },
    KernelSpec {
        name: "6.12",
        suite: "trixie",
        package: "linux-image-6.12.117+deb13-amd64",
        version: "6.12.117-1",
        series: "linux-image-6.12.",
    },
];

/// The kernel of [`KERNELS`] called `name`.
pub fn spec(name: &str) -> Option<&'static KernelSpec> {
    KERNELS.iter().find(|k| k.name == name)
}

/// The meta package that names a suite's current image package.
const KERNEL_META: &str = "linux-image-amd64";

/// What the guest needs beyond the host's userland (the package layer shadows the host's copy,
/// so these are there even when the host lacks them). Their dependencies are added unless the
/// host has them installed.
pub const GUEST_PACKAGES: &[&str] = &[
    "kmod",
    "ipvsadm",
    "iptables",
    "libip4tc2",
    "libip6tc2",
    "libxtables12",
    "libnftnl11",
    "libmnl0",
    "libnetfilter-conntrack3",
    "libnfnetlink0",
    "conntrack",
    "bpftool",
    "iproute2",
];

/// Bump when the layout of a cache entry changes, so old entries are rebuilt.
const CACHE_FORMAT: u32 = 1;

/// One kernel, unpacked and ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// e.g. `linux-image-6.1.0-56-amd64`.
    pub package: String,
    /// e.g. `6.1.192-2`.
    pub version: String,
    /// `uname -r` of the guest, e.g. `6.1.0-56-amd64`.
    pub release: String,
    /// What QEMU boots: the decompressed ELF `vmlinux` (PVH entry, skips the decompressor,
    /// about 4 s faster under TCG) or, when it cannot be extracted, the bzImage.
    pub image: PathBuf,
    /// The package layer (contains `usr/`), exported to the guest as its own 9p share.
    pub root: PathBuf,
    /// The guest's architecture (the arm64 root also brings the initramfs's busybox).
    pub arch: crate::arch::Arch,
}

/// The compressed kernel inside a bzImage: its byte range and the command that decompresses it.
/// The boot protocol header gives `setup_sects` (0x1f1), `payload_offset` (0x248) and
/// `payload_length` (0x24c); the payload ends with the decompressed size (le32).
pub fn bzimage_payload(bz: &[u8]) -> Option<(std::ops::Range<usize>, &'static str, u32)> {
    if bz.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let setup_sects = match *bz.get(0x1f1)? {
        0 => 4,
        n => n as usize,
    };
    let le32 = |o: usize| {
        bz.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let start = (setup_sects + 1) * 512 + le32(0x248)? as usize;
    let end = start.checked_add(le32(0x24c)? as usize)?;
    let payload = bz.get(start..end)?;
    let size = le32(end - 4)?;
    let tool = if payload.starts_with(b"\xfd7zXZ\x00") {
        "xz"
    } else if payload.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "zstd"
    } else if payload.starts_with(&[0x1f, 0x8b]) {
        "gzip"
    } else {
        return None;
    };
    Some((start..end, tool, size))
}

/// Decompresses the bzImage's payload into an ELF vmlinux.
fn extract_vmlinux(bzimage: &Path, out: &Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    let bz = std::fs::read(bzimage)?;
    let (range, tool, size) =
        bzimage_payload(&bz).context("not a bzImage with an xz/zstd/gzip payload")?;
    let mut args = vec!["-dc"];
    if tool == "xz" {
        // The payload ends with the size word, which xz would take for a second stream.
        args.push("--single-stream");
    }
    let mut child = Command::new(tool)
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::fs::File::create(out)?)
        .spawn()
        .with_context(|| format!("starting {tool}"))?;
    let mut stdin = child.stdin.take().context("stdin")?;
    // The payload ends with the decompressed size (le32), which is no part of the compressed
    // stream: zstd fails on it as trailing garbage (trixie's kernel is zstd-compressed).
    let data = bz[range.start..range.end.saturating_sub(4).max(range.start)].to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&data));
    let status = child.wait()?;
    let _ = feeder.join();
    let got = std::fs::metadata(out)?.len();
    let mut magic = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open(out)?, &mut magic)?;
    if !status.success() || got != u64::from(size) || &magic != b"\x7fELF" {
        bail!("{tool} gave {got} bytes (want {size}), exit {status}");
    }
    Ok(())
}

/// `dir/vmlinux`, extracted once from `dir/vmlinuz`; the bzImage when that fails.
fn boot_image(dir: &Path) -> PathBuf {
    let vmlinux = dir.join("vmlinux");
    let vmlinuz = dir.join("vmlinuz");
    if vmlinux.is_file() {
        return vmlinux;
    }
    let tmp = dir.join("vmlinux.tmp");
    match extract_vmlinux(&vmlinuz, &tmp).and_then(|()| Ok(std::fs::rename(&tmp, &vmlinux)?)) {
        Ok(()) => vmlinux,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            say(&format!(
                "could not extract vmlinux ({e:#}); booting the bzImage (slower)"
            ));
            vmlinuz
        }
    }
}

/// `linux-image-6.1.0-56-amd64` -> `6.1.0-56-amd64`.
pub fn release_of(package: &str) -> Option<&str> {
    package
        .strip_prefix("linux-image-")
        .filter(|r| r.chars().next().is_some_and(|c| c.is_ascii_digit()))
}

/// The cache root: `$CLB_VM_CACHE`, else `$XDG_CACHE_HOME/clb-probe/vm`, else
/// `~/.cache/clb-probe/vm`. Outside the target dir so `cargo clean` keeps the 400 MB.
pub fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("CLB_VM_CACHE") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/root"))
                .join(".cache")
        });
    base.join("clb-probe/vm")
}

fn entry_dir(cache: &Path, package: &str, version: &str) -> PathBuf {
    cache.join(format!("{package}_{version}"))
}

fn complete_stamp(dir: &Path) -> PathBuf {
    dir.join("complete")
}

/// Whether the cache entry `dir` was fully built in layout `format` (its stamp is written last,
/// by [`commit_entry`]).
pub(super) fn is_complete(dir: &Path, format: u32) -> bool {
    std::fs::read_to_string(complete_stamp(dir))
        .is_ok_and(|s| s.lines().next() == Some(&format!("format {format}")))
}

/// Finishes a cache entry built in `tmp`: its package list, the stamp of layout `format`, and
/// `tmp` renamed to `dir` (replacing a stale one).
pub(super) fn commit_entry(
    tmp: &Path,
    dir: &Path,
    specs: &[String],
    format: u32,
) -> anyhow::Result<()> {
    std::fs::write(
        tmp.join("packages.txt"),
        specs.iter().map(|s| format!("{s}\n")).collect::<String>(),
    )?;
    std::fs::write(complete_stamp(tmp), format!("format {format}\n"))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(tmp, dir)?;
    say(&format!("cached in {}", dir.display()));
    Ok(())
}

fn kernel_at(dir: &Path, package: &str, version: &str) -> anyhow::Result<Kernel> {
    let release = release_of(package)
        .with_context(|| format!("{package} is not a linux-image-<release> package"))?;
    Ok(Kernel {
        package: package.to_string(),
        version: version.to_string(),
        release: release.to_string(),
        image: boot_image(dir),
        root: dir.join("root"),
        arch: crate::arch::Arch::Amd64,
    })
}

/// The kernel `spec` pins (or the fallback, see the module doc) with the guest packages, from
/// the cache or downloaded into it.
pub fn ensure(cache: &Path, spec: &KernelSpec) -> anyhow::Result<Kernel> {
    let pinned = entry_dir(cache, spec.package, spec.version);
    if is_complete(&pinned, CACHE_FORMAT) {
        return kernel_at(&pinned, spec.package, spec.version);
    }
    std::fs::create_dir_all(cache)
        .with_context(|| format!("creating the VM cache {}", cache.display()))?;
    // One builder at a time (two CI jobs on one machine); the lock goes with the file.
    let _lock = lock(&cache.join("lock"))?;
    if is_complete(&pinned, CACHE_FORMAT) {
        return kernel_at(&pinned, spec.package, spec.version);
    }
    let apt = SuiteApt::new(cache, spec.suite)?;
    let (package, version) = choose_kernel(&apt, spec, KERNEL_META)?;
    let dir = entry_dir(cache, &package, &version);
    if !is_complete(&dir, CACHE_FORMAT) {
        build_entry(&dir, &apt, &package, &version)?;
    }
    kernel_at(&dir, &package, &version)
}

pub(super) fn lock(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor we own; it is released when the file is closed.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        say(&format!(
            "waiting for another run that fills {}",
            path.display()
        ));
        // SAFETY: as above.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(f)
}

/// The pinned kernel when apt can download it, else the newest image of its series (loudly).
pub(super) fn choose_kernel(
    apt: &SuiteApt,
    spec: &KernelSpec,
    meta: &str,
) -> anyhow::Result<(String, String)> {
    let mut updated = false;
    loop {
        let versions = parse_policy_versions(&apt.policy(spec.package));
        if versions.iter().any(|v| v == spec.version) {
            return Ok((spec.package.to_string(), spec.version.to_string()));
        }
        if updated {
            break;
        }
        apt.update()?;
        updated = true;
    }
    let deps = output(apt.command("apt-cache").args(["depends", meta]))?;
    let image = parse_depends(&deps)
        .remove(meta)
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .map(|d| d.name)
        .find(|n| n.starts_with(spec.series))
        .with_context(|| {
            format!(
                "the pinned kernel {}={} is not downloadable and {}'s {meta} names no \
                 {}* image: update KERNELS in xtask/src/vm/kernel.rs",
                spec.package, spec.version, spec.suite, spec.series
            )
        })?;
    let version = parse_policy_candidate(&apt.policy(&image))
        .with_context(|| format!("apt has no candidate for {image}"))?;
    let bar = "!".repeat(78);
    eprintln!(
        "{bar}\nvm: WARNING: the pinned kernel {}={} is no longer downloadable;\nvm: WARNING: \
         falling back to {image}={version}. Results may differ: update KERNELS\nvm: WARNING: \
         in xtask/src/vm/kernel.rs to pin it.\n{bar}",
        spec.package, spec.version
    );
    Ok((image, version))
}

/// Downloads, unpacks and prepares one cache entry (in `<dir>.tmp`, renamed when complete).
/// Empties `tmp` (a cache entry being built) and makes its `debs` and `root` folders.
pub(super) fn fresh_build_dirs(tmp: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    if tmp.exists() {
        std::fs::remove_dir_all(tmp)?;
    }
    let debs = tmp.join("debs");
    let root = tmp.join("root");
    std::fs::create_dir_all(&debs)?;
    std::fs::create_dir_all(&root)?;
    Ok((debs, root))
}

fn build_entry(dir: &Path, apt: &SuiteApt, package: &str, version: &str) -> anyhow::Result<()> {
    let release = release_of(package).context("kernel package name")?;
    let tmp = dir.with_extension("tmp");
    let (debs, root) = fresh_build_dirs(&tmp)?;

    let installed = host_installed().unwrap_or_default();
    let mut apt_failed_once = false;
    let guest = loop {
        match closure(GUEST_PACKAGES, &installed, apt_depends) {
            Ok(g) => break g,
            Err(e) if !apt_failed_once => {
                say(&format!("apt-cache depends failed ({e:#}); updating"));
                apt_update()?;
                apt_failed_once = true;
            }
            Err(e) => return Err(e),
        }
    };
    let kernel = format!("{package}={version}");
    say(&format!("downloading {kernel} ({})", apt.suite));
    output(
        apt.command("apt-get")
            .args(["download", "-qq", &kernel])
            .current_dir(&debs),
    )
    .with_context(|| format!("apt-get download of {kernel} failed"))?;
    let specs: Vec<String> = std::iter::once(kernel.clone())
        .chain(guest.iter().cloned())
        .collect();
    say(&format!(
        "downloading {}",
        guest.iter().cloned().collect::<Vec<_>>().join(" ")
    ));
    let mut cmd = Command::new("apt-get");
    cmd.arg("download").arg("-qq").current_dir(&debs);
    if crate_is_root() {
        // apt's _apt sandbox user cannot write into root's cache folder.
        cmd.args(["-o", "APT::Sandbox::User=root"]);
    }
    output(cmd.args(&guest)).context("apt-get download of the VM's tools failed")?;

    for deb in std::fs::read_dir(&debs)? {
        let deb = deb?.path();
        output(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))
            .with_context(|| format!("unpacking {}", deb.display()))?;
    }
    fold_usr(&root)?;

    // The kernel image and config live beside the layer, not in it.
    let boot = root.join("boot");
    std::fs::rename(boot.join(format!("vmlinuz-{release}")), tmp.join("vmlinuz"))
        .context("the kernel package has no boot/vmlinuz-<release>")?;
    let _ = std::fs::rename(boot.join(format!("config-{release}")), tmp.join("config"));
    std::fs::remove_dir_all(&boot)?;
    if !root.join("usr/lib/modules").join(release).is_dir() {
        bail!("the kernel package has no lib/modules/{release}");
    }
    depmod(&root, release)?;
    std::fs::remove_dir_all(&debs)?;
    commit_entry(&tmp, dir, &specs, CACHE_FORMAT)
}

/// Moves `src`'s entries into `dst`, merging folders; `src` is removed.
fn merge_into(src: &Path, dst: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        let ft = e.file_type()?;
        match std::fs::symlink_metadata(&to) {
            Ok(m) if m.is_dir() && ft.is_dir() => merge_into(&e.path(), &to)?,
            Ok(m) => {
                if m.is_dir() {
                    std::fs::remove_dir_all(&to)?;
                } else {
                    std::fs::remove_file(&to)?;
                }
                std::fs::rename(e.path(), &to)?;
            }
            Err(_) => std::fs::rename(e.path(), &to)?,
        }
    }
    std::fs::remove_dir(src)?;
    Ok(())
}

/// Merged-/usr: `bin`, `sbin`, `lib*` of the unpacked packages go under `usr/`.
pub(super) fn fold_usr(root: &Path) -> anyhow::Result<()> {
    for d in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let src = root.join(d);
        if std::fs::symlink_metadata(&src).is_ok_and(|m| m.is_dir()) {
            merge_into(&src, &root.join("usr").join(d))
                .with_context(|| format!("folding {d}/ into usr/"))?;
        }
    }
    Ok(())
}

/// Runs the unpacked kmod under another name (its `depmod`/`modprobe` links are absolute).
/// The host's own `kmod` stands in when the unpacked one is another architecture's (arm64).
pub fn kmod(root: &Path, as_name: &str) -> Command {
    let unpacked = root.join("usr/bin/kmod");
    let native = std::fs::read(&unpacked)
        .ok()
        .and_then(|b| elf_machine(&b))
        .is_some_and(|m| m == HOST_ELF_MACHINE);
    if !native {
        let mut cmd = Command::new("kmod");
        cmd.arg0(as_name);
        return cmd;
    }
    let mut cmd = Command::new(unpacked);
    cmd.arg0(as_name);
    let libdir = root.join("usr/lib/x86_64-linux-gnu");
    if libdir.join("libkmod.so.2").exists() {
        cmd.env("LD_LIBRARY_PATH", libdir);
    }
    cmd
}

/// `e_machine` of an ELF file (62: x86-64, 183: aarch64).
pub fn elf_machine(elf: &[u8]) -> Option<u16> {
    (elf.get(..4)? == b"\x7fELF").then_some(())?;
    Some(u16::from_le_bytes(elf.get(18..20)?.try_into().ok()?))
}

/// This machine's `e_machine`.
const HOST_ELF_MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    183
} else {
    62
};

pub(super) fn depmod(root: &Path, release: &str) -> anyhow::Result<()> {
    output(
        kmod(root, "depmod")
            .arg("-b")
            .arg(root.join("usr"))
            .arg(release),
    )
    .map(drop)
    .context("depmod on the unpacked modules failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_elf_machine() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[18] = 183;
        assert_eq!(elf_machine(&elf), Some(183));
        assert_eq!(elf_machine(b"#!/bin/sh\n"), None);
        assert_eq!(elf_machine(b"\x7fELF"), None);
    }

    #[test]
    fn finds_the_bzimage_payload() {
        let mut bz = vec![0u8; 5 * 512 + 64];
        bz[0x1f1] = 4;
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        bz[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        bz[0x24c..0x250].copy_from_slice(&12u32.to_le_bytes());
        let start = 5 * 512 + 16;
        bz[start..start + 6].copy_from_slice(b"\xfd7zXZ\x00");
        bz[start + 8..start + 12].copy_from_slice(&4242u32.to_le_bytes());
        assert_eq!(bzimage_payload(&bz), Some((start..start + 12, "xz", 4242)));
        bz[start] = 0;
        assert_eq!(bzimage_payload(&bz), None);
        assert_eq!(bzimage_payload(b"\x7fELF"), None);
    }

    #[test]
    fn release_from_package() {
        assert_eq!(
            release_of("linux-image-6.1.0-56-amd64"),
            Some("6.1.0-56-amd64")
        );
        assert_eq!(
            release_of("linux-image-6.12.117+deb13-amd64"),
            Some("6.12.117+deb13-amd64")
        );
        assert_eq!(release_of("linux-image-amd64"), None);
        for k in KERNELS {
            assert!(k.package.starts_with(k.series), "{k:?}");
            assert!(release_of(k.package).is_some(), "{k:?}");
            assert_eq!(spec(k.name), Some(k));
        }
        assert_eq!(spec("4.19"), None);
    }
}
