//! `cargo xtask image`: the agent's container image, built here without pulling from a
//! container registry. A Debian rootfs is assembled from the machine's own Debian mirror
//! (apt resolves the dependency closure of exactly the packages whose tools the agent runs;
//! `dpkg -x` unpacks them), the release binary is added, and buildah commits the image to
//! local storage (`podman run localhost/clb-probe:<version>`).
//!
//! Two architectures: amd64 and arm64 images (tags `<tag>-amd64`, `<tag>-arm64`) and a manifest
//! list naming both (`<tag>`). The arm64 agent is cross-compiled with Debian's cross toolchain
//! (`.cargo/config.toml` names the linker); its eBPF object is the same bytecode as amd64's (both
//! are bpfel: checked byte for byte before the image is assembled). The arm64 rootfs comes from
//! the same mirror through apt's `APT::Architecture=arm64` with lists and caches of its own, so
//! the host's package state is never touched. Each image gets a CycloneDX SBOM (the Rust
//! dependency tree of its target by cargo-cyclonedx, plus the rootfs' Debian packages) written
//! next to it in `target/image/`, its digest an annotation of the image.
//!
//! Cached for CI: the rootfs tarball (in ~/.local/share/clb-probe/image, which a fresh clone
//! reuses) is keyed by the resolved package versions, and the image carries a label of its
//! inputs (rootfs key + binary hash), so an unchanged build downloads and commits nothing.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

pub use crate::arch::Arch;
use crate::{setup, workspace_root};

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

/// The label naming the image's inputs (the cache key).
const INPUTS_LABEL: &str = "io.github.clb-probe.inputs";

/// The annotation carrying the digest of the image's SBOM (the file is in `target/image/`).
const SBOM_ANNOTATION: &str = "io.github.clb-probe.sbom.cyclonedx.sha256";

#[derive(Debug, Clone, clap::Args)]
pub struct ImageArgs {
    /// The agent binary to put in the image (default: a release build, built first). Only
    /// with a single `--arch`.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Image name (default localhost/clb-probe:<version>). With two architectures it names
    /// the manifest list, and the images are `<tag>-amd64` and `<tag>-arm64`.
    #[arg(long)]
    pub tag: Option<String>,
    /// The architectures to build (default: amd64 and arm64, plus their manifest list).
    #[arg(long, value_enum)]
    pub arch: Vec<Arch>,
    /// Skip the SBOMs (cargo-cyclonedx): for a quick local image.
    #[arg(long)]
    pub no_sbom: bool,
}

pub fn default_tag() -> String {
    format!("localhost/clb-probe:{}", env!("CARGO_PKG_VERSION"))
}

/// Outside the work tree, like setup's venv: a fresh clone (CI) reuses it.
fn cache_dir() -> PathBuf {
    setup::home().join(".local/share/clb-probe/image")
}

fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = output(Command::new("sha256sum").arg(path))?;
    Ok(out
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
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
fn rootfs(arch: Arch) -> anyhow::Result<(PathBuf, String, Vec<String>)> {
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

/// The image's inputs label, or None when the image does not exist.
fn image_inputs(tag: &str) -> Option<String> {
    output(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        &format!("{{{{index .Labels \"{INPUTS_LABEL}\"}}}}"),
        tag,
    ]))
    .ok()
}

/// Builds (or finds up to date) the host-architecture image with `binary` as the agent, no
/// SBOM; returns its tag.
pub fn build(binary: &Path, tag: &str) -> anyhow::Result<String> {
    build_arch(binary, tag, Arch::host(), None).map(|(tag, _)| tag)
}

