//! `probe events` and `probe watch` against the real agent in the lab; the live view driven
//! through a real terminal (tmux: send keys, capture the pane, assert what a person sees).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use probe_tests::agent::{Agent, follow_events, probe_bin, wait_for};
use test_support::lab::{LabGuard, Outcome, Scenario, Variants};

const WAIT: Duration = Duration::from_secs(10);

/// A tmux server of this test's own, killed on drop.
struct Tmux(String);

impl Tmux {
    fn new() -> Tmux {
        Tmux(format!("clbtest-{}", std::process::id()))
    }

    fn cmd(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.0])
            .args(args)
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.cmd(&["capture-pane", "-p", "-t", "watch"])
    }

    /// Waits until the pane shows `needle`.
    fn wait_for(&self, needle: &str) -> String {
        wait_for(needle, WAIT, || {
            let s = self.screen();
            s.contains(needle).then_some(s)
        })
        .unwrap_or_else(|| panic!("{needle:?} never shown; screen:\n{}", self.screen()))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn events_watch_once_and_the_live_view_in_a_terminal() {
    let Some(lab) = LabGuard::for_test("watch", &Variants::default()) else {
        return;
    };
    let socket = std::env::temp_dir().join(format!("clb-watch-test-{}.sock", std::process::id()));
    let socket_arg = socket.to_str().unwrap().to_string();
    let _agent = Agent::on_node_nic(&["--socket", &socket_arg]);

    // `probe events` follows from before the traffic.
    let (mut events, rx) = follow_events(&socket);
    assert_eq!(
        lab.traffic(Scenario::HealthcheckBlackhole).unwrap(),
        Outcome::Timeout
    );
    assert_eq!(
        lab.traffic(Scenario::VipPortUnserved).unwrap(),
        Outcome::Refused
    );
    let mut kinds = std::collections::BTreeSet::new();
    while kinds.len() < 2 {
        let line = rx
            .recv_timeout(WAIT)
            .expect("probe events printed both kinds");
        let e: probe_contract::LoopbackEvent =
            serde_json::from_str(&line).expect("a contract event per line");
        kinds.insert(e.kind.as_str().to_string());
    }
    let _ = events.kill();
    let _ = events.wait();

    // `probe watch --once`: a plain snapshot.
    let once = Command::new(probe_bin())
        .args(["watch", "--once", "--socket", &socket_arg])
        .output()
        .unwrap();
    assert!(once.status.success());
    let text = String::from_utf8_lossy(&once.stdout);
    // The agent's status names the dataplane (the lab's kube-proxy mode).
    let dataplane = format!(
        "dataplane: kube-proxy {}",
        test_support::lab::KubeProxyMode::from_env().unwrap().name()
    );
    for needle in [
        "kube-ipvs0 (present)",
        dataplane.as_str(),
        "healthcheck_blackhole",
        "vip_port_unserved      203.0.113.10     443",
        "evidence:",
        "remedy:",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }

    // The live view in a real terminal.
    let tmux = Tmux::new();
    let command = format!("{} watch --socket {}", probe_bin().display(), socket_arg);
    tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "watch",
        "-x",
        "160",
        "-y",
        "50",
        &command,
    ]);
    let screen = tmux.wait_for("vip_port_unserved");
    assert!(
        screen.contains("clb-probe watch") && screen.contains("kernel"),
        "{screen}"
    );
    assert!(screen.contains("healthcheck_blackhole"), "{screen}");
    assert!(screen.contains("203.0.113.10"), "{screen}");
    // Select the second row: its evidence and remedy show in the detail pane.
    tmux.cmd(&["send-keys", "-t", "watch", "j"]);
    let screen = tmux.wait_for("evidence:");
    assert!(screen.contains("remedy:"), "{screen}");
    tmux.cmd(&["send-keys", "-t", "watch", "?"]);
    tmux.wait_for("HELP");
    tmux.cmd(&["send-keys", "-t", "watch", "?"]);
    tmux.cmd(&["send-keys", "-t", "watch", "p"]);
    tmux.wait_for("PAUSED");
    tmux.cmd(&["send-keys", "-t", "watch", "p"]);
    tmux.cmd(&["send-keys", "-t", "watch", "/", "unserved", "Enter"]);
    // The table's title, not the input line: "filter: unserved_" shows while typing, before
    // Enter applies the filter.
    let screen = tmux.wait_for("(filter: unserved)");
    let table: String = screen
        .lines()
        .skip_while(|l| !l.contains("confirmed loopback"))
        .take(4)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !table.contains("healthcheck_blackhole"),
        "filtered out:\n{table}"
    );
    tmux.cmd(&["send-keys", "-t", "watch", "q"]);
    let gone = wait_for("watch exits on q", WAIT, || {
        let sessions = tmux.cmd(&["list-sessions"]);
        (!sessions.contains("watch")).then_some(())
    });
    assert!(gone.is_some(), "still running: {}", tmux.screen());
}

#[test]
fn without_an_agent_watch_and_events_say_how_to_start_one() {
    for sub in ["watch", "events"] {
        let o = Command::new(probe_bin())
            .args(
                [sub, "--socket", "/tmp/clb-no-agent-here.sock", "--once"]
                    [..if sub == "watch" { 4 } else { 3 }]
                    .to_vec(),
            )
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{sub}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("no agent is listening on /tmp/clb-no-agent-here.sock")
                && err.contains("probe agent"),
            "{sub}: {err}"
        );
    }
}
