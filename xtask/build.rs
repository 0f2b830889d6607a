//! Empty: it only makes cargo resolve xtask's `[build-dependencies]`, which align the derive
//! macros' features with the agent's (Cargo.toml says why).
fn main() {}
