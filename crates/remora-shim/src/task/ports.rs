//! What the task logic ([`super::Tasks`]) reaches outside itself through, in its own words:
//! the OCI runtime ([`OciRuntime`], made per container by [`Runtimes`]), the exits of the
//! processes it started ([`ExitWatch`]) and containerd's event stream ([`Events`]). The shim
//! plugs in [`Runc`], the [`Reaper`] and the [`Publisher`]; the tests plug in recording fakes.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use slog::Logger;
use tokio::sync::oneshot;

use crate::options::RuntimeOptions;
use crate::publisher::Publisher;
use crate::reaper::{Exit, Reaper};
use crate::runc::{CreateOpts, ExecOpts, Runc, RuncError};

/// The OCI runtime calls the task logic makes for one container (the subset of [`Runc`] it
/// uses, with the same meaning and errors).
#[async_trait::async_trait]
pub(crate) trait OciRuntime: Send + Sync {
    /// Creates the container from `bundle`; the pid of its init process.
    async fn create(&self, id: &str, bundle: &Path, opts: CreateOpts) -> Result<u32, RuncError>;
    /// Starts the created container's init process.
    async fn start(&self, id: &str) -> Result<(), RuncError>;
    /// Runs the OCI process `spec_json` in the container; its pid.
    async fn exec(&self, id: &str, spec_json: &[u8], opts: ExecOpts) -> Result<u32, RuncError>;
    /// Signals the init process (`all`: every process of the container).
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuncError>;
    /// Deletes the container (`force`: even if it runs).
    async fn delete(&self, id: &str, force: bool) -> Result<(), RuncError>;
    /// The pids of the container's processes.
    async fn ps(&self, id: &str) -> Result<Vec<u32>, RuncError>;
    /// Freezes the container.
    async fn pause(&self, id: &str) -> Result<(), RuncError>;
    /// Thaws the container.
    async fn resume(&self, id: &str) -> Result<(), RuncError>;
    /// Sets the container's resources (an OCI `LinuxResources` JSON).
    async fn update(&self, id: &str, resources_json: &[u8]) -> Result<(), RuncError>;
}

#[async_trait::async_trait]
impl OciRuntime for Runc {
    async fn create(&self, id: &str, bundle: &Path, opts: CreateOpts) -> Result<u32, RuncError> {
        Runc::create(self, id, bundle, opts).await
    }
    async fn start(&self, id: &str) -> Result<(), RuncError> {
        Runc::start(self, id).await
    }
    async fn exec(&self, id: &str, spec_json: &[u8], opts: ExecOpts) -> Result<u32, RuncError> {
        Runc::exec(self, id, spec_json, opts).await
    }
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuncError> {
        Runc::kill(self, id, signal, all).await
    }
    async fn delete(&self, id: &str, force: bool) -> Result<(), RuncError> {
        Runc::delete(self, id, force).await
    }
    async fn ps(&self, id: &str) -> Result<Vec<u32>, RuncError> {
        Runc::ps(self, id).await
    }
    async fn pause(&self, id: &str) -> Result<(), RuncError> {
        Runc::pause(self, id).await
    }
    async fn resume(&self, id: &str) -> Result<(), RuncError> {
        Runc::resume(self, id).await
    }
    async fn update(&self, id: &str, resources_json: &[u8]) -> Result<(), RuncError> {
        Runc::update(self, id, resources_json).await
    }
}

/// Makes the OCI runtime of a new container from its task options.
pub(crate) trait Runtimes: Send + Sync {
    /// The runtime for a container of `namespace` created with `opts`.
    fn runtime(&self, opts: &RuntimeOptions, namespace: &str, log: &Logger) -> Arc<dyn OciRuntime>;
}

/// The shim's runtimes: the options' runtime binary as [`Runc`], its children waited through
/// the reaper.
pub(crate) struct RuncRuntimes {
    /// The shim's reaper.
    pub(crate) reaper: Reaper,
}

impl Runtimes for RuncRuntimes {
    fn runtime(&self, opts: &RuntimeOptions, namespace: &str, log: &Logger) -> Arc<dyn OciRuntime> {
        Arc::new(Runc::new(
            opts.binary(),
            opts.root_for(namespace),
            opts.systemd_cgroup,
            self.reaper.clone(),
            log.clone(),
        ))
    }
}

/// The exits of the processes the task logic started (see [`Reaper`]).
pub(crate) trait ExitWatch: Send + Sync {
    /// The exit of `pid`, a child the shim did not spawn through the runtime (a log driver).
    fn watch(&self, pid: i32) -> oneshot::Receiver<Exit>;
    /// The exit of `pid`, spawned at or after `spawned_at` (an older kept exit of the same
    /// pid is not this one's).
    fn watch_spawned(&self, pid: i32, spawned_at: Instant) -> oneshot::Receiver<Exit>;
}

impl ExitWatch for Reaper {
    fn watch(&self, pid: i32) -> oneshot::Receiver<Exit> {
        Reaper::watch(self, pid)
    }
    fn watch_spawned(&self, pid: i32, spawned_at: Instant) -> oneshot::Receiver<Exit> {
        Reaper::watch_spawned(self, pid, spawned_at)
    }
}

/// A task event, as containerd receives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// A container was created.
    Create(TaskCreate),
    /// A container's init process was started.
    Start(TaskStart),
    /// A container's processes were OOM-killed.
    Oom(TaskOOM),
    /// A process exited.
    Exit(TaskExit),
    /// A container was deleted.
    Delete(TaskDelete),
    /// An exec process was added.
    ExecAdded(TaskExecAdded),
    /// An exec process was started.
    ExecStarted(TaskExecStarted),
    /// A container was paused.
    Paused(TaskPaused),
    /// A container was resumed.
    Resumed(TaskResumed),
}

/// containerd's event stream, in the order events are sent.
pub(crate) trait Events: Send + Sync {
    /// Sends `event` after every event sent before it; never drops one.
    fn send(&self, event: Event);
}

impl Events for Publisher {
    fn send(&self, event: Event) {
        match event {
            Event::Create(e) => self.publish(&e),
            Event::Start(e) => self.publish(&e),
            Event::Oom(e) => self.publish(&e),
            Event::Exit(e) => self.publish(&e),
            Event::Delete(e) => self.publish(&e),
            Event::ExecAdded(e) => self.publish(&e),
            Event::ExecStarted(e) => self.publish(&e),
            Event::Paused(e) => self.publish(&e),
            Event::Resumed(e) => self.publish(&e),
        }
    }
}
