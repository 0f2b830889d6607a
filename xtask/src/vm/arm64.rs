//! `cargo xtask vm-test --arch arm64`: Debian's stock arm64 kernel (`linux-image-arm64` of
//! bookworm, 6.1) under `qemu-system-aarch64` (machine `virt`, software emulation: there is no
//! cross-architecture KVM).
//!
//! The amd64 tier's guest runs the host's userland over 9p; an arm64 guest cannot. So the
//! package layer here is a small arm64 root: the kernel package plus [`ROOTFS_PACKAGES`] and
//! their Depends closure (nothing counts as installed: the host's packages are another
//! architecture's), downloaded with apt's arm64 architecture through a private configuration
//! with its own lists folder ([`super::apt::SuiteApt::for_arch`]) and unpacked with `dpkg -x`.
//! The host's `/` stays the lowest overlay layer only so the workspace (the cross-built test
//! binaries under `target/aarch64-unknown-linux-gnu`) and `/etc` are at their paths; every
//! program the guest runs comes from the arm64 layer above it (the shell, `ip`, `ipvsadm`,
//! `modprobe`, ...). The initramfs's busybox is the arm64 `busybox-static` of that root.
//!
//! The cache entry is `arm64/<kernel package>_<version>_<key>` under the VM cache, `key` a hash
//! of [`ROOTFS_PACKAGES`] and [`CACHE_FORMAT`]: another package list or layout never reuses a
//! stale root. About 600 MB unpacked (the kernel's modules are most of it).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::{
    KernelSpec,
    apt::{SuiteApt, closure, output, say},
    kernel::{self, Kernel},
    shell_quote,
    suite::THREE_KINDS_TEST,
};
use crate::arch::Arch;

/// The arm64 kernel: bookworm's 6.1, the series the amd64 tier's full suite runs on. Pinned
/// like [`kernel::KERNELS`] (a superseded ABI falls back to what `linux-image-arm64` names).
pub const KERNEL: KernelSpec = KernelSpec {
    name: "6.1",
    suite: "bookworm",
    package: "linux-image-6.1.0-56-arm64",
    version: "6.1.192-2",
    series: "linux-image-6.1.",
};

/// The suite's metapackage that names the current arm64 image.
pub const KERNEL_META: &str = "linux-image-arm64";

/// The arm64 userland of the guest (with their Depends): stage 2's shell and mounts, what the
/// smoke script and the IPVS-mode lab run (`ip`, `ipvsadm`, `ipset`, `iptables-save`, `nft`,
/// `bpftool`, `modprobe`, `ss`, `setsid`, `python3` for its servers), and the initramfs's busybox. Essential packages are named because
/// nothing declares a dependency on them.
pub const ROOTFS_PACKAGES: &[&str] = &[
    "libc6",
    "bash",
    "dash",
    "coreutils",
    "mount",
    "util-linux",
    "grep",
    "sed",
    "mawk",
    "findutils",
    "procps",
    "busybox-static",
    "kmod",
    "iproute2",
    "iptables",
    "nftables",
    "ipset",
    "ipvsadm",
    "conntrack",
    "bpftool",
    // The lab's TCP/UDP servers (`python3 -c`, socket and threading).
    "python3",
];

/// Bumped when the entry's layout changes.
pub const CACHE_FORMAT: u32 = 1;

/// Which kernels `--kernel` selects for arm64: only 6.1 exists there (`all` is that one).
pub fn kernel_of(choice: &str) -> Result<&'static KernelSpec, String> {
    match choice {
        "6.1" | "all" => Ok(&KERNEL),
        other => Err(format!(
            "--arch arm64 boots only the 6.1 kernel (bookworm's linux-image-arm64); \
             --kernel {other} is amd64-only"
        )),
    }
}

/// FNV-1a over the package list and the format: the cache key of the arm64 root.
pub fn rootfs_key(packages: &[&str], format: u32) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= u64::from(x);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(&format.to_le_bytes());
    for p in packages {
        eat(p.as_bytes());
        eat(b"\n");
    }
    format!("{:08x}", h >> 32)
}

fn entry_dir(cache: &Path, package: &str, version: &str) -> PathBuf {
    cache.join("arm64").join(format!(
        "{package}_{version}_{}",
        rootfs_key(ROOTFS_PACKAGES, CACHE_FORMAT)
    ))
}

fn kernel_at(dir: &Path, package: &str, version: &str) -> anyhow::Result<Kernel> {
    let release = kernel::release_of(package)
        .with_context(|| format!("{package} is not a linux-image-<release> package"))?;
    Ok(Kernel {
        package: package.to_string(),
        version: version.to_string(),
        release: release.to_string(),
        image: dir.join("Image"),
        root: dir.join("root"),
        arch: Arch::Arm64,
    })
}

