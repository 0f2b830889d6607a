//! Part 6: ns per ordinary packet by traffic class, the program alone and live, side by side,
//! each against an empty program measured the same way.
//!
//! A real node's ordinary traffic is not one class: sources in another /16, other nodes' pods
//! in the local pod CIDR's /16 (10.244.2.x beside this node's 10.244.1.0/24), the node's own
//! subnet neighbours, and TCP data segments both ways. Each class is measured two ways with
//! one agent attached, round after round:
//!
//! - **test run**: BPF_PROG_TEST_RUN (`bpftool prog run id N`) of one frame of the class
//!   through the agent's attached program and its live maps, `repeat` times.
//! - **live**: `kernel.bpf_stats_enabled=1` while trafgen (UDP) or iperf3 (TCP) sends the
//!   class through the NIC: run_time_ns / run_cnt of the same program.
//!
//! The floor of each method is measured, not argued: an empty classifier (`r0 = -1; exit`,
//! loaded by the bench, [`tcx::load_empty_classifier`]) test-run on the same frame, and live on
//! the same tcx hook with the same traffic. Live, the agent's program and the empty one take
//! turns in windows of their own on the class's hook (the bench takes over the agent's tcx
//! links, [`Toggle`]): in one chain the second program would run on lines the first just
//! warmed. The program minus the empty program is its own cost; what separates that live from
//! the test run is cache state.
//!
//! Programs are found by the agent's pid (its fdinfo), so another clb-probe loaded on the
//! machine at the same time is neither measured nor test-run.

use std::{
    net::Ipv4Addr,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use super::{
    BenchArgs, METRICS_PORT, WARMUP,
    net::{self, BenchNet},
    report::{Table, median, spread},
    tcx::{self, Toggle},
    tools::{self, Agent, pause},
    write_sysctl,
};

/// A source in a /16 that holds none of the node's prefixes (TEST-NET-2).
const OTHER_16: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
/// Another node's pod, in the /16 of the agent's `--pod-cidr` (10.244.1.0/24).
const POD_CIDR_16: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);

/// One measured case.
struct Case {
    traffic: &'static str,
    program: &'static str,
    /// The frame test-run through `program`.
    frame: Vec<u8>,
    /// How live traffic of the class is made .
    live: Live,
}

enum Live {
    /// trafgen: 64-byte UDP from this source to the sink, forwarded by the node.
    Udp(Ipv4Addr),
    /// One iperf3 stream from the sender to the node (`reverse`: from the node).
    Tcp { reverse: bool },
    /// trafgen: 64-byte frames of a local experimental ethertype (0x88b5), which the program
    /// leaves after reading it: the live floor (bpf_stats' clock reads, a cold program).
    NonIp,
}

fn cases() -> Vec<Case> {
    let udp = |src| tools::ether(&ipv4(src, net::SINK_DST, 17, &udp_header(40000, 9, 18)));
    vec![
        Case {
            traffic: "(a) other /16: UDP from 198.51.100.7",
            program: "clb_ingress",
            frame: udp(OTHER_16),
            live: Live::Udp(OTHER_16),
        },
        Case {
            traffic: "(b) pod CIDR's /16: UDP from 10.244.2.7",
            program: "clb_ingress",
            frame: udp(POD_CIDR_16),
            live: Live::Udp(POD_CIDR_16),
        },
        Case {
            traffic: "(c) node subnet: UDP from 10.200.0.1",
            program: "clb_ingress",
            frame: udp(net::TX_IP),
            live: Live::Udp(net::TX_IP),
        },
        Case {
            traffic: "TCP data segment in (10.200.0.1 -> node)",
            program: "clb_ingress",
            frame: tools::ether(&ipv4(net::TX_IP, net::NODE_IP, 6, &tcp_data(40000, 5201))),
            live: Live::Tcp { reverse: false },
        },
        Case {
            traffic: "TCP data segment out (node -> 10.200.0.1)",
            program: "clb_egress",
            frame: tools::ether(&ipv4(net::NODE_IP, net::TX_IP, 6, &tcp_data(5201, 40000))),
            live: Live::Tcp { reverse: true },
        },
        Case {
            traffic: "floor: non-IP frame (ethertype 0x88b5), read and left",
            program: "clb_ingress",
            frame: {
                let mut f = tools::ether(&[0u8; 46]);
                f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
                f
            },
            live: Live::NonIp,
        },
    ]
}

