//! The task logic of one pod's shim: its containers and exec processes, run through the OCI
//! runtime, their exits and OOMs reported to containerd. Plain Rust over narrow ports
//! ([`ports`]); the ttrpc `Task` service (`crate::service`) is a thin adapter over [`Tasks`].
//! Here: [`Tasks`] and its calls; `create`: Create; `exit`: exits, OOM kills and a pod
//! holder's end; [`ports`]: the OCI runtime, exits and events it reaches through.
//!
//! A process's life, as the shim tracks it:
//!
//! ```text
//!   Create/Exec ──> CREATED ──Start──> RUNNING <──Resume── PAUSED
//!                     │                  │  └─────Pause─────^
//!                     │                  └──(reaper: exit)──> STOPPED ──Delete──> gone
//!                     └────────────────Delete─────────────────────────────────────^
//! ```
//!
//! Event order is the contract containerd and CRI clients rely on: TaskCreate → TaskStart →
//! (TaskOOM) → TaskExit → TaskDelete, and ExecAdded → ExecStarted → TaskExit. Each container
//! has one `lifecycle` lock: Create, Start and Exec publish under it, and an exit is published
//! under it too, so a process that dies at once never has its TaskExit overtake its TaskStart.
//! Before TaskExit of an init process the shim re-reads the cgroup's OOM-kill counter, so a
//! TaskOOM whose watch wake-up has not been handled yet still comes first. An exit's output is
//! drained (bounded) before its TaskExit, so a client that reads the log after the exit sees
//! every line.
//!
//! A pod holder (the task of a pod without a pause container, `crate::bundle::is_pod_holder`)
//! goes through the same records without a process: Create and Start call no OCI runtime, a
//! kill ends it with 128 + the signal, Delete forgets it. It keeps the shim, and with it the
//! pod's containers, until the pod stops.
//!
//! The exit status of an init process is also written to the bundle: a `delete` after the shim
//! died reports the real code. Events go through [`Events`] (the shim's `Publisher`, which
//! never drops one).

mod create;
mod exit;
pub(crate) mod ports;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use containerd_shim_protos::events::task::{
    TaskDelete, TaskExecAdded, TaskExecStarted, TaskPaused, TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::types::mount::Mount;
use slog::{info, o, Logger};
use tokio::sync::mpsc;

use crate::cgroup::CgroupReadings;
use crate::error::ShimError;
use crate::io::{IoSpec, ProcessIo};
use crate::process::{timestamp, Container, Exited, Proc, ProcStatus};
use crate::rootfs::unmount;
use crate::runc::{ExecOpts, RuncError};
pub(crate) use ports::{Event, Events, ExitWatch, OciRuntime, Runtimes};

/// How long an exit waits for its process's output to drain before TaskExit goes out anyway
/// (a grandchild may hold the pipe open for ever).
const IO_DRAIN: Duration = Duration::from_secs(2);
/// Console sockets: a short directory, as a unix socket path must stay under 108 bytes and a
/// bundle path alone is about 100.
pub(crate) const CONSOLE_DIR: &str = "/run/remora-shim";

/// A container to create (the task API's Create).
#[derive(Debug, Clone, Default)]
pub(crate) struct NewTask {
    /// The container id.
    pub(crate) id: String,
    /// The OCI bundle.
    pub(crate) bundle: String,
    /// The rootfs mounts (none: the bundle's rootfs is ready).
    pub(crate) rootfs: Vec<Mount>,
    /// The init process's streams (owner: from the options).
    pub(crate) stdin: String,
    /// See `stdin`.
    pub(crate) stdout: String,
    /// See `stdin`.
    pub(crate) stderr: String,
    /// Run the init process on a pty.
    pub(crate) terminal: bool,
    /// The task options, as containerd packs them.
    pub(crate) options: Option<Any>,
    /// A checkpoint to restore from (refused).
    pub(crate) checkpoint: String,
}

/// An exec process to add (the task API's Exec).
#[derive(Debug, Clone, Default)]
pub(crate) struct NewExec {
    /// The container id.
    pub(crate) id: String,
    /// The exec id.
    pub(crate) exec_id: String,
    /// The process's streams (owner: the container's).
    pub(crate) stdin: String,
    /// See `stdin`.
    pub(crate) stdout: String,
    /// See `stdin`.
    pub(crate) stderr: String,
    /// Run the process on a pty.
    pub(crate) terminal: bool,
    /// The OCI process JSON (empty: none given).
    pub(crate) spec: Vec<u8>,
}

/// What a Delete reports: the process's pid and its exit (now and 0 if it never ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deleted {
    pub(crate) pid: u32,
    pub(crate) exit: Exited,
}

