//! `cargo xtask lab ...`

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use test_support::lab::{self, Lab, Scenario, Variant, Variants};

#[derive(Args)]
pub struct LabArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

impl From<OnOff> for bool {
    fn from(v: OnOff) -> bool {
        v == OnOff::On
    }
}

#[derive(Subcommand)]
enum Action {
    /// Build the lab (removes a leftover lab first). `CLB_LAB_FAIL_AFTER=<step>` injects a failure.
    Up {
        #[arg(long, value_enum, default_value = "on")]
        vip_bound: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        rp_filter: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        masquerade: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        ipvs_filter: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        peer_node: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        vip_local_route: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        vip_announced: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        self_snat_missing: OnOff,
        #[arg(long, value_enum, default_value = "off")]
        bridge_pod: OnOff,
    },
    /// Kill the lab's servers and delete its namespaces (idempotent).
    Down,
    /// Namespaces, addresses, variants, servers.
    Status,
    /// Turn a variant on or off.
    Set {
        #[arg(value_enum)]
        variant: Variant,
        #[arg(value_enum)]
        state: OnOff,
    },
    /// Run scenarios (each sets its variants, drives traffic once, checks the outcome).
    Traffic {
        /// Scenario names, or `all`.
        #[arg(required = true)]
        scenarios: Vec<String>,
        /// Client connect timeout in seconds.
        #[arg(long, default_value_t = 2.0)]
        timeout: f64,
        /// Also print who answered and the client's address.
        #[arg(long, short)]
        verbose: bool,
    },
    /// List the scenarios with their variants and expected outcome.
    Scenarios,
}

pub fn run(args: LabArgs) -> Result<ExitCode> {
    // Wait for a test (or another CLI) that is using the lab; `status` and `scenarios` only read.
    let _lock = match args.action {
        Action::Status | Action::Scenarios => None,
        _ => Some(lab::LabLock::acquire()?),
    };
    match args.action {
        Action::Up {
            vip_bound,
            rp_filter,
            masquerade,
            ipvs_filter,
            peer_node,
            vip_local_route,
            vip_announced,
            self_snat_missing,
            bridge_pod,
        } => {
            let v = Variants {
                vip_bound: vip_bound.into(),
                rp_filter: rp_filter.into(),
                masquerade: masquerade.into(),
                ipvs_filter: ipvs_filter.into(),
                peer_node: peer_node.into(),
                vip_local_route: vip_local_route.into(),
                vip_announced: vip_announced.into(),
                self_snat_missing: self_snat_missing.into(),
                bridge_pod: bridge_pod.into(),
            };
            Lab::down()?;
            Lab::up(&v)?;
            println!("lab up: {v}");
        }
        Action::Down => {
            Lab::down()?;
            println!("lab down");
        }
        Action::Status => print!("{}", Lab::status()?),
        Action::Set { variant, state } => {
            let lab = Lab::attach();
            lab.set(variant, state.into())?;
            println!("variants: {}", lab.variants()?);
        }
        Action::Traffic {
            scenarios,
            timeout,
            verbose,
        } => {
            let list: Vec<Scenario> = if scenarios.iter().any(|s| s == "all") {
                Scenario::ALL.to_vec()
            } else {
                scenarios.iter().map(|s| s.parse()).collect::<Result<_>>()?
            };
            let lab = Lab {
                timeout: Duration::from_secs_f64(timeout),
            };
            let mut failed = false;
            for sc in list {
                let report = lab.run(sc)?;
                println!("{report}");
                if verbose {
                    let a = &report.attempt;
                    let local = a.local.map(|l| l.to_string()).unwrap_or_else(|| "-".into());
                    let answer = a.answer.as_deref().unwrap_or("-");
                    println!("    from {local} in {:?}; answer: {answer}", a.elapsed);
                }
                failed |= !report.as_expected();
            }
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
        Action::Scenarios => {
            for sc in Scenario::ALL {
                let s = sc.spec();
                let src = s.src.map(|a| format!(" from {a}")).unwrap_or_default();
                println!(
                    "{sc}: {} -> {}{src}; {}; expected {}",
                    s.from_ns, s.dst, s.variants, s.expected
                );
                println!("    {}", s.what);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct ClientArgs {
    /// Lab namespace to connect from (omit to use the current one).
    #[arg(long)]
    netns: Option<String>,
    /// Source address to bind.
    #[arg(long)]
    src: Option<Ipv4Addr>,
    /// Destination ip:port.
    dst: SocketAddrV4,
    /// Connect timeout in seconds.
    #[arg(long, default_value_t = 2.0)]
    timeout: f64,
}

pub fn client(args: ClientArgs) -> Result<ExitCode> {
    if !args.timeout.is_finite() || args.timeout <= 0.0 {
        bail!("--timeout must be positive");
    }
    let t = Duration::from_secs_f64(args.timeout);
    let attempt = match &args.netns {
        Some(ns) => lab::connect_in(ns, args.src, args.dst, t)?,
        None => lab::connect_here(args.src, args.dst, t)?,
    };
    println!("{}", attempt.outcome);
    Ok(ExitCode::SUCCESS)
}