/// Part 6's table; one summary line.
pub(crate) fn classes(
    args: &BenchArgs,
    net: &BenchNet,
    probe: &Path,
    work: &Path,
    summary: &mut Vec<(String, String)>,
) -> Result<Table> {
    let cases = cases();
    let repeat: u32 = if args.quick { 200_000 } else { 1_000_000 };
    // --quick: half-second windows, no warm-up (iperf3 runs a whole second all the same).
    let window = if args.quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(args.secs.min(2))
    };
    let warmup = if args.quick { Duration::ZERO } else { WARMUP };
    // The baseline: a classifier that returns at once, measured the same two ways.
    let empty = tcx::load_empty_classifier()?;
    let empty_id = u64::from(tcx::prog_id(&empty)?);
    let mut m: Vec<Measured> = (0..cases.len()).map(|_| Measured::default()).collect();
    for round in 0..args.rounds {
        eprintln!(
            "bench: traffic classes, round {}/{}",
            round + 1,
            args.rounds
        );
        let agent = Agent::start(probe, work, METRICS_PORT)?;
        pause(Duration::from_millis(300))?;
        let progs = agent_programs(agent.pid())?;
        let id_of = |name: &str| {
            progs
                .iter()
                .find(|(_, n)| n == name)
                .map(|(id, _)| *id)
                .with_context(|| format!("the agent has no program {name} loaded"))
        };
        for (i, case) in cases.iter().enumerate() {
            let id = id_of(case.program)?.to_string();
            let ours = tools::test_run_prog(&["id", &id], &case.frame, repeat, work)?;
            let floor =
                tools::test_run_prog(&["id", &empty_id.to_string()], &case.frame, repeat, work)?;
            m[i].test_run.push((ours, floor));
        }
        // From here the bench holds the agent's links: each window has either the agent's
        // program or the empty one on the class's hook (never both), the agent's other hooks
        // as they are.
        let mut toggle = Toggle::take_over(agent.pid())?;
        for (i, case) in cases.iter().enumerate() {
            let id = id_of(case.program)?;
            let mut pair = [None, None];
            // Which arm goes first alternates by class and round: a drift of the machine
            // favours neither.
            for k in 0..2 {
                let arm = (round + i + k) % 2;
                let measured = if arm == 0 {
                    toggle.on()?;
                    id
                } else {
                    toggle.swap(id as u32, &empty)?;
                    empty_id
                };
                let (ns, runs) =
                    with_stats(|| send_class(net, case, work, warmup, window), measured)?;
                if runs > 0 {
                    pair[arm] = Some(ns as f64 / runs as f64);
                    if arm == 0 {
                        m[i].live_runs += runs;
                    }
                }
            }
            m[i].live.push((pair[0], pair[1]));
        }
        toggle.off();
        drop(toggle);
        drop(agent);
    }
    drop(empty);

    let mut t = Table::new(
        "6. Per-packet cost by traffic class",
        &[
            "traffic",
            "program",
            "test run, ns",
            "empty program, test run, ns",
            "program minus empty, test run, ns",
            "live (bpf_stats), ns",
            "empty program, live (bpf_stats), ns",
            "program minus empty, live, ns",
            "live net minus test-run net (cache), ns",
            "live runs",
        ],
    );
    t.note = format!(
        "The agent attached (`--pod-cidr {pod}`, node {node}/24, VIP {vip}/32). Test run: \
         `bpftool prog run` (BPF_PROG_TEST_RUN, {repeat} repeats) of one frame of the class \
         through the agent's attached program and live maps. Live: run_time_ns / run_cnt \
         with `kernel.bpf_stats_enabled=1` while trafgen (one 64-byte UDP flow per class, \
         forwarded to the sink) or iperf3 (one stream, GRO/GSO: one run per super-packet) \
         sends the class. Baseline: an empty classifier (`r0 = -1; exit`, TC_ACT_UNSPEC: \
         touches neither packet nor map), loaded by the bench with BPF_PROG_LOAD (not in the \
         product's object) and measured the same two ways: test-run on the same frame, and \
         live on the same hook (tcx {nic} ingress, or egress for clb_egress) with the same \
         traffic. Live, the two alternate in windows of their own (the bench holds the \
         agent's tcx links; on the class's hook either the agent's program or the empty one, \
         never both in one chain, which would warm the second one's cache for it; which \
         goes first alternates by class and round). \"Program minus empty\" is paired per \
         round: the program's own cost over the floor of each method (the test-run loop's \
         per-repeat cost; bpf_stats' two clock reads, the u64_stats update and the indirect \
         call). What remains between the live and the test-run net cost is cache state the \
         test run never sees (one frame a million times on hot lines; live, headers written \
         by the sender on the other CPU, and for TCP a 64 KB GRO/GSO copy between two runs). \
         The non-IP row is the program's own floor: its cheapest path. Target: under 50 ns \
         per ordinary packet, every class.",
        pod = net::POD_CIDR,
        node = net::NODE_IP,
        vip = net::VIP,
        nic = net::NODE_IF,
    );
    for (i, case) in cases.iter().enumerate() {
        let r = &m[i];
        t.row(vec![
            case.traffic.to_string(),
            case.program.to_string(),
            spread(&r.test_ours(), 1),
            spread(&r.test_floor(), 1),
            spread(&r.test_net(), 1),
            spread(&r.live_ours(), 1),
            spread(&r.live_floor(), 1),
            spread(&r.live_net(), 1),
            format!("{:.1}", median(&r.live_net()) - median(&r.test_net())),
            r.live_runs.to_string(),
        ]);
    }
    let ordinary: Vec<(&Case, &Measured)> = cases
        .iter()
        .zip(&m)
        .filter(|(c, _)| !matches!(c.live, Live::NonIp))
        .collect();
    let met = |ns: f64| if ns < 50.0 { "met" } else { "NOT met" };
    let worst = ordinary
        .iter()
        .map(|(c, r)| (median(&r.test_ours()), median(&r.test_net()), c.traffic))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((ns, net_ns, traffic)) = worst {
        summary.push((
            "ordinary packet by traffic class, worst test-run median (target < 50 ns)".into(),
            format!(
                "{ns:.1} ns ({traffic}): {}; {net_ns:.1} ns of it the program's own (minus the \
                 empty program)",
                met(ns)
            ),
        ));
    }
    let per_class: Vec<String> = ordinary
        .iter()
        .map(|(c, r)| {
            let ns = median(&r.live_net());
            format!("{} {ns:.1} ns: {}", short(c.traffic), met(ns))
        })
        .collect();
    let floors: Vec<f64> = ordinary.iter().flat_map(|(_, r)| r.live_floor()).collect();
    summary.push((
        "ordinary packet by traffic class, live (bpf_stats), program minus the empty program \
         (target < 50 ns)"
            .into(),
        format!(
            "{}; the empty program itself {} ns live (the measurement floor)",
            per_class.join(", "),
            spread(&floors, 1)
        ),
    ));
    Ok(t)
}

