//! StopContainer: the container's stop signal (CRI's, else the image's, else SIGTERM), the
//! grace period, then SIGKILL.

use std::sync::Arc;
use std::time::Duration;

use slog::warn;

use super::backend::TaskStatus;
use super::{ContainerError, Pods, KILL_WAIT};
use crate::signal::Signal;
use crate::store::{Container, ContainerState, StoreError};

impl Pods {
    /// StopContainer: the container's stop signal, `timeout` seconds, then SIGKILL.
    /// Idempotent; an unknown id is success.
    pub async fn stop_container(
        self: &Arc<Self>,
        id: &str,
        timeout: Duration,
    ) -> Result<(), ContainerError> {
        let container = match self.containers_store.get(id) {
            Ok(c) => c,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move { me.stop_container_inner(&container, timeout).await })
            .await
            .map_err(ContainerError::Aborted)?
    }

    /// Stops `container`: its stop signal, `timeout` to exit, then SIGKILL (at once for a zero
    /// `timeout`: a container of a pod being stopped or removed, which kubelet stopped
    /// gracefully already).
    pub(crate) async fn stop_container_inner(
        &self,
        container: &Container,
        timeout: Duration,
    ) -> Result<(), ContainerError> {
        let id = container.id().to_string();
        let Some(state) = self.tasks.state(&id).await? else {
            // No task, or (as containerd answers it) one whose shim died: the exit monitor
            // records the exit, or reaps the container (`reap_after_dead_shim`). Callers
            // (RemoveContainer, ContainerStatus after Stop) need it recorded.
            if container.state() == ContainerState::Running {
                let _ = tokio::time::timeout(KILL_WAIT, self.wait_exit(container)).await;
            }
            return Ok(());
        };
        if state.status == TaskStatus::Stopped {
            // Exited, but the exit monitor may still be draining output before it records
            // the exit: callers (RemoveContainer, ContainerStatus after Stop) need it recorded.
            let _ = tokio::time::timeout(KILL_WAIT, self.wait_exit(container)).await;
            return Ok(());
        }
        let signal = self.stop_signal(container);
        if !timeout.is_zero() {
            // A signal's number is 1 to 64 (`Signal`), so it fits.
            self.kill_ignoring_gone(&id, signal.number().unsigned_abs())
                .await?;
            if tokio::time::timeout(timeout, self.wait_exit(container))
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        self.kill_ignoring_gone(&id, libc::SIGKILL as u32).await?;
        if tokio::time::timeout(KILL_WAIT, self.wait_exit(container))
            .await
            .is_err()
        {
            warn!(self.log, "container did not exit after SIGKILL"; "container_id" => &id);
        }
        Ok(())
    }

    /// Resolves when the container's exit is recorded: woken by the recording itself (see
    /// [`Container::not_running`]), before its task is deleted.
    pub(crate) async fn wait_exit(&self, container: &Container) {
        container.not_running().await;
    }

    /// Resolves once no exit of `id` is being recorded, so its task delete is done: for callers
    /// that delete the task (or what it uses) themselves. Bounded by [`KILL_WAIT`]: a recording
    /// stuck on an unreachable containerd is retried by the event queue, and the caller's own
    /// delete then fails with containerd's error.
    pub(crate) async fn wait_exit_settled(&self, id: &str) {
        let _ = tokio::time::timeout(KILL_WAIT, self.exiting.settled(id)).await;
    }

    /// The signal `container` is stopped with first: the one its record keeps (see
    /// [`crate::store::ContainerMetadata::stop_signal`]); for a record written before remora
    /// kept it, its image's `StopSignal` as remora sent then, else SIGTERM.
    fn stop_signal(&self, container: &Container) -> Signal {
        let m = container.metadata();
        Signal::parse(&m.stop_signal)
            .or_else(|| {
                let image = self.find_image(&m.image.id)?;
                Signal::parse(image.config.config.stop_signal.as_deref()?)
            })
            .unwrap_or(Signal::TERM)
    }
}
