//! `cargo xtask image`: the agent's container image, built here without pulling from a
//! container registry. A Debian rootfs is assembled from the machine's own Debian mirror
//! (apt resolves the dependency closure of exactly the packages whose tools the agent runs;
//! `dpkg -x` unpacks them), the release binary is added, and buildah commits the image to
//! local storage (`podman run localhost/clb-probe:<version>`).
//!
//! Cached for CI: the rootfs tarball (in ~/.local/share/clb-probe/image, which a fresh clone
//! reuses) is keyed by the resolved package versions, and the image carries a label of its
//! inputs (rootfs key + binary hash), so an unchanged build downloads and commits nothing.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

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

#[derive(Debug, Clone, clap::Args)]
pub struct ImageArgs {
    /// The agent binary to put in the image (default: a release build, built first).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Image name (default localhost/clb-probe:<version>).
    #[arg(long)]
    pub tag: Option<String>,
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

/// apt with an empty dpkg status: resolves the full closure from the machine's mirror into
/// our own archive cache, never touching the host's package state.
fn apt(archives: &Path, status: &Path) -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.args([
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "--download-only",
    ])
    .arg(format!("-o=Dir::State::status={}", status.display()))
    .arg(format!("-o=Dir::Cache::archives={}", archives.display()))
    .arg("-o=Debug::NoLocking=1")
    // Our cache is root's: apt's _apt sandbox user could not write it.
    .arg("-o=APT::Sandbox::User=root")
    .args(PACKAGES)
    .env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// The rootfs tarball (cached by the resolved .deb file names, which carry the versions).
fn rootfs() -> anyhow::Result<(PathBuf, String)> {
    let apt_dir = cache_dir().join("apt");
    let archives = apt_dir.join("archives");
    std::fs::create_dir_all(archives.join("partial"))?;
    let status = apt_dir.join("status");
    std::fs::write(&status, "")?;
    let uris = output(apt(&archives, &status).arg("--print-uris"))
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
    let key_file = apt_dir.join("closure.txt");
    std::fs::write(&key_file, &list)?;
    let key = sha256(&key_file)?[..16].to_string();
    let tar = cache_dir().join(format!("rootfs-{key}.tar"));
    if tar.is_file() {
        eprintln!("image: Debian rootfs {key} cached");
        return Ok((tar, key));
    }
    eprintln!("image: downloading {PACKAGES:?} and their dependencies from the Debian mirror");
    let status_code = apt(&archives, &status)
        .status()
        .context("apt-get --download-only")?;
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
    Ok((tar, key))
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

/// Builds (or finds up to date) the image with `binary` as the agent; returns its tag.
pub fn build(binary: &Path, tag: &str) -> anyhow::Result<String> {
    if !setup::is_root() {
        bail!("building the image needs root (rootful buildah storage): run as root");
    }
    for tool in ["buildah", "podman", "apt-get", "dpkg"] {
        if setup::which(tool).is_none() {
            bail!("{tool} is not installed: run `cargo xtask setup`");
        }
    }
    let (tar, key) = rootfs()?;
    let inputs = format!("{key}-{}", &sha256(binary)?[..16]);
    if image_inputs(tag).as_deref() == Some(inputs.as_str()) {
        eprintln!("image: {tag} up to date");
        return Ok(tag.to_string());
    }
    eprintln!("image: assembling {tag} with buildah");
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
        output(Command::new("buildah").args([
            "config",
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
            &ctr,
        ]))?;
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
    Ok(tag.to_string())
}

pub fn run(args: &ImageArgs) -> anyhow::Result<()> {
    let binary = match &args.binary {
        Some(b) => b.clone(),
        None => {
            eprintln!("image: cargo build --release -p probe-user");
            let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args(["build", "--release", "--locked", "-p", "probe-user"])
                .current_dir(workspace_root())
                .status()?;
            if !status.success() {
                bail!("the release build failed");
            }
            workspace_root().join("target/release/probe")
        }
    };
    let tag = build(&binary, args.tag.as_deref().unwrap_or(&default_tag()))?;
    println!("{tag}");
    Ok(())
}