/// A process as State reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcView {
    /// The container id for the init process, else the exec id.
    pub(crate) id: String,
    /// The exec id asked for (empty: init).
    pub(crate) exec_id: String,
    pub(crate) bundle: String,
    pub(crate) pid: u32,
    pub(crate) status: ProcStatus,
    pub(crate) io: IoSpec,
    pub(crate) exit: Option<Exited>,
}

/// A process of a container as Pids reports it: its pid, and its exec id if it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PidInfo {
    pub(crate) pid: u32,
    pub(crate) exec_id: Option<String>,
}

struct Inner {
    namespace: String,
    events: Arc<dyn Events>,
    exits: Arc<dyn ExitWatch>,
    runtimes: Arc<dyn Runtimes>,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    oom_tx: mpsc::UnboundedSender<String>,
    log: Logger,
}

/// The containers of one shim and what is done to them; cheap to clone.
#[derive(Clone)]
pub(crate) struct Tasks {
    inner: Arc<Inner>,
}

impl Tasks {
    /// The tasks of one shim: events go to `events`, exits come from `exits`, each container's
    /// OCI runtime is made by `runtimes`. Starts the task that reports OOM kills (so it must
    /// run inside a tokio runtime).
    pub(crate) fn new(
        namespace: String,
        events: Arc<dyn Events>,
        exits: Arc<dyn ExitWatch>,
        runtimes: Arc<dyn Runtimes>,
        log: Logger,
    ) -> Tasks {
        let (oom_tx, oom_rx) = mpsc::unbounded_channel();
        let tasks = Tasks {
            inner: Arc::new(Inner {
                namespace,
                events,
                exits,
                runtimes,
                containers: Mutex::new(HashMap::new()),
                oom_tx,
                log,
            }),
        };
        tasks.clone().spawn_oom_reports(oom_rx);
        tasks
    }

    pub(crate) fn container(&self, id: &str) -> Result<Arc<Container>, ShimError> {
        self.containers()
            .get(id)
            .cloned()
            .ok_or_else(|| ShimError::ContainerNotFound { id: id.to_string() })
    }

    /// The container's process: its init (empty `exec_id`) or an exec.
    fn proc(&self, id: &str, exec_id: &str) -> Result<(Arc<Container>, Arc<Proc>), ShimError> {
        let c = self.container(id)?;
        let p = c.proc(exec_id)?;
        Ok((c, p))
    }

    fn containers(&self) -> MutexGuard<'_, HashMap<String, Arc<Container>>> {
        self.inner
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether no container is left.
    pub(crate) fn is_empty(&self) -> bool {
        self.containers().is_empty()
    }

    fn publish(&self, event: Event) {
        self.inner.events.send(event);
    }

    /// Refuses what needs a process of a pod holder's.
    fn holder_has_no_process(c: &Container, action: &'static str) -> Result<(), ShimError> {
        if c.holder {
            return Err(ShimError::WrongState {
                id: c.id.clone(),
                action,
                state: "a pod holder, which runs no process",
            });
        }
        Ok(())
    }

