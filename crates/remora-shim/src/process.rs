//! The service's records of its containers and their processes (the init process and exec
//! processes): status, pid, exit, IO, and the per-container lock that orders their events
//! (see [`crate::task`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::types::task::Status;
use tokio::sync::watch;

use crate::cgroup::Cgroup;
use crate::error::ShimError;
use crate::io::{IoSpec, ProcessIo};
use crate::oom::OomWatch;
use crate::task::OciRuntime;

/// Where a process is in its life (the diagram in [`crate::task`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcStatus {
    Created,
    Running,
    Paused,
    Stopped,
}

impl ProcStatus {
    /// The state's name in error messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ProcStatus::Created => "created",
            ProcStatus::Running => "running",
            ProcStatus::Paused => "paused",
            ProcStatus::Stopped => "stopped",
        }
    }
    /// The state in the task API.
    pub(crate) fn pb(self) -> Status {
        match self {
            ProcStatus::Created => Status::CREATED,
            ProcStatus::Running => Status::RUNNING,
            ProcStatus::Paused => Status::PAUSED,
            ProcStatus::Stopped => Status::STOPPED,
        }
    }
}

/// A process's exit: its status (exit code, or 128 + signal) and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exited {
    pub(crate) status: u32,
    pub(crate) at: SystemTime,
}

/// What changes in a process's record, under one lock.
pub(crate) struct ProcState {
    pub(crate) status: ProcStatus,
    pub(crate) pid: u32,
    pub(crate) exit: Option<Exited>,
}

/// The init process or an exec process.
pub(crate) struct Proc {
    /// Empty for the init process.
    pub(crate) exec_id: String,
    pub(crate) io_spec: IoSpec,
    /// The exec's OCI process JSON (empty for init).
    pub(crate) spec_json: Vec<u8>,
    pub(crate) state: Mutex<ProcState>,
    pub(crate) io: Mutex<Option<Arc<ProcessIo>>>,
    pub(crate) exited: watch::Sender<Option<Exited>>,
}

impl Proc {
    pub(crate) fn new(exec_id: String, io_spec: IoSpec, spec_json: Vec<u8>) -> Proc {
        Proc {
            exec_id,
            io_spec,
            spec_json,
            state: Mutex::new(ProcState {
                status: ProcStatus::Created,
                pid: 0,
                exit: None,
            }),
            io: Mutex::new(None),
            exited: watch::channel(None).0,
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, ProcState> {
        // A poisoned lock means a panic, which aborts the shim (panic = "abort"): the
        // guard is always usable here.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn io(&self) -> Option<Arc<ProcessIo>> {
        self.io.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits for the process's exit.
    pub(crate) async fn wait(&self) -> Exited {
        let mut rx = self.exited.subscribe();
        loop {
            if let Some(e) = *rx.borrow_and_update() {
                return e;
            }
            if rx.changed().await.is_err() {
                // The sender lives in the Proc we borrow: it cannot be gone.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A container: its init process, its exec processes, and what the shim holds for it.
pub(crate) struct Container {
    pub(crate) id: String,
    pub(crate) bundle: PathBuf,
    /// Its OCI runtime.
    pub(crate) runc: Arc<dyn OciRuntime>,
    pub(crate) rootfs_mounted: bool,
    /// The container shares the host's (or another) pid namespace: its processes do not die
    /// with its init, so they are killed when it exits (as Go shims do).
    pub(crate) kill_all_on_exit: bool,
    /// Serializes Create/Start/Exec publishing with exit publishing (module docs).
    pub(crate) lifecycle: tokio::sync::Mutex<()>,
    pub(crate) init: Arc<Proc>,
    pub(crate) execs: Mutex<HashMap<String, Arc<Proc>>>,
    pub(crate) cgroup: Option<Cgroup>,
    pub(crate) oom_watch: Mutex<Option<OomWatch>>,
    /// OOM kills reported so far (the cgroup's counter when the last TaskOOM went out).
    pub(crate) ooms_reported: Mutex<u64>,
    /// Owner of its processes' stdio pipes (the task options' `io_uid`/`io_gid`), execs too.
    pub(crate) io_owner: Option<(u32, u32)>,
    /// A pod holder (`crate::bundle::is_pod_holder`): the task of a pod without a pause
    /// container, which keeps the pod's shim until the pod stops. It runs no process: the OCI
    /// runtime is never called for it, its pid is the shim's, and a kill ends it.
    pub(crate) holder: bool,
}

impl Container {
    /// The init process (empty `exec_id`) or an exec process.
    pub(crate) fn proc(&self, exec_id: &str) -> Result<Arc<Proc>, ShimError> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        self.execs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(exec_id)
            .cloned()
            .ok_or_else(|| ShimError::ExecNotFound {
                id: self.id.clone(),
                exec_id: exec_id.to_string(),
            })
    }
}

/// Nanoseconds since the epoch (0 before it).
pub(crate) fn to_ns(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A protobuf timestamp of `t`.
pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    timestamp_ns(to_ns(t))
}

/// A protobuf timestamp of nanoseconds since the epoch.
pub(crate) fn timestamp_ns(ns: i64) -> Timestamp {
    let mut ts = Timestamp::new();
    ts.seconds = ns.div_euclid(1_000_000_000);
    ts.nanos = ns.rem_euclid(1_000_000_000) as i32;
    ts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_split_nanoseconds() {
        let t = timestamp_ns(1_500_000_000_123);
        assert_eq!((t.seconds, t.nanos), (1500, 123));
    }
}
