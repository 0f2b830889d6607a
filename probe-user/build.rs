use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // With AYA_BUILD_SKIP=1 (unit tests and tools that never load programs) aya-build writes
    // nothing; leave an empty object so the crate still compiles, and the loader says so.
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("probe");
        if !out.exists() {
            std::fs::write(&out, b"")?;
        }
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "probe-ebpf")
        .ok_or_else(|| anyhow!("probe-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("probe-ebpf has no manifest directory"))?;
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context(
        "building the eBPF programs (run `cargo xtask setup` if bpf-linker or rust-src is missing)",
    )
}
