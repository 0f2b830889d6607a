//! The checked-in eBPF object (`probe-user/ebpf-prebuilt/`, what a first run without the eBPF
//! toolchain embeds) is byte for byte the object this checkout builds: it cannot drift from
//! the source. Runs wherever the toolchain built the object (`cargo xtask test` installs it).

/// This build's object, as the agent embeds it.
const THIS_BUILD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe"));

#[test]
fn the_checked_in_ebpf_object_is_this_build() {
    let source = env!("CLB_EBPF_OBJECT_SOURCE");
    let prebuilt_path = env!("CLB_EBPF_PREBUILT");
    if source != "built" {
        eprintln!("not checked: this build used the {source} object, not a fresh one");
        return;
    }
    let Ok(prebuilt) = std::fs::read(prebuilt_path) else {
        eprintln!("not checked: no checked-in object for this target ({prebuilt_path})");
        return;
    };
    assert!(
        prebuilt == THIS_BUILD,
        "{prebuilt_path} ({} bytes) differs from this build's object ({} bytes): after changing \
         probe-ebpf or its toolchain, refresh it: cp {}/probe {prebuilt_path}",
        prebuilt.len(),
        THIS_BUILD.len(),
        env!("OUT_DIR"),
    );
}
