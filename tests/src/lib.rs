//! Helpers for the root-only integration tests in `tests/tests/`: running the real agent in
//! the lab and reading what it wrote, and observing the kernel independently (bpftool).
//! The lab itself is `xtask::lab`. Run through `cargo xtask test` (one test at a time: the
//! tests share the lab's fixed namespaces).

pub mod agent;
pub mod kernel_view;
pub mod kube_fixture;
pub mod kube_names;
pub mod otlp;
pub mod readiness;
pub mod trafgen;
