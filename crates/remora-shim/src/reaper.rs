//! The shim's child reaper: one SIGCHLD-driven loop that reaps every child and hands each exit
//! to whoever watches that pid.
//!
//! # Design
//!
//! The shim is a child subreaper (`PR_SET_CHILD_SUBREAPER`): when `runc create` or
//! `runc exec --detach` exits, the container's init and exec processes are re-parented to the
//! shim, so their exits come to it. `waitpid(-1)` is process-wide, so exactly one loop may call it
//! ([`Reaper::start`] refuses a second start), and nothing else may wait for a child: no
//! `tokio::process` (its `waitpid(pid)` races this loop and gets `ECHILD`), no
//! `std::process::Child::wait`. Children are spawned with `std::process::Command`, their pid is
//! watched with [`Reaper::watch_spawned`], and the `Child` is dropped unwaited.
//!
//! Signals coalesce: one SIGCHLD may stand for many exits, so each wake-up reaps with
//! `waitpid(-1, WNOHANG)` until none is left, and the loop reaps once at start for children that
//! ended before the signal stream existed.
//!
//! A process may exit before anyone watches it (a container that dies at once, before its pid
//! file is read; a runc child that ends before `spawn` returns to the caller). Such an exit is
//! *kept*, and handed to the first watch of its pid. Kept exits are bounded, oldest evicted
//! first:
//! - by age, [`KEEP_FOR`] (60 s): the gap between a reap and the watch that claims it is the time
//!   the shim takes to read a pid file after runc returns — milliseconds, seconds on a loaded
//!   node. A minute is a wide margin for that, and short for pid reuse: on this node `pid_max`
//!   is 32768, so a stale exit would need that many forks in a minute to meet a new process with
//!   its pid.
//! - by count, [`KEEP_AT_MOST`] (1024 exits, about 40 KB): orphans nobody watches (a hostPID
//!   pod's daemons re-parent to the shim) must not grow the shim's memory without end.
//!
//! Pid reuse is handled, not just made unlikely, where the caller can say when its process began:
//! [`Reaper::watch_spawned`] ignores kept exits reaped before that instant (they belong to an
//! earlier process with the same pid). Several watches registered *before* an exit all get it; a
//! kept exit goes to the first watch only (it is removed when claimed, so that a later process
//! with the same pid cannot get it).
//!
//! The bookkeeping is a pure struct (`Book`) driven by `(pid, status)` and an injected clock,
//! so it is tested without processes; the syscall loop is tested in a re-executed child process
//! (the shared lib test binary must never be a subreaper or call `waitpid(-1)`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use slog::{debug, error, o, Logger};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

/// How long an exit nobody watched yet is kept for a later watch (see the module docs).
pub const KEEP_FOR: Duration = Duration::from_secs(60);

/// How many exits nobody watched yet are kept at most (see the module docs).
pub const KEEP_AT_MOST: usize = 1024;

/// Set once a reaper loop runs in this process: `waitpid(-1)` is process-wide, so a second loop
/// would steal the first one's exits.
static STARTED: AtomicBool = AtomicBool::new(false);

/// Why the reaper could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    #[error("making the shim a child subreaper (prctl PR_SET_CHILD_SUBREAPER): {0}")]
    Subreaper(#[source] Errno),
    /// The SIGCHLD stream could not be set up (no tokio runtime with signals enabled?).
    #[error("listening for SIGCHLD: {0}")]
    Signal(#[source] std::io::Error),
    /// A reaper already runs in this process; a second `waitpid(-1)` loop would steal its exits.
    #[error("a reaper already runs in this process (pid {pid})")]
    AlreadyStarted {
        /// This process's pid.
        pid: u32,
    },
}

/// How a process ended, as containerd reports it: the exit code, or 128 + the signal that killed
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The process that ended.
    pub pid: i32,
    /// Its exit code, or 128 + the signal that killed it.
    pub status: u32,
    /// When it was reaped.
    pub at: SystemTime,
}

/// The reaper: watches of pids, fed by the SIGCHLD loop. Cheap to clone.
#[derive(Clone)]
pub struct Reaper {
    book: Arc<Mutex<Book>>,
}

