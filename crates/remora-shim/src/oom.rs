//! OOM-kill watches on a container's cgroup: every OOM kill in it sends the container's id on a
//! channel, from which the shim publishes `TaskOOM`.
//!
//! # Design
//! - **Registered right after `runc create`**, so an OOM during the container's first moments is
//!   caught; a kill counted before the watch started (the cgroup is fresh per container, so it
//!   can only be this container's) is reported at once.
//! - **No thread per watch.** v1: an eventfd registered with `cgroup.event_control` against
//!   `memory.oom_control`; v2: inotify on `memory.events`. Both fds sit on the tokio reactor
//!   through [`AsyncFd`], one small task per container on the shim's current-thread runtime.
//! - **The counter decides, not the wake-up.** The v1 eventfd also fires when the cgroup is
//!   removed, and under `oom_kill_disable` without a kill; `memory.events` changes for every
//!   event it counts (low, high, max, oom). So each wake-up re-reads `oom_kill` and reports when it
//!   rose: once per wake-up with an increase (kills that coalesce into one wake-up give one
//!   report, as in containerd's Go shim). A cgroup whose file is gone ends the watch.
//! - **v1 notifies before it kills.** The kernel signals the eventfd when the cgroup enters OOM,
//!   then picks and kills a victim, so the first read can see the old count. A wake-up with the
//!   same count is re-read a few times over ~0.6 s before it is dismissed.
//! - **Old v1 kernels** (< 4.13) have no `oom_kill` in `memory.oom_control`: there every wake-up
//!   while the cgroup exists counts as an OOM (which is what containerd's Go shim does on v1).
//! - **TaskOOM before TaskExit.** The watch and the reaper race: the kernel's notification and
//!   the SIGCHLD of the killed process arrive independently. The service closes the race: when
//!   a container's init has exited (its kill is then counted for sure) it re-reads the counter
//!   itself and publishes any kill not yet reported before `TaskExit`; the container's reported
//!   count keeps the watch's own wake-up from reporting the same kill twice.
//! - Dropping the [`OomWatch`] aborts its task, which closes its fds (and so unregisters the v1
//!   eventfd in the kernel).

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent};
use slog::{debug, error, o, warn, Logger};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::cgroup::{Cgroup, CgroupError, CgroupReadings};

#[cfg(test)]
mod tests;

