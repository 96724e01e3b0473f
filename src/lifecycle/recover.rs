//! Rebuilding the pod and container index from containerd (the source of truth) when remora
//! starts, and reconciling it whenever the event stream reconnects.
//!
//! For each sandbox and container record in remora's namespace: decode the metadata from the
//! record's extension, reserve the name, and look at the task — running: re-attach the exit
//! monitor (and, for containers, resume copying output from the FIFOs the shim still holds
//! into the same log file); exited while remora was away: record the real exit status and time
//! from containerd (never a placeholder) and delete the task; gone without a trace: UNKNOWN.
//! Objects already indexed are only reconciled, so running this again is harmless.

use std::sync::Arc;

use slog::{info, warn};

use super::backend::TaskStatus;
use super::sandbox::{exit_ns, now_ns, Pods};
use crate::error::ContainerdError;
use crate::io::{copy_stream, FifoSet, FifoSpec, LogWriter, StreamKind};
use crate::store::persist::{
    CONTAINER_EXTENSION, KIND_CONTAINER, KIND_SANDBOX, LABEL_KIND, SANDBOX_EXTENSION,
};
use crate::store::{
    container_name_key, decode_extension, Container, ContainerSnapshot, ContainerState,
    ExitOutcome, Sandbox, SandboxMetadata, SandboxStatus,
};

/// What a recovery pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Sandboxes newly indexed.
    pub sandboxes: usize,
    /// Containers newly indexed.
    pub containers: usize,
    /// Exits recorded that happened while remora was not watching.
    pub exits: usize,
    /// Records that could not be decoded (left alone).
    pub skipped: usize,
}

impl Pods {
    /// One recovery/reconcile pass over containerd's records.
    pub async fn recover(self: &Arc<Self>) -> Result<Recovered, ContainerdError> {
        let mut done = Recovered::default();
        let records = self.containers().list().await?;
        let log = self.log().clone();
        for r in records
            .iter()
            .filter(|r| r.labels.get(LABEL_KIND).map(String::as_str) == Some(KIND_SANDBOX))
        {
            if self.sandboxes.get(&r.id).is_ok() {
                continue;
            }
            let Some(meta) = r
                .extensions
                .get(SANDBOX_EXTENSION)
                .and_then(|b| decode_extension::<SandboxMetadata>(b).ok())
            else {
                done.skipped += 1;
                warn!(log, "sandbox record without readable metadata; left alone"; "pod_id" => &r.id);
                continue;
            };
            let state = self.tasks().state(&r.id).await?;
            let (status, running) = match state {
                Some(s) if s.status == TaskStatus::Running => (SandboxStatus::ready(s.pid), true),
                _ => (SandboxStatus::default(), false),
            };
            let _ = self.names.reserve(&meta.name_key(), &r.id);
            let sandbox = Sandbox::new(meta, status);
            if !running {
                sandbox.set_not_ready();
            }
            if let Err(e) = self.sandboxes.add(sandbox.clone()) {
                warn!(log, "cannot index a recovered sandbox"; "pod_id" => &r.id, "error" => %e);
                continue;
            }
            if running {
                self.monitor_exit(sandbox);
            }
            done.sandboxes += 1;
        }
        for r in records
            .iter()
            .filter(|r| r.labels.get(LABEL_KIND).map(String::as_str) == Some(KIND_CONTAINER))
        {
            let state = self.tasks().state(&r.id).await?;
            if let Ok(existing) = self.containers_store().get(&r.id) {
                // Known: only an exit missed while the stream was down needs recording.
                if let Some(s) = state.filter(|s| {
                    s.status == TaskStatus::Stopped && existing.state() == ContainerState::Running
                }) {
                    if existing.record_exit(s.exit_status as i32, exit_ns(s.exited_at))
                        == ExitOutcome::Recorded
                    {
                        done.exits += 1;
                        self.persist(&existing).await;
                    }
                } else if state.is_none() {
                    // Deleted by containerd while we were not looking (see the exit monitor).
                    self.mark_vanished(&existing).await;
                }
                continue;
            }
            let Some(snap) = r
                .extensions
                .get(CONTAINER_EXTENSION)
                .and_then(|b| decode_extension::<ContainerSnapshot>(b).ok())
            else {
                done.skipped += 1;
                warn!(log, "container record without readable metadata; left alone"; "container_id" => &r.id);
                continue;
            };
            let meta = (*snap.metadata).clone();
            let container = Container::new(meta.clone(), snap.status.clone());
            if let Ok(sb) = self.sandboxes.get(&meta.sandbox_id) {
                let sb = sb.snapshot();
                let _ = self.names.reserve(
                    &container_name_key(
                        &meta.name,
                        &sb.metadata.name,
                        &sb.metadata.namespace,
                        &sb.metadata.uid,
                        meta.attempt,
                    ),
                    &r.id,
                );
            }
            match state {
                Some(s) if s.status == TaskStatus::Running => {
                    if container.state() != ContainerState::Running {
                        let _ = container.record_started(s.pid, now_ns());
                    }
                    let copiers = self.resume_io(&container).await;
                    self.monitor_container_exit(container.clone(), copiers);
                }
                Some(s) if s.status == TaskStatus::Stopped => {
                    if container.record_exit(s.exit_status as i32, exit_ns(s.exited_at))
                        == ExitOutcome::Recorded
                    {
                        done.exits += 1;
                    }
                    let _ = self.tasks().delete(&r.id).await;
                }
                None if container.state() == ContainerState::Running => {
                    // The task is gone and its exit with it: say so rather than invent one.
                    let _ = container.mark_unknown();
                }
                _ => {}
            }
            if let Err(e) = self.containers_store().add(container.clone()) {
                warn!(log, "cannot index a recovered container"; "container_id" => &r.id, "error" => %e);
                continue;
            }
            self.persist(&container).await;
            done.containers += 1;
        }
        if done != Recovered::default() {
            info!(log, "recovered from containerd"; "sandboxes" => done.sandboxes, "containers" => done.containers, "exits_recorded" => done.exits, "skipped" => done.skipped);
        }
        Ok(done)
    }