/// The arm64 kernel and root, downloaded and unpacked into the cache on first use.
pub fn ensure(cache: &Path) -> anyhow::Result<Kernel> {
    let pinned = entry_dir(cache, KERNEL.package, KERNEL.version);
    if kernel::is_complete(&pinned, CACHE_FORMAT) {
        return kernel_at(&pinned, KERNEL.package, KERNEL.version);
    }
    std::fs::create_dir_all(cache)
        .with_context(|| format!("creating the VM cache {}", cache.display()))?;
    let _lock = kernel::lock(&cache.join("lock"))?;
    if kernel::is_complete(&pinned, CACHE_FORMAT) {
        return kernel_at(&pinned, KERNEL.package, KERNEL.version);
    }
    let apt = SuiteApt::for_arch(cache, KERNEL.suite, Some("arm64"))?;
    let (package, version) = kernel::choose_kernel(&apt, &KERNEL, KERNEL_META)?;
    let dir = entry_dir(cache, &package, &version);
    if !kernel::is_complete(&dir, CACHE_FORMAT) {
        build_entry(&dir, &apt, &package, &version)?;
    }
    kernel_at(&dir, &package, &version)
}

fn build_entry(dir: &Path, apt: &SuiteApt, package: &str, version: &str) -> anyhow::Result<()> {
    let release = kernel::release_of(package).context("kernel package name")?;
    let tmp = PathBuf::from(format!("{}.tmp", dir.display()));
    let (debs, root) = kernel::fresh_build_dirs(&tmp)?;
    let rootfs = closure(ROOTFS_PACKAGES, &Default::default(), |p| apt.depends(p))
        .context("resolving the arm64 root's packages")?;
    let kernel = format!("{package}={version}");
    let specs: Vec<String> = std::iter::once(kernel.clone())
        .chain(rootfs.iter().cloned())
        .collect();
    say(&format!(
        "downloading {kernel} and {} arm64 packages ({})",
        rootfs.len(),
        apt.suite
    ));
    output(
        apt.command("apt-get")
            .args(["download", "-qq"])
            .args(&specs)
            .current_dir(&debs),
    )
    .context("apt-get download of the arm64 kernel and root failed")?;
    for deb in std::fs::read_dir(&debs)? {
        let deb = deb?.path();
        output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))
            .with_context(|| format!("unpacking {}", deb.display()))?;
    }
    std::fs::remove_dir_all(&debs)?;
    kernel::fold_usr(&root)?;
    let boot = root.join("boot");
    let vmlinuz = boot.join(format!("vmlinuz-{release}"));
    // bookworm's arm64 vmlinuz is the plain `Image` (EFI stub, `ARMd` magic); a gzip'd one
    // (other releases) is unpacked, QEMU boots the plain one fastest.
    let mut magic = [0u8; 2];
    std::io::Read::read_exact(&mut std::fs::File::open(&vmlinuz)?, &mut magic)
        .with_context(|| format!("reading {}", vmlinuz.display()))?;
    if magic == [0x1f, 0x8b] {
        let image = std::fs::File::create(tmp.join("Image"))?;
        let st = Command::new("gzip")
            .arg("-dc")
            .arg(&vmlinuz)
            .stdout(image)
            .status()
            .context("starting gzip")?;
        if !st.success() {
            bail!("gzip -dc {} failed ({st})", vmlinuz.display());
        }
    } else {
        std::fs::rename(&vmlinuz, tmp.join("Image"))?;
    }
    std::fs::remove_dir_all(&boot)?;
    if !root.join("usr/lib/modules").join(release).is_dir() {
        bail!("the kernel package has no lib/modules/{release}");
    }
    kernel::depmod(&root, release)?;
    kernel::commit_entry(&tmp, dir, &specs, CACHE_FORMAT)
}

/// The cross target of the guest's binaries.
pub const TARGET: &str = Arch::Arm64.rust_target();

/// The datapath smoke: datapath.rs's tests that the arm64 programs load, attach (clsact on
/// 6.1), count and event a looping packet with its drop reason, and leave nothing behind.
pub const DATAPATH_SMOKE: &[&str] = &[
    "vip_source_on_the_nic_is_counted_evented_and_its_drop_has_the_reason",
    "nothing_stays_attached_after_exit_sigterm_or_sigkill",
];

/// The test files the arm64 suite runs, in order.
pub const TEST_FILES: &[&str] = &["datapath", "ipvs"];

/// The arm64 suite's executables, cross-built on the host: the agent, and (test file,
/// executable) in [`TEST_FILES`] order.
pub fn build(root: &Path) -> anyhow::Result<(PathBuf, Vec<(String, PathBuf)>)> {
    let built = crate::build::arm64(root, TEST_FILES)?;
    let probe = crate::build::probe_binary(&built, "arm64 ")?;
    let tests = crate::build::test_executables(&built, TEST_FILES, "arm64 ")?;
    Ok((probe, tests))
}

