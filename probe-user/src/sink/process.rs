//! The agent's own footprint as the standard `process_*` families (the names every
//! Prometheus client library exports, so dashboards and alerts written for them apply):
//! CPU time, resident and virtual memory, open and maximum file descriptors, start time.
//! Read from /proc/self at scrape time; parsing is pure and unit-tested.

/// One reading of /proc/self.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub start_time_seconds: f64,
    pub open_fds: u64,
    pub max_fds: u64,
}

/// Parses /proc/self/stat (fields after the parenthesised command name, which may hold
/// spaces) with the clock tick rate, page size and boot time (`btime` of /proc/stat).
pub fn parse_stat(
    stat: &str,
    ticks_per_second: f64,
    page_size: u64,
    boot_time: u64,
) -> Option<ProcessStats> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts at field 3 (state); fields are 1-based in proc(5).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let (utime, stime) = (field(14)?, field(15)?);
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / ticks_per_second,
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks_per_second,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page_size,
        ..ProcessStats::default()
    })
}

/// `btime` of /proc/stat: boot time in seconds since the epoch.
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The current process; None when /proc is not readable.
pub fn read() -> Option<ProcessStats> {
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let mut stats = parse_stat(
        &std::fs::read_to_string("/proc/self/stat").ok()?,
        ticks.max(1) as f64,
        page.max(1) as u64,
        boot,
    )?;
    stats.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        stats.max_fds = limit.rlim_cur;
    }
    Some(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_real_stat_line_with_spaces_in_the_name() {
        // /proc/self/stat of a real process, its command name given a space and a ')'.
        let stat = "4242 (probe (x) y) S 1 4242 4242 0 -1 4194560 2571 0 0 0 150 50 0 0 20 0 \
                    6 0 12345 1099511627776 4096 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 \
                    17 1 0 0 0 0 0";
        let s = parse_stat(stat, 100.0, 4096, 1_700_000_000).unwrap();
        assert_eq!(s.cpu_seconds, 2.0);
        assert_eq!(s.start_time_seconds, 1_700_000_123.45);
        assert_eq!(s.virtual_bytes, 1_099_511_627_776);
        assert_eq!(s.resident_bytes, 4096 * 4096);
        assert_eq!(parse_stat("4242 (probe) S 1", 100.0, 4096, 0), None);
    }

    #[test]
    fn reads_this_process() {
        let s = read().expect("/proc/self");
        assert!(s.resident_bytes > 0 && s.open_fds > 0 && s.max_fds >= s.open_fds);
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
    }
}

#[cfg(test)]
mod exposition_tests {
    use super::*;
    use crate::sink::metrics::{MetricsInput, render, to_prometheus_text};

    #[test]
    fn the_families_keep_their_standard_names() {
        let text = to_prometheus_text(&render(&MetricsInput {
            process: Some(ProcessStats {
                cpu_seconds: 1.5,
                resident_bytes: 20 << 20,
                open_fds: 9,
                ..ProcessStats::default()
            }),
            ..MetricsInput::default()
        }));
        for needle in [
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n",
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 20971520",
            "process_open_fds 9",
            "process_max_fds 0",
            "process_start_time_seconds 0",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in\n{text}");
        }
        assert!(!text.contains("clbprobe_process"), "unprefixed");
    }
}
