//! Where a lifecycle operation's time goes: the time of each of its steps, logged once at
//! debug level when it succeeds (`"steps" => "lease=0.31 prepare=2.87 …"`, milliseconds).
//!
//! Steps that ran concurrently are timed on branches ([`Steps::fork`]) and shown as one
//! section with its wall time, each branch's own steps in brackets, branches apart by `|`:
//! `netns=1.02 network+pause=61.30 [cni_add=55.10 | pod_files=0.40 lease=0.51 …] ip=0.90 …`.
//! The top-level entries add up to the total; a branch's add up to at most the section's.
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
    steps: Vec<Entry>,
}

/// One entry of the timing line.
enum Entry {
    /// A step that ran alone.
    Step(&'static str, Duration),
    /// A section of concurrent branches: its wall time and each branch's steps.
    Concurrent(&'static str, Duration, Vec<Vec<Entry>>),
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
        self.steps.push(Entry::Step(name, now - self.last));
        self.last = now;
    }

    /// The clock of a branch that starts where the last step ended and runs concurrently with
    /// others; [`Steps::join`] takes its steps back.
    pub(crate) fn fork(&self) -> Steps {
        Self {
            start: self.last,
            last: self.last,
            steps: Vec::with_capacity(8),
        }
    }

    /// The concurrent section `name` ended now: its wall time, with each branch's steps.
    pub(crate) fn join(&mut self, name: &'static str, branches: impl IntoIterator<Item = Steps>) {
        let now = Instant::now();
        let branches = branches.into_iter().map(|b| b.steps).collect();
        self.steps
            .push(Entry::Concurrent(name, now - self.last, branches));
        self.last = now;
    }

    /// `name=ms` for each step, in order.
    fn render(&self) -> String {
        let mut s = String::new();
        render_entries(&mut s, &self.steps);
        s
    }

    /// Logs the steps and the total at debug level.
    pub(crate) fn log(&self, log: &Logger, what: &'static str) {
        debug!(log, "step timings"; "operation" => what,
            "total_ms" => format!("{:.2}", self.start.elapsed().as_secs_f64() * 1000.0),
            "steps" => slog::FnValue(|_| self.render()));
    }
}

fn render_entries(s: &mut String, entries: &[Entry]) {
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        match entry {
            Entry::Step(name, d) => {
                let _ = write!(s, "{name}={:.2}", d.as_secs_f64() * 1000.0);
            }
            Entry::Concurrent(name, d, branches) => {
                let _ = write!(s, "{name}={:.2} [", d.as_secs_f64() * 1000.0);
                for (j, branch) in branches.iter().enumerate() {
                    if j > 0 {
                        s.push_str(" | ");
                    }
                    render_entries(s, branch);
                }
                s.push(']');
            }
        }
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

    #[test]
    fn concurrent_branches_render_inside_their_section() {
        let mut s = Steps::start();
        s.mark("a");
        let (mut x, mut y) = (s.fork(), s.fork());
        x.mark("x1");
        y.mark("y1");
        y.mark("y2");
        s.join("x+y", [x, y]);
        s.mark("b");
        let r = s.render();
        let names: Vec<&str> = r
            .split(' ')
            .filter(|t| t.contains('='))
            .map(|kv| kv.trim_start_matches('[').split_once('=').unwrap().0)
            .collect();
        assert_eq!(names, ["a", "x+y", "x1", "y1", "y2", "b"], "{r}");
        assert!(r.contains(" [x1="), "{r}");
        assert!(r.contains(" | y1="), "{r}");
        assert!(r.contains("] b="), "{r}");
    }
}
