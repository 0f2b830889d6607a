#![no_std]
// This file exists so probe-user can name probe-ebpf as a build-dependency: cargo then
// reruns probe-user/build.rs (which builds the real object) when the programs change.