/// Why an OOM watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum OomError {
    /// `start` was called outside a tokio runtime.
    #[error("no tokio runtime to run the OOM watch of container {id} on")]
    NoRuntime {
        /// The container.
        id: String,
    },
    /// The cgroup's OOM counter could not be read (no memory controller, cgroup gone, ...).
    #[error("OOM counter of container {id}: {source}")]
    Counter {
        /// The container.
        id: String,
        #[source]
        source: CgroupError,
    },
    /// `memory.oom_control` could not be opened (v1).
    #[error("open {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// No eventfd could be made (v1).
    #[error("create the OOM eventfd: {source}")]
    EventFd {
        #[source]
        source: nix::Error,
    },
    /// Writing the eventfd registration to `cgroup.event_control` failed (v1).
    #[error("register the OOM eventfd with {path}: {source}")]
    Register {
        /// `cgroup.event_control`.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// No inotify instance could be made (v2).
    #[error("create an inotify instance: {source}")]
    Inotify {
        #[source]
        source: nix::Error,
    },
    /// The inotify watch on `memory.events` could not be added (v2).
    #[error("watch {path} with inotify: {source}")]
    Watch {
        /// `memory.events`.
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    /// The fd could not be put on the tokio reactor.
    #[error("poll the OOM watch fd on the tokio reactor: {source}")]
    Reactor {
        #[source]
        source: std::io::Error,
    },
}

/// After a v1 wake-up without a new kill, re-read the counter after these delays: the kernel
/// signals before it kills.
const V1_RECHECK_DELAYS_MS: [u64; 6] = [10, 20, 40, 80, 160, 320];

/// Sentinel in [`Reporter::last`] for "this kernel has no oom_kill counter".
const NO_COUNTER: u64 = u64::MAX;

/// What the watch's task reads and reports with: the last count reported and where to send.
#[derive(Debug)]
struct Reporter {
    cgroup: Cgroup,
    id: String,
    tx: UnboundedSender<String>,
    /// The `oom_kill` count last reported, or [`NO_COUNTER`].
    last: AtomicU64,
    log: Logger,
}

/// What re-reading the counter found.
enum Check {
    /// A rise was reported (or, with no counter, the wake-up was reported).
    Reported,
    /// The count has not risen.
    Unchanged,
    /// The cgroup is gone, or nobody listens any more: the watch ends.
    End,
}

impl Reporter {
    /// Re-reads the counter and reports a rise.
    fn check(&self) -> Check {
        match self.cgroup.oom_kills() {
            Ok(kills) => {
                let last = self.last.fetch_max(kills, Ordering::SeqCst);
                if kills > last {
                    self.send(kills)
                } else {
                    Check::Unchanged
                }
            }
            Err(CgroupError::Gone { .. }) => {
                debug!(self.log, "cgroup removed; OOM watch ends");
                Check::End
            }
            Err(CgroupError::NoOomKillCounter { .. }) => self.send(0),
            Err(e) => {
                // Transient or not, the watch stays: ending it would lose later OOMs silently.
                warn!(self.log, "read OOM counter"; "error" => %e);
                Check::Unchanged
            }
        }
    }

    fn send(&self, kills: u64) -> Check {
        if self.tx.send(self.id.clone()).is_err() {
            debug!(self.log, "OOM receiver dropped; OOM watch ends");
            return Check::End;
        }
        debug!(self.log, "OOM kill"; "oom_kills" => kills);
        Check::Reported
    }
}

/// An OOM watch on one container's cgroup; dropping it stops the watch (its task ends, fds
/// closed).
#[derive(Debug)]
pub struct OomWatch {
    task: JoinHandle<()>,
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OomWatch {
    /// Starts watching `cgroup` on the current tokio runtime (a current-thread one in the
    /// shim): every OOM kill sends `id` on `tx` (once per wake-up with an increase of the
    /// kernel's counter; a kill counted before the start is sent at once). The watch ends by
    /// itself when the cgroup goes away, or when `tx`'s receiver is dropped.
    pub fn start(
        cgroup: &Cgroup,
        id: String,
        tx: UnboundedSender<String>,
        log: Logger,
    ) -> Result<OomWatch, OomError> {
        // AsyncFd::new and spawn panic outside a runtime; an error is kinder.
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| OomError::NoRuntime { id: id.clone() })?;
        let counter_error = |source| OomError::Counter {
            id: id.clone(),
            source,
        };
        let file = cgroup.oom_file().map_err(counter_error)?;
        let log = log.new(o!("container_id" => id.clone()));
        // Registered before the first read, so that no kill falls between the read and the watch.
        let source = match cgroup {
            Cgroup::V1(_) => Source::EventFd(register_v1(&file)?),
            Cgroup::V2(_) => Source::Inotify(watch_v2(&file)?),
        };
        let last = match cgroup.oom_kills() {
            Ok(_) => 0,
            Err(CgroupError::NoOomKillCounter { .. }) => NO_COUNTER,
            Err(source) => return Err(counter_error(source)),
        };
        let reporter = Arc::new(Reporter {
            cgroup: cgroup.clone(),
            id,
            tx,
            last: AtomicU64::new(last),
            log,
        });
        if last != NO_COUNTER {
            // A kill counted before the watch started (see the module docs).
            reporter.check();
        }
        let task = {
            let _guard = runtime.enter();
            match source {
                Source::EventFd(fd) => {
                    // SAFETY: EventFd owns its fd (an OwnedFd), which stays open, unchanged, until
                    // the AsyncFd drops the EventFd; as_raw_fd always returns that fd.
                    let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                        .map_err(|e| OomError::Reactor {
                            source: e.into_parts().1,
                        })?;
                    runtime.spawn(run_v1(fd, reporter.clone()))
                }
                Source::Inotify(fd) => {
                    // SAFETY: as above: Inotify owns its fd (an OwnedFd), and InotifyFd returns it.
                    let fd = unsafe {
                        AsyncFd::register_with_interest(InotifyFd(fd), Interest::READABLE)
                    }
                    .map_err(|e| OomError::Reactor {
                        source: e.into_parts().1,
                    })?;
                    runtime.spawn(run_v2(fd, reporter.clone()))
                }
            }
        };
        Ok(OomWatch { task })
    }

    /// Whether the watch has ended by itself (its cgroup went away, its receiver was dropped,
    /// or polling its fd failed). Only the tests ask.
    #[cfg(test)]
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits until the watch ends by itself (see [`OomWatch::is_finished`]). Only the tests wait.
    #[cfg(test)]
    pub async fn finished(&mut self) {
        if self.task.is_finished() {
            return;
        }
        // The task never panics (no unwraps) and is aborted only by drop, so the result carries
        // nothing to handle.
        let _ = (&mut self.task).await;
    }
}

enum Source {
    EventFd(EventFd),
    Inotify(Inotify),
}

/// Opens `memory.oom_control` and registers a fresh eventfd against it.
fn register_v1(oom_control: &std::path::Path) -> Result<EventFd, OomError> {
    let control = std::fs::File::open(oom_control).map_err(|source| OomError::Open {
        path: oom_control.to_path_buf(),
        source,
    })?;
    let eventfd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(|source| OomError::EventFd { source })?;
    let event_control = oom_control.with_file_name("cgroup.event_control");
    std::fs::write(
        &event_control,
        format!("{} {}", eventfd.as_raw_fd(), control.as_raw_fd()),
    )
    .map_err(|source| OomError::Register {
        path: event_control,
        source,
    })?;
    // The kernel keeps its own reference to the cgroup, not to this file: it can close now.
    drop(control);
    Ok(eventfd)
}

/// An inotify instance watching `memory.events` for changes and its own removal.
fn watch_v2(memory_events: &std::path::Path) -> Result<Inotify, OomError> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(|source| OomError::Inotify { source })?;
    inotify
        .add_watch(
            memory_events,
            AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_DELETE_SELF,
        )
        .map_err(|source| OomError::Watch {
            path: memory_events.to_path_buf(),
            source,
        })?;
    Ok(inotify)
}

