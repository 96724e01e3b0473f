//! RemoveContainer: a running container is killed first; then it leaves every CRI view (index,
//! name, a DELETED event) and the call answers; its containerd objects (task, image volumes,
//! record, snapshot) and FIFOs go right behind the answer.
//!
//! Why behind: a container stopped a moment ago still has its task delete in flight (the exit
//! recording deletes the task after it published the exit, see `handle_exit`), and the record
//! and snapshot cannot go before the task. containerd's CRI pays that delete inside
//! StopContainer; remora's Stop answers once the exit is recorded, so a Remove right after it
//! would wait for the delete instead. Nothing is lost by not waiting:
//! - the removal's intent is written before the index forgets the container, so a remora that
//!   dies before the cleanup is done finishes it at its next start (the start-up sweep undoes
//!   a stale `Intent::Container` completely, see [`super::journal`]);
//! - a failed cleanup step is retried with backoff (each attempt bounded) until it succeeds;
//!   it is never dropped;
//! - a resync does not bring back a container whose cleanup is in flight ([`Removals`]);
//! - StopPodSandbox and RemovePodSandbox wait for their containers' cleanups before the pause
//!   task and the pod's own objects go, and fail with UNAVAILABLE naming the container and its
//!   last error if one does not finish within [`REMOVAL_WAIT`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slog::{info, warn};

use super::container_events::EventKind;
use super::journal::Intent;
use super::{now_ns, ContainerError, Pods, SandboxError, KILL_WAIT};
use crate::store::{container_name_key, Container, ContainerState, MountSummary, StoreError};
use remora_host::backoff::Backoff;

/// How long StopPodSandbox and RemovePodSandbox wait for the pod's container cleanups.
pub(crate) const REMOVAL_WAIT: Duration = Duration::from_secs(30);

/// The bound on one attempt of a removed container's cleanup.
const CLEANUP_ATTEMPT: Duration = Duration::from_secs(30);

/// The first retry of a failed cleanup; it doubles up to [`CLEANUP_RETRY_MAX`].
const CLEANUP_RETRY_MIN: Duration = Duration::from_secs(1);

/// The longest wait between cleanup attempts.
const CLEANUP_RETRY_MAX: Duration = Duration::from_secs(60);

impl Pods {
    /// RemoveContainer: a running container is killed first. Idempotent; an unknown id is
    /// success.
    pub async fn remove_container(self: &Arc<Self>, id: &str) -> Result<(), ContainerError> {
        let container = match self.containers_store.get(id) {
            Ok(c) => c,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move { me.remove_container_inner(&container).await })
            .await
            .map_err(ContainerError::Aborted)?
    }

    /// Removes `container` from every CRI view and starts its cleanup (see the module docs).
    pub(crate) async fn remove_container_inner(
        self: &Arc<Self>,
        container: &Container,
    ) -> Result<(), ContainerError> {
        let id = container.id().to_string();
        if container.state() == ContainerState::Running {
            self.stop_container_inner(container, Duration::ZERO).await?;
            // The exit is recorded by the monitor; removal needs it.
            let _ = tokio::time::timeout(KILL_WAIT, self.wait_exit(container)).await;
        }
        container.begin_removal()?;
        // Durable before the index forgets the container: a crash from here on is finished by
        // the start-up sweep.
        if let Err(source) = self.journal.begin(&Intent::Container { id: id.clone() }) {
            container.abort_removal();
            return Err(ContainerError::Journal {
                path: self.journal.dir().to_path_buf(),
                source,
            });
        }
        let meta = container.metadata();
        // Before the index forgets it, so a resync never finds it unknown and uncleaned.
        self.removals.enter(&id, &meta.sandbox_id);
        match self.containers_store.delete(&id) {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => {
                self.removals.leave(&id);
                self.journal.end(&id);
                container.abort_removal();
                return Err(e.into());
            }
        }
        let pod = self
            .sandboxes
            .get(&meta.sandbox_id)
            .ok()
            .map(|sb| sb.snapshot());
        if let Some(sb) = &pod {
            self.names.release(&container_name_key(
                &meta.name,
                &sb.metadata.name,
                &sb.metadata.namespace,
                &sb.metadata.uid,
                meta.attempt,
            ));
        }
        self.events
            .emit(&id, &meta.sandbox_id, EventKind::Deleted, now_ns());
        if let (Some(nri), Some(pod)) = (self.nri(), &pod) {
            nri.remove_container(pod, &container.snapshot()).await;
        }
        self.nri_forget(&id);
        self.stats_sampler.forget(&id);
        info!(self.log, "container removed"; "container_id" => &id);
        let me = self.clone();
        let (name, mounts) = (meta.name.clone(), meta.mounts.clone());
        tokio::spawn(async move { me.clean_up_removed(&id, &name, &mounts).await });
        Ok(())
    }

    /// The cleanup of removed container `id` (`name` for failpoints; `mounts` as recorded),
    /// retried with backoff until it succeeds; then its intent and [`Removals`] entry go.
    async fn clean_up_removed(&self, id: &str, name: &str, mounts: &[MountSummary]) {
        let mut backoff = Backoff::new(CLEANUP_RETRY_MIN, CLEANUP_RETRY_MAX);
        loop {
            let error = match tokio::time::timeout(
                CLEANUP_ATTEMPT,
                self.clean_up_removed_once(id, name, mounts),
            )
            .await
            {
                Ok(Ok(())) => break,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("timed out after {CLEANUP_ATTEMPT:?}"),
            };
            let delay = backoff.next_delay();
            warn!(self.log, "cannot finish removing a container's containerd objects; retrying"; "container_id" => id, "error" => &error, "retry_in_ms" => delay.as_millis() as u64);
            self.removals.failed(id, error);
            tokio::time::sleep(delay).await;
        }
        self.journal.end(id);
        self.removals.leave(id);
    }