/// Builds (or finds up to date) the `arch` image with `binary` (built for `arch`) as the agent;
/// with `sbom`, the Rust SBOM to complete with the rootfs' Debian packages, write next to the
/// image (`target/image/`) and annotate. Returns the tag and the SBOM's path.
pub fn build_arch(
    binary: &Path,
    tag: &str,
    arch: Arch,
    sbom: Option<&Path>,
) -> anyhow::Result<(String, Option<PathBuf>)> {
    if !setup::is_root() {
        bail!("building the image needs root (rootful buildah storage): run as root");
    }
    for tool in ["buildah", "podman", "apt-get", "dpkg"] {
        if setup::which(tool).is_none() {
            bail!("{tool} is not installed: run `cargo xtask setup`");
        }
    }
    let (tar, key, debs) = rootfs(arch)?;
    let sbom = match sbom {
        Some(rust) => {
            let out = out_dir().join(format!(
                "clb-probe-{}-{}.cdx.json",
                env!("CARGO_PKG_VERSION"),
                arch.name()
            ));
            crate::supply::write_image_sbom(rust, &debs, &out)?;
            Some(out)
        }
        None => None,
    };
    let sbom_hash = sbom.as_deref().map(sha256).transpose()?;
    let inputs = format!(
        "{key}-{}{}",
        &sha256(binary)?[..16],
        sbom_hash
            .as_deref()
            .map(|h| format!("-{}", &h[..16]))
            .unwrap_or_default()
    );
    if image_inputs(tag).as_deref() == Some(inputs.as_str()) {
        eprintln!("image: {tag} up to date");
        return Ok((tag.to_string(), sbom));
    }
    eprintln!("image: assembling {tag} ({}) with buildah", arch.name());
    let ctr = output(Command::new("buildah").args(["from", "scratch"]))?;
    let result = (|| -> anyhow::Result<()> {
        output(
            Command::new("buildah")
                .args(["add", &ctr])
                .arg(&tar)
                .arg("/"),
        )?;
        output(
            Command::new("buildah")
                .args(["copy", "--chmod", "0755", &ctr])
                .arg(binary)
                .arg("/usr/local/bin/probe"),
        )?;
        let mut config = Command::new("buildah");
        config.args([
            "config",
            "--os",
            "linux",
            "--arch",
            arch.name(),
            "--entrypoint",
            r#"["/usr/local/bin/probe"]"#,
            "--cmd",
            "agent",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--label",
            &format!("{INPUTS_LABEL}={inputs}"),
            "--label",
            "org.opencontainers.image.title=clb-probe",
        ]);
        if let Some(hash) = &sbom_hash {
            config
                .arg("--annotation")
                .arg(format!("{SBOM_ANNOTATION}={hash}"));
        }
        output(config.arg(&ctr))?;
        let previous =
            output(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", tag]))
                .ok();
        output(Command::new("buildah").args(["commit", "--quiet", &ctr, tag]))?;
        // The image this tag named before would stay behind untagged, build after build.
        if let Some(id) = previous {
            let _ = Command::new("podman").args(["rmi", &id]).output();
        }
        Ok(())
    })();
    let _ = Command::new("buildah").args(["rm", &ctr]).output();
    result?;
    Ok((tag.to_string(), sbom))
}

/// Where the image build writes what goes with the images (SBOMs).
pub fn out_dir() -> PathBuf {
    workspace_root().join("target/image")
}

/// The release agent for `arch`: the host's in target/release, arm64 cross-compiled.
pub fn release_build(arch: Arch) -> anyhow::Result<PathBuf> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "--release", "--locked", "-p", "probe-user"])
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
        .filter(|e| e.file_name().to_string_lossy().starts_with("probe-user-"))
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

pub fn run(args: &ImageArgs) -> anyhow::Result<()> {
    let mut arches = if args.arch.is_empty() {
        Arch::ALL.to_vec()
    } else {
        args.arch.clone()
    };
    arches.dedup();
    if args.binary.is_some() && arches.len() != 1 {
        bail!("--binary needs a single --arch (it is built for one architecture)");
    }
    let tag = args.tag.clone().unwrap_or_else(default_tag);
    let mut binaries = Vec::new();
    for &arch in &arches {
        let binary = match &args.binary {
            Some(b) => b.clone(),
            None => release_build(arch)?,
        };
        binaries.push((arch, binary));
    }
    // Both agents carry the same programs: one bpfel object, whatever the userspace target.
    if args.binary.is_none() && arches.len() > 1 {
        let objects: Vec<(Arch, PathBuf)> = arches
            .iter()
            .map(|&a| Ok((a, ebpf_object(a)?)))
            .collect::<anyhow::Result<_>>()?;
        let (first_arch, first) = &objects[0];
        let first_code = ebpf_code(first)?;
        for (arch, object) in &objects[1..] {
            if ebpf_code(object)? != first_code {
                bail!(
                    "the eBPF programs differ between {} ({}) and {} ({}): they must be the \
                     same bytecode on every architecture",
                    first_arch.name(),
                    first.display(),
                    arch.name(),
                    object.display()
                );
            }
        }
        eprintln!(
            "image: eBPF programs, maps and relocations identical for {arches:?} ({} sections)",
            first_code.len()
        );
    }
    std::fs::create_dir_all(out_dir())?;
    let mut images = Vec::new();
    for (arch, binary) in &binaries {
        let rust_sbom = if args.no_sbom {
            None
        } else {
            Some(crate::supply::rust_sbom(
                arch.rust_target(),
                arch.name(),
                &out_dir(),
            )?)
        };
        let image_tag = if arches.len() == 1 {
            tag.clone()
        } else {
            format!("{tag}-{}", arch.name())
        };
        let (image, sbom) = build_arch(binary, &image_tag, *arch, rust_sbom.as_deref())?;
        if let Some(sbom) = sbom {
            eprintln!("image: SBOM {}", sbom.display());
        }
        println!("{image}");
        images.push(image);
    }
    if images.len() > 1 {
        manifest_list(&tag, &images)?;
        println!("{tag}");
    }
    Ok(())
}

/// The manifest list `tag` naming `images` (rebuilt each time: it is only references).
fn manifest_list(tag: &str, images: &[String]) -> anyhow::Result<()> {
    let _ = Command::new("buildah")
        .args(["manifest", "rm", tag])
        .output();
    output(Command::new("buildah").args(["manifest", "create", tag]))?;
    for image in images {
        output(Command::new("buildah").args([
            "manifest",
            "add",
            tag,
            &format!("containers-storage:{image}"),
        ]))?;
    }
    eprintln!("image: manifest list {tag} ({})", images.join(", "));
    Ok(())
}