    /// Start: the init process (or an exec process) run; its pid.
    pub(crate) async fn start(&self, id: &str, exec_id: &str) -> Result<u32, ShimError> {
        let (c, p) = self.proc(id, exec_id)?;
        let _order = c.lifecycle.lock().await;
        let status = p.state().status;
        if status != ProcStatus::Created {
            return Err(ShimError::WrongState {
                id: id.to_string(),
                action: "start",
                state: status.name(),
            });
        }
        if exec_id.is_empty() {
            if !c.holder {
                c.runc.start(&c.id).await?;
            }
            let pid = {
                let mut st = p.state();
                // The exit may have been reaped already; it is published after this, in order.
                if st.status == ProcStatus::Created {
                    st.status = ProcStatus::Running;
                }
                st.pid
            };
            let mut e = TaskStart::new();
            e.container_id = c.id.clone();
            e.pid = pid;
            self.publish(Event::Start(e));
            return Ok(pid);
        }
        let log = self
            .inner
            .log
            .new(o!("container_id" => c.id.clone(), "exec_id" => exec_id.to_string()));
        let mut io = ProcessIo::prepare(
            &p.io_spec,
            exec_id,
            &self.inner.namespace,
            Path::new(CONSOLE_DIR),
            log.clone(),
        )
        .await?;
        self.watch_logger(&io);
        let pid_file = c.bundle.join(format!("exec-{}.pid", short(exec_id)));
        let opts = ExecOpts {
            pid_file: pid_file.clone(),
            console_socket: io.console_socket().map(Path::to_path_buf),
            stdio: io.take_stdio(),
        };
        let spawned_at = Instant::now();
        let pid = c.runc.exec(&c.id, &p.spec_json, opts).await;
        let _ = std::fs::remove_file(&pid_file);
        let pid = pid?;
        // Watched before anything else can fail: the reaper keeps an early exit for us.
        {
            let mut st = p.state();
            st.pid = pid;
            st.status = ProcStatus::Running;
        }
        let copying = io.start_copying().await;
        *p.io.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(io));
        self.watch_exit(c.clone(), p.clone(), pid, spawned_at);
        if let Err(e) = copying {
            // The process runs without its IO: kill it, its exit is reported as usual.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return Err(e.into());
        }
        let mut e = TaskExecStarted::new();
        e.container_id = c.id.clone();
        e.exec_id = exec_id.to_string();
        e.pid = pid;
        self.publish(Event::ExecStarted(e));
        Ok(pid)
    }

    /// Delete: a process that is not running forgotten (for the init process: the container
    /// deleted from the OCI runtime, its rootfs unmounted); its pid and exit.
    pub(crate) async fn delete(&self, id: &str, exec_id: &str) -> Result<Deleted, ShimError> {
        let (c, p) = self.proc(id, exec_id)?;
        let _order = c.lifecycle.lock().await;
        let (status, pid, exit) = {
            let st = p.state();
            (st.status, st.pid, st.exit)
        };
        if matches!(status, ProcStatus::Running | ProcStatus::Paused) {
            return Err(ShimError::WrongState {
                id: id.to_string(),
                action: "delete",
                state: status.name(),
            });
        }
        let exit = exit.unwrap_or(Exited {
            status: 0,
            at: SystemTime::now(),
        });
        let deleted = Deleted { pid, exit };
        if !exec_id.is_empty() {
            c.execs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(exec_id);
            return Ok(deleted);
        }
        if !c.holder {
            match c.runc.delete(&c.id, status == ProcStatus::Created).await {
                Ok(()) | Err(RuncError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if c.rootfs_mounted {
            unmount(&c.id, &c.bundle.join("rootfs"))?;
        }
        c.oom_watch.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.containers().remove(&c.id);
        let mut e = TaskDelete::new();
        e.container_id = c.id.clone();
        e.id = c.id.clone();
        e.pid = pid;
        e.exit_status = exit.status;
        e.exited_at = MessageField::some(timestamp(exit.at));
        self.publish(Event::Delete(e));
        info!(self.inner.log, "container deleted"; "container_id" => &c.id);
        Ok(deleted)
    }

    /// Exec: an exec process added to a running container (created, not started).
    pub(crate) async fn exec(&self, req: NewExec) -> Result<(), ShimError> {
        let c = self.container(&req.id)?;
        Self::holder_has_no_process(&c, "exec in")?;
        if req.exec_id.is_empty() {
            return Err(ShimError::InvalidArgument {
                field: "exec_id",
                reason: "empty".into(),
            });
        }
        let _order = c.lifecycle.lock().await;
        let status = c.init.state().status;
        if status != ProcStatus::Running {
            return Err(ShimError::WrongState {
                id: req.id.clone(),
                action: "exec in",
                state: status.name(),
            });
        }
        if req.spec.is_empty() {
            return Err(ShimError::InvalidArgument {
                field: "spec",
                reason: "no process spec".into(),
            });
        }
        {
            let mut execs = c.execs.lock().unwrap_or_else(|e| e.into_inner());
            if execs.contains_key(&req.exec_id) {
                return Err(ShimError::AlreadyExists {
                    what: "exec",
                    id: req.exec_id.clone(),
                });
            }
            let io = IoSpec {
                stdin: req.stdin,
                stdout: req.stdout,
                stderr: req.stderr,
                terminal: req.terminal,
                owner: c.io_owner,
            };
            execs.insert(
                req.exec_id.clone(),
                Arc::new(Proc::new(req.exec_id.clone(), io, req.spec)),
            );
        }
        let mut e = TaskExecAdded::new();
        e.container_id = c.id.clone();
        e.exec_id = req.exec_id;
        self.publish(Event::ExecAdded(e));
        Ok(())
    }

    /// Kill: `signal` to the init process (`all`: to every process of the container) or to an
    /// exec process. A finished process is NotFound.
    pub(crate) async fn kill(
        &self,
        id: &str,
        exec_id: &str,
        signal: u32,
        all: bool,
    ) -> Result<(), ShimError> {
        let (c, p) = self.proc(id, exec_id)?;
        let (status, pid) = {
            let st = p.state();
            (st.status, st.pid)
        };
        let finished = || ShimError::ProcessFinished {
            id: if exec_id.is_empty() { id } else { exec_id }.to_string(),
        };
        if status == ProcStatus::Stopped {
            return Err(finished());
        }
        if exec_id.is_empty() && c.holder {
            // Signal 0 asks whether it is there; any other ends it.
            if signal != 0 {
                self.stop_holder(&c, signal).await;
            }
            return Ok(());
        }
        if exec_id.is_empty() {
            return match c.runc.kill(&c.id, signal, all).await {
                Ok(()) => Ok(()),
                // The init process died between our check and runc's: it is finished.
                Err(RuncError::NotFound { .. }) => Err(finished()),
                Err(e) if e.is_not_running() => Err(finished()),
                Err(e) => Err(e.into()),
            };
        }
        if status == ProcStatus::Created {
            return Err(ShimError::WrongState {
                id: exec_id.to_string(),
                action: "kill",
                state: status.name(),
            });
        }
        let sig = nix::sys::signal::Signal::try_from(signal as i32).map_err(|_| {
            ShimError::InvalidArgument {
                field: "signal",
                reason: format!("{signal} is not a signal"),
            }
        })?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).map_err(|source| {
            match source {
                nix::Error::ESRCH => finished(),
                source => ShimError::Signal {
                    signal,
                    pid: pid as i32,
                    source,
                },
            }
        })
    }

    /// Pids: the container's processes, as the OCI runtime lists them, exec processes named.
    pub(crate) async fn pids(&self, id: &str) -> Result<Vec<PidInfo>, ShimError> {
        let c = self.container(id)?;
        if c.holder {
            return Ok(Vec::new());
        }
        let pids = c.runc.ps(&c.id).await?;
        let execs: HashMap<u32, String> = c
            .execs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|p| (p.state().pid, p.exec_id.clone()))
            .collect();
        Ok(pids
            .into_iter()
            .map(|pid| PidInfo {
                pid,
                exec_id: execs.get(&pid).cloned(),
            })
            .collect())
    }

    /// Pause (`pause`) a running container or resume a paused one.
    pub(crate) async fn pause_or_resume(&self, id: &str, pause: bool) -> Result<(), ShimError> {
        let c = self.container(id)?;
        Self::holder_has_no_process(&c, if pause { "pause" } else { "resume" })?;
        let _order = c.lifecycle.lock().await;
        let status = c.init.state().status;
        let want = if pause {
            ProcStatus::Running
        } else {
            ProcStatus::Paused
        };
        if status != want {
            return Err(ShimError::WrongState {
                id: id.to_string(),
                action: if pause { "pause" } else { "resume" },
                state: status.name(),
            });
        }
        if pause {
            c.runc.pause(id).await?;
            c.init.state().status = ProcStatus::Paused;
            let mut e = TaskPaused::new();
            e.container_id = id.to_string();
            self.publish(Event::Paused(e));
        } else {
            c.runc.resume(id).await?;
            c.init.state().status = ProcStatus::Running;
            let mut e = TaskResumed::new();
            e.container_id = id.to_string();
            self.publish(Event::Resumed(e));
        }
        Ok(())
    }

    /// State: the process's record.
    pub(crate) fn state(&self, id: &str, exec_id: &str) -> Result<ProcView, ShimError> {
        let (c, p) = self.proc(id, exec_id)?;
        let st = p.state();
        Ok(ProcView {
            id: if exec_id.is_empty() {
                c.id.clone()
            } else {
                p.exec_id.clone()
            },
            exec_id: exec_id.to_string(),
            bundle: c.bundle.display().to_string(),
            pid: st.pid,
            status: st.status,
            io: p.io_spec.clone(),
            exit: st.exit,
        })
    }

    /// ResizePty: the process's pty resized (nothing without one).
    pub(crate) fn resize_pty(
        &self,
        id: &str,
        exec_id: &str,
        width: u32,
        height: u32,
    ) -> Result<(), ShimError> {
        let (_, p) = self.proc(id, exec_id)?;
        if let Some(io) = p.io() {
            io.resize(width, height)?;
        }
        Ok(())
    }

    /// CloseIO: the process's stdin closed (when `stdin`).
    pub(crate) fn close_io(&self, id: &str, exec_id: &str, stdin: bool) -> Result<(), ShimError> {
        let (_, p) = self.proc(id, exec_id)?;
        if stdin {
            if let Some(io) = p.io() {
                io.close_stdin();
            }
        }
        Ok(())
    }

    /// Update: the container's resources (an OCI `LinuxResources` JSON) set.
    pub(crate) async fn update(&self, id: &str, resources: &[u8]) -> Result<(), ShimError> {
        let c = self.container(id)?;
        Self::holder_has_no_process(&c, "update the resources of")?;
        if resources.is_empty() {
            return Err(ShimError::InvalidArgument {
                field: "resources",
                reason: "empty".into(),
            });
        }
        Ok(c.runc.update(&c.id, resources).await?)
    }

    /// Wait: the process's exit, once it is in.
    pub(crate) async fn wait(&self, id: &str, exec_id: &str) -> Result<Exited, ShimError> {
        let (_, p) = self.proc(id, exec_id)?;
        Ok(p.wait().await)
    }

    /// Stats: the container's cgroup metrics, packed as containerd packs them.
    pub(crate) fn stats(&self, id: &str) -> Result<Any, ShimError> {
        let c = self.container(id)?;
        let cg = c.cgroup.as_ref().ok_or_else(|| ShimError::WrongState {
            id: id.to_string(),
            action: "read the stats of",
            state: "cgroup-less",
        })?;
        Ok(cg.metrics()?)
    }

    /// The pid of the container's init process, if there is such a container.
    pub(crate) fn task_pid(&self, id: &str) -> Option<u32> {
        self.container(id).ok().map(|c| c.init.state().pid)
    }
}

/// Exec ids are up to 64 bytes: pid files stay short.
fn short(exec_id: &str) -> String {
    exec_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(32)
        .collect()
}

#[cfg(test)]
pub(crate) mod fakes;
#[cfg(test)]
mod tests;