    /// One attempt: the task (once an exit being recorded has deleted it, so no two deletes
    /// race into a shim that is shutting down), image volumes, record, snapshot, FIFOs. Every
    /// step is idempotent.
    async fn clean_up_removed_once(
        &self,
        id: &str,
        name: &str,
        mounts: &[MountSummary],
    ) -> Result<(), ContainerError> {
        self.wait_exit_settled(id).await;
        crate::failpoint::hit("container.remove_cleanup", name).await?;
        let _ = self.tasks.delete(id).await?;
        self.remove_image_volumes(id, mounts).await?;
        self.containers.delete(id).await?;
        self.snapshots.remove(&self.snapshotter, id).await?;
        if let Some(io) = self.io.remove(id) {
            let _ = io.fifos.remove();
        }
        let dir = self.io_dir(id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ContainerError::Host {
                action: "remove",
                path: dir,
                source,
            }),
        }
    }

    /// Waits (up to [`REMOVAL_WAIT`]) for the cleanups of pod `sandbox_id`'s removed
    /// containers: its pause task and its own objects go after them.
    pub(crate) async fn wait_removals_of(&self, sandbox_id: &str) -> Result<(), SandboxError> {
        match self.removals.settled_in(sandbox_id, REMOVAL_WAIT).await {
            Ok(()) => Ok(()),
            Err(pending) => Err(SandboxError::RemovalPending {
                container: pending.id,
                last_error: pending
                    .last_error
                    .unwrap_or_else(|| "no attempt failed yet".to_string()),
            }),
        }
    }

    /// Whether removed container `id`'s cleanup is in flight (a resync leaves it alone).
    pub(crate) fn is_being_removed(&self, id: &str) -> bool {
        self.removals.contains(id)
    }
}

/// Removed containers whose cleanup is in flight, by id: their pod, and the last error of
/// their cleanup, if an attempt failed.
#[derive(Debug, Default)]
pub(crate) struct Removals {
    ids: Mutex<HashMap<String, Removal>>,
    left: tokio::sync::Notify,
}

#[derive(Debug, Clone)]
struct Removal {
    sandbox_id: String,
    last_error: Option<String>,
}

/// A cleanup that did not finish in time: its container and its last error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingRemoval {
    /// The container.
    pub id: String,
    /// Its cleanup's last error, if an attempt failed.
    pub last_error: Option<String>,
}

impl Removals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Removal>> {
        // Only map operations run under this lock.
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Container `id` of pod `sandbox_id` is being cleaned up.
    pub(crate) fn enter(&self, id: &str, sandbox_id: &str) {
        self.lock().insert(
            id.to_string(),
            Removal {
                sandbox_id: sandbox_id.to_string(),
                last_error: None,
            },
        );
    }

    /// An attempt of `id`'s cleanup failed with `error`.
    pub(crate) fn failed(&self, id: &str, error: String) {
        if let Some(r) = self.lock().get_mut(id) {
            r.last_error = Some(error);
        }
    }

    /// `id`'s cleanup is done (or was not started).
    pub(crate) fn leave(&self, id: &str) {
        self.lock().remove(id);
        self.left.notify_waiters();
    }

    /// Whether `id`'s cleanup is in flight.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    fn pending_in(&self, sandbox_id: &str) -> Option<PendingRemoval> {
        self.lock()
            .iter()
            .find(|(_, r)| r.sandbox_id == sandbox_id)
            .map(|(id, r)| PendingRemoval {
                id: id.clone(),
                last_error: r.last_error.clone(),
            })
    }

    /// Resolves once no cleanup of a container of `sandbox_id` is in flight, or after `bound`
    /// with one still in flight.
    pub(crate) async fn settled_in(
        &self,
        sandbox_id: &str,
        bound: Duration,
    ) -> Result<(), PendingRemoval> {
        let wait = async {
            loop {
                let left = self.left.notified();
                tokio::pin!(left);
                // Registered before the check, so a cleanup ending in between still wakes us.
                left.as_mut().enable();
                if self.pending_in(sandbox_id).is_none() {
                    return;
                }
                left.await;
            }
        };
        match tokio::time::timeout(bound, wait).await {
            Ok(()) => Ok(()),
            Err(_) => match self.pending_in(sandbox_id) {
                Some(pending) => Err(pending),
                None => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settled_in_waits_for_the_pods_cleanups_only() {
        let set = Arc::new(Removals::default());
        set.settled_in("p1", Duration::from_secs(5))
            .await
            .expect("nothing in flight: settled at once");
        set.enter("c1", "p1");
        set.enter("c2", "p2");
        let waiter = tokio::spawn({
            let set = set.clone();
            async move { set.settled_in("p1", Duration::from_secs(30)).await }
        });
        tokio::task::yield_now().await;
        set.leave("c2");
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "p2's cleanup ending does not settle p1"
        );
        set.leave("c1");
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken when p1's last cleanup is done")
            .unwrap()
            .expect("settled");
        assert!(!set.contains("c1"));
    }

    #[tokio::test]
    async fn a_cleanup_still_in_flight_after_the_bound_is_named_with_its_last_error() {
        let set = Removals::default();
        set.enter("c1", "p1");
        set.failed("c1", "containerd: record busy".into());
        let pending = set
            .settled_in("p1", Duration::from_millis(20))
            .await
            .expect_err("still in flight");
        assert_eq!(
            pending,
            PendingRemoval {
                id: "c1".into(),
                last_error: Some("containerd: record busy".into())
            }
        );
        set.failed("c9", "unknown ids are ignored".into());
        assert!(!set.contains("c9"));
    }
}
