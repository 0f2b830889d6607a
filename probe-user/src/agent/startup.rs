//! The agent's startup, step by step: one `startup:` log line at ready, so where the time to
//! ready goes is visible on any node (and `cargo xtask bench` tabulates it).

use std::time::{Duration, Instant};

/// Durations of the startup steps, in order.
#[derive(Debug)]
pub struct StartupSteps {
    start: Instant,
    last: Instant,
    steps: Vec<(&'static str, Duration)>,
}

impl Default for StartupSteps {
    fn default() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            last: now,
            steps: Vec::new(),
        }
    }
}

impl StartupSteps {
    /// Ends the step `name` (it began when the previous one ended).
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.steps.push((name, now - self.last));
        self.last = now;
    }

    /// `startup: <step> <ms> ms, ..., total <ms> ms`.
    pub fn line(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut parts: Vec<String> = self
            .steps
            .iter()
            .map(|(n, d)| format!("{n} {:.1} ms", ms(*d)))
            .collect();
        parts.push(format!("total {:.1} ms", ms(self.last - self.start)));
        format!("startup: {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_up_to_the_total() {
        let mut s = StartupSteps::default();
        s.mark("a");
        s.mark("b");
        let line = s.line();
        assert!(line.starts_with("startup: a "), "{line}");
        assert!(line.contains(", b ") && line.contains(", total "), "{line}");
        let sum: Duration = s.steps.iter().map(|(_, d)| *d).sum();
        assert_eq!(sum, s.last - s.start);
    }
}
