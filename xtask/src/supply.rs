//! The supply chain: what the image is made of (CycloneDX SBOMs), what the dependency tree may
//! hold (`cargo deny` with the repo's `deny.toml`), and whether a release build is reproducible
//! (`cargo xtask repro`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{setup, workspace_root};

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The Rust dependency tree of the agent as built for `rust_target` (cargo-cyclonedx, only the
/// dependencies that target links), as a CycloneDX JSON file `probe-user-<arch>.rust.cdx.json`
/// in `out` (the image's output folder).
pub fn rust_sbom(rust_target: &str, arch: &str, out: &Path) -> anyhow::Result<PathBuf> {
    setup::cargo_tool(setup::CYCLONEDX)?;
    let name = format!("probe-user-{arch}.rust.cdx");
    let root = workspace_root();
    let status = cargo()
        .args(["cyclonedx", "--format", "json", "--spec-version", "1.5"])
        .args(["--target", rust_target])
        .args(["--override-filename", &name])
        .arg("--manifest-path")
        .arg(root.join("probe-user/Cargo.toml"))
        .current_dir(&root)
        .status()
        .context("failed to start cargo cyclonedx")?;
    if !status.success() {
        bail!("cargo cyclonedx failed ({status})");
    }
    // cargo-cyclonedx writes one next to every workspace member's manifest; only the agent's
    // is wanted, and it belongs with the image.
    for member in [
        "probe-common",
        "probe-contract",
        "probe-core",
        "probe-client",
        "probe-ebpf",
        "test-support",
        "tests",
        "xtask",
    ] {
        let _ = std::fs::remove_file(root.join(member).join(format!("{name}.json")));
    }
    let written = root.join("probe-user").join(format!("{name}.json"));
    let dest = out.join(format!("{name}.json"));
    std::fs::create_dir_all(out)?;
    std::fs::rename(&written, &dest)
        .with_context(|| format!("moving {} to {}", written.display(), dest.display()))?;
    Ok(dest)
}

/// A Debian package from its archive file name (`name_version_arch.deb`, `:` as `%3a`).
fn deb_component(file: &str) -> Option<serde_json::Value> {
    let stem = file.strip_suffix(".deb")?;
    let mut parts = stem.split('_');
    let (name, version, arch) = (parts.next()?, parts.next()?, parts.next()?);
    let version = version.replace("%3a", ":");
    let purl = format!(
        "pkg:deb/debian/{name}@{}?arch={arch}",
        version.replace(':', "%3A").replace('+', "%2B")
    );
    Some(serde_json::json!({
        "type": "library",
        "bom-ref": purl,
        "name": name,
        "version": version,
        "purl": purl,
    }))
}

/// The image's SBOM: the Rust SBOM with the rootfs' Debian packages (`debs`, archive file
/// names) added as components, written to `out`.
pub fn write_image_sbom(rust: &Path, debs: &[String], out: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(rust).with_context(|| format!("reading {}", rust.display()))?;
    let mut bom: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", rust.display()))?;
    let components = bom
        .get_mut("components")
        .and_then(|c| c.as_array_mut())
        .with_context(|| format!("{} has no components", rust.display()))?;
    let before = components.len();
    components.extend(debs.iter().filter_map(|d| deb_component(d)));
    if components.len() - before != debs.len() {
        bail!("unparsable Debian package file names in {debs:?}");
    }
    std::fs::write(out, serde_json::to_vec_pretty(&bom)?)
        .with_context(|| format!("writing {}", out.display()))
}

/// Where cargo-deny keeps the RustSec advisory database (`db-path` in deny.toml).
fn advisory_dbs() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| test_support::tools::home().join(".cargo"))
        .join("advisory-dbs")
}

fn has_advisory_db() -> bool {
    std::fs::read_dir(advisory_dbs()).is_ok_and(|d| {
        d.filter_map(|e| e.ok())
            .any(|e| e.path().join("crates").is_dir())
    })
}

