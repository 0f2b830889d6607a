//! Where the tools the tests and xtask's commands run are found: the PATH (with the sbin
//! directories a root shell may lack), and the prefixes `cargo xtask setup` installs into (its
//! Python venv, its npm prefix). Lookups only: installing is xtask's (`xtask/src/setup.rs`).

use std::path::PathBuf;

/// `cmd` on the PATH, or in /usr/sbin or /sbin.
pub fn which(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// `$HOME`, else /root.
pub fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// Setup's Python venv.
pub fn venv_dir() -> PathBuf {
    home().join(".local/share/clb-probe/venv")
}

/// A command installed in setup's Python venv.
pub fn venv_bin(name: &str) -> PathBuf {
    venv_dir().join("bin").join(name)
}

/// Whether setup's venv has a Python module (a package directory in its site-packages).
pub fn venv_has_module(module: &str) -> bool {
    std::fs::read_dir(venv_dir().join("lib"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| e.path().join("site-packages").join(module).is_dir())
        })
        .unwrap_or(false)
}

/// Where setup installs npm packages (`npm install --prefix`).
pub fn node_prefix() -> PathBuf {
    home().join(".local/share/clb-probe/node")
}
