//! Builds the eBPF programs (probe-ebpf) into `OUT_DIR/probe`, which the agent embeds.
//!
//! With the eBPF toolchain (the nightly's rust-src and bpf-linker) the object is built from
//! source, path-independently (cargo's `trim-paths`), so every checkout builds the same bytes.
//! Without it, the checked-in object of this target (`probe-user/ebpf-prebuilt/`) is used: a
//! first run needs neither the nightly's rust-src nor a source build of bpf-linker
//! (docs/decisions.md, "The eBPF object of a first run"). A unit test proves the checked-in
//! object identical to a fresh build wherever the toolchain is present (`cargo xtask test`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

/// How the object came to be, for the drift test (`CLB_EBPF_OBJECT_SOURCE`).
const BUILT: &str = "built";
const PREBUILT: &str = "prebuilt";
const SKIPPED: &str = "skipped";

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("probe");
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let prebuilt = manifest_dir.join(prebuilt_name()?);
    println!("cargo:rerun-if-changed={}", prebuilt.display());
    println!("cargo:rustc-env=CLB_EBPF_PREBUILT={}", prebuilt.display());
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    // With AYA_BUILD_SKIP=1 (unit tests and tools that never load programs) aya-build writes
    // nothing; leave an empty object so the crate still compiles, and the loader says so.
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        if !out.exists() {
            std::fs::write(&out, b"")?;
        }
        println!("cargo:rustc-env=CLB_EBPF_OBJECT_SOURCE={SKIPPED}");
    }
    let ebpf_dir = ebpf_package_dir()?;
    if !skip && !ebpf_toolchain_present() && prebuilt.is_file() {
        // Edits to the programs rerun this script (aya-build says the same when it builds).
        println!("cargo:rerun-if-changed={}", ebpf_dir.display());
        println!(
            "cargo:warning=no eBPF toolchain (nightly rust-src, bpf-linker): using the checked-in {} \
             (changes to probe-ebpf need `cargo xtask setup`)",
            prebuilt.display()
        );
        std::fs::copy(&prebuilt, &out).context("copying the checked-in eBPF object")?;
        println!("cargo:rustc-env=CLB_EBPF_OBJECT_SOURCE={PREBUILT}");
        return Ok(());
    }
    // The nested nightly cargo that aya-build starts inherits these. `trim-paths` rewrites the
    // source paths in the object's debuginfo and BTF line info (this checkout's folder, the
    // cargo registry's, the nightly's rust-src) to relative or `/rustc/<hash>` ones, so the
    // bytes do not depend on where the checkout is. aya-build replaces RUSTFLAGS, so a
    // `--remap-path-prefix` cannot come that way. Cargo's unstable table as environment:
    // https://doc.rust-lang.org/cargo/reference/unstable.html#trim-paths
    // SAFETY: a build script is single-threaded here; nothing reads the environment meanwhile.
    unsafe {
        std::env::set_var("CARGO_UNSTABLE_TRIM_PATHS", "true");
        std::env::set_var("CARGO_PROFILE_RELEASE_TRIM_PATHS", "all");
        // The workspace's release profile links the agent with fat LTO in one codegen unit
        // (Cargo.toml); the eBPF object keeps cargo's defaults, so bpf-linker links the same
        // instructions as before (only the symbols' hashes moved: docs/decisions.md).
        std::env::set_var("CARGO_PROFILE_RELEASE_LTO", "false");
        std::env::set_var("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16");
    }
    aya_build::build_ebpf(
        [Package {
            name: "probe-ebpf",
            root_dir: ebpf_dir
                .to_str()
                .ok_or_else(|| anyhow!("probe-ebpf's path is not UTF-8"))?,
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context(
        "building the eBPF programs (run `cargo xtask setup` if bpf-linker or rust-src is missing)",
    )?;
    if !skip {
        println!("cargo:rustc-env=CLB_EBPF_OBJECT_SOURCE={BUILT}");
    }
    Ok(())
}

/// `ebpf-prebuilt/<bpfel|bpfeb>-<arch>.o`: the programs differ per endianness and per
/// `bpf_target_arch` (aya-build's cfg, from the agent's target).
fn prebuilt_name() -> anyhow::Result<String> {
    let endian = std::env::var("CARGO_CFG_TARGET_ENDIAN")?;
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let bpf = if endian == "big" { "bpfeb" } else { "bpfel" };
    Ok(format!("ebpf-prebuilt/{bpf}-{arch}.o"))
}

fn ebpf_package_dir() -> anyhow::Result<PathBuf> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "probe-ebpf")
        .ok_or_else(|| anyhow!("probe-ebpf package not found"))?;
    ebpf.manifest_path
        .parent()
        .map(|p| p.as_std_path().to_path_buf())
        .ok_or_else(|| anyhow!("probe-ebpf has no manifest directory"))
}

/// What aya-build's nested build needs: bpf-linker on the PATH and the nightly's rust-src
/// (`-Z build-std=core`). Checked the way `cargo xtask setup` installs them.
fn ebpf_toolchain_present() -> bool {
    let has_linker = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("bpf-linker").is_file()));
    has_linker && nightly_has_rust_src()
}

fn nightly_has_rust_src() -> bool {
    let Ok(out) = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
    else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout);
    out.status.success()
        && Path::new(sysroot.trim())
            .join("lib/rustlib/src/rust/library/core")
            .is_dir()
}
