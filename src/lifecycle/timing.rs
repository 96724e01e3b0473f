//! Where a lifecycle operation's time goes: the time of each of its steps, logged once at
//! debug level when it succeeds (`"steps" => "lease=0.31 prepare=2.87 …"`, milliseconds).
//!
//! The profile of an RPC against containerd's own CRI comes from these lines (run remora with
//! `[log] level = "debug"`) beside `scripts/bench-critest.sh`'s whole-RPC means. Cheap: one
//! `Instant::now()` per step and a small vector; nothing is formatted unless debug is on.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use slog::{debug, Logger};

/// The steps of one operation so far.
pub(crate) struct Steps {
    start: Instant,
    last: Instant,
    steps: Vec<(&'static str, Duration)>,
}

impl Steps {
    /// Starts the clock.
    pub(crate) fn start() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            last: now,
            steps: Vec::with_capacity(12),
        }
    }

    /// The step `name` ended now (it began where the previous one ended).
    pub(crate) fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.steps.push((name, now - self.last));
        self.last = now;
    }

    /// `name=ms` for each step, in order.
    fn render(&self) -> String {
        let mut s = String::new();
        for (name, d) in &self.steps {
            if !s.is_empty() {
                s.push(' ');
            }
            let _ = write!(s, "{name}={:.2}", d.as_secs_f64() * 1000.0);
        }
        s
    }

    /// Logs the steps and the total at debug level.
    pub(crate) fn log(&self, log: &Logger, what: &'static str) {
        debug!(log, "step timings"; "operation" => what,
            "total_ms" => format!("{:.2}", self.start.elapsed().as_secs_f64() * 1000.0),
            "steps" => slog::FnValue(|_| self.render()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_render_in_order_with_their_names() {
        let mut s = Steps::start();
        s.mark("a");
        s.mark("b");
        let r = s.render();
        let names: Vec<&str> = r
            .split(' ')
            .map(|kv| kv.split_once('=').unwrap().0)
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert!(r
            .split(' ')
            .all(|kv| kv.split_once('=').unwrap().1.parse::<f64>().is_ok()));
    }
}
