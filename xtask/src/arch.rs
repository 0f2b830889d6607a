//! The two CPU architectures xtask builds for and boots (`--arch` of `image` and `vm-test`), and
//! what each tool calls them: Debian and OCI, Rust, QEMU. One enum for both commands, so an
//! image and a VM guest of the same architecture are the same value.

use std::path::PathBuf;

use crate::workspace_root;

/// A CPU architecture (Debian's and the OCI names agree for these two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Arch {
    /// x86-64, the host's own (qemu-system-x86_64 with the host's userland)
    #[default]
    Amd64,
    /// aarch64, cross-compiled (qemu-system-aarch64, machine `virt`, TCG, an arm64 userland)
    Arm64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// Debian's (and OCI's) name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target the agent is built for.
    pub const fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The machine's own architecture (the images are built on amd64).
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Arm64
        } else {
            Arch::Amd64
        }
    }

    /// Where `cargo build --release --target <rust_target>` leaves the agent.
    pub fn release_binary(self) -> PathBuf {
        workspace_root()
            .join("target")
            .join(self.rust_target())
            .join("release/probe")
    }

    /// The QEMU system emulator.
    pub fn qemu(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    /// The Debian package that has [`Arch::qemu`].
    pub fn qemu_package(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-system-x86",
            Arch::Arm64 => "qemu-system-arm",
        }
    }
}
