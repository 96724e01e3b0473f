//! A container's exit: the exit monitor on its task, and the recording of the exit (persisted,
//! task deleted, EXITED once with one STOPPED event) that the event queue retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slog::{info, warn};

use super::backend::{Exit, ForceDeleted, ShimRuntime};
use super::container_events::EventKind;
use super::{exit_ns, now_ns, wait_through_outages, ContainerError, ContainerIo, Pods};
use crate::io::{FifoSet, LogWriter};
use crate::store::persist::CONTAINER_EXTENSION;
use crate::store::{encode_extension, Container, ContainerSnapshot, ContainerState, ExitOutcome};

impl Pods {
    pub(crate) fn set_monitored(&self, id: &str, on: bool) {
        let mut m = self.monitored.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            m.insert(id.to_string());
        } else {
            m.remove(id);
        }
    }

    /// Whether container `id`'s exit monitor is attached.
    pub(crate) fn is_monitored(&self, id: &str) -> bool {
        self.monitored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    /// Records container `id`'s exit (status and time from containerd): persisted as EXITED,
    /// the task deleted, then RUNNING → EXITED in the index once (later calls find it
    /// recorded) with one STOPPED event, and the log closed. Idempotent, so the event queue may
    /// retry it; an error (containerd unreachable, or the `exit.handle` failpoint) asks for a
    /// retry.
    pub(crate) async fn handle_exit(
        &self,
        id: &str,
        status: u32,
        at: Option<std::time::SystemTime>,
    ) -> Result<(), ContainerError> {
        let Ok(container) = self.containers_store.get(id) else {
            return Ok(()); // removed meanwhile
        };
        crate::failpoint::hit("exit.handle", &container.metadata().name).await?;
        // Until the task is deleted below, RemoveContainer and StopPodSandbox wait for this
        // recording to settle rather than delete the task themselves.
        let _exiting = self.exiting.enter(id);
        // Durable first: the record says EXITED before anyone is told, so a crash later loses
        // nothing (a restarted remora finds the record EXITED and the task stopped, records
        // nothing twice and deletes the task). Then the exit becomes visible — the index, the
        // STOPPED event, and Stop's waiters — and only then is the task (the shim holding the
        // exit status) deleted: Stop does not pay for the delete. Remove waits for it (see
        // `ExitsInFlight`), so its own Tasks.Delete never races this one into a shim that is
        // shutting down ("ttrpc: closed"). A failed delete fails the handling, and the event
        // queue's retry finds the exit recorded and deletes again.
        let mut exited = container.snapshot();
        // The OOM event may have been published while nobody listened (containerd or remora
        // away): the cgroup, kept until the task is deleted below, counts OOM kills. Recovery
        // after a restart asks the same question (`oom_killed_in_cgroup_of`).
        if !exited.status.oom_killed && self.oom_killed_in_cgroup_of(&container, status) {
            exited.status.mark_oom();
            if container.mark_oom() == crate::store::OomOutcome::Marked {
                info!(self.log, "OOM kill found in the container's cgroup"; "container_id" => id);
            }
        }
        if exited.status.record_exit(status as i32, exit_ns(at)) == ExitOutcome::Recorded {
            self.persist_snapshot(id, &exited).await;
            // Before the exit is visible: a StopContainer waiting for it answers after the
            // plugins heard of it, so its RemoveContainer event comes after this one.
            self.nri_stop_container(&exited).await;
        }
        if let Some(io) = self.io.get(id) {
            if let Some(w) = &io.log {
                w.close().await;
            }
        }
        if container.record_exit(status as i32, exit_ns(at)) == ExitOutcome::Recorded {
            info!(self.log, "container exited"; "container_id" => id, "exit_code" => status);
            // Stamped when published, not with the exit time (which the status carries):
            // kubelet's evented PLEG drops an event older than the pod status it last read,
            // and a status read between the exit and this point still showed it running.
            self.events.emit(
                id,
                &container.metadata().sandbox_id,
                EventKind::Stopped,
                now_ns(),
            );
        }
        self.tasks.delete(id).await?;
        Ok(())
    }

    /// NRI's StopContainer for a container that stopped (on its own, killed, or its task
    /// gone), once per container (see [`super::nri`]).
    pub(crate) async fn nri_stop_container(&self, container: &ContainerSnapshot) {
        let Some(nri) = self.nri() else { return };
        if !self.nri_first_stop(&container.metadata.id) {
            return;
        }
        // A pod is removed only after its containers: without it there is nothing to tell.
        let Ok(pod) = self.sandboxes.get(&container.metadata.sandbox_id) else {
            return;
        };
        nri.stop_container(&pod.snapshot(), container).await;
    }

    /// Whether the kernel OOM-killed a process of `container`, which exited with
    /// `exit_status` (see [`super::recover::oom_killed_in_cgroup_at`]).
    pub(crate) fn oom_killed_in_cgroup_of(&self, container: &Container, exit_status: u32) -> bool {
        let parent = self.pod_cgroup_parent(container);
        let driver = self.host.cgroup_driver;
        let own_dir = crate::spec::cgroups::container_cgroup_dir(driver, &parent, container.id());
        let pod_dir = crate::spec::cgroups::pod_cgroup_dir(driver, &parent);
        super::recover::oom_killed_in_cgroup_at(&super::recover::OomProbe {
            id: container.id(),
            own_dir: own_dir.as_deref(),
            pod_dir: pod_dir.as_deref(),
            pod_kills_at_start: container.snapshot().status.pod_oom_kills_at_start,
            exit_status,
        })
    }

    /// The OOM kill count of `container`'s pod cgroup now (cgroup v2 only), for
    /// [`crate::store::ContainerStatus::pod_oom_kills_at_start`].
    pub(crate) fn pod_oom_kills_of(&self, container: &Container) -> Option<u64> {
        let parent = self.pod_cgroup_parent(container);
        let pod_dir = crate::spec::cgroups::pod_cgroup_dir(self.host.cgroup_driver, &parent);
        super::recover::pod_oom_kills(pod_dir.as_deref())
    }

    fn pod_cgroup_parent(&self, container: &Container) -> String {
        self.sandboxes
            .get(&container.metadata().sandbox_id)
            .map(|s| s.metadata().cgroup_parent.clone())
            .unwrap_or_default()
    }

    /// A running container whose task vanished (with its exit status): UNKNOWN, persisted, one
    /// STOPPED event. Returns false if it was not running (nothing done). The transition is
    /// atomic, so of the exit monitor and recovery only one does it.
    pub(crate) async fn mark_vanished(&self, container: &Container) -> bool {
        // `handle_exit` records the exit before it deletes the task, so a task it deleted
        // belongs to a container that is no longer running: never a second STOPPED.
        if !container.mark_unknown_if_running() {
            return false;
        }
        warn!(self.log, "container task vanished; its exit status is unknown"; "container_id" => container.id());
        self.persist(container).await;
        self.nri_stop_container(&container.snapshot()).await;
        self.events.emit(
            container.id(),
            &container.metadata().sandbox_id,
            EventKind::Stopped,
            now_ns(),
        );
        true
    }

    /// Reaps `container` after containerd said its task's shim is gone.
    ///
    /// containerd runs a sandboxed container's task in its pod's shim (see
    /// [`ContainerRecord::sandbox`](super::backend::ContainerRecord::sandbox)) and keeps no
    /// dead-shim cleanup for it: nobody would kill what the shim left running, delete the
    /// task, or tell its exit. remora does what that cleanup does for an unsandboxed task
    /// (the shim binary's `delete`): the OCI runtime force-deletes the container (its
    /// processes SIGKILLed, its cgroup and state removed), and containerd forgets the task
    /// (its delete fails on the closed shim connection but drops the task and unmounts its
    /// bundle). The exit is then 137 for processes killed here — the code containerd's
    /// cleanup reports — and unknown for a container that had exited already (its code died
    /// with the shim): never a code that did not happen.
    pub(crate) async fn reap_after_dead_shim(&self, container: &Container) -> DeadShim {
        let id = container.id();
        // Confirmed before anything is killed: containerd answers a dead shim's task `State` as
        // not found. The task read as there, or containerd not answering (a Wait cut short as
        // containerd itself stops), is no dead shim.
        match self.tasks.state(id).await {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => return DeadShim::NotDead,
        }
        let runtime = match self.containers.get(id).await {
            Ok(Some(r)) if r.sandbox.is_empty() => return DeadShim::NotSandboxed,
            Ok(Some(r)) => r.runtime,
            Ok(None) => return DeadShim::ExitLost, // removed meanwhile
            Err(e) => {
                // The pod's handler names the same runtime the record was made with.
                warn!(self.log, "cannot read the record of a container whose shim died; using its pod's handler"; "container_id" => id, "error" => %e);
                let sb = container.metadata().sandbox_id.clone();
                match self
                    .sandboxes
                    .get(&sb)
                    .map(|s| s.metadata().runtime_handler.clone())
                    .ok()
                    .and_then(|h| self.pod_runtime(&sb, &h).ok())
                {
                    Some(h) => h.runtime.clone(),
                    None => return DeadShim::ExitLost,
                }
            }
        };
        if self.reap_task_of_dead_shim(&runtime, id).await {
            DeadShim::Killed(Exit {
                status: 128 + libc::SIGKILL as u32,
                at: Some(std::time::SystemTime::now()),
            })
        } else {
            DeadShim::ExitLost
        }
    }

    /// The reaping of [`Pods::reap_after_dead_shim`] for container `id` run by `runtime`:
    /// the OCI runtime force-deletes it, then containerd drops the task. Whether processes of
    /// it were still running (and were killed here).
    pub(crate) async fn reap_task_of_dead_shim(&self, runtime: &ShimRuntime, id: &str) -> bool {
        warn!(self.log, "the container's shim died; its processes are killed and its task deleted"; "container_id" => id);
        let killed = match self.oci.force_delete(runtime, id).await {
            Ok(ForceDeleted::WasRunning) => true,
            Ok(ForceDeleted::WasStopped | ForceDeleted::Unknown) => false,
            Err(e) => {
                warn!(self.log, "cannot force-delete the container of a dead shim; its processes may be left"; "container_id" => id, "error" => %e);
                false
            }
        };
        match self.tasks.delete(id).await {
            Ok(_) => {}
            Err(e) if e.is_shim_gone() || e.is_not_found() => {}
            Err(e) => {
                warn!(self.log, "cannot delete the task of a dead shim"; "container_id" => id, "error" => %e)
            }
        }
        killed
    }

    /// Records IO handles of a container (used by recovery).
    pub(crate) fn register_io(&self, id: &str, fifos: FifoSet, log: Option<Arc<LogWriter>>) {
        self.io.insert(id, Arc::new(ContainerIo::new(fifos, log)));
    }

    /// Writes the container's current snapshot to its containerd record (best effort: the
    /// record is how a restarted remora learns an exit that containerd no longer keeps).
    pub(crate) async fn persist(&self, container: &Container) {
        self.persist_snapshot(container.id(), &container.snapshot())
            .await;
    }

    async fn persist_snapshot(&self, id: &str, snapshot: &crate::store::ContainerSnapshot) {
        if let Err(e) = self
            .containers
            .set_extension(id, CONTAINER_EXTENSION, encode_extension(snapshot))
            .await
        {
            warn!(self.log, "cannot update the container record"; "container_id" => id, "error" => %e);
        }
    }

    /// Attaches the exit monitor of a running `container`. It writes no RUNNING state:
    /// StartContainer has written it before it answers, and recovery writes what it
    /// recovered itself.
    pub(crate) fn monitor_container_exit(
        self: &Arc<Self>,
        container: Container,
        copiers: Vec<tokio::task::JoinHandle<crate::io::CopySummary>>,
    ) {
        let me = self.clone();
        me.set_monitored(container.id(), true);
        tokio::spawn(async move {
            let id = container.id().to_string();
            let log = me.log.new(slog::o!("container_id" => id.clone()));
            let tasks = me.tasks.clone();
            let waiting = container.clone();
            let running = move || waiting.state() == ContainerState::Running;
            let mut outcome =
                wait_through_outages(tasks.as_ref(), &id, me.reachability(), true, &running).await;
            let mut backoff = remora_host::backoff::Backoff::new(
                Duration::from_millis(200),
                Duration::from_secs(5),
            );
            while matches!(&outcome, Err(e) if e.is_shim_gone()) {
                match me.reap_after_dead_shim(&container).await {
                    DeadShim::Killed(exit) => outcome = Ok(exit),
                    DeadShim::ExitLost => {}
                    // containerd's own cleanup deletes the task, with the exit it learns.
                    DeadShim::NotSandboxed => {
                        outcome = wait_through_outages(
                            tasks.as_ref(),
                            &id,
                            me.reachability(),
                            false,
                            &running,
                        )
                        .await
                    }
                    DeadShim::NotDead => {
                        tokio::time::sleep(backoff.next_delay()).await;
                        outcome = wait_through_outages(
                            tasks.as_ref(),
                            &id,
                            me.reachability(),
                            true,
                            &running,
                        )
                        .await;
                        continue;
                    }
                }
                break;
            }
            match outcome {
                Ok(exit) => {
                    // Output written just before the exit is still in the pipes: let the
                    // copiers drain to EOF before recording the exit.
                    for c in copiers {
                        let _ = tokio::time::timeout(Duration::from_secs(2), c).await;
                    }
                    me.set_monitored(&id, false);
                    // Recorded by the event queue, in order with the container's other events
                    // and retried with backoff if handling fails; directly without a queue.
                    match me.exit_queue.get() {
                        Some(q) => q.push_exit(&id, exit),
                        None => {
                            if let Err(e) = me.handle_exit(&id, exit.status, exit.at).await {
                                warn!(log, "cannot record the exit"; "error" => %e);
                            }
                        }
                    }
                }
                Err(e) => {
                    me.set_monitored(&id, false);
                    // The task vanished while the container ran: containerd 2.x, restarted
                    // after the process exited, deletes such tasks at start-up ("cleaning
                    // leaked shim process") and the exit status with them. Report UNKNOWN
                    // rather than a made-up exit code, and never RUNNING for a dead process.
                    if !me.mark_vanished(&container).await {
                        warn!(log, "lost the wait on the container task"; "error" => %e);
                    }
                }
            }
        });
    }
}

