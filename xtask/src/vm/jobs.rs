//! The boots as jobs: one per kernel (and the arm64 run), prepared once ([`prepare`]) and run
//! in lanes ([`run_jobs`]: `--lanes` guests at once), each decided PASS or FAIL ([`verdict`]).

use std::time::Instant;

use super::*;

/// One kernel's boot: what it produced (None when it could not boot), its verdict and time.
#[derive(Debug)]
pub struct KernelRun {
    pub kernel: &'static KernelSpec,
    pub arch: Arch,
    pub outcome: Option<Outcome>,
    pub verdict: Result<(), String>,
    pub secs: f64,
}

/// A boot's name in logs and verdicts: the kernel's matrix name, with ` arm64` for the arm64 run.
pub(super) fn label(arch: Arch, spec: &KernelSpec) -> String {
    match arch {
        Arch::Amd64 => spec.name.to_string(),
        Arch::Arm64 => format!("{} arm64", spec.name),
    }
}

impl KernelRun {
    /// [`label`] of this run.
    pub fn label(&self) -> String {
        label(self.arch, self.kernel)
    }
}

/// Ok when every kernel passed, else an error naming the ones that did not.
pub fn verdict(runs: &[KernelRun]) -> anyhow::Result<()> {
    let failed: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            r.verdict
                .as_ref()
                .err()
                .map(|why| format!("{}: {why}", r.label()))
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("vm-test failed on {}", failed.join("; "))
    }
}

/// [`run`], returning each boot (their output carries the libtest summaries). Every selected
/// kernel boots, also after one failed; the suite's binaries are built once for all.
pub fn run_with_output(args: &VmArgs) -> anyhow::Result<Vec<KernelRun>> {
    if args.fetch_only {
        for spec in kernels_for(args.arch, &args.kernel)? {
            let k = ensure_kernel(args.arch, spec)?;
            println!(
                "vm-test: {} cached: {}={} ({})",
                spec.name, k.package, k.version, k.release
            );
        }
        return Ok(Vec::new());
    }
    let jobs = prepare(args)?;
    Ok(run_jobs(&jobs, args.lanes))
}

/// One boot to run: its arguments (the architecture among them), its kernel and the suite's
/// binaries (None for `-c` and `--smoke`).
#[derive(Debug)]
pub struct Job {
    pub args: VmArgs,
    pub spec: &'static KernelSpec,
    pub bins: Option<std::sync::Arc<suite::Bins>>,
    /// How many kernels `args` selected (`--out` gets a subfolder per kernel when several).
    pub of: usize,
}

/// Everything before `args`'s boots: the host packages, the suite's binaries (built once for
/// all its kernels) and each kernel in the cache, fetched one after another (apt and the cache
/// are not shared safely). A kernel that cannot be fetched fails its own boot, with the reason.
pub fn prepare(args: &VmArgs) -> anyhow::Result<Vec<Job>> {
    let kernels = kernels_for(args.arch, &args.kernel)?;
    ensure_host_packages(args.arch)?;
    let bins = match (args.arch, args.command.is_none() && !args.smoke) {
        (_, false) => None,
        (Arch::Amd64, true) => Some(suite::build(&workspace_root())?),
        (Arch::Arm64, true) => {
            let (probe, tests) = arm64::build(&workspace_root())?;
            Some(suite::Bins {
                probe,
                unit: PathBuf::new(),
                tests,
                older_kernel: false,
            })
        }
    }
    .map(std::sync::Arc::new);
    for spec in kernels.iter().copied() {
        if let Err(e) = ensure_kernel(args.arch, spec) {
            eprintln!("vm: fetching {}: {e:#}", spec.name);
        }
    }
    Ok(kernels
        .iter()
        .map(|&spec| Job {
            args: args.clone(),
            spec,
            bins: bins.clone(),
            of: kernels.len(),
        })
        .collect())
}

/// Boots `jobs`, `lanes` at a time, each lane taking the next job in order when free; returns
/// the runs in `jobs`' order, with a closing PASS/FAIL table when there are several.
pub fn run_jobs(jobs: &[Job], lanes: usize) -> Vec<KernelRun> {
    let lanes = lanes.clamp(1, jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..lanes {
            s.spawn(|| {
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(job) = jobs.get(index) else { break };
                    let run = boot_and_decide(job);
                    done.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((index, run));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_by_key(|(index, _)| *index);
    let runs: Vec<KernelRun> = done.into_iter().map(|(_, run)| run).collect();
    if runs.len() > 1 {
        for r in &runs {
            println!(
                "vm-test: {:>11} {}: {} in {:.0} s",
                r.label(),
                r.outcome
                    .as_ref()
                    .map_or("(no boot)", |o| o.kernel_release.as_str()),
                if r.verdict.is_ok() { "PASS" } else { "FAIL" },
                r.secs
            );
        }
    }
    runs
}

/// One job of [`run_jobs`]: its boot, verdict and time, with its PASS/FAIL line.
fn boot_and_decide(job: &Job) -> KernelRun {
    let (args, spec) = (&job.args, job.spec);
    let out = args.out.as_ref().map(|d| {
        if job.of > 1 {
            d.join(spec.name)
        } else {
            d.clone()
        }
    });
    let start = Instant::now();
    let (outcome, verdict) = match boot_one(args, spec, job.bins.as_deref(), out.as_deref()) {
        Ok((o, v)) => (Some(o), v),
        Err(e) => (None, Err(format!("{e:#}"))),
    };
    let secs = start.elapsed().as_secs_f64();
    let run = KernelRun {
        kernel: spec,
        arch: args.arch,
        outcome,
        verdict,
        secs,
    };
    match &run.verdict {
        Ok(()) => println!("vm-test: kernel {}: PASS ({secs:.0} s)", run.label()),
        Err(why) => println!("vm-test: kernel {}: FAIL ({secs:.0} s): {why}", run.label()),
    }
    run
}

/// One kernel: boot, decide, keep the run folder of a failure.
fn boot_one(
    args: &VmArgs,
    spec: &'static KernelSpec,
    bins: Option<&suite::Bins>,
    out: Option<&Path>,
) -> anyhow::Result<(Outcome, Result<(), String>)> {
    let start = Instant::now();
    let timeout = args.timeout;
    let keep = VmArgs {
        keep: true,
        ..args.clone()
    };
    // Keep the run folder while deciding, so a failure can point at the console log.
    let outcome = boot(&keep, spec, bins, out)?;
    let run_dir = outcome
        .console_log
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "vm-test: kernel {} ({}; pinned {}={}), {secs:.1} s",
        outcome.kernel_release, outcome.kernel_package, spec.package, spec.version
    );
    let verdict = match (outcome.exit_code, &outcome.ending) {
        (Some(0), _) => Ok(()),
        (Some(c), _) => Err(format!("the command exited {c}")),
        (None, Ending::Timeout) => Err(format!("timed out after {timeout} s; qemu was killed")),
        (None, Ending::Reported(c)) if *c == qemu::INFRA_FAILURE => {
            Err("the guest could not set up its root (see the vm-init lines above)".into())
        }
        (None, e) => Err(format!(
            "the guest ended without reporting an exit code ({e:?}): kernel panic or init died"
        )),
    };
    let verdict = match verdict {
        Ok(()) => {
            if args.keep {
                eprintln!("vm: kept the run folder {}", run_dir.display());
            } else {
                let _ = std::fs::remove_dir_all(&run_dir);
            }
            Ok(())
        }
        Err(why) => Err(format!(
            "{why}; console log kept in {}",
            outcome.console_log.display()
        )),
    };
    Ok((outcome, verdict))
}
