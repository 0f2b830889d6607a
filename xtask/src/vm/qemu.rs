//! Running QEMU: accelerator choice, the command line, the console echo and log, the hard
//! timeout, and decoding what the guest reported.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::arch::Arch;

/// The exit code stage 1 reports when it cannot run the command at all.
pub const INFRA_FAILURE: i32 = 125;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

/// A console line without terminal control sequences (SeaBIOS clears the screen) or `\r`.
pub fn clean_console(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            // CSI runs to a final byte in @..~; other escapes (ESC c: reset) are two characters.
            '\x1b' => {
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// KVM only on real VT-x/AMD-V: a nested PVM backend (`kvm-pvm` in dmesg, no vmx/svm) makes
/// QEMU fail with MSR assertions, so everything else is software emulation.
pub fn choose_accel(cpuinfo: &str, dmesg: &str, dev_kvm: bool) -> Accel {
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if dev_kvm && hw && !dmesg.contains("kvm-pvm") && !dmesg.contains("kvm_pvm") {
        Accel::Kvm
    } else {
        Accel::Tcg
    }
}

/// The accelerator for this machine (`CLB_VM_ACCEL=tcg|kvm` overrides).
pub fn detect_accel() -> Accel {
    match std::env::var("CLB_VM_ACCEL").as_deref() {
        Ok("kvm") => return Accel::Kvm,
        Ok("tcg") => return Accel::Tcg,
        _ => {}
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let dmesg = Command::new("dmesg")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let pvm_module = Path::new("/sys/module/kvm_pvm").exists();
    let dmesg = if pvm_module {
        format!("{dmesg}\nkvm-pvm")
    } else {
        dmesg
    };
    choose_accel(&cpuinfo, &dmesg, Path::new("/dev/kvm").exists())
}

/// The guest kernel's command line on `arch` (the `virt` machine's console is a PL011).
pub fn kernel_cmdline_for(arch: Arch, extra: &[&str]) -> String {
    let console = match arch {
        Arch::Amd64 => "console=ttyS0",
        Arch::Arm64 => "console=ttyAMA0",
    };
    let mut args = vec![
        console,
        "rdinit=/init",
        // A dead PID 1 reboots at once, and -no-reboot turns that into qemu exiting.
        "panic=-1",
        "oops=panic",
        "quiet",
        "loglevel=4",
        // Cheaper syscalls under software emulation; nothing here tests speculation.
        "mitigations=off",
    ];
    if arch == Arch::Amd64 {
        args.push("8250.nr_uarts=1");
    }
    args.extend_from_slice(extra);
    args.join(" ")
}

/// Everything one boot needs.
#[derive(Debug, Clone)]
pub struct Boot {
    pub arch: Arch,
    pub accel: Accel,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    /// Exported read-only as `pkgs` (the package layer).
    pub pkgs: PathBuf,
    /// Exported read-write as `results`.
    pub results: PathBuf,
    pub memory_mib: u32,
    pub cpus: u32,
    /// Niceness of the QEMU process and every thread it starts (0: as the caller).
    pub nice: i32,
    /// Prefixes each echoed console line: `vm| ` and the kernel's name, so boots that run at
    /// once can be told apart in one log.
    pub echo_prefix: String,
}

/// [`Arch::qemu`]'s arguments for `boot`. arm64 is the `virt` machine under TCG (no KVM across
/// architectures) on a Cortex-A57: `max` would add pointer authentication, whose emulation
/// costs much of the guest's time. It has no isa-debug-exit: the exit code comes back in the
/// results share's `rc` only, and a guest that powers off without one reads as no report.
pub fn qemu_args(boot: &Boot) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |s: &str| a.push(s.to_string());
    match (boot.arch, boot.accel) {
        (Arch::Arm64, _) => {
            for s in [
                "-machine",
                "virt",
                "-accel",
                "tcg,thread=multi",
                "-cpu",
                "cortex-a57",
            ] {
                push(s);
            }
        }
        (Arch::Amd64, Accel::Kvm) => {
            push("-accel");
            push("kvm");
            push("-cpu");
            push("host");
        }
        (Arch::Amd64, Accel::Tcg) => {
            push("-accel");
            push("tcg,thread=multi");
            push("-cpu");
            push("max");
        }
    }
    for s in [
        "-m",
        &format!("{}M", boot.memory_mib),
        "-smp",
        &boot.cpus.to_string(),
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
        "-kernel",
    ] {
        push(s);
    }
    a.push(boot.kernel.display().to_string());
    a.push("-initrd".into());
    a.push(boot.initrd.display().to_string());
    a.push("-append".into());
    a.push(boot.cmdline.clone());
    let share = |path: &Path, tag: &str, ro: bool| {
        format!(
            "local,path={},mount_tag={tag},security_model=none,{}multidevs=remap",
            path.display(),
            if ro { "readonly=on," } else { "" }
        )
    };
    for (path, tag, ro) in [
        (Path::new("/"), "host", true),
        (boot.pkgs.as_path(), "pkgs", true),
        (boot.results.as_path(), "results", false),
    ] {
        a.push("-virtfs".into());
        a.push(share(path, tag, ro));
    }
    if boot.arch == Arch::Amd64 {
        a.push("-device".into());
        a.push("isa-debug-exit,iobase=0xf4,iosize=0x04".into());
    }
    a
}

/// How the boot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The guest reported this exit code through isa-debug-exit.
    Reported(i32),
    /// QEMU exited 0: the guest powered off or rebooted (panic) without reporting.
    NoReport,
    /// QEMU itself failed (bad arguments, missing accelerator, ...).
    QemuError(i32),
    /// QEMU was killed by a signal.
    Signal,
    /// The hard timeout fired and QEMU was killed.
    Timeout,
}

/// Decodes QEMU's exit status: isa-debug-exit makes it exit with `value << 1 | 1`.
pub fn decode_exit(code: Option<i32>) -> Ending {
    match code {
        None => Ending::Signal,
        Some(0) => Ending::NoReport,
        Some(c) if c & 1 == 1 => Ending::Reported(c >> 1),
        Some(c) => Ending::QemuError(c),
    }
}

/// Boots, echoes the console (prefixed) and writes it to `log`; kills QEMU after `timeout`.
pub fn run(boot: &Boot, log: &Path, timeout: Duration) -> anyhow::Result<Ending> {
    let args = qemu_args(boot);
    let qemu = boot.arch.qemu();
    let mut command = Command::new(qemu);
    if boot.nice != 0 {
        let nice = boot.nice;
        // In the child before exec, so the vCPU and I/O threads QEMU starts inherit it (on
        // Linux niceness is per thread: renicing the pid after spawn could miss them).
        // SAFETY: setpriority is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                if libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "starting {qemu} (install {}: cargo xtask setup)",
                boot.arch.qemu_package()
            )
        })?;
    let mut logf =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let stderr = child.stderr.take().context("qemu stderr")?;
    let prefix = boot.echo_prefix.clone();
    let echo = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        let mut out = std::io::stdout();
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            let text = clean_console(&String::from_utf8_lossy(&line));
            let _ = writeln!(logf, "{text}");
            let _ = writeln!(out, "{prefix}{text}");
            line.clear();
        }
        let _ = logf.flush();
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = echo.join();
    let stderr = err.join().unwrap_or_default();
    let Some(status) = status else {
        return Ok(Ending::Timeout);
    };
    let ending = decode_exit(status.code());
    if let Ending::QemuError(c) = ending {
        bail!("{qemu} failed with exit code {c}: {}", stderr.trim());
    }
    if !stderr.trim().is_empty() {
        eprintln!("vm: qemu said: {}", stderr.trim());
    }
    Ok(ending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_console_lines() {
        assert_eq!(
            clean_console("\x1bc\x1b[?7l\x1b[2J\x1b[0mSeaBIOS (version 1.16)\r\n"),
            "SeaBIOS (version 1.16)"
        );
        assert_eq!(clean_console("a\tb"), "a\tb");
    }

    #[test]
    fn decodes_isa_debug_exit() {
        assert_eq!(decode_exit(Some(1)), Ending::Reported(0));
        assert_eq!(decode_exit(Some(3)), Ending::Reported(1));
        assert_eq!(decode_exit(Some(251)), Ending::Reported(125));
        assert_eq!(decode_exit(Some(0)), Ending::NoReport);
        assert_eq!(decode_exit(Some(2)), Ending::QemuError(2));
        assert_eq!(decode_exit(None), Ending::Signal);
    }

    #[test]
    fn accel_only_on_real_virtualisation() {
        let vmx = "processor: 0\nflags\t\t: fpu vme vmx sse\n";
        let none = "flags\t\t: fpu vme sse\n";
        assert_eq!(choose_accel(vmx, "", true), Accel::Kvm);
        assert_eq!(choose_accel(vmx, "", false), Accel::Tcg);
        assert_eq!(choose_accel(none, "", true), Accel::Tcg);
        assert_eq!(choose_accel(vmx, "[0.1] kvm-pvm: loaded", true), Accel::Tcg);
    }

    /// A 2-CPU, 1 GiB boot of `kernel` with the initrd, packages and results at fixed paths.
    fn test_boot(arch: Arch, accel: Accel, kernel: &str, cmdline: String) -> Boot {
        Boot {
            arch,
            accel,
            kernel: kernel.into(),
            initrd: "/r/initramfs.cpio".into(),
            cmdline,
            pkgs: "/c/root".into(),
            results: "/r/results".into(),
            memory_mib: 1024,
            cpus: 2,
            nice: 0,
            echo_prefix: "vm| ".into(),
        }
    }

    #[test]
    fn cmdline_and_args() {
        let c = kernel_cmdline_for(Arch::Amd64, &["clb.test=1"]);
        assert!(c.starts_with("console=ttyS0 rdinit=/init panic=-1"));
        assert!(c.ends_with(" clb.test=1"));
        assert!(c.contains(" 8250.nr_uarts=1"));
        let boot = test_boot(Arch::Amd64, Accel::Tcg, "/c/vmlinuz", c);
        let a = qemu_args(&boot).join(" ");
        assert!(a.starts_with("-accel tcg,thread=multi -cpu max -m 1024M -smp 2 -nographic"));
        assert!(a.contains(
            "-virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"
        ));
        assert!(a.contains(
            "local,path=/c/root,mount_tag=pkgs,security_model=none,readonly=on,multidevs=remap"
        ));
        assert!(
            a.contains("local,path=/r/results,mount_tag=results,security_model=none,multidevs=")
        );
        assert!(a.ends_with("-device isa-debug-exit,iobase=0xf4,iosize=0x04"));
    }

    #[test]
    fn aarch64_is_the_virt_machine_under_tcg() {
        let c = kernel_cmdline_for(Arch::Arm64, &[]);
        assert!(
            c.starts_with("console=ttyAMA0 rdinit=/init panic=-1"),
            "{c}"
        );
        assert!(!c.contains("8250"), "{c}");
        // KVM on the host does not carry over to another architecture.
        let boot = test_boot(Arch::Arm64, Accel::Kvm, "/c/Image", c);
        let a = qemu_args(&boot).join(" ");
        assert!(
            a.starts_with("-machine virt -accel tcg,thread=multi -cpu cortex-a57 -m 1024M -smp 2"),
            "{a}"
        );
        assert!(a.contains("-kernel /c/Image -initrd /r/initramfs.cpio"));
        assert!(a.contains("mount_tag=pkgs"));
        assert!(!a.contains("isa-debug-exit"), "{a}");
        assert_eq!(Arch::Arm64.qemu(), "qemu-system-aarch64");
        assert_eq!(Arch::Arm64.qemu_package(), "qemu-system-arm");
    }
}
