use super::*;

#[test]
fn quick_is_short() {
    let a = BenchArgs {
        rounds: 5,
        secs: 5,
        flood_secs: 30,
        latency_events: 250,
        cycles: 60,
        window_ms: 1000,
        starts: 5,
        capture_bytes: Vec::new(),
        only: vec![Part::Ratio],
        quick: true,
        storm_only: false,
        scale_sizes: vec![100, 1000],
        scale_window: 3,
        scale_modes: vec![super::scale::Mode::Iptables, super::scale::Mode::Nftables],
        scale_no_baseline: false,
        scale_api: false,
        scale_api_only: false,
        scale_conntrack: None,
        scale_table_pattern: vec![],
        fleet_sizes: vec![1000, 5000],
        fleet_services: 30_000,
        fleet_agents: 1,
        fleet_window: 120,
        out: None,
        detect: false,
        baseline_agent: None,
    }
    .effective();
    assert_eq!(
        (a.rounds, a.secs, a.flood_secs, a.latency_events),
        (1, 1, 3, 20)
    );
    assert_eq!((a.cycles, a.window_ms, a.starts), (4, 300, 2));
    assert!(a.runs(Part::Ratio) && !a.runs(Part::Datapath));
    assert_eq!((a.fleet_sizes, a.fleet_window), (vec![20, 60], 4));
}

/// The fleet (like scale) runs only when named: the bench smoke (`--quick`, no `--only`)
/// leaves it out.
#[test]
fn fleet_runs_only_when_named() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }
    let all = <Cli as clap::Parser>::try_parse_from(["bench", "--quick"]).unwrap();
    assert!(all.bench.runs(Part::Datapath));
    assert!(!all.bench.runs(Part::Fleet) && !all.bench.runs(Part::Scale));
    let named = <Cli as clap::Parser>::try_parse_from(["bench", "--only", "fleet"]).unwrap();
    assert!(named.bench.runs(Part::Fleet) && !named.bench.runs(Part::Datapath));
}

#[test]
fn the_table_line_patterns_default_to_both_lines() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }
    let cli = <Cli as clap::Parser>::try_parse_from(["bench"]).unwrap();
    assert_eq!(cli.bench.scale_table_pattern, scale::TABLE_PATTERNS);
    let cli = <Cli as clap::Parser>::try_parse_from([
        "bench",
        "--scale-table-pattern",
        "service table from the API",
    ])
    .unwrap();
    assert_eq!(
        cli.bench.scale_table_pattern,
        ["service table from the API"]
    );
}
