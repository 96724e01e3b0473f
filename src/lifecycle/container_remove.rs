//! RemoveContainer: a running container is killed first; then its task, image volumes,
//! record, snapshot, FIFOs and name go.

use std::sync::Arc;
use std::time::Duration;

use slog::info;

use super::events::EventKind;
use super::{now_ns, ContainerError, Pods, KILL_WAIT};
use crate::store::{container_name_key, Container, ContainerState, StoreError};

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

    pub(crate) async fn remove_container_inner(
        &self,
        container: &Container,
    ) -> Result<(), ContainerError> {
        let id = container.id().to_string();
        if container.state() == ContainerState::Running {
            self.stop_container_inner(container, Duration::ZERO).await?;
            // The exit is recorded by the monitor; removal needs it.
            let _ = tokio::time::timeout(KILL_WAIT, self.wait_exit(container)).await;
        }
        // An exit being recorded deletes the task itself: not two deletes at once.
        self.wait_exit_settled(&id).await;
        container.begin_removal()?;
        let result = async {
            let _ = self.tasks.delete(&id).await?;
            self.remove_image_volumes(&id, &container.metadata().mounts)
                .await?;
            self.containers.delete(&id).await?;
            self.snapshots.remove(&self.snapshotter, &id).await?;
            if let Some(io) = self.io.remove(&id) {
                let _ = io.fifos.remove();
            }
            let _ = std::fs::remove_dir_all(self.io_dir(&id));
            Ok::<(), ContainerError>(())
        }
        .await;
        if let Err(e) = result {
            container.abort_removal();
            return Err(e);
        }
        let meta = container.metadata();
        if let Ok(sb) = self.sandboxes.get(&meta.sandbox_id) {
            let sb = sb.snapshot();
            self.names.release(&container_name_key(
                &meta.name,
                &sb.metadata.name,
                &sb.metadata.namespace,
                &sb.metadata.uid,
                meta.attempt,
            ));
        }
        match self.containers_store.delete(&id) {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.events
            .emit(&id, &meta.sandbox_id, EventKind::Deleted, now_ns());
        info!(self.log, "container removed"; "container_id" => &id);
        Ok(())
    }
}
