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

mod agent;
mod rootfs;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

pub use agent::{ebpf_code, ebpf_object, release_build};
use anyhow::bail;
use rootfs::rootfs;

pub use crate::arch::Arch;
use crate::{setup, workspace_root};

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

/// [`setup::output`], trimmed.
fn output(cmd: &mut Command) -> anyhow::Result<String> {
    Ok(setup::output(cmd)?.trim().to_string())
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = output(Command::new("sha256sum").arg(path))?;
    Ok(out
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
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
        if test_support::tools::which(tool).is_none() {
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