impl Reaper {
    /// Makes this process a child subreaper and starts the SIGCHLD loop on the current tokio
    /// runtime (which needs signals enabled, e.g. `enable_all`).
    ///
    /// Spawn children on that same current-thread runtime: there, `Command::spawn` and the
    /// following `watch_spawned` run without the loop in between, and std's own `waitpid` of a
    /// child whose `exec` failed cannot race it.
    pub fn start(log: Logger) -> Result<Reaper, ReapError> {
        if STARTED.swap(true, Ordering::SeqCst) {
            return Err(ReapError::AlreadyStarted {
                pid: std::process::id(),
            });
        }
        let started = Self::start_loop(log);
        if started.is_err() {
            // Nothing runs: a later, successful start is allowed.
            STARTED.store(false, Ordering::SeqCst);
        }
        started
    }

    fn start_loop(log: Logger) -> Result<Reaper, ReapError> {
        // The stream first, then the subreaper bit: a SIGCHLD between the two is not lost, and
        // the loop reaps once before its first wait anyway.
        let sigchld = signal(SignalKind::child()).map_err(ReapError::Signal)?;
        nix::sys::prctl::set_child_subreaper(true).map_err(ReapError::Subreaper)?;
        let reaper = Reaper {
            book: Arc::new(Mutex::new(Book::default())),
        };
        let book = reaper.book.clone();
        tokio::spawn(reap_loop(book, sigchld, log.new(o!("task" => "reaper"))));
        Ok(reaper)
    }

    /// The exit of `pid`, once reaped (at once if it was reaped before this call and not claimed
    /// yet). Prefer [`Reaper::watch_spawned`] when the process's start time is known: this one
    /// would take a kept exit of an earlier process with the same pid (bounded by [`KEEP_FOR`]).
    pub fn watch(&self, pid: i32) -> oneshot::Receiver<Exit> {
        self.book().watch(pid, None, Instant::now())
    }

    /// The exit of `pid`, a process that began after `spawned_at`: a kept exit of `pid` reaped
    /// before that instant belongs to an earlier process with the same pid and is ignored.
    ///
    /// For a child: take `Instant::now()` before `Command::spawn`. For a container's init or exec
    /// process: take it before spawning the `runc create` / `runc exec` that starts it.
    pub fn watch_spawned(&self, pid: i32, spawned_at: Instant) -> oneshot::Receiver<Exit> {
        self.book().watch(pid, Some(spawned_at), Instant::now())
    }

