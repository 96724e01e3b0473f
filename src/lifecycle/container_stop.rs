//! StopContainer: the image's stop signal (or SIGTERM), the grace period, then SIGKILL.

use std::sync::Arc;
use std::time::Duration;

use slog::warn;

use super::backend::TaskStatus;
use super::{image_config, ContainerError, Pods, KILL_WAIT};
use crate::store::{Container, ContainerState, StoreError};

impl Pods {
    /// StopContainer: the image's stop signal (or SIGTERM), `timeout` seconds, then SIGKILL.
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
            self.kill_ignoring_gone(&id, signal).await?;
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

    fn stop_signal(&self, container: &Container) -> u32 {
        let image = self.find_image(&container.metadata().image.id);
        let name = image
            .map(|i| image_config(&i))
            .map(|c| c.stop_signal)
            .unwrap_or_default();
        parse_signal(&name).unwrap_or(libc::SIGTERM as u32)
    }
}

/// A signal by name (`SIGTERM`, `TERM`) or number (`15`).
pub fn parse_signal(s: &str) -> Option<u32> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(n) = s.parse::<u32>() {
        return Some(n);
    }
    let name = s.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    let n = match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        _ => return None,
    };
    Some(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("SIGTERM"), Some(15));
        assert_eq!(parse_signal("quit"), Some(3));
        assert_eq!(parse_signal("9"), Some(9));
        assert_eq!(parse_signal(""), None);
        assert_eq!(parse_signal("SIGBOGUS"), None);
    }
}