/// What [`Pods::reap_after_dead_shim`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadShim {
    /// The container's processes were killed here: this is its exit.
    Killed(Exit),
    /// The container had exited (or is gone): its exit status died with the shim.
    ExitLost,
    /// The task is not sandboxed: containerd's own dead-shim cleanup handles it.
    NotSandboxed,
    /// containerd still reads the task as there (or does not answer): nothing was done; wait
    /// on.
    NotDead,
}

/// Containers whose exit is being recorded (`handle_exit` running), counted: the exit monitor
/// and a resync may record one exit at the same time. Whoever would delete such a container's
/// task waits for [`ExitsInFlight::settled`] instead.
#[derive(Debug, Default)]
pub(crate) struct ExitsInFlight {
    ids: Mutex<HashMap<String, usize>>,
    left: tokio::sync::Notify,
}

impl ExitsInFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        // Only map operations run under this lock.
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers an exit of `id` being recorded until the guard drops.
    pub(crate) fn enter(&self, id: &str) -> ExitInFlight<'_> {
        *self.lock().entry(id.to_string()).or_default() += 1;
        ExitInFlight {
            set: self,
            id: id.to_string(),
        }
    }

    /// Whether an exit of `id` is being recorded.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// Resolves once no exit of `id` is being recorded (at once if none is).
    pub(crate) async fn settled(&self, id: &str) {
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            // Registered before the check, so a guard dropped in between still wakes us.
            left.as_mut().enable();
            if !self.contains(id) {
                return;
            }
            left.await;
        }
    }
}