    /// Sends SIGKILL to the process group that `pid` leads, unless `exit` (its watch) holds
    /// its exit already; returns whether the group was signalled.
    ///
    /// For a child of this process that was spawned as the leader of a group of its own
    /// (`process_group(0)`). The check and the kill run under the book's lock, and the loop
    /// reaps under that lock too: while the exit is not booked the leader is not reaped, and an
    /// unreaped process (a zombie too) keeps its pid, so the group id cannot name another
    /// group. Once the exit is booked nothing is signalled: the leader's pid may be reused, and
    /// what stays in its group (a container's init that did not `setsid`) is not this call's to
    /// kill. The killed processes are reaped by the loop like any other child (the leader's
    /// exit goes to `exit`); nothing here waits, so nothing is reaped twice.
    pub fn kill_group(&self, pid: i32, exit: &oneshot::Receiver<Exit>) -> Result<bool, Errno> {
        let _book = self.book();
        // Empty: no exit sent (a terminated receiver got its exit earlier, and is empty too).
        if !exit.is_empty() || exit.is_terminated() || pid <= 1 {
            return Ok(false);
        }
        match nix::sys::signal::killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL) {
            Ok(()) => Ok(true),
            // Not expected (an unreaped leader, a zombie too, is a member of its group); if so,
            // there is nothing to kill.
            Err(Errno::ESRCH) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // The book's methods do not panic, so a poisoned lock still holds consistent data.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reaps at start, then after every SIGCHLD, until the runtime stops.
async fn reap_loop(book: Arc<Mutex<Book>>, mut sigchld: tokio::signal::unix::Signal, log: Logger) {
    loop {
        {
            // `waitpid` runs under the book's lock, so a reaped exit is booked before anyone
            // can look: [`Reaper::kill_group`] relies on it (a child whose exit is not booked
            // still holds its pid).
            let mut book = book.lock().unwrap_or_else(PoisonError::into_inner);
            let exits = reap_all(&log);
            let now = Instant::now();
            for exit in exits {
                debug!(log, "process exited"; "pid" => exit.pid, "status" => exit.status);
                book.exited(exit, now);
            }
        }
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

/// Reaps every child that has ended, without blocking.
fn reap_all(log: &Logger) -> Vec<Exit> {
    let mut exits = Vec::new();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return exits,
            Ok(status) => {
                if let Some((pid, status)) = exit_of(status) {
                    exits.push(Exit {
                        pid,
                        status,
                        at: SystemTime::now(),
                    });
                }
            }
            Err(Errno::EINTR) => continue,
            Err(e) => {
                // Not expected from waitpid(-1, WNOHANG) (EINVAL would be a bad flag). The next
                // SIGCHLD tries again; the error is handled (logged) here.
                error!(log, "waitpid(-1) failed"; "error" => %e);
                return exits;
            }
        }
    }
}

/// The pid and containerd-style status of a wait status that ends a process; `None` for a stop
/// or continue report (not asked for, but harmless).
fn exit_of(status: WaitStatus) -> Option<(i32, u32)> {
    match status {
        WaitStatus::Exited(pid, code) => Some((pid.as_raw(), code as u32)),
        WaitStatus::Signaled(pid, signal, _core) => Some((pid.as_raw(), 128 + signal as u32)),
        _ => None,
    }
}

/// Watches by pid and exits nobody watched yet: the reaper's bookkeeping, without syscalls.
#[derive(Default)]
pub(crate) struct Book {
    /// Watches waiting for their pid's exit.
    watchers: HashMap<i32, Vec<oneshot::Sender<Exit>>>,
    /// Exits that came before any watch, oldest first, with when they were reaped.
    kept: VecDeque<(Exit, Instant)>,
}

impl Book {
    /// Records an exit reaped at `now`: to the pid's watches if any, else kept.
    pub(crate) fn exited(&mut self, exit: Exit, now: Instant) {
        if let Some(watchers) = self.watchers.remove(&exit.pid) {
            let mut delivered = false;
            for watcher in watchers {
                // A dropped receiver: that watcher stopped caring; the others still get it.
                delivered |= watcher.send(exit).is_ok();
            }
            if delivered {
                return;
            }
        }
        // A kept exit of the same pid belongs to an earlier process: the newest one wins.
        self.kept.retain(|(kept, _)| kept.pid != exit.pid);
        self.kept.push_back((exit, now));
        self.evict(now);
    }

    /// A watch of `pid` (begun after `not_before`, if known), at `now`.
    pub(crate) fn watch(
        &mut self,
        pid: i32,
        not_before: Option<Instant>,
        now: Instant,
    ) -> oneshot::Receiver<Exit> {
        self.evict(now);
        let (tx, rx) = oneshot::channel();
        let found = self.kept.iter().position(|(exit, reaped)| {
            exit.pid == pid && not_before.is_none_or(|start| *reaped >= start)
        });
        if let Some(index) = found {
            if let Some((exit, _)) = self.kept.remove(index) {
                // The receiver is alive (it is returned below), so the send succeeds.
                let _ = tx.send(exit);
                return rx;
            }
        }
        // Kept exits of `pid` older than the watched process are stale: drop them now.
        if not_before.is_some() {
            self.kept.retain(|(exit, _)| exit.pid != pid);
        }
        let watchers = self.watchers.entry(pid).or_default();
        watchers.retain(|w| !w.is_closed());
        watchers.push(tx);
        rx
    }

    /// Drops kept exits older than [`KEEP_FOR`], then the oldest beyond [`KEEP_AT_MOST`].
    fn evict(&mut self, now: Instant) {
        while let Some((_, reaped)) = self.kept.front() {
            if now.saturating_duration_since(*reaped) > KEEP_FOR {
                self.kept.pop_front();
            } else {
                break;
            }
        }
        while self.kept.len() > KEEP_AT_MOST {
            self.kept.pop_front();
        }
    }

    #[cfg(test)]
    fn kept_pids(&self) -> Vec<i32> {
        self.kept.iter().map(|(exit, _)| exit.pid).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests;
