//! Developer and CI tasks for clb-probe. The lab and the fake Kubernetes API they drive live in
//! the test-support crate, which the tests share.

pub mod arch;
pub mod bench;
pub mod build;
pub mod chaos;
pub mod chart;
pub mod demo;
pub mod image;
pub mod setup;
pub mod supply;
pub mod testrun;
pub mod vm;

/// The workspace root (xtask is one of its members); commands run from here.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}
