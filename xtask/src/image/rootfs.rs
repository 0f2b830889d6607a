//! The image's Debian rootfs: the dependency closure of the packages whose tools the agent
//! runs, resolved and downloaded with apt against an empty dpkg status (the host's package
//! state untouched), unpacked with `dpkg -x`, cached as a tarball keyed by the .deb names.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use super::{output, sha256};
use crate::arch::Arch;

/// Debian packages whose tools the agent runs (`Command::new` in probe-user): iptables
/// (`iptables-save` and its `-legacy`/`-nft` variants, `ip6tables-save`: kube-proxy's rules)
/// nftables (`nft -j`: kube-proxy's nftables-mode tables) and ipset (`ipset save`: IPVS mode's
/// externalTrafficPolicy Local sets).
const PACKAGES: &[&str] = &["iptables", "nftables", "ipset"];

/// In the closure only for maintainer scripts, which an unpacked rootfs never runs.
const SCRIPT_ONLY: &[&str] = &["debconf"];

/// What `update-alternatives` would link in the iptables postinst (Debian's default: nft).
const ALTERNATIVES: &[(&str, &str)] = &[
    ("usr/sbin/iptables-save", "xtables-nft-multi"),
    ("usr/sbin/ip6tables-save", "xtables-nft-multi"),
];

/// Outside the work tree, like setup's venv: a fresh clone (CI) reuses it.
fn cache_dir() -> PathBuf {
    test_support::tools::home().join(".local/share/clb-probe/image")
}

/// apt's cache directory for `arch` (the host's keeps its historical name).
fn apt_dir(arch: Arch) -> PathBuf {
    if arch == Arch::host() {
        cache_dir().join("apt")
    } else {
        cache_dir().join(format!("apt-{}", arch.name()))
    }
}

/// apt-get with an empty dpkg status: resolves the full closure from the machine's mirror into
/// our own archive cache, never touching the host's package state. A foreign architecture
/// gets its own lists and package caches (the machine's sources, read for arm64).
fn apt_get(arch: Arch) -> Command {
    let dir = apt_dir(arch);
    let mut cmd = Command::new("apt-get");
    cmd.arg(format!(
        "-o=Dir::State::status={}",
        dir.join("status").display()
    ))
    .arg(format!(
        "-o=Dir::Cache::archives={}",
        dir.join("archives").display()
    ))
    .arg("-o=Debug::NoLocking=1")
    // Our cache is root's: apt's _apt sandbox user could not write it.
    .arg("-o=APT::Sandbox::User=root")
    .env("DEBIAN_FRONTEND", "noninteractive");
    if arch != Arch::host() {
        cmd.arg(format!("-o=APT::Architecture={}", arch.name()))
            .arg(format!("-o=APT::Architectures::={}", arch.name()))
            .arg(format!(
                "-o=Dir::State::Lists={}",
                dir.join("lists").display()
            ))
            .arg(format!("-o=Dir::Cache={}", dir.join("cache").display()));
    }
    cmd
}

fn apt(arch: Arch) -> Command {
    let mut cmd = apt_get(arch);
    cmd.args([
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "--download-only",
    ])
    .args(PACKAGES);
    cmd
}

/// The rootfs tarball (cached by the resolved .deb file names, which carry the versions and
/// the architecture) and the .deb file names it was unpacked from.
pub(super) fn rootfs(arch: Arch) -> anyhow::Result<(PathBuf, String, Vec<String>)> {
    let apt_dir = apt_dir(arch);
    let archives = apt_dir.join("archives");
    std::fs::create_dir_all(archives.join("partial"))?;
    std::fs::write(apt_dir.join("status"), "")?;
    if arch != Arch::host() {
        let lists = apt_dir.join("lists");
        std::fs::create_dir_all(lists.join("partial"))?;
        std::fs::create_dir_all(apt_dir.join("cache"))?;
        let has_lists = std::fs::read_dir(&lists)?
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().contains("_Packages"));
        if !has_lists {
            eprintln!(
                "image: apt-get update for {} (lists of its own)",
                arch.name()
            );
            output(apt_get(arch).args(["update", "-qq"]))
                .with_context(|| format!("apt-get update for {}", arch.name()))?;
        }
    }
    let uris = output(apt(arch).arg("--print-uris"))
        .context("resolving the image's Debian packages (apt-get update may be needed)")?;
    let mut debs: Vec<String> = uris
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(String::from))
        .collect();
    // Already-downloaded packages are not printed: list the closure from the cache too.
    let mut cached: Vec<String> = std::fs::read_dir(&archives)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".deb"))
        .collect();
    if debs.is_empty() && cached.is_empty() {
        bail!("apt resolved no packages for {PACKAGES:?}");
    }
    debs.append(&mut cached);
    debs.sort();
    debs.dedup();
    let list = debs.join("\n");
    // What the rootfs holds (for its SBOM): the closure less the script-only packages.
    let unpacked: Vec<String> = debs
        .iter()
        .filter(|d| !SCRIPT_ONLY.contains(&d.split('_').next().unwrap_or_default()))
        .cloned()
        .collect();
    let key_file = apt_dir.join("closure.txt");
    std::fs::write(&key_file, &list)?;
    let key = sha256(&key_file)?[..16].to_string();
    let tar = cache_dir().join(format!("rootfs-{key}.tar"));
    if tar.is_file() {
        eprintln!("image: Debian rootfs {key} ({}) cached", arch.name());
        return Ok((tar, key, unpacked));
    }
    eprintln!(
        "image: downloading {PACKAGES:?} ({}) and their dependencies from the Debian mirror",
        arch.name()
    );
    let status_code = apt(arch).status().context("apt-get --download-only")?;
    if !status_code.success() {
        bail!("apt-get --download-only failed ({status_code})");
    }
    let dir = cache_dir().join(format!("rootfs-{key}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for deb in &debs {
        let name = deb.split('_').next().unwrap_or_default();
        if SCRIPT_ONLY.contains(&name) || !archives.join(deb).is_file() {
            continue;
        }
        output(
            Command::new("dpkg")
                .arg("-x")
                .arg(archives.join(deb))
                .arg(&dir),
        )?;
    }
    for (link, target) in ALTERNATIVES {
        let _ = std::fs::remove_file(dir.join(link));
        std::os::unix::fs::symlink(target, dir.join(link))?;
    }
    // Documentation is no part of a runtime image; the mount points podman fills are.
    for d in [
        "usr/share/doc",
        "usr/share/man",
        "usr/share/locale",
        "usr/share/info",
        "usr/share/lintian",
        "usr/share/bug",
    ] {
        let _ = std::fs::remove_dir_all(dir.join(d));
    }
    for d in ["tmp", "run", "proc", "sys", "dev", "etc", "usr/local/bin"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    output(
        Command::new("tar")
            .arg("-C")
            .arg(&dir)
            .args(["--numeric-owner", "-cf"])
            .arg(&tar)
            .arg("."),
    )?;
    std::fs::remove_dir_all(&dir)?;
    Ok((tar, key, unpacked))
}