/// The arm64 suite: the IPVS smoke scenario, the datapath smoke, then the IPVS lab's three
/// kinds; every part runs, the script fails when one did.
pub fn script(probe: &Path, tests: &[(String, PathBuf)]) -> anyhow::Result<String> {
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let exe = |file: &str| {
        tests
            .iter()
            .find(|(f, _)| f == file)
            .map(|(_, e)| q(e))
            .with_context(|| format!("the arm64 suite has no {file}.rs binary"))
    };
    let mut s = super::suite::script_prelude(
        "the arm64 VM suite, written by cargo xtask vm-test --arch arm64",
    );
    s.push_str(
        "echo \"=== vm-suite: kernel $(uname -r) on $(uname -m)\"\n\
         part 'IPVS smoke' bash /clb-vm/smoke.sh\n\
         modprobe -a ip_vs ip_vs_rr dummy ip_set xt_set\n\
         export CLB_LAB_MODE=ipvs\n",
    );
    s.push_str(&format!("export CLB_PROBE_BIN={}\n", q(probe)));
    let datapath = exe("datapath")?;
    for t in DATAPATH_SMOKE {
        s.push_str(&format!(
            "part 'datapath smoke: {t}' {datapath} --exact {t} --test-threads=1\n"
        ));
    }
    s.push_str(&format!(
        "part 'the three kinds (tests/ipvs.rs, IPVS-mode lab)' {} --exact {THREE_KINDS_TEST} \
         --test-threads=1\n",
        exe("ipvs")?
    ));
    s.push_str(
        "if [ ${#failed[@]} -eq 0 ]; then echo '=== vm-suite: all passed'; exit 0; fi\n\
         echo \"=== vm-suite: FAILED: ${failed[*]}\"\n\
         exit 1\n",
    );
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_six_one_kernel_on_arm64() {
        assert_eq!(kernel_of("6.1").unwrap().package, KERNEL.package);
        assert_eq!(kernel_of("all").unwrap().name, "6.1");
        for k in ["5.10", "6.12"] {
            let e = kernel_of(k).unwrap_err();
            assert!(e.contains("amd64-only"), "{e}");
        }
        assert!(KERNEL.package.ends_with("-arm64"));
        assert_eq!(kernel::release_of(KERNEL.package), Some("6.1.0-56-arm64"));
    }

    #[test]
    fn cache_key_follows_the_package_list_and_format() {
        let k = rootfs_key(ROOTFS_PACKAGES, CACHE_FORMAT);
        assert_eq!(k.len(), 8);
        assert_eq!(k, rootfs_key(ROOTFS_PACKAGES, CACHE_FORMAT));
        assert_ne!(k, rootfs_key(ROOTFS_PACKAGES, CACHE_FORMAT + 1));
        assert_ne!(k, rootfs_key(&ROOTFS_PACKAGES[1..], CACHE_FORMAT));
        // ["ab", "c"] and ["a", "bc"] are different lists.
        assert_ne!(rootfs_key(&["ab", "c"], 1), rootfs_key(&["a", "bc"], 1));
        let d = entry_dir(Path::new("/c"), "linux-image-6.1.0-56-arm64", "6.1.192-2");
        assert_eq!(
            d,
            Path::new(&format!(
                "/c/arm64/linux-image-6.1.0-56-arm64_6.1.192-2_{k}"
            ))
        );
    }

    #[test]
    fn the_root_has_what_the_guest_runs() {
        for p in [
            "libc6",
            "bash",
            "busybox-static",
            "kmod",
            "iproute2",
            "ipvsadm",
            "ipset",
            "iptables",
            "nftables",
            "conntrack",
            "python3",
        ] {
            assert!(ROOTFS_PACKAGES.contains(&p), "{p}");
        }
    }

    #[test]
    fn script_runs_smoke_datapath_and_the_three_kinds_in_ipvs_mode() {
        let tests = vec![
            ("datapath".to_string(), PathBuf::from("/t/datapath-1")),
            ("ipvs".to_string(), PathBuf::from("/t/ipvs-1")),
        ];
        let s = script(Path::new("/t/probe"), &tests).unwrap();
        assert!(s.contains("part 'IPVS smoke' bash /clb-vm/smoke.sh"));
        assert!(s.contains("modprobe -a ip_vs ip_vs_rr dummy ip_set xt_set"));
        assert!(s.contains("export CLB_LAB_MODE=ipvs\nexport CLB_PROBE_BIN='/t/probe'\n"));
        assert!(s.contains(
            "'/t/datapath-1' --exact \
             vip_source_on_the_nic_is_counted_evented_and_its_drop_has_the_reason --test-threads=1"
        ));
        assert!(s.contains(
            "'/t/ipvs-1' --exact \
             ipvs_mode_failures_are_confirmed_and_twins_are_silent --test-threads=1"
        ));
        assert!(s.ends_with("exit 1\n"));
        assert!(script(Path::new("/t/probe"), &tests[1..]).is_err());
    }
}
