//! `containerd-shim-remora-v2`: remora's own containerd runtime-v2 shim.
//!
//! containerd starts the shim (`start`), talks to it over ttrpc with the task API v3
//! (`containerd.task.v3.Task`), and cleans up after a dead one (`delete`). One shim process
//! serves every container of a pod, grouped by the `io.kubernetes.cri.sandbox-id` annotation.
//! Containers run through an OCI runtime binary (runc by default, crun when configured).
//!
//! The pieces, bottom up:
//! - `reaper`: the shim is a child subreaper; one SIGCHLD-driven loop reaps every child and
//!   hands each exit to whoever watches that pid (an exit before the watch is kept for it).
//! - `runc`: the OCI runtime's command line (create, start, exec, kill, delete, state, ps,
//!   pause, resume, update), its children waited through the reaper.
//! - `io`: container stdio: FIFOs, `binary://` and `file://` log URIs, TTYs through a console
//!   socket.
//! - `cgroup`: a process's cgroup (v1 or v2), its metrics in containerd's metrics types, and
//!   `oom`: OOM-kill watches on it (v1 eventfd, v2 `memory.events`).
//! - `publisher`: events to containerd, in order, spooled to disk, retried for as long as
//!   containerd is away; it never drops one.
//! - `bootstrap`: the command line and the `start` / `delete` / `-info` protocol (containerd
//!   2.3's protobuf bootstrap and the legacy flags and JSON reply), and the server mode.
//! - `service`: the task service (the ttrpc `Task` impl), a thin adapter over `task`: the
//!   containers and their processes (their life, events, exits), over its records of them
//!   (`process`), the task's runtime options (`options`), the container's rootfs
//!   mounts (`rootfs`) and the shim's files in the bundle (`bundle`); `error`: its typed
//!   errors, mapped to ttrpc statuses in one place.
//!
//! The shim links none of remora's daemon dependencies (tonic, hyper, reqwest, rustls) and runs
//! on a current-thread tokio runtime: it is started once per pod, so its memory counts. Host
//! code it shares with the daemon (user namespaces, cgroup discovery, mount options, backoff)
//! is in the `remora-host` crate.

#![warn(missing_docs)]

mod bootstrap;
mod bundle;
mod cgroup;
mod error;
mod io;
mod oom;
mod options;
mod process;
mod publisher;
mod reaper;
mod rootfs;
mod runc;
mod service;
mod task;

/// The shim's entry point: parses the command line, runs the action, returns the exit code.
pub fn main() -> i32 {
    bootstrap::main()
}

/// The standard streams a process is started with: the child's ends, handed to the OCI runtime
/// (which passes them on to the container's process). `None` leaves that stream unconnected
/// (/dev/null). Made by [`io`], consumed by [`runc`].
#[derive(Debug, Default)]
pub(crate) struct Stdio {
    /// The process's stdin.
    pub(crate) stdin: Option<std::os::fd::OwnedFd>,
    /// The process's stdout.
    pub(crate) stdout: Option<std::os::fd::OwnedFd>,
    /// The process's stderr.
    pub(crate) stderr: Option<std::os::fd::OwnedFd>,
}