/// The figures of one class over the rounds.
#[derive(Default)]
struct Measured {
    /// (program, empty program) ns per repeat, each round.
    test_run: Vec<(f64, f64)>,
    /// (program, empty program) ns per run on live traffic, each round (`None`: no run).
    live: Vec<(Option<f64>, Option<f64>)>,
    /// Runs of the program in its live windows.
    live_runs: u64,
}

impl Measured {
    fn test_ours(&self) -> Vec<f64> {
        self.test_run.iter().map(|p| p.0).collect()
    }
    fn test_floor(&self) -> Vec<f64> {
        self.test_run.iter().map(|p| p.1).collect()
    }
    fn test_net(&self) -> Vec<f64> {
        self.test_run.iter().map(|p| p.0 - p.1).collect()
    }
    fn live_ours(&self) -> Vec<f64> {
        self.live.iter().filter_map(|p| p.0).collect()
    }
    fn live_floor(&self) -> Vec<f64> {
        self.live.iter().filter_map(|p| p.1).collect()
    }
    /// Paired per round: only rounds where both arms ran.
    fn live_net(&self) -> Vec<f64> {
        self.live.iter().filter_map(|p| Some(p.0? - p.1?)).collect()
    }
}

/// The class's name up to its colon or parenthesis: "(a) other /16", "TCP data segment in".
fn short(traffic: &str) -> &str {
    let end = traffic
        .find(':')
        .or_else(|| traffic.find(" ("))
        .unwrap_or(traffic.len());
    traffic[..end].trim()
}

/// Sends the class's live traffic for `window` (after `warmup`).
fn send_class(
    net: &BenchNet,
    case: &Case,
    work: &Path,
    warmup: Duration,
    window: Duration,
) -> Result<()> {
    match case.live {
        Live::Udp(_) | Live::NonIp => {
            let config = work.join("class.trafgen");
            std::fs::write(&config, trafgen_config(net, &case.live))?;
            let mut g = tools::trafgen(&config)?;
            pause(warmup)?;
            pause(window)?;
            g.check_running()?;
            g.stop();
            Ok(())
        }
        Live::Tcp { reverse } => iperf3(window, reverse),
    }
}

