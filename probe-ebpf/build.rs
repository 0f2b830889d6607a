fn main() {
    // Relink when bpf-linker changes (a new LLVM under it changes the object).
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