/// `cargo deny check` with the repo's deny.toml: licenses, bans (duplicate versions warn),
/// sources, always; advisories from the local database, fetched (or updated) first when the
/// network allows. No database and none fetchable: the advisories check is skipped with a
/// line saying so, never failed for want of a network. An advisory in a database that is
/// there fails it.
pub fn deny() -> anyhow::Result<()> {
    setup::cargo_tool(setup::DENY)?;
    let root = workspace_root();
    // cargo deny reads every package of the lock file, other platforms' too (windows-sys),
    // which no build here downloads: fetched first, the lock file as it is, so the `--frozen`
    // checks below find them on a fresh machine (crates.io is reachable; no-op when cached).
    let status = cargo()
        .args(["fetch", "--locked"])
        .current_dir(&root)
        .status()
        .context("failed to start cargo fetch")?;
    if !status.success() {
        bail!("cargo fetch --locked failed ({status}): cargo deny needs every locked package");
    }
    // `--frozen`: the lock file as it is, nothing fetched (the database is fetched below).
    let check = |what: &[&str]| -> anyhow::Result<()> {
        let status = cargo()
            .args(["deny", "--frozen", "check", "--hide-inclusion-graph"])
            .args(what)
            .current_dir(&root)
            .status()
            .context("failed to start cargo deny")?;
        if !status.success() {
            bail!("cargo deny check {} failed ({status})", what.join(" "));
        }
        Ok(())
    };
    check(&["licenses", "bans", "sources"])?;
    // Fetching is git over the network: a bounded attempt, then whatever database is here.
    let fetched = Command::new("timeout")
        .args(["60", "cargo", "deny", "fetch", "db"])
        .current_dir(&root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !fetched && !has_advisory_db() {
        eprintln!(
            "test: cargo deny: SKIPPING advisories: no advisory database in {} and none \
             fetchable (no network); licenses, bans and sources were checked",
            advisory_dbs().display()
        );
        return Ok(());
    }
    if !fetched {
        eprintln!(
            "test: cargo deny: advisory database not updated (no network): using the local one"
        );
    }
    check(&["advisories"])
}

/// `cargo xtask repro`: two release builds of this checkout, each in a fresh target directory
/// of its own, compared byte for byte (the agent, the plugin, and the embedded eBPF object).
pub fn repro() -> anyhow::Result<()> {
    let root = workspace_root();
    let base = root.join("target/repro");
    let mut built = Vec::new();
    for run in ["a", "b"] {
        let dir = base.join(run);
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("repro: release build {run} into {}", dir.display());
        let start = std::time::Instant::now();
        let status = cargo()
            // The agent and the plugin (probe-client's binary).
            .args(["build", "--release", "--locked"])
            .args(["-p", "clb-probe", "-p", "clb-probe-client"])
            .arg("--target-dir")
            .arg(&dir)
            .current_dir(&root)
            .status()?;
        if !status.success() {
            bail!("release build {run} failed");
        }
        eprintln!(
            "repro: build {run} took {:.0} s",
            start.elapsed().as_secs_f64()
        );
        built.push(dir);
    }
    let mut differ = Vec::new();
    for file in ["release/probe", "release/kubectl-clb_probe"] {
        let (a, b) = (built[0].join(file), built[1].join(file));
        let same = std::fs::read(&a)? == std::fs::read(&b)?;
        println!("{file}: {}", if same { "identical" } else { "DIFFERS" });
        if !same {
            differ.push(file.to_string());
        }
    }
    if differ.is_empty() {
        println!("repro: the release build is byte-for-byte reproducible");
        for dir in &built {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    } else {
        bail!(
            "{differ:?} differ between two builds (kept in {} for diffoscope)",
            base.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::deb_component;

    #[test]
    fn debian_packages_become_purls() {
        let c = deb_component("libgmp10_2%3a6.2.1+dfsg1-1.1_arm64.deb").unwrap();
        assert_eq!(c["name"], "libgmp10");
        assert_eq!(c["version"], "2:6.2.1+dfsg1-1.1");
        assert_eq!(
            c["purl"],
            "pkg:deb/debian/libgmp10@2%3A6.2.1%2Bdfsg1-1.1?arch=arm64"
        );
        assert!(deb_component("not-a-deb.tar").is_none());
        assert!(deb_component("name-only.deb").is_none());
    }
}