/// A container's exit being recorded, registered in [`ExitsInFlight`] while it lives.
pub(crate) struct ExitInFlight<'a> {
    set: &'a ExitsInFlight,
    id: String,
}

impl Drop for ExitInFlight<'_> {
    fn drop(&mut self) {
        let mut ids = self.set.lock();
        if let Some(n) = ids.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                ids.remove(&self.id);
            }
        }
        drop(ids);
        self.set.left.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_stays_in_flight_until_its_last_recorder_is_done() {
        let set = ExitsInFlight::default();
        let monitor = set.enter("c1");
        let resync = set.enter("c1");
        drop(monitor);
        assert!(set.contains("c1"), "the resync still records it");
        drop(resync);
        assert!(!set.contains("c1"));
    }

    #[tokio::test]
    async fn settled_waits_for_the_last_recorder_and_not_for_others() {
        let set = std::sync::Arc::new(ExitsInFlight::default());
        tokio::time::timeout(Duration::from_secs(5), set.settled("c1"))
            .await
            .expect("nothing in flight: settled at once");
        let guard = set.enter("c1");
        let other = set.enter("c2");
        let waiter = tokio::spawn({
            let set = set.clone();
            async move { set.settled("c1").await }
        });
        tokio::task::yield_now().await;
        drop(other);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "c2 leaving does not settle c1");
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken when c1's recording is done")
            .unwrap();
    }
}