/// (id, name) of the `clb_*` programs the process `pid` holds (by its file descriptors'
/// `prog_id` in /proc: other helpers' agents may be loaded on the same machine, and
/// bpftool's own `pids` needs a build with skeletons).
fn agent_programs(pid: i32) -> Result<Vec<(u64, String)>> {
    let mut ids = Vec::new();
    let fdinfo = format!("/proc/{pid}/fdinfo");
    for entry in std::fs::read_dir(&fdinfo).with_context(|| format!("reading {fdinfo}"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        if let Some(id) = text
            .lines()
            .find_map(|l| l.strip_prefix("prog_id:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            ids.push(id);
        }
    }
    let out = test_support::lab::cmd::run(&["bpftool", "-j", "prog", "show"])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("bpftool -j prog show")?;
    let progs: Vec<(u64, String)> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str()?.to_string())))
        .filter(|(id, name)| name.starts_with("clb_") && ids.contains(id))
        .collect();
    if progs.is_empty() {
        bail!("no clb_* program held by the agent (pid {pid})");
    }
    Ok(progs)
}

/// (run_time_ns, run_cnt) of program `id`.
fn prog_stats(id: u64) -> Result<(u64, u64)> {
    let out =
        test_support::lab::cmd::run(&["bpftool", "-j", "prog", "show", "id", &id.to_string()])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("bpftool -j prog show id")?;
    Ok((
        v["run_time_ns"].as_u64().unwrap_or(0),
        v["run_cnt"].as_u64().unwrap_or(0),
    ))
}

/// The ns and runs program `id` spent while `f` ran with bpf_stats on.
fn with_stats(f: impl FnOnce() -> Result<()>, id: u64) -> Result<(u64, u64)> {
    write_sysctl("kernel.bpf_stats_enabled", "1")?;
    let before = prog_stats(id);
    let r = f();
    let after = prog_stats(id);
    write_sysctl("kernel.bpf_stats_enabled", "0")?;
    r?;
    let ((t0, c0), (t1, c1)) = (before?, after?);
    Ok((t1 - t0, c1 - c0))
}

/// One iperf3 stream between the sender and the node for `window`; `reverse`: the node sends.
fn iperf3(window: Duration, reverse: bool) -> Result<()> {
    let _server = tools::iperf3_server()?;
    let secs = window.as_secs().max(1).to_string();
    let node = net::NODE_IP.to_string();
    let mut argv = vec!["iperf3", "-c", &node, "-t", &secs];
    if reverse {
        argv.push("-R");
    }
    let status = Command::new("ip")
        .args(["netns", "exec", net::NS_TX])
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running iperf3 -c")?;
    if !status.success() {
        bail!("iperf3 -c failed ({status})");
    }
    Ok(())
}

/// trafgen: one 64-byte UDP frame from the class's source to the sink, random source ports
/// (or the non-IP floor frame).
fn trafgen_config(net: &BenchNet, live: &Live) -> String {
    let Live::Udp(src) = live else {
        return format!(
            "{{ eth(da={da}, sa={sa}, type=0x88b5), fill(0x00, 46) }}\n",
            da = net.node_mac,
            sa = net.tx_mac,
        );
    };
    format!(
        "{{ eth(da={da}, sa={sa}, type=0x0800), ipv4(saddr={src}, daddr={dst}, ttl=64), \
         udp(sport=drnd(1024, 65000), dport=9), fill(0x00, 18) }}\n",
        da = net.node_mac,
        sa = net.tx_mac,
        dst = net::SINK_DST,
    )
}

/// An IPv4 header (no options, no checksum: test runs and the probe do not check it) and `l4`.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    ip.extend_from_slice(l4);
    ip
}

fn udp_header(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let mut u = vec![0u8; 8 + payload];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    u
}

/// A TCP segment with ACK|PSH and 64 bytes of data (no checksum).
fn tcp_data(sport: u16, dport: u16) -> Vec<u8> {
    let mut tcp = vec![0u8; 20 + 64];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    tcp[8..12].copy_from_slice(&0x0abc_def0u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x18; // ACK|PSH
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    tcp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_class_source_and_protocol() {
        for case in cases() {
            let f = &case.frame;
            if case.traffic.starts_with("floor") {
                assert_eq!(&f[12..14], &[0x88, 0xb5]);
                continue;
            }
            assert_eq!(&f[12..14], &[0x08, 0x00], "{}", case.traffic);
            assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, f.len() - 14);
            let src = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
            assert!(case.traffic.contains(&src.to_string()) || src == net::NODE_IP);
            if f[23] == 6 {
                // A data segment: ACK set, SYN clear, payload present.
                assert_eq!(f[14 + 20 + 13] & 0x12, 0x10);
                assert!(f.len() > 14 + 40);
            }
        }
    }
}