    /// A `/tasks/exit` event for `id`. The exit monitor normally records the exit (after the
    /// container's output is drained into its log); if it has not within a grace period, it
    /// was lost, and the exit is recorded here from containerd's task state.
    pub async fn reconcile_exit(&self, id: &str) {
        let Ok(container) = self.containers_store().get(id) else {
            return;
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        while container.state() == ContainerState::Running && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        if container.state() != ContainerState::Running {
            return;
        }
        if let Ok(Some(s)) = self.tasks().state(id).await {
            if s.status == TaskStatus::Stopped
                && container.record_exit(s.exit_status as i32, exit_ns(s.exited_at))
                    == ExitOutcome::Recorded
            {
                self.persist(&container).await;
                self.events.emit(
                    id,
                    &container.metadata().sandbox_id,
                    super::events::EventKind::Stopped,
                    exit_ns(s.exited_at),
                );
            }
        }
    }

    /// Re-opens a running container's FIFOs (the shim still holds the write ends) and resumes
    /// copying into its log file (appending to the same file).
    async fn resume_io(
        &self,
        container: &Container,
    ) -> Vec<tokio::task::JoinHandle<crate::io::CopySummary>> {
        let meta = container.metadata();
        let dir = self.state_dir().join("io").join(container.id());
        let spec = FifoSpec {
            stdin: meta.stdin,
            tty: meta.tty,
        };
        let Ok(fifos) = FifoSet::paths(&dir, container.id(), spec) else {
            return Vec::new();
        };
        if !fifos.stdout().exists() || meta.log_path.is_empty() {
            return Vec::new();
        }
        let Ok(writer) =
            LogWriter::open(&meta.log_path, Some(crate::io::DEFAULT_MAX_LINE_SIZE)).await
        else {
            return Vec::new();
        };
        let writer = Arc::new(writer);
        let mut copiers = Vec::new();
        if let Ok(r) = fifos.open_stdout() {
            copiers.push(copy_stream(r, StreamKind::Stdout, writer.clone()));
        }
        if !meta.tty {
            if let Ok(r) = fifos.open_stderr() {
                copiers.push(copy_stream(r, StreamKind::Stderr, writer.clone()));
            }
        }
        self.register_io(container.id(), fifos, Some(writer));
        copiers
    }
}