/// nix's Inotify has AsFd but not the AsRawFd that AsyncFd wants.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

async fn run_v1(fd: AsyncFd<EventFd>, reporter: Arc<Reporter>) {
    loop {
        let woken = async {
            loop {
                let mut guard = fd.readable().await?;
                match guard.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from)) {
                    Ok(result) => return result,
                    Err(_would_block) => continue,
                }
            }
        };
        if let Err(e) = woken.await {
            error!(reporter.log, "read the OOM eventfd; OOM watch ends"; "error" => %e);
            return;
        }
        match reporter.check() {
            Check::Reported => continue,
            Check::End => return,
            Check::Unchanged if reporter.last.load(Ordering::SeqCst) == NO_COUNTER => continue,
            Check::Unchanged => {}
        }
        for delay in V1_RECHECK_DELAYS_MS {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            match reporter.check() {
                Check::Reported => break,
                Check::End => return,
                Check::Unchanged => {}
            }
        }
    }
}

async fn run_v2(fd: AsyncFd<InotifyFd>, reporter: Arc<Reporter>) {
    loop {
        let events = async {
            loop {
                let mut guard = fd.readable().await?;
                match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from))
                {
                    Ok(result) => return result,
                    Err(_would_block) => continue,
                }
            }
        };
        let events: Vec<InotifyEvent> = match events.await {
            Ok(events) => events,
            Err(e) => {
                error!(reporter.log, "read the OOM inotify fd; OOM watch ends"; "error" => %e);
                return;
            }
        };
        let removed = events.iter().any(|e| {
            e.mask
                .intersects(AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF)
        });
        if let Check::End = reporter.check() {
            return;
        }
        if removed {
            debug!(reporter.log, "memory.events removed; OOM watch ends");
            return;
        }
    }
}
