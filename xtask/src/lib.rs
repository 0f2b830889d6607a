//! Developer and CI tasks for clb-probe; the lab is a library so the integration tests share it.

pub mod lab;
pub mod vm;
