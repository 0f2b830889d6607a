use super::*;

#[test]
fn quotes_for_the_shell() {
    assert_eq!(shell_quote("a b"), "'a b'");
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(shell_quote(""), "''");
}

#[test]
fn command_script_exports_and_cds() {
    let s = command_script(
        "target/debug/deps/it-123 --test-threads=1",
        &["RUST_LOG=debug".into(), "X=a'b c".into()],
        Path::new("/work/main"),
    )
    .unwrap();
    assert_eq!(
        s,
        "# written by cargo xtask vm-test\n\
         export CLB_VM=1 CLB_VM_RESULTS=/clb-vm\n\
         export RUST_LOG='debug'\n\
         export X='a'\\''b c'\n\
         cd '/work/main' || { echo \"vm-test: the workspace \"'/work/main'\" is not \
         visible in the guest\"; exit 125; }\n\
         target/debug/deps/it-123 --test-threads=1\n"
    );
    assert!(command_script("true", &["NOEQUALS".into()], Path::new("/")).is_err());
    assert!(command_script("true", &["1X=1".into()], Path::new("/")).is_err());
    assert!(command_script("true", &["A-B=1".into()], Path::new("/")).is_err());
}

#[test]
fn kernel_choice() {
    let all: Vec<_> = kernels_of("all").unwrap().iter().map(|k| k.name).collect();
    assert_eq!(all, ["5.10", "6.1", "6.12"]);
    assert_eq!(kernels_of("6.12").unwrap()[0].suite, "trixie");
    assert!(kernels_of("4.19").is_err());
}

#[test]
fn arch_selects_kernels_and_host_packages() {
    let amd: Vec<_> = kernels_for(Arch::Amd64, "all")
        .unwrap()
        .iter()
        .map(|k| k.name)
        .collect();
    assert_eq!(amd, ["5.10", "6.1", "6.12"]);
    let arm = kernels_for(Arch::Arm64, "all").unwrap();
    assert_eq!(arm.len(), 1);
    assert!(arm[0].package.ends_with("-arm64"), "{}", arm[0].package);
    assert!(kernels_for(Arch::Arm64, "5.10").is_err());
    let arm64 = |kernel: &str| VmArgs {
        arch: Arch::Arm64,
        kernel: kernel.into(),
        ..VmArgs::default()
    };
    assert!(check_args(&arm64("6.1")).is_ok());
    assert!(check_args(&arm64("all")).is_ok());
    let e = check_args(&arm64("6.12")).unwrap_err();
    assert!(e.contains("amd64-only"), "{e}");
    assert!(check_args(&VmArgs::default()).is_ok());
    assert_eq!(VmArgs::default().arch, Arch::Amd64);
    let cmds: Vec<_> = host_packages_for(Arch::Arm64)
        .iter()
        .map(|(_, c)| *c)
        .collect();
    assert_eq!(cmds, ["qemu-system-aarch64", "kmod"]);
    assert_eq!(host_packages_for(Arch::Amd64), host_packages());
}

#[test]
fn host_packages_name_their_commands() {
    let cmds: Vec<_> = host_packages().iter().map(|(_, c)| *c).collect();
    assert_eq!(cmds, ["qemu-system-x86_64", "busybox", "xz"]);
}

#[test]
fn smoke_script_checks_what_the_tier_promises() {
    for needle in [
        "uname -r",
        "modprobe ip_vs ip_vs_rr dummy",
        "ipvsadm -Ln",
        "/sys/kernel/btf/vmlinux",
        "SKB_DROP_REASON_",
    ] {
        assert!(SMOKE.contains(needle), "{needle}");
    }
}

/// Boots the real VM (needs root and the Debian archive):
/// `cargo test -p xtask vm::tests::smoke_boot -- --ignored --nocapture`.
#[test]
#[ignore]
fn smoke_boot() {
    run(&VmArgs {
        smoke: true,
        kernel: "6.1".into(),
        ..VmArgs::default()
    })
    .unwrap();
}
