//! The readers' captured fixtures under `probe-user/tests/data/` (real kernel replies and rule
//! sets), for their tests.

use std::path::{Path, PathBuf};

/// `tests/data/<path>` of this package.
pub fn data_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path)
}

/// The bytes of [`data_file`]`(path)`; panics naming the file when it cannot be read.
pub fn data_bytes(path: &str) -> Vec<u8> {
    let p = data_file(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
